//! Engine choice for one request, and the `[routing]` knobs.
//!
//! The product's policy (`predicted_finish`) lives in [`crate::admission`]:
//! the engine with the lowest predicted finish time among those that keep
//! KV headroom above their low watermark, long prompts in their own lane.
//! The simple policies here serve the FCFS baselines of the admission
//! benchmark and the fallback when admission is off: fewest in-flight
//! tokens, fewest in-flight requests (length-oblivious "least loaded"), and
//! round robin.

use serde::Deserialize;

/// `[routing] policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutePolicy {
    /// Lowest predicted finish time with KV headroom and lanes (admission).
    PredictedFinish,
    /// Fewest in-flight requests, blind to their length.
    LeastLoaded,
    /// Each engine in turn.
    RoundRobin,
    /// The engine holding the longest cached prefix of the prompt (the
    /// gateway's index, `[routing.prefix]`), unless the fleet is
    /// imbalanced; else fewest in-flight tokens (admission off).
    CacheAware,
}

/// `[routing] order`: the ordering key sent with each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOrder {
    /// Weighted shortest remaining processing time, as a virtual finish
    /// time (arrival + estimated service / weight, so waiting requests age);
    /// requests with an explicit `x-slo-ttft-ms` use their deadline (EDF).
    Wsrpt,
    /// Arrival order.
    Fcfs,
}

/// `[routing]` in the policy document.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    pub policy: RoutePolicy,
    pub order: QueueOrder,
    /// Prompts of at least this many tokens use the long lane.
    pub long_prompt_tokens: u32,
    /// Engines (of each class, counted from the first) in the long lane,
    /// when the class has more engines than this.
    pub long_lane_engines: u32,
    /// Deficit round-robin credit per turn per unit of tier weight, tokens.
    pub drr_quantum_tokens: u64,
    /// Longest a request may wait at the gateway for a slot, milliseconds
    /// (besides its own TTFT budget).
    pub max_queue_ms: u32,
    /// Prefix-cache affinity.
    pub prefix: crate::prefix::AffinityConfig,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            policy: RoutePolicy::PredictedFinish,
            order: QueueOrder::Wsrpt,
            long_prompt_tokens: 1024,
            long_lane_engines: 1,
            drr_quantum_tokens: 512,
            max_queue_ms: 30_000,
            prefix: crate::prefix::AffinityConfig::default(),
        }
    }
}

impl RoutingConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.drr_quantum_tokens == 0 {
            return Err(("routing.drr_quantum_tokens", "must be > 0".into()));
        }
        if self.long_prompt_tokens == 0 {
            return Err(("routing.long_prompt_tokens", "must be > 0".into()));
        }
        self.prefix.validate()
    }
}

/// What routing may know about one engine at decision time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineView {
    /// Stable engine id (as reported in `x-engine`).
    pub id: String,
    /// The engine answered its readiness probe recently.
    pub ready: bool,
    /// Tokens the gateway has dispatched to it and not yet seen finish
    /// (prompt tokens plus the remaining output budget).
    pub inflight_tokens: u64,
    /// Requests the gateway has dispatched to it and not yet seen finish.
    pub inflight_requests: u32,
    /// Leading blocks of this request's prompt it holds (the gateway's
    /// prefix index; 0 when not looked up).
    pub cached_blocks: u32,
}

/// Picks the index of the ready engine with the fewest in-flight tokens,
/// skipping the indexes in `exclude` (engines that already failed this
/// request). Ties go to the lowest index, so the choice is deterministic.
/// `None` when no ready engine remains.
pub fn least_inflight_tokens(engines: &[EngineView], exclude: &[usize]) -> Option<usize> {
    least_by(engines, exclude, 0, |e| e.inflight_tokens)
}

/// Fewest in-flight requests among ready engines (length-oblivious), ties
/// taken in turn ([`from_turn`]), as nginx's `least_conn` tries tied
/// servers round robin. Lowest index on ties would send every request of a
/// lightly loaded fleet, where all engines sit at zero, to the first
/// engine, an accidental affinity (one engine's prefix cache then holds
/// everything) that no load balancer a fleet runs has.
pub fn least_inflight_requests(engines: &[EngineView], exclude: &[usize], turn: u64) -> Option<usize> {
    least_by(engines, exclude, turn, |e| u64::from(e.inflight_requests))
}

/// How far position `i` of `n` comes after where decision `turn` starts
/// (`turn mod n`): the tie-break that takes equal engines in turn.
pub fn from_turn(i: usize, n: usize, turn: u64) -> usize {
    let n = n.max(1);
    (i + n - (turn % n as u64) as usize) % n
}

/// The ready engine not in `exclude` with the least `load`, ties in `turn`.
fn least_by(
    engines: &[EngineView],
    exclude: &[usize],
    turn: u64,
    load: impl Fn(&EngineView) -> u64,
) -> Option<usize> {
    engines
        .iter()
        .enumerate()
        .filter(|(i, e)| e.ready && !exclude.contains(i))
        .min_by_key(|(i, e)| (load(e), from_turn(*i, engines.len(), turn)))
        .map(|(i, _)| i)
}

/// The ready engine not in `exclude` holding the longest prefix of a
/// prompt of `blocks` full blocks, unless affinity yields to load
/// ([`crate::prefix::pick`] over in-flight tokens, ties in `turn`).
pub fn cache_aware(
    engines: &[EngineView],
    exclude: &[usize],
    blocks: u32,
    cfg: &crate::prefix::AffinityConfig,
    turn: u64,
) -> Option<usize> {
    let choices: Vec<crate::prefix::Choice> = engines
        .iter()
        .enumerate()
        .filter(|(i, e)| e.ready && !exclude.contains(i))
        .map(|(idx, e)| crate::prefix::Choice {
            idx,
            matched_blocks: e.cached_blocks,
            load: e.inflight_tokens,
        })
        .collect();
    crate::prefix::pick(&choices, blocks, cfg, turn)
}

/// The `turn`-th ready engine in order, skipping `exclude`.
pub fn round_robin(engines: &[EngineView], exclude: &[usize], turn: u64) -> Option<usize> {
    let ready: Vec<usize> =
        (0..engines.len()).filter(|i| engines[*i].ready && !exclude.contains(i)).collect();
    (!ready.is_empty()).then(|| ready[(turn % ready.len() as u64) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: &str, ready: bool, tokens: u64) -> EngineView {
        EngineView {
            id: id.into(),
            ready,
            inflight_tokens: tokens,
            inflight_requests: (tokens / 10) as u32,
            cached_blocks: 0,
        }
    }

    #[test]
    fn baselines_round_robin_and_least_requests() {
        let es = [view("a", true, 500), view("b", false, 0), view("c", true, 20)];
        let turns: Vec<_> = (0..4).map(|t| round_robin(&es, &[], t)).collect();
        assert_eq!(turns, vec![Some(0), Some(2), Some(0), Some(2)]);
        assert_eq!(round_robin(&es, &[0, 2], 0), None);
        assert_eq!(least_inflight_requests(&es, &[], 0), Some(2));
        assert_eq!(least_inflight_requests(&es, &[2], 0), Some(0));
    }

    #[test]
    fn least_requests_takes_tied_engines_in_turn_and_never_a_busier_one() {
        let idle = |id: &str, requests: u32| EngineView {
            id: id.into(),
            ready: true,
            inflight_tokens: 0,
            inflight_requests: requests,
            cached_blocks: 0,
        };
        // An idle fleet: each decision goes to the next engine.
        let es = [idle("a", 0), idle("b", 0), idle("c", 0), idle("d", 0)];
        let picks: Vec<_> = (0..6).map(|t| least_inflight_requests(&es, &[], t).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 3, 0, 1]);
        // Only the least loaded are candidates, whatever the turn; the turn
        // rotates among them (b and d tie at 1).
        let es = [idle("a", 3), idle("b", 1), idle("c", 2), idle("d", 1)];
        let picks: Vec<_> = (0..4).map(|t| least_inflight_requests(&es, &[], t).unwrap()).collect();
        assert_eq!(picks, vec![1, 1, 3, 3]);
        assert_eq!(least_inflight_requests(&es, &[1], 0), Some(3));
        assert_eq!(least_inflight_requests(&es, &[0, 1, 2, 3], 5), None);
    }

    #[test]
    fn picks_fewest_tokens_among_ready() {
        let es = [view("a", true, 500), view("b", true, 20), view("c", false, 0)];
        assert_eq!(least_inflight_tokens(&es, &[]), Some(1));
    }

    #[test]
    fn excludes_failed_engines_and_breaks_ties_by_index() {
        let es = [view("a", true, 10), view("b", true, 10)];
        assert_eq!(least_inflight_tokens(&es, &[]), Some(0));
        assert_eq!(least_inflight_tokens(&es, &[0]), Some(1));
        assert_eq!(least_inflight_tokens(&es, &[0, 1]), None);
    }

    #[test]
    fn none_when_nothing_is_ready() {
        assert_eq!(least_inflight_tokens(&[view("a", false, 0)], &[]), None);
        assert_eq!(least_inflight_tokens(&[], &[]), None);
    }

    #[test]
    fn cache_aware_follows_the_prefix_among_ready_engines_until_load_diverges() {
        let cfg = crate::prefix::AffinityConfig::default(); // imbalanced past 4,096 tokens and 1.5x
        let with = |mut v: EngineView, blocks| {
            v.cached_blocks = blocks;
            v
        };
        let es =
            [with(view("a", true, 3_000), 8), with(view("b", true, 100), 0), with(view("c", false, 0), 10)];
        assert_eq!(cache_aware(&es, &[], 10, &cfg, 0), Some(0), "the cached prefix, not the idle engine");
        assert_eq!(cache_aware(&es, &[0], 10, &cfg, 0), Some(1), "a failed engine is skipped");
        let busy = [with(view("a", true, 9_000), 8), with(view("b", true, 100), 0)];
        assert_eq!(cache_aware(&busy, &[], 10, &cfg, 0), Some(1), "imbalanced: load decides");
        let short = [with(view("a", true, 300), 2), with(view("b", true, 100), 0)];
        assert_eq!(cache_aware(&short, &[], 10, &cfg, 0), Some(1), "2 of 10 blocks is under min_match");
    }
}
