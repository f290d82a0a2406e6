//! A fleet on hosts of its own ([`Hosts`]: network namespaces on one
//! switch): Redis on host 0 (with a replica and sentinels where asked),
//! `gateway serve` on some hosts, emulated engines (`engine --redis
//! --advertise`) on others, clients in this process over the gateways'
//! plaintext listeners. Used by `loadtest chaos --fleet` ([`super::fleet_run`])
//! and by the gateway's tests (`gateway/tests/fleet_hosts.rs`).
//!
//! Every process runs inside its host through `ip netns exec` and is ended
//! by its process id; everything is torn down when the fleet drops.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::hosts::Hosts;
use crate::client::{body_bytes, Conn, Proto};

/// The engines' API token.
const TOKEN: &str = "hosts-engine-token-0123456789";
/// The gateways' admin token.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The binaries a fleet runs.
#[derive(Debug, Clone)]
pub struct Bins {
    pub gateway: PathBuf,
    pub engine: PathBuf,
}

impl Bins {
    /// `gateway` and `engine` side by side (`target/<profile>/`).
    pub fn beside(gateway: &Path) -> Self {
        Self { gateway: gateway.to_path_buf(), engine: gateway.with_file_name("engine") }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    /// Hosts to make (0 is Redis's).
    pub hosts: usize,
    /// A gateway on each of these hosts.
    pub gateways: &'a [usize],
    /// An engine on each of these hosts (ids `e<host>`).
    pub engines: &'a [usize],
    /// The engines' profile (TOML text).
    pub profile: &'a str,
    /// The gateways' policy document (TOML text).
    pub policy: &'a str,
    /// (replica host, sentinel hosts): a replica of the primary and
    /// sentinels watching it as `fleet` (quorum 2, down after 1 s),
    /// everyone given the `redis+sentinel://` URL.
    pub sentinel: Option<(usize, &'a [usize])>,
}

/// How one streamed chat through a gateway went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Streamed {
    /// Refused before the request went out (connection refused, or closed
    /// by a draining gateway first): a balancer retries it elsewhere.
    NotAccepted,
    /// Answered to its last event.
    Done,
    /// 429: the tenant's limit.
    Limited,
    /// 503 with Retry-After: refused by admission or as overload, with a
    /// reason (not a failure).
    Refused,
    Failed(String),
}

/// One streamed chat of `max_tokens` for `key` through `url`; `opened`
/// runs when its 200 head arrives, `closed` when its body has ended.
pub async fn stream_chat(
    url: &str,
    key: &str,
    max_tokens: u32,
    opened: impl FnOnce(),
    closed: impl FnOnce(),
) -> Streamed {
    stream_chat_timed(url, key, max_tokens, opened, closed).await.0
}

/// [`stream_chat`], and when its first body bytes (the first token's
/// event) arrived after the request went out. A failure names the engine
/// that served it (`x-engine`).
pub async fn stream_chat_timed(
    url: &str,
    key: &str,
    max_tokens: u32,
    opened: impl FnOnce(),
    closed: impl FnOnce(),
) -> (Streamed, Option<Duration>) {
    let Ok(conn) = Conn::connect(url, None, Proto::Http1).await else { return (Streamed::NotAccepted, None) };
    let body = serde_json::json!({"model": "synthetic-small", "max_tokens": max_tokens, "stream": true,
        "messages": [{"role": "user", "content": "streamed through the fleet"}]});
    let sent = crate::clock::now();
    let resp = match conn.post_json("/v1/chat/completions", Some(key), body.to_string()).await {
        Ok(resp) if resp.status() == http::StatusCode::OK => resp,
        other => return (answered(url, other).await, None),
    };
    opened();
    let engine = resp.headers().get("x-engine").and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
    let mut body = resp.into_body();
    let (mut first, mut all) = (None, Vec::new());
    let end = loop {
        match http_body_util::BodyExt::frame(&mut body).await {
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    first.get_or_insert_with(|| crate::clock::since(sent));
                    all.extend_from_slice(&d);
                }
            }
            Some(Err(e)) => break Err(e.to_string()),
            None => break Ok(()),
        }
    };
    closed();
    let outcome = match end {
        Ok(()) if String::from_utf8_lossy(&all).contains("data: [DONE]") => Streamed::Done,
        Ok(()) => {
            Streamed::Failed(format!("{url}: a stream cut short ({} bytes) on engine {engine}", all.len()))
        }
        Err(e) => Streamed::Failed(format!("{url}: body: {e} on engine {engine}")),
    };
    (outcome, first)
}

/// What a chat answered with anything but a 200 (or no answer) means.
async fn answered(
    url: &str,
    r: Result<http::Response<hyper::body::Incoming>, crate::client::ClientError>,
) -> Streamed {
    match r {
        Ok(resp) if resp.status() == http::StatusCode::OK => Streamed::Done,
        Ok(resp) if resp.status() == http::StatusCode::TOO_MANY_REQUESTS => {
            let _ = body_bytes(resp).await;
            Streamed::Limited
        }
        Ok(resp)
            if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE
                && resp.headers().contains_key("retry-after") =>
        {
            let _ = body_bytes(resp).await;
            Streamed::Refused
        }
        Ok(resp) => Streamed::Failed(format!("{url}: {}", resp.status())),
        Err(e) if e.to_string().contains("connection closed before") => Streamed::NotAccepted,
        Err(e) => Streamed::Failed(format!("{url}: {e}")),
    }
}

pub struct Fleet {
    pub hosts: Hosts,
    pub dir: PathBuf,
    pub redis: String,
    /// The gateways' hosts.
    pub gateways: Vec<usize>,
    bins: Bins,
    /// Engines: (host, id, pid).
    engines: Vec<(usize, String, u32)>,
    /// The gateway processes: (host, pid).
    gateway_pids: Vec<(usize, u32)>,
    /// Redis servers and sentinels: (host, pid).
    pub redis_pids: Vec<(usize, u32)>,
}

/// The data directory of the Redis server on `host` (RDB files of
/// replication), under the run's directory.
fn redis_dir(run: &std::path::Path, host: usize) -> Result<std::path::PathBuf, String> {
    let dir = run.join(format!("redis-{host}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn log(dir: &Path, name: &str) -> Result<Stdio, String> {
    let f = std::fs::File::create(dir.join(format!("{name}.log"))).map_err(|e| format!("{name}.log: {e}"))?;
    Ok(Stdio::from(f))
}

fn wait_port(addr: &str, what: &str) -> Result<(), String> {
    let start = crate::clock::now();
    let sock = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    while std::net::TcpStream::connect_timeout(&sock, Duration::from_millis(300)).is_err() {
        if crate::clock::since(start) > Duration::from_secs(30) {
            return Err(format!("{what} is not listening on {addr} after 30 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

impl Fleet {
    /// Makes the hosts and starts everything `layout` names; `Ok(None)`
    /// (said on standard error) where this machine cannot make network
    /// namespaces. Files (configs, logs) go under `dir`.
    pub fn start(bins: &Bins, layout: &Layout<'_>, dir: &Path) -> Result<Option<Fleet>, String> {
        let Some(hosts) = Hosts::create_or_skip(layout.hosts, "the multi-host fleet") else {
            return Ok(None);
        };
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write =
            |name: &str, text: &str| std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"));
        write("engine.token", TOKEN)?;
        write("policy.key", "hosts-policy-signing-key-0123456789")?;
        write("profile.toml", layout.profile)?;
        write("policy.toml", layout.policy)?;
        let mut fleet = Fleet {
            redis: format!("redis://{}:6379", hosts.addr(0)),
            hosts,
            dir: dir.to_path_buf(),
            gateways: layout.gateways.to_vec(),
            bins: bins.clone(),
            engines: Vec::new(),
            gateway_pids: Vec::new(),
            redis_pids: Vec::new(),
        };
        let mut redis = fleet.hosts.command(0, "redis-server");
        // Its own directory: a replica's full sync still writes an RDB file
        // (`--save ""` only stops the periodic ones), which would otherwise
        // land in the working directory.
        let dir = redis_dir(&fleet.dir, 0)?;
        redis
            .args(["--bind", &fleet.hosts.addr(0).to_string(), "--port", "6379", "--save", ""])
            .arg("--dir")
            .arg(&dir)
            .args(["--appendonly", "no", "--protected-mode", "no"])
            .stdout(log(&fleet.dir, "redis")?);
        let pid = fleet.hosts.spawn(redis)?;
        fleet.redis_pids.push((0, pid));
        wait_port(&format!("{}:6379", fleet.hosts.addr(0)), "redis")?;
        if let Some((replica, sentinels)) = layout.sentinel {
            fleet.sentinel(replica, sentinels)?;
        }
        for &h in layout.engines {
            fleet.engine(h)?;
        }
        let mut certs = std::process::Command::new(&bins.gateway);
        certs.arg("certs").arg("--out").arg(fleet.dir.join("certs"));
        for &g in layout.gateways {
            certs.args(["--san", &fleet.hosts.addr(g).to_string()]);
        }
        let made = certs.output().map_err(|e| format!("{}: {e}", bins.gateway.display()))?;
        if !made.status.success() {
            return Err(format!("gateway certs: {}", String::from_utf8_lossy(&made.stderr)));
        }
        for &g in layout.gateways {
            fleet.gateway(g)?;
        }
        Ok(Some(fleet))
    }

    /// Starts engine `e<host>` on `host`; its process id.
    pub fn engine(&mut self, host: usize) -> Result<u32, String> {
        self.engine_as(host, &format!("e{host}"))
    }

    /// Starts an engine on `host` under another host's id (an engine moved
    /// to another machine keeps its name); its process id.
    pub fn engine_as(&mut self, host: usize, id: &str) -> Result<u32, String> {
        let addr = format!("{}:9000", self.hosts.addr(host));
        let mut cmd = self.hosts.command(host, &self.bins.engine);
        cmd.args(["--listen", &addr, "--advertise", &format!("http://{addr}")])
            .args(["--id", id, "--redis", &self.redis])
            .arg("--api-token-file")
            .arg(self.dir.join("engine.token"))
            .arg("--profile")
            .arg(self.dir.join("profile.toml"))
            .stdout(log(&self.dir, &format!("engine-{host}-{id}"))?)
            .stderr(Stdio::null());
        let pid = self.hosts.spawn(cmd)?;
        wait_port(&addr, "engine")?;
        self.engines.push((host, id.to_string(), pid));
        Ok(pid)
    }

    /// Kills the engine on `host` (SIGKILL).
    pub fn kill_engine(&mut self, host: usize) {
        if let Some(at) = self.engines.iter().position(|e| e.0 == host) {
            let (_, _, pid) = self.engines.remove(at);
            self.hosts.stop(pid);
        }
    }

    /// `redis-cli` against `host:port`; its output.
    pub fn cli(&self, host: usize, port: u16, args: &[&str]) -> String {
        std::process::Command::new("redis-cli")
            .args(["-h", &self.hosts.addr(host).to_string(), "-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }

    fn sentinel(&mut self, replica: usize, sentinels: &[usize]) -> Result<(), String> {
        let primary = self.hosts.addr(0).to_string();
        let a = self.hosts.addr(replica).to_string();
        let mut cmd = self.hosts.command(replica, "redis-server");
        cmd.args(["--bind", &a, "--port", "6379", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(redis_dir(&self.dir, replica)?)
            .args(["--protected-mode", "no", "--replicaof", &primary, "6379"])
            .stdout(log(&self.dir, "replica")?);
        let pid = self.hosts.spawn(cmd)?;
        self.redis_pids.push((replica, pid));
        for &h in sentinels {
            let dir = self.dir.join(format!("sentinel-{h}"));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port 26379\nbind {}\nprotected-mode no\ndir {}\nsentinel monitor fleet {primary} 6379 2\n\
                     sentinel down-after-milliseconds fleet 1000\nsentinel failover-timeout fleet 5000\n\
                     sentinel parallel-syncs fleet 1\n",
                    self.hosts.addr(h),
                    dir.display()
                ),
            )
            .map_err(|e| e.to_string())?;
            let mut cmd = self.hosts.command(h, "redis-server");
            cmd.arg(&conf).arg("--sentinel").stdout(log(&self.dir, &format!("sentinel-{h}"))?);
            let pid = self.hosts.spawn(cmd)?;
            self.redis_pids.push((h, pid));
        }
        let start = crate::clock::now();
        loop {
            let master = self.cli(sentinels[0], 26379, &["SENTINEL", "MASTER", "fleet"]);
            let synced = self.cli(replica, 6379, &["INFO", "replication"]).contains("master_link_status:up");
            let seen = |k: &str, v: &str| {
                master.lines().collect::<Vec<_>>().windows(2).any(|w| w[0] == k && w[1] == v)
            };
            if synced
                && seen("num-other-sentinels", &(sentinels.len() - 1).to_string())
                && seen("num-slaves", "1")
            {
                break;
            }
            if crate::clock::since(start) > Duration::from_secs(30) {
                return Err(
                    "the replica did not sync or the sentinels did not find each other in 30 s".into()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let hosts: Vec<String> = sentinels.iter().map(|&h| format!("{}:26379", self.hosts.addr(h))).collect();
        self.redis = format!("redis+sentinel://{}/fleet", hosts.join(","));
        Ok(())
    }

    fn gateway(&mut self, host: usize) -> Result<(), String> {
        let d = &self.dir;
        let a = self.hosts.addr(host);
        // Each gateway its own copy: a policy published through the fleet
        // is written back to the file the gateway was started with.
        let policies = d.join(format!("policies-{host}.toml"));
        std::fs::copy(d.join("policy.toml"), &policies).map_err(|e| e.to_string())?;
        let config = format!(
            "listen = \"{a}:8443\"\nplaintext_listen = \"{a}:8080\"\npolicies = {policies:?}\n\
             engine_token_file = {:?}\n[tls]\ncert = {:?}\nkey = {:?}\n\
             [admin]\nlisten = \"{a}:9444\"\n[[admin.tokens]]\nid = \"ops\"\ntoken = \"{ADMIN_TOKEN}\"\n\
             [cluster]\nengine_ttl_s = 5\nnode_id = \"g{host}-{}\"\npolicy_key_file = {:?}\n",
            d.join("engine.token"),
            d.join("certs/server.pem"),
            d.join("certs/server.key"),
            self.gateway_pids.len(),
            d.join("policy.key"),
        );
        let file = d.join(format!("gateway-{host}.toml"));
        std::fs::write(&file, config).map_err(|e| e.to_string())?;
        let mut cmd = self.hosts.command(host, &self.bins.gateway);
        cmd.arg("serve").arg("--config").arg(&file).args(["--redis", &self.redis]);
        let n = self.gateway_pids.iter().filter(|g| g.0 == host).count();
        cmd.stdout(log(d, &format!("gateway-{host}-{n}-out"))?)
            .stderr(log(d, &format!("gateway-{host}-{n}"))?);
        let pid = self.hosts.spawn(cmd)?;
        self.gateway_pids.push((host, pid));
        wait_port(&format!("{a}:8080"), "gateway")
    }

    /// The process id of the gateway running on `host`.
    pub fn gateway_pid(&self, host: usize) -> Option<u32> {
        self.gateway_pids.iter().rev().find(|g| g.0 == host).map(|g| g.1)
    }

    /// Stops the gateway on `host` as an orchestrator does (SIGTERM: it
    /// leaves rotation, refuses new connections after its grace, sends
    /// GOAWAY and drains its open streams up to its bound), then starts it
    /// again. How long the stop took, and whether it exited by itself
    /// within 15 s.
    pub fn restart_gateway(&mut self, host: usize) -> Result<(Duration, bool), String> {
        let pid = self.gateway_pid(host).ok_or("no gateway on that host")?;
        let stopped = self.hosts.terminate(pid, Duration::from_secs(15));
        self.gateway(host)?;
        Ok(stopped)
    }

    /// Kills the gateway on `host` (SIGKILL).
    pub fn kill_gateway(&mut self, host: usize) {
        if let Some(pid) = self.gateway_pid(host) {
            self.hosts.stop(pid);
        }
    }

    /// Starts the gateway on `host` again (after [`Fleet::kill_gateway`]).
    pub fn start_gateway(&mut self, host: usize) -> Result<(), String> {
        self.gateway(host)
    }

    /// The plaintext URL of the gateway on `host`.
    pub fn url(&self, host: usize) -> String {
        format!("http://{}:8080", self.hosts.addr(host))
    }

    /// A TLS connection to the admin listener of the gateway on `host`.
    pub async fn admin(&self, host: usize) -> Result<Conn, String> {
        let url = format!("https://{}:9444", self.hosts.addr(host));
        Conn::connect(&url, Some(&self.dir.join("certs/ca.pem")), Proto::H2).await.map_err(|e| e.to_string())
    }

    /// The gateway on `host`'s Prometheus text ("" when it does not answer).
    pub async fn metrics(&self, host: usize) -> String {
        let Ok(conn) = self.admin(host).await else { return String::new() };
        match conn.get("/metrics", Some(ADMIN_TOKEN)).await {
            Ok(r) => String::from_utf8_lossy(&body_bytes(r).await.unwrap_or_default()).to_string(),
            Err(_) => String::new(),
        }
    }

    /// The gateway on `host`'s `/readyz` document (null when it does not
    /// answer).
    pub async fn readyz(&self, host: usize) -> serde_json::Value {
        let Ok(conn) = Conn::connect(&self.url(host), None, Proto::Http1).await else {
            return serde_json::Value::Null;
        };
        let Ok(resp) = conn.get("/readyz", None).await else { return serde_json::Value::Null };
        serde_json::from_slice(&body_bytes(resp).await.unwrap_or_default()).unwrap_or_default()
    }

    /// One non-streamed gold chat through the first gateway.
    pub async fn chat(&self) -> (u16, String, Duration) {
        self.chat_on(self.gateways[0]).await.0
    }

    /// One non-streamed gold chat through the gateway on `host`: its
    /// status, the engine that answered and how long it took, and the
    /// policy version it was decided under.
    pub async fn chat_on(&self, host: usize) -> ((u16, String, Duration), String) {
        let start = crate::clock::now();
        let Ok(conn) = Conn::connect(&self.url(host), None, Proto::Http1).await else {
            return ((0, String::new(), crate::clock::since(start)), String::new());
        };
        let body = serde_json::json!({"model": "synthetic-small", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello over the switch"}]});
        match conn.post_json("/v1/chat/completions", Some("sk-demo-gold"), body.to_string()).await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let header =
                    |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let (engine, version) = (header("x-engine"), header("x-policy-version"));
                let _ = body_bytes(resp).await;
                ((status, engine, crate::clock::since(start)), version)
            }
            Err(_) => ((0, String::new(), crate::clock::since(start)), String::new()),
        }
    }

    /// Chats through the first gateway until every engine in `ids` has
    /// answered one (30 s at most).
    pub async fn until_served_by(&self, ids: &[&str]) -> Result<(), String> {
        self.until_served_on(self.gateways[0], ids).await
    }

    /// Chats through the gateway on `host` until every engine in `ids` has
    /// answered one (30 s at most).
    pub async fn until_served_on(&self, host: usize, ids: &[&str]) -> Result<(), String> {
        let start = crate::clock::now();
        let mut seen = std::collections::BTreeSet::new();
        while !ids.iter().all(|id| seen.contains(*id)) {
            if crate::clock::since(start) > Duration::from_secs(30) {
                return Err(format!(
                    "engines {ids:?} do not all serve through the gateway on host {host} within 30 s (seen {seen:?}); logs in {}",
                    self.dir.display()
                ));
            }
            let ((status, engine, _), _) = self.chat_on(host).await;
            if status == 200 {
                seen.insert(engine);
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}
