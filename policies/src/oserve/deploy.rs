//! The upper level of OServe (§4.3): which replicas (GPU count and TP × PP
//! split each) to run on `D` GPUs, and how to move from one deployment to
//! another without dropping below the capacity the forecast needs (§5).
//!
//! Search (flow-network-guided generation, Appendix E): start from
//! identical replicas of the fewest GPUs that hold the model, the widest TP;
//! each iteration solves the lower level ([`assign`]) for the forecast,
//! then tries the moves its flow suggests: merge two replicas (an under-used
//! replica's GPUs go where the flow is saturated, or two saturated small
//! replicas become one with room for larger batches), split a saturated
//! replica into two, swap GPUs (one or two move from an under-used replica
//! to a saturated one), and re-split any replica's GPUs (TP ↔ PP); each
//! move's replicas get their best split. Replicas take any GPU count up to
//! 16 (the paper's TP3 and 5-replica deployments). It takes the best move
//! and stops when none improves (requests served, then the most loaded
//! replica's load: headroom) or after `max_iterations`.

use super::assign::{assign, Assignment, Replica};
use super::capacity::{CostModel, Parallel, MAX_REPLICA_GPUS};

/// Replicas, each a parallel configuration on its own GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    pub replicas: Vec<Parallel>,
}

impl Deployment {
    pub fn gpus(&self) -> u32 {
        self.replicas.iter().map(|p| p.gpus()).sum()
    }

    /// Replicas sorted (the search compares deployments as multisets).
    fn canonical(mut self) -> Self {
        self.replicas.sort();
        self
    }
}

impl std::fmt::Display for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.replicas.iter().map(ToString::to_string).collect();
        write!(f, "[{}]", parts.join(", "))
    }
}

/// The lower level's input for `dep`: `n_kj` from the cost model for each
/// type's centroid (input, output); no per-edge cap (C2 is `n_kj` itself).
pub fn replicas(model: &CostModel, dep: &Deployment, types: &[(f64, f64)]) -> Vec<Replica> {
    dep.replicas
        .iter()
        .map(|&p| {
            let n: Vec<f64> = types.iter().map(|&(i, o)| model.capacity(p, i, o)).collect();
            Replica { e: n.clone(), n }
        })
        .collect()
}

/// The assignment of `lambda` (requests per second per type) on `dep`.
pub fn evaluate(model: &CostModel, dep: &Deployment, types: &[(f64, f64)], lambda: &[f64]) -> Assignment {
    assign(lambda, &replicas(model, dep, types))
}

/// A candidate's score: what the objective measures (requests served, or
/// the rate sustained in a mix), and the assignment the next moves read.
#[derive(Debug, Clone)]
pub struct Scored {
    pub score: f64,
    pub assignment: Assignment,
}

impl Scored {
    fn peak(&self) -> f64 {
        self.assignment.load.iter().copied().fold(0.0, f64::max)
    }

    /// Better: a higher score, then a lower peak load (headroom).
    fn beats(&self, other: &Scored) -> bool {
        let tol = 1e-6 * other.score.abs().max(1.0);
        self.score > other.score + tol
            || (self.score > other.score - tol && self.peak() < other.peak() - 1e-6)
    }
}

/// The smallest GPU count one replica of the model fits on.
pub fn min_gpus(model: &CostModel) -> Option<u32> {
    (1..=MAX_REPLICA_GPUS).find(|&g| !model.splits(g).is_empty())
}

/// The best split of `gpus` GPUs for replica slot `k` of `dep` (others
/// fixed), or `None` when no split fits.
fn best_split(
    model: &CostModel,
    dep: &Deployment,
    k: usize,
    gpus: u32,
    score: &dyn Fn(&Deployment) -> Scored,
) -> Option<(Deployment, Scored)> {
    let mut best: Option<(Deployment, Scored)> = None;
    for p in model.splits(gpus) {
        let mut d = dep.clone();
        d.replicas[k] = p;
        let s = score(&d);
        if best.as_ref().is_none_or(|(_, b)| s.beats(b)) {
            best = Some((d, s));
        }
    }
    best
}

/// What a search found, and how long it searched.
#[derive(Debug, Clone)]
pub struct Plan {
    pub deployment: Deployment,
    /// The objective's value: requests served ([`search`]) or the rate
    /// sustained in the mix ([`search_mix`]).
    pub score: f64,
    pub assignment: Assignment,
    pub iterations: usize,
}

/// Searches deployments of `gpus` GPUs serving the most of `lambda`
/// (requests per second per type, the forecast) over `types`.
pub fn search(
    model: &CostModel,
    gpus: u32,
    types: &[(f64, f64)],
    lambda: &[f64],
    max_iterations: usize,
) -> Option<Plan> {
    let score = |d: &Deployment| {
        let assignment = evaluate(model, d, types, lambda);
        Scored { score: assignment.served, assignment }
    };
    search_by(model, gpus, max_iterations, &score)
}

/// Searches deployments of `gpus` GPUs sustaining the highest rate in the
/// proportions `shares` ([`mix_capacity`]); the moves read the assignment
/// at that rate (its saturated replicas are the bottlenecks).
pub fn search_mix(
    model: &CostModel,
    gpus: u32,
    types: &[(f64, f64)],
    shares: &[f64],
    max_iterations: usize,
) -> Option<Plan> {
    let total: f64 = shares.iter().sum::<f64>().max(1e-12);
    let score = |d: &Deployment| {
        let rate = mix_capacity(model, d, types, shares);
        let lambda: Vec<f64> = shares.iter().map(|s| s / total * rate).collect();
        Scored { score: rate, assignment: evaluate(model, d, types, &lambda) }
    };
    search_by(model, gpus, max_iterations, &score)
}

fn search_by(
    model: &CostModel,
    gpus: u32,
    max_iterations: usize,
    score: &dyn Fn(&Deployment) -> Scored,
) -> Option<Plan> {
    // The start: the uniform deployment scoring most, the smallest
    // replicas and the widest TP on a tie (the paper starts from a uniform one; starting
    // from the best of them means the search never ends below what a
    // homogeneous fleet sustains; a tie goes to data parallelism, as
    // headroom compared across replica counts says little).
    let mut start: Option<(Deployment, Scored)> = None;
    let mut uniform: Vec<Parallel> =
        model.configurations().into_iter().filter(|p| p.gpus() <= gpus).collect();
    uniform.sort_by_key(|p| (p.gpus(), std::cmp::Reverse(p.tp)));
    for p in uniform {
        let d = Deployment { replicas: vec![p; (gpus / p.gpus()) as usize] };
        let s = score(&d);
        if start.as_ref().is_none_or(|(_, b)| s.score > b.score + 1e-6 * b.score.abs().max(1.0)) {
            start = Some((d, s));
        }
    }
    let (mut dep, mut cur) = start?;
    let mut iterations = 0;
    while iterations < max_iterations {
        iterations += 1;
        let mut best: Option<(Deployment, Scored)> = None;
        for (d, s) in neighbours(model, &dep, &cur.assignment, score) {
            if s.beats(&cur) && best.as_ref().is_none_or(|(_, b)| s.beats(b)) {
                best = Some((d, s));
            }
        }
        let Some((d, s)) = best else { break };
        (dep, cur) = (d.canonical(), s);
    }
    Some(Plan { deployment: dep, score: cur.score, assignment: cur.assignment, iterations })
}

/// The moves the flow of `cur` suggests from `dep`, each with its best
/// split, scored.
fn neighbours(
    model: &CostModel,
    dep: &Deployment,
    cur: &Assignment,
    score: &dyn Fn(&Deployment) -> Scored,
) -> Vec<(Deployment, Scored)> {
    let full = |k: usize| cur.load[k] >= 1.0 - 1e-6;
    let n = dep.replicas.len();
    let mut out = Vec::new();
    // Merges: the pair's GPUs become one replica (≤ 16 GPUs).
    for a in 0..n {
        for b in a + 1..n {
            let gpus = dep.replicas[a].gpus() + dep.replicas[b].gpus();
            if gpus > MAX_REPLICA_GPUS {
                continue;
            }
            let mut d = dep.clone();
            d.replicas.remove(b);
            out.extend(best_split(model, &d, a, gpus, score));
        }
    }
    // Splits of saturated replicas into two (halves, the larger first).
    for k in (0..n).filter(|&k| full(k)) {
        let g = dep.replicas[k].gpus();
        let (big, small) = (g - g / 2, g / 2);
        if small == 0 || model.splits(small).is_empty() {
            continue;
        }
        let mut d = dep.clone();
        d.replicas.insert(k + 1, dep.replicas[k]);
        out.extend(resize_pair(model, &d, (k, big), (k + 1, small), score));
    }
    // Swaps: one or two GPUs from an under-used replica to a saturated one.
    for to in (0..n).filter(|&k| full(k)) {
        for from in (0..n).filter(|&k| !full(k)) {
            for moved in 1..=2 {
                let (gf, gt) = (dep.replicas[from].gpus(), dep.replicas[to].gpus());
                if gf <= moved || gt + moved > MAX_REPLICA_GPUS {
                    continue;
                }
                out.extend(resize_pair(model, dep, (from, gf - moved), (to, gt + moved), score));
            }
        }
    }
    // Re-splits of one replica's GPUs.
    for k in 0..n {
        if let Some((d, s)) = best_split(model, dep, k, dep.replicas[k].gpus(), score) {
            if d != *dep {
                out.push((d, s));
            }
        }
    }
    out
}

/// `dep` with replica slots `a` and `b` resized to the given GPU counts,
/// each with its best split (`a` first); `None` when either fits no split.
fn resize_pair(
    model: &CostModel,
    dep: &Deployment,
    (a, ga): (usize, u32),
    (b, gb): (usize, u32),
    score: &dyn Fn(&Deployment) -> Scored,
) -> Option<(Deployment, Scored)> {
    let mut d = dep.clone();
    // `b` at any split of its new count while `a`'s is chosen.
    d.replicas[b] = *model.splits(gb).first()?;
    let (d1, _) = best_split(model, &d, a, ga, score)?;
    best_split(model, &d1, b, gb, score)
}

/// One step of a switch between deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Start a replica of this configuration on free GPUs.
    Start(Parallel),
    /// Drain a replica of this configuration (its requests finish, it takes
    /// no new ones) and free its GPUs.
    Drain(Parallel),
}

/// A switch from `current` to `target` on `gpus` GPUs (§5): starts replicas
/// while free GPUs allow (capacity only grows), else drains the replica
/// whose loss costs the forecast `need` least, but only while what stays
/// serves at least `min(Σ need, what current serves of it)`, so the switch
/// never drops below the capacity the forecast needs. `None` when no such
/// order exists: the caller keeps `current` until load or GPUs allow.
pub fn switch_plan(
    model: &CostModel,
    gpus: u32,
    current: &Deployment,
    target: &Deployment,
    types: &[(f64, f64)],
    need: &[f64],
) -> Option<Vec<Step>> {
    switch_plan_within(model, gpus, current, target, types, need, 0.0)
}

/// [`switch_plan`] allowing each intermediate deployment to serve down to
/// `1 − max_dip` of that floor: the paper's switches take a replica's GPUs
/// out of service for the transfer (§5.2, ~10 s), which from a full fleet
/// near its knee is the only way to reach a better deployment. The dip
/// lasts while a drained replica finishes its sequences and the started one
/// loads; `max_dip` 0 is [`switch_plan`].
pub fn switch_plan_within(
    model: &CostModel,
    gpus: u32,
    current: &Deployment,
    target: &Deployment,
    types: &[(f64, f64)],
    need: &[f64],
    max_dip: f64,
) -> Option<Vec<Step>> {
    let floor = need.iter().sum::<f64>().min(evaluate(model, current, types, need).served)
        * (1.0 - max_dip.clamp(0.0, 1.0))
        - 1e-6;
    let mut running = current.clone().canonical();
    let target = target.clone().canonical();
    let mut steps = Vec::new();
    // Each replica is started or drained at most once.
    for _ in 0..=current.replicas.len() + target.replicas.len() {
        if running == target {
            return Some(steps);
        }
        let (to_start, to_drain) = difference(&target.replicas, &running.replicas);
        let free = gpus.saturating_sub(running.gpus());
        if let Some(&p) = to_start.iter().filter(|p| p.gpus() <= free).max_by_key(|p| p.gpus()) {
            running.replicas.push(p);
            running = running.canonical();
            steps.push(Step::Start(p));
            continue;
        }
        let mut best: Option<(f64, Parallel)> = None;
        for &p in &to_drain {
            let mut d = running.clone();
            let at = d.replicas.iter().position(|&r| r == p)?;
            d.replicas.remove(at);
            let served = evaluate(model, &d, types, need).served;
            if served >= floor && best.is_none_or(|(s, _)| served > s) {
                best = Some((served, p));
            }
        }
        let (_, p) = best?;
        let at = running.replicas.iter().position(|&r| r == p)?;
        running.replicas.remove(at);
        steps.push(Step::Drain(p));
    }
    None
}

/// `(a − b, b − a)` as multisets.
fn difference(a: &[Parallel], b: &[Parallel]) -> (Vec<Parallel>, Vec<Parallel>) {
    let mut only_b = b.to_vec();
    let mut only_a = Vec::new();
    for p in a {
        match only_b.iter().position(|q| q == p) {
            Some(i) => {
                only_b.remove(i);
            }
            None => only_a.push(*p),
        }
    }
    (only_a, only_b)
}

/// Requests per second `dep` sustains in the proportions `shares` (the
/// largest `t` with every type's `t · share` served: the max concurrent
/// flow, by bisection on the lower level), so that capacities of
/// deployments compare on the same mix rather than on whichever type is
/// cheapest.
pub fn mix_capacity(model: &CostModel, dep: &Deployment, types: &[(f64, f64)], shares: &[f64]) -> f64 {
    let total: f64 = shares.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let rs = replicas(model, dep, types);
    let fits = |t: f64| {
        let lambda: Vec<f64> = shares.iter().map(|s| s / total * t).collect();
        assign(&lambda, &rs).served >= t * (1.0 - 1e-9)
    };
    // Upper bound: everything on the replicas' best type rates.
    let mut hi: f64 = rs.iter().map(|r| r.n.iter().copied().fold(0.0, f64::max)).sum();
    if hi <= 0.0 || !fits(1e-9) {
        return 0.0;
    }
    let mut lo = 0.0;
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}
