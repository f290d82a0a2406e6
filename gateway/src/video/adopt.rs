//! Streams that outlive their gateway. Each live stream's owner keeps a
//! signed record of it in Redis (`cluster::streams`): tenant, tier,
//! parameters, prompt and epoch, home engine, chunks delivered. When a
//! gateway dies, its streams stay on their engines, and:
//!
//! - every gateway's sync tick sweeps the records; a stream whose owner's
//!   liveness mark has expired is taken over (a conditional write: one
//!   gateway wins) and registered here, **waiting for its reader**: it
//!   generates nothing until its client comes back (its engine keeps the
//!   state), and ends as `abandoned` if none does within
//!   [`super::UNREAD_LIMIT_S`];
//! - a client resumes the feed through any gateway
//!   (`GET /v1/video/streams/{id}/events` with `Last-Event-ID: N`, the
//!   last chunk it received, or `?from_chunk=N+1`): a gateway that does not
//!   hold the stream takes it over from whichever gateway owns it (dead or
//!   alive: an owner that loses a stream learns it at its next record
//!   write and lets go without ending it on the engine);
//! - the new owner asks the engine for chunks by index from the cursor on
//!   (`ChunkRequest::at`): chunks the engine already made, sent or not by
//!   the dead gateway, come from its recent chunks, so the client loses
//!   none of them (a cursor further back than the engine keeps gets a
//!   `gap` event instead).
//!
//! Nothing Redis holds makes a gateway serve a stream to another tenant:
//! records are verified with the fleet's policy key (without one, streams
//! are not adopted), and the resuming key's tenant must be the record's.

use std::sync::Arc;

use engine_api::video::Resolution;
use policies::video::Urgency;
use serde::{Deserialize, Serialize};

use super::{driver, Stream, StreamParams, Streams};
use crate::cluster::streams::Stored;
use crate::metrics as m;
use crate::reload::PolicyStore;

/// What another gateway needs to take a stream over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub id: String,
    pub tenant: String,
    pub tier: String,
    pub owner: String,
    /// The home engine's id.
    pub engine: String,
    pub fps: u32,
    pub frames_per_chunk: u32,
    pub resolution: Resolution,
    pub chunks_total: Option<u64>,
    pub prompt: String,
    pub epoch: u32,
    /// The stream index of the current epoch's first chunk (the engine
    /// counts chunks per epoch).
    pub epoch_base: u64,
    /// Chunks delivered: the next chunk's index.
    pub chunks: u64,
}

impl Record {
    pub fn of(stream: &Stream, owner: &str, engine: &str) -> Self {
        let st = stream.lock();
        Self {
            id: stream.id.clone(),
            tenant: stream.tenant.clone(),
            tier: stream.tier.clone(),
            owner: owner.to_string(),
            engine: engine.to_string(),
            fps: stream.params.fps,
            frames_per_chunk: stream.params.frames_per_chunk,
            resolution: stream.params.resolution,
            chunks_total: stream.params.chunks,
            prompt: st.prompt.clone(),
            epoch: st.epoch,
            epoch_base: st.epoch_base,
            chunks: st.next_index,
        }
    }

    /// The signed message's "version" part: the stream, namespaced so a
    /// policy signature can never pass for a stream's.
    fn label(id: &str) -> String {
        format!("video-stream:{id}")
    }

    /// The record as stored (`doc`, `mac`); the mac is empty without a key.
    pub fn seal(&self, key: Option<&crate::cluster::signing::PolicyKey>) -> (String, String) {
        let doc = serde_json::to_string(self).expect("a record serialises");
        let mac = key.map(|k| k.sign(&Self::label(&self.id), &doc)).unwrap_or_default();
        (doc, mac)
    }

    /// A stored record, if its signature and shape hold and it is the
    /// stream `id`'s; else why not (the metric's `result`).
    pub fn open(
        id: &str,
        stored: &Stored,
        key: &crate::cluster::signing::PolicyKey,
    ) -> Result<Self, &'static str> {
        if !key.verify(&Self::label(id), &stored.doc, &stored.mac) {
            return Err(if stored.mac.is_empty() { "unsigned" } else { "forged" });
        }
        let r: Record = serde_json::from_str(&stored.doc).map_err(|_| "malformed")?;
        if r.id != id {
            return Err("malformed");
        }
        Ok(r)
    }
}

fn counted(trigger: &'static str, result: &'static str) {
    ::metrics::counter!(m::VIDEO_ADOPTIONS, "trigger" => trigger, "result" => result).increment(1);
}

/// Writes `stream`'s record (off the request path). When another gateway
/// owns it now, the stream ends here as `moved` (its new owner drives it).
pub fn record(streams: &Streams, stream: &Arc<Stream>) {
    let Some(redis) = &streams.cluster.redis else { return };
    if !redis.is_up() {
        return;
    }
    let engine = streams.pool.slot(stream.lock().home).spec.id.clone();
    let rec = Record::of(stream, &streams.cluster.node_id, &engine);
    let (doc, mac) = rec.seal(streams.cluster.policy_key.as_ref());
    let (cluster, stream) = (Arc::clone(&streams.cluster), Arc::clone(stream));
    tokio::spawn(async move {
        let Some(redis) = &cluster.redis else { return };
        match redis.put_stream(&stream.id, &cluster.node_id, &doc, &mac).await {
            Ok(true) => {}
            Ok(false) => let_go(&stream),
            Err(e) => tracing::debug!(event = "video_record_failed", stream = %stream.id, error = %e),
        }
    });
}

/// Another gateway took `stream` over: it ends here without ending its
/// engine session.
fn let_go(stream: &Stream) {
    let mut st = stream.lock();
    if st.ended.is_none() {
        st.ended = Some("moved");
        tracing::info!(event = "video_stream_moved_away", stream = %stream.id);
    }
    drop(st);
    stream.wake.notify_one();
}

/// Whether this gateway may end `stream`'s engine session as it ends: it
/// still owns the stream (or there is no shared record). Removes the
/// record when it does.
pub async fn release(streams: &Streams, stream: &Stream) -> bool {
    let Some(redis) = &streams.cluster.redis else { return true };
    // Redis down: ours as far as anyone can tell.
    redis.drop_stream(&stream.id, &streams.cluster.node_id).await.unwrap_or(true)
}

/// Whether this gateway still owns `id` (a waiting adopted stream checks,
/// since it writes nothing until its reader comes back).
pub async fn still_owned(streams: &Streams, id: &str) -> bool {
    let Some(redis) = &streams.cluster.redis else { return true };
    match redis.get_stream(id).await {
        Ok(Some(s)) => s.owner == streams.cluster.node_id,
        Ok(None) | Err(_) => true,
    }
}

/// Why a stream could not be taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No such stream anywhere (or another tenant's: the same answer).
    NotFound,
    /// Redis did not answer, or the fleet has no key to check records.
    Unavailable,
}

/// Takes stream `id` over for `tenant`'s client resuming it here (any
/// owner, dead or alive); registers and starts it, waiting for its reader.
pub async fn take_over(
    streams: &Arc<Streams>,
    policies: &Arc<PolicyStore>,
    id: &str,
    tenant: &str,
) -> Result<Arc<Stream>, Refused> {
    let (Some(redis), Some(key)) = (&streams.cluster.redis, &streams.cluster.policy_key) else {
        return Err(Refused::NotFound);
    };
    let stored = match redis.get_stream(id).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(Refused::NotFound),
        Err(e) => {
            let malformed =
                e.kind() == redis::ErrorKind::UnexpectedReturnType || e.code() == Some("WRONGTYPE");
            if malformed {
                counted("resume", "malformed");
                tracing::error!(event = "video_record_refused", stream = %id, why = "malformed", error = %e);
                return Err(Refused::NotFound);
            }
            return Err(Refused::Unavailable);
        }
    };
    let rec = match Record::open(id, &stored, key) {
        Ok(r) => r,
        Err(why) => {
            counted("resume", why);
            tracing::error!(event = "video_record_refused", stream = %id, why);
            return Err(Refused::NotFound);
        }
    };
    if rec.tenant != tenant {
        counted("resume", "other_tenant");
        return Err(Refused::NotFound);
    }
    adopt(streams, policies, rec, &stored.owner, "resume").await.ok_or(Refused::Unavailable)
}

/// How often a gateway marks itself live and sweeps for streams of dead
/// gateways (a dead owner's streams are taken over within
/// [`LIVE_TTL`](crate::cluster::streams::LIVE_TTL) + this).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs until the process ends (a no-op without Redis): marks this gateway
/// live and sweeps.
pub async fn run(streams: Arc<Streams>, policies: Arc<PolicyStore>) {
    let Some(redis) = &streams.cluster.redis else { return };
    let mut ticks = tokio::time::interval(SWEEP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(e) = redis.beat(&streams.cluster.node_id).await {
            tracing::debug!(event = "liveness_mark_failed", error = %e);
            continue;
        }
        let n = sweep(&streams, &policies).await;
        if n > 0 {
            tracing::info!(event = "video_streams_adopted", streams = n);
        }
    }
}

/// One sweep: streams whose owner is dead are taken over here. Returns
/// how many were.
pub async fn sweep(streams: &Arc<Streams>, policies: &Arc<PolicyStore>) -> usize {
    let (Some(redis), Some(key)) = (&streams.cluster.redis, &streams.cluster.policy_key) else { return 0 };
    let me = &streams.cluster.node_id;
    let Ok(owned) = redis.stream_owners().await else { return 0 };
    let mut owners: Vec<String> = owned.iter().map(|(_, o)| o.clone()).filter(|o| o != me).collect();
    owners.sort();
    owners.dedup();
    let Ok(live) = redis.alive(&owners).await else { return 0 };
    let dead: std::collections::HashSet<&String> =
        owners.iter().zip(live).filter(|(_, l)| !l).map(|(o, _)| o).collect();
    let mut adopted = 0;
    for (id, owner) in owned.iter().filter(|(id, o)| dead.contains(o) && streams.get_any(id).is_none()) {
        let stored = match redis.get_stream(id).await {
            Ok(Some(s)) if &s.owner == owner => s,
            _ => continue,
        };
        let rec = match Record::open(id, &stored, key) {
            Ok(r) => r,
            Err(why) => {
                counted("dead_owner", why);
                tracing::error!(event = "video_record_refused", stream = %id, why, owner = %owner);
                continue;
            }
        };
        if adopt(streams, policies, rec, owner, "dead_owner").await.is_some() {
            adopted += 1;
        }
    }
    adopted
}

/// Claims the stream from `from` and registers it here, waiting for its
/// reader; `None` when another gateway was first or it cannot run here.
async fn adopt(
    streams: &Arc<Streams>,
    policies: &Arc<PolicyStore>,
    rec: Record,
    from: &str,
    trigger: &'static str,
) -> Option<Arc<Stream>> {
    let redis = streams.cluster.redis.as_ref()?;
    let Some(home) = streams.pool.index_of(&rec.engine) else {
        counted(trigger, "unknown_engine");
        tracing::warn!(event = "video_adopt_skipped", stream = %rec.id, engine = %rec.engine, why = "unknown_engine");
        return None;
    };
    if rec.chunks_total.is_some_and(|n| rec.chunks >= n) {
        counted(trigger, "completed");
        return None;
    }
    let me = streams.cluster.node_id.clone();
    let mut claimed = rec.clone();
    claimed.owner = me.clone();
    let (doc, mac) = claimed.seal(streams.cluster.policy_key.as_ref());
    match redis.claim_stream(&rec.id, (from, &me), &doc, &mac).await {
        Ok(true) => {}
        Ok(false) => {
            counted(trigger, "lost_race");
            return None;
        }
        Err(e) => {
            tracing::warn!(event = "video_adopt_failed", stream = %rec.id, error = %e);
            return None;
        }
    }
    // A local copy still registered (this gateway owned it before and
    // let it go): replace it.
    if let Some(old) = streams.get_any(&rec.id) {
        let_go(&old);
        streams.remove(&rec.id);
    }
    let params = StreamParams {
        fps: rec.fps,
        frames_per_chunk: rec.frames_per_chunk,
        resolution: rec.resolution,
        chunks: rec.chunks_total,
    };
    let chunk_s = f64::from(rec.frames_per_chunk) / f64::from(rec.fps);
    let budget = policies.current().video.initial_slack_factor * chunk_s;
    let stream = streams.insert_as(
        Some(rec.id.clone()),
        &rec.tenant,
        &rec.tier,
        rec.prompt.clone(),
        params,
        home,
        budget,
    );
    {
        let mut st = stream.lock();
        st.epoch = rec.epoch;
        st.epoch_base = rec.epoch_base;
        st.next_index = rec.chunks;
        st.awaiting_reader = true;
        st.replay = true;
        st.urgency = Urgency::Relaxed;
        st.suspended = true; // the engine has it; nothing runs until the reader
    }
    ::metrics::gauge!(m::VIDEO_STREAMS).increment(1.0);
    counted(trigger, "adopted");
    tracing::warn!(event = "video_stream_adopted", stream = %rec.id, from = %from, trigger, engine = %rec.engine, chunks = rec.chunks);
    tokio::spawn(driver::drive(Arc::clone(streams), Arc::clone(&stream), Arc::clone(policies)));
    Some(stream)
}

/// Whether a waiting stream can resume from `from` (the next chunk its
/// reader wants): not past what its engine may have made since the record
/// (at most [`RECENT_CHUNKS`](engine_api::video::RECENT_CHUNKS) ahead).
/// Err with the range it can resume from.
pub fn check_cursor(stream: &Stream, from: Option<u64>) -> Result<(), (u64, u64)> {
    let st = stream.lock();
    let most = st.next_index + engine_api::video::RECENT_CHUNKS as u64;
    match from {
        Some(f) if f > most => Err((st.epoch_base, most)),
        _ => Ok(()),
    }
}

/// Starts a waiting stream for the reader who came back, from `from`
/// (`None`: where the record left off; see [`check_cursor`]), its playout
/// starting now with `budget_s` of slack (the reader buffers anew).
pub fn start_reader(stream: &Stream, from: Option<u64>, now: f64, budget_s: f64) {
    let mut st = stream.lock();
    st.playout = policies::video::Playout::new(now, stream.chunk_s(), budget_s);
    if let Some(from) = from {
        // Chunks of an earlier prompt are gone with it.
        st.next_index = from.max(st.epoch_base);
    }
    st.awaiting_reader = false;
    drop(st);
    stream.wake.notify_one();
}
