//! Stored responses (`store: true`): what `GET /v1/responses/{id}` answers
//! and what a `previous_response_id` continues, bounded per tenant.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

/// `[responses]` in the gateway config: how much the Responses API keeps.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// Stored responses kept per tenant; the oldest go first.
    pub max_per_tenant: usize,
    /// Bytes of stored responses (the object and its conversation) kept
    /// per tenant; the oldest go first.
    pub max_bytes_per_tenant: usize,
    /// A stored response is forgotten this long after it was made.
    pub ttl_s: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self { max_per_tenant: 10_000, max_bytes_per_tenant: 64 << 20, ttl_s: 24 * 3600 }
    }
}

/// A stored response: the object `GET` answers, and the conversation a
/// `previous_response_id` continues.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub(crate) struct Stored {
    pub response: Value,
    pub conversation: Vec<Value>,
}

impl Stored {
    fn bytes(&self) -> usize {
        self.response.to_string().len() + self.conversation.iter().map(|m| m.to_string().len()).sum::<usize>()
    }
}

/// Stored responses, per tenant: bounded in count and bytes (the oldest
/// are forgotten first) and in time (a TTL). In this gateway's memory, and
/// with Redis also there (`slo:resp:{tenant}:{id}`, the tenant's count
/// bound kept by an index), so any gateway of the fleet continues a
/// conversation; this gateway's copy is a cache.
#[derive(Debug)]
pub(crate) struct ResponseStore {
    config: ResponsesConfig,
    tenants: Mutex<HashMap<String, TenantResponses>>,
    cluster: Option<Arc<crate::cluster::Cluster>>,
}

#[derive(Debug, Default)]
struct TenantResponses {
    by_id: HashMap<String, (Stored, usize, Instant)>,
    /// Insertion order: (sequence, id).
    order: BTreeMap<u64, String>,
    next: u64,
    bytes: usize,
}

impl ResponseStore {
    /// A store in this gateway's memory only.
    #[cfg(test)]
    pub fn new(config: ResponsesConfig) -> Self {
        Self { config, tenants: Mutex::new(HashMap::new()), cluster: None }
    }

    /// The store, shared through the fleet's Redis when it has one.
    pub fn shared(config: ResponsesConfig, cluster: Arc<crate::cluster::Cluster>) -> Self {
        let cluster = cluster.redis.is_some().then_some(cluster);
        Self { config, tenants: Mutex::new(HashMap::new()), cluster }
    }

    fn redis(&self) -> Option<&crate::cluster::redis::RedisState> {
        self.cluster.as_ref()?.redis.as_ref().filter(|r| r.is_up())
    }

    /// Stores `stored` here and, in the background, in Redis.
    pub fn save(self: &Arc<Self>, tenant: &str, stored: Stored) {
        if self.redis().is_some() {
            let (store, tenant, stored) = (Arc::clone(self), tenant.to_string(), stored.clone());
            tokio::spawn(async move {
                let Some(redis) = store.redis() else { return };
                let Some(id) = stored.response["id"].as_str() else { return };
                let json = serde_json::to_string(&stored).expect("a stored response serialises");
                if json.len() > store.config.max_bytes_per_tenant {
                    return;
                }
                let ttl_ms = store.config.ttl_s.saturating_mul(1000);
                if let Err(e) =
                    redis.put_response(&tenant, id, &json, ttl_ms, store.config.max_per_tenant).await
                {
                    redis.mark_down(&e);
                }
            });
        }
        self.put(tenant, stored);
    }

    /// The tenant's stored response `id`: Redis's (the fleet's, so a
    /// delete through another gateway holds), else this gateway's while
    /// Redis does not answer.
    pub async fn fetch(&self, tenant: &str, id: &str) -> Option<Stored> {
        let Some(redis) = self.redis() else { return self.get(tenant, id) };
        match redis.get_response(tenant, id).await {
            Ok(json) => serde_json::from_str(&json?).ok(),
            Err(e) => {
                redis.mark_down(&e);
                self.get(tenant, id)
            }
        }
    }

    /// Forgets the tenant's response `id` here and in Redis.
    pub async fn remove(&self, tenant: &str, id: &str) -> bool {
        let here = self.delete(tenant, id);
        let there = match self.redis() {
            Some(redis) => redis.delete_response(tenant, id).await.unwrap_or_else(|e| {
                redis.mark_down(&e);
                false
            }),
            None => false,
        };
        here || there
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.config.ttl_s)
    }

    pub fn put(&self, tenant: &str, stored: Stored) {
        let Some(id) = stored.response["id"].as_str().map(str::to_owned) else { return };
        let size = stored.bytes();
        if size > self.config.max_bytes_per_tenant || self.config.max_per_tenant == 0 {
            return; // larger than the tenant's whole allowance: not kept
        }
        let now = crate::clock::now();
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let t = tenants.entry(tenant.to_string()).or_default();
        t.expire(now, self.ttl());
        while t.by_id.len() >= self.config.max_per_tenant || t.bytes + size > self.config.max_bytes_per_tenant
        {
            if !t.evict_oldest() {
                break;
            }
        }
        let seq = t.next;
        t.next += 1;
        t.order.insert(seq, id.clone());
        t.bytes += size;
        if let Some((_, old, _)) = t.by_id.insert(id, (stored, size, now)) {
            t.bytes -= old;
        }
    }

    /// The tenant's stored response `id` (another tenant's is not found).
    pub fn get(&self, tenant: &str, id: &str) -> Option<Stored> {
        let now = crate::clock::now();
        let tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let (stored, _, at) = tenants.get(tenant)?.by_id.get(id)?;
        (now.duration_since(*at) < self.ttl()).then(|| stored.clone())
    }

    pub fn delete(&self, tenant: &str, id: &str) -> bool {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let Some(t) = tenants.get_mut(tenant) else { return false };
        match t.by_id.remove(id) {
            Some((_, size, _)) => {
                t.bytes -= size;
                t.order.retain(|_, v| v != id);
                true
            }
            None => false,
        }
    }

    /// Responses and bytes kept for a tenant.
    #[cfg(test)]
    fn usage(&self, tenant: &str) -> (usize, usize) {
        let tenants = self.tenants.lock().unwrap();
        tenants.get(tenant).map_or((0, 0), |t| (t.by_id.len(), t.bytes))
    }
}

impl TenantResponses {
    fn evict_oldest(&mut self) -> bool {
        let Some((_, id)) = self.order.pop_first() else { return false };
        if let Some((_, size, _)) = self.by_id.remove(&id) {
            self.bytes -= size;
        }
        true
    }

    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((_, id)) = self.order.first_key_value() {
            let expired = self.by_id.get(id).is_none_or(|(_, _, at)| now.duration_since(*at) >= ttl);
            if !expired {
                break;
            }
            self.evict_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_store_is_bounded_in_count_bytes_and_time() {
        let config = ResponsesConfig { max_per_tenant: 3, max_bytes_per_tenant: 4_000, ttl_s: 60 };
        let store = ResponseStore::new(config);
        let put = |id: &str, pad: usize| {
            store.put(
                "t",
                Stored { response: json!({"id": id, "pad": "x".repeat(pad)}), conversation: vec![] },
            )
        };
        for i in 0..5 {
            put(&format!("r{i}"), 10);
        }
        assert_eq!(store.usage("t").0, 3, "at most max_per_tenant");
        assert!(store.get("t", "r0").is_none() && store.get("t", "r4").is_some(), "the oldest went first");
        put("big", 3_500);
        let (n, bytes) = store.usage("t");
        assert!(bytes <= 4_000 && n == 3, "{n} responses, {bytes} bytes");
        put("big2", 3_500);
        let (n, bytes) = store.usage("t");
        assert!(
            bytes <= 4_000 && store.get("t", "big").is_none(),
            "{n} responses, {bytes} bytes: the bytes bound"
        );
        put("huge", 5_000);
        assert!(store.get("t", "huge").is_none(), "larger than the allowance: not kept");
        assert!(store.delete("t", "big2") && !store.delete("t", "big2"));
        assert_eq!(store.usage("t").1, store.get("t", "r4").map_or(0, |s| s.bytes()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stored_response_expires_after_its_ttl() {
        let store = ResponseStore::new(ResponsesConfig { ttl_s: 60, ..ResponsesConfig::default() });
        store.put("t", Stored { response: json!({"id": "r1"}), conversation: vec![] });
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(store.get("t", "r1").is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(store.get("t", "r1").is_none(), "expired");
        store.put("t", Stored { response: json!({"id": "r2"}), conversation: vec![] });
        assert_eq!(store.usage("t").0, 1, "an expired response's room is reclaimed at the next put");
    }
}
