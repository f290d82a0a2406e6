//! Engine-to-engine state transfer between two real engine processes, each
//! with its own API token: the target pulls a copy straight from the source
//! under a one-time token while the source keeps generating, then only
//! what changed; after the commit both hold byte-identical state. A wrong
//! token is refused; a staged copy runs no chunk; a source killed mid-pull
//! leaves the target with nothing half-installed.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use std::process::Stdio;

use bytes::Bytes;
use http_body_util::Full;
use loadtest::client::{body_bytes, Conn, Proto};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TOKEN: &str = "engine-token-0123456789";
const TRANSFER: &str = "0123456789abcdef0123456789abcdef";

struct Engine {
    child: Child,
    conn: Conn,
    url: String,
}

async fn start(state_mib: &str) -> Engine {
    let dir = std::env::temp_dir().join(format!(
        "engine-xfer-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", "127.0.0.1:0", "--id", "x", "--exit-on-stdin-eof", "--video-state-mib", state_mib])
        .arg("--api-token-file")
        .arg(dir.join("token"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap()).lines().next_line().await.unwrap().unwrap();
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("listen=")).unwrap().to_string();
    let url = format!("http://{addr}");
    let conn = Conn::connect(&url, None, Proto::H2).await.unwrap();
    Engine { child, conn, url }
}

impl Engine {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self.conn.post_json(path, Some(TOKEN), body.to_string()).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = body_bytes(resp).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn chunk(&self, id: &str) -> (u16, Value) {
        let fidelity = json!({"steps": 2, "sparsity_pct": 0, "window": 1, "precision": "fp16"});
        self.post(
            &format!("/engine/v1/video/sessions/{id}/chunk"),
            json!({"epoch": 0, "fidelity": fidelity, "key": 0.0, "credit": 1.0}),
        )
        .await
    }

    /// The session's whole wire form, as a pulling engine would get it.
    async fn snapshot(&self, id: &str, token: Option<&str>) -> (u16, Bytes) {
        let mut req = http::Request::get(format!("/engine/v1/video/sessions/{id}/snapshot"));
        if let Some(t) = token {
            req = req.header("x-transfer-token", t);
        }
        let resp = self.conn.send(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        (status, body_bytes(resp).await.unwrap())
    }
}

fn session(id: &str) -> Value {
    json!({"id": id, "prompt": "a heron at dawn", "resolution": "tiny", "latent_frames": 3})
}

#[tokio::test]
async fn the_target_pulls_while_the_source_generates_and_ends_with_identical_state() {
    let (a, b) = tokio::join!(start("8"), start("8"));
    assert_eq!(a.post("/engine/v1/video/sessions", session("s")).await.0, 201);
    for _ in 0..3 {
        assert_eq!(a.chunk("s").await.0, 200);
    }
    // No offer yet: a snapshot is refused even with a well-formed token,
    // and without one the engine's API token is needed.
    assert_eq!(a.snapshot("s", Some(TRANSFER)).await.0, 403);
    assert_eq!(a.snapshot("s", None).await.0, 401);
    let (s, v) = a.post("/engine/v1/video/sessions/s/offer", json!({"token": TRANSFER})).await;
    assert_eq!((s, v["epoch"].as_u64(), v["chunks"].as_u64()), (200, Some(0), Some(3)), "{v}");
    assert_eq!(a.snapshot("s", Some("wrong-wrong-wrong-wrong")).await.0, 403);
    // The pre-copy: B stages all of it (8 MiB of KV plus the model state).
    let (s, copy) =
        b.post("/engine/v1/video/sessions/s/pull", json!({"from": a.url, "token": TRANSFER})).await;
    assert_eq!(s, 200, "{copy}");
    let full = copy["bytes"].as_u64().unwrap();
    assert!(full >= 8 << 20, "{copy}");
    // A staged copy is not a session: it runs no chunk.
    assert_eq!(b.chunk("s").await.0, 404);
    // The source keeps generating meanwhile.
    for _ in 0..2 {
        assert_eq!(a.chunk("s").await.0, 200);
    }
    // The switch: only the two chunks' pages and the model state move.
    let (s, delta) =
        b.post("/engine/v1/video/sessions/s/commit", json!({"from": a.url, "token": TRANSFER})).await;
    assert_eq!(s, 200, "{delta}");
    let moved = delta["bytes"].as_u64().unwrap();
    assert!(moved * 3 < full, "delta {moved} of {full} bytes");
    // Byte-identical: both engines' whole wire forms match.
    b.post("/engine/v1/video/sessions/s/offer", json!({"token": TRANSFER})).await;
    let (sa, wa) = a.snapshot("s", Some(TRANSFER)).await;
    let (sb, wb) = b.snapshot("s", Some(TRANSFER)).await;
    assert_eq!((sa, sb), (200, 200));
    assert!(wa == wb, "the target's state differs from the source's");
    // The target generates the next chunk from where the source stopped.
    let (s, out) = b.chunk("s").await;
    assert_eq!((s, out["index"].as_u64()), (200, Some(5)), "{out}");
}

#[tokio::test]
async fn a_source_killed_mid_pull_leaves_the_target_with_nothing() {
    let (mut a, b) = tokio::join!(start("512"), start("0"));
    assert_eq!(a.post("/engine/v1/video/sessions", session("s")).await.0, 201);
    a.post("/engine/v1/video/sessions/s/offer", json!({"token": TRANSFER})).await;
    let url = a.url.clone();
    let pull = b.post("/engine/v1/video/sessions/s/pull", json!({"from": url, "token": TRANSFER}));
    let kill = async {
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        a.child.start_kill().unwrap();
    };
    let ((s, body), ()) = tokio::join!(pull, kill);
    assert_eq!(s, 502, "{body}");
    assert_eq!(body["code"], "transfer_failed", "{body}");
    // Nothing staged, nothing to commit, no session.
    let (s, _) = b.post("/engine/v1/video/sessions/s/commit", json!({"from": url, "token": TRANSFER})).await;
    assert_eq!(s, 502);
    assert_eq!(b.chunk("s").await.0, 404);
    let resp = b.conn.send(
        http::Request::delete("/engine/v1/video/sessions/s/staged")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    );
    assert_eq!(resp.await.unwrap().status(), 404);
}

#[tokio::test]
async fn a_synchronous_move_carries_a_kv_window_larger_than_a_request_body() {
    // 32 MiB of KV: over the 16 MiB bound of other request bodies.
    let (a, b) = tokio::join!(start("32"), start("32"));
    assert_eq!(a.post("/engine/v1/video/sessions", session("s")).await.0, 201);
    assert_eq!(a.chunk("s").await.0, 200);
    let auth = format!("Bearer {TOKEN}");
    let req = http::Request::post("/engine/v1/video/sessions/s/export").header("authorization", &auth);
    let resp = a.conn.send(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let state = body_bytes(resp).await.unwrap();
    assert!(state.len() > 32 << 20);
    let req = http::Request::put("/engine/v1/video/sessions/s/import").header("authorization", &auth);
    let resp = b.conn.send(req.body(Full::new(state)).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(b.chunk("s").await.1["index"], 1);
}

#[tokio::test]
async fn a_source_killed_after_the_pre_copy_leaves_a_copy_the_target_adopts() {
    let (mut a, b) = tokio::join!(start("8"), start("8"));
    assert_eq!(a.post("/engine/v1/video/sessions", session("s")).await.0, 201);
    for _ in 0..3 {
        assert_eq!(a.chunk("s").await.0, 200);
    }
    a.post("/engine/v1/video/sessions/s/offer", json!({"token": TRANSFER})).await;
    let (s, copy) =
        b.post("/engine/v1/video/sessions/s/pull", json!({"from": a.url, "token": TRANSFER})).await;
    assert_eq!(s, 200, "{copy}");
    // Nothing to adopt where nothing was staged.
    assert_eq!(a.post("/engine/v1/video/sessions/t/adopt", json!({})).await.0, 404);
    // The source generates one more chunk, then dies before the switch.
    assert_eq!(a.chunk("s").await.0, 200);
    a.child.start_kill().unwrap();
    let _ = a.child.wait().await;
    let (s, _) =
        b.post("/engine/v1/video/sessions/s/commit", json!({"from": a.url, "token": TRANSFER})).await;
    assert_eq!(s, 502, "no final delta from a dead source");
    // The target owns the state the source offloaded, three chunks in, and
    // generates from there; a second adoption finds the session taken.
    let (s, v) = b.post("/engine/v1/video/sessions/s/adopt", json!({})).await;
    assert_eq!((s, v["epoch"].as_u64(), v["chunks"].as_u64()), (200, Some(0), Some(3)), "{v}");
    let (s, out) = b.chunk("s").await;
    assert_eq!((s, out["index"].as_u64()), (200, Some(3)), "{out}");
    assert_eq!(b.post("/engine/v1/video/sessions/s/adopt", json!({})).await.0, 409);
}
