//! `loadtest streams`: many concurrent streamed chat completions held open
//! against one OpenAI-compatible target (our gateway or a peer), and the
//! resident memory of the target's process tree before and while they are
//! held: what a proxy costs per open stream (docs/benchmarks/peers.md, "Against
//! the gateways people run"). The engines behind the target pace the
//! tokens; this command only opens, holds and reads.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::client::{body_bytes, Conn, Proto};

/// Options of `loadtest streams`.
#[derive(Debug, Clone, clap::Args)]
pub struct StreamsArgs {
    /// The target's base URL (`https://...` or `http://...`).
    #[arg(long)]
    pub target: String,
    /// CA certificate to trust for `https` targets.
    #[arg(long, default_value = "certs/ca.pem")]
    pub ca: PathBuf,
    /// Bearer key, if the target wants one.
    #[arg(long)]
    pub key: Option<String>,
    #[arg(long, value_enum, default_value_t = Proto::H2)]
    pub proto: Proto,
    /// The target's process (its descendants are counted too).
    #[arg(long)]
    pub pid: u32,
    /// Concurrent streams to hold.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Streams per HTTP/2 connection (HTTP/1.1: one per connection).
    #[arg(long, default_value_t = 100)]
    pub per_connection: usize,
    /// Tokens each stream asks for (the engines' pace sets how long it lasts).
    #[arg(long, default_value_t = 12)]
    pub tokens: u32,
    #[arg(long, default_value = "synthetic-small")]
    pub model: String,
    /// Give up on a stream after this many seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout_s: u64,
    /// A label for the report.
    #[arg(long, default_value = "target")]
    pub label: String,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct StreamsReport {
    pub label: String,
    pub streams: usize,
    pub connections: usize,
    /// Streams that ended with `data: [DONE]` after a 200.
    pub completed: usize,
    pub failed: usize,
    /// Seconds to open them all.
    pub open_s: f64,
    /// The process tree's RSS after a warm-up, and while every stream is
    /// open (5 s after the last was sent), KiB.
    pub rss_idle_kib: u64,
    pub rss_held_kib: u64,
    /// (held − idle) / streams.
    pub bytes_per_stream: f64,
}

fn chat(model: &str, tokens: u32) -> String {
    serde_json::json!({
        "model": model,
        "max_tokens": tokens,
        "stream": true,
        "messages": [{"role": "user", "content": "hold this stream open"}],
    })
    .to_string()
}

async fn one(conn: &Conn, key: Option<&str>, body: &str, timeout: Duration) -> bool {
    let call = async {
        let resp = conn.post_json("/v1/chat/completions", key, body.to_string()).await.ok()?;
        if resp.status() != 200 {
            return None;
        }
        let bytes = body_bytes(resp).await.ok()?;
        Some(bytes.ends_with(b"data: [DONE]\n\n") || bytes.ends_with(b"data: [DONE]\r\n\r\n"))
    };
    matches!(tokio::time::timeout(timeout, call).await, Ok(Some(true)))
}

/// Opens `args.streams` streams, holds them until they end, and reports.
pub async fn run(args: &StreamsArgs) -> Result<StreamsReport, String> {
    let ca = args.target.starts_with("https").then_some(args.ca.as_path());
    let per = match args.proto {
        Proto::H2 => args.per_connection.max(1),
        Proto::Http1 => 1,
    };
    let n_conns = args.streams.div_ceil(per).max(1);
    let mut conns = Vec::with_capacity(n_conns);
    for i in 0..n_conns {
        let c = Conn::connect(&args.target, ca, args.proto)
            .await
            .map_err(|e| format!("connection {i} of {n_conns}: {e}"))?;
        conns.push(c);
    }
    let key = args.key.as_deref();
    let timeout = Duration::from_secs(args.timeout_s);
    // Warm every path the streams take, then the idle size.
    let warm = chat(&args.model, 1);
    for c in conns.iter().take(20) {
        one(c, key, &warm, timeout).await;
    }
    let idle = crate::cpu::tree_rss_kib(args.pid).ok_or("the target's process is not running")?;
    let body = chat(&args.model, args.tokens);
    let mut tasks = tokio::task::JoinSet::new();
    let t0 = crate::clock::now();
    for i in 0..args.streams {
        let (conn, body, key) = (conns[i / per].clone(), body.clone(), args.key.clone());
        tasks.spawn(async move { one(&conn, key.as_deref(), &body, timeout).await });
        if i % 250 == 249 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let open_s = crate::clock::since(t0).as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held =
        crate::cpu::tree_rss_kib(args.pid).ok_or("the target's process ended while streams were held")?;
    let (mut completed, mut failed) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        if r.unwrap_or(false) {
            completed += 1;
        } else {
            failed += 1;
        }
    }
    Ok(StreamsReport {
        label: args.label.clone(),
        streams: args.streams,
        connections: n_conns,
        completed,
        failed,
        open_s,
        rss_idle_kib: idle,
        rss_held_kib: held,
        bytes_per_stream: held.saturating_sub(idle) as f64 * 1024.0 / args.streams.max(1) as f64,
    })
}
