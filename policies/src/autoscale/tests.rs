use super::*;

fn cfg() -> AutoscaleConfig {
    AutoscaleConfig { enabled: true, min_engines: 1, max_engines: 16, ..AutoscaleConfig::default() }
}

fn signals(serving: u32, demand: f64, arrivals: u64) -> Signals {
    Signals { serving, slots_per_engine: 8, demand, arrivals, ..Signals::default() }
}

#[test]
fn the_target_tracks_load_with_the_proportional_rule() {
    let c = cfg();
    let mut a = Autoscaler::new();
    // 4 engines x 8 slots, 40 sequences: rho = 1.25 > 0.8 + 0.1.
    let mut t = 0.0;
    let d = a.tick(t, &signals(4, 40.0, 0), &c);
    assert_eq!(d.serving, 4, "the first tick only adopts the fleet");
    let mut change = None;
    while t < 3.0 {
        t += 0.5;
        let d = a.tick(t, &signals(4, 40.0, (t * 10.0) as u64), &c);
        if d.why != Why::Hold {
            change.get_or_insert((t, d.serving, d.why));
        }
    }
    // Sustained for 2 s; M_target = ceil(40 / (8 * 0.8)) = 7.
    assert_eq!(change, Some((2.0, 7, Why::Utilization)));
}

#[test]
fn a_noisy_signal_around_the_target_never_flaps() {
    let c = cfg();
    let mut a = Autoscaler::new();
    let mut changes = 0;
    let mut last = None;
    let mut rng = crate::rng::SplitMix(7);
    for i in 0..20_000 {
        let t = f64::from(i) * 0.25;
        // rho wanders in [0.72, 0.88]: inside the band, never a reason.
        let rho = 0.72 + 0.16 * rng.unit_f64();
        let d = a.tick(t, &signals(4, rho * 32.0, i as u64), &c);
        if last.is_some_and(|l| l != d.serving) {
            changes += 1;
        }
        last = Some(d.serving);
    }
    assert_eq!(changes, 0);
}

#[test]
fn spikes_shorter_than_the_sustain_time_do_not_scale_out_and_scale_in_waits_for_every_window() {
    let c = cfg();
    let mut a = Autoscaler::new();
    let mut serving = 6;
    let mut t = 0.0;
    let mut history = Vec::new();
    for i in 0..4000u32 {
        t = f64::from(i) * 0.25;
        // One-second spikes every 30 s over a low base.
        let spike = (t % 30.0) < 1.0;
        let demand = if spike { 60.0 } else { 8.0 };
        let d = a.tick(t, &signals(serving, demand, u64::from(i)), &c);
        if d.serving != serving {
            history.push((t, d.serving, d.why));
        }
        serving = d.serving;
    }
    assert!(history.iter().all(|(_, _, w)| *w == Why::Quiet), "{history:?}");
    // A window holding a spike is not quiet; with 10 s windows two of
    // three are, but never three in a row.
    assert!(history.is_empty(), "{history:?} (t = {t})");
}

#[test]
fn quiet_load_scales_in_one_step_at_a_time_after_the_windows_and_cooldown() {
    let c = cfg();
    let mut a = Autoscaler::new();
    let mut serving = 8;
    let mut steps = Vec::new();
    for i in 0..2400u32 {
        let t = f64::from(i) * 0.25;
        let d = a.tick(t, &signals(serving, 6.0, u64::from(i)), &c);
        if d.serving != serving {
            steps.push((t, d.serving));
        }
        serving = d.serving;
    }
    assert!(!steps.is_empty());
    assert!(steps[0].0 >= 30.0, "3 windows of 10 s first: {steps:?}");
    // 8 -> 6 (a quarter) -> 5 -> 4 ... one step per cooldown at most.
    assert_eq!(steps[0].1, 6, "{steps:?}");
    assert!(steps.windows(2).all(|w| w[1].1 < w[0].1 && w[1].0 - w[0].0 >= 30.0), "{steps:?}");
    assert_eq!(steps.last().unwrap().1, 1, "6 sequences fit one engine at rho_hat: {steps:?}");
}

#[test]
fn queue_latency_scales_out_even_when_utilization_looks_fine() {
    let c = cfg();
    let mut a = Autoscaler::new();
    let s = Signals { queue_ratio_p95: Some(0.9), ..signals(4, 16.0, 0) };
    let mut whys = vec![a.tick(0.0, &s, &c).why];
    let mut d = None;
    for i in 1..=12 {
        let x = a.tick(f64::from(i) * 0.25, &s, &c);
        whys.push(x.why);
        d = Some(x);
    }
    assert_eq!(d.unwrap().serving, 5);
    assert!(whys.contains(&Why::QueueLatency), "{whys:?}");
}

#[test]
fn engines_still_starting_count_so_a_cold_start_does_not_scale_out_twice() {
    let c = cfg();
    let mut a = Autoscaler::new();
    // 4 serving, demand 40: out to 7. The 3 new ones take 30 s to start;
    // meanwhile the serving count stays 4 and the demand 40.
    let mut targets = Vec::new();
    for i in 0..120 {
        let d = a.tick(f64::from(i) * 0.25, &signals(4, 40.0, 0), &c);
        targets.push(d.serving);
    }
    assert_eq!(*targets.last().unwrap(), 7, "{targets:?}");
}

#[test]
fn warm_pool_is_burst_rate_times_cold_start_with_margin() {
    let c = cfg();
    // 8 serving, burst x3 over 30 s: 16 engines more in 30 s, 0.533/s;
    // cold start 10 s: 5.33 engines, x1.25 = 6.67 -> 7.
    assert_eq!(warm_pool(8, 3.0, Some(10.0), &c), 7);
    // Half the cold start, about half the pool.
    assert_eq!(warm_pool(8, 3.0, Some(5.0), &c), 4);
    // A cold start longer than the ramp is capped: the whole burst.
    assert_eq!(warm_pool(4, 3.0, Some(300.0), &c), 8.min(c.max_engines - 4));
    assert_eq!(warm_pool(8, 1.0, Some(10.0), &c), 0, "no burst expected, no pool");
    assert_eq!(warm_pool(15, 3.0, Some(10.0), &c), 1, "bounded by max_engines");
}

#[test]
fn volatile_arrivals_lower_the_target_utilization() {
    let c = cfg();
    let run = |bursty: bool| {
        let mut a = Autoscaler::new();
        let mut arrivals = 0u64;
        let mut d = None;
        for i in 0..400 {
            let t = f64::from(i) * 0.25;
            arrivals += if bursty && (t % 20.0) < 5.0 {
                40
            } else if bursty {
                0
            } else {
                10
            };
            d = Some(a.tick(t, &signals(4, 16.0, arrivals), &c));
        }
        d.unwrap()
    };
    let (steady, bursty) = (run(false), run(true));
    assert_eq!(steady.level, 0);
    assert!(bursty.level > steady.level && bursty.target_utilization < steady.target_utilization);
}

#[test]
fn restart_backoff_doubles_to_its_cap() {
    let c = cfg();
    let d: Vec<f64> = (0..7).map(|i| restart_delay_s(i, &c)).collect();
    assert_eq!(d, vec![1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]);
}

#[test]
fn the_shipped_defaults_are_valid_and_bad_values_are_named() {
    assert!(AutoscaleConfig::default().validate().is_ok());
    let bad = AutoscaleConfig { min_engines: 5, max_engines: 2, ..AutoscaleConfig::default() };
    assert_eq!(bad.validate().unwrap_err().0, "autoscale.max_engines");
    let mut bad = AutoscaleConfig::default();
    bad.levels[1].above = 0.0;
    assert_eq!(bad.validate().unwrap_err().0, "autoscale.levels");
}
