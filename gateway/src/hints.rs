//! Sends the active policy version's batch-formation hints (`[batching]`
//! plus the routing lane, see `policies::batching::BatchHints`) to every
//! engine: before the listener opens, after every reload, when an engine
//! becomes ready again, and every [`REFRESH`] as a safety net (an engine that
//! restarted between two readiness probes). Engines apply them from their
//! next batch; a failed push is logged and retried on the next pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use policies::batching::BatchHints;
use policies::PolicyDocument;
use tokio::sync::watch;

use crate::engines::{join, EnginePool};

/// Every hint is re-sent this often even when nothing changed.
const REFRESH: Duration = Duration::from_secs(30);
/// How often readiness changes are looked for.
const CHECK: Duration = Duration::from_secs(1);
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `hints` to every ready engine; returns the indices that took them.
pub async fn push_all(pool: &EnginePool, hints: &BatchHints) -> Vec<usize> {
    let mut ok = Vec::new();
    for idx in 0..pool.len() {
        if pool.slot(idx).is_ready() && push(pool, idx, hints).await {
            ok.push(idx);
        }
    }
    ok
}

async fn push(pool: &EnginePool, idx: usize, hints: &BatchHints) -> bool {
    let slot = pool.slot(idx);
    let spec = &slot.spec;
    if spec.kind != crate::engines::EngineKind::Native {
        return true; // third-party engines batch by their own settings
    }
    let Some(uri) = join(&spec.url, engine_api::BATCHING_PATH) else { return false };
    let body = serde_json::to_vec(hints).expect("hints serialise");
    let req = http::Request::put(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Bytes::from(body))
        .expect("valid request parts");
    let sent = tokio::time::timeout(PUSH_TIMEOUT, async {
        let resp = pool.send(req, &slot).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
        }
    })
    .await
    .unwrap_or_else(|_| Err("timed out".into()));
    match sent {
        Ok(()) => {
            tracing::debug!(event = "batching_hints_sent", engine = %spec.id);
            true
        }
        Err(e) => {
            tracing::warn!(event = "batching_hints_failed", engine = %spec.id, error = %e);
            false
        }
    }
}

/// Keeps every engine on the active version's hints; spawn it.
pub async fn follow(pool: Arc<EnginePool>, mut versions: watch::Receiver<Arc<PolicyDocument>>) {
    // What each engine last took from us, and when.
    let mut sent: HashMap<usize, (BatchHints, tokio::time::Instant)> = HashMap::new();
    let mut ticks = tokio::time::interval(CHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hints = versions.borrow_and_update().engine_hints();
        for idx in 0..pool.len() {
            if !pool.slot(idx).is_ready() {
                sent.remove(&idx); // it gets them again once it is back
                continue;
            }
            let fresh = sent.get(&idx).is_some_and(|(h, at)| *h == hints && at.elapsed() < REFRESH);
            if !fresh && push(&pool, idx, &hints).await {
                sent.insert(idx, (hints.clone(), tokio::time::Instant::now()));
            }
        }
        tokio::select! {
            _ = ticks.tick() => {}
            changed = versions.changed() => if changed.is_err() { return },
        }
    }
}
