use super::*;

fn setup(transfer: Transfer) -> Setup {
    let mut fleet = FleetConfig { max_engines: 64, transfer_mib_per_s: 10_000.0, ..FleetConfig::default() };
    fleet.autoscale = true;
    Setup {
        latency: ChunkLatency { chunk_ms: 300.0, batch_cost: 0.3 },
        slo_ms: 670.0,
        chunk_s: 0.75,
        fleet,
        cold_start_s: 5.0,
        gpu_hour: 3.0,
        state_mib: 64.0,
        growth_mib: 0.5,
        window_chunks: 8.0,
        transfer,
        warmup_s: 0.0,
    }
}

fn t1(engines: u32) -> Trace {
    let spec = trace::spec("t1").unwrap();
    trace::generate(&spec, f64::from(engines) * 5.0 * 0.6 / spec.peak_active(), 3.0, 1)
}

#[test]
fn the_closed_loop_meets_the_chunk_target_that_fixed_placements_miss_at_the_same_cost() {
    let s = setup(Transfer::Async);
    let trace = t1(64);
    let ours = run(&s, &trace, Arm::Ours, 20, false);
    assert!(ours.worst_ms <= s.slo_ms, "{ours:?}");
    assert!(ours.migrations > 0 && ours.scale_outs > 0 && ours.scale_ins > 0, "{ours:?}");
    let same_cost = (ours.mean_engines.round() as u32).max(1);
    for arm in [Arm::Base, Arm::Lag, Arm::Mag] {
        let fixed = run(&s, &trace, arm, same_cost, false);
        assert!(fixed.worst_ms > ours.worst_ms, "{arm:?}: {fixed:?}");
        assert!((fixed.mean_engines - f64::from(same_cost)).abs() < 1e-6);
    }
}

#[test]
fn engines_are_billed_from_the_ask_and_sync_transfers_stall_longer() {
    let trace = t1(16);
    let (sync, asyn) = (
        run(&setup(Transfer::Sync), &trace, Arm::Ours, 4, false),
        run(&setup(Transfer::Async), &trace, Arm::Ours, 4, false),
    );
    assert!(sync.migration_stall_ms_mean > asyn.migration_stall_ms_mean * 2.0, "{sync:?} {asyn:?}");
    // A fixed fleet pays for every engine all the time.
    let fixed = run(&setup(Transfer::Async), &trace, Arm::Lag, 7, false);
    assert!((fixed.gpu_seconds - 7.0 * trace.duration_s).abs() < 1e-6);
    // The timeline never shows more engines serving than billed, nor
    // more than the budget allows.
    for &(_, billed, serving, _, _) in &asyn.timeline {
        assert!(serving <= billed && billed <= 64);
    }
}
