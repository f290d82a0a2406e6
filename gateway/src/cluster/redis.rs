//! Cluster state in Redis. Key layout (prefix `slo:`; docs/operations.md):
//!
//! | key | type | TTL | what |
//! | --- | --- | --- | --- |
//! | `slo:lease:{tenant}` | sorted set: lease id -> expiry ms | lease TTL | open requests of a tenant |
//! | `slo:rpm:{tenant}:{minute}` | counter | 61 s | requests in a minute of Redis's clock |
//! | `slo:tpm:{tenant}:{minute}` | counter | 61 s | tokens in it |
//!
//! Lease expiries and the minute windows are read from Redis's own clock
//! (`TIME` inside the scripts), not the gateways': gateways whose clocks
//! disagree by seconds still count one minute and expire one lease alike.
//! (Effects replication, Redis 5 and later, carries a script that reads
//! `TIME` to replicas; Redis Cluster, which would need the minute key
//! declared, is not supported.)
//! | `slo:engines` | set of engine ids | none (ids whose key expired are skipped) | the registry's index |
//! | `slo:engine:{id}` | string: base URL | 10 s, refreshed every 3 s by the engine | a live engine |
//! | `slo:load:{id}` | string: JSON load report | 5 s, refreshed every 0.5 s | an engine's latest load |
//! | `slo:policy` | string: JSON `{version, text, mac}` (`mac`: HMAC-SHA256, see `signing`) | none | the active policy document |
//! | `slo:leader` | string: node id | 5 s, renewed every 0.5 s by the leader | the control-loop leader |
//! | `slo:stream:{id}` | hash: owner, doc (JSON record), mac | 1 h, refreshed per chunk | a video stream's owner, home and progress ([`streams`](super::streams)) |
//! | `slo:gw:{node}` | string | 3 s, refreshed every 0.5 s | a live gateway (stream adoption) |
//!
//! The request path makes one round trip (the acquire script); releases,
//! renewals and everything else run off the request path.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use super::{retry_after_window, ClusterConfig, Denied, Grant, Limits};
use crate::metrics as m;
use conn::Conn;

mod conn;

/// A stored response and its tenant's index. KEYS: the response, the
/// index. ARGV: JSON, ttl ms, now ms, id, most kept, the responses' key
/// prefix.
const PUT_RESPONSE: &str = r"
local ttl, now = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if excess > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #old, 2 do redis.call('DEL', ARGV[6] .. old[i]) end
end
redis.call('PEXPIRE', KEYS[2], ttl)
return 0
";

/// Concurrency lease, request window and token window in one step, on
/// Redis's clock. KEYS: lease zset, the rpm and tpm counters' prefix (the
/// minute is appended here). ARGV: (unused), lease id, lease ttl ms, max
/// concurrency, rpm, tpm, tokens (0 = no limit). Returns {0, requests,
/// tokens, now ms} granted (the windows' counts with this request), {1,
/// 0, 0, now} concurrency, {2, ...} requests, {3, ...} tokens.
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local minute = tostring(math.floor(now / 60000))
local rpm_key, tpm_key = KEYS[2] .. minute, KEYS[3] .. minute
local ttl = tonumber(ARGV[3])
local conc, rpm, tpm, tokens = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if conc > 0 and redis.call('ZCARD', KEYS[1]) >= conc then return {1, 0, 0, now} end
if rpm > 0 and tonumber(redis.call('GET', rpm_key) or '0') + 1 > rpm then return {2, 0, 0, now} end
if tpm > 0 and tonumber(redis.call('GET', tpm_key) or '0') + tokens > tpm then return {3, 0, 0, now} end
local used_r, used_t = 0, 0
if rpm > 0 then used_r = redis.call('INCR', rpm_key); redis.call('PEXPIRE', rpm_key, 61000) end
if tpm > 0 then used_t = redis.call('INCRBY', tpm_key, tokens); redis.call('PEXPIRE', tpm_key, 61000) end
if conc > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {0, used_r, used_t, now}
";

/// Renews leases on Redis's clock. KEYS: each lease's zset. ARGV: ttl ms,
/// then each lease id in KEYS' order.
const RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + ttl, ARGV[i + 1])
  redis.call('PEXPIRE', key, ttl)
end
return #KEYS
";

/// Take or keep the leader lease. KEYS: leader key. ARGV: node id, ttl ms.
/// Returns 1 when this node leads.
const LEAD: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
";

/// The Redis side of the cluster.
pub struct RedisState {
    timeout: Duration,
    lease_ttl_ms: u64,
    conn: Arc<Conn>,
    up: Arc<AtomicBool>,
    acquire: Script,
    renew: Script,
    lead: Script,
    /// Leases this gateway holds: renewed while held.
    held: Arc<Mutex<HashSet<(String, String)>>>,
    /// Leases released while Redis did not answer: removed from Redis as
    /// soon as it answers again, so a tenant is not held at its limit by
    /// requests long finished until their TTL runs out (at most
    /// [`MAX_PENDING_RELEASES`]; past that, the TTL).
    pending_releases: Arc<Mutex<Vec<(String, String)>>>,
    next_lease: AtomicU64,
    lease_prefix: String,
    /// Where the next stream sweep's SCAN starts (0: from the beginning).
    pub(super) sweep_cursor: AtomicU64,
}

impl std::fmt::Debug for RedisState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisState").field("target", &self.conn.target).field("up", &self.is_up()).finish()
    }
}

fn mark_down(up: &AtomicBool, conn: &Conn, e: &redis::RedisError) {
    conn.invalidate(e);
    if up.swap(false, Ordering::AcqRel) {
        tracing::warn!(event = "redis_down", error = %e);
        ::metrics::gauge!(m::CLUSTER_REDIS_UP).set(0.0);
    }
}

fn timeout_err() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "timed out"))
}

/// Most leases kept for removal while Redis does not answer; past it, the
/// lease TTL frees the rest.
pub const MAX_PENDING_RELEASES: usize = 65_536;

fn defer_release(pending: &Mutex<Vec<(String, String)>>, tenant: String, lease: String) {
    let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
    if p.len() < MAX_PENDING_RELEASES {
        p.push((tenant, lease));
    }
}

impl RedisState {
    pub fn new(target: fleet_redis::Target, cfg: &ClusterConfig) -> Self {
        // Down until it first answers: a gateway that never reaches its
        // Redis (a wrong address, an untrusted certificate) reads 0, not
        // nothing, so an alert on `== 0` fires for it too.
        ::metrics::gauge!(m::CLUSTER_REDIS_UP).set(0.0);
        Self {
            timeout: Duration::from_millis(cfg.timeout_ms.max(1)),
            lease_ttl_ms: cfg.lease_ttl_s.max(1) * 1000,
            conn: Arc::new(Conn::new(target)),
            up: Arc::new(AtomicBool::new(false)),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            lead: Script::new(LEAD),
            held: Arc::new(Mutex::new(HashSet::new())),
            pending_releases: Arc::new(Mutex::new(Vec::new())),
            next_lease: AtomicU64::new(0),
            lease_prefix: format!("{}-{}", std::process::id(), super::wall_ms()),
            sweep_cursor: AtomicU64::new(0),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub(crate) fn mark_down(&self, e: &redis::RedisError) {
        mark_down(&self.up, &self.conn, e);
    }

    fn mark_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!(event = "redis_up", target = ?self.conn.target);
            ::metrics::gauge!(m::CLUSTER_REDIS_UP).set(1.0);
        }
    }

    /// The connection to the primary (see [`Conn`]), dialled if there is
    /// none (off the request path: it waits for the dial).
    async fn conn(&self) -> redis::RedisResult<ConnectionManager> {
        self.conn.get(self.timeout).await
    }

    /// The request path's connection within its timeout. Without one, the
    /// dial runs in a task of its own and this waits for it up to the
    /// timeout: a dial slower than that (a TLS handshake, loading the
    /// system's roots, asking the sentinels) finishes for the next request
    /// instead of being cut short and started again by every request.
    /// Requests that find a dial in flight go on without Redis at once.
    async fn conn_timed(&self) -> redis::RedisResult<ConnectionManager> {
        Conn::get_timed(&self.conn, self.timeout).await
    }

    /// Runs `f` with the request-path timeout.
    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        tokio::time::timeout(self.timeout, f).await.unwrap_or_else(|_| Err(timeout_err()))
    }

    /// The acquire script; `Err` only for a Redis failure.
    pub async fn acquire(
        &self,
        tenant: &str,
        limits: Limits,
        tokens: u64,
        now_ms: u64,
    ) -> redis::RedisResult<Result<Grant, Denied>> {
        let lease = format!("{}-{}", self.lease_prefix, self.next_lease.fetch_add(1, Ordering::Relaxed));
        let mut conn = self.conn_timed().await?;
        let reply: Vec<i64> = self
            .timed(
                self.acquire
                    .key(format!("slo:lease:{tenant}"))
                    .key(format!("slo:rpm:{tenant}:"))
                    .key(format!("slo:tpm:{tenant}:"))
                    .arg(0)
                    .arg(&lease)
                    .arg(self.lease_ttl_ms)
                    .arg(limits.max_concurrency.unwrap_or(0))
                    .arg(limits.requests_per_minute.unwrap_or(0))
                    .arg(limits.tokens_per_minute.unwrap_or(0))
                    .arg(tokens)
                    .invoke_async(&mut conn),
            )
            .await?;
        // The window's end on Redis's clock (this gateway's, if no reply said).
        let redis_now = reply.get(3).copied().filter(|&t| t > 0).map_or(now_ms, |t| t as u64);
        let retry_after_s = retry_after_window(redis_now);
        let at = |i: usize| reply.get(i).copied().unwrap_or(0).max(0) as u64;
        Ok(match reply.first().copied().unwrap_or(0) {
            0 => {
                let lease = limits.max_concurrency.map(|_| lease);
                if let Some(l) = &lease {
                    self.held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert((tenant.to_string(), l.clone()));
                }
                let used = super::Used { requests: at(1), tokens: at(2) };
                Ok(Grant { tenant: tenant.to_string(), used, lease, local: false })
            }
            1 => Err(Denied::Concurrency { limit: limits.max_concurrency.unwrap_or(0) }),
            2 => Err(Denied::Requests { limit: limits.requests_per_minute.unwrap_or(0), retry_after_s }),
            _ => Err(Denied::Tokens { limit: limits.tokens_per_minute.unwrap_or(0), retry_after_s }),
        })
    }

    /// Removes a lease, off the request path (it expires anyway); while
    /// Redis does not answer, as soon as it does again.
    pub fn release(&self, tenant: &str, lease: String) {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&(tenant.to_string(), lease.clone()));
        let pending = Arc::clone(&self.pending_releases);
        if !self.is_up() {
            defer_release(&pending, tenant.to_string(), lease);
            return;
        }
        let (conn, tenant, up) = (Arc::clone(&self.conn), tenant.to_string(), Arc::clone(&self.up));
        tokio::spawn(async move {
            let r: redis::RedisResult<()> = match conn.current.load_full() {
                Some(c) => (*c).clone().zrem(format!("slo:lease:{tenant}"), &lease).await,
                None => Err(timeout_err()),
            };
            if let Err(e) = r {
                mark_down(&up, &conn, &e);
                defer_release(&pending, tenant, lease);
            }
        });
    }

    /// Health check and lease renewal (on Redis's clock), every sync tick.
    pub async fn heartbeat(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn_timed().await?;
        let held: Vec<(String, String)> =
            self.held.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        let pending: Vec<(String, String)> =
            std::mem::take(&mut *self.pending_releases.lock().unwrap_or_else(|p| p.into_inner()));
        let renew = async {
            let () = redis::cmd("PING").query_async(&mut conn).await?;
            // Leases released while Redis did not answer.
            if !pending.is_empty() {
                let mut pipe = redis::pipe();
                for (tenant, lease) in &pending {
                    pipe.cmd("ZREM").arg(format!("slo:lease:{tenant}")).arg(lease).ignore();
                }
                let () = pipe.query_async(&mut conn).await?;
            }
            // On Redis's clock, in batches (one script call per 256 leases).
            for batch in held.chunks(256) {
                let mut call = self.renew.prepare_invoke();
                call.arg(self.lease_ttl_ms);
                for (tenant, lease) in batch {
                    call.key(format!("slo:lease:{tenant}")).arg(lease);
                }
                let _: i64 = call.invoke_async(&mut conn).await?;
            }
            Ok(())
        };
        let r: redis::RedisResult<()> =
            tokio::time::timeout(Duration::from_secs(1), renew).await.unwrap_or_else(|_| Err(timeout_err()));
        if r.is_err() {
            for (tenant, lease) in pending {
                defer_release(&self.pending_releases, tenant, lease);
            }
        }
        match r {
            Ok(()) => {
                self.mark_up();
                Ok(())
            }
            Err(e) => {
                self.mark_down(&e);
                Err(e)
            }
        }
    }

    /// Live engines: `(id, url)` of every registered id whose key is alive.
    pub async fn engines(&self) -> redis::RedisResult<Vec<(String, String)>> {
        let mut conn = self.conn().await?;
        let ids: Vec<String> = conn.smembers("slo:engines").await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| format!("slo:engine:{id}")).collect();
        let urls: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        // Ids whose registration expired are gone: drop them from the set,
        // which would otherwise only grow.
        let gone: Vec<&String> =
            ids.iter().zip(&urls).filter(|(_, u)| u.is_none()).map(|(id, _)| id).collect();
        if !gone.is_empty() {
            let _: redis::RedisResult<()> = conn.srem("slo:engines", gone).await;
        }
        Ok(ids.into_iter().zip(urls).filter_map(|(id, url)| url.map(|u| (id, u))).collect())
    }

    /// The published policy, if any (`Some` with empty fields when what
    /// is there is not a well-formed document: it is then unsigned).
    pub async fn policy(&self) -> redis::RedisResult<Option<Published>> {
        let mut conn = self.conn().await?;
        let raw: Option<String> = conn.get("slo:policy").await?;
        Ok(raw.map(|r| {
            let v: serde_json::Value = serde_json::from_str(&r).unwrap_or_default();
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            Published { version: field("version"), text: field("text"), mac: field("mac") }
        }))
    }

    pub async fn publish_policy(&self, p: &Published) -> redis::RedisResult<()> {
        let mut conn = self.conn().await?;
        let body = serde_json::json!({"version": p.version, "text": p.text, "mac": p.mac}).to_string();
        conn.set("slo:policy", body).await
    }

    /// Takes or keeps the leader lease; true when this node leads.
    pub async fn lead(&self, node: &str, ttl_ms: u64) -> redis::RedisResult<bool> {
        let mut conn = self.conn().await?;
        let r: i64 = self.lead.key("slo:leader").arg(node).arg(ttl_ms).invoke_async(&mut conn).await?;
        Ok(r == 1)
    }

    /// Publishes the latest load report of each engine this gateway polls
    /// (`slo:load:{id}`, 5 s TTL), for the fleet's other gateways and tools.
    pub async fn put_loads(&self, reports: &[(String, String)]) -> redis::RedisResult<()> {
        if reports.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        for (id, json) in reports {
            pipe.cmd("SET").arg(format!("slo:load:{id}")).arg(json).arg("PX").arg(5000).ignore();
        }
        pipe.query_async(&mut conn).await
    }

    /// Stores a Responses API response for `ttl_ms`, keeping the tenant's
    /// newest `max` (an index by time; the oldest are dropped).
    pub async fn put_response(
        &self,
        tenant: &str,
        id: &str,
        json: &str,
        ttl_ms: u64,
        max: usize,
    ) -> redis::RedisResult<()> {
        let mut conn = self.conn_timed().await?;
        let now = super::wall_ms();
        let prefix = format!("slo:resp:{tenant}:");
        self.timed(
            redis::Script::new(PUT_RESPONSE)
                .key(format!("{prefix}{id}"))
                .key(format!("slo:resp-idx:{tenant}"))
                .arg(json)
                .arg(ttl_ms.max(1))
                .arg(now)
                .arg(id)
                .arg(max)
                .arg(&prefix)
                .invoke_async(&mut conn),
        )
        .await
    }

    pub async fn get_response(&self, tenant: &str, id: &str) -> redis::RedisResult<Option<String>> {
        let mut conn = self.conn_timed().await?;
        self.timed(redis::cmd("GET").arg(format!("slo:resp:{tenant}:{id}")).query_async(&mut conn)).await
    }

    /// Whether it was there.
    pub async fn delete_response(&self, tenant: &str, id: &str) -> redis::RedisResult<bool> {
        let mut conn = self.conn_timed().await?;
        let (n, _): (i64, i64) = self
            .timed(
                redis::pipe()
                    .del(format!("slo:resp:{tenant}:{id}"))
                    .zrem(format!("slo:resp-idx:{tenant}"), id)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(n > 0)
    }

    /// Writes API key records (`slo:keys`: id -> JSON, no secrets);
    /// `only_new`: only those Redis does not have.
    pub async fn put_keys(&self, records: &[(String, String)], only_new: bool) -> redis::RedisResult<()> {
        let mut conn = self.conn_timed().await?;
        let mut pipe = redis::pipe();
        for (id, json) in records {
            if only_new {
                pipe.hset_nx("slo:keys", id, json).ignore();
            } else {
                pipe.hset("slo:keys", id, json).ignore();
            }
        }
        self.timed(pipe.query_async(&mut conn)).await
    }

    /// Every API key record of the fleet.
    pub async fn keys(&self) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.conn_timed().await?;
        self.timed(redis::cmd("HVALS").arg("slo:keys").query_async(&mut conn)).await
    }

    /// Adds usage counts: per day, `field -> increment` in `slo:usage:{day}`
    /// (kept `keep_days`).
    pub async fn add_usage(
        &self,
        days: &[(u32, Vec<(String, u64)>)],
        keep_days: u32,
    ) -> redis::RedisResult<()> {
        let mut conn = self.conn_timed().await?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (day, fields) in days {
            let key = format!("slo:usage:{day}");
            for (field, v) in fields {
                pipe.hincr(&key, field, *v).ignore();
            }
            pipe.expire(&key, i64::from(keep_days) * 86_400).ignore();
        }
        self.timed(pipe.query_async(&mut conn)).await
    }

    /// The usage hashes of `days`.
    pub async fn usage_days(&self, days: &[u32]) -> redis::RedisResult<Vec<(u32, Vec<(String, u64)>)>> {
        let mut conn = self.conn_timed().await?;
        let mut pipe = redis::pipe();
        for day in days {
            pipe.hgetall(format!("slo:usage:{day}"));
        }
        let all: Vec<Vec<(String, u64)>> = self.timed(pipe.query_async(&mut conn)).await?;
        Ok(days.iter().copied().zip(all).collect())
    }

    /// The connection for the modules that keep their own keys
    /// (`streams`).
    pub(crate) async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        self.conn().await
    }
}

/// A policy document as published in Redis, with its signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub version: String,
    pub text: String,
    /// Hex HMAC-SHA256 (see [`super::signing`]).
    pub mac: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_kept_while_redis_is_down_are_bounded() {
        let pending = Mutex::new(Vec::new());
        for i in 0..MAX_PENDING_RELEASES + 10 {
            defer_release(&pending, "t".into(), format!("lease-{i}"));
        }
        let kept = pending.into_inner().unwrap();
        assert_eq!(kept.len(), MAX_PENDING_RELEASES, "past the bound the lease TTL frees the rest");
        assert_eq!(kept[0].1, "lease-0", "the oldest are kept, in order");
    }
}
