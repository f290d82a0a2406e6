//! `loadtest decision-cost`: how long the control plane's decisions take,
//! measured on the production code with synthetic fleets: one admission
//! decision (`Controller::request`) over N engines, a gate pump, one
//! autoscaler tick, and one placement event (a re-homing plan over 64
//! engines' streams, plus a new stream's home). Medians and p99 of many
//! repetitions, in microseconds.

use policies::admission::controller::{Controller, Request};
use policies::admission::Candidate;
use policies::autoscale::{AutoscaleConfig, Autoscaler, Signals};
use policies::video::placement::{home, plan_rehoming, RehomeLimits, StreamView};
use policies::video::playout::Urgency;
use policies::{LatencyProfile, PolicyDocument};

use crate::stats::Summary;

/// One measured decision.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cost {
    pub what: String,
    pub engines: usize,
    pub micros: Summary,
}

fn measure(reps: usize, mut f: impl FnMut(usize)) -> Summary {
    let mut v = Vec::with_capacity(reps);
    for i in 0..reps {
        let t = crate::clock::now();
        f(i);
        v.push(crate::clock::since(t).as_secs_f64() * 1e6);
    }
    Summary::of(&v).expect("samples")
}

/// Runs every measurement with `engines` engines for admission and
/// autoscaling and `placement_engines` for placement.
pub fn run(
    policy: &PolicyDocument,
    profile: &LatencyProfile,
    engines: usize,
    placement_engines: usize,
) -> Vec<Cost> {
    let mut out = Vec::new();
    let mut ctl = Controller::new();
    let class = ctl.class_of(profile);
    let cands: Vec<Candidate> = (0..engines)
        .map(|idx| Candidate {
            idx,
            class,
            slots: 8,
            active: (idx % 9) as u32,
            active_out_tokens: (idx as u64 % 9) * 150,
            prefill_backlog_tokens: (idx as u64 % 3) * 200,
            kv_headroom_tokens: 1 << 20,
            long_lane: idx == 0,
            cached_tokens: 0,
            preemptible: 0,
        })
        .collect();
    let tiers: Vec<_> = policy.tiers.iter().collect();
    let tenants = ["a", "b", "c", "d"];
    let micros = measure(20_000, |i| {
        let r = Request {
            tenant: tenants[i % 4],
            tier: tiers[i % tiers.len()],
            model: "m",
            prompt_tokens: 100 + (i as u32 * 37) % 3000,
            max_tokens: 64 + (i as u32 * 13) % 900,
            sampling: i % 2 == 0,
            ttft_hint_ms: None,
            e2e_hint_ms: None,
            prefix_blocks: 0,
        };
        let o = ctl.request(i as f64 * 1e-3, policy, &r, &cands, &[]);
        std::hint::black_box(o);
        ctl.release(tenants[i % 4]);
    });
    out.push(Cost { what: "admission decision (Controller::request)".into(), engines, micros });
    let full: Vec<Candidate> = cands.iter().map(|c| Candidate { active: c.slots, ..c.clone() }).collect();
    for i in 0..200 {
        let r = Request {
            tenant: tenants[i % 4],
            tier: tiers[i % tiers.len()],
            model: "m",
            prompt_tokens: 200,
            max_tokens: 100,
            sampling: false,
            ttft_hint_ms: None,
            e2e_hint_ms: None,
            prefix_blocks: 0,
        };
        let _ = ctl.request(30.0, policy, &r, &full, &[]);
    }
    let micros = measure(2_000, |_| {
        std::hint::black_box(ctl.pump(30.0, policy, &full, |_| true));
    });
    out.push(Cost { what: format!("gate pump, {} waiting, no slot free", ctl.waiting()), engines, micros });
    let cfg =
        AutoscaleConfig { enabled: true, max_engines: engines as u32 * 2, ..AutoscaleConfig::default() };
    let mut scaler = Autoscaler::new();
    let micros = measure(20_000, |i| {
        let s = Signals {
            serving: engines as u32,
            slots_per_engine: 8,
            demand: engines as f64 * 6.0 + (i % 50) as f64,
            queue_ratio_p95: Some(0.2),
            brownout_level: 0,
            arrivals: i as u64 * 40,
            cold_start_s: Some(20.0),
            tokens_in_flight: engines as f64 * 20_000.0,
            kv_tokens_per_engine: 65_536.0,
        };
        std::hint::black_box(scaler.tick(i as f64, &s, &cfg));
    });
    out.push(Cost { what: "autoscaler tick (Autoscaler::tick)".into(), engines, micros });
    let streams: Vec<StreamView> = (0..placement_engines * 8)
        .map(|i| StreamView {
            id: i as u64,
            engine: i % placement_engines,
            credit_s: (i % 17) as f64 * 0.3,
            urgency: match i % 5 {
                0 | 1 => Urgency::Urgent,
                2 => Urgency::Normal,
                _ => Urgency::Relaxed,
            },
            last_moved: None,
        })
        .collect();
    let ids: Vec<usize> = (0..placement_engines).collect();
    let limits = RehomeLimits { max_out: 2, max_in: 1, cooldown_s: 60.0 };
    let micros = measure(2_000, |_| {
        std::hint::black_box(plan_rehoming(&ids, &streams, 100.0, limits));
    });
    out.push(Cost {
        what: format!("placement event: re-homing plan, {} streams", streams.len()),
        engines: placement_engines,
        micros,
    });
    let counts: Vec<(usize, u32)> = (0..placement_engines).map(|e| (e, (e % 7) as u32)).collect();
    let micros = measure(20_000, |_| {
        std::hint::black_box(home(&counts));
    });
    out.push(Cost {
        what: "placement event: a new stream's home".into(),
        engines: placement_engines,
        micros,
    });
    out.push(video_tick(&policy.video, 1024, 16));
    out
}

/// One video control tick as the gateway runs it (SlackServe Appendix
/// D.1): every stream's credit, tier and next fidelity (BMPR over the
/// bundled emulated profile's frontier), then min-max rebalancing and the
/// URGENT re-homing plan, over `streams` streams on `engines` engines.
fn video_tick(cfg: &policies::video::VideoConfig, streams: usize, engines: usize) -> Cost {
    use policies::video::{bmpr, credit, fleet, urgency, VideoProfile};
    let profile =
        VideoProfile::parse("bundled", include_str!("../../policies/profiles/video-emulated-h100.toml"))
            .expect("the bundled profile parses");
    let frontier = profile.frontier();
    let floor = profile.quality_floor();
    let latency = fleet::ChunkLatency::of(&profile);
    let gpus: Vec<fleet::Gpu> =
        (0..engines).map(|_| fleet::Gpu { latency, capacity: 64, open: true }).collect();
    let ids: Vec<usize> = (0..engines).collect();
    let limits = RehomeLimits {
        max_out: cfg.max_out_per_tick,
        max_in: cfg.max_in_per_tick,
        cooldown_s: cfg.rehome_cooldown_s,
    };
    let micros = measure(200, |i| {
        let mut views = Vec::with_capacity(streams);
        let mut active = Vec::with_capacity(streams);
        for s in 0..streams {
            // Skewed homes so that rebalancing has work to do.
            let engine = (s * s + i) % engines;
            let slack = ((s * 7919 + i) % 4000) as f64 / 1000.0;
            let k = streams / engines;
            let cost = |p: &policies::video::ConfigPoint| profile.batch_ms(p.chunk_ms, k.max(1));
            let budget = bmpr::budget_s(slack, 0.75, 0.0, cost(&profile.best()) / 1e3, cfg.alpha);
            let (p, _) = bmpr::select(&frontier, budget * 1e3, floor, cost)
                .unwrap_or((profile.best(), bmpr::Mode::SpeedRecovery));
            let next_s = cost(&p) / 1e3;
            let c = credit(slack, 0.0, next_s);
            views.push(StreamView {
                id: s as u64,
                engine,
                credit_s: c,
                urgency: urgency(c, next_s, cfg.alpha),
                last_moved: None,
            });
            active.push(fleet::Active { id: s as u64, gpu: engine, state_bytes: 64 << 20, movable: true });
        }
        std::hint::black_box(fleet::rebalance(&gpus, &active, &cfg.fleet.params()));
        std::hint::black_box(plan_rehoming(&ids, &views, 100.0, limits));
    });
    Cost {
        what: format!("video control tick, {streams} streams (credit, BMPR, min-max, re-homing)"),
        engines,
        micros,
    }
}
