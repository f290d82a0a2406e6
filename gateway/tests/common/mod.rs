//! Shared fixtures of the gateway's integration tests: a real `gateway up`
//! process (real TLS, real engine child processes) on ephemeral ports, in a
//! private directory with its own certificates and latency profile.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use engine::api::LoadReport;
use engine::backend::emulated::TextSource;
use http_body_util::Full;
use loadtest::client::{body_bytes, Conn, Proto};
use loadtest::sse::{SseEvent, SseParser};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const MODEL: &str = "synthetic-small";
pub const GOLD: &str = "sk-demo-gold";
pub const SILVER: &str = "sk-demo-silver";
pub const BRONZE: &str = "sk-demo-bronze";
/// The admin token of gateways started with [`System::serve_beside`].
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The shipped policy document's text.
pub fn default_policy() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/default.toml")).unwrap()
}

/// A profile where everything is instant: protocol tests run fast.
pub const INSTANT: &str = "model = \"synthetic-small\"\nengine_class = \"test-instant\"\n\
    [prefill]\npoints = [[0, 0.0]]\n[decode]\nbatch_points = [[1, 0.0]]\n";

/// A profile with the given prefill and per-token decode time in ms.
pub fn paced(prefill_ms: u32, decode_ms: u32) -> String {
    format!(
        "model = \"synthetic-small\"\nengine_class = \"test-paced\"\n\
         [prefill]\npoints = [[0, {prefill_ms}.0]]\n[decode]\nbatch_points = [[1, {decode_ms}.0]]\n"
    )
}

/// The `--engine-arg` that gives engines the shipped diffusion profile
/// (policies/profiles/genserve-emulated.toml) on a clock `scale` times as
/// long (0.02: 50x faster), written into `dir`.
pub fn diffusion_profile(dir: &Path, scale: f64) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/profiles/genserve-emulated.toml"),
    )
    .unwrap();
    let path = dir.join(format!("genserve-{scale}.toml"));
    std::fs::write(&path, format!("time_scale = {scale}\n{text}")).unwrap();
    format!("--engine-arg=--diffusion-profile={}", path.display())
}

/// `gateway up` arguments for cpu-backend engines running a tiny model
/// (a real transformer, quick on this machine's cores).
pub const TINY_CPU_MODEL: [&str; 7] = [
    "--backend=cpu",
    "--engine-arg=--model-layers=2",
    "--engine-arg=--model-hidden=64",
    "--engine-arg=--model-heads=4",
    "--engine-arg=--model-ffn=128",
    "--engine-arg=--model-vocab=512",
    "--engine-arg=--kv-cache-mb=8",
];

/// One engine child as `gateway up` reported it.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub id: String,
    pub pid: u32,
    pub url: String,
}

/// A running `gateway up`.
pub struct System {
    pub child: Child,
    pub base: String,
    /// The plaintext listener (`http://127.0.0.1:PORT`), when started with
    /// `--plaintext-listen`.
    pub plain: Option<String>,
    /// The admin listener (`https://localhost:PORT`).
    pub admin: String,
    /// The policy file the gateway runs from.
    pub policies: PathBuf,
    pub ca: PathBuf,
    pub engines: Vec<EngineInfo>,
    pub dir: PathBuf,
}

/// The gateway binary with the fixtures' stdio (stdout read for its
/// start-up lines; logs, its engines' included, in `dir/gateway.log`
/// ([`System::log`]), or shown with `GATEWAY_TEST_LOGS=1`), killed on drop.
fn gateway_command(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    let log = if std::env::var_os("GATEWAY_TEST_LOGS").is_some() {
        Stdio::inherit()
    } else {
        std::fs::File::create(dir.join("gateway.log")).map_or_else(|_| Stdio::null(), Stdio::from)
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log).kill_on_drop(true);
    cmd
}

/// A fresh directory under the temp dir, private to this call.
pub fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gateway-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

impl System {
    /// Starts `gateway up` with `engines` children replaying `profile`.
    pub async fn start(profile: &str, engines: usize) -> Self {
        Self::start_with(profile, engines, &[]).await
    }

    pub async fn start_with(profile: &str, engines: usize, extra: &[&str]) -> Self {
        Self::start_with_policy(profile, engines, extra, None).await
    }

    /// As [`System::start_with`], with this policy document instead of the
    /// shipped one.
    pub async fn start_with_policy(
        profile: &str,
        engines: usize,
        extra: &[&str],
        policy: Option<&str>,
    ) -> Self {
        Self::start_with_env(profile, engines, extra, policy, &[]).await
    }

    /// As [`System::start_with_policy`], with these environment variables
    /// for the gateway (its engines inherit them).
    pub async fn start_with_env(
        profile: &str,
        engines: usize,
        extra: &[&str],
        policy: Option<&str>,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = scratch_dir();
        let profile_path = dir.join("profile.toml");
        std::fs::write(&profile_path, profile).unwrap();
        let policies = match policy {
            Some(text) => {
                let p = dir.join("policies.toml");
                std::fs::write(&p, text).unwrap();
                p
            }
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/default.toml"),
        };
        let mut cmd = gateway_command(&dir);
        cmd.arg("up")
            .args(["--listen", "127.0.0.1:0", "--engines", &engines.to_string()])
            .arg("--certs")
            .arg(dir.join("certs"))
            .arg("--profile")
            .arg(&profile_path)
            .arg("--policies")
            .arg(&policies)
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied());
        let ca = dir.join("certs/ca.pem");
        Self::spawn(cmd, dir, policies, ca).await
    }

    /// Runs `cmd` (a gateway) and reads its start-up lines up to `ready:`.
    async fn spawn(mut cmd: Command, dir: PathBuf, policies: PathBuf, ca: PathBuf) -> Self {
        let mut child = cmd.spawn().expect("gateway binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut base = None;
        let mut admin = None;
        let mut plain = None;
        let mut infos = Vec::new();
        let read = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(rest) = line.strip_prefix("gateway listening on https://") {
                    let addr = rest.split_whitespace().next().unwrap();
                    let port = addr.rsplit(':').next().unwrap();
                    base = Some(format!("https://localhost:{port}"));
                } else if let Some(rest) = line.strip_prefix("gateway listening on http://") {
                    plain = Some(format!("http://{}", rest.split_whitespace().next().unwrap()));
                } else if let Some(rest) = line.strip_prefix("admin listening on https://") {
                    let port = rest.split_whitespace().next().unwrap().rsplit(':').next().unwrap();
                    admin = Some(format!("https://localhost:{port}"));
                } else if let Some(rest) = line.strip_prefix("engine ") {
                    let mut words = rest.split_whitespace();
                    let id = words.next().unwrap().to_string();
                    let field = |p: &str| {
                        rest.split_whitespace().find_map(|w| w.strip_prefix(p)).unwrap().to_string()
                    };
                    infos.push(EngineInfo { id, pid: field("pid=").parse().unwrap(), url: field("url=") });
                } else if line.starts_with("ready:") {
                    return;
                }
            }
            panic!("gateway exited before its ready line");
        };
        tokio::time::timeout(Duration::from_secs(30), read).await.expect("gateway ready within 30 s");
        // Keep draining stdout so the gateway never writes into a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        System {
            child,
            base: base.expect("listening line"),
            plain,
            admin: admin.expect("admin listening line"),
            policies,
            ca,
            engines: infos,
            dir,
        }
    }

    /// A second gateway (`gateway serve`) beside `other`, with its
    /// certificate, the policy text `policy`, an admin token `ADMIN_TOKEN`,
    /// and `args` (such as `--redis URL`). It has no engines of its own.
    pub async fn serve_beside(other: &System, policy: &str, args: &[&str]) -> Self {
        let dir = scratch_dir();
        let policies = dir.join("policies.toml");
        std::fs::write(&policies, policy).unwrap();
        let certs = other.dir.join("certs");
        // The fleet's engines take the API token of the first gateway's, and
        // the fleet signs its policies with its key.
        let config = format!(
            "listen = \"127.0.0.1:0\"\npolicies = {policies:?}\nengine_token_file = {:?}\n\
             [tls]\ncert = {:?}\nkey = {:?}\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n[[admin.tokens]]\nid = \"ops\"\ntoken = \"{ADMIN_TOKEN}\"\n\
             [cluster]\npolicy_key_file = {:?}\n",
            certs.join("engine.token"),
            certs.join("server.pem"),
            certs.join("server.key"),
            certs.join("policy.key"),
        );
        let config_path = dir.join("gateway.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = gateway_command(&dir);
        cmd.arg("serve").arg("--config").arg(&config_path).args(args);
        Self::spawn(cmd, dir, policies, certs.join("ca.pem")).await
    }

    /// `gateway serve` with `engines` (the `[[engines]]` tables of its
    /// config, verbatim), the policy text `policy`, its own development
    /// certificates and an admin token [`ADMIN_TOKEN`].
    pub async fn serve(engines: &str, policy: &str) -> Self {
        let dir = scratch_dir();
        let certs = dir.join("certs");
        let made = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
            .arg("certs")
            .arg("--out")
            .arg(&certs)
            .output()
            .expect("gateway certs runs");
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let policies = dir.join("policies.toml");
        std::fs::write(&policies, policy).unwrap();
        let config = format!(
            "listen = \"127.0.0.1:0\"\npolicies = {policies:?}\n\
             [tls]\ncert = {:?}\nkey = {:?}\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n[[admin.tokens]]\nid = \"ops\"\ntoken = \"{ADMIN_TOKEN}\"\n\
             {engines}",
            certs.join("server.pem"),
            certs.join("server.key"),
        );
        let config_path = dir.join("gateway.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = gateway_command(&dir);
        cmd.arg("serve").arg("--config").arg(&config_path);
        Self::spawn(cmd, dir, policies, certs.join("ca.pem")).await
    }

    /// What the gateway and its engines logged so far (empty with
    /// `GATEWAY_TEST_LOGS=1`: then it goes to the terminal).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }

    pub async fn conn(&self, proto: Proto) -> Conn {
        Conn::connect(&self.base, Some(&self.ca), proto).await.expect("connects to the gateway")
    }

    /// A connection to the admin listener.
    pub async fn admin_conn(&self) -> Conn {
        Conn::connect(&self.admin, Some(&self.ca), Proto::H2).await.expect("connects to the admin listener")
    }

    /// The Prometheus text from the admin listener.
    pub async fn metrics(&self) -> String {
        let conn = self.admin_conn().await;
        String::from_utf8(body_bytes(conn.get("/metrics", None).await.unwrap()).await.unwrap().to_vec())
            .unwrap()
    }

    /// The Prometheus text of engine `i` (with the engine API token).
    pub async fn engine_metrics(&self, i: usize) -> String {
        let conn =
            Conn::connect(&self.engines[i].url, None, Proto::H2).await.expect("connects to the engine");
        let token = self.engine_token();
        String::from_utf8(
            body_bytes(conn.get("/metrics", Some(&token)).await.unwrap()).await.unwrap().to_vec(),
        )
        .unwrap()
    }

    /// The admin token: the one `gateway up` made, or [`ADMIN_TOKEN`] for a
    /// gateway from [`System::serve_beside`].
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.join("certs/admin.token"))
            .map_or_else(|_| ADMIN_TOKEN.to_string(), |t| t.trim().to_string())
    }

    /// The engine API token `gateway up` made for its children.
    pub fn engine_token(&self) -> String {
        std::fs::read_to_string(self.dir.join("certs/engine.token"))
            .expect("gateway up made an engine token")
            .trim()
            .to_string()
    }

    /// `/readyz` of this gateway.
    pub async fn readyz(&self) -> serde_json::Value {
        let conn = self.conn(Proto::H2).await;
        json(&body_bytes(conn.get("/readyz", None).await.unwrap()).await.unwrap())
    }

    /// The load report of engine `id`, read straight from the engine.
    pub async fn engine_load(&self, id: &str) -> LoadReport {
        let e = self.engines.iter().find(|e| e.id == id).expect("known engine id");
        let conn = Conn::connect(&e.url, None, Proto::H2).await.expect("engine reachable");
        let token = self.engine_token();
        let body = body_bytes(conn.get("/engine/v1/load", Some(&token)).await.unwrap()).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// SIGKILLs engine `id`.
    pub fn kill_engine(&self, id: &str) {
        let e = self.engines.iter().find(|e| e.id == id).expect("known engine id");
        signal(e.pid, "KILL");
    }

    pub fn other_engine(&self, id: &str) -> String {
        self.engines.iter().find(|e| e.id != id).expect("a second engine").id.clone()
    }
}

impl Drop for System {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends a signal with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let ok =
        std::process::Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap();
    assert!(ok.success(), "kill -{sig} {pid}");
}

/// Whether process `pid` still runs (a zombie counts as gone: orphans are
/// reaped by PID 1, which in a container may never do it).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Reads a whole SSE body into events.
pub async fn sse_events(resp: http::Response<hyper::body::Incoming>) -> Vec<SseEvent> {
    let body =
        tokio::time::timeout(Duration::from_secs(20), body_bytes(resp)).await.expect("stream ends").unwrap();
    SseParser::new().push(&body)
}

pub fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

/// A request to `path` with a key, a JSON body and extra headers.
pub fn request(path: &str, key: &str, body: String, headers: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::post(path)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::from(body))).unwrap()
}

/// The value of the first Prometheus sample whose line starts with `prefix`.
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix))?.rsplit(' ').next()?.parse().ok()
}

pub fn chat_body(content: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": MODEL, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

/// A prompt the emulated model answers with at least `min` tokens before
/// ending by itself, so a stream holds its slot for a known time.
pub fn long_prompt(min: u32) -> String {
    (0..)
        .map(|i| format!("tell me a long story number {i}"))
        .find(|p| {
            let mut s = TextSource::new(p, None);
            (0..min).all(|_| s.next_token().is_some())
        })
        .unwrap()
}

/// A prompt the emulated model ends by itself within `max` tokens.
pub fn short_prompt(max: u32) -> String {
    (0..)
        .map(|i| format!("a short answer please {i}"))
        .find(|p| {
            let mut s = TextSource::new(p, None);
            (0..=max).any(|_| s.next_token().is_none())
        })
        .unwrap()
}

pub fn completion(prompt: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream})
        .to_string()
}

pub fn header<'a>(resp: &'a http::Response<hyper::body::Incoming>, name: &str) -> &'a str {
    resp.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

/// A real `redis-server` on a free loopback port, private to one test
/// (`scripts/test-all` installs it from Debian's packages when missing).
#[allow(unused_imports)] // not every test binary uses Sentinel
pub use loadtest::chaos::system::{Redis, Sentinel};

/// Starts a [`Redis`] in a scratch directory of this test.
pub fn start_redis() -> Redis {
    Redis::start(&scratch_dir()).expect("redis-server is installed (scripts/test-all installs it)")
}

/// Runs `tests/<script>` with the official OpenAI Python client
/// (`OPENAI_PYTHON`, set by the test command) against `sys`, given only the
/// base URL, a gold key and the dev CA; asserts it exits 0 printing `OK`.
/// Without `OPENAI_PYTHON` it skips, except under CI.
pub async fn run_openai_script(sys: &System, script: &str) {
    run_sdk_script(sys, script, &[]).await;
}

/// As [`run_openai_script`], with these further environment variables; the
/// Anthropic SDK is configured beside the OpenAI client (ANTHROPIC_BASE_URL,
/// ANTHROPIC_API_KEY: the environment it reads).
pub async fn run_sdk_script(sys: &System, script: &str, env: &[(&str, &str)]) {
    let Some(python) = std::env::var_os("OPENAI_PYTHON") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set OPENAI_PYTHON (see .ci/run)");
        eprintln!("SKIPPED {script}: set OPENAI_PYTHON to a python with `openai` and `h2` installed");
        return;
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let out = Command::new(python)
        .arg(path)
        .env("OPENAI_BASE_URL", format!("{}/v1", sys.base))
        .env("OPENAI_API_KEY", GOLD)
        .env("ANTHROPIC_BASE_URL", &sys.base)
        .env("ANTHROPIC_API_KEY", GOLD)
        .env("SSL_CERT_FILE", &sys.ca)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("OK"), "{stdout}");
}

/// `promtool check metrics` on a /metrics text: its complaints (empty when
/// the text follows Prometheus' conventions), but one: the engine exports
/// vLLM's own metric names beside its own (`vllm:num_requests_running`,
/// ...) so that routers built for vLLM read it, and those names carry the
/// colon vLLM gave them, which promtool reserves for recording rules. Any
/// other complaint, about those families or others, stays. scripts/test-all
/// installs promtool (Debian's `prometheus`).
pub fn promtool_lint(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/test-all installs Debian's prometheus)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        return String::new();
    }
    let vllm_colon = |l: &str| l.starts_with("vllm:") && l.ends_with("metric names should not contain ':'");
    said.lines().filter(|l| !l.trim().is_empty() && !vllm_colon(l)).collect::<Vec<_>>().join("\n")
}

/// An admin API call on `sys` with its admin token, a JSON body: the
/// status and the JSON answer (`Null` when it is not JSON).
pub async fn admin_json(
    sys: &System,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (http::StatusCode, serde_json::Value) {
    let (status, text) = admin_text(sys, method, path, body).await;
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

/// As [`admin_json`], the answer as text (CSV exports, secrets searched for).
pub async fn admin_text(
    sys: &System,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (http::StatusCode, String) {
    let conn = sys.admin_conn().await;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {}", sys.admin_token()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.map_or(String::new(), |b| b.to_string()))))
        .unwrap();
    let resp = conn.send(req).await.unwrap();
    let status = resp.status();
    (status, String::from_utf8(body_bytes(resp).await.unwrap().to_vec()).unwrap())
}

/// `GET /admin/fleet` polled until `ok` holds, at most `within`; fails the
/// test with `what` and the last answer otherwise.
#[allow(clippy::disallowed_methods)] // process-level: real time on purpose
pub async fn fleet_until(
    sys: &System,
    within: std::time::Duration,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        let (status, v) = admin_json(sys, "GET", "/admin/fleet", None).await;
        assert_eq!(status, http::StatusCode::OK);
        if ok(&v) {
            return v;
        }
        assert!(t.elapsed() < within, "{what}: not within {within:?}: {v:#}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Polls `check` on `sys`'s `/readyz` until it holds (10 s at most).
#[allow(clippy::disallowed_methods)] // real processes, real time
pub async fn wait_ready(
    sys: &System,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = sys.readyz().await;
        if check(&r) {
            return r;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `ok` every 100 ms for at most `within`; how long it took.
#[allow(clippy::disallowed_methods)] // real processes, real time
pub async fn within(within: Duration, what: &str, mut ok: impl AsyncFnMut() -> bool) -> Duration {
    let started = std::time::Instant::now();
    while !ok().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}
