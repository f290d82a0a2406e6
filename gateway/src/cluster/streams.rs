//! Video stream ownership in Redis: which gateway drives each live stream,
//! and what another gateway needs to take it over when that one dies
//! (`video::adopt`).
//!
//! `slo:stream:{id}` is a hash: `owner` (the driving gateway's node id),
//! `doc` (the stream's record, JSON) and `mac` (HMAC-SHA256 of the record
//! with the fleet's policy key, see [`super::signing`]: whoever can write
//! to Redis cannot make a gateway serve a stream it forged). Every write
//! is conditional on the owner: the owner refreshes its record after each
//! chunk and learns at once when another gateway took the stream over;
//! a takeover names the owner it replaces, so two gateways never both win.
//!
//! `slo:gw:{node}` marks a live gateway (3 s, refreshed every sync tick):
//! a stream whose owner's mark is gone belongs to a dead gateway.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Script;

use super::redis::RedisState;

/// How long a stream's record lives without a write (its owner writes one
/// per chunk; a stream paused longer than `video.max_pause_s` has ended).
pub const RECORD_TTL: Duration = Duration::from_secs(3600);
/// A gateway whose mark is older than this is dead.
pub const LIVE_TTL: Duration = Duration::from_secs(3);
/// Most stream records one sweep reads (it may read one SCAN batch, about
/// [`SWEEP_BATCH`], past it). A fleet with more live streams is swept in
/// turns: each sweep goes on from where the last stopped.
pub const MAX_SWEEP: usize = 4096;
/// Keys one SCAN step is asked to examine.
pub const SWEEP_BATCH: usize = 512;

/// Writes a record if `owner` owns the stream or nobody does. KEYS: the
/// stream. ARGV: owner, doc, mac, ttl ms. Returns 1 written, 0 owned by
/// another gateway.
const PUT: &str = r"
local o = redis.call('HGET', KEYS[1], 'owner')
if o and o ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'doc', ARGV[2], 'mac', ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1
";

/// Takes a stream over from `from`. KEYS: the stream. ARGV: from, to, doc,
/// mac, ttl ms. Returns 1 taken, 0 its owner is no longer `from`.
const CLAIM: &str = r"
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'doc', ARGV[3], 'mac', ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
return 1
";

/// Deletes the record if `owner` owns it. KEYS: the stream. ARGV: owner.
/// Returns 1 deleted, 0 another gateway owns it, 2 there was none.
const DROP: &str = r"
local o = redis.call('HGET', KEYS[1], 'owner')
if not o then return 2 end
if o ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// A stream's hash as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub owner: String,
    pub doc: String,
    pub mac: String,
}

fn key(id: &str) -> String {
    format!("slo:stream:{id}")
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl RedisState {
    /// Writes stream `id`'s record as `owner`; false when another gateway
    /// owns it now (this one lost it).
    pub async fn put_stream(&self, id: &str, owner: &str, doc: &str, mac: &str) -> redis::RedisResult<bool> {
        self.write_stream(PUT, id, &[owner], doc, mac).await
    }

    /// Takes stream `id` over from `from` with this record; false when its
    /// owner is no longer `from` (another gateway was first).
    pub async fn claim_stream(
        &self,
        id: &str,
        (from, to): (&str, &str),
        doc: &str,
        mac: &str,
    ) -> redis::RedisResult<bool> {
        self.write_stream(CLAIM, id, &[from, to], doc, mac).await
    }

    /// Runs [`PUT`] or [`CLAIM`]: ARGV the owners, then the record and its
    /// TTL. True when it wrote.
    async fn write_stream(
        &self,
        script: &str,
        id: &str,
        owners: &[&str],
        doc: &str,
        mac: &str,
    ) -> redis::RedisResult<bool> {
        let mut conn = self.connection().await?;
        let script = Script::new(script);
        let mut call = script.key(key(id));
        for o in owners {
            call.arg(*o);
        }
        let r: i64 = call.arg(doc).arg(mac).arg(ms(RECORD_TTL)).invoke_async(&mut conn).await?;
        Ok(r == 1)
    }

    /// Deletes stream `id`'s record if `owner` owns it: `Some(true)`
    /// deleted or none was there, `Some(false)` another gateway owns it.
    pub async fn drop_stream(&self, id: &str, owner: &str) -> redis::RedisResult<bool> {
        let mut conn = self.connection().await?;
        let r: i64 = Script::new(DROP).key(key(id)).arg(owner).invoke_async(&mut conn).await?;
        Ok(r != 0)
    }

    /// Stream `id`'s record, if there is one. A key of another type (not a
    /// hash) is an error (`WRONGTYPE`), as is a hash without its fields.
    pub async fn get_stream(&self, id: &str) -> redis::RedisResult<Option<Stored>> {
        let mut conn = self.connection().await?;
        let fields: Vec<Option<String>> =
            redis::cmd("HMGET").arg(key(id)).arg(&["owner", "doc", "mac"]).query_async(&mut conn).await?;
        match fields.as_slice() {
            [None, None, None] => Ok(None),
            [Some(owner), Some(doc), mac] => Ok(Some(Stored {
                owner: owner.clone(),
                doc: doc.clone(),
                mac: mac.clone().unwrap_or_default(),
            })),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "a stream record without owner or doc",
            ))),
        }
    }

    /// Stream ids with their owners: every one when there are at most
    /// [`MAX_SWEEP`], else the next [`MAX_SWEEP`] or so in SCAN order from
    /// where the previous call stopped (all of them within two full turns
    /// of the keyspace). Keys of the wrong type are skipped.
    pub async fn stream_owners(&self) -> redis::RedisResult<Vec<(String, String)>> {
        let mut conn = self.connection().await?;
        let mut cursor = self.sweep_cursor.load(Ordering::Acquire);
        let mut keys: Vec<String> = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("slo:stream:*")
                .arg("COUNT")
                .arg(SWEEP_BATCH)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            cursor = next;
            if cursor == 0 || keys.len() >= MAX_SWEEP {
                break;
            }
        }
        self.sweep_cursor.store(cursor, Ordering::Release);
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(256) {
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("TYPE").arg(k);
            }
            let types: Vec<String> = pipe.query_async(&mut conn).await?;
            let hashes: Vec<&String> =
                chunk.iter().zip(&types).filter(|(_, t)| *t == "hash").map(|(k, _)| k).collect();
            if hashes.is_empty() {
                continue;
            }
            let mut pipe = redis::pipe();
            for k in &hashes {
                pipe.hget(*k, "owner");
            }
            let owners: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
            for (k, o) in hashes.into_iter().zip(owners) {
                if let (Some(id), Some(o)) = (k.strip_prefix("slo:stream:"), o) {
                    out.push((id.to_string(), o));
                }
            }
        }
        Ok(out)
    }

    /// Marks this gateway live for [`LIVE_TTL`].
    pub async fn beat(&self, node: &str) -> redis::RedisResult<()> {
        let mut conn = self.connection().await?;
        redis::cmd("SET")
            .arg(format!("slo:gw:{node}"))
            .arg(1)
            .arg("PX")
            .arg(ms(LIVE_TTL))
            .query_async(&mut conn)
            .await
    }

    /// Which of `nodes` are live.
    pub async fn alive(&self, nodes: &[String]) -> redis::RedisResult<Vec<bool>> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.connection().await?;
        let keys: Vec<String> = nodes.iter().map(|n| format!("slo:gw:{n}")).collect();
        let marks: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        Ok(marks.iter().map(Option::is_some).collect())
    }
}
