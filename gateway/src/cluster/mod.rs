//! Cluster state: what the gateways of one fleet share. One interface,
//! two implementations: [`local`] (in memory, the single-gateway default)
//! and [`redis`] (several gateways on one Redis).
//!
//! What it holds: per-tenant concurrency leases and request / token rate
//! windows, enforced atomically across gateways (one Lua script, one round
//! trip on the request path); the engine registry (engines register
//! themselves with a TTL, so every gateway discovers them); the active
//! policy version (every gateway converges on it); the control-loop leader
//! lease; each video stream's home engine and owner.
//!
//! Failure: Redis calls on the request path have a short timeout; when
//! Redis is unreachable the gateway keeps serving with local limits set to
//! `local_fraction` of the global ones, reports it in `/readyz` and
//! `gateway_cluster_redis_up`, and goes back to Redis when it answers again
//! ([`sync`] runs the background side: health, registry, policy, leader).

pub mod local;
pub mod redis;
pub mod signing;
pub mod streams;
pub mod sync;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Deserialize;

/// `[cluster]` in the gateway config (or `--redis URL`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `redis://[[user]:password@]host:port[/db]`, over TLS
    /// `rediss://…[?ca_file=PATH]`, or Sentinel:
    /// `redis+sentinel://[[user]:password@]host:port[,host:port…]/master[/db]`
    /// (the fleet-redis crate); unset: in-memory state (one gateway).
    pub redis: Option<String>,
    /// Timeout of a Redis call on the request path.
    pub timeout_ms: u64,
    /// While Redis is unreachable each gateway enforces this share of every
    /// global limit locally (1 / the number of gateways is exact; the
    /// default suits two).
    pub local_fraction: f64,
    /// A concurrency lease expires this long after its gateway stops
    /// renewing it (a dead gateway's capacity comes back by then).
    pub lease_ttl_s: u64,
    /// This gateway's name in the cluster (leader lease); default
    /// `gateway-<pid>-<port>`.
    pub node_id: Option<String>,
    /// File holding the key that signs policy documents in Redis (shared by
    /// the fleet's gateways, never stored in Redis); else the
    /// `GATEWAY_POLICY_KEY` environment variable. Without a key, gateways
    /// do not converge on a policy through Redis.
    pub policy_key_file: Option<std::path::PathBuf>,
    /// A discovered engine gone from the registry and silent this long is
    /// dropped from routing and `/readyz` (its slot is reused).
    pub engine_ttl_s: u64,
}

impl ClusterConfig {
    /// The policy signing key: `policy_key_file`, else `GATEWAY_POLICY_KEY`.
    pub fn policy_key(&self) -> Result<Option<signing::PolicyKey>, String> {
        let secret = match &self.policy_key_file {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?),
            None => std::env::var(signing::KEY_ENV).ok(),
        };
        secret.map(|s| signing::PolicyKey::new(&s)).transpose()
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            redis: None,
            timeout_ms: 50,
            local_fraction: 0.5,
            lease_ttl_s: 15,
            node_id: None,
            policy_key_file: None,
            engine_ttl_s: 30,
        }
    }
}

/// A tenant's limits for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub max_concurrency: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

impl Limits {
    /// These limits scaled by `f` (at least 1 where set).
    pub fn scaled(&self, f: f64) -> Self {
        let s = |v: Option<u32>| v.map(|x| ((f64::from(x) * f).floor() as u32).max(1));
        Self {
            max_concurrency: s(self.max_concurrency),
            requests_per_minute: s(self.requests_per_minute),
            tokens_per_minute: s(self.tokens_per_minute),
        }
    }
}

/// A tenant's use of its per-minute windows, this request counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Used {
    pub requests: u64,
    pub tokens: u64,
}

/// Why a request is over its tenant's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Concurrency { limit: u32 },
    Requests { limit: u32, retry_after_s: u32 },
    Tokens { limit: u32, retry_after_s: u32 },
}

/// A request's hold on its tenant's limits, given back when dropped (the
/// response ended).
#[derive(Debug)]
pub struct Hold {
    cluster: std::sync::Arc<Cluster>,
    grant: Option<Grant>,
}

impl Hold {
    pub fn new(cluster: std::sync::Arc<Cluster>, grant: Grant) -> Self {
        Self { cluster, grant: Some(grant) }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(g) = self.grant.take() {
            self.cluster.release(g);
        }
    }
}

/// A granted request's hold on its tenant's limits; give it back with
/// [`Cluster::release`] (or hold it in a [`Hold`]).
#[derive(Debug)]
pub struct Grant {
    pub(crate) tenant: String,
    /// The tenant's per-minute windows after this request was counted
    /// (OpenAI's `x-ratelimit-*` headers).
    pub(crate) used: Used,
    /// The Redis lease id, when the grant came from Redis.
    pub(crate) lease: Option<String>,
    /// Held in the local fallback counters.
    pub(crate) local: bool,
}

/// The fleet's shared state.
#[derive(Debug)]
pub struct Cluster {
    pub cfg: ClusterConfig,
    pub node_id: String,
    pub local: local::Local,
    pub redis: Option<redis::RedisState>,
    /// Signs and checks policy documents shared through Redis.
    pub policy_key: Option<signing::PolicyKey>,
    leader: AtomicBool,
}

impl Cluster {
    /// In-memory state, or Redis when configured. Never fails: Redis that
    /// is not there yet is connected to in the background.
    pub fn new(cfg: ClusterConfig, listen: SocketAddr, policy_key: Option<signing::PolicyKey>) -> Self {
        let node_id = cfg
            .node_id
            .clone()
            .unwrap_or_else(|| format!("gateway-{}-{}", std::process::id(), listen.port()));
        let redis = cfg.redis.as_deref().and_then(|url| match fleet_redis::Target::parse(url) {
            Ok(t) => Some(redis::RedisState::new(t, &cfg)),
            Err(e) => {
                tracing::error!(event = "redis_url_invalid", error = %e);
                None
            }
        });
        let leader = AtomicBool::new(redis.is_none()); // alone, a gateway leads
        Self { cfg, node_id, local: local::Local::default(), redis, policy_key, leader }
    }

    pub fn mode(&self) -> &'static str {
        if self.redis.is_some() {
            "redis"
        } else {
            "memory"
        }
    }

    /// Whether this gateway runs the fleet's control loop (re-homing).
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        if self.leader.swap(leader, Ordering::AcqRel) != leader {
            tracing::info!(event = "cluster_leadership", node = %self.node_id, leader);
        }
    }

    /// Takes one unit of the tenant's concurrency and its request and token
    /// windows, or says which limit is in the way. In Redis mode: one
    /// script, one round trip; on a Redis failure the local fallback.
    pub async fn acquire(
        &self,
        tenant: &str,
        limits: Limits,
        tokens: u64,
        now_ms: u64,
    ) -> Result<Grant, Denied> {
        if limits == Limits::default() {
            return Ok(Grant {
                tenant: tenant.to_string(),
                used: Used::default(),
                lease: None,
                local: false,
            });
        }
        if let Some(r) = &self.redis {
            if r.is_up() {
                match r.acquire(tenant, limits, tokens, now_ms).await {
                    Ok(result) => return result,
                    // A key of ours holding another type (written by
                    // someone else): Redis answers, this tenant's shared
                    // state cannot be used; local limits for it.
                    Err(e) if bad_key(&e, "window_or_lease") => {}
                    Err(e) => r.mark_down(&e),
                }
            }
            let local = limits.scaled(self.cfg.local_fraction);
            return self.local.acquire(tenant, local, tokens, now_ms);
        }
        // One gateway: the same limits, counted here (the one owner of a
        // tenant's concurrency in both modes).
        self.local.acquire(tenant, limits, tokens, now_ms)
    }

    /// Gives a grant back (the request's response ended).
    pub fn release(&self, grant: Grant) {
        if grant.local {
            self.local.release(&grant.tenant);
        }
        if let (Some(lease), Some(r)) = (grant.lease, &self.redis) {
            r.release(&grant.tenant, lease);
        }
    }

    /// `/readyz` detail.
    pub fn detail(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode(),
            "node": self.node_id,
            "leader": self.is_leader(),
            "redis_up": self.redis.as_ref().map(redis::RedisState::is_up),
            "local_fraction": self.redis.as_ref().map(|_| self.cfg.local_fraction),
        })
    }
}

/// Whether `e` says a key of the gateways' own holds another type; if so
/// it is counted (`family`) and logged.
pub(crate) fn bad_key(e: &::redis::RedisError, family: &'static str) -> bool {
    if e.code() != Some("WRONGTYPE") {
        return false;
    }
    ::metrics::counter!(crate::metrics::CLUSTER_BAD_KEYS, "family" => family).increment(1);
    tracing::error!(event = "redis_key_wrong_type", family, error = %e);
    true
}

/// Milliseconds of wall-clock time (rate windows are shared across
/// gateways, so they use the wall clock, not a process-local one).
pub fn wall_ms() -> u64 {
    crate::clock::wall().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How long until the next one-minute window starts, in whole seconds.
pub fn retry_after_window(now_ms: u64) -> u32 {
    let left = 60_000 - now_ms % 60_000;
    u32::try_from(left.div_ceil(1000)).unwrap_or(60).max(1)
}

pub(crate) const SYNC_EVERY: Duration = Duration::from_millis(500);
