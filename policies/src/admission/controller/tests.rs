//! The state machine in virtual time: the same events give the same
//! decisions, the gate binds late and expires on time, tenants' open
//! counts follow admissions and releases.

use super::*;
use crate::admission::fixtures::{engines, policy, req};

#[test]
fn a_free_slot_starts_at_once_and_a_full_fleet_waits_at_the_gate() {
    let p = policy();
    let mut ctl = Controller::new();
    let free = engines(&mut ctl, 2, 8, 0);
    match ctl.request(0.0, &p, &req(&p, "gold", "a", 100, 100), &free, &[]) {
        Outcome::Start { engine, admit } => {
            assert!(engine < 2);
            assert_eq!(admit.reason(), "slo_feasible");
            assert_eq!(admit.work.prompt_tokens, 100);
        }
        o => panic!("{o:?}"),
    }
    let full = engines(&mut ctl, 2, 8, 8);
    let Outcome::Wait { id, deadline, .. } =
        ctl.request(1.0, &p, &req(&p, "gold", "a", 100, 100), &full, &[])
    else {
        panic!("a full fleet with a short queue makes the request wait")
    };
    assert!(deadline > 1.0 && deadline <= 1.0 + ms(p.tiers[0].ttft.max(p.tiers[2].ttft)) / 1e3);
    assert_eq!(ctl.waiting(), 1);
    // No slot yet: nothing granted. A slot frees: it goes to the waiter.
    assert!(ctl.pump(1.05, &p, &full, |_| true).is_empty());
    let one_free = engines(&mut ctl, 2, 8, 7);
    let grants = ctl.pump(1.1, &p, &one_free, |_| true);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].id, id);
    assert!(grants[0].result.is_ok());
    assert_eq!(ctl.waiting(), 0);
}

#[test]
fn a_waiter_past_its_deadline_is_refused_at_the_tick_and_one_that_waited_too_long_at_its_turn() {
    let p = policy();
    let mut ctl = Controller::new();
    let full = engines(&mut ctl, 1, 8, 8);
    let Outcome::Wait { id, deadline, .. } = ctl.request(0.0, &p, &req(&p, "gold", "a", 100, 50), &full, &[])
    else {
        panic!()
    };
    let (_, expired) = ctl.tick(deadline - 1e-3, &p);
    assert!(expired.is_empty(), "not yet");
    let (_, expired) = ctl.tick(deadline + 1e-3, &p);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].id, id);
    assert_eq!(expired[0].result.as_ref().unwrap_err().reason, Reason::QueueTimeout);
    // Turn comes after nearly the whole budget: prefill cannot fit.
    let o = ctl.request(10.0, &p, &req(&p, "silver", "a", 1500, 50), &full, &[]);
    let Outcome::Wait { deadline, .. } = o else { panic!("{o:?}") };
    let free = engines(&mut ctl, 1, 8, 0);
    let grants = ctl.pump(deadline - 1e-4, &p, &free, |_| true);
    let refusal = grants[0].result.as_ref().unwrap_err();
    assert_eq!(refusal.reason, Reason::DeadlineUnreachable);
    assert!(refusal.waited_ms > 0.0 && refusal.prefill_ms > 0.0);
}

#[test]
fn a_gone_waiter_never_takes_a_slot() {
    let p = policy();
    let mut ctl = Controller::new();
    let full = engines(&mut ctl, 1, 8, 8);
    let Outcome::Wait { id: gone, .. } = ctl.request(0.0, &p, &req(&p, "gold", "a", 100, 50), &full, &[])
    else {
        panic!()
    };
    let Outcome::Wait { id: kept, .. } = ctl.request(0.0, &p, &req(&p, "gold", "a", 100, 50), &full, &[])
    else {
        panic!()
    };
    let one_free = engines(&mut ctl, 1, 8, 7);
    let grants = ctl.pump(0.01, &p, &one_free, |id| id != gone);
    assert_eq!(grants.iter().map(|g| g.id).collect::<Vec<_>>(), vec![kept]);
}

#[test]
fn tenant_concurrency_counts_admissions_and_releases() {
    let mut p = policy();
    p.tiers[0].max_concurrency = std::num::NonZeroU32::new(2);
    let gold = p.tiers[0].name.clone();
    let mut ctl = Controller::new();
    let free = engines(&mut ctl, 4, 8, 0);
    for _ in 0..2 {
        assert!(matches!(
            ctl.request(0.0, &p, &req(&p, &gold, "t", 50, 50), &free, &[]),
            Outcome::Start { .. }
        ));
    }
    match ctl.request(0.0, &p, &req(&p, &gold, "t", 50, 50), &free, &[]) {
        Outcome::Refuse(r) => {
            assert_eq!(r.reason, Reason::TenantConcurrency);
            assert_eq!(r.limit, 2);
        }
        o => panic!("{o:?}"),
    }
    assert!(matches!(ctl.request(0.0, &p, &req(&p, &gold, "u", 50, 50), &free, &[]), Outcome::Start { .. }));
    ctl.release("t");
    assert_eq!(ctl.open("t"), 1);
    assert!(matches!(ctl.request(0.0, &p, &req(&p, &gold, "t", 50, 50), &free, &[]), Outcome::Start { .. }));
}

#[test]
fn the_same_events_give_the_same_decisions() {
    let p = policy();
    let run = || {
        let mut ctl = Controller::new();
        let mut out = Vec::new();
        for i in 0..400u32 {
            let now = f64::from(i) * 0.01;
            let active = (i % 9).min(8);
            let es = engines(&mut ctl, 3, 8, active);
            let tier = ["gold", "silver", "bronze"][(i % 3) as usize];
            let o = ctl.request(now, &p, &req(&p, tier, "t", 100 + (i * 37) % 3000, 64 + i % 500), &es, &[]);
            out.push(format!("{o:?}"));
            if i % 5 == 0 {
                ctl.finished(&p, "t", "m", Some(0), (100, 0), 40 + i % 300, 12.0, Some(900.0), 4.0);
                ctl.release("t");
            }
            if i % 25 == 0 {
                out.push(format!("{:?}", ctl.tick(now, &p)));
            }
            let es = engines(&mut ctl, 3, 8, 7);
            out.push(format!("{:?}", ctl.pump(now, &p, &es, |_| true)));
        }
        out
    };
    assert_eq!(run(), run());
}

#[test]
fn refusal_labels_are_distinct() {
    let labels: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.label()).collect();
    assert_eq!(labels.len(), Reason::ALL.len());
}

#[test]
fn oserve_routes_send_each_type_to_its_classes_and_fall_back_without_a_ready_one() {
    use crate::oserve::assign::Assignment;
    use crate::oserve::route::Routes;
    use crate::oserve::{OserveConfig, TypeCentroid};
    let mut p = policy();
    let t = |name: &str, input: f64| TypeCentroid { name: name.into(), input, output: 100.0 };
    p.oserve = OserveConfig { types: vec![t("short", 100.0), t("long", 4000.0)], ..Default::default() };
    let mut ctl = Controller::new();
    let mut fleet = engines(&mut ctl, 2, 8, 0); // class 0: the bundled profile's
    let mut other = crate::admission::fixtures::profile();
    other.engine_class = "tp4".into();
    let tp4 = ctl.class_of(&other);
    let first = fleet[0].clone();
    fleet.extend((2..4).map(|idx| Candidate { idx, class: tp4, ..first.clone() }));
    // The assignment: short requests on replica 0 (the bundled class), long
    // ones 3:1 on replica 1 (tp4) and replica 0.
    let a = Assignment { x: vec![vec![4.0, 1.0], vec![0.0, 3.0]], served: 8.0, load: vec![1.0, 1.0] };
    let names = vec![fleet_class(&ctl, 0), "tp4".to_string()];
    ctl.set_routes(Some(Routes::from_assignment(names, &[0, 1], 2, &a)));
    let class_of = |o: &Outcome| match o {
        Outcome::Start { engine, .. } => fleet[*engine].class,
        o => panic!("{o:?}"),
    };
    let mut long_on_tp4 = 0;
    for i in 0..8 {
        let short = ctl.request(f64::from(i), &p, &req(&p, "gold", "a", 100, 100), &fleet, &[]);
        assert_eq!(class_of(&short), 0, "short requests have no share on tp4");
        assert!(matches!(&short, Outcome::Start { admit, .. } if admit.work_type == Some(0)));
        let long = ctl.request(f64::from(i), &p, &req(&p, "gold", "a", 4000, 100), &fleet, &[]);
        long_on_tp4 += usize::from(class_of(&long) == tp4);
    }
    assert_eq!(long_on_tp4, 6, "3:1 over 8 long requests");
    // No tp4 engine ready: long requests go where a share remains.
    let only_first: Vec<Candidate> = fleet.iter().filter(|e| e.class == 0).cloned().collect();
    let long = ctl.request(9.0, &p, &req(&p, "gold", "b", 4000, 100), &only_first, &[]);
    assert!(matches!(long, Outcome::Start { engine, .. } if engine < 2));
    // Routes cleared: the primary class (the first ready engine's) again.
    ctl.set_routes(None);
    let long = ctl.request(10.0, &p, &req(&p, "gold", "b", 4000, 100), &fleet, &[]);
    assert_eq!(class_of(&long), 0);
}

fn fleet_class(ctl: &Controller, class: usize) -> String {
    ctl.model(class).unwrap().class.clone()
}

#[test]
fn the_queue_signal_is_observed_gate_waits_not_predictions() {
    let p = policy();
    let min = p.brownout.min_samples;
    let mut ctl = Controller::new();
    let full = engines(&mut ctl, 2, 8, 8);
    let one_free = engines(&mut ctl, 2, 8, 7);
    // Every request predicted to wait at the gate, every one granted a
    // slot 10 ms later: the prediction said "queue", the fleet did not.
    for i in 0..min {
        let t = i as f64;
        let o = ctl.request(t, &p, &req(&p, "silver", "a", 100, 100), &full, &[]);
        assert!(matches!(o, Outcome::Wait { .. }), "{o:?}");
        assert_eq!(ctl.pump(t + 0.01, &p, &one_free, |_| true).len(), 1);
    }
    let quiet = ctl.queue_ratio_p95(min as f64, &p).expect("enough samples");
    assert!(quiet < 0.05, "10 ms of a 1 s budget: {quiet}");
    // The same requests granted after 800 ms: observed waits of 0.8.
    for i in 0..min {
        let t = 100.0 + i as f64;
        ctl.request(t, &p, &req(&p, "silver", "a", 100, 100), &full, &[]);
        assert_eq!(ctl.pump(t + 0.8, &p, &one_free, |_| true).len(), 1);
    }
    let busy = ctl.queue_ratio_p95(100.0 + min as f64, &p).unwrap();
    assert!((0.75..0.85).contains(&busy), "{busy}");
    // The window is `queue_window_s`: long after, no samples, no signal.
    assert_eq!(ctl.queue_ratio_p95(1000.0, &p), None);
    // Started at once: zero waits.
    let free = engines(&mut ctl, 2, 8, 0);
    for i in 0..min {
        ctl.request(2000.0 + i as f64 * 0.1, &p, &req(&p, "silver", "a", 100, 100), &free, &[]);
    }
    assert_eq!(ctl.queue_ratio_p95(2000.0 + min as f64 * 0.1, &p), Some(0.0));
}
