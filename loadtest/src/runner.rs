//! Executes a plan against a target: each request is spawned at its
//! scheduled time whatever the target is doing (open loop), streamed, and
//! turned into a [`Record`]. Latencies count from the scheduled time, so
//! queueing anywhere — target or harness — shows up in them. The one
//! exception is a conversation's turn that resends the previous answer as
//! received (`answers = "received"`): it waits for that answer, as its user
//! would, and its latencies count from when it could be sent.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::arrival::Planned;
use crate::client::{ClientError, Conn, Proto};
use crate::record::{Admission, Outcome, Record};
use crate::stream::TokenStream;
use crate::workload::Workload;

/// Which API the target speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// The gateway's OpenAI `/v1/completions`, streamed as SSE.
    Openai,
    /// OpenAI's `/v1/chat/completions` (the prompt as one user message),
    /// streamed as SSE: the endpoint most clients use, and the one some
    /// gateways serve on a faster path than text completions.
    Chat,
    /// An engine's `/engine/v1/generate`, streamed as NDJSON (for measuring
    /// an engine directly, or a plain proxy in front of one).
    Engine,
}

/// Where and how to send.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub ca: Option<std::path::PathBuf>,
    pub proto: Proto,
    pub api: Api,
    /// HTTP/2: connections to multiplex over. HTTP/1.1: the pool grows to
    /// one connection per request in flight; this many are opened up front.
    pub connections: usize,
    /// Give up on a request this long after its scheduled time.
    pub timeout: Duration,
    /// Overrides every mix entry's key.
    pub key: Option<String>,
}

/// Counters the progress display reads while the run goes on.
#[derive(Debug, Default)]
pub struct Live {
    pub sent: AtomicU64,
    pub done: AtomicU64,
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    pub inflight: AtomicUsize,
    /// TTFTs since the progress display last took them.
    pub recent_ttft_ms: Mutex<Vec<f64>>,
}

/// Open connections to the target.
enum Pool {
    /// Fixed slots, used round-robin; a slot whose connection closed (the
    /// server's GOAWAY after its per-connection request limit, say) is
    /// reconnected by the first request that finds it so.
    H2 {
        slots: Vec<tokio::sync::Mutex<Conn>>,
        next: AtomicUsize,
        url: String,
        ca: Option<std::path::PathBuf>,
    },
    /// Idle connections; one per request in flight, opened on demand.
    H1 { idle: Mutex<Vec<Conn>>, url: String, ca: Option<std::path::PathBuf> },
}

impl Pool {
    async fn open(t: &Target) -> Result<Self, ClientError> {
        let mut conns = Vec::with_capacity(t.connections.max(1));
        for _ in 0..t.connections.max(1) {
            conns.push(Conn::connect(&t.url, t.ca.as_deref(), t.proto).await?);
        }
        let (url, ca) = (t.url.clone(), t.ca.clone());
        Ok(match t.proto {
            Proto::H2 => {
                let slots = conns.into_iter().map(tokio::sync::Mutex::new).collect();
                Pool::H2 { slots, next: AtomicUsize::new(0), url, ca }
            }
            Proto::Http1 => Pool::H1 { idle: Mutex::new(conns), url, ca },
        })
    }

    /// Which HTTP/2 connection a request uses (round robin).
    fn pick(&self) -> usize {
        match self {
            Pool::H2 { slots, next, .. } => next.fetch_add(1, Ordering::Relaxed) % slots.len(),
            Pool::H1 { .. } => 0,
        }
    }

    /// A connection for one request (HTTP/2: slot `pick`), and whether to
    /// return it afterwards.
    async fn take(&self, pick: usize) -> Result<(Conn, bool), ClientError> {
        match self {
            Pool::H2 { slots, url, ca, .. } => {
                let mut slot = slots[pick].lock().await;
                if slot.is_closed() {
                    *slot = Conn::connect(url, ca.as_deref(), Proto::H2).await?;
                }
                Ok((slot.clone(), false))
            }
            Pool::H1 { idle, url, ca } => {
                let reuse = idle.lock().expect("pool lock").pop();
                match reuse {
                    Some(c) => Ok((c, true)),
                    None => Ok((Conn::connect(url, ca.as_deref(), Proto::Http1).await?, true)),
                }
            }
        }
    }

    fn give_back(&self, conn: Conn) {
        if let Pool::H1 { idle, .. } = self {
            if !conn.is_closed() {
                idle.lock().expect("pool lock").push(conn);
            }
        }
    }
}

/// Runs `plan` against `target`; `start` is the instant scheduled times
/// count from. Returns records in plan order.
pub async fn execute(
    target: &Target,
    workload: &Workload,
    plan: &[Planned],
    seed: u64,
    live: Arc<Live>,
) -> Result<Vec<Record>, ClientError> {
    let pool = Arc::new(Pool::open(target).await?);
    let shared = Arc::new((target.clone(), workload.clone(), plan.to_vec(), Handoffs::new(plan)));
    // A short lead so the first arrivals are not late because of set-up.
    let start = Instant::now() + Duration::from_millis(20);
    // The dispatcher is its own OS thread: `thread::sleep` wakes within tens
    // of microseconds, where tokio's timer rounds up to whole milliseconds,
    // and request tasks never compete with it for a runtime worker.
    let handle = tokio::runtime::Handle::current();
    let (dispatch_shared, dispatch_live) = (shared.clone(), live.clone());
    let dispatcher = std::thread::Builder::new()
        .name("loadtest-dispatch".into())
        .spawn(move || {
            let plan = &dispatch_shared.2;
            let mut tasks = Vec::with_capacity(plan.len());
            for (i, p) in plan.iter().enumerate() {
                let at = start + Duration::from_secs_f64(p.at_s);
                let wait = at.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
                let (pool, shared, live) = (pool.clone(), dispatch_shared.clone(), dispatch_live.clone());
                tasks.push(handle.spawn(async move {
                    let (target, workload, plan, handoffs) = &*shared;
                    let turn = Turn { plan: &plan[i], at: i, handoffs };
                    one(&pool, target, workload, turn, seed, start, &live).await
                }));
            }
            tasks
        })
        .expect("spawning the dispatcher thread");
    let tasks =
        tokio::task::spawn_blocking(move || dispatcher.join().expect("the dispatcher does not panic"))
            .await
            .expect("joining the dispatcher");
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        records.push(t.await.expect("request tasks do not panic"));
    }
    Ok(records)
}

/// Received answers handed from a conversation's turn to the next
/// ([`Planned::after`]), by plan position: each channel is used once.
struct Handoffs {
    /// Where a turn that a later one follows sends its prompt and answer.
    send: Vec<Mutex<Option<tokio::sync::oneshot::Sender<String>>>>,
    /// Where a turn after a received answer waits for it.
    recv: Vec<Mutex<Option<tokio::sync::oneshot::Receiver<String>>>>,
}

impl Handoffs {
    fn new(plan: &[Planned]) -> Self {
        let (mut send, mut recv): (Vec<_>, Vec<_>) =
            plan.iter().map(|_| (Mutex::new(None), Mutex::new(None))).unzip();
        let at: std::collections::HashMap<u64, usize> =
            plan.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
        for (i, p) in plan.iter().enumerate() {
            if let Some(&j) = p.after.and_then(|(prev, _)| at.get(&prev)) {
                let (tx, rx) = tokio::sync::oneshot::channel();
                send[j] = Mutex::new(Some(tx));
                recv[i] = Mutex::new(Some(rx));
            }
        }
        Handoffs { send, recv }
    }

    fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
        slot.lock().expect("handoff lock").take()
    }
}

/// One request of the plan, with what it needs from the turn before it.
struct Turn<'a> {
    plan: &'a Planned,
    /// Its position in the plan.
    at: usize,
    handoffs: &'a Handoffs,
}

impl Turn<'_> {
    /// The prompt to send, and when it could be sent: after a received
    /// answer, the previous prompt, that answer and the new message, once
    /// the answer is in (`None` if it is not by `deadline`: the previous
    /// turn outlived its own deadline, which comes first). A previous turn
    /// that ended without sending (it cannot: every turn sends) would leave
    /// the planned stand-in prompt.
    async fn prompt(&self, seed: u64, scheduled: Instant, deadline: Instant) -> Option<(String, Instant)> {
        let Some(rx) = Handoffs::take(&self.handoffs.recv[self.at]) else {
            return Some((self.plan.prompt(seed), scheduled));
        };
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(history)) => {
                Some((format!("{history} {}", self.plan.message(seed)), scheduled.max(Instant::now())))
            }
            Ok(Err(_)) => Some((self.plan.prompt(seed), scheduled)),
            Err(_) => None,
        }
    }

    /// Whether a later turn resends this one's answer.
    fn followed(&self) -> bool {
        self.handoffs.send[self.at].lock().expect("handoff lock").is_some()
    }

    /// Hands the prompt and its answer (none if it failed) to the next turn.
    fn hand_on(&self, prompt: String, answer: Option<String>) {
        if let Some(tx) = Handoffs::take(&self.handoffs.send[self.at]) {
            let history = match answer {
                Some(a) => format!("{prompt} {a}"),
                None => prompt,
            };
            let _ = tx.send(history); // the next turn may have timed out
        }
    }
}

/// Sends one request and records what happened.
async fn one(
    pool: &Pool,
    t: &Target,
    w: &Workload,
    turn: Turn<'_>,
    seed: u64,
    start: Instant,
    live: &Live,
) -> Record {
    let p = turn.plan;
    let mix = &w.mix[p.mix];
    let mut rec = Record::planned(p.id, &mix.tier, p.mix, p.at_s * 1e3, p.input_tokens, p.max_tokens);
    live.inflight.fetch_add(1, Ordering::Relaxed);
    let planned = start + Duration::from_secs_f64(p.at_s);
    let deadline = planned + t.timeout;
    match turn.prompt(seed, planned, deadline).await {
        None => fail(&mut rec, "timeout".into()),
        Some((prompt, scheduled)) => {
            if scheduled > planned {
                // A turn that waited for its answer counts from when it is sent.
                rec.scheduled_at_ms = scheduled.saturating_duration_since(start).as_secs_f64() * 1e3;
            }
            rec.tokens_in = policies::tokens::count(&prompt);
            let req = Exchange {
                api: t.api,
                key: t.key.as_deref().unwrap_or(&mix.key),
                body: request_body(t.api, &w.model, &prompt, p),
                capture: turn.followed(),
                scheduled,
                start,
            };
            let answer = match tokio::time::timeout_at(deadline, req.run(pool, &mut rec, live)).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => {
                    fail(&mut rec, transport_label(&e));
                    None
                }
                Err(_) => {
                    fail(&mut rec, "timeout".into());
                    None
                }
            };
            turn.hand_on(prompt, answer.filter(|_| rec.outcome == Outcome::Ok));
        }
    }
    live.inflight.fetch_sub(1, Ordering::Relaxed);
    live.done.fetch_add(1, Ordering::Relaxed);
    let counter = match rec.outcome {
        Outcome::Ok => &live.ok,
        Outcome::Rejected => &live.rejected,
        Outcome::Failed => &live.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if let Some(t) = rec.ttft_ms {
        live.recent_ttft_ms.lock().expect("ttft lock").push(t);
    }
    rec
}

/// One request on the wire.
struct Exchange<'a> {
    api: Api,
    key: &'a str,
    body: Bytes,
    /// Keep the answer's text (a later turn resends it).
    capture: bool,
    scheduled: Instant,
    start: Instant,
}

impl Exchange<'_> {
    /// Sends it; the answer's text if `capture`.
    async fn run(self, pool: &Pool, rec: &mut Record, live: &Live) -> Result<Option<String>, ClientError> {
        let path = match self.api {
            Api::Openai => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
            Api::Engine => "/engine/v1/generate",
        };
        let auth = (self.api != Api::Engine).then_some(self.key);
        let pick = pool.pick();
        let (mut conn, mut reusable) = pool.take(pick).await?;
        rec.sent_at_ms = Instant::now().saturating_duration_since(self.start).as_secs_f64() * 1e3;
        live.sent.fetch_add(1, Ordering::Relaxed);
        let resp = match conn.post_json(path, auth, self.body.clone()).await {
            Ok(resp) => resp,
            // The connection closed under the request before it was
            // answered (a GOAWAY racing the send): the server did not
            // process it, so send it once more on a fresh connection, as
            // HTTP clients do. Latency still counts from the scheduled time.
            Err(_) if conn.is_closed() => {
                (conn, reusable) = pool.take(pick).await?;
                conn.post_json(path, auth, self.body).await?
            }
            Err(e) => return Err(e),
        };
        let r = read_response(resp, self.api, self.scheduled, self.capture, rec).await;
        if reusable && r.is_ok() {
            pool.give_back(conn);
        }
        r
    }
}

fn fail(rec: &mut Record, reason: String) {
    rec.outcome = Outcome::Failed;
    rec.reason.get_or_insert(reason);
}

fn transport_label(e: &ClientError) -> String {
    match e {
        ClientError::Connect(..) => "connect".into(),
        ClientError::Tls(..) | ClientError::Alpn(..) => "tls".into(),
        ClientError::Http(_) => "transport".into(),
        ClientError::Url(..) | ClientError::Ca(..) => "config".into(),
    }
}

fn request_body(api: Api, model: &str, prompt: &str, p: &Planned) -> Bytes {
    let v = match api {
        Api::Openai => json!({
            "model": model, "prompt": prompt, "max_tokens": p.max_tokens,
            "stream": true, "stream_options": {"include_usage": true},
        }),
        Api::Chat => json!({
            "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": p.max_tokens,
            "stream": true, "stream_options": {"include_usage": true},
        }),
        Api::Engine => json!({
            "request_id": format!("lt-{}", p.id), "model": model, "prompt": prompt, "max_tokens": p.max_tokens,
        }),
    };
    Bytes::from(serde_json::to_vec(&v).expect("JSON values serialise"))
}

/// Reads status, headers and the streamed body into `rec`.
async fn read_response(
    resp: http::Response<Incoming>,
    api: Api,
    scheduled: Instant,
    capture: bool,
    rec: &mut Record,
) -> Result<Option<String>, ClientError> {
    rec.status = resp.status().as_u16();
    rec.admission = admission(resp.headers());
    let since = |i: Instant| i.saturating_duration_since(scheduled).as_secs_f64() * 1e3;
    if !resp.status().is_success() {
        let body = crate::client::body_bytes(resp).await?;
        rec.outcome = Outcome::Rejected;
        rec.reason = Some(rejection_reason(rec, &body));
        rec.done_ms = Some(since(Instant::now())); // how long the refusal took
        return Ok(None);
    }
    let mut stream = if capture { TokenStream::capturing(api) } else { TokenStream::new(api) };
    let mut body = resp.into_body();
    let mut last: Option<Instant> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        let now = Instant::now();
        for _ in 0..stream.push(&data) {
            match last {
                None => rec.ttft_ms = Some(since(now)),
                Some(prev) => rec.tbt_ms.push((now - prev).as_secs_f64() * 1e3),
            }
            last = Some(now);
        }
    }
    rec.done_ms = Some(since(Instant::now()));
    rec.tlet_ms = last.map(since);
    rec.tokens_out = stream.usage.unwrap_or(stream.tokens);
    match (stream.error, stream.finished) {
        (Some(code), _) => fail(rec, format!("stream_error:{code}")),
        (None, true) => rec.outcome = Outcome::Ok,
        (None, false) => fail(rec, "stream_truncated".into()),
    }
    Ok(stream.text)
}

fn admission(h: &http::HeaderMap) -> Admission {
    let s = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let f = |name: &str| s(name).and_then(|v| v.trim().parse::<f64>().ok());
    Admission {
        decision: s("x-admission"),
        reason: s("x-admission-reason"),
        predicted_ttft_ms: f("x-predicted-ttft-ms"),
        predicted_e2e_ms: f("x-predicted-e2e-ms"),
        engine_class: s("x-engine-class"),
        policy_version: s("x-policy-version"),
        retry_after_s: f("retry-after"),
    }
}

/// The admission reason header when admission refused the request, else the
/// OpenAI error body's `code` (or `type`), else the status. (A request that
/// admission let through and that failed later, e.g. engines at capacity,
/// is explained by its body, not by why it was admitted.)
fn rejection_reason(rec: &Record, body: &[u8]) -> String {
    if let Some(r) =
        rec.admission.reason.as_ref().filter(|_| rec.admission.decision.as_deref() == Some("rejected"))
    {
        return r.clone();
    }
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let e = if v["error"].is_object() { &v["error"] } else { &v };
    e["code"]
        .as_str()
        .or_else(|| e["type"].as_str())
        .map_or_else(|| format!("http_{}", rec.status), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_reason_prefers_the_header_then_the_body() {
        let mut rec = Record::planned(0, "gold", 0, 0.0, 1, 1);
        rec.outcome = Outcome::Rejected;
        rec.status = 429;
        let body = br#"{"error":{"message":"m","type":"rate_limit_error","code":"tenant_concurrency"}}"#;
        assert_eq!(rejection_reason(&rec, body), "tenant_concurrency");
        assert_eq!(rejection_reason(&rec, b"{\"error\":{\"type\":\"server_error\"}}"), "server_error");
        assert_eq!(rejection_reason(&rec, b"<html>"), "http_429");
        rec.admission.reason = Some("capacity".into());
        rec.admission.decision = Some("admitted".into());
        assert_eq!(
            rejection_reason(&rec, body),
            "tenant_concurrency",
            "admitted, then failed: the body says why"
        );
        rec.admission.decision = Some("rejected".into());
        assert_eq!(rejection_reason(&rec, body), "capacity");
    }
}
