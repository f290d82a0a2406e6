//! Brownout: graceful degradation under overload, before anything is refused.
//!
//! A level state machine (0 = normal) driven by one observed signal: the
//! **trouble share**, the share of the requests of the last `window_s`
//! seconds that were in trouble. A request is in trouble when it was refused
//! for capacity (`ttft_infeasible`, `e2e_infeasible`, `kv_headroom`,
//! `deadline_unreachable`, `queue_timeout`) or when its first token came
//! after `trouble_ttft_fraction` of its TTFT budget. Both are things that
//! happened, not predictions: a fleet that serves everything well inside its
//! budgets reads 0 however pessimistic the estimator is, and brownout stays
//! at level 0. Its own refusals (`brownout_context`) and tenant limits do
//! not count (they say nothing about capacity). Each level lists, per tier,
//! how far the output cap and the context ceiling shrink; the shipped
//! levels tighten bronze first, then silver, and leave gold alone.
//!
//! Hysteresis: a level is entered when the share stays above its
//! `enter_above` for `up_dwell_s`, and left when it stays below its
//! `exit_below` (lower) for `down_dwell_s` (longer), one level per step, so
//! a noisy signal near a threshold does not flap.

use std::collections::{BTreeMap, VecDeque};

use serde::Deserialize;

/// How one brownout level shrinks one tier's limits.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TierCaps {
    /// Multiplies the tier's output cap (max_tokens), floored at its
    /// `output_floor_tokens`.
    pub output_scale: f64,
    /// Multiplies the tier's context ceiling (prompt tokens).
    pub context_scale: f64,
}

impl Default for TierCaps {
    fn default() -> Self {
        Self { output_scale: 1.0, context_scale: 1.0 }
    }
}

/// One brownout level.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// Enter this level when the trouble share stays above this (0-1).
    pub enter_above: f64,
    /// Leave it when the share stays below this (must be < enter_above).
    pub exit_below: f64,
    /// Caps by tier name; tiers not named keep their limits.
    #[serde(default)]
    pub tiers: BTreeMap<String, TierCaps>,
}

/// `[brownout]` in the policy document.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrownoutConfig {
    pub enabled: bool,
    /// Length of the sliding window the trouble share is taken over, seconds.
    pub window_s: f64,
    /// A served request is in trouble when its first token came after this
    /// share of its TTFT budget.
    pub trouble_ttft_fraction: f64,
    /// Samples needed in the window before it says anything.
    pub min_samples: usize,
    /// How long the signal must stay above the next level's threshold.
    pub up_dwell_s: f64,
    /// How long it must stay below the current level's exit threshold.
    pub down_dwell_s: f64,
    /// Levels 1, 2, ... in order of severity.
    pub levels: Vec<LevelConfig>,
}

fn caps(pairs: &[(&str, f64, f64)]) -> BTreeMap<String, TierCaps> {
    pairs.iter().map(|&(t, o, c)| (t.to_string(), TierCaps { output_scale: o, context_scale: c })).collect()
}

impl Default for BrownoutConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window_s: 10.0,
            trouble_ttft_fraction: 0.9,
            min_samples: 20,
            up_dwell_s: 1.0,
            down_dwell_s: 10.0,
            levels: vec![
                LevelConfig { enter_above: 0.05, exit_below: 0.01, tiers: caps(&[("bronze", 0.5, 1.0)]) },
                LevelConfig {
                    enter_above: 0.15,
                    exit_below: 0.04,
                    tiers: caps(&[("bronze", 0.25, 0.5), ("silver", 0.5, 1.0)]),
                },
                LevelConfig {
                    enter_above: 0.3,
                    exit_below: 0.1,
                    tiers: caps(&[("bronze", 0.125, 0.25), ("silver", 0.25, 0.5)]),
                },
            ],
        }
    }
}

impl BrownoutConfig {
    /// Cross-field checks; the error names the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let pos = |x: f64| x.is_finite() && x > 0.0;
        if !pos(self.window_s) || !pos(self.up_dwell_s) || !pos(self.down_dwell_s) {
            return Err(("brownout".into(), "window_s, up_dwell_s and down_dwell_s must be > 0".into()));
        }
        if !(pos(self.trouble_ttft_fraction) && self.trouble_ttft_fraction <= 1.0) {
            return Err(("brownout.trouble_ttft_fraction".into(), "must be in (0, 1]".into()));
        }
        let mut last = 0.0;
        for (i, l) in self.levels.iter().enumerate() {
            let key = |k: &str| format!("brownout.levels[{i}].{k}");
            if !(pos(l.enter_above) && l.enter_above < 1.0 && l.exit_below.is_finite() && l.exit_below >= 0.0)
            {
                return Err((key("enter_above"), "shares: enter_above in (0, 1), exit_below >= 0".into()));
            }
            if l.exit_below >= l.enter_above {
                return Err((key("exit_below"), format!("must be < enter_above ({})", l.enter_above)));
            }
            if l.enter_above <= last {
                return Err((key("enter_above"), "must increase from level to level".into()));
            }
            last = l.enter_above;
            for (t, c) in &l.tiers {
                let ok = |x: f64| x.is_finite() && x > 0.0 && x <= 1.0;
                if !ok(c.output_scale) || !ok(c.context_scale) {
                    return Err((
                        format!("brownout.levels[{i}].tiers.{t}"),
                        "scales must be in (0, 1]".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The caps level `level` (0 = normal) puts on `tier`.
    pub fn caps(&self, level: usize, tier: &str) -> TierCaps {
        match level.checked_sub(1).and_then(|i| self.levels.get(i)) {
            Some(l) => l.tiers.get(tier).copied().unwrap_or_default(),
            None => TierCaps::default(),
        }
    }
}

/// Time-stamped samples over a sliding window; time in seconds from any
/// fixed origin (a parameter, never a clock read).
#[derive(Debug, Clone, Default)]
pub struct Window {
    samples: VecDeque<(f64, f64)>,
}

impl Window {
    /// At most this many samples are kept (oldest dropped first).
    const MAX: usize = 8192;

    pub fn push(&mut self, now: f64, value: f64) {
        if !value.is_finite() {
            return;
        }
        if self.samples.len() >= Self::MAX {
            self.samples.pop_front();
        }
        self.samples.push_back((now, value));
    }

    fn forget(&mut self, now: f64, span: f64) {
        while self.samples.front().is_some_and(|&(t, _)| t < now - span) {
            self.samples.pop_front();
        }
    }

    /// The share of the samples of the last `span` seconds that are at
    /// least `at`, when there are at least `min` of them.
    pub fn share(&mut self, now: f64, span: f64, min: usize, at: f64) -> Option<f64> {
        self.forget(now, span);
        if self.samples.len() < min.max(1) {
            return None;
        }
        let over = self.samples.iter().filter(|&&(_, x)| x >= at).count();
        Some(over as f64 / self.samples.len() as f64)
    }

    /// The 95th percentile of the samples of the last `span` seconds, when
    /// there are at least `min` of them.
    pub fn p95(&mut self, now: f64, span: f64, min: usize) -> Option<f64> {
        self.forget(now, span);
        if self.samples.len() < min.max(1) {
            return None;
        }
        let mut v: Vec<f64> = self.samples.iter().map(|&(_, x)| x).collect();
        let rank = ((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1;
        let (_, q, _) = v.select_nth_unstable_by(rank, f64::total_cmp);
        Some(*q)
    }
}

/// The brownout level and its hysteresis timers.
#[derive(Debug, Clone, Default)]
pub struct Brownout {
    level: usize,
    above_since: Option<f64>,
    below_since: Option<f64>,
}

impl Brownout {
    pub fn level(&self) -> usize {
        self.level
    }

    /// Feeds the current signal (`None`: too few samples, counts as quiet)
    /// at time `now` (seconds); returns the new level when it changed.
    pub fn update(&mut self, now: f64, signal: Option<f64>, cfg: &BrownoutConfig) -> Option<usize> {
        if !cfg.enabled {
            let changed = self.level != 0;
            *self = Self::default();
            return changed.then_some(0);
        }
        if self.level > cfg.levels.len() {
            // A reload removed levels: stand at the highest one left.
            *self = Self { level: cfg.levels.len(), ..Self::default() };
            return Some(self.level);
        }
        let s = signal.unwrap_or(0.0);
        let up = cfg.levels.get(self.level).is_some_and(|next| s > next.enter_above);
        let down = self.level > 0 && s < cfg.levels[self.level - 1].exit_below;
        self.above_since = if up { self.above_since.or(Some(now)) } else { None };
        self.below_since = if down { self.below_since.or(Some(now)) } else { None };
        if self.above_since.is_some_and(|t| now - t >= cfg.up_dwell_s) {
            self.level += 1;
        } else if self.below_since.is_some_and(|t| now - t >= cfg.down_dwell_s) {
            self.level -= 1;
        } else {
            return None;
        }
        self.above_since = None;
        self.below_since = None;
        Some(self.level)
    }
}

#[cfg(test)]
mod tests {

    /// A window fed faster than it forgets (the gate-wait signal gets a
    /// sample per admitted request) keeps at most `Window::MAX`, the newest.
    #[test]
    fn a_window_keeps_at_most_its_bound_of_the_newest_samples() {
        let mut w = Window::default();
        for i in 0..(3 * Window::MAX) {
            // The oldest two thirds read 9, the newest third 1.
            w.push(i as f64 * 1e-4, if i < 2 * Window::MAX { 9.0 } else { 1.0 });
        }
        assert_eq!(w.samples.len(), Window::MAX);
        assert_eq!(w.p95(3.0, 30.0, 1), Some(1.0), "only the newest samples count");
    }
    use super::*;
    use crate::rng::SplitMix;

    #[test]
    fn a_reload_with_fewer_levels_clamps_the_level() {
        let mut cfg = BrownoutConfig::default();
        let mut b = Brownout::default();
        let mut t = 0.0;
        while b.level() < 3 {
            b.update(t, Some(5.0), &cfg);
            t += 0.25;
        }
        cfg.levels.truncate(1);
        assert_eq!(b.update(t, Some(5.0), &cfg), Some(1));
        assert_eq!(b.update(t + 0.25, Some(0.0), &cfg), None, "dwell restarts");
        cfg.levels.clear();
        assert_eq!(b.update(t + 0.5, Some(5.0), &cfg), Some(0));
        assert_eq!(b.update(t + 60.0, Some(5.0), &cfg), None);
    }

    #[test]
    fn shipped_levels_are_valid_and_tighten_bronze_first() {
        let cfg = BrownoutConfig::default();
        cfg.validate().unwrap();
        assert!(cfg.caps(1, "bronze").output_scale < 1.0);
        assert_eq!(cfg.caps(1, "silver"), TierCaps::default());
        assert!(cfg.caps(2, "silver").output_scale < 1.0);
        assert_eq!(cfg.caps(3, "gold"), TierCaps::default());
        assert_eq!(cfg.caps(0, "bronze"), TierCaps::default());
    }

    #[test]
    fn window_p95_forgets_old_samples() {
        let mut w = Window::default();
        for i in 0..100 {
            w.push(f64::from(i) * 0.01, f64::from(i));
        }
        assert_eq!(w.p95(1.0, 10.0, 20), Some(94.0));
        assert_eq!(w.p95(20.0, 10.0, 20), None, "all samples older than the window");
    }

    /// A trouble share oscillating around an enter threshold never flaps:
    /// it climbs once it is clearly above, and only comes down after
    /// staying below the lower exit threshold for the down dwell.
    #[test]
    fn hysteresis_on_a_noisy_signal_does_not_flap() {
        let cfg = BrownoutConfig::default();
        let mut b = Brownout::default();
        let mut rng = SplitMix(7);
        let mut changes = Vec::new();
        let mut t = 0.0;
        // `secs` of a signal uniform in mean ± spread, one sample per 0.25 s.
        let mut run = |b: &mut Brownout,
                       mean: f64,
                       spread: f64,
                       secs: f64,
                       t: &mut f64,
                       changes: &mut Vec<(f64, usize)>| {
            let end = *t + secs;
            while *t < end {
                let noise = (rng.unit_f64() - 0.5) * 2.0 * spread;
                if let Some(l) = b.update(*t, Some((mean + noise).max(0.0)), &cfg) {
                    changes.push((*t, l));
                }
                *t += 0.25;
            }
        };
        // A few percent in trouble, straddling level 1's exit (1%) but under
        // its entry (5%): quiet.
        run(&mut b, 0.02, 0.025, 30.0, &mut t, &mut changes);
        assert!(changes.is_empty(), "{changes:?}");
        // Overload: 17-23% in trouble, above level 2's entry (15%), under
        // level 3's (30%): up to level 2, never back.
        run(&mut b, 0.2, 0.03, 20.0, &mut t, &mut changes);
        assert_eq!(b.level(), 2, "{changes:?}");
        let n = changes.len();
        assert!(changes.windows(2).all(|w| w[1].1 > w[0].1), "only rises under overload: {changes:?}");
        // 3-9%: below level 2's entry, crossing its exit (4%) often: holds.
        run(&mut b, 0.06, 0.03, 30.0, &mut t, &mut changes);
        assert_eq!(b.level(), 2, "{changes:?}");
        assert_eq!(changes.len(), n);
        // Quiet: steps down one level per dwell, each >= down_dwell apart.
        run(&mut b, 0.0, 0.005, 60.0, &mut t, &mut changes);
        assert_eq!(b.level(), 0, "{changes:?}");
        let downs: Vec<f64> = changes[n..].iter().map(|c| c.0).collect();
        assert_eq!(downs.len(), 2);
        assert!(downs.windows(2).all(|w| w[1] - w[0] >= cfg.down_dwell_s), "{downs:?}");
    }

    #[test]
    fn window_share_counts_samples_at_or_over_the_mark() {
        let mut w = Window::default();
        for i in 0..20 {
            w.push(f64::from(i) * 0.1, if i % 4 == 0 { 1.0 } else { 0.5 });
        }
        assert_eq!(w.share(2.0, 10.0, 20, 0.9), Some(0.25));
        assert_eq!(w.share(2.0, 10.0, 21, 0.9), None, "too few samples");
        assert_eq!(w.share(2.0, 10.0, 1, 0.4), Some(1.0));
    }

    #[test]
    fn invalid_levels_name_the_key() {
        let mut cfg = BrownoutConfig::default();
        cfg.levels[1].exit_below = 0.9;
        let (key, _) = cfg.validate().unwrap_err();
        assert_eq!(key, "brownout.levels[1].exit_below");
        let mut cfg = BrownoutConfig::default();
        cfg.levels[0].tiers.get_mut("bronze").unwrap().output_scale = 0.0;
        assert!(cfg.validate().unwrap_err().0.contains("tiers.bronze"));
    }
}
