//! Load for chaos scenarios: streaming chat completions sent open-loop, each
//! read to its end and classified (finished with `[DONE]`, refused with a
//! status, ended with an error event, cut off, or failed in transport).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde::Serialize;

use crate::client::Conn;
use crate::sse::SseParser;
use crate::stats::percentile;

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Seconds from the scenario's start.
    pub sent_s: f64,
    /// `ok`, `status_503`, `error_event:<code>`, `cut_off`, `transport`, `timeout`.
    pub outcome: String,
    pub ttft_s: Option<f64>,
    /// When its error (event or status) arrived, seconds from the start.
    pub ended_s: f64,
    pub engine: String,
}

impl Record {
    pub fn ok(&self) -> bool {
        self.outcome == "ok"
    }
}

/// Sends one streaming request and reads it to the end (at most `limit`).
pub async fn one(conn: &Conn, key: &str, body: &str, t0: Instant, limit: Duration) -> Record {
    let sent = crate::clock::now();
    let at = |i: Instant| i.duration_since(t0).as_secs_f64();
    let mut rec = Record {
        sent_s: at(sent),
        outcome: String::new(),
        ttft_s: None,
        ended_s: 0.0,
        engine: String::new(),
    };
    let run = async {
        let resp = match conn.post_json("/v1/chat/completions", Some(key), body.to_string()).await {
            Ok(r) => r,
            Err(_) => return "transport".to_string(),
        };
        rec.engine = resp.headers().get("x-engine").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        if resp.status() != 200 {
            return format!("status_{}", resp.status().as_u16());
        }
        let mut body = resp.into_body();
        let mut parser = SseParser::new();
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if rec.ttft_s.is_none() {
                        rec.ttft_s = Some(crate::clock::since(sent).as_secs_f64());
                    }
                    for e in parser.push(&frame.into_data().unwrap_or_default()) {
                        if e.data == "[DONE]" {
                            return "ok".to_string();
                        }
                        if e.data.starts_with("{\"error\"") {
                            let v: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
                            return format!("error_event:{}", v["error"]["code"].as_str().unwrap_or("?"));
                        }
                    }
                }
                Some(Err(_)) => return "transport".to_string(),
                None => return "cut_off".to_string(),
            }
        }
    };
    rec.outcome = tokio::time::timeout(limit, run).await.unwrap_or_else(|_| "timeout".to_string());
    rec.ended_s = at(crate::clock::now());
    rec
}

/// Sends `rate` requests per second for `duration` (evenly spaced, spread
/// over `conns`), each read to its end; returns every record once all end.
pub async fn open_loop(
    conns: &[Conn],
    key: &str,
    body: &str,
    rate: f64,
    duration: Duration,
    t0: Instant,
    limit: Duration,
) -> Vec<Record> {
    let n = (rate * duration.as_secs_f64()).round() as usize;
    let out = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut tasks = tokio::task::JoinSet::new();
    let start = crate::clock::now();
    for i in 0..n {
        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate)).into()).await;
        let (conn, key, body, out) =
            (conns[i % conns.len()].clone(), key.to_string(), body.to_string(), Arc::clone(&out));
        tasks.spawn(async move {
            let r = one(&conn, &key, &body, t0, limit).await;
            out.lock().unwrap_or_else(|p| p.into_inner()).push(r);
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut v = std::mem::take(&mut *out.lock().unwrap_or_else(|p| p.into_inner()));
    v.sort_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
    v
}

/// Counts and TTFT percentiles of a set of records.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    pub requests: usize,
    pub ok: usize,
    pub failures: usize,
    /// Failures by outcome.
    pub by_kind: BTreeMap<String, usize>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
}

impl Tally {
    pub fn of<'a>(records: impl IntoIterator<Item = &'a Record>) -> Self {
        let mut t = Tally::default();
        let mut ttft = Vec::new();
        for r in records {
            t.requests += 1;
            if r.ok() {
                t.ok += 1;
                ttft.extend(r.ttft_s.map(|s| s * 1e3));
            } else {
                t.failures += 1;
                *t.by_kind.entry(r.outcome.clone()).or_default() += 1;
            }
        }
        t.ttft_p50_ms = percentile(&ttft, 0.5);
        t.ttft_p99_ms = percentile(&ttft, 0.99);
        t
    }
}

/// A chat body asking for exactly `tokens` output tokens of a short prompt.
pub fn chat(model: &str, tokens: u32) -> String {
    serde_json::json!({
        "model": model, "stream": true, "max_tokens": tokens,
        "messages": [{"role": "user", "content": "chaos"}],
    })
    .to_string()
}
