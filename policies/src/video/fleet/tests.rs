use super::*;
use crate::rng::SplitMix;

const H100: ChunkLatency = ChunkLatency { chunk_ms: 150.0, batch_cost: 0.25 };
const A100: ChunkLatency = ChunkLatency { chunk_ms: 240.0, batch_cost: 0.3 };
const FREE: TransferModel = TransferModel { alpha_ms: 0.0, mib_per_s: 1e9 };

fn gpu(latency: ChunkLatency, capacity: u32) -> Gpu {
    Gpu { latency, capacity, open: true }
}

fn params(eta: f64) -> PlaceParams {
    PlaceParams { eta, transfer: TransferModel { alpha_ms: 2.0, mib_per_s: 400.0 }, max_moves: 4096 }
}

fn sessions(load: &[u32], bytes: u64) -> Vec<Active> {
    let mut out = Vec::new();
    for (gpu, &n) in load.iter().enumerate() {
        for _ in 0..n {
            out.push(Active { id: out.len() as u64, gpu, state_bytes: bytes, movable: true });
        }
    }
    out
}

#[test]
fn latency_grows_with_coalescing_and_capacity_is_the_most_within_the_target() {
    assert_eq!(H100.ms(0), 0.0);
    assert_eq!(H100.ms(1), 150.0);
    assert_eq!(H100.ms(5), 300.0);
    assert_eq!(H100.capacity(300.0), 5);
    assert_eq!(H100.capacity(299.0), 4);
    assert_eq!(H100.capacity(10.0), 1, "an engine always takes one");
    let t = TransferModel { alpha_ms: 2.0, mib_per_s: 500.0 };
    assert!((t.ms(50 << 20) - 102.0).abs() < 1e-9, "α + bytes/β");
}

#[test]
fn assignment_minimises_the_resulting_bottleneck_and_prefers_the_less_loaded() {
    // An idle A100 (240 ms) against an H100 with one session (150 → 187.5):
    // both under the bottleneck of the busy third engine: the less loaded.
    let gpus = [gpu(H100, 5), gpu(A100, 3), gpu(H100, 5)];
    assert_eq!(assign(&gpus, &[1, 0, 4]), Some(1));
    // Nothing busy: the lower ℓ̂(n + 1) wins the bottleneck outright.
    assert_eq!(assign(&gpus, &[1, 0, 0]), Some(2));
    // No room anywhere: still placed, on the lowest ℓ̂(n + 1).
    let full = [gpu(H100, 1), gpu(A100, 1)];
    assert_eq!(assign(&full, &[1, 1]), Some(0));
    // Closed engines never take a session; none open: nowhere.
    let mut closed = gpus;
    closed[1].open = false;
    assert_eq!(assign(&closed, &[1, 0, 4]), Some(0));
    assert_eq!(assign(&[Gpu { open: false, ..gpu(H100, 5) }], &[0]), None);
}

#[test]
fn rebalancing_moves_off_the_bottleneck_only_while_the_gain_is_positive() {
    let gpus = [gpu(H100, 6), gpu(H100, 6), gpu(H100, 6)];
    let plan = rebalance(&gpus, &sessions(&[6, 1, 2], 1 << 20), &params(0.05));
    assert_eq!(plan.load, vec![3, 3, 3]);
    assert_eq!(plan.before_ms, H100.ms(6));
    assert_eq!(plan.after_ms, H100.ms(3));
    assert!(plan.moves.iter().all(|m| m.from == 0));
    // A state so large that moving it costs more than it gains: no move.
    let plan = rebalance(&gpus, &sessions(&[6, 1, 2], 8 << 30), &params(0.05));
    assert!(plan.moves.is_empty(), "{plan:?}");
    assert_eq!(plan.after_ms, plan.before_ms);
    // Sessions that may not move (cooldown, a move in flight) stay.
    let mut pinned = sessions(&[6, 1, 2], 1 << 20);
    pinned.iter_mut().for_each(|s| s.movable = false);
    assert!(rebalance(&gpus, &pinned, &params(0.05)).moves.is_empty());
}

#[test]
fn ties_at_the_bottleneck_move_together() {
    // [3, 3, 0, 0]: moving one session off one engine leaves L unchanged;
    // one off each lowers it.
    let gpus = [gpu(H100, 5); 4];
    let plan = rebalance(&gpus, &sessions(&[3, 3, 0, 0], 1 << 20), &params(0.0));
    assert_eq!(plan.after_ms, H100.ms(2));
    assert_eq!(plan.load.iter().sum::<u32>(), 6);
}

#[test]
fn closed_engines_are_evacuated_whatever_the_gain() {
    let mut gpus = [gpu(H100, 5); 3];
    gpus[2].open = false;
    let plan = rebalance(&gpus, &sessions(&[1, 1, 3], 8 << 30), &params(10.0));
    assert_eq!(plan.load[2], 0);
    assert_eq!(plan.moves.len(), 3);
    assert!(plan.moves.iter().all(|m| m.from == 2 && m.to != 2));
}

/// Random clusters of H100s and A100s with random loads.
fn random_case(rng: &mut SplitMix, engines: usize, most: u32) -> (Vec<Gpu>, Vec<u32>) {
    let gpus: Vec<Gpu> =
        (0..engines).map(|_| if rng.unit_f64() < 0.5 { gpu(H100, 8) } else { gpu(A100, 6) }).collect();
    let load = (0..engines).map(|_| (rng.next_u64() % u64::from(most + 1)) as u32).collect();
    (gpus, load)
}

#[test]
fn every_applied_move_lowers_the_bottleneck_and_no_plan_loses_a_session() {
    let mut rng = SplitMix(7);
    for _ in 0..300 {
        let (gpus, load) = {
            let e = 2 + (rng.next_u64() % 7) as usize;
            random_case(&mut rng, e, 6)
        };
        let ss = sessions(&load, (rng.next_u64() % (64 << 20)) + 1);
        let p = params(rng.unit_f64() * 0.2);
        let plan = rebalance(&gpus, &ss, &p);
        assert_eq!(plan.load.iter().sum::<u32>(), load.iter().sum::<u32>());
        assert!(plan.after_ms <= plan.before_ms);
        // Replaying the plan move by move never raises the bottleneck, and
        // its total gain is positive.
        let mut now = load.clone();
        for m in &plan.moves {
            let before = bottleneck_ms(&gpus, &now);
            now[m.from] -= 1;
            now[m.to] += 1;
            assert!(bottleneck_ms(&gpus, &now) <= before + 1e-9, "{m:?} raised the bottleneck");
            assert!(now[m.to] <= gpus[m.to].capacity, "a move overfilled engine {}", m.to);
        }
        assert_eq!(now, plan.load);
        if !plan.moves.is_empty() {
            let kappa: f64 = plan.moves.iter().map(|m| m.cost_ms).sum();
            assert!(plan.before_ms - plan.after_ms - p.eta * kappa > 0.0, "a plan with non-positive gain");
        }
        // Each session moves at most once per plan.
        let mut moved: Vec<u64> = plan.moves.iter().map(|m| m.session).collect();
        moved.sort_unstable();
        moved.dedup();
        assert_eq!(moved.len(), plan.moves.len());
    }
}

#[test]
fn without_a_migration_penalty_the_local_search_reaches_the_oracle() {
    let mut rng = SplitMix(11);
    for _ in 0..200 {
        let (mut gpus, load) = {
            let e = 2 + (rng.next_u64() % 5) as usize;
            random_case(&mut rng, e, 5)
        };
        for g in &mut gpus {
            g.capacity = 64; // room everywhere: the oracle ignores capacity
        }
        let n = load.iter().sum::<u32>();
        let plan =
            rebalance(&gpus, &sessions(&load, 1), &PlaceParams { eta: 0.0, transfer: FREE, max_moves: 4096 });
        let best = oracle_ms(&gpus, n);
        assert!((plan.after_ms - best).abs() < 1e-9, "{load:?}: {} vs oracle {best}", plan.after_ms);
    }
}

#[test]
fn with_the_shipped_penalty_the_gap_to_the_oracle_stays_within_seven_percent() {
    let mut rng = SplitMix(3);
    let cfg = FleetConfig::default();
    let mut gaps = Vec::new();
    for _ in 0..200 {
        let (mut gpus, load) = {
            let e = 2 + (rng.next_u64() % 5) as usize;
            random_case(&mut rng, e, 5)
        };
        for g in &mut gpus {
            g.capacity = 64;
        }
        // States of a few MiB to a few hundred (the emulated model's are
        // ~1 MiB; long-context ones reach hundreds).
        let ss = sessions(&load, (1 << 20) + rng.next_u64() % (256 << 20));
        let plan = rebalance(&gpus, &ss, &cfg.params());
        let best = oracle_ms(&gpus, load.iter().sum());
        gaps.push(if best > 0.0 { plan.after_ms / best - 1.0 } else { 0.0 });
    }
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!(mean <= 0.07, "mean gap {mean}");
}

#[test]
fn the_oracle_is_exhaustive() {
    // 5 sessions on an H100 and an A100: (3, 2) → max(200, 312) = 312;
    // (4, 1) → max(262.5, 240) = 262.5, the best.
    assert_eq!(oracle_ms(&[gpu(H100, 9), gpu(A100, 9)], 5), 262.5);
    assert_eq!(oracle_ms(&[gpu(H100, 9)], 0), 0.0);
}

fn load(rho_max: f64, required: u32, engines: u32, activations: u64) -> Load {
    Load { rho_max, required, engines, capacity: 5, activations }
}

#[test]
fn the_scaler_holds_inside_the_band_and_tracks_the_target_outside_it() {
    let cfg = FleetConfig {
        levels: vec![Level { above: 0.0, target_utilization: 0.6, lambda: 0.2, engines: 0 }],
        ..FleetConfig::default()
    };
    let mut s = Scaler::new();
    let l_of = |m: u32| bottleneck_on(H100, m, 30);
    // 30 sessions on 10 engines of K = 5: ρ_max 0.6 = ρ̂: hold.
    let d = s.decide(0.0, &load(0.6, 30, 10, 0), 1e9, l_of, &cfg);
    assert_eq!((d.engines, d.why), (10, ScaleWhy::Hold));
    // Within δ either side: hold (no flapping on noise).
    for rho in [0.52, 0.68] {
        assert_eq!(s.decide(1.0, &load(rho, 30, 10, 0), 1e9, l_of, &cfg).why, ScaleWhy::Hold);
    }
    // Above: out to ⌈N / (K·ρ̂)⌉ = ⌈45 / 3⌉ = 15.
    let d = s.decide(2.0, &load(0.9, 45, 10, 0), 1e9, l_of, &cfg);
    assert_eq!((d.engines, d.why, d.m_target), (15, ScaleWhy::Out, 15));
    // Imbalance alone (N fits the budget) still adds one.
    assert_eq!(s.decide(3.0, &load(1.0, 20, 10, 0), 1e9, l_of, &cfg).engines, 11);
    // Below, but within the cooldown of the last change: hold.
    let d = s.decide(4.0, &load(0.2, 12, 10, 0), 1e9, |m| bottleneck_on(H100, m, 12), &cfg);
    assert_eq!(d.why, ScaleWhy::Hold);
    // After it: in to the target, when the target meets the latency objective.
    let d = s.decide(40.0, &load(0.2, 12, 10, 0), 1e9, |m| bottleneck_on(H100, m, 12), &cfg);
    assert_eq!((d.engines, d.why), (4, ScaleWhy::In));
    // ... and not when L*(M′) would miss L_SLO.
    let d = s.decide(80.0, &load(0.2, 12, 10, 0), 200.0, |m| bottleneck_on(H100, m, 12), &cfg);
    assert_eq!(d.why, ScaleWhy::Hold);
    // A λ that prices latency above engines keeps them.
    let pricey = FleetConfig {
        levels: vec![Level { above: 0.0, target_utilization: 0.6, lambda: 1e5, engines: 0 }],
        ..cfg.clone()
    };
    let d = s.decide(120.0, &load(0.2, 12, 10, 0), 1e9, |m| bottleneck_on(H100, m, 12), &pricey);
    assert_eq!(d.why, ScaleWhy::Hold);
    // Bounds.
    let d = s.decide(160.0, &load(0.6, 30, 300, 0), 1e9, l_of, &cfg);
    assert_eq!((d.engines, d.why), (256, ScaleWhy::Bounds));
}

#[test]
fn bursty_activations_pick_a_lower_target_utilisation() {
    let cfg = FleetConfig::default();
    let (mut calm, mut bursty) = (Scaler::new(), Scaler::new());
    let (mut a, mut b) = (0u64, 0u64);
    let mut last = (0, 0);
    for bin in 0..30u64 {
        a += 4; // four activations every 5 s
        b += if bin % 4 == 0 { 16 } else { 0 }; // the same rate, in bursts
        let t = bin as f64 * 5.0 + 1.0;
        // 50 engines: the table profiled at 64 (five levels).
        let dc = calm.decide(t, &load(0.5, 10, 50, a), 1e9, |_| 0.0, &cfg);
        let db = bursty.decide(t, &load(0.5, 10, 50, b), 1e9, |_| 0.0, &cfg);
        last = (dc.level, db.level);
        if bin > 12 {
            assert!(db.target_utilization < dc.target_utilization, "bin {bin}: {dc:?} vs {db:?}");
        }
    }
    assert_eq!(last.0, 0);
    assert!(last.1 >= 2, "{last:?}");
}

/// The shipped table keyed on the plain std (TurboServe's σ) reads a big
/// fleet's steady arrivals as volatile: 100 ± 5 activations per bin is std
/// 5 (the top row) but dispersion 0.5 (the calm row).
#[test]
fn the_plain_std_keys_the_same_calm_arrivals_by_the_fleet_size() {
    let dispersion = FleetConfig::default();
    let std = FleetConfig { volatility_measure: VolatilityMeasure::Std, ..FleetConfig::default() };
    let (mut d, mut s) = (Scaler::new(), Scaler::new());
    let mut total = 0u64;
    let mut last = (0, 0, 0.0, 0.0);
    for bin in 0..20u64 {
        total += if bin % 2 == 0 { 95 } else { 105 };
        let t = bin as f64 * 5.0 + 1.0;
        let a = d.decide(t, &load(0.5, 100, 40, total), 1e9, |_| 0.0, &dispersion);
        let b = s.decide(t, &load(0.5, 100, 40, total), 1e9, |_| 0.0, &std);
        last = (a.level, b.level, a.volatility, b.volatility);
    }
    let top = std.table(40).len() - 1;
    assert_eq!((last.0, last.1), (0, top), "{last:?}");
    assert!((last.2 - 0.5).abs() < 0.01 && (last.3 - 5.0).abs() < 0.1, "{last:?}");
}

fn row(engines: u32, above: f64, rho: f64) -> Level {
    Level { above, target_utilization: rho, lambda: 0.2, engines }
}

/// Tables profiled at 8, 64 and 256 engines: the scaler reads the one
/// nearest its fleet in ratio, and out-of-order or headless tables are
/// refused at load.
#[test]
fn the_scaler_reads_the_table_profiled_nearest_its_fleet_size() {
    let cfg = FleetConfig {
        levels: vec![
            row(8, 0.0, 0.7),
            row(8, 1.3, 0.45),
            row(64, 0.0, 0.85),
            row(64, 2.3, 0.45),
            row(256, 0.0, 0.85),
        ],
        ..FleetConfig::default()
    };
    cfg.validate().unwrap();
    let first = |m: u32| (cfg.table(m)[0].engines, cfg.table(m).len());
    assert_eq!(first(1), (8, 2));
    assert_eq!(first(22), (8, 2)); // √(8·64) ≈ 22.6 is the turn
    assert_eq!(first(23), (64, 2));
    assert_eq!(first(128), (64, 2));
    assert_eq!(first(129), (256, 1));
    assert_eq!(first(4096), (256, 1));
    // The same calm activations (dispersion 0.5) on 6 engines and on 40.
    let (mut small, mut big) = (Scaler::new(), Scaler::new());
    let (mut total, mut last) = (0u64, (0.0, 0.0));
    for bin in 0..20u64 {
        total += if bin % 2 == 0 { 95 } else { 105 };
        let t = bin as f64 * 5.0 + 1.0;
        let a = small.decide(t, &load(0.5, 20, 6, total), 1e9, |_| 0.0, &cfg);
        let b = big.decide(t, &load(0.5, 150, 40, total), 1e9, |_| 0.0, &cfg);
        last = (a.target_utilization, b.target_utilization);
    }
    assert_eq!(last, (0.7, 0.85));
    let unordered =
        FleetConfig { levels: vec![row(64, 0.0, 0.8), row(8, 0.0, 0.7)], ..FleetConfig::default() };
    assert_eq!(unordered.validate().unwrap_err().0, "video.fleet.levels");
    let headless =
        FleetConfig { levels: vec![row(8, 0.0, 0.8), row(64, 1.0, 0.7)], ..FleetConfig::default() };
    assert_eq!(headless.validate().unwrap_err().0, "video.fleet.levels");
}

#[test]
fn the_shipped_defaults_are_valid_and_bad_values_are_named() {
    FleetConfig::default().validate().unwrap();
    // The code's default tables are the policy file's.
    let doc = crate::PolicyDocument::parse("default.toml", include_str!("../../../default.toml")).unwrap();
    assert_eq!(doc.video.fleet.levels, FleetConfig::default().levels);
    let bad = FleetConfig {
        levels: vec![Level { above: 1.0, target_utilization: 0.5, lambda: 0.2, engines: 0 }],
        ..FleetConfig::default()
    };
    assert_eq!(bad.validate().unwrap_err().0, "video.fleet.levels");
    let bad = FleetConfig { transfer_mib_per_s: 0.0, ..FleetConfig::default() };
    assert_eq!(bad.validate().unwrap_err().0, "video.fleet.transfer_mib_per_s");
}

#[test]
fn urgent_rehoming_is_kept_only_where_it_does_not_raise_the_bottleneck() {
    let gpus = [gpu(H100, 5); 3];
    // [3, 3, 1] stays (L = ℓ̂(3) = 225 ms; one off each of the two
    // bottleneck engines would only move it).
    let plan = rebalance(&gpus, &sessions(&[3, 3, 1], 1 << 20), &params(0.05));
    assert_eq!((plan.load.clone(), plan.after_ms), (vec![3, 3, 1], 225.0));
    // URGENT moves into engine 2: to 2 streams (187.5 ms) and to 3 (225)
    // are kept, to 4 (262.5) would make it the bottleneck; the move back
    // to engine 1 is judged on the loads the kept ones left. A closed
    // engine never receives.
    let kept = admit_rehoming(&gpus, &plan, &[(0, 2), (1, 2), (0, 2), (2, 1)]);
    assert_eq!(kept, vec![true, true, false, true]);
    let mut closed = gpus;
    closed[2].open = false;
    assert_eq!(admit_rehoming(&closed, &plan, &[(0, 2)]), vec![false]);
}

fn text(serving: u32, warm: u32, why: crate::autoscale::Why) -> crate::autoscale::Decision {
    crate::autoscale::Decision {
        serving,
        warm,
        why,
        utilization: 0.5,
        target_utilization: 0.7,
        m_target: serving,
        level: 0,
        volatility: 0.0,
        burst_factor: 1.0,
    }
}

fn video(engines: u32, why: ScaleWhy) -> ScaleDecision {
    ScaleDecision {
        engines,
        why,
        volatility: 0.0,
        level: 0,
        utilization: 0.9,
        target_utilization: 0.85,
        m_target: engines,
    }
}

#[test]
fn text_and_video_share_a_class_by_the_larger_answer_and_scale_in_only_together() {
    use crate::autoscale::Why;
    // Video needs more: its count and reason win, the text warm pool stays.
    let d = joint(Some(text(2, 1, Why::Hold)), Some(video(4, ScaleWhy::Out))).unwrap();
    assert_eq!((d.serving, d.warm, d.why), (4, 1, Why::VideoUtilization));
    // Text wants to shrink while video holds its engines: nothing shrinks.
    let d = joint(Some(text(1, 0, Why::Quiet)), Some(video(3, ScaleWhy::Hold))).unwrap();
    assert_eq!((d.serving, d.why), (3, Why::Hold));
    // Both shrink: to the larger of the two.
    let d = joint(Some(text(2, 0, Why::Quiet)), Some(video(1, ScaleWhy::In))).unwrap();
    assert_eq!((d.serving, d.why), (2, Why::Quiet));
    // Equal, text holding: the video reason is the one that acted.
    let d = joint(Some(text(3, 0, Why::Hold)), Some(video(3, ScaleWhy::In))).unwrap();
    assert_eq!(d.why, Why::VideoQuiet);
    // One controller alone decides alone; none, nothing.
    let d = joint(None, Some(video(5, ScaleWhy::Out))).unwrap();
    assert_eq!((d.serving, d.warm, d.why), (5, 0, Why::VideoUtilization));
    assert_eq!(joint(Some(text(2, 1, Why::Utilization)), None).unwrap().serving, 2);
    assert!(joint(None, None).is_none());
}

#[test]
fn the_scaler_never_scales_in_below_the_engines_its_live_streams_need() {
    // 10 active streams, K = 4: whatever the quiet, at least ⌈10/4⌉ = 3.
    let mut cfg = FleetConfig { down_cooldown_s: 0.0, max_engines: 16, ..FleetConfig::default() };
    cfg.levels = vec![Level { above: 0.0, target_utilization: 1.0, lambda: 0.0, engines: 0 }];
    let mut s = Scaler::new();
    let lat = ChunkLatency { chunk_ms: 100.0, batch_cost: 0.5 };
    for t in 0..20 {
        let load = Load { rho_max: 0.1, required: 10, engines: 8, capacity: 4, activations: 10 };
        let d = s.decide(f64::from(t) * 10.0, &load, 1e9, |m| bottleneck_on(lat, m, 10), &cfg);
        assert!(d.engines >= 3, "{d:?}");
    }
}

#[test]
fn a_momentary_dip_does_not_collapse_the_fleet_and_a_sustained_quiet_scales_in() {
    let mut cfg =
        FleetConfig { down_cooldown_s: 0.0, down_sustain_s: 10.0, max_engines: 16, ..FleetConfig::default() };
    cfg.levels = vec![Level { above: 0.0, target_utilization: 0.7, lambda: 0.2, engines: 0 }];
    let lat = ChunkLatency { chunk_ms: 600.0, batch_cost: 0.3 };
    // Busy: 6 streams on 8 engines of K = 1 (ρ_max 0.75, inside the band);
    // quiet: none.
    let load =
        |n: u32| Load { rho_max: f64::from(n) / 8.0, required: n, engines: 8, capacity: 1, activations: 0 };
    let mut s = Scaler::new();
    let step =
        |s: &mut Scaler, t: f64, n: u32| s.decide(t, &load(n), 750.0, |m| bottleneck_on(lat, m, n), &cfg);
    // Busy, then one second with no stream, then busy again.
    assert_eq!(step(&mut s, 0.0, 6).why, ScaleWhy::Hold);
    assert_eq!(step(&mut s, 1.0, 0).why, ScaleWhy::Hold, "the dip starts the clock only");
    assert_eq!(step(&mut s, 2.0, 6).why, ScaleWhy::Hold);
    // Quiet from t = 3: nothing before t = 13, then straight to M_target.
    for t in 3..13 {
        assert_eq!(step(&mut s, f64::from(t), 0).engines, 8, "t = {t}");
    }
    let d = step(&mut s, 13.0, 0);
    assert_eq!((d.why, d.engines), (ScaleWhy::In, 1));
}
