//! Metric handles kept per worker thread, so that a request records its
//! metrics without a registry lookup per record.
//!
//! `metrics::counter!(NAME, "tier" => t)` builds the key (the labels
//! copied into a new vector), hashes it and looks it up in the exporter's
//! registry on every call; a request made about ten such calls, ~15% of
//! the gateway's own instructions per request (callgrind). A handle
//! (`Counter`, `Histogram`, `Gauge`) records with one atomic operation, so
//! each worker thread keeps the handles of the label sets it has used:
//! per tier ([`TierMetrics`]), per route and status, per admission
//! decision; the two label-free ones are kept once per process. The caches
//! are bounded ([`MAX_ENTRIES`] label sets each; cleared when full, after
//! which handles are made again on first use): label values come from the
//! policy file and the route table, never from a client, but a policy
//! reload can rename tiers.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram};

/// Label sets each thread's cache keeps before it starts over.
pub(crate) const MAX_ENTRIES: usize = 64;

/// One tier's handles: what a request of that tier records. Each is made
/// at its first use, so that a series appears in `/metrics` only once
/// something was recorded in it, as with the macros.
#[derive(Debug)]
pub struct TierMetrics {
    pub(crate) name: Box<str>,
    ttft: OnceLock<Histogram>,
    tbt: OnceLock<Histogram>,
    tlet: OnceLock<Histogram>,
    ttft_prediction: OnceLock<Histogram>,
    queue_wait: OnceLock<Histogram>,
    /// `[ttft, e2e][met, missed]`.
    slo: [[OnceLock<Counter>; 2]; 2],
}

/// Which target an SLO result is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Slo {
    Ttft = 0,
    E2e = 1,
}

impl TierMetrics {
    fn new(tier: &str) -> Self {
        Self {
            name: tier.into(),
            ttft: OnceLock::new(),
            tbt: OnceLock::new(),
            tlet: OnceLock::new(),
            ttft_prediction: OnceLock::new(),
            queue_wait: OnceLock::new(),
            slo: Default::default(),
        }
    }

    /// `tier`'s handles, from this thread's cache.
    pub fn of(tier: &str) -> Arc<TierMetrics> {
        thread_local! {
            static TIERS: RefCell<Vec<Arc<TierMetrics>>> = const { RefCell::new(Vec::new()) };
        }
        TIERS.with_borrow_mut(|tiers| {
            if let Some(t) = tiers.iter().find(|t| &*t.name == tier) {
                return Arc::clone(t);
            }
            if tiers.len() >= MAX_ENTRIES {
                tiers.clear();
            }
            let t = Arc::new(TierMetrics::new(tier));
            tiers.push(Arc::clone(&t));
            t
        })
    }

    fn histogram<'a>(&'a self, cell: &'a OnceLock<Histogram>, name: &'static str) -> &'a Histogram {
        cell.get_or_init(|| metrics::histogram!(name, "tier" => self.name.to_string()))
    }

    pub(crate) fn ttft(&self) -> &Histogram {
        self.histogram(&self.ttft, super::TTFT)
    }

    pub(crate) fn tbt(&self) -> &Histogram {
        self.histogram(&self.tbt, super::TBT)
    }

    pub(crate) fn tlet(&self) -> &Histogram {
        self.histogram(&self.tlet, super::TLET)
    }

    pub(crate) fn ttft_prediction(&self) -> &Histogram {
        self.histogram(&self.ttft_prediction, super::TTFT_PREDICTION)
    }

    pub(crate) fn queue_wait(&self) -> &Histogram {
        self.histogram(&self.queue_wait, super::QUEUE_WAIT)
    }

    pub(crate) fn slo(&self, slo: Slo, met: bool) {
        let (which, result) = (["ttft", "e2e"][slo as usize], if met { "met" } else { "missed" });
        let counter = self.slo[slo as usize][usize::from(!met)].get_or_init(|| {
            metrics::counter!(super::SLO, "tier" => self.name.to_string(), "slo" => which, "result" => result)
        });
        counter.increment(1);
    }
}

/// `gateway_inflight_requests`' handle, made at first use.
pub(crate) fn inflight() -> &'static Gauge {
    static INFLIGHT: OnceLock<Gauge> = OnceLock::new();
    INFLIGHT.get_or_init(|| metrics::gauge!(super::INFLIGHT))
}

/// `gateway_output_tokens_total`'s handle, made at first use.
pub(crate) fn output_tokens() -> &'static Counter {
    static OUTPUT_TOKENS: OnceLock<Counter> = OnceLock::new();
    OUTPUT_TOKENS.get_or_init(|| metrics::counter!(super::OUTPUT_TOKENS))
}

/// A thread's counters by label set, found by a linear scan (a few dozen
/// sets at most) and started over when full.
type Counters<K> = RefCell<Vec<(K, Counter)>>;

fn counter_in<K>(
    cache: &Counters<K>,
    hit: impl Fn(&K) -> bool,
    make: impl FnOnce() -> (K, Counter),
) -> Counter {
    let mut cache = cache.borrow_mut();
    if let Some((_, c)) = cache.iter().find(|(k, _)| hit(k)) {
        return c.clone();
    }
    if cache.len() >= MAX_ENTRIES {
        cache.clear();
    }
    let (k, c) = make();
    cache.push((k, c.clone()));
    c
}

/// `gateway_requests_total{route,status}`'s handle for this pair.
pub(crate) fn requests(route: &'static str, status: u16) -> Counter {
    thread_local! {
        static REQUESTS: Counters<(&'static str, u16)> = const { RefCell::new(Vec::new()) };
    }
    REQUESTS.with(|cache| {
        counter_in(
            cache,
            |&(r, s)| r == route && s == status,
            || {
                let c = metrics::counter!(super::REQUESTS, "route" => route, "status" => status.to_string());
                ((route, status), c)
            },
        )
    })
}

/// `gateway_admission_decisions_total{tier,decision,reason}`'s handle.
pub(crate) fn admission(tier: &str, decision: &'static str, reason: &str) -> Counter {
    thread_local! {
        static ADMISSION: Counters<(Box<str>, &'static str, Box<str>)> = const { RefCell::new(Vec::new()) };
    }
    ADMISSION.with(|cache| {
        let hit = |(t, d, r): &(Box<str>, &'static str, Box<str>)| &**t == tier && *d == decision && &**r == reason;
        counter_in(cache, hit, || {
            let c = metrics::counter!(super::ADMISSION, "tier" => tier.to_string(), "decision" => decision, "reason" => reason.to_string());
            ((tier.into(), decision, reason.into()), c)
        })
    })
}

/// The usage counters of one tenant and model: requests, prompt and
/// completion tokens, cost.
#[derive(Debug, Clone)]
pub(crate) struct UsageCounters {
    pub(crate) requests: Counter,
    pub(crate) prompt: Counter,
    pub(crate) completion: Counter,
    pub(crate) cost: Counter,
}

/// A thread's usage counters by (tenant, model).
type UsageCache = RefCell<Vec<((Box<str>, Box<str>), UsageCounters)>>;

/// `gateway_usage_*{tenant,model}`'s handles for this pair, from this
/// thread's cache.
pub(crate) fn usage(tenant: &str, model: &str) -> UsageCounters {
    thread_local! {
        static USAGE: UsageCache = const { RefCell::new(Vec::new()) };
    }
    USAGE.with_borrow_mut(|cache| {
        if let Some((_, c)) = cache.iter().find(|((t, m), _)| &**t == tenant && &**m == model) {
            return c.clone();
        }
        if cache.len() >= MAX_ENTRIES {
            cache.clear();
        }
        let (t, m) = (tenant.to_string(), model.to_string());
        let tokens = |kind: &'static str| {
            metrics::counter!(super::USAGE_TOKENS, "tenant" => t.clone(), "model" => m.clone(), "kind" => kind)
        };
        let c = UsageCounters {
            requests: metrics::counter!(super::USAGE_REQUESTS, "tenant" => t.clone(), "model" => m.clone()),
            prompt: tokens("prompt"),
            completion: tokens("completion"),
            cost: metrics::counter!(super::USAGE_COST, "tenant" => t.clone(), "model" => m.clone()),
        };
        cache.push(((tenant.into(), model.into()), c.clone()));
        c
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tier's handles are made once per thread and reused; the cache
    /// starts over past its bound instead of growing.
    #[test]
    fn a_tier_is_looked_up_once_and_the_cache_is_bounded() {
        let gold = TierMetrics::of("gold");
        assert!(Arc::ptr_eq(&gold, &TierMetrics::of("gold")), "the second lookup reuses the handles");
        assert!(!Arc::ptr_eq(&gold, &TierMetrics::of("silver")));
        for i in 0..MAX_ENTRIES {
            TierMetrics::of(&format!("tier-{i}"));
        }
        assert!(!Arc::ptr_eq(&gold, &TierMetrics::of("gold")), "cleared when full, then made again");
        assert_eq!(&*TierMetrics::of("gold").name, "gold");
    }

    /// A label set's counter is made once; past the bound the cache starts
    /// over rather than growing.
    #[test]
    fn counters_are_made_once_per_label_set_and_the_cache_is_bounded() {
        let cache: Counters<u16> = RefCell::new(Vec::new());
        let mut made = 0;
        for status in (0..MAX_ENTRIES as u16 + 10).chain(0..5) {
            let _counter = counter_in(
                &cache,
                |&s| s == status,
                || {
                    made += 1;
                    (status, Counter::noop())
                },
            );
            assert!(cache.borrow().len() <= MAX_ENTRIES);
        }
        assert_eq!(made, MAX_ENTRIES + 10 + 5, "the first five were dropped at the clear, so made again");
        let _counter =
            counter_in(&cache, |&s| s == 4, || unreachable!("a cached label set is not made again"));
    }
}
