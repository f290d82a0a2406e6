//! The gateway-overhead benchmark: the same work through the gateway and
//! straight to the engine, interleaved in one run so both see the same
//! machine noise.
//!
//! - Non-streaming: a 1-token completion; latency from send to the last body
//!   byte. Added latency = gateway percentile minus direct percentile.
//! - Streaming: N-token generations; the time between successive tokens as
//!   the client sees them (SSE through the gateway, NDJSON from the engine).
//!
//! Run it against `gateway up --engines 1 --profile
//! policies/profiles/bench-paced.toml` (prefill 0, 5 ms decode steps) so the
//! engine itself adds no noise to the non-streaming numbers; see
//! docs/benchmarks/overhead.md.

use std::path::PathBuf;
use std::time::Instant;

use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::json;

use crate::client::{ClientError, Conn, Proto};
use crate::progress::Progress;
use crate::sse::SseParser;
use crate::stats::Summary;

/// Options of `loadtest overhead`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    /// Gateway base URL.
    #[arg(long, default_value = "https://localhost:8443")]
    pub gateway: String,
    /// CA certificate to trust for the gateway.
    #[arg(long, default_value = "certs/ca.pem")]
    pub ca: PathBuf,
    /// API key.
    #[arg(long, default_value = "sk-demo-gold")]
    pub key: String,
    /// Engine base URL; by default the first engine in the gateway's /readyz.
    #[arg(long)]
    pub engine: Option<String>,
    /// The engines' API token, for the direct requests: this file (`gateway
    /// up` writes it), else `ENGINE_API_TOKEN`, else none.
    #[arg(long, default_value = "certs/engine.token")]
    pub engine_token_file: PathBuf,
    /// Model name.
    #[arg(long, default_value = "synthetic-small")]
    pub model: String,
    /// Non-streaming request pairs (gateway + direct) to measure.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Streaming generation pairs to measure.
    #[arg(long, default_value_t = 40)]
    pub streams: usize,
    /// Tokens per streaming generation.
    #[arg(long, default_value_t = 64)]
    pub tokens: u32,
    /// Warm-up pairs before measuring (not recorded).
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Write the JSON report here too.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also a reverse proxy in front of the same engine (nginx from
    /// `scripts/bench-proxies`, say), sent the engine's own requests in the
    /// same interleaved run: its added non-streaming latency beside the
    /// gateway's, under the same machine noise. `https` URLs trust `--ca`.
    #[arg(long)]
    pub proxy: Option<String>,
}

/// Results in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadReport {
    pub gateway: String,
    pub engine: String,
    pub nonstream_gateway_ms: Summary,
    pub nonstream_direct_ms: Summary,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    pub tbt_gateway_ms: Summary,
    pub tbt_direct_ms: Summary,
    pub tbt_diff_p50_ms: f64,
    pub tbt_diff_p99_ms: f64,
    /// With `--proxy`.
    pub proxy: Option<ProxySide>,
}

/// The `--proxy` side of the run.
#[derive(Debug, Clone, Serialize)]
pub struct ProxySide {
    pub url: String,
    pub nonstream_ms: Summary,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum OverheadError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Protocol(String),
}

/// Runs the benchmark.
pub async fn run(args: &OverheadArgs) -> Result<OverheadReport, OverheadError> {
    let gw = Conn::connect(&args.gateway, Some(&args.ca), Proto::H2).await?;
    let engine_url = match &args.engine {
        Some(u) => u.clone(),
        None => first_engine(&gw).await?,
    };
    let direct = Conn::connect(&engine_url, None, Proto::H2).await?;
    let proxy = match &args.proxy {
        Some(url) => Some(Conn::connect(url, Some(&args.ca), Proto::H2).await?),
        None => None,
    };
    let mut progress = Progress::new(args.warmup + args.requests + args.streams);
    let sides = Sides { gw: &gw, direct: &direct, proxy: proxy.as_ref() };
    let [gw_ms, direct_ms, proxy_ms] = nonstream_rounds(&sides, args, &mut progress).await?;
    let (mut gw_tbt, mut direct_tbt) = (Vec::new(), Vec::new());
    for _ in 0..args.streams {
        gw_tbt.extend(stream_gateway(&gw, args).await?);
        direct_tbt.extend(stream_direct(&direct, args).await?);
        progress.tick();
    }
    progress.done();
    let s = |v: &[f64], what: &str| {
        Summary::of(v).ok_or_else(|| OverheadError::Protocol(format!("no {what} samples")))
    };
    let (ng, nd) = (s(&gw_ms, "gateway")?, s(&direct_ms, "direct")?);
    let (tg, td) = (s(&gw_tbt, "gateway TBT")?, s(&direct_tbt, "direct TBT")?);
    let proxy = match &args.proxy {
        Some(url) => {
            let np = s(&proxy_ms, "proxy")?;
            Some(ProxySide {
                url: url.clone(),
                added_p50_ms: np.p50 - nd.p50,
                added_p99_ms: np.p99 - nd.p99,
                nonstream_ms: np,
            })
        }
        None => None,
    };
    Ok(OverheadReport {
        proxy,
        gateway: args.gateway.clone(),
        engine: engine_url,
        added_p50_ms: ng.p50 - nd.p50,
        added_p99_ms: ng.p99 - nd.p99,
        tbt_diff_p50_ms: tg.p50 - td.p50,
        tbt_diff_p99_ms: tg.p99 - td.p99,
        nonstream_gateway_ms: ng,
        nonstream_direct_ms: nd,
        tbt_gateway_ms: tg,
        tbt_direct_ms: td,
    })
}

/// The connections one non-streaming round goes through.
struct Sides<'a> {
    gw: &'a Conn,
    direct: &'a Conn,
    proxy: Option<&'a Conn>,
}

/// Latencies of the measured non-streaming rounds: gateway, direct and
/// proxy (empty without one). Each round sends to every side once, the
/// order rotating so no side always runs on a warmer cache.
async fn nonstream_rounds(
    sides: &Sides<'_>,
    args: &OverheadArgs,
    progress: &mut Progress,
) -> Result<[Vec<f64>; 3], OverheadError> {
    let n = if sides.proxy.is_some() { 3 } else { 2 };
    let mut ms: [Vec<f64>; 3] = Default::default();
    for i in 0..args.warmup + args.requests {
        let mut took = [0.0; 3];
        for k in 0..n {
            let side = (i + k) % n;
            took[side] = match (side, sides.proxy) {
                (0, _) => nonstream_gateway(sides.gw, args).await?,
                (1, _) => nonstream_direct(sides.direct, args).await?,
                (_, Some(p)) => nonstream_direct(p, args).await?,
                (_, None) => unreachable!("two sides without a proxy"),
            };
        }
        if i >= args.warmup {
            for side in 0..n {
                ms[side].push(took[side]);
            }
        }
        progress.tick();
    }
    Ok(ms)
}

async fn first_engine(gw: &Conn) -> Result<String, OverheadError> {
    let body = crate::client::body_bytes(gw.get("/readyz", None).await?).await?;
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| OverheadError::Protocol(e.to_string()))?;
    let engines = v["detail"]["engines"].as_array().cloned().unwrap_or_default();
    if engines.len() != 1 {
        eprintln!(
            "note: the gateway has {} engines; measuring against the first (use --engines 1)",
            engines.len()
        );
    }
    engines
        .first()
        .and_then(|e| e["url"].as_str())
        .map(|u| u.trim_end_matches('/').to_string())
        .ok_or_else(|| OverheadError::Protocol("no engine in /readyz detail".into()))
}

const PROMPT: &str = "measure the gateway overhead";

async fn nonstream_gateway(gw: &Conn, a: &OverheadArgs) -> Result<f64, OverheadError> {
    let body = json!({"model": a.model, "prompt": PROMPT, "max_tokens": 1}).to_string();
    timed(gw.post_json("/v1/completions", Some(&a.key), body)).await
}

async fn nonstream_direct(engine: &Conn, a: &OverheadArgs) -> Result<f64, OverheadError> {
    let body =
        json!({"request_id": "bench", "model": a.model, "prompt": PROMPT, "max_tokens": 1}).to_string();
    timed(engine.post_json("/engine/v1/generate", engine_token(a).as_deref(), body)).await
}

/// The engines' API token (see [`OverheadArgs::engine_token_file`]).
fn engine_token(a: &OverheadArgs) -> Option<String> {
    std::fs::read_to_string(&a.engine_token_file)
        .ok()
        .or_else(|| std::env::var("ENGINE_API_TOKEN").ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

async fn timed(
    send: impl std::future::Future<Output = Result<http::Response<hyper::body::Incoming>, ClientError>>,
) -> Result<f64, OverheadError> {
    let t = crate::clock::now();
    let resp = send.await?;
    if !resp.status().is_success() {
        return Err(OverheadError::Protocol(format!("status {}", resp.status())));
    }
    crate::client::body_bytes(resp).await?;
    Ok(crate::clock::since(t).as_secs_f64() * 1e3)
}

/// Time between successive token events of one generation.
async fn stream_gateway(gw: &Conn, a: &OverheadArgs) -> Result<Vec<f64>, OverheadError> {
    let body =
        json!({"model": a.model, "prompt": PROMPT, "max_tokens": a.tokens, "stream": true}).to_string();
    let mut resp = gw.post_json("/v1/completions", Some(&a.key), body).await?;
    let mut parser = SseParser::new();
    let mut arrivals = Vec::new();
    while let Some(frame) = resp.body_mut().frame().await {
        let Ok(data) = frame.map_err(ClientError::from)?.into_data() else { continue };
        let now = crate::clock::now();
        for ev in parser.push(&data) {
            let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap_or_default();
            if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
                arrivals.push(now);
            }
        }
    }
    Ok(gaps(&arrivals))
}

async fn stream_direct(engine: &Conn, a: &OverheadArgs) -> Result<Vec<f64>, OverheadError> {
    let body = json!({"request_id": "bench", "model": a.model, "prompt": PROMPT, "max_tokens": a.tokens})
        .to_string();
    let mut resp = engine.post_json("/engine/v1/generate", engine_token(a).as_deref(), body).await?;
    let mut arrivals = Vec::new();
    while let Some(frame) = resp.body_mut().frame().await {
        let Ok(data) = frame.map_err(ClientError::from)?.into_data() else { continue };
        let now = crate::clock::now();
        let tokens = data.split(|b| *b == b'\n').filter(|l| l.starts_with(b"{\"event\":\"token\"")).count();
        arrivals.extend(std::iter::repeat_n(now, tokens));
    }
    Ok(gaps(&arrivals))
}

fn gaps(arrivals: &[Instant]) -> Vec<f64> {
    arrivals.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3).collect()
}
