//! Autoscaling and warm pools: how many engines should serve, and how many
//! should stand ready beside them.
//!
//! A pure state machine ticked with the fleet's own measurements
//! ([`Signals`]) and `now`; the live supervisor and the simulator run the
//! same one and carry out its [`Decision`].
//!
//! - **Load signal** ρ = N_req / (M · K): sequences running plus waiting at
//!   the gate over the slots of the budget M already decided (serving
//!   engines, or more while started ones are still cold: tokens in flight
//!   as pressure, in units of decode slots).
//! - **Target tracking with hysteresis** (TurboServe §5.2.2): scale out when
//!   ρ > ρ̂ + δ, in when ρ < ρ̂ − δ; the target is
//!   M_target = ⌈N_req / (K · ρ̂)⌉, bounded by `[min_engines, max_engines]`.
//! - **Queue latency** (Vennamaneni §4.4): scale out when the p95 of the
//!   *observed* waits at the gate over the TTFT budget, over the last
//!   `queue_window_s` (30 s: the paper's long continuous window), exceeds
//!   θ for `up_sustain_s`, even if ρ looks fine (at least one engine more).
//!   Admission's predicted waits never enter it: predictions ran at 0.3-0.6
//!   of observed TTFT, and a fleet must not scale on a forecast alone.
//! - **Conservative scale-in:** only after `down_windows` consecutive windows
//!   of `down_window_s` in which ρ stayed below ρ̂ − δ, queue latency below
//!   θ/2 (the wait alone, not prefill); at most `max_step_in` of the serving
//!   engines at a time (at least one);
//!   engines leave by draining at token boundaries (the caller's job).
//! - **Dwell:** no scale-out within `up_cooldown_s` of a change, no scale-in
//!   within `down_cooldown_s`: a noisy signal never flaps the fleet.
//! - **Volatility levels** (TurboServe Appendix A): σ of arrivals per
//!   `volatility_bin_s` bin over the last `volatility_bins` bins
//!   (`volatility_measure`: std / √mean by default, 1 for Poisson arrivals
//!   at any rate, as the video scaler's), picks a row of the `levels` table: calmer
//!   traffic packs denser (higher ρ̂), bursty traffic keeps headroom.
//! - **Warm pool** (Vennamaneni §4.4): N_warm = ⌈λ_burst · T_cold · margin⌉
//!   ready engines beyond the serving ones, where T_cold is the measured
//!   cold start (the prior until one was measured) and λ_burst the rate at
//!   which the burst adds engine demand,
//!   (burst_factor − 1) · M_target / `burst_ramp_s` engines per second
//!   (T_cold capped at the ramp: a pool never exceeds the whole burst).
//!   The burst factor is *observed* ([`BurstHistory`]): the largest rise of
//!   the arrival rate from one T_cold-long window to the next over the
//!   last `burst_horizon_s`, with Poisson noise discounted (three standard
//!   deviations off the peak, onto the base), so steady traffic at any
//!   rate keeps no pool; the volatility level's `burst_factor` is the prior
//!   until the horizon holds two such windows.
//! - **Token pressure:** ρ is the larger of slot occupancy and tokens in
//!   flight over the serving engines' KV capacity in tokens (long contexts
//!   fill KV before they fill slots); M_target likewise.

use serde::Deserialize;

mod arrivals;

pub use arrivals::{ArrivalBins, BurstHistory, VolatilityMeasure};

/// One row of the volatility table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolatilityLevel {
    /// The row applies when volatility σ (`volatility_measure` of arrivals
    /// per bin) is at least this (rows in increasing order; the first
    /// row's is 0).
    pub above: f64,
    /// ρ̂: the serving engines' target slot occupancy.
    pub target_utilization: f64,
    /// Expected burst at this volatility: demand multiplies by this.
    pub burst_factor: f64,
}

/// `[autoscale] burst_source`: what the warm pool expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BurstSource {
    /// The largest rise seen over the horizon ([`BurstHistory`]); the
    /// level's `burst_factor` until there is history.
    Observed,
    /// The volatility level's `burst_factor`, always (a burst known ahead,
    /// as an offline-sized pool).
    Levels,
}

/// `[autoscale]` in the policy document.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// Off: the fleet keeps the engines it was started with (restarts of
    /// engines that exit still happen).
    pub enabled: bool,
    pub min_engines: u32,
    pub max_engines: u32,
    /// δ: the hysteresis band around ρ̂.
    pub band: f64,
    /// θ: queue latency p95 over D_TTFT that triggers scale-out.
    pub queue_theta: f64,
    /// The window the queue signal's p95 is taken over, seconds: observed
    /// waits at the gate of the requests admitted in it (Vennamaneni's
    /// "long continuous window").
    pub queue_window_s: f64,
    /// A scale-out trigger must hold this long.
    pub up_sustain_s: f64,
    /// Scale-in needs this many consecutive quiet windows ...
    pub down_windows: u32,
    /// ... of this length.
    pub down_window_s: f64,
    pub up_cooldown_s: f64,
    pub down_cooldown_s: f64,
    /// Share of the serving engines one scale-in may remove (at least one).
    pub max_step_in: f64,
    pub volatility_bin_s: f64,
    pub volatility_bins: usize,
    /// σ of the bins: std / √mean ("dispersion": 1 for Poisson arrivals at
    /// any rate) or the plain std; the same measure as `[video.fleet]`.
    pub volatility_measure: VolatilityMeasure,
    pub levels: Vec<VolatilityLevel>,
    /// Keep a warm pool.
    pub warm_pool: bool,
    /// Safety margin on the warm pool.
    pub warm_margin: f64,
    /// The burst ramp the warm pool is sized for, seconds.
    pub burst_ramp_s: f64,
    /// How far back the observed burst factor looks, seconds.
    pub burst_horizon_s: f64,
    /// Where the warm pool's burst factor comes from.
    pub burst_source: BurstSource,
    /// Cold start assumed until one is measured, seconds.
    pub cold_start_prior_s: f64,
    /// Restarts of an engine that exited: first delay, doubling to the max.
    pub restart_backoff_s: f64,
    pub restart_backoff_max_s: f64,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            min_engines: 1,
            max_engines: 8,
            band: 0.1,
            queue_theta: 0.5,
            queue_window_s: 30.0,
            up_sustain_s: 2.0,
            down_windows: 3,
            down_window_s: 10.0,
            up_cooldown_s: 5.0,
            down_cooldown_s: 30.0,
            max_step_in: 0.25,
            volatility_bin_s: 5.0,
            volatility_bins: 12,
            volatility_measure: VolatilityMeasure::Dispersion,
            levels: default_levels(),
            warm_pool: true,
            warm_margin: 1.25,
            burst_ramp_s: 30.0,
            burst_horizon_s: 600.0,
            burst_source: BurstSource::Observed,
            cold_start_prior_s: 10.0,
            restart_backoff_s: 1.0,
            restart_backoff_max_s: 30.0,
        }
    }
}

/// The shipped table, σ in units of Poisson noise (dispersion), profiled
/// by replay: `scripts/sim-text-levels` (four traces around 15 req/s whose
/// rate swings 1x, 1.5x, 2x, 3x; per trace the cheapest target within half
/// a point of its best share within SLO and 25% of its lowest TTFT p99,
/// made monotone; docs/benchmarks/fleet.md "Text volatility levels").
fn default_levels() -> Vec<VolatilityLevel> {
    [(0.0, 0.9, 1.2), (2.2, 0.8, 1.5), (4.9, 0.8, 2.0), (7.7, 0.7, 3.0)]
        .into_iter()
        .map(|(above, target_utilization, burst_factor)| VolatilityLevel {
            above,
            target_utilization,
            burst_factor,
        })
        .collect()
}

impl AutoscaleConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.min_engines > self.max_engines || self.max_engines == 0 {
            return Err((
                "autoscale.max_engines",
                "need 1 <= max_engines and min_engines <= max_engines".into(),
            ));
        }
        if !(self.band.is_finite() && (0.0..0.5).contains(&self.band)) {
            return Err(("autoscale.band", "must be in [0, 0.5)".into()));
        }
        if !(self.queue_theta.is_finite() && self.queue_theta > 0.0) {
            return Err(("autoscale.queue_theta", "must be > 0".into()));
        }
        let times = [
            ("autoscale.queue_window_s", self.queue_window_s),
            ("autoscale.up_sustain_s", self.up_sustain_s),
            ("autoscale.down_window_s", self.down_window_s),
            ("autoscale.up_cooldown_s", self.up_cooldown_s),
            ("autoscale.down_cooldown_s", self.down_cooldown_s),
            ("autoscale.volatility_bin_s", self.volatility_bin_s),
            ("autoscale.burst_ramp_s", self.burst_ramp_s),
            ("autoscale.burst_horizon_s", self.burst_horizon_s),
            ("autoscale.cold_start_prior_s", self.cold_start_prior_s),
            ("autoscale.restart_backoff_s", self.restart_backoff_s),
            ("autoscale.restart_backoff_max_s", self.restart_backoff_max_s),
        ];
        for (key, v) in times {
            if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
                return Err((key, "must be a duration in [0, 86400] seconds".into()));
            }
        }
        if self.queue_window_s < 1.0 {
            return Err(("autoscale.queue_window_s", "must be >= 1 s".into()));
        }
        if self.volatility_bin_s <= 0.0 || self.down_window_s <= 0.0 || self.burst_ramp_s <= 0.0 {
            return Err(("autoscale.down_window_s", "windows, bins and the ramp must be > 0 s".into()));
        }
        if self.down_windows == 0 || self.volatility_bins < 2 {
            return Err(("autoscale.down_windows", "need down_windows >= 1 and volatility_bins >= 2".into()));
        }
        if !(self.max_step_in > 0.0 && self.max_step_in <= 1.0) {
            return Err(("autoscale.max_step_in", "must be in (0, 1]".into()));
        }
        if !(self.warm_margin.is_finite() && self.warm_margin >= 1.0) {
            return Err(("autoscale.warm_margin", "must be >= 1".into()));
        }
        if self.levels.is_empty() || self.levels[0].above != 0.0 {
            return Err(("autoscale.levels", "need at least one level, the first with above = 0".into()));
        }
        for w in self.levels.windows(2) {
            if w[1].above <= w[0].above {
                return Err(("autoscale.levels", "levels must be in increasing order of `above`".into()));
            }
        }
        for l in &self.levels {
            if !(l.target_utilization > 0.0 && l.target_utilization <= 1.0)
                || l.target_utilization <= self.band
            {
                return Err(("autoscale.levels", "target_utilization must be in (band, 1]".into()));
            }
            if !(l.burst_factor.is_finite() && l.burst_factor >= 1.0) {
                return Err(("autoscale.levels", "burst_factor must be >= 1".into()));
            }
        }
        Ok(())
    }
}

/// What the fleet measured, at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// Engines serving (ready and routed to).
    pub serving: u32,
    /// K: decode slots per engine.
    pub slots_per_engine: u32,
    /// N_req: sequences running plus waiting at the gate.
    pub demand: f64,
    /// Observed gate-wait p95 over the TTFT budget over the queue window,
    /// when there are enough samples.
    pub queue_ratio_p95: Option<f64>,
    pub brownout_level: usize,
    /// Requests arrived so far (a counter; the volatility reads its steps).
    pub arrivals: u64,
    /// The measured cold start, seconds, when one was measured.
    pub cold_start_s: Option<f64>,
    /// Tokens in flight on the serving engines (prompt plus output budget
    /// of what runs or prefills there), and one engine's KV capacity in
    /// tokens (0: unknown, token pressure off).
    pub tokens_in_flight: f64,
    pub kv_tokens_per_engine: f64,
}

/// Why the target changed (or did not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No change.
    Hold,
    /// ρ above ρ̂ + δ for long enough.
    Utilization,
    /// Queue latency p95 above θ · D_TTFT for long enough.
    QueueLatency,
    /// Quiet for every scale-in window.
    Quiet,
    /// Brought into `[min_engines, max_engines]` (start, or a reload).
    Bounds,
    /// The video controller's ρ_max above its ρ̂ + δ (the class serves
    /// both; see [`crate::video::fleet::joint`]).
    VideoUtilization,
    /// The video controller's scale-in (ρ_max below ρ̂ − δ, Equation 5).
    VideoQuiet,
}

impl Why {
    pub fn label(self) -> &'static str {
        match self {
            Why::Hold => "hold",
            Why::Utilization => "utilization",
            Why::QueueLatency => "queue_latency",
            Why::Quiet => "quiet",
            Why::Bounds => "bounds",
            Why::VideoUtilization => "video_utilization",
            Why::VideoQuiet => "video_quiet",
        }
    }
}

/// The autoscaler's answer at one tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Engines that should serve.
    pub serving: u32,
    /// Ready engines to keep beside them, not routed to.
    pub warm: u32,
    pub why: Why,
    /// ρ and the ρ̂ and M_target it was judged against.
    pub utilization: f64,
    pub target_utilization: f64,
    pub m_target: u32,
    /// The volatility level in force (index into `levels`), and σ that
    /// picked it (`volatility_measure` of the arrival bins).
    pub level: usize,
    pub volatility: f64,
    /// The burst factor the warm pool was sized for: observed, or the
    /// level's prior while too little history is kept.
    pub burst_factor: f64,
}

/// What one tick reads from the signals (see [`Autoscaler::tick`]).
#[derive(Debug, Clone, Copy)]
struct Pressure {
    /// ρ: the higher of slot and KV-token utilisation under the budget.
    rho: f64,
    /// ρ̂ of the volatility level.
    rho_hat: f64,
    /// Engines for the demand at ρ̂, within the bounds.
    m_target: u32,
}

/// The autoscaler's memory between ticks.
#[derive(Debug, Clone, Default)]
pub struct Autoscaler {
    target: Option<u32>,
    /// Since when a scale-out trigger holds, and which.
    out_since: Option<(f64, Why)>,
    /// The current quiet window's start, and quiet windows completed.
    window_start: Option<f64>,
    window_quiet: bool,
    quiet_windows: u32,
    /// When the target last changed (adopting the fleet is not a change).
    last_change: Option<f64>,
    bins: ArrivalBins,
    burst: BurstHistory,
}

impl Autoscaler {
    pub fn new() -> Self {
        Self::default()
    }

    /// The current serving target (None before the first tick).
    pub fn target(&self) -> Option<u32> {
        self.target
    }

    /// Volatility σ: `cfg.volatility_measure` of the arrivals per bin over
    /// the full bins kept (the video scaler's measure).
    fn volatility(&mut self, now: f64, arrivals: u64, cfg: &AutoscaleConfig) -> f64 {
        self.bins.observe(now, arrivals, cfg.volatility_bin_s, cfg.volatility_bins);
        cfg.volatility_measure.of(&self.bins.complete())
    }

    /// One tick at `now` (seconds).
    pub fn tick(&mut self, now: f64, s: &Signals, cfg: &AutoscaleConfig) -> Decision {
        let vol = self.volatility(now, s.arrivals, cfg);
        let level = cfg.levels.iter().rposition(|l| vol >= l.above).unwrap_or(0);
        let p = self.pressure(s, cfg.levels[level].target_utilization, cfg);
        let (mut target, mut why) = self.bounded_target(now, s, cfg);
        let since_change = self.last_change.map_or(f64::INFINITY, |t| now - t);
        let queue = s.queue_ratio_p95.unwrap_or(0.0);
        if let Some((out, trigger)) = self.scale_out(now, &p, queue, target, since_change, cfg) {
            (target, why) = (out, trigger);
        }
        // Brownout is not a quiet condition: its signal includes the prefill
        // time of long prompts, so it can sit at level 1 on an idle fleet;
        // the wait-only queue signal says whether queues are short.
        self.count_quiet(now, p.rho < p.rho_hat - cfg.band && queue < cfg.queue_theta / 2.0, cfg);
        if why == Why::Hold {
            if let Some(next) = self.scale_in(now, target, p.m_target, since_change, cfg) {
                (target, why) = (next, Why::Quiet);
            }
        }
        self.target = Some(target);
        let burst_factor = self.burst_factor(now, s, cfg.levels[level].burst_factor, cfg);
        let warm = if cfg.warm_pool { warm_pool(target, burst_factor, s.cold_start_s, cfg) } else { 0 };
        Decision {
            serving: target,
            warm,
            why,
            utilization: p.rho,
            target_utilization: p.rho_hat,
            m_target: p.m_target,
            level,
            volatility: vol,
            burst_factor,
        }
    }

    /// ρ and M_target at target utilisation `rho_hat`: slots (demand over
    /// engines × slots) or KV tokens in flight, whichever presses harder.
    /// ρ is taken under the budget already decided (TurboServe recomputes
    /// the load "under the new budget"): engines still starting count, or
    /// every tick of a cold start would scale out again.
    fn pressure(&self, s: &Signals, rho_hat: f64, cfg: &AutoscaleConfig) -> Pressure {
        let k = f64::from(s.slots_per_engine.max(1));
        let budget = self.target.unwrap_or(0).max(s.serving).max(1);
        let kv = s.kv_tokens_per_engine;
        let rho_tokens = if kv > 0.0 { s.tokens_in_flight / (f64::from(budget) * kv) } else { 0.0 };
        let rho = (s.demand / (f64::from(budget) * k)).max(rho_tokens);
        let m_slots = (s.demand / (k * rho_hat)).ceil();
        let m_tokens = if kv > 0.0 { (s.tokens_in_flight / (kv * rho_hat)).ceil() } else { 0.0 };
        let m_target = (m_slots.max(m_tokens) as u32).clamp(cfg.min_engines, cfg.max_engines);
        Pressure { rho, rho_hat, m_target }
    }

    /// The budget this tick starts from: the last decision, or the serving
    /// count at the first tick, within the configured bounds (`Bounds` when
    /// that moved it).
    fn bounded_target(&mut self, now: f64, s: &Signals, cfg: &AutoscaleConfig) -> (u32, Why) {
        let bounds = cfg.min_engines..=cfg.max_engines;
        match self.target {
            Some(t) if !bounds.contains(&t) => {
                self.last_change = Some(now);
                (t.clamp(cfg.min_engines, cfg.max_engines), Why::Bounds)
            }
            Some(t) => (t, Why::Hold),
            None => {
                let t = s.serving.clamp(cfg.min_engines, cfg.max_engines);
                (t, if t != s.serving { Why::Bounds } else { Why::Hold })
            }
        }
    }

    /// Scale-out, once a trigger (ρ above ρ̂ + δ, else the observed queue
    /// ratio above θ) has held for `up_sustain_s` outside the cooldown: to
    /// M_target, at least one more, and under utilisation at least ρ/ρ̂ of
    /// the budget.
    fn scale_out(
        &mut self,
        now: f64,
        p: &Pressure,
        queue: f64,
        target: u32,
        since_change: f64,
        cfg: &AutoscaleConfig,
    ) -> Option<(u32, Why)> {
        let trigger = if p.rho > p.rho_hat + cfg.band {
            Some(Why::Utilization)
        } else if queue > cfg.queue_theta {
            Some(Why::QueueLatency)
        } else {
            None
        };
        self.out_since = match (trigger, self.out_since) {
            (None, _) => None,
            (Some(t), None) => Some((now, t)),
            (Some(t), Some((since, _))) => Some((since, t)),
        };
        let (since, t) = self.out_since?;
        if now - since < cfg.up_sustain_s || since_change < cfg.up_cooldown_s || target >= cfg.max_engines {
            return None;
        }
        let want = match t {
            Why::QueueLatency => p.m_target.max(target + 1),
            _ => p.m_target.max(target + 1).max(((p.rho / p.rho_hat) * f64::from(target)).ceil() as u32),
        };
        self.last_change = Some(now);
        self.out_since = None;
        self.reset_quiet(now);
        Some((want.min(cfg.max_engines), t))
    }

    /// Counts consecutive `down_window_s` windows in which every tick was
    /// quiet.
    fn count_quiet(&mut self, now: f64, quiet: bool, cfg: &AutoscaleConfig) {
        match self.window_start {
            None => self.reset_quiet(now),
            Some(start) => {
                self.window_quiet &= quiet;
                if now - start >= cfg.down_window_s {
                    self.quiet_windows = if self.window_quiet { self.quiet_windows + 1 } else { 0 };
                    self.window_start = Some(now);
                    self.window_quiet = true;
                }
            }
        }
    }

    /// Scale-in after `down_windows` quiet windows outside the cooldown:
    /// toward M_target, at most `max_step_in` of the budget at once.
    fn scale_in(
        &mut self,
        now: f64,
        target: u32,
        m_target: u32,
        since_change: f64,
        cfg: &AutoscaleConfig,
    ) -> Option<u32> {
        if self.quiet_windows < cfg.down_windows
            || since_change < cfg.down_cooldown_s
            || target <= cfg.min_engines
        {
            return None;
        }
        self.quiet_windows = 0;
        let step = ((f64::from(target) * cfg.max_step_in).floor() as u32).max(1);
        let next = m_target.max(target.saturating_sub(step).max(cfg.min_engines));
        (next < target).then(|| {
            self.last_change = Some(now);
            next
        })
    }

    /// The warm pool's burst factor: observed over the trailing horizon
    /// (the highest rate over a cold start's length against the mean), or
    /// the volatility level's `prior` (`burst_source`, and before enough
    /// arrivals were seen).
    fn burst_factor(&mut self, now: f64, s: &Signals, prior: f64, cfg: &AutoscaleConfig) -> f64 {
        let t_cold = s.cold_start_s.unwrap_or(cfg.cold_start_prior_s);
        self.burst.observe(now, s.arrivals, cfg.burst_horizon_s);
        match cfg.burst_source {
            BurstSource::Observed => self.burst.factor(t_cold).unwrap_or(prior),
            BurstSource::Levels => prior,
        }
    }

    fn reset_quiet(&mut self, now: f64) {
        self.window_start = Some(now);
        self.window_quiet = true;
        self.quiet_windows = 0;
    }
}

/// N_warm = ⌈λ_burst · T_cold · margin⌉, with
/// λ_burst = (burst_factor − 1) · serving / burst_ramp_s engines per second
/// and T_cold capped at the ramp; never beyond the whole burst's engines
/// nor `max_engines − serving`.
pub fn warm_pool(serving: u32, burst_factor: f64, cold_start_s: Option<f64>, cfg: &AutoscaleConfig) -> u32 {
    let t_cold = cold_start_s.unwrap_or(cfg.cold_start_prior_s).min(cfg.burst_ramp_s);
    let lambda = (burst_factor - 1.0) * f64::from(serving) / cfg.burst_ramp_s;
    let n = (lambda * t_cold * cfg.warm_margin - 1e-9).ceil().max(0.0) as u32;
    let whole_burst = ((burst_factor - 1.0) * f64::from(serving)).ceil() as u32;
    n.min(whole_burst).min(cfg.max_engines.saturating_sub(serving))
}

/// The delay before restart number `attempt` (0-based) of an engine that
/// exited: `restart_backoff_s`, doubling, at most `restart_backoff_max_s`.
pub fn restart_delay_s(attempt: u32, cfg: &AutoscaleConfig) -> f64 {
    (cfg.restart_backoff_s * 2f64.powi(attempt.min(30) as i32)).min(cfg.restart_backoff_max_s)
}

#[cfg(test)]
mod tests;
