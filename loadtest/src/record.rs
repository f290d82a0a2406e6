//! What is recorded about each request. These structs are the `records`
//! array of the results file; their field names are part of its stable
//! schema (docs/loadtest.md). Times are milliseconds; "at" fields count from
//! the run's start, latencies from the request's *scheduled* send time.

use serde::{Deserialize, Serialize};

/// How a request ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// 200 and the stream finished normally.
    Ok,
    /// Refused with an HTTP error status before any token (admission,
    /// limits, validation); `reason` says why.
    Rejected,
    /// Anything else: connection or protocol failure, an error event in the
    /// stream, a stream cut short, or the client's timeout.
    Failed,
}

/// The gateway's admission headers, when present.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    /// `x-admission`: admitted, degraded or rejected.
    pub decision: Option<String>,
    /// `x-admission-reason`.
    pub reason: Option<String>,
    /// `x-predicted-ttft-ms`.
    pub predicted_ttft_ms: Option<f64>,
    /// `x-predicted-e2e-ms`.
    #[serde(default)]
    pub predicted_e2e_ms: Option<f64>,
    /// `x-engine-class`: the class of the engine that served it.
    #[serde(default)]
    pub engine_class: Option<String>,
    /// `x-policy-version`.
    pub policy_version: Option<String>,
    /// `retry-after`, seconds.
    pub retry_after_s: Option<f64>,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    pub tier: String,
    pub key_index: usize,
    /// Scheduled send time.
    pub scheduled_at_ms: f64,
    /// When the request was actually handed to the connection.
    pub sent_at_ms: f64,
    pub outcome: Outcome,
    /// HTTP status; 0 when no response arrived.
    pub status: u16,
    /// Why it was rejected or failed: the admission reason header, else the
    /// error body's `code` (or `type`), else `http_<status>`, or a transport
    /// label (`connect`, `timeout`, `stream_error:<code>`, ...).
    pub reason: Option<String>,
    pub admission: Admission,
    /// Scheduled send to the first token.
    pub ttft_ms: Option<f64>,
    /// Gaps between successive tokens.
    pub tbt_ms: Vec<f64>,
    /// Scheduled send to the last token (time to last emitted token).
    pub tlet_ms: Option<f64>,
    /// Scheduled send to the end of the response (for a rejection: to the
    /// end of the error body, i.e. how long the refusal took).
    pub done_ms: Option<f64>,
    pub tokens_in: u32,
    /// Tokens received (the usage count when the server sent one).
    pub tokens_out: u32,
    pub max_tokens: u32,
}

impl Record {
    /// A record for a request not sent yet: failed until shown otherwise,
    /// sent at its scheduled time until it actually is.
    pub fn planned(
        id: u64,
        tier: &str,
        key_index: usize,
        scheduled_at_ms: f64,
        tokens_in: u32,
        max_tokens: u32,
    ) -> Self {
        Record {
            id,
            tier: tier.to_string(),
            key_index,
            scheduled_at_ms,
            sent_at_ms: scheduled_at_ms,
            outcome: Outcome::Failed,
            status: 0,
            reason: None,
            admission: Admission::default(),
            ttft_ms: None,
            tbt_ms: Vec::new(),
            tlet_ms: None,
            done_ms: None,
            tokens_in,
            tokens_out: 0,
            max_tokens,
        }
    }

    /// Send time minus scheduled time: the harness's own lateness.
    pub fn schedule_error_ms(&self) -> f64 {
        self.sent_at_ms - self.scheduled_at_ms
    }

    /// Whether the gateway said it degraded this request.
    pub fn degraded(&self) -> bool {
        self.admission.decision.as_deref() == Some("degraded")
    }
}
