//! The gate in tokio's paused time: the engine is a slot of the registry
//! (ready, with a profile) and nothing else, so what is measured is the
//! gateway's own waiting, in virtual time.

use std::sync::Arc;
use std::time::Duration;

use policies::PolicyDocument;

use super::*;
use crate::engines::{EnginePool, EngineSpec};

fn policy() -> PolicyDocument {
    PolicyDocument::parse("default.toml", include_str!("../../../policies/default.toml")).unwrap()
}

/// A pool of one ready engine (one batch slot: it reports nothing) with
/// the bundled A100 profile.
fn one_engine() -> Arc<EnginePool> {
    let spec = EngineSpec::native("e0", "http://127.0.0.1:9".parse().unwrap());
    let pool = EnginePool::new(vec![spec], &crate::limits::Limits::default(), None);
    let profile = policies::LatencyProfile::parse(
        "a100",
        include_str!("../../../policies/profiles/emulated-a100-8b.toml"),
    )
    .unwrap();
    pool.slot(0).set_ready(true);
    pool.slot(0).set_profile(profile);
    pool
}

fn ask<'a>(policy: &'a PolicyDocument) -> AdmitRequest<'a> {
    let (tenant, tier) = policy.authenticate("sk-demo-gold").unwrap();
    AdmitRequest {
        tenant,
        tier,
        model: "synthetic-small",
        prompt_tokens: 16,
        max_tokens: 16,
        sampling: false,
        ttft_hint: None,
        e2e_hint: None,
        upstream_only: false,
        prefix: &[],
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_slot_freed_before_its_deadline_and_is_refused_at_it() {
    let policy = policy();
    let adm = Admission::new(one_engine());
    let first = adm.admit(&policy, &ask(&policy)).unwrap();
    let Start::Now(lease) = first.start else { panic!("the free slot is taken at once: {:?}", first.start) };
    // The second waits at the gate with the tier's TTFT budget.
    let second = adm.admit(&policy, &ask(&policy)).unwrap();
    let Start::Wait(rx, deadline, _) = second.start else { panic!("the second waits: {:?}", second.start) };
    let budget = deadline - tokio::time::Instant::now();
    assert!(budget > Duration::from_millis(100), "{budget:?}");
    // 50 ms of virtual time later the first ends: the gate task hands its
    // slot to the waiter, at once.
    let (_versions, version) = tokio::sync::watch::channel(Arc::new(policy.clone()));
    let gate = tokio::spawn(Arc::clone(&adm).run(version));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let freed_at = tokio::time::Instant::now();
    drop(lease);
    let granted = tokio::time::timeout_at(deadline, rx).await.expect("before the deadline").unwrap();
    assert!(granted.is_ok(), "the freed slot goes to the waiter");
    assert_eq!(
        tokio::time::Instant::now(),
        freed_at,
        "no virtual time passes between the free and the grant"
    );
    // A third, with the slot held again, is refused when its deadline
    // passes: exactly then, in virtual time.
    let third = adm.admit(&policy, &ask(&policy)).unwrap();
    let Start::Wait(rx, deadline, _) = third.start else { panic!("the third waits: {:?}", third.start) };
    let waited = tokio::time::timeout_at(deadline, rx).await;
    assert!(waited.is_err(), "nobody frees the slot: the wait times out");
    assert_eq!(tokio::time::Instant::now(), deadline);
    gate.abort();
}

/// The gateway's whole admission decision (the registry snapshot read into
/// candidates, the state machine's decision, the lease) at 256 engines.
/// A micro-benchmark, not a test (timings need a release build and a quiet
/// machine): `cargo test --release -p gateway --lib admission_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn admission_cost_at_256_engines() {
    let policy = policy();
    let specs = (0..256)
        .map(|i| {
            EngineSpec::native(format!("e{i}"), format!("http://127.0.0.1:{}", 10_000 + i).parse().unwrap())
        })
        .collect();
    let pool = EnginePool::new(specs, &crate::limits::Limits::default(), None);
    let profile = policies::LatencyProfile::parse(
        "a100",
        include_str!("../../../policies/profiles/emulated-a100-8b.toml"),
    )
    .unwrap();
    for i in 0..256 {
        pool.slot(i).set_ready(true);
        pool.slot(i).set_profile(profile.clone());
    }
    let adm = Admission::new(pool);
    let mut held = std::collections::VecDeque::new();
    let mut us = Vec::new();
    for n in 0..20_000 {
        let t = crate::clock::now();
        let a = adm.admit(&policy, &ask(&policy));
        us.push(crate::clock::since(t).as_secs_f64() * 1e6);
        // Keep ~128 requests open (half the engines busy), as under load.
        held.push_back(a);
        if held.len() > 128 || n % 7 == 0 {
            held.pop_front();
        }
    }
    us.sort_by(f64::total_cmp);
    let q = |p: f64| us[((us.len() - 1) as f64 * p) as usize];
    println!(
        "admission decision, 256 engines: p50 {:.2} us, p99 {:.2} us, max {:.1} us",
        q(0.5),
        q(0.99),
        q(1.0)
    );
}
