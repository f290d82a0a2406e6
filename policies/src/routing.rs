//! Engine choice for one request.
//!
//! The foundation policy is "fewest in-flight tokens among ready engines":
//! tokens, not request counts, because one long generation costs an engine
//! as much as many short ones. Later policies (predicted finish time, KV
//! headroom, lanes, affinity) extend [`EngineView`] and keep this signature.

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
}

/// Picks the index of the ready engine with the fewest in-flight tokens,
/// skipping the indexes in `exclude` (engines that already failed this
/// request). Ties go to the lowest index, so the choice is deterministic.
/// `None` when no ready engine remains.
pub fn least_inflight_tokens(engines: &[EngineView], exclude: &[usize]) -> Option<usize> {
    engines
        .iter()
        .enumerate()
        .filter(|(i, e)| e.ready && !exclude.contains(i))
        .min_by_key(|(i, e)| (e.inflight_tokens, *i))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: &str, ready: bool, tokens: u64) -> EngineView {
        EngineView { id: id.into(), ready, inflight_tokens: tokens }
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
}
