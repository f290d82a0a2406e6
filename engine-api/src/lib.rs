//! The engine's internal wire format: what gateways and engines send each
//! other, and nothing else (serde only), so that a gateway links no engine
//! code. Text generation lives here; video sessions in [`video`].
//!
//! Routes (HTTP/2, cleartext on loopback by default):
//! - `POST /engine/v1/generate`: [`GenerateRequest`] in, a stream of
//!   newline-delimited [`Event`]s out (`application/x-ndjson`).
//! - `GET /engine/v1/load`: a [`LoadReport`].
//! - `POST /engine/v1/drain`: stop taking new work, finish what runs.
//! - `GET /engine/v1/profile`: the latency profile in use (TOML text).
//! - `GET /healthz` (alive), `GET /readyz` (ready to take work).
//!
//! Every route but `/healthz` and `/readyz` needs `Authorization: Bearer
//! <token>` when the engine has an API token ([`TOKEN_ENV`] or
//! `--api-token-file`); without one it must listen on loopback only.
//!
//! Video session operations (create, next chunks, suspend, resume, export,
//! import, end) will live under `/engine/v1/sessions/...`; nothing here
//! assumes generate is the only kind of work. Adding fields is compatible:
//! readers ignore fields they do not know.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

pub mod diffusion;
pub mod video;

/// The backends an engine can be asked for (`engine --backend`, `gateway up
/// --backend`): `auto` picks `cuda` when a GPU answers, else `cpu`.
pub const BACKENDS: [&str; 4] = ["emulated", "cpu", "cuda", "auto"];

/// Path of the generate endpoint.
pub const GENERATE_PATH: &str = "/engine/v1/generate";
/// Path of the load report endpoint.
pub const LOAD_PATH: &str = "/engine/v1/load";
/// Path of the latency profile endpoint (the profile's TOML text): the
/// gateway's estimator starts from it.
pub const PROFILE_PATH: &str = "/engine/v1/profile";
/// Path of the drain endpoint.
pub const DRAIN_PATH: &str = "/engine/v1/drain";
/// `PUT`: batch-formation hints (`policies::batching::BatchHints` as JSON;
/// unset keys restore the engine's flags); `GET`: the limits in force.
/// Both answer with the limits in force.
pub const BATCHING_PATH: &str = "/engine/v1/batching";
/// `GET ?after=N`: the prefix cache's events after sequence number `N`
/// ([`KvEvents`]); `after=0` (a new reader), a number the engine no longer
/// keeps, or one ahead of it (the engine restarted) answers with a
/// snapshot of every cached block instead.
pub const KV_EVENTS_PATH: &str = "/engine/v1/kv-events";
/// Events per [`KvEvents`] answer at most (`more` says when there are more).
pub const KV_EVENTS_MAX: usize = 1024;
/// Content type of the generate event stream.
pub const NDJSON: &str = "application/x-ndjson";
/// Environment variable holding the engine API token (so it never appears
/// on a command line).
pub const TOKEN_ENV: &str = "ENGINE_API_TOKEN";
/// Environment variable holding the fleet's Redis URL, which may carry a
/// password (`--redis` is the same without the secrecy).
pub const REDIS_ENV: &str = "ENGINE_REDIS_URL";
/// Shortest API token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// Whether an `Authorization` header value carries `expected` as its bearer
/// token, compared in constant time.
pub fn bearer_matches(expected: &str, authorization: Option<&str>) -> bool {
    let given = authorization
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map_or("", str::trim);
    constant_time_eq(expected.as_bytes(), given.as_bytes())
}

/// Equality whose time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One text-generation job, as the gateway sends it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GenerateRequest {
    /// The gateway's request id, for correlating logs.
    pub request_id: String,
    pub model: String,
    /// The fully rendered prompt (chat messages already templated).
    pub prompt: String,
    /// Output token cap; the engine stops with `length` when it is reached.
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop sequences: generation ends (`stop`) once the text contains one;
    /// the stop sequence itself is not emitted.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Scheduling key: lower runs first. The gateway sends estimated work
    /// over the tier's priority weight (or a deadline for EDF); default
    /// prompt + max_tokens (shortest job first).
    #[serde(default)]
    pub priority_key: Option<f64>,
    /// The request's TTFT budget; prefill batches stay within 40% of it.
    #[serde(default)]
    pub ttft_budget_ms: Option<u32>,
    /// Priority preemption at token boundaries: when this request waits
    /// for a decode slot and would miss its TTFT budget, the engine pauses
    /// a running sequence of a strictly lower class (its KV kept) to start
    /// it. `None`: the request neither preempts nor is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

/// A request's standing for priority preemption (the gateway's tier).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Priority {
    /// Higher preempts lower (the tier's priority weight).
    pub class: u32,
    /// How many times this sequence may be paused for a higher class
    /// (at most [`bounds::MAX_PAUSES`]).
    pub max_pauses: u32,
    /// Its end-to-end budget: it is never paused when the pause would
    /// make it miss this.
    pub e2e_budget_ms: u32,
}

/// Bounds on every generate field (the body itself is at most 16 MiB).
pub mod bounds {
    /// Longest request id and model name.
    pub const MAX_ID_BYTES: usize = 256;
    /// Stop sequences per request, and bytes per stop sequence: each one is
    /// checked after every token on the scheduler's single loop.
    pub const MAX_STOPS: usize = 4;
    pub const MAX_STOP_BYTES: usize = 256;
    /// Output tokens one request may ask for.
    pub const MAX_TOKENS: u32 = 1 << 17;
    /// Times one sequence may be paused for a higher class.
    pub const MAX_PAUSES: u32 = 8;
}

impl GenerateRequest {
    /// Checks every field against [`bounds`]; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        use bounds::*;
        if self.request_id.len() > MAX_ID_BYTES || self.model.len() > MAX_ID_BYTES {
            return Err(format!("request_id and model are at most {MAX_ID_BYTES} bytes"));
        }
        if self.max_tokens > MAX_TOKENS {
            return Err(format!("max_tokens: at most {MAX_TOKENS}"));
        }
        if self.stop.len() > MAX_STOPS || self.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(format!("stop: at most {MAX_STOPS} sequences of at most {MAX_STOP_BYTES} bytes"));
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err("temperature: must be in [0, 2]".into());
        }
        if self.priority_key.is_some_and(|k| !k.is_finite()) {
            return Err("priority_key: must be finite".into());
        }
        if self.priority.is_some_and(|p| p.max_pauses > MAX_PAUSES) {
            return Err(format!("priority.max_pauses: at most {MAX_PAUSES}"));
        }
        Ok(())
    }
}

/// Why a generation ended, in OpenAI's vocabulary.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended the text, or a stop sequence matched.
    Stop,
    /// `max_tokens` was reached.
    Length,
}

/// Token counts of one generation.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens whose K/V came from the engine's prefix cache (not
    /// computed); 0 from engines without one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Whether an NDJSON line of the generate stream is its last: a `done` or
/// `error` event (the tag is always the first field [`Event::to_line`] writes).
pub fn is_terminal_line(line: &[u8]) -> bool {
    line.starts_with(b"{\"event\":\"done\"") || line.starts_with(b"{\"event\":\"error\"")
}

impl Event {
    /// The event as one NDJSON line.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("events always serialise");
        line.push(b'\n');
        line
    }
}

/// One line of the generate stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// One generated token's text.
    Token { text: String },
    /// The generation finished normally; always the last line.
    Done {
        finish_reason: FinishReason,
        usage: Usage,
        /// Milliseconds spent waiting and in prefill, for the gateway's estimators.
        queue_ms: f64,
        prefill_ms: f64,
    },
    /// The generation failed; always the last line.
    Error { code: String, message: String },
    /// Inside the gateway only, never on the wire: a third-party engine's
    /// OpenAI chunk (or whole answer), relayed as it is but for the
    /// gateway's id and model, for answers that are more than text (tool
    /// calls, several choices, log-probabilities).
    #[serde(skip)]
    Upstream { json: String },
}

/// Error body of a refused engine request (4xx/5xx before any event).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    /// Stable machine label: `invalid_request`, `engine_not_ready`,
    /// `engine_draining`, `kv_low_watermark`, `kv_request_too_large`.
    pub code: String,
    pub message: String,
}

/// What an engine reports about its load (`GET /engine/v1/load`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct LoadReport {
    pub engine_id: String,
    /// `emulated`, `cpu` or `cuda`.
    pub backend: String,
    /// Engine class of the latency profile in use.
    pub engine_class: String,
    pub ready: bool,
    pub draining: bool,
    /// Sequences accepted but not yet started.
    pub queued_sequences: u32,
    /// Tokens (prompt + output budget) of the queued sequences.
    pub queued_tokens: u64,
    /// Sequences in prefill or decode.
    pub inflight_sequences: u32,
    /// Tokens (prompt + output budget) of the in-flight sequences.
    pub inflight_tokens: u64,
    pub kv_pages_free: u32,
    pub kv_pages_total: u32,
    /// False while the KV cache is below its low watermark (new work is
    /// refused with `kv_low_watermark` until frees reach the high watermark).
    pub kv_admitting: bool,
    /// KV pages consumed per second, smoothed (negative while freeing).
    pub kv_consumption_pages_per_s: f64,
    /// Mean decode step time over recent steps, in milliseconds.
    pub decode_step_ms: f64,
    /// Mean sequences per decode step (smoothed) and the configured maximum.
    #[serde(default)]
    pub batch_achieved: f64,
    #[serde(default)]
    pub batch_target: u32,
    /// Sequences preempted (pages reclaimed at a token boundary) so far.
    #[serde(default)]
    pub preemptions: u64,
    /// Start to ready: weights resident, kernels built, warm-up batch run.
    #[serde(default)]
    pub cold_start_ms: f64,
    /// Tokens per KV page.
    #[serde(default)]
    pub kv_page_tokens: u32,
    /// Free pages below which new work is refused (the low watermark).
    #[serde(default)]
    pub kv_low_watermark_pages: u32,
    /// Pages the prefix cache names (held by sequences or not); the
    /// unheld ones are evictable and counted in `kv_pages_free`.
    #[serde(default)]
    pub prefix_cached_pages: u32,
    /// Prompt tokens prefilled so far (each sequence's first prefill), and
    /// of those found in the prefix cache (not computed).
    #[serde(default)]
    pub prefix_lookup_tokens: u64,
    #[serde(default)]
    pub prefix_hit_tokens: u64,
}

/// One change to an engine's prefix cache: blocks (by chained hash, see
/// `policies::prefix`) stored after a prefill, or evicted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEvent {
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stored: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<u64>,
}

/// A batch of prefix-cache events (`GET` [`KV_EVENTS_PATH`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEvents {
    pub engine_id: String,
    /// This engine process: a reader that sees it change starts over.
    pub epoch: u64,
    /// Tokens per block (the engine's page size).
    pub page_tokens: u32,
    /// The sequence number to ask after next.
    pub last_seq: u64,
    /// More events are waiting past `last_seq`.
    #[serde(default)]
    pub more: bool,
    #[serde(default)]
    pub events: Vec<KvEvent>,
    /// Instead of events: every block cached as of `last_seq` (the events
    /// asked for are gone, or the reader is new or from another epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Vec<u64>>,
}
