//! Deficit round-robin across tenants, counted in tokens.
//!
//! Requests that cannot start at once wait in one flow per tenant. Flows
//! take turns; each turn a flow earns `quantum × weight` tokens of credit
//! and sends requests while their cost (prompt + expected output tokens)
//! fits its credit. A tenant sending many long requests therefore gets the
//! same token share as one sending many short ones, not more because its
//! requests are bigger, and not less because they are fewer.
//!
//! Inside one flow requests leave in key order (lower first: weighted
//! shortest job, or a deadline), not arrival order.
//!
//! Fairness bound (Shreedhar & Varghese): while two flows stay backlogged,
//! the tokens they have been served, each divided by its weight, differ by
//! at most `quantum + max_cost / min_weight` at any moment. Tested below.

use std::collections::{BTreeMap, VecDeque};

/// One waiting item with its cost (tokens) and ordering key.
#[derive(Debug)]
struct Entry<T> {
    cost: u64,
    key: f64,
    item: T,
}

#[derive(Debug)]
struct Flow<T> {
    weight: u64,
    deficit: u64,
    queue: VecDeque<Entry<T>>,
    /// Sum of the costs queued.
    backlog: u64,
}

/// A deficit round-robin scheduler over tenant flows.
#[derive(Debug)]
pub struct Drr<T> {
    quantum: u64,
    flows: BTreeMap<String, Flow<T>>,
    /// Backlogged flows in turn order; the head is being served.
    active: VecDeque<String>,
    /// Whether the head has already received this turn's quantum.
    head_credited: bool,
    len: usize,
}

impl<T> Drr<T> {
    /// `quantum`: tokens of credit per turn per unit of weight.
    pub fn new(quantum: u64) -> Self {
        Self {
            quantum: quantum.max(1),
            flows: BTreeMap::new(),
            active: VecDeque::new(),
            head_credited: false,
            len: 0,
        }
    }

    /// A new quantum (a policy reload); credit already earned is kept.
    pub fn set_quantum(&mut self, quantum: u64) {
        self.quantum = quantum.max(1);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `item` for `tenant` (weight ≥ 1, taken from its tier).
    pub fn push(&mut self, tenant: &str, weight: u32, cost: u64, key: f64, item: T) {
        let flow = self.flows.entry(tenant.to_string()).or_insert_with(|| Flow {
            weight: 1,
            deficit: 0,
            queue: VecDeque::new(),
            backlog: 0,
        });
        flow.weight = u64::from(weight.max(1));
        if flow.queue.is_empty() {
            flow.deficit = 0;
            self.active.push_back(tenant.to_string());
        }
        let at = flow.queue.iter().position(|e| e.key > key).unwrap_or(flow.queue.len());
        flow.queue.insert(at, Entry { cost, key, item });
        flow.backlog += cost;
        self.len += 1;
    }

    /// The next item to serve and its tenant.
    pub fn pop(&mut self) -> Option<(String, T)> {
        loop {
            let name = self.active.front()?.clone();
            let flow = self.flows.get_mut(&name).expect("active flows exist");
            if !self.head_credited {
                flow.deficit += self.quantum * flow.weight;
                self.head_credited = true;
            }
            let head_cost = flow.queue.front().map(|e| e.cost);
            match head_cost {
                Some(c) if c <= flow.deficit => {
                    let e = flow.queue.pop_front().expect("non-empty");
                    flow.deficit -= c;
                    flow.backlog -= c;
                    self.len -= 1;
                    if flow.queue.is_empty() {
                        flow.deficit = 0;
                        self.active.pop_front();
                        self.head_credited = false;
                    }
                    return Some((name, e.item));
                }
                Some(_) => {
                    // Not enough credit: the turn passes, credit is kept.
                    self.active.rotate_left(1);
                    self.head_credited = false;
                }
                None => {
                    self.active.pop_front();
                    self.head_credited = false;
                }
            }
        }
    }

    /// Drops every item for which `keep` is false (waiters that gave up).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for flow in self.flows.values_mut() {
            let before = flow.queue.len();
            flow.queue.retain(|e| keep(&e.item));
            self.len -= before - flow.queue.len();
            flow.backlog = flow.queue.iter().map(|e| e.cost).sum();
        }
        let flows = &self.flows;
        let head = self.active.front().cloned();
        self.active.retain(|n| flows.get(n).is_some_and(|f| !f.queue.is_empty()));
        if self.active.front() != head.as_ref() {
            self.head_credited = false;
        }
        self.flows.retain(|_, f| !f.queue.is_empty());
    }

    /// Tokens that would be served before a new request of `cost` from
    /// `tenant` (weight `weight`) with key `key`, itself included: the ones
    /// ahead of it in its own flow, plus from every other flow up to the
    /// same weighted share (DRR serves flows in proportion to weight).
    pub fn tokens_ahead(&self, tenant: &str, weight: u32, cost: u64, key: f64) -> u64 {
        let own: u64 = self
            .flows
            .get(tenant)
            .map_or(0, |f| f.queue.iter().filter(|e| e.key <= key).map(|e| e.cost).sum());
        let mine = own + cost;
        let w = weight.max(1) as f64;
        let others: u64 = self
            .flows
            .iter()
            .filter(|(n, _)| n.as_str() != tenant)
            .map(|(_, f)| f.backlog.min((mine as f64 * f.weight as f64 / w).ceil() as u64))
            .sum();
        mine + others
    }

    /// Sum of the costs waiting.
    pub fn backlog(&self) -> u64 {
        self.flows.values().map(|f| f.backlog).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix;

    #[test]
    fn serves_in_token_shares_by_weight() {
        let mut d = Drr::new(100);
        // Tenant a sends 10 requests of 400 tokens, b sends 40 of 100: the
        // same tokens; equal weights get equal token shares, not equal counts.
        for i in 0..10 {
            d.push("a", 1, 400, i as f64, ("a", 400));
        }
        for i in 0..40 {
            d.push("b", 1, 100, i as f64, ("b", 100));
        }
        let mut served = BTreeMap::<&str, u64>::new();
        for _ in 0..25 {
            let (_, (t, c)) = d.pop().unwrap();
            *served.entry(t).or_default() += c;
        }
        let (a, b) = (served["a"], served["b"]);
        assert!(a.abs_diff(b) <= 500, "a={a} b={b}");
    }

    #[test]
    fn key_order_inside_a_flow() {
        let mut d = Drr::new(1000);
        d.push("a", 1, 10, 3.0, 3);
        d.push("a", 1, 10, 1.0, 1);
        d.push("a", 1, 10, 2.0, 2);
        let order: Vec<i32> = std::iter::from_fn(|| d.pop().map(|(_, x)| x)).collect();
        assert_eq!(order, vec![1, 2, 3]);
        assert!(d.is_empty());
    }

    /// The DRR fairness bound on random costs and weights.
    #[test]
    fn fairness_bound_holds_while_backlogged() {
        for seed in 0..50u64 {
            let mut rng = SplitMix(seed);
            let quantum = 64 + rng.next_u64() % 512;
            let (wa, wb) = (1 + (rng.next_u64() % 4) as u32, 1 + (rng.next_u64() % 4) as u32);
            let max_cost = 2000u64;
            let mut d = Drr::new(quantum);
            for i in 0..300 {
                let ca = 1 + rng.next_u64() % max_cost;
                let cb = 1 + rng.next_u64() % max_cost;
                d.push("a", wa, ca, f64::from(i), ('a', ca));
                d.push("b", wb, cb, f64::from(i), ('b', cb));
            }
            let (mut sa, mut sb) = (0f64, 0f64);
            let bound = quantum as f64 + max_cost as f64; // per unit weight, min weight 1
                                                          // Stop while both flows are surely still backlogged.
            for _ in 0..200 {
                let (_, (t, c)) = d.pop().unwrap();
                if t == 'a' {
                    sa += c as f64;
                } else {
                    sb += c as f64;
                }
                let gap = (sa / f64::from(wa) - sb / f64::from(wb)).abs();
                assert!(gap <= bound + 1e-9, "seed {seed}: gap {gap} > {bound}");
            }
        }
    }

    #[test]
    fn retain_drops_waiters_and_keeps_counts() {
        let mut d = Drr::new(10);
        for i in 0..6 {
            d.push(if i % 2 == 0 { "a" } else { "b" }, 1, 5, f64::from(i), i);
        }
        d.retain(|x| *x != 0 && *x != 2 && *x != 4);
        assert_eq!(d.len(), 3);
        assert_eq!(d.backlog(), 15);
        let left: Vec<i32> = std::iter::from_fn(|| d.pop().map(|(_, x)| x)).collect();
        assert_eq!(left, vec![1, 3, 5]);
    }

    #[test]
    fn tokens_ahead_counts_weighted_shares() {
        let mut d = Drr::new(100);
        d.push("a", 1, 1000, 0.0, ());
        d.push("b", 4, 5000, 0.0, ());
        // A new 200-token request of a (weight 1): a has 1000 ahead, so
        // 1200 of a's; b (weight 4) is served up to 4,800 meanwhile.
        assert_eq!(d.tokens_ahead("a", 1, 200, 1.0), 1200 + 4800);
        // A new gold request of b with a better key than b's queued one.
        assert_eq!(d.tokens_ahead("b", 4, 200, -1.0), 200 + 50);
    }
}
