//! Bi-Modal Pareto Routing: the fidelity of a stream's next chunk.
//!
//! *Quality mode*: the best-quality frontier point whose time fits the
//! stream's budget and whose quality meets the floor. *Speed-recovery
//! mode*, when none fits: the fastest frontier point that still meets the
//! floor, to rebuild slack as fast as the floor allows.
//!
//! The budget is what the next chunk may take while the buffer stays at
//! its safe level `α·T_ref` (the urgency margin at the reference, highest
//! quality, configuration): `P + D − R − α·T_ref` (slack now, plus the
//! chunk's own duration it adds to the buffer, less the chunk in progress,
//! less the safe level). Above the safe level a stream spends the excess
//! on quality; below it the budget is under one chunk duration, so only
//! configurations faster than playout fit and the buffer refills; with no
//! fit, speed recovery takes the fastest one over the floor.

use super::fidelity::ConfigPoint;
use super::playout::{urgency, Urgency};

/// Which mode chose the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Quality,
    SpeedRecovery,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Quality => "quality",
            Mode::SpeedRecovery => "speed_recovery",
        }
    }
}

/// The time budget for the next chunk, seconds (see the module docs).
pub fn budget_s(slack_s: f64, chunk_s: f64, in_progress_s: f64, reference_s: f64, alpha: f64) -> f64 {
    slack_s + chunk_s - in_progress_s - alpha * reference_s
}

/// Picks from `frontier` (sorted by latency, as [`super::frontier`] returns
/// it). `cost_ms` maps a point to its effective time on the stream's engine
/// (for example its coalesced batch time). `None` only for an empty frontier.
pub fn select(
    frontier: &[ConfigPoint],
    budget_ms: f64,
    floor: f64,
    cost_ms: impl Fn(&ConfigPoint) -> f64,
) -> Option<(ConfigPoint, Mode)> {
    let quality = frontier
        .iter()
        .filter(|p| p.quality >= floor && cost_ms(p) <= budget_ms)
        .max_by(|a, b| a.quality.total_cmp(&b.quality));
    if let Some(p) = quality {
        return Some((*p, Mode::Quality));
    }
    let recovery = frontier
        .iter()
        .filter(|p| p.quality >= floor)
        .min_by(|a, b| cost_ms(a).total_cmp(&cost_ms(b)))
        .or_else(|| frontier.iter().max_by(|a, b| a.quality.total_cmp(&b.quality)));
    recovery.map(|p| (*p, Mode::SpeedRecovery))
}

/// SlackServe's fixed-level baseline (§7.3, Figure 16): three frontier
/// points over the floor (the fastest, the middle one, the best) and a
/// switch among them by the stream's tier: credit below `α·T_ref`
/// (URGENT) runs the fast level, above `2α·T_ref` (RELAXED) the slow
/// (best) one, between them the medium one. It switches fidelity by slack
/// as BMPR does but without the budget and the frontier search, which is
/// what the paper's comparison isolates. `frontier` sorted by latency;
/// `None` only when it is empty.
pub fn fixed_level(
    frontier: &[ConfigPoint],
    floor: f64,
    credit_s: f64,
    reference_s: f64,
    alpha: f64,
) -> Option<(ConfigPoint, &'static str)> {
    let over: Vec<&ConfigPoint> = frontier.iter().filter(|p| p.quality >= floor).collect();
    let levels: Vec<&ConfigPoint> = if over.is_empty() { frontier.iter().collect() } else { over };
    let (fast, medium, slow) = (levels.first()?, levels[levels.len() / 2], levels.last()?);
    Some(match urgency(credit_s, reference_s, alpha) {
        Urgency::Urgent => (**fast, "level_fast"),
        Urgency::Normal => (*medium, "level_medium"),
        Urgency::Relaxed => (**slow, "level_slow"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::video::fidelity::{Fidelity, Precision};

    fn p(steps: u8, ms: f64, q: f64) -> ConfigPoint {
        let fidelity = Fidelity { steps, sparsity_pct: 0, window: 7, precision: Precision::Fp16 };
        ConfigPoint { fidelity, chunk_ms: ms, quality: q }
    }

    /// A hand-made frontier: 100 ms @ 0.90, 200 @ 0.95, 300 @ 0.98, 500 @ 1.0.
    fn frontier() -> Vec<ConfigPoint> {
        vec![p(1, 100.0, 0.90), p(2, 200.0, 0.95), p(3, 300.0, 0.98), p(4, 500.0, 1.0)]
    }

    #[test]
    fn quality_mode_takes_the_best_point_that_fits() {
        let f = frontier();
        let id = |c: &ConfigPoint| c.chunk_ms;
        assert_eq!(
            select(&f, 1000.0, 0.93, id).map(|(c, m)| (c.fidelity.steps, m)),
            Some((4, Mode::Quality))
        );
        assert_eq!(select(&f, 350.0, 0.93, id).map(|(c, m)| (c.fidelity.steps, m)), Some((3, Mode::Quality)));
        assert_eq!(select(&f, 200.0, 0.93, id).map(|(c, m)| (c.fidelity.steps, m)), Some((2, Mode::Quality)));
        // The floor excludes the fastest point even when it is the only fit.
        assert_eq!(
            select(&f, 150.0, 0.93, id).map(|(c, m)| (c.fidelity.steps, m)),
            Some((2, Mode::SpeedRecovery))
        );
    }

    #[test]
    fn speed_recovery_takes_the_fastest_point_over_the_floor() {
        let f = frontier();
        // Nothing fits 50 ms: the fastest point that meets the floor.
        let (c, m) = select(&f, 50.0, 0.97, |c| c.chunk_ms).unwrap();
        assert_eq!((c.fidelity.steps, m), (3, Mode::SpeedRecovery));
        // Costs on the engine (a batch of 3 at 30% per extra chunk) change the fit.
        let batch = |c: &ConfigPoint| c.chunk_ms * 1.6;
        let (c, m) = select(&f, 500.0, 0.9, batch).unwrap();
        assert_eq!((c.fidelity.steps, m), (3, Mode::Quality));
        // A floor nothing meets: the best there is.
        let (c, _) = select(&f, 50.0, 1.5, batch).unwrap();
        assert_eq!(c.fidelity.steps, 4);
        assert!(select(&[], 50.0, 0.5, batch).is_none());
    }

    #[test]
    fn budget_spends_only_buffer_above_the_safe_level() {
        // Safe level 2 × 0.6 s = 1.2 s. At 2 s of slack, 0.8 s to spend.
        assert!((budget_s(2.0, 0.75, 0.0, 0.6, 2.0) - 1.55).abs() < 1e-9);
        // At the safe level: one chunk duration, i.e. keep up.
        assert!((budget_s(1.2, 0.75, 0.0, 0.6, 2.0) - 0.75).abs() < 1e-9);
        // Below it: faster than playout, to refill.
        assert!(budget_s(0.5, 0.75, 0.1, 0.6, 2.0) < 0.75);
    }

    #[test]
    fn fixed_level_switches_among_three_points_over_the_floor_by_tier() {
        let f = frontier();
        let level = |credit: f64| {
            let (c, label) = fixed_level(&f, 0.93, credit, 0.5, 2.0).unwrap();
            (c.fidelity.steps, label)
        };
        // Over the floor: 200, 300 and 500 ms; URGENT below 1 s of credit,
        // RELAXED above 2 s.
        assert_eq!(level(0.5), (2, "level_fast"));
        assert_eq!(level(1.5), (3, "level_medium"));
        assert_eq!(level(2.5), (4, "level_slow"));
        // A floor nothing meets: the whole frontier is the ladder.
        assert_eq!(fixed_level(&f, 1.5, 0.0, 0.5, 2.0).map(|(c, _)| c.fidelity.steps), Some(1));
        assert!(fixed_level(&[], 0.9, 0.0, 0.5, 2.0).is_none());
    }
}
