//! `--experiment placement`: placement time per event at 4-256 engines and
//! the gap to the exhaustive oracle (TurboServe §7.4).

use policies::rng::SplitMix;
use policies::video::fleet::{self, Active, ChunkLatency, FleetConfig, Gpu};

use super::super::trace::{self, Kind};
use super::super::{run, Arm};
use super::{scaled, SimVideoArgs};
use crate::progress::Progress;

pub(super) fn placement(args: &SimVideoArgs, fleet_cfg: &FleetConfig) -> (String, serde_json::Value) {
    let spec = trace::spec("t5").expect("bundled");
    let mut md = String::from(
        "Placement time per event (assign + min-max rebalancing + the scaler), trace t5 scaled to each size, this machine:\n\n| engines | events | p50 µs | p99 µs | max µs |\n| ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut timing = Vec::new();
    let sizes = [4u32, 8, 16, 32, 64, 128, 256];
    let mut progress = Progress::new(sizes.len() + 3);
    for &engines in &sizes {
        let mut cfg = fleet_cfg.clone();
        cfg.max_engines = engines;
        let setup = args.setup(cfg.clone());
        let k = setup.capacity();
        let t = scaled(args, &spec, engines, k, 1);
        let o = run(&setup, &t, Arm::Ours, engines / 2, true);
        let mut us = o.place_us.clone();
        us.sort_by(f64::total_cmp);
        let q = |p: f64| us[((us.len() as f64 - 1.0) * p).round() as usize];
        md.push_str(&format!(
            "| {engines} | {} | {:.1} | {:.1} | {:.0} |\n",
            us.len(),
            q(0.5),
            q(0.99),
            us.last().copied().unwrap_or(0.0)
        ));
        timing.push(serde_json::json!({"engines": engines, "events": us.len(), "p50_us": q(0.5), "p99_us": q(0.99), "max_us": us.last()}));
        progress.tick();
    }
    // Oracle gap: trace t1 on small mixed clusters (half the engines 1.6×
    // slower), 80 sampled events each, placement kept by assign +
    // rebalance with the policy's η and transfer model.
    md.push_str("\nGap to the exhaustive oracle (trace t1 replayed on mixed clusters, half the engines 1.6× slower, 80 events sampled per size, the policy's η):\n\n| engines | mean gap | max gap | placement µs (mean) | oracle µs (mean) |\n| ---: | ---: | ---: | ---: | ---: |\n");
    let mut gaps_json = Vec::new();
    for engines in [4usize, 6, 8] {
        let fast = ChunkLatency { chunk_ms: args.chunk_ms, batch_cost: args.batch_cost };
        let slow = ChunkLatency { chunk_ms: args.chunk_ms * 1.6, batch_cost: args.batch_cost };
        let gpus: Vec<Gpu> = (0..engines)
            .map(|j| {
                let latency = if j % 2 == 0 { fast } else { slow };
                Gpu { latency, capacity: 64, open: true }
            })
            .collect();
        let params = args.setup(fleet_cfg.clone()).fleet.params();
        let spec1 = trace::spec("t1").expect("bundled");
        // About 3 active sessions per engine at the peak.
        let t = trace::generate(&spec1, (engines as f64 * 3.0) / spec1.peak_active(), args.burst, 7);
        let mut rng = SplitMix(engines as u64);
        let mut on: Vec<Option<usize>> = vec![None; t.sessions];
        let (mut gaps, mut place_us, mut oracle_us) = (Vec::new(), Vec::new(), Vec::new());
        let every = (t.events.len() / 80).max(1);
        for (i, e) in t.events.iter().enumerate() {
            let load = |on: &[Option<usize>]| {
                let mut l = vec![0u32; engines];
                on.iter().flatten().for_each(|&g| l[g] += 1);
                l
            };
            let began = crate::clock::now();
            match e.kind {
                Kind::Arrive | Kind::Resume => on[e.session] = fleet::assign(&gpus, &load(&on)),
                Kind::Idle | Kind::Depart => on[e.session] = None,
            }
            let active: Vec<Active> = on
                .iter()
                .enumerate()
                .filter_map(|(s, g)| {
                    g.map(|gpu| Active {
                        id: s as u64,
                        gpu,
                        state_bytes: ((args.state_mib + rng.unit_f64() * args.state_mib) * 1048576.0) as u64,
                        movable: true,
                    })
                })
                .collect();
            let plan = fleet::rebalance(&gpus, &active, &params);
            for m in &plan.moves {
                on[m.session as usize] = Some(m.to);
            }
            let took = crate::clock::since(began).as_secs_f64() * 1e6;
            if i % every == 0 && gaps.len() < 80 {
                let n = plan.load.iter().sum::<u32>();
                let began = crate::clock::now();
                let best = fleet::oracle_ms(&gpus, n);
                oracle_us.push(crate::clock::since(began).as_secs_f64() * 1e6);
                place_us.push(took);
                gaps.push(if best > 0.0 { plan.after_ms / best - 1.0 } else { 0.0 });
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        md.push_str(&format!(
            "| {engines} | {:.2}% | {:.2}% | {:.1} | {:.1} |\n",
            mean(&gaps) * 100.0,
            gaps.iter().copied().fold(0.0, f64::max) * 100.0,
            mean(&place_us),
            mean(&oracle_us)
        ));
        gaps_json.push(serde_json::json!({"engines": engines, "gaps": gaps, "place_us": place_us, "oracle_us": oracle_us}));
        progress.tick();
    }
    progress.done();
    (md, serde_json::json!({"experiment": "placement", "timing": timing, "oracle": gaps_json}))
}
