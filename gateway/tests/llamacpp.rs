//! The gateway in front of a real third-party engine: llama.cpp's own
//! `llama-server` (built from source by `scripts/build-llama-server`, which
//! the test command runs), serving a tiny random-weight llama model that
//! `tests/fixtures/tiny_llama.py` writes with the `gguf` package. Through
//! the gateway (`kind = "openai"`, `flavour = "llamacpp"`): the official
//! OpenAI Python client, streaming and not, chat and completions;
//! cancellation reaching the server; admission refusing with a reason when
//! the server's slots are full; load read from the server's `/metrics`; and
//! the server killed mid-stream. Without the server built it skips loudly,
//! except under CI.
// Real processes in real time (the clock rule is for the gateway's code).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Conn, Proto};
use tokio::process::{Child, Command};

/// `llama-server` and the python with `gguf`, if built.
fn llama_tools() -> Option<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/llama.cpp");
    let server =
        std::env::var_os("LLAMA_SERVER").map_or_else(|| root.join("bin/llama-server"), PathBuf::from);
    let python = root.join("venv/bin/python");
    if server.exists() && python.exists() {
        return Some((server, python));
    }
    assert!(std::env::var_os("CI").is_none(), "CI must build llama-server (scripts/build-llama-server)");
    eprintln!("SKIPPED: run scripts/build-llama-server to test against a real llama.cpp server");
    None
}

struct Llama {
    child: Child,
    url: String,
}

impl Llama {
    /// `llama-server` with `parallel` slots on a free port, once healthy.
    async fn start(dir: &Path, parallel: u32) -> Self {
        let (server, python) = llama_tools().expect("checked by the caller");
        // One model file for all the tests of this process, written once.
        static MODEL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        let model = MODEL.get_or_init(|| {
            let model = dir.join("tiny.gguf");
            let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_llama.py");
            let out = std::process::Command::new(&python).arg(fixture).arg(&model).output().unwrap();
            assert!(out.status.success(), "the model fixture: {}", String::from_utf8_lossy(&out.stderr));
            model
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.join(format!("llama-{port}.log"))).unwrap();
        let child = Command::new(server)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", &parallel.to_string(), "-c", &(8192 * parallel).to_string()])
            .args(["--threads", "1", "--metrics", "--no-webui"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("llama-server starts");
        let url = format!("http://127.0.0.1:{port}");
        let healthy = async {
            loop {
                if let Ok(c) = Conn::connect(&url, None, Proto::Http1).await {
                    if c.get("/health", None).await.is_ok_and(|r| r.status() == StatusCode::OK) {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), healthy)
            .await
            .expect("llama-server healthy within 60 s");
        Self { child, url }
    }

    /// A gauge of the server's `/metrics`.
    async fn gauge(&self, name: &str) -> f64 {
        let c = Conn::connect(&self.url, None, Proto::Http1).await.unwrap();
        let text =
            String::from_utf8(body_bytes(c.get("/metrics", None).await.unwrap()).await.unwrap().to_vec())
                .unwrap();
        metric(&text, name).unwrap_or_else(|| panic!("{name} in {text}"))
    }

    fn engines(&self, max_batch: u32) -> String {
        format!(
            "[[engines]]\nid = \"llama\"\nurl = \"{}\"\nkind = \"openai\"\n\
             upstream = {{ flavour = \"llamacpp\", max_batch = {max_batch}, served_model = \"tiny-llama\" }}\n",
            self.url
        )
    }
}

/// A gateway (with `extra` config after its engines) over a llama-server of
/// `slots` slots, and a long (about 5 s) streamed generation through it
/// whose first chunk has been read.
async fn long_stream(slots: u32, extra: &str) -> (Llama, System, Conn, hyper::body::Incoming) {
    let llama = Llama::start(&scratch(), slots).await;
    let sys = System::serve(&format!("{}{extra}", llama.engines(slots)), &default_policy()).await;
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("go on", 4000, true)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", sys.log());
    let mut body = resp.into_body();
    let first = http_body_util::BodyExt::frame(&mut body).await.expect("a first chunk").unwrap();
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    (llama, sys, conn, body)
}

/// The rest of a stream (within 10 s), which must end cleanly.
async fn rest_of(body: hyper::body::Incoming) -> String {
    let rest = tokio::time::timeout(Duration::from_secs(10), http_body_util::BodyExt::collect(body))
        .await
        .expect("the stream ends within 10 s")
        .expect("ends cleanly, with an error event")
        .to_bytes();
    String::from_utf8_lossy(&rest).into_owned()
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llamacpp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn the_official_openai_client_through_the_gateway_to_llama_server() {
    if llama_tools().is_none() {
        return;
    }
    let llama = Llama::start(&scratch(), 2).await;
    let sys = System::serve(&llama.engines(2), &default_policy()).await;
    run_openai_script(&sys, "openai_llamacpp.py").await;
    // The gateway read the server's own metrics into its load report.
    let ready = sys.readyz().await;
    let engine = &ready["detail"]["engines"][0];
    assert_eq!(engine["id"], "llama", "{ready}");
    assert_eq!(engine["ready"], true, "{ready}");
    assert_eq!(engine["load"]["backend"], "external", "{ready}");
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_generation_at_llama_server() {
    if llama_tools().is_none() {
        return;
    }
    let (llama, _sys, conn, body) = long_stream(2, "").await;
    assert_eq!(llama.gauge("llamacpp:requests_processing").await, 1.0, "generating while we read");
    drop(body); // the client goes away mid-stream
    drop(conn);
    let idle = async {
        while llama.gauge("llamacpp:requests_processing").await != 0.0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), idle)
        .await
        .expect("llama-server stops the generation within 2 s");
}

#[tokio::test]
async fn with_the_servers_slots_full_admission_refuses_with_a_reason() {
    if llama_tools().is_none() {
        return;
    }
    let llama = Llama::start(&scratch(), 1).await;
    let sys = System::serve(&llama.engines(1), &default_policy()).await;
    let conn = sys.conn(Proto::H2).await;
    // One long generation holds the server's only slot...
    let long =
        conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("go on", 4000, true)).await.unwrap();
    assert_eq!(long.status(), StatusCode::OK);
    // ...so a request that must start within 100 ms is refused, with why.
    let req = request("/v1/chat/completions", GOLD, chat_body("hi", 8, true), &[("x-slo-ttft-ms", "100")]);
    let refused = conn.send(req).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "{}", sys.log());
    let reason = header(&refused, "x-admission-reason").to_string();
    assert!(!reason.is_empty());
    assert!(!header(&refused, "retry-after").is_empty());
    let err = json(&body_bytes(refused).await.unwrap());
    assert_eq!(err["error"]["code"], reason.as_str(), "{err}");
    drop(long);
}

#[tokio::test]
async fn llama_server_killed_mid_stream_ends_the_stream_with_an_error_event() {
    if llama_tools().is_none() {
        return;
    }
    let (mut llama, _sys, _conn, body) = long_stream(1, "").await;
    llama.child.kill().await.unwrap();
    let text = rest_of(body).await;
    assert!(text.contains("\"error\""), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
}

#[tokio::test]
async fn llama_server_stopped_mid_stream_is_cut_at_the_event_timeout() {
    if llama_tools().is_none() {
        return;
    }
    // A short event timeout, so that a stopped (SIGSTOP) server costs 1 s
    // (a stopped server left behind is killed with its child handle).
    let (llama, _sys, _conn, body) = long_stream(1, "[limits]\nengine_event_timeout_ms = 1000\n").await;
    let pid = llama.child.id().unwrap();
    signal(pid, "STOP");
    let started = std::time::Instant::now();
    let text = rest_of(body).await;
    signal(pid, "CONT");
    assert!(text.contains("no event from the engine for 1s"), "{text}");
    assert!(!text.contains("[DONE]"));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}
