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
    let spec = EngineSpec { id: "e0".into(), url: "http://127.0.0.1:9".parse().unwrap() };
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
