//! Each chunk's fidelity: Bi-Modal Pareto Routing (the product), the
//! static highest-quality baseline, or SlackServe's fixed levels.

use policies::video::bmpr::{self, Mode};
use policies::video::{self as pv, FidelityMode, VideoConfig, VideoProfile};

use super::super::chunk_time_s;

/// The next chunk's plan.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub fidelity: pv::Fidelity,
    pub expected_s: f64,
    pub quality: f64,
    pub mode: &'static str,
}

/// Picks the next chunk's configuration on an engine coalescing `k` streams.
pub(super) fn plan(cfg: &VideoConfig, profile: &VideoProfile, slack_s: f64, chunk_s: f64, k: u32) -> Plan {
    let best = profile.best();
    let reference_s = chunk_time_s(profile, best.chunk_ms, k);
    let cost = |p: &pv::ConfigPoint| profile.batch_ms(p.chunk_ms, k.max(1) as usize);
    let (frontier, floor) = (profile.frontier(), profile.quality_floor());
    let (p, mode) = match cfg.fidelity {
        FidelityMode::Static => (best, "static"),
        FidelityMode::Levels => {
            let credit = pv::credit(slack_s, 0.0, reference_s);
            bmpr::fixed_level(&frontier, floor, credit, reference_s, cfg.alpha).unwrap_or((best, "static"))
        }
        FidelityMode::Bmpr => {
            let budget = bmpr::budget_s(slack_s, chunk_s, 0.0, reference_s, cfg.alpha);
            let (p, mode) =
                bmpr::select(&frontier, budget * 1e3, floor, cost).unwrap_or((best, Mode::SpeedRecovery));
            (p, mode.label())
        }
    };
    Plan { fidelity: p.fidelity, expected_s: cost(&p) / 1e3, quality: p.quality, mode }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> VideoProfile {
        VideoProfile::parse("bundled", include_str!("../../../../policies/profiles/video-emulated-h100.toml"))
            .expect("the bundled profile parses")
    }

    /// Each fidelity mode on the shipped profile: static always runs the
    /// best point; BMPR spends slack on quality and drops to the fastest
    /// point over the floor when none is left; the fixed-level baseline
    /// runs exactly three points over the floor, by tier.
    #[test]
    fn every_fidelity_mode_plans_from_the_profile() {
        let profile = shipped();
        let (best, floor) = (profile.best(), profile.quality_floor());
        let with = |fidelity| VideoConfig { fidelity, ..VideoConfig::default() };
        let chunk_s = 0.75;
        let mut seen = std::collections::BTreeSet::new();
        for slack in [0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0] {
            let s = plan(&with(FidelityMode::Static), &profile, slack, chunk_s, 1);
            assert_eq!((s.fidelity, s.mode), (best.fidelity, "static"));
            let b = plan(&with(FidelityMode::Bmpr), &profile, slack, chunk_s, 1);
            assert!(b.quality >= floor, "BMPR stays over the floor at slack {slack}");
            let l = plan(&with(FidelityMode::Levels), &profile, slack, chunk_s, 1);
            assert!(l.quality >= floor && l.mode.starts_with("level_"));
            seen.insert((l.mode, (l.quality * 1e6) as u64));
        }
        let b0 = plan(&with(FidelityMode::Bmpr), &profile, 0.0, chunk_s, 1);
        assert_eq!(b0.mode, "speed_recovery");
        let b10 = plan(&with(FidelityMode::Bmpr), &profile, 10.0, chunk_s, 1);
        assert_eq!((b10.fidelity, b10.mode), (best.fidelity, "quality"));
        // Three levels, and the fast one is BMPR's recovery point.
        let modes: Vec<&str> = seen.iter().map(|(m, _)| *m).collect();
        assert_eq!(modes, ["level_fast", "level_medium", "level_slow"]);
        let fast = plan(&with(FidelityMode::Levels), &profile, 0.0, chunk_s, 1);
        assert_eq!(fast.fidelity, b0.fidelity);
        let slow = plan(&with(FidelityMode::Levels), &profile, 10.0, chunk_s, 1);
        assert_eq!(slow.fidelity, best.fidelity);
    }
}
