//! The volatility-keyed autoscaling controller (TurboServe §5.2.2): ρ_max
//! against the level's ρ̂ with hysteresis, Equation 5's scale-in test.

use super::{ChunkLatency, FleetConfig, Level};
use crate::autoscale::{ArrivalBins, Decision, Why};

/// Why the scaler changed the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleWhy {
    Hold,
    /// ρ_max above ρ̂ + δ.
    Out,
    /// ρ_max below ρ̂ − δ and Equation 5 prefers fewer engines.
    In,
    /// Brought into `[min_engines, max_engines]`.
    Bounds,
}

/// The scaler's answer at one event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleDecision {
    /// M: engines that should serve.
    pub engines: u32,
    pub why: ScaleWhy,
    pub volatility: f64,
    pub level: usize,
    /// ρ_max the decision was judged on, and the level's ρ̂.
    pub utilization: f64,
    pub target_utilization: f64,
    pub m_target: u32,
}

/// The volatility-keyed autoscaling controller's memory between events.
#[derive(Debug, Clone, Default)]
pub struct Scaler {
    bins: ArrivalBins,
    /// When the budget last changed (or the first decision).
    last_change: Option<f64>,
    /// Since when the scale-in condition (ρ_max below ρ̂ − δ, fewer
    /// engines wanted) has held without a break.
    quiet_since: Option<f64>,
}

/// What the placement reports to the scaler at one event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// ρ_max after placement.
    pub rho_max: f64,
    /// N_required: active sessions.
    pub required: u32,
    /// M: engines in the budget now (serving and starting).
    pub engines: u32,
    /// K of one engine.
    pub capacity: u32,
    /// Activations so far (a counter: arrivals and resumes).
    pub activations: u64,
}

impl Scaler {
    pub fn new() -> Self {
        Self::default()
    }

    /// σ(t) after recording the activations counter at `now`.
    pub fn observe(&mut self, now: f64, activations: u64, cfg: &FleetConfig) -> f64 {
        self.bins.observe(now, activations, cfg.volatility_bin_s, cfg.volatility_bins);
        cfg.volatility_measure.of(&self.bins.complete())
    }

    /// One decision (Algorithm 1, line 3). `bottleneck_at(m)` is L*(m):
    /// the placement's best bottleneck, milliseconds, on m engines (the
    /// scale-in test of Equation 5: c·M′ + λ·L*(M′) < c·M + λ·L*(M), and
    /// L*(M′) within `slo_ms`).
    pub fn decide(
        &mut self,
        now: f64,
        load: &Load,
        slo_ms: f64,
        bottleneck_at: impl Fn(u32) -> f64,
        cfg: &FleetConfig,
    ) -> ScaleDecision {
        let volatility = self.observe(now, load.activations, cfg);
        let table = cfg.table(load.engines);
        let level = table.iter().rposition(|l| volatility >= l.above).unwrap_or(0);
        let Level { target_utilization: rho_hat, lambda, .. } = table[level];
        let k = f64::from(load.capacity.max(1));
        let m_target = ((f64::from(load.required) / (k * rho_hat)).ceil() as u32)
            .clamp(cfg.min_engines, cfg.max_engines);
        let m = load.engines;
        let since_change = now - *self.last_change.get_or_insert(now);
        // The scale-in condition, and since when it has held unbroken.
        let quiet = load.rho_max < rho_hat - cfg.band && m_target < m;
        self.quiet_since = if quiet { Some(self.quiet_since.unwrap_or(now)) } else { None };
        let mut engines = m;
        let mut why = ScaleWhy::Hold;
        if !(cfg.min_engines..=cfg.max_engines).contains(&m) {
            engines = m.clamp(cfg.min_engines, cfg.max_engines);
            why = ScaleWhy::Bounds;
        } else if load.rho_max > rho_hat + cfg.band && m < cfg.max_engines {
            // At least one more: ρ_max may be high from imbalance alone.
            engines = m_target.max(m + 1).min(cfg.max_engines);
            why = ScaleWhy::Out;
        } else if quiet
            && since_change >= cfg.down_cooldown_s
            && now - self.quiet_since.unwrap_or(now) >= cfg.down_sustain_s
        {
            let (now_l, then_l) = (bottleneck_at(m), bottleneck_at(m_target));
            let objective = |engines: u32, l_ms: f64| f64::from(engines) + lambda * l_ms / 1e3;
            if then_l <= slo_ms && objective(m_target, then_l) < objective(m, now_l) {
                engines = m_target;
                why = ScaleWhy::In;
            }
        }
        if engines != m {
            self.last_change = Some(now);
            self.quiet_since = None;
        }
        ScaleDecision {
            engines,
            why,
            volatility,
            level,
            utilization: load.rho_max,
            target_utilization: rho_hat,
            m_target,
        }
    }
}

/// L*(m): the best bottleneck for `n` sessions on `m` engines of one kind
/// (greedy fill, optimal for a non-decreasing ℓ̂), milliseconds.
pub fn bottleneck_on(latency: ChunkLatency, m: u32, n: u32) -> f64 {
    if m == 0 {
        return if n == 0 { 0.0 } else { f64::INFINITY };
    }
    latency.ms(n.div_ceil(m))
}

/// One decision for an engine class that serves both text and video (the
/// rule of Kubernetes' HPA over several metrics): each controller sizes the
/// class for its own demand, and the class serves the larger answer. Either
/// scales out alone; the class scales in only as far as both allow, so the
/// two never undo each other's step. The warm pool is the text controller's
/// (TurboServe keeps none for video). `None` when neither controller runs.
pub fn joint(text: Option<Decision>, video: Option<ScaleDecision>) -> Option<Decision> {
    let video = video.map(|v| Decision {
        serving: v.engines,
        warm: 0,
        why: match v.why {
            ScaleWhy::Hold => Why::Hold,
            ScaleWhy::Out => Why::VideoUtilization,
            ScaleWhy::In => Why::VideoQuiet,
            ScaleWhy::Bounds => Why::Bounds,
        },
        utilization: v.utilization,
        target_utilization: v.target_utilization,
        m_target: v.m_target,
        level: v.level,
        volatility: v.volatility,
        burst_factor: 1.0,
    });
    match (text, video) {
        (Some(t), Some(v)) if v.serving > t.serving => Some(Decision { warm: t.warm, ..v }),
        // Equal answers: the text controller's reason, unless it holds.
        (Some(t), Some(v)) if v.serving == t.serving && t.why == Why::Hold => {
            Some(Decision { warm: t.warm, ..v })
        }
        (Some(t), _) => Some(t),
        (None, v) => v,
    }
}
