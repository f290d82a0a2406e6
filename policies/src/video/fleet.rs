//! Video fleet control (TurboServe §5.2): where each active session runs and
//! how many engines serve.
//!
//! - **Placement controller** (§5.2.1), event-driven: a session that needs
//!   a place (a new one, one re-activated after a pause, one on an engine
//!   being drained) goes to the engine that minimises the resulting
//!   bottleneck per-chunk latency ℓ̂_j(n_j + 1) ([`assign`]); then
//!   migration-aware min-max rebalancing ([`rebalance`]) moves sessions off
//!   the bottleneck engine while the gain Γ = L − L′ − η·κ_i is positive,
//!   κ_i being the α-β transfer time of the session's state
//!   ([`TransferModel`]).
//! - **Autoscaling controller** (§5.2.2, Appendix A): [`Scaler`] keys the
//!   target utilisation ρ̂ and the latency weight λ on the volatility of
//!   session activations (the standard deviation of activations per bin
//!   over a sliding window, in units of Poisson noise, mapped to a row of
//!   the `levels` table profiled nearest the fleet's size), scales out when ρ_max = max_j n_j/K_j exceeds ρ̂ + δ and in
//!   below ρ̂ − δ, to M_target = ⌈N_required / (K·ρ̂)⌉. The caller keeps
//!   Algorithm 1's order: scale-out, then rebalance onto the new engines;
//!   rebalance off the leaving engines, then scale-in.
//!
//! Everything here is pure: loads and sessions in, decisions out; time is a
//! parameter. The gateway's video control tick and `loadtest sim-video`
//! run the same code.
//!
//! ℓ̂_j(n) is the engine's coalesced batch time of n chunks at the
//! profile's highest-fidelity point, `chunk_ms · (1 + batch_cost · (n − 1))`
//! (0 for an idle engine): what the placement protects is the latency of
//! full-quality chunks; BMPR's faster configurations are the stream's own
//! recovery on top.

use serde::Deserialize;

use super::fidelity::VideoProfile;
use crate::autoscale::VolatilityMeasure;

mod scaler;

pub use scaler::{bottleneck_on, joint, Load, ScaleDecision, ScaleWhy, Scaler};

/// ℓ̂(n): one engine's per-chunk latency with n active sessions coalesced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkLatency {
    pub chunk_ms: f64,
    pub batch_cost: f64,
}

impl ChunkLatency {
    /// At the profile's highest-fidelity point.
    pub fn of(profile: &VideoProfile) -> Self {
        Self { chunk_ms: profile.best().chunk_ms, batch_cost: profile.batch_cost }
    }

    /// ℓ̂(n) in milliseconds; 0 for no session.
    pub fn ms(&self, n: u32) -> f64 {
        if n == 0 {
            0.0
        } else {
            self.chunk_ms * (1.0 + self.batch_cost * f64::from(n - 1))
        }
    }

    /// K: the most sessions whose coalesced chunk still meets `slo_ms`
    /// (at least 1: an engine always takes one session).
    pub fn capacity(&self, slo_ms: f64) -> u32 {
        if self.batch_cost <= 0.0 {
            return if self.chunk_ms <= slo_ms { 1024 } else { 1 };
        }
        let k = ((slo_ms / self.chunk_ms - 1.0) / self.batch_cost).floor() + 1.0;
        if k.is_finite() {
            k.clamp(1.0, 1024.0) as u32
        } else {
            1
        }
    }
}

/// The α-β model of moving a session's state between engines: a fixed
/// start-up cost plus bytes over bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferModel {
    pub alpha_ms: f64,
    pub mib_per_s: f64,
}

impl TransferModel {
    /// κ: milliseconds to move `bytes`.
    pub fn ms(&self, bytes: u64) -> f64 {
        self.alpha_ms + bytes as f64 / (1024.0 * 1024.0) / self.mib_per_s.max(1e-9) * 1e3
    }
}

/// One engine as the placement sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub latency: ChunkLatency,
    /// K_j: sessions it may host within the chunk latency target.
    pub capacity: u32,
    /// Takes sessions. An engine being drained for scale-in is not open:
    /// its sessions must move and nothing moves onto it.
    pub open: bool,
}

/// One active session: where it runs, its state's size (κ), and whether it
/// may move now (not in a move's cooldown, no move in flight).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Active {
    pub id: u64,
    pub gpu: usize,
    pub state_bytes: u64,
    pub movable: bool,
}

/// One planned move.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Move {
    pub session: u64,
    pub from: usize,
    pub to: usize,
    /// κ of the move, milliseconds.
    pub cost_ms: f64,
}

/// Knobs of the placement controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlaceParams {
    /// η: milliseconds of bottleneck latency a millisecond of transfer is
    /// worth.
    pub eta: f64,
    pub transfer: TransferModel,
    /// Most moves in one rebalancing (a bound on transfer bursts).
    pub max_moves: usize,
}

/// L: the bottleneck per-chunk latency of `load` (active sessions per
/// engine), milliseconds.
pub fn bottleneck_ms(gpus: &[Gpu], load: &[u32]) -> f64 {
    gpus.iter().zip(load).map(|(g, &n)| g.latency.ms(n)).fold(0.0, f64::max)
}

/// ρ_max = max_j n_j / K_j over the open engines (0 with none).
pub fn rho_max(gpus: &[Gpu], load: &[u32]) -> f64 {
    gpus.iter()
        .zip(load)
        .filter(|(g, _)| g.open)
        .map(|(g, &n)| f64::from(n) / f64::from(g.capacity.max(1)))
        .fold(0.0, f64::max)
}

/// Session assignment: the open engine minimising the resulting bottleneck
/// max(L, ℓ̂_j(n_j + 1)) among those with room (n_j < K_j); ties go to the
/// less loaded (n_j / K_j), then the lower index. With no room anywhere,
/// the open engine with the lowest ℓ̂_j(n_j + 1) (the session must run;
/// the autoscaler sees the overload). `None` with no open engine.
pub fn assign(gpus: &[Gpu], load: &[u32]) -> Option<usize> {
    let l = bottleneck_ms(gpus, load);
    let key = |j: usize| {
        let after = gpus[j].latency.ms(load[j] + 1);
        (after.max(l), f64::from(load[j]) / f64::from(gpus[j].capacity.max(1)), after)
    };
    let best = |room: bool| {
        (0..gpus.len()).filter(|&j| gpus[j].open && (!room || load[j] < gpus[j].capacity)).min_by(|&a, &b| {
            let (ka, kb) = (key(a), key(b));
            ka.0.total_cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(a.cmp(&b))
        })
    };
    best(true).or_else(|| {
        (0..gpus.len())
            .filter(|&j| gpus[j].open)
            .min_by(|&a, &b| key(a).2.total_cmp(&key(b).2).then(a.cmp(&b)))
    })
}

/// The outcome of one rebalancing.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub moves: Vec<Move>,
    /// The bottleneck before and after, milliseconds.
    pub before_ms: f64,
    pub after_ms: f64,
    /// Active sessions per engine after the moves.
    pub load: Vec<u32>,
}

/// Migration-aware min-max rebalancing over the active sessions.
///
/// First, sessions on engines that are not open move (consolidation before
/// scale-in), each by [`assign`], whatever the gain. Then the local search
/// of §5.2.1: take the engines at the bottleneck L; from each, the movable
/// session with the smallest transfer cost κ; for each, the target with
/// the lowest ℓ̂_j(n_j + 1) that has room; Γ = L − L′ − η·Σκ; apply when
/// Γ > 0 and repeat. When several engines tie at L, moving one session off
/// only one of them cannot lower L, so one step moves one session off each
/// (a compound move with the summed κ): the local optimum then has the
/// optimal bottleneck whenever η = 0 (see the oracle test). Every applied
/// step lowers L strictly, so the search ends; at most
/// `params.max_moves` moves.
pub fn rebalance(gpus: &[Gpu], sessions: &[Active], params: &PlaceParams) -> Plan {
    let mut load = vec![0u32; gpus.len()];
    let mut on: Vec<Vec<(f64, u64, bool)>> = vec![Vec::new(); gpus.len()];
    for s in sessions.iter().filter(|s| s.gpu < gpus.len()) {
        load[s.gpu] += 1;
        on[s.gpu].push((params.transfer.ms(s.state_bytes), s.id, s.movable));
    }
    let before_ms = bottleneck_ms(gpus, &load);
    let mut moves = Vec::new();
    // Evacuate closed engines.
    for from in 0..gpus.len() {
        if gpus[from].open {
            continue;
        }
        for (cost_ms, id, _) in std::mem::take(&mut on[from]) {
            load[from] -= 1;
            let Some(to) = assign(gpus, &load) else {
                load[from] += 1;
                on[from].push((cost_ms, id, false));
                continue;
            };
            load[to] += 1;
            on[to].push((cost_ms, id, false));
            moves.push(Move { session: id, from, to, cost_ms });
        }
    }
    // Cheapest movable session first on every engine.
    for list in &mut on {
        list.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.total_cmp(&b.0)).then(a.1.cmp(&b.1)));
    }
    while moves.len() < params.max_moves {
        let l = bottleneck_ms(gpus, &load);
        if l <= 0.0 {
            break;
        }
        let tied: Vec<usize> =
            (0..gpus.len()).filter(|&j| load[j] > 0 && gpus[j].latency.ms(load[j]) >= l - 1e-9).collect();
        if tied.len() + moves.len() > params.max_moves {
            break;
        }
        let mut trial = load.clone();
        let mut step = Vec::new();
        for &from in &tied {
            let Some(&(cost_ms, id, true)) = on[from].first() else { break };
            let to = (0..gpus.len())
                .filter(|&j| gpus[j].open && !tied.contains(&j) && trial[j] < gpus[j].capacity)
                .min_by(|&a, &b| {
                    gpus[a]
                        .latency
                        .ms(trial[a] + 1)
                        .total_cmp(&gpus[b].latency.ms(trial[b] + 1))
                        .then(a.cmp(&b))
                });
            let Some(to) = to else { break };
            trial[from] -= 1;
            trial[to] += 1;
            step.push(Move { session: id, from, to, cost_ms });
        }
        if step.len() < tied.len() {
            break; // some bottleneck engine cannot shed a session
        }
        let gain = l - bottleneck_ms(gpus, &trial) - params.eta * step.iter().map(|m| m.cost_ms).sum::<f64>();
        if gain <= 0.0 {
            break;
        }
        for m in &step {
            let entry = on[m.from].remove(0);
            // A session that moved stays put for the rest of this plan.
            on[m.to].push((entry.0, entry.1, false));
        }
        load = trial;
        moves.extend(step);
    }
    Plan { after_ms: bottleneck_ms(gpus, &load), before_ms, moves, load }
}

/// Composes SlackServe's URGENT re-homing with a min-max plan (one
/// placement layer): `rehome` moves (engine index pairs into `gpus`, in the
/// planner's order) are kept only if each leaves the bottleneck the plan
/// reached no higher, each kept move updating the loads the next one is
/// judged on. Returns which were kept.
pub fn admit_rehoming(gpus: &[Gpu], plan: &Plan, rehome: &[(usize, usize)]) -> Vec<bool> {
    let mut load = plan.load.clone();
    rehome
        .iter()
        .map(|&(from, to)| {
            let ok = from < gpus.len()
                && to < gpus.len()
                && from != to
                && gpus[to].open
                && gpus[to].latency.ms(load[to] + 1) <= plan.after_ms;
            if ok {
                load[to] += 1;
                load[from] = load[from].saturating_sub(1);
            }
            ok
        })
        .collect()
}

/// The optimal bottleneck for `n` sessions on `gpus` (open ones), by
/// exhaustive search over every placement's per-engine counts (sessions are
/// interchangeable for L): the oracle of TurboServe §7.4. Exponential; for
/// small clusters. Capacities are ignored (as placement ignores them when
/// nothing has room).
pub fn oracle_ms(gpus: &[Gpu], n: u32) -> f64 {
    fn go(gpus: &[Gpu], left: u32, worst: f64, best: &mut f64) {
        if worst >= *best {
            return;
        }
        match gpus.split_first() {
            None => {
                if left == 0 {
                    *best = worst;
                }
            }
            Some((g, rest)) if !g.open => go(rest, left, worst, best),
            Some((g, rest)) => {
                let take = if rest.iter().any(|g| g.open) { 0..=left } else { left..=left };
                for k in take {
                    go(rest, left - k, worst.max(g.latency.ms(k)), best);
                }
            }
        }
    }
    let mut best = f64::INFINITY;
    go(gpus, n, 0.0, &mut best);
    best
}

/// One row of the volatility table (TurboServe Table 6).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Level {
    /// The row applies when σ (`volatility_measure` of activations per bin) is at least this
    /// (rows in increasing order; the first row's is 0).
    pub above: f64,
    /// ρ̂: the target of ρ_max.
    pub target_utilization: f64,
    /// λ: GPUs one second of bottleneck latency is worth (Equation 5); a
    /// scale-in must lower c·M + λ·L*.
    pub lambda: f64,
    /// The fleet size this row was profiled at (0: any size). Rows of one
    /// size form one table; the scaler reads the table profiled nearest
    /// (in ratio) to the engines it has ([`FleetConfig::table`]).
    #[serde(default)]
    pub engines: u32,
}

/// `[video.fleet]`: placement and autoscaling of video sessions.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// "min_max" (TurboServe's controller, the product) or "fewest"
    /// (fewest streams at creation, never rebalanced: the baseline).
    pub placement: PlacementMode,
    /// η of the gain Γ = L − L′ − η·κ.
    pub eta: f64,
    /// α of the transfer model, milliseconds.
    pub transfer_alpha_ms: f64,
    /// β⁻¹ of the transfer model: engine-to-engine throughput, MiB/s.
    pub transfer_mib_per_s: f64,
    /// L_SLO: per-chunk latency target, milliseconds; K_j = the most
    /// sessions whose coalesced chunk meets it. 0: the chunk's duration.
    pub chunk_slo_ms: f64,
    /// Most moves one rebalancing plans.
    pub max_moves: u32,
    /// Video autoscaling: the gateway's primary engine class and the
    /// simulator (docs/operations.md "Autoscaling", "Video streams").
    pub autoscale: bool,
    pub min_engines: u32,
    pub max_engines: u32,
    /// δ: hysteresis band around ρ̂.
    pub band: f64,
    /// No scale-in within this long of the last change of the budget (or
    /// of the first decision): a fleet that just grew, or just started,
    /// does not shrink on the first quiet event.
    pub down_cooldown_s: f64,
    /// ... and only once the scale-in condition has held this long without
    /// a break: a momentary dip in active streams (a few ending together)
    /// does not collapse the fleet to M_target of that instant.
    pub down_sustain_s: f64,
    pub volatility_bin_s: f64,
    /// W: complete bins in the volatility window.
    pub volatility_bins: usize,
    /// σ: std / √mean of the bins ("dispersion", the product) or their
    /// plain std ("std", TurboServe's; its table holds at one fleet size).
    pub volatility_measure: VolatilityMeasure,
    pub levels: Vec<Level>,
}

/// How video sessions are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementMode {
    MinMax,
    Fewest,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            placement: PlacementMode::MinMax,
            eta: 0.05,
            transfer_alpha_ms: 2.0,
            transfer_mib_per_s: 400.0,
            chunk_slo_ms: 0.0,
            max_moves: 16,
            autoscale: false,
            min_engines: 1,
            max_engines: 256,
            band: 0.1,
            down_cooldown_s: 30.0,
            down_sustain_s: 10.0,
            volatility_bin_s: 5.0,
            volatility_bins: 12,
            volatility_measure: VolatilityMeasure::Dispersion,
            levels: default_levels(),
        }
    }
}

/// The shipped tables, one per fleet size profiled: `loadtest sim-video
/// --experiment levels --levels 10 --engines N --seeds 3` for N = 8, 64
/// and 256, levels of equal ρ̂ merged (docs/benchmarks/video.md, "Video fleet
/// control").
fn default_levels() -> Vec<Level> {
    [
        (8, 0.0, 0.7),
        (8, 1.31, 0.45),
        (64, 0.0, 0.85),
        (64, 1.32, 0.8),
        (64, 1.49, 0.75),
        (64, 1.84, 0.7),
        (64, 2.34, 0.45),
        (256, 0.0, 0.85),
        (256, 1.54, 0.75),
        (256, 3.86, 0.7),
    ]
    .into_iter()
    .map(|(engines, above, target_utilization)| Level { above, target_utilization, lambda: 0.2, engines })
    .collect()
}

impl FleetConfig {
    /// Range checks, naming the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=100.0).contains(&self.eta) {
            return Err(("video.fleet.eta", "must be in [0, 100]".into()));
        }
        if !(0.0..=10_000.0).contains(&self.transfer_alpha_ms) {
            return Err(("video.fleet.transfer_alpha_ms", "must be in [0, 10000]".into()));
        }
        if !(self.transfer_mib_per_s > 0.0 && self.transfer_mib_per_s <= 1e7) {
            return Err(("video.fleet.transfer_mib_per_s", "must be in (0, 1e7]".into()));
        }
        if !(0.0..=600_000.0).contains(&self.chunk_slo_ms) {
            return Err(("video.fleet.chunk_slo_ms", "must be in [0, 600000]".into()));
        }
        if self.max_moves > 4096 {
            return Err(("video.fleet.max_moves", "must be at most 4096".into()));
        }
        if self.min_engines == 0 || self.min_engines > self.max_engines || self.max_engines > 4096 {
            return Err(("video.fleet.min_engines", "need 1 <= min_engines <= max_engines <= 4096".into()));
        }
        if !(0.0..0.5).contains(&self.band) {
            return Err(("video.fleet.band", "must be in [0, 0.5)".into()));
        }
        if !(0.0..=86_400.0).contains(&self.down_cooldown_s) {
            return Err(("video.fleet.down_cooldown_s", "must be in [0, 86400]".into()));
        }
        if !(0.0..=86_400.0).contains(&self.down_sustain_s) {
            return Err(("video.fleet.down_sustain_s", "must be in [0, 86400]".into()));
        }
        if !(self.volatility_bin_s > 0.0 && self.volatility_bin_s <= 3600.0) {
            return Err(("video.fleet.volatility_bin_s", "must be in (0, 3600]".into()));
        }
        if !(2..=1000).contains(&self.volatility_bins) {
            return Err(("video.fleet.volatility_bins", "must be in [2, 1000]".into()));
        }
        if self.levels.is_empty() {
            return Err(("video.fleet.levels", "need at least one row, the first with above = 0".into()));
        }
        for w in self.levels.windows(2) {
            if w[1].engines < w[0].engines {
                return Err(("video.fleet.levels", "tables in increasing order of `engines`".into()));
            }
        }
        for table in self.levels.chunk_by(|a, b| a.engines == b.engines) {
            if table[0].above != 0.0 {
                return Err(("video.fleet.levels", "each table's first row has above = 0".into()));
            }
            if table.windows(2).any(|w| w[1].above <= w[0].above) {
                return Err(("video.fleet.levels", "`above` must increase row by row".into()));
            }
        }
        for l in &self.levels {
            let rho_ok = l.target_utilization > 0.0 && l.target_utilization <= 1.0;
            if !(rho_ok && (0.0..=1e6).contains(&l.lambda)) {
                return Err((
                    "video.fleet.levels",
                    "target_utilization in (0, 1], lambda in [0, 1e6]".into(),
                ));
            }
        }
        Ok(())
    }

    /// The volatility table for a fleet of `engines`: the rows profiled at
    /// the size nearest to it in ratio (between 64 and 256, 128 is the
    /// turn); rows with `engines = 0` serve any size. Validated tables are
    /// never empty.
    pub fn table(&self, engines: u32) -> &[Level] {
        let distance = |profiled: u32| {
            if profiled == 0 {
                0.0
            } else {
                (f64::from(engines.max(1)) / f64::from(profiled)).ln().abs()
            }
        };
        self.levels
            .chunk_by(|a, b| a.engines == b.engines)
            .min_by(|a, b| distance(a[0].engines).total_cmp(&distance(b[0].engines)))
            .unwrap_or(&self.levels)
    }

    pub fn params(&self) -> PlaceParams {
        PlaceParams {
            eta: self.eta,
            transfer: TransferModel { alpha_ms: self.transfer_alpha_ms, mib_per_s: self.transfer_mib_per_s },
            max_moves: self.max_moves as usize,
        }
    }

    /// L_SLO for chunks of `chunk_s` seconds.
    pub fn slo_ms(&self, chunk_s: f64) -> f64 {
        if self.chunk_slo_ms > 0.0 {
            self.chunk_slo_ms
        } else {
            chunk_s * 1e3
        }
    }
}

#[cfg(test)]
mod tests;
