//! Prometheus metrics: names, the recorder, and a per-request observer.
//!
//! Exported at `GET /metrics` on the admin listener (not the public one):
//! - `gateway_requests_total{route,status}`: responses by route and status
//! - `gateway_errors_total{code}`: API errors by stable label
//! - `gateway_ttft_seconds{tier}`, `gateway_tlet_seconds{tier}`: time to
//!   first and last token, measured at the gateway
//! - `gateway_slo_requests_total{tier,slo,result}`: admitted generations
//!   that met or missed their TTFT (`slo="ttft"`) and end-to-end targets
//! - `gateway_inflight_requests`: requests whose response is still open
//! - `gateway_ready_engines`: engines passing their readiness probe
//! - `gateway_engine_retries_total`: engine attempts that failed and moved on
//! - `gateway_admission_decisions_total{tier,decision,reason}`: admitted,
//!   degraded and rejected requests by why
//! - `gateway_brownout_level`, `gateway_brownout_signal`: the level and the
//!   trouble share (0-1) driving it
//! - `gateway_queue_waiting`: requests waiting at the gate for a slot
//! - `gateway_ttft_prediction_ratio{tier}`: observed / predicted TTFT
//! - `gateway_video_streams`: live video streams
//! - `gateway_video_chunks_total{tier,on_time,mode}`: chunks delivered, by
//!   whether they met their playout deadline and the fidelity mode
//! - `gateway_video_stalls_total{tier}`, `gateway_video_rehomes_total`
//! - `gateway_diffusion_jobs_total{kind,outcome}`: image requests and
//!   videos finished (`met` or `late` against their deadline, `failed`);
//!   `gateway_diffusion_refused_total{kind,reason}`;
//!   `gateway_diffusion_jobs_waiting`: images waiting plus videos unfinished;
//!   `gateway_diffusion_pauses_total`, `gateway_diffusion_sp_changes_total`,
//!   `gateway_diffusion_migrations_total`: the scheduler's preemptions,
//!   SP degree changes and paused states moved between engines
//! - `gateway_cluster_redis_up`: 1 while Redis cluster state answers
//! - `gateway_policy_version_info{version}`: 1 for the active policy
//!   version, 0 for versions it replaced
//! - `gateway_policy_reloads_total{source,result}`: policy changes applied
//!   or rejected, by where they came from
//! - `gateway_cluster_policy_rejected_total{why}`: policy documents in
//!   Redis refused (`unsigned`, `bad_signature`)
//! - `gateway_stream_resets_total{why}`: response streams reset because
//!   the client stopped reading (`write_stall`) or a video feed's reader
//!   fell behind (`video_feed_stall`)
//! - `gateway_autoscale_desired_engines{class}`: serving + warm engines
//!   the autoscaler wants (KEDA scales engine Deployments on it);
//!   `gateway_autoscale_serving_target{class}`, `..._warm_target{class}`,
//!   `gateway_autoscale_utilization{class}` (ρ),
//!   `gateway_autoscale_decisions_total{class,why}`
//! - `gateway_engines_serving{class}`, `gateway_engines_warm{class}`: what
//!   there is; `gateway_engine_cold_starts_total`,
//!   `gateway_engine_cold_start_seconds`, `gateway_engine_restarts_total`
//!   (embedded mode)
//! - `gateway_gpu_seconds_total{class}`, `gateway_cost_usd{class}`
//!   (engine time × `[cost]` price), `gateway_output_tokens_total`,
//!   `gateway_cost_per_1m_output_tokens_usd`, `gateway_cost_per_video_minute_usd`
//!   (all engine cost over all tokens, and over all video delivered: on a
//!   fleet serving both, each figure carries the whole cost)
//! - `gateway_connections_open{listener}`, `gateway_connections_refused_total{listener}`
//!   (over `limits.max_connections`), `gateway_connections_closed_total{listener,why}`
//!   (`idle`, `header_timeout`; abusive: `rapid_reset`, `stream_rate`, `h2_calm`)

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use engine_api::Usage;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

mod handles;
pub use handles::TierMetrics;
pub(crate) use handles::{admission, requests, usage};
use handles::{inflight, output_tokens, Slo};

pub const REQUESTS: &str = "gateway_requests_total";
pub const ERRORS: &str = "gateway_errors_total";
pub const TTFT: &str = "gateway_ttft_seconds";
pub const TLET: &str = "gateway_tlet_seconds";
/// Time between tokens of a stream as the gateway relays them.
pub const TBT: &str = "gateway_tbt_seconds";
/// Time an admitted request waited at the gate for an engine slot.
pub const QUEUE_WAIT: &str = "gateway_queue_wait_seconds";
/// Admitted generations that met or missed their TTFT and end-to-end
/// targets (the tier's, or the request's own hint), by tier, slo
/// (`ttft`, `e2e`) and result (`met`, `missed`): SLO attainment and burn.
pub const SLO: &str = "gateway_slo_requests_total";
pub const INFLIGHT: &str = "gateway_inflight_requests";
/// Prompt plus expected output tokens of the work dispatched to engines
/// (what routing by token load balances), sampled every second.
pub const TOKENS_IN_FLIGHT: &str = "gateway_tokens_in_flight";
pub const READY_ENGINES: &str = "gateway_ready_engines";
pub const AUTOSCALE_DESIRED: &str = "gateway_autoscale_desired_engines";
pub const AUTOSCALE_SERVING: &str = "gateway_autoscale_serving_target";
pub const AUTOSCALE_WARM: &str = "gateway_autoscale_warm_target";
pub const AUTOSCALE_UTILIZATION: &str = "gateway_autoscale_utilization";
pub const AUTOSCALE_DECISIONS: &str = "gateway_autoscale_decisions_total";
pub const ENGINES_SERVING: &str = "gateway_engines_serving";
pub const ENGINES_WARM: &str = "gateway_engines_warm";
pub const ENGINE_COLD_STARTS: &str = "gateway_engine_cold_starts_total";
pub const ENGINE_COLD_START: &str = "gateway_engine_cold_start_seconds";
pub const ENGINE_RESTARTS: &str = "gateway_engine_restarts_total";
/// Engine-seconds, whole (a counter is an integer).
pub const GPU_SECONDS: &str = "gateway_gpu_seconds_total";
pub const COST_USD: &str = "gateway_cost_usd";
pub const OUTPUT_TOKENS: &str = "gateway_output_tokens_total";
pub const COST_PER_1M: &str = "gateway_cost_per_1m_output_tokens_usd";

/// Output tokens this process has relayed (the cost per 1M tokens).
pub static OUTPUT_TOKENS_SO_FAR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Video delivered, in microseconds of playout (the cost per video minute).
pub static VIDEO_MICROS_SO_FAR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub const COST_PER_VIDEO_MINUTE: &str = "gateway_cost_per_video_minute_usd";

/// Counts `seconds` of video delivered.
pub fn add_video_seconds(seconds: f64) {
    VIDEO_MICROS_SO_FAR.fetch_add((seconds.max(0.0) * 1e6) as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Minutes of video delivered so far.
pub fn video_minutes() -> f64 {
    VIDEO_MICROS_SO_FAR.load(std::sync::atomic::Ordering::Relaxed) as f64 / 60e6
}
pub const ENGINE_RETRIES: &str = "gateway_engine_retries_total";
pub const ADMISSION: &str = "gateway_admission_decisions_total";
/// Admitted requests per `[oserve]` workload type.
pub const WORKLOAD_TYPE: &str = "gateway_workload_type_total";
pub const BROWNOUT_LEVEL: &str = "gateway_brownout_level";
pub const BROWNOUT_SIGNAL: &str = "gateway_brownout_signal";
pub const QUEUE_WAITING: &str = "gateway_queue_waiting";
pub const TTFT_PREDICTION: &str = "gateway_ttft_prediction_ratio";
pub const VIDEO_STREAMS: &str = "gateway_video_streams";
pub const DIFFUSION_JOBS: &str = "gateway_diffusion_jobs_total";
pub const DIFFUSION_REFUSED: &str = "gateway_diffusion_refused_total";
pub const DIFFUSION_WAITING: &str = "gateway_diffusion_jobs_waiting";
pub const DIFFUSION_PAUSES: &str = "gateway_diffusion_pauses_total";
pub const DIFFUSION_SP_CHANGES: &str = "gateway_diffusion_sp_changes_total";
pub const DIFFUSION_MIGRATIONS: &str = "gateway_diffusion_migrations_total";
pub const VIDEO_CHUNKS: &str = "gateway_video_chunks_total";
pub const VIDEO_STALLS: &str = "gateway_video_stalls_total";
pub const VIDEO_REHOMES: &str = "gateway_video_rehomes_total";
pub const VIDEO_RECOVERIES: &str = "gateway_video_recoveries_total";
pub const VIDEO_RHO_MAX: &str = "gateway_video_rho_max";
pub const VIDEO_DESIRED_ENGINES: &str = "gateway_video_autoscale_desired_engines";
/// Engine-to-engine state transfers, by phase (`copy`: the background
/// pre-copy; `switch`: the final delta at the chunk boundary).
pub const VIDEO_TRANSFER: &str = "gateway_video_transfer_seconds";
/// How long a moving stream waited on its move.
pub const VIDEO_MOVE_STALL: &str = "gateway_video_move_stall_seconds";
/// Donor engines borrowed for elastic sequence parallelism.
pub const VIDEO_SP_BORROWS: &str = "gateway_video_sp_borrows_total";
/// Streams taken over from another gateway (`video::adopt`), by trigger
/// (`dead_owner`, `resume`, `replay`) and result (`adopted`, `lost_race`,
/// `forged`, `unsigned`, `malformed`, `other_tenant`, `unknown_engine`,
/// `completed`, `gap`).
pub const VIDEO_ADOPTIONS: &str = "gateway_video_adoptions_total";
pub const CLUSTER_REDIS_UP: &str = "gateway_cluster_redis_up";
pub const CLUSTER_SENTINEL_ERRORS: &str = "gateway_cluster_redis_sentinel_errors_total";
pub const POLICY_VERSION: &str = "gateway_policy_version_info";
pub const POLICY_RELOADS: &str = "gateway_policy_reloads_total";
pub const STREAM_RESETS: &str = "gateway_stream_resets_total";
pub const STREAM_RESUMES: &str = "gateway_stream_resumes_total";
pub const CLUSTER_POLICY_REJECTED: &str = "gateway_cluster_policy_rejected_total";
/// Keys of the gateways' own found holding another type (`WRONGTYPE`), by
/// key family (`lease`, `window`, `policy`, `engines`): not used, logged.
pub const CLUSTER_BAD_KEYS: &str = "gateway_cluster_redis_bad_keys_total";
pub const CONNECTIONS_OPEN: &str = "gateway_connections_open";
pub const CONNECTIONS_REFUSED: &str = "gateway_connections_refused_total";
pub const CONNECTIONS_CLOSED: &str = "gateway_connections_closed_total";
pub const USAGE_REQUESTS: &str = "gateway_usage_requests_total";
pub const USAGE_TOKENS: &str = "gateway_usage_tokens_total";
pub const USAGE_COST: &str = "gateway_usage_cost_microdollars_total";

/// `# HELP` text of every family (kind as the family is recorded). A test
/// checks that every name above is here.
pub const HELP: &[(&str, &str)] = &[
    (REQUESTS, "Requests answered, by route, tier and HTTP status."),
    (ERRORS, "Requests that ended in an error, by kind."),
    (USAGE_REQUESTS, "Generations counted in usage (what the client saw), by tenant and model."),
    (USAGE_TOKENS, "Tokens counted in usage, by tenant, model and kind (prompt, completion)."),
    (USAGE_COST, "What the usage cost at [cost.tokens] prices, millionths of a dollar, by tenant and model."),
    (TTFT, "Time from arrival to the first token, seconds, by tier."),
    (TLET, "Time from arrival to the last token, seconds, by tier."),
    (TBT, "Time between successive tokens of a generation as relayed, seconds, by tier."),
    (QUEUE_WAIT, "Time an admitted request waited at the gate for an engine slot, seconds (0 when one was free), by tier."),
    (SLO, "Admitted generations that met or missed their targets, by tier, slo (ttft, e2e) and result (met, missed); one ended without a first token missed both."),
    (INFLIGHT, "Generations in flight in this gateway."),
    (TOKENS_IN_FLIGHT, "Prompt plus expected output tokens of the work on engines (routing's token load), sampled every second."),
    (READY_ENGINES, "Engines ready to take work."),
    (AUTOSCALE_DESIRED, "Engines the autoscaler wants serving or warm."),
    (AUTOSCALE_SERVING, "The autoscaler's serving target."),
    (AUTOSCALE_WARM, "The autoscaler's warm-pool target."),
    (AUTOSCALE_UTILIZATION, "Fleet utilization the autoscaler tracks (0-1)."),
    (AUTOSCALE_DECISIONS, "Autoscaler decisions, by action and reason."),
    (ENGINES_SERVING, "Engines serving (routed to)."),
    (ENGINES_WARM, "Engines started and ready but not routed to (the warm pool)."),
    (ENGINE_COLD_STARTS, "Engine cold starts."),
    (ENGINE_COLD_START, "Engine start to ready, seconds."),
    (ENGINE_RESTARTS, "Engine processes restarted by the supervisor."),
    (GPU_SECONDS, "Engine-seconds of every engine not stopped (billed time), whole seconds, by class."),
    (COST_USD, "Cost of the fleet so far, US dollars ([cost] prices)."),
    (OUTPUT_TOKENS, "Output tokens relayed to clients."),
    (COST_PER_1M, "Fleet cost per million output tokens, US dollars."),
    (COST_PER_VIDEO_MINUTE, "Fleet cost per minute of video delivered, US dollars."),
    (ENGINE_RETRIES, "Requests retried on another engine before their first byte."),
    (ADMISSION, "Admission decisions (admitted, degraded, rejected), by tier and reason."),
    (WORKLOAD_TYPE, "Admitted requests per [oserve] workload type."),
    (BROWNOUT_LEVEL, "Brownout level in force (0: none)."),
    (BROWNOUT_SIGNAL, "The overload signal brownout levels are chosen from."),
    (QUEUE_WAITING, "Requests waiting at the admission gate."),
    (TTFT_PREDICTION, "Measured over predicted TTFT of admitted requests (1: exact)."),
    (VIDEO_STREAMS, "Live video streams, by state."),
    (DIFFUSION_JOBS, "Image and video jobs finished, by kind and outcome (met, late, failed)."),
    (DIFFUSION_REFUSED, "Image and video requests refused, by reason."),
    (DIFFUSION_WAITING, "Image and video jobs waiting for GPUs."),
    (DIFFUSION_PAUSES, "Video jobs paused at a round boundary for more urgent work."),
    (DIFFUSION_SP_CHANGES, "Sequence-parallel degree changes of video jobs."),
    (DIFFUSION_MIGRATIONS, "Paused video jobs resumed on another engine."),
    (VIDEO_CHUNKS, "Video chunks delivered, by tier and fidelity."),
    (VIDEO_STALLS, "Video chunks delivered after their playout deadline."),
    (VIDEO_REHOMES, "Video streams moved to another engine."),
    (VIDEO_RHO_MAX, "ρ_max of the live video placement: the most loaded engine's active streams over its capacity K."),
    (VIDEO_DESIRED_ENGINES, "Engines the video autoscaler wants for the primary class ([video.fleet] autoscale)."),
    (VIDEO_RECOVERIES, "Video streams whose engine was lost, by what they went on from (staged_copy, prompt)."),
    (VIDEO_TRANSFER, "Engine-to-engine video state transfers, seconds, by phase."),
    (VIDEO_MOVE_STALL, "How long a moving video stream waited on its move, seconds."),
    (VIDEO_SP_BORROWS, "Donor engines borrowed for elastic sequence parallelism."),
    (
        VIDEO_ADOPTIONS,
        "Video streams taken over from another gateway, by trigger (dead_owner, resume, replay) and result (adopted, lost_race, forged, unsigned, malformed, other_tenant, unknown_engine, completed, gap).",
    ),
    (CLUSTER_REDIS_UP, "Whether the shared Redis answers (1) or not (0)."),
    (
        CLUSTER_SENTINEL_ERRORS,
        "Resolutions of the Redis primary through Sentinel that found none usable, by reason (no_primary: the sentinels name none that is up by that name; unreachable: no sentinel, or not the primary they named, answered in time).",
    ),
    (POLICY_VERSION, "The policy document in force (its version as a label; value 1)."),
    (POLICY_RELOADS, "Policy reloads, by result."),
    (STREAM_RESETS, "HTTP/2 streams reset, by reason."),
    (STREAM_RESUMES, "Streamed generations whose engine failed after the first tokens, by outcome: resumed on another engine, or failed (no engine took the rest)."),
    (CLUSTER_POLICY_REJECTED, "Policy documents from the cluster that failed validation here."),
    (
        CLUSTER_BAD_KEYS,
        "Gateway-owned Redis keys found holding another type (WRONGTYPE), by family: ignored, served on local limits.",
    ),
    (CONNECTIONS_OPEN, "Client connections open."),
    (CONNECTIONS_REFUSED, "Client connections refused at the limit."),
    (CONNECTIONS_CLOSED, "Client connections closed, by reason."),
];

/// Describes every family (the `# HELP` lines of `/metrics`).
fn describe_all() {
    for &(name, help) in HELP {
        // The exporter keeps one description per name, whatever the kind.
        metrics::describe_counter!(name, help);
    }
}

const LATENCY_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Installs the process-wide recorder once and returns its handle.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .expect("bucket list is non-empty")
            .install_recorder()
            .expect("the metrics recorder is installed once per process");
        describe_all();
        // A histogram keeps each sample until it is folded into its
        // buckets: at a render of /metrics, or at this upkeep. Without it a
        // gateway nobody scrapes kept every token's TBT sample (13.5 MB in
        // 2 minutes of overload, found by heaptrack: docs/reliability.md
        // "Soak").
        let upkeep = handle.clone();
        let _ = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        });
        handle
    })
}

/// How often histogram samples are folded into their buckets when nobody
/// renders `/metrics`: what a gateway holds of them is bounded by this
/// period's samples.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Follows one generation: TTFT at its first token, TLET at its end, SLO
/// met or missed, the in-flight gauge for as long as it lives, and the
/// same moments in the request's trace (first-token event, relay span,
/// usage). Observation only: what a request holds is its permit,
/// `permit.rs`.
#[derive(Debug)]
pub struct RequestObserver {
    arrived: Instant,
    /// The tier's metric handles (one cache lookup per request).
    tier: Arc<TierMetrics>,
    first_seen: bool,
    /// The request's TTFT and end-to-end targets, and whether its end-to-end
    /// result is recorded (at the end, or as a miss if it never ends).
    slo: Option<(Duration, Duration)>,
    e2e_recorded: bool,
    /// The request's trace: the first token as an event, the relay from it
    /// to the last token as a span, the usage on the server span.
    trace: crate::trace::RequestTrace,
    relay: crate::trace::Child,
    /// From the first token on: the last token's time (none before the
    /// first gap is timed).
    tbt: Option<Option<Instant>>,
}

impl RequestObserver {
    /// `slo`: the TTFT and end-to-end targets the request was admitted
    /// against (counted in `gateway_slo_requests_total`).
    pub fn new(arrived: Instant, tier: &str, slo: Option<(Duration, Duration)>) -> Self {
        inflight().increment(1.0);
        Self {
            arrived,
            tier: TierMetrics::of(tier),
            first_seen: false,
            slo,
            e2e_recorded: false,
            trace: crate::trace::RequestTrace::default(),
            relay: crate::trace::Child::default(),
            tbt: None,
        }
    }

    /// Follows the request's trace too.
    pub(crate) fn traced(mut self, trace: crate::trace::RequestTrace) -> Self {
        self.trace = trace;
        self
    }

    pub fn tier(&self) -> &TierMetrics {
        &self.tier
    }

    /// Records TTFT at the first call; returns it then (`None` after).
    pub fn first_token(&mut self) -> Option<Duration> {
        if self.first_seen {
            return None;
        }
        self.first_seen = true;
        let ttft = crate::clock::since(self.arrived);
        self.tbt = Some(None);
        self.tier.ttft().record(ttft.as_secs_f64());
        if let Some((target, _)) = self.slo {
            self.tier.slo(Slo::Ttft, ttft <= target);
        }
        self.trace.event("gen_ai.first_token", || {
            vec![telemetry::KeyValue::new("slo.ttft_ms", telemetry::ms(ttft))]
        });
        self.relay = self.trace.child("relay", telemetry::SpanKind::Internal, Vec::new);
        Some(ttft)
    }

    /// A token was relayed: from the second on, the gap since the last.
    pub fn token(&mut self) {
        if let Some(last) = &mut self.tbt {
            let now = crate::clock::now();
            if let Some(t) = last {
                self.tier.tbt().record(now.saturating_duration_since(*t).as_secs_f64());
            }
            *last = Some(now);
        }
    }

    /// The generation ended normally.
    pub fn finished(&mut self, usage: Usage) {
        let tlet = crate::clock::since(self.arrived);
        self.tier.tlet().record(tlet.as_secs_f64());
        if let Some((_, target)) = self.slo {
            self.tier.slo(Slo::E2e, tlet <= target);
            self.e2e_recorded = true;
        }
        self.trace.set(|| {
            vec![
                telemetry::KeyValue::new("gen_ai.usage.input_tokens", i64::from(usage.prompt_tokens)),
                telemetry::KeyValue::new("gen_ai.usage.output_tokens", i64::from(usage.completion_tokens)),
                telemetry::KeyValue::new("slo.e2e_ms", telemetry::ms(tlet)),
            ]
        });
        self.relay = crate::trace::Child::default(); // ends the relay span
        output_tokens().increment(u64::from(usage.completion_tokens));
        OUTPUT_TOKENS_SO_FAR
            .fetch_add(u64::from(usage.completion_tokens), std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for RequestObserver {
    fn drop(&mut self) {
        // Ended early (an engine failure, a timeout, the client gone): the
        // targets not yet met are missed.
        if self.first_seen && !self.e2e_recorded {
            self.relay.fail("ended before the last token");
        }
        if self.slo.is_some() {
            if !self.first_seen {
                self.tier.slo(Slo::Ttft, false);
            }
            if !self.e2e_recorded {
                self.tier.slo(Slo::E2e, false);
            }
        }
        inflight().decrement(1.0);
    }
}

#[cfg(test)]
mod help_tests {
    /// Every family named in this file has its `# HELP` text.
    #[test]
    fn every_family_is_described() {
        let (names, missing) = loadtest::prom::missing_help(include_str!("metrics.rs"), super::HELP);
        assert!(names > 40, "found {names} names");
        assert!(missing.is_empty(), "no # HELP for {missing:?}");
    }
}
