//! The engine's Prometheus metrics (`GET /metrics` on the engine).
//!
//! - `engine_batch_size` (histogram) and `engine_batch_target` (gauge):
//!   sequences per decode step, achieved against `--max-batch`
//! - `engine_prefill_batch_size` (histogram): sequences per prefill batch
//! - `engine_batch_formation_seconds` (histogram): admission to prefill start
//! - `engine_prefill_seconds`, `engine_decode_step_seconds` (histograms)
//! - `engine_kv_pages_free`, `engine_kv_pages_capacity` (gauges)
//! - `engine_preemptions_total` (counter)
//! - `engine_refusals_total{reason}` (counter): `kv_low_watermark`,
//!   `kv_request_too_large`, `engine_draining`, ...
//! - `engine_prefix_lookup_tokens_total`, `engine_prefix_hit_tokens_total`
//!   (counters): prompt tokens prefilled, and of those found in the prefix
//!   cache (hit rate = hit / lookup)
//! - `engine_prefix_cached_pages` (gauge): pages the prefix cache names
//! - `engine_cold_start_seconds` (gauge)
//! - `engine_running_sequences`, `engine_queued_sequences` (gauges)
//! - `engine_video_batch_size` (histogram): chunks per coalesced video batch
//! - `engine_video_suspends_total` (counter): video states moved to host memory
//! - `engine_generate_requests_total` (counter): generate requests handed
//!   to the scheduler (refused or not)
//! - `engine_connections_closed_total{why}` (counter): connections closed
//!   as abusive (`rapid_reset`, `stream_rate`; `h2_calm`: by the HTTP/2
//!   library's own GOAWAY ENHANCE_YOUR_CALM)

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const BATCH_SIZE: &str = "engine_batch_size";
pub const BATCH_TARGET: &str = "engine_batch_target";
pub const PREFILL_BATCH_SIZE: &str = "engine_prefill_batch_size";
pub const FORMATION: &str = "engine_batch_formation_seconds";
pub const PREFILL: &str = "engine_prefill_seconds";
pub const DECODE_STEP: &str = "engine_decode_step_seconds";
pub const KV_FREE: &str = "engine_kv_pages_free";
pub const KV_TOTAL: &str = "engine_kv_pages_capacity";
pub const PREEMPTIONS: &str = "engine_preemptions_total";
pub const PRIORITY_PAUSES: &str = "engine_priority_pauses_total";
pub const REFUSALS: &str = "engine_refusals_total";
pub const PREFIX_LOOKUP_TOKENS: &str = "engine_prefix_lookup_tokens_total";
pub const PREFIX_HIT_TOKENS: &str = "engine_prefix_hit_tokens_total";
pub const PREFIX_CACHED_PAGES: &str = "engine_prefix_cached_pages";
pub const COLD_START: &str = "engine_cold_start_seconds";
pub const RUNNING: &str = "engine_running_sequences";
pub const QUEUED: &str = "engine_queued_sequences";
pub const VIDEO_BATCH: &str = "engine_video_batch_size";
pub const VIDEO_SUSPENDS: &str = "engine_video_suspends_total";
/// Chunks set aside at a denoising-step boundary for a more urgent one.
pub const VIDEO_PREEMPTIONS: &str = "engine_video_preemptions_total";
pub const CONNECTIONS_CLOSED: &str = "engine_connections_closed_total";
pub const GENERATE_REQUESTS: &str = "engine_generate_requests_total";

/// `# HELP` text of every family. A test checks that every name above is
/// here.
pub const HELP: &[(&str, &str)] = &[
    (BATCH_SIZE, "Sequences per decode step."),
    (BATCH_TARGET, "The decode batch the engine aims for (--max-batch)."),
    (PREFILL_BATCH_SIZE, "Sequences per prefill batch."),
    (FORMATION, "Admission to prefill start, seconds."),
    (PREFILL, "Prefill batch time, seconds."),
    (DECODE_STEP, "Decode step time, seconds."),
    (KV_FREE, "KV cache pages free (cached-but-unused pages count as free)."),
    (KV_TOTAL, "KV cache pages in all."),
    (PREEMPTIONS, "Sequences preempted (their pages returned, recomputed later)."),
    (
        PRIORITY_PAUSES,
        "Sequences paused at a token boundary for a higher class's TTFT (pages kept, resumed later).",
    ),
    (REFUSALS, "Requests refused, by reason."),
    (PREFIX_LOOKUP_TOKENS, "Prompt tokens looked up in the prefix cache."),
    (PREFIX_HIT_TOKENS, "Prompt tokens found in the prefix cache (not prefilled)."),
    (PREFIX_CACHED_PAGES, "Pages the prefix cache names."),
    (COLD_START, "Process start to ready, seconds."),
    (RUNNING, "Sequences running."),
    (QUEUED, "Sequences queued."),
    (VIDEO_BATCH, "Chunks per coalesced video batch."),
    (VIDEO_SUSPENDS, "Video states moved to host memory."),
    (VIDEO_PREEMPTIONS, "Video chunks set aside at a denoising-step boundary for a more urgent one."),
    (CONNECTIONS_CLOSED, "Connections closed as abusive (rapid reset, stream rate), by why."),
    (GENERATE_REQUESTS, "Generate requests handed to the scheduler (refused or not)."),
];

const SECONDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
const SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Installs the process-wide recorder once and returns its handle.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("batch_size".into()), SIZES))
            .expect("bucket lists are non-empty")
            .install_recorder()
            .expect("the metrics recorder is installed once per process");
        // The exporter keeps one description per name, whatever the kind.
        for &(name, help) in HELP {
            metrics::describe_counter!(name, help);
        }
        handle
    })
}

#[cfg(test)]
mod help_tests {
    /// Every family named in this file has its `# HELP` text.
    #[test]
    fn every_family_is_described() {
        let (names, missing) = loadtest::prom::missing_help(include_str!("metrics.rs"), super::HELP);
        assert!(names > 15, "found {names} names");
        assert!(missing.is_empty(), "no # HELP for {missing:?}");
    }
}
