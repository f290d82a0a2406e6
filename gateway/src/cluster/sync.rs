//! The background side of Redis cluster state, every [`SYNC_EVERY`]: health
//! (a ping, which also renews this gateway's concurrency leases), engine
//! discovery from the registry, the engines' latest load reports, policy
//! convergence, and the leader lease.
//! Nothing here is on the request path.
//!
//! Policy convergence: a change made on this gateway (any trigger) is
//! published; a version published by another gateway is applied here (the
//! audit log says source `cluster`). The last change wins.

use std::sync::Arc;
use std::time::Duration;

use super::redis::Published;
use super::{Cluster, SYNC_EVERY};
use crate::audit::Source;
use crate::engines::{EnginePool, EngineSpec};
use crate::reload::{Mode, PolicyStore};

/// How long the leader lease lives without renewal.
const LEADER_TTL: Duration = Duration::from_secs(5);

/// Runs until the process ends; spawn it (no-op without Redis).
pub async fn run(cluster: Arc<Cluster>, pool: Arc<EnginePool>, store: Arc<PolicyStore>) {
    let Some(redis) = &cluster.redis else { return };
    let mut versions = store.subscribe();
    let mut ticks = tokio::time::interval(SYNC_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The version this gateway and the cluster last agreed on.
    let mut synced = store.current().version.clone();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            changed = versions.changed() => if changed.is_err() { return },
        }
        if redis.heartbeat().await.is_err() {
            cluster.set_leader(false);
            continue;
        }
        match redis.engines().await {
            Ok(found) => {
                let live: Vec<String> = found.iter().map(|(id, _)| id.clone()).collect();
                for (id, url) in found {
                    if let Ok(url) = url.parse() {
                        pool.add(EngineSpec::native(id, url));
                    }
                }
                let ttl = Duration::from_secs(cluster.cfg.engine_ttl_s);
                pool.retire_gone(&live, ttl, crate::clock::now());
            }
            Err(e) if super::bad_key(&e, "engines") => {}
            Err(e) => tracing::debug!(event = "registry_read_failed", error = %e),
        }
        let reports: Vec<(String, String)> = (0..pool.len())
            .filter_map(|i| {
                let slot = pool.slot(i);
                let report = slot.report()?;
                Some((slot.spec.id.clone(), serde_json::to_string(&*report).ok()?))
            })
            .collect();
        if let Err(e) = redis.put_loads(&reports).await {
            tracing::debug!(event = "load_publish_failed", error = %e);
        }
        synced = converge_policy(&cluster, &store, synced).await;
        match redis.lead(&cluster.node_id, LEADER_TTL.as_millis() as u64).await {
            Ok(leads) => cluster.set_leader(leads),
            Err(_) => cluster.set_leader(false),
        }
    }
}

/// One round of policy convergence; returns the version now agreed on.
/// Only documents signed with the fleet's key are applied; without a key
/// nothing is applied or published.
async fn converge_policy(cluster: &Cluster, store: &PolicyStore, synced: String) -> String {
    let (Some(redis), Some(key)) = (&cluster.redis, &cluster.policy_key) else { return synced };
    let active = store.current().version.clone();
    let remote = match redis.policy().await {
        Ok(r) => r,
        Err(e) if super::bad_key(&e, "policy") => return synced,
        Err(e) => {
            tracing::debug!(event = "policy_read_failed", error = %e);
            return synced;
        }
    };
    let remote = remote.filter(|p| {
        let signed = key.verify(&p.version, &p.text, &p.mac);
        if !signed {
            let why = if p.mac.is_empty() { "unsigned" } else { "bad_signature" };
            tracing::error!(event = "policy_from_cluster_refused", why, version = %p.version);
            ::metrics::counter!(crate::metrics::CLUSTER_POLICY_REJECTED, "why" => why).increment(1);
        }
        signed
    });
    let local_change = active != synced;
    match remote {
        Some(p) if !local_change && p.version != active => {
            match store.apply("cluster", &p.text, Source::Cluster, Mode::Apply) {
                Ok(a) => {
                    tracing::info!(event = "policy_from_cluster", version = %a.version, previous = %a.previous)
                }
                Err(e) => {
                    tracing::error!(event = "policy_from_cluster_rejected", version = %p.version, error = %e)
                }
            }
            p.version
        }
        Some(p) if p.version == active => active,
        _ => {
            // Ours is newer, or none (or only a forged one) is published:
            // publish ours, signed.
            let text = store.active_text();
            let published = Published { mac: key.sign(&active, &text), version: active.clone(), text };
            match redis.publish_policy(&published).await {
                Ok(()) => {
                    tracing::info!(event = "policy_published", version = %active);
                    active
                }
                Err(e) => {
                    tracing::warn!(event = "policy_publish_failed", error = %e);
                    synced
                }
            }
        }
    }
}
