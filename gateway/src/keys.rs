//! API keys made at run time (`/admin/keys`, docs/operations.md "API keys
//! and usage"), beside the policy document's keys, which keep working.
//!
//! A key belongs to a tenant of the policy document (and may name another
//! of its tiers), may expire, may be limited to some models, and may carry
//! a budget. Only the SHA-256 of its secret is kept, here, in the state
//! file and in Redis; the secret is shown once, when the key is made (or
//! rotated), and never logged (`KeyRecord`'s `Debug` has no secret to
//! show). Revoking a key marks its record: every gateway of the fleet reads
//! the records from Redis every second, so a revoked key is refused
//! fleet-wide within about a second (2 s at most with a slow Redis).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use policies::Budget;
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};

/// Longest name, tenant or tier id, model id and number of models a key
/// record takes.
const MAX_NAME_BYTES: usize = 128;
const MAX_MODELS: usize = 64;
/// Most keys the store holds (revoked ones count until they are dropped).
pub const MAX_KEYS: usize = 100_000;

/// One key made at run time: what the gateway knows of it (never its
/// secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// `key_` and 16 hex digits: how usage, budgets and the admin API name it.
    pub id: String,
    /// SHA-256 of the secret, lowercase hex.
    pub hash: String,
    pub tenant: String,
    /// A tier other than the tenant's, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The models it may use (unset: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    #[serde(default)]
    pub budget: Budget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
    /// The first characters of the secret (`sk-gw-3f9a…`), to recognise it.
    pub prefix: String,
}

impl KeyRecord {
    /// Whether the key authenticates at `now` (unix seconds).
    pub fn live(&self, now: u64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| now < e)
    }

    /// The record as the admin API shows it (no hash).
    pub fn public(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a key record serialises");
        if let Some(o) = v.as_object_mut() {
            o.remove("hash");
            o.insert("object".into(), "api_key".into());
        }
        v
    }
}

/// What `POST /admin/keys` asks for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    pub tenant: String,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// Unix seconds.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// Seconds from now (instead of `expires_at`).
    #[serde(default)]
    pub expires_in_s: Option<u64>,
    #[serde(default)]
    pub models: Option<Vec<String>>,
    #[serde(default)]
    pub budget: Budget,
}

impl NewKey {
    /// Checks the request against the policy in force (the tenant, tier and
    /// models must exist); `Err` names the field.
    pub fn check(&self, policy: &policies::PolicyDocument) -> Result<(), (String, String)> {
        let field = |f: &str, m: String| Err((f.to_string(), m));
        if policy.tenant_index(&self.tenant).is_none() {
            return field("tenant", format!("no tenant `{}` in the policy document", self.tenant));
        }
        if let Some(t) = self.tier.as_deref().filter(|t| policy.tier(t).is_none()) {
            return field("tier", format!("no tier `{t}` in the policy document"));
        }
        if self.name.as_ref().is_some_and(|n| n.len() > MAX_NAME_BYTES) {
            return field("name", format!("at most {MAX_NAME_BYTES} bytes"));
        }
        if self.expires_at.is_some() && self.expires_in_s.is_some() {
            return field("expires_at", "give expires_at or expires_in_s, not both".into());
        }
        if let Some(models) = &self.models {
            if models.len() > MAX_MODELS {
                return field("models", format!("at most {MAX_MODELS} models"));
            }
            if let Some(m) = models.iter().find(|m| policy.model(m).is_none()) {
                return field("models", format!("no model `{m}` in the policy document"));
            }
        }
        if let Some(why) = self.budget.problem() {
            return field("budget", why.into());
        }
        Ok(())
    }
}

/// SHA-256 of a key's secret, lowercase hex.
pub fn hash(secret: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    ring::rand::SystemRandom::new().fill(&mut b).expect("the system RNG works");
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new secret: `sk-gw-` and 48 hex digits (192 random bits).
fn new_secret() -> String {
    format!("sk-gw-{}", random_hex(24))
}

/// The run-time keys, by hash and by id; saved to the state file (one
/// gateway) and to Redis (a fleet).
#[derive(Debug, Default)]
pub struct KeyStore {
    inner: RwLock<Keys>,
    file: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct Keys {
    by_id: HashMap<String, Arc<KeyRecord>>,
    by_hash: HashMap<String, Arc<KeyRecord>>,
    /// Changed here, not yet written to Redis.
    unsynced: std::collections::HashSet<String>,
    /// Redis answered the last sync (a sync after an outage, or the first,
    /// writes every record: a Redis without persistence comes back empty).
    synced_once: bool,
    /// Records to write back where Redis has none (never over a newer
    /// change made elsewhere, such as a revocation).
    resync: std::collections::HashSet<String>,
}

impl Keys {
    fn insert(&mut self, r: KeyRecord) {
        if let Some(old) = self.by_id.get(&r.id) {
            let old_hash = old.hash.clone();
            self.by_hash.remove(&old_hash);
        }
        let r = Arc::new(r);
        self.by_hash.insert(r.hash.clone(), Arc::clone(&r));
        self.by_id.insert(r.id.clone(), r);
    }
}

/// Why the admin API could not make a key.
#[derive(Debug, PartialEq)]
pub enum KeyError {
    Invalid(String, String),
    NotFound(String),
    Full,
}

impl KeyStore {
    /// The store, loaded from `file` (the state directory's `keys.json`)
    /// when it exists.
    pub fn open(file: Option<PathBuf>) -> Self {
        let store = Self { inner: RwLock::default(), file };
        if let Some(path) = &store.file {
            match std::fs::read(path) {
                Ok(bytes) => match serde_json::from_slice::<Vec<KeyRecord>>(&bytes) {
                    Ok(records) => store.replace(records),
                    Err(e) => {
                        tracing::error!(event = "keys_file_unreadable", path = %path.display(), error = %e)
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::error!(event = "keys_file_unreadable", path = %path.display(), error = %e),
            }
        }
        store
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Keys> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The record of the key whose secret hashes to `hash`.
    pub fn by_hash(&self, hash: &str) -> Option<Arc<KeyRecord>> {
        self.read().by_hash.get(hash).cloned()
    }

    pub fn get(&self, id: &str) -> Option<Arc<KeyRecord>> {
        self.read().by_id.get(id).cloned()
    }

    /// Every record, oldest first.
    pub fn list(&self) -> Vec<Arc<KeyRecord>> {
        let mut all: Vec<_> = self.read().by_id.values().cloned().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        all
    }

    /// All records at once (what Redis holds): replaces this store's.
    pub fn replace(&self, records: Vec<KeyRecord>) {
        let mut keys = Keys::default();
        for r in records.into_iter().take(MAX_KEYS) {
            keys.insert(r);
        }
        *self.write() = keys;
    }

    /// Makes a key: its record and its secret (shown once).
    pub fn create(
        &self,
        req: NewKey,
        policy: &policies::PolicyDocument,
        now: u64,
    ) -> Result<(KeyRecord, String), KeyError> {
        req.check(policy).map_err(|(f, m)| KeyError::Invalid(f, m))?;
        if self.read().by_id.len() >= MAX_KEYS {
            return Err(KeyError::Full);
        }
        let secret = new_secret();
        let record = KeyRecord {
            id: format!("key_{}", random_hex(8)),
            hash: hash(&secret),
            tenant: req.tenant,
            tier: req.tier,
            name: req.name,
            created_at: now,
            expires_at: req.expires_at.or(req.expires_in_s.map(|s| now.saturating_add(s))),
            models: req.models,
            budget: req.budget,
            revoked_at: None,
            prefix: secret[..10].to_string(),
        };
        let mut keys = self.write();
        keys.insert(record.clone());
        keys.unsynced.insert(record.id.clone());
        drop(keys);
        self.save();
        Ok((record, secret))
    }

    /// The records changed here since Redis last took them.
    pub fn unsynced(&self) -> Vec<KeyRecord> {
        let keys = self.read();
        keys.unsynced.iter().filter_map(|id| keys.by_id.get(id)).map(|r| (**r).clone()).collect()
    }

    /// Redis took these records.
    pub fn synced(&self, ids: &[String]) {
        let mut keys = self.write();
        for id in ids {
            keys.unsynced.remove(id);
        }
    }

    /// Redis did not answer: the next sync writes every record again.
    pub fn sync_failed(&self) {
        self.write().synced_once = false;
    }

    /// Every record goes back to Redis where it has none (first sync, or
    /// after an outage): taken once.
    pub fn take_resync(&self) -> Vec<KeyRecord> {
        let mut keys = self.write();
        if !keys.synced_once {
            let ids: Vec<String> = keys.by_id.keys().cloned().collect();
            keys.resync.extend(ids);
            keys.synced_once = true;
        }
        let ids: Vec<String> = keys.resync.drain().collect();
        ids.iter().filter_map(|id| keys.by_id.get(id)).map(|r| (**r).clone()).collect()
    }

    /// The fleet's records (Redis): each replaces this store's record of
    /// its id, unless that one changed here since (it goes to Redis next).
    pub fn merge(&self, records: Vec<KeyRecord>) {
        let mut keys = self.write();
        let mut changed = false;
        for r in records {
            if keys.unsynced.contains(&r.id) || keys.by_id.get(&r.id).is_some_and(|old| **old == r) {
                continue;
            }
            if keys.by_id.len() >= MAX_KEYS && !keys.by_id.contains_key(&r.id) {
                break;
            }
            keys.insert(r);
            changed = true;
        }
        drop(keys);
        if changed {
            self.save();
        }
    }

    /// Revokes key `id` (its record stays, for usage and the audit trail).
    pub fn revoke(&self, id: &str, now: u64) -> Result<KeyRecord, KeyError> {
        let mut keys = self.write();
        let mut r = keys.by_id.get(id).map(|r| (**r).clone()).ok_or_else(|| KeyError::NotFound(id.into()))?;
        r.revoked_at.get_or_insert(now);
        keys.insert(r.clone());
        keys.unsynced.insert(r.id.clone());
        drop(keys);
        self.save();
        Ok(r)
    }

    /// A new secret for key `id` (same id, tenant, budget and usage); the
    /// old secret stops working at once.
    pub fn rotate(&self, id: &str) -> Result<(KeyRecord, String), KeyError> {
        let mut keys = self.write();
        let mut r = keys.by_id.get(id).map(|r| (**r).clone()).ok_or_else(|| KeyError::NotFound(id.into()))?;
        if r.revoked_at.is_some() {
            return Err(KeyError::Invalid("id".into(), "a revoked key cannot be rotated".into()));
        }
        let secret = new_secret();
        r.hash = hash(&secret);
        r.prefix = secret[..10].to_string();
        keys.insert(r.clone());
        keys.unsynced.insert(r.id.clone());
        drop(keys);
        self.save();
        Ok((r, secret))
    }

    /// Writes the state file (whole, then renamed into place). A failure is
    /// logged: the change holds in memory (and in Redis) regardless.
    fn save(&self) {
        let Some(path) = &self.file else { return };
        let records: Vec<KeyRecord> = self.list().iter().map(|r| (**r).clone()).collect();
        let bytes = serde_json::to_vec_pretty(&records).expect("key records serialise");
        if let Err(e) = write_state(path, &bytes) {
            tracing::error!(event = "keys_file_write_failed", path = %path.display(), error = %e);
        }
    }
}

/// Writes a state file whole: into a temporary file beside it, then renamed
/// over it, so a crash leaves the old file or the new one, never half.
pub(crate) fn write_state(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> policies::PolicyDocument {
        policies::PolicyDocument::parse("p.toml", crate::DEFAULT_POLICIES).unwrap()
    }

    fn new_key(tenant: &str) -> NewKey {
        NewKey {
            tenant: tenant.into(),
            tier: None,
            name: Some("ci".into()),
            expires_at: None,
            expires_in_s: Some(60),
            models: None,
            budget: Budget::default(),
        }
    }

    #[test]
    fn a_key_is_kept_as_its_hash_and_found_by_it() {
        let dir = std::env::temp_dir().join(format!("keys-test-{}", random_hex(4)));
        let file = dir.join("keys.json");
        let store = KeyStore::open(Some(file.clone()));
        let (record, secret) = store.create(new_key("demo-gold"), &policy(), 1_000).unwrap();
        assert!(secret.starts_with("sk-gw-") && secret.len() == 54);
        assert_eq!(store.by_hash(&hash(&secret)).unwrap().id, record.id);
        assert_eq!(record.expires_at, Some(1_060));
        assert!(record.live(1_059) && !record.live(1_060), "expired at expires_at");
        let on_disk = std::fs::read_to_string(&file).unwrap();
        assert!(!on_disk.contains(&secret) && on_disk.contains(&record.hash), "only the hash is saved");
        assert!(!format!("{record:?}").contains(&secret));
        assert!(record.public().get("hash").is_none());
        // A restart reads the file back; a rotation retires the old secret.
        let again = KeyStore::open(Some(file.clone()));
        let (rotated, fresh) = again.rotate(&record.id).unwrap();
        assert!(again.by_hash(&hash(&secret)).is_none() && again.by_hash(&hash(&fresh)).is_some());
        assert_eq!(rotated.id, record.id);
        let revoked = again.revoke(&record.id, 1_010).unwrap();
        assert!(!revoked.live(1_011));
        assert!(!KeyStore::open(Some(file)).get(&record.id).unwrap().live(1_011), "revocation is saved");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_key_names_only_what_the_policy_has() {
        let store = KeyStore::default();
        let p = policy();
        let e = store.create(new_key("nobody"), &p, 0).unwrap_err();
        assert!(matches!(e, KeyError::Invalid(ref f, _) if f == "tenant"), "{e:?}");
        let e = store
            .create(NewKey { tier: Some("platinum".into()), ..new_key("demo-gold") }, &p, 0)
            .unwrap_err();
        assert!(matches!(e, KeyError::Invalid(ref f, _) if f == "tier"), "{e:?}");
        let e = store
            .create(NewKey { models: Some(vec!["gpt-nope".into()]), ..new_key("demo-gold") }, &p, 0)
            .unwrap_err();
        assert!(matches!(e, KeyError::Invalid(ref f, _) if f == "models"), "{e:?}");
        assert_eq!(store.rotate("key_none").unwrap_err(), KeyError::NotFound("key_none".into()));
    }
}
