//! One task per stream: at every chunk boundary it moves the stream if the
//! control tick planned a move (export -> import -> switch home: never two
//! owners), waits while enough video is buffered, picks the next chunk's
//! fidelity (Bi-Modal Pareto Routing, or the static or fixed-level
//! baseline), computes the
//! stream's credit and the engine ordering key, asks the home engine for
//! the chunk, and delivers it: playout accounting, `chunk` / `stall`
//! events, the `end` event when the stream is done.

use std::sync::Arc;
use std::time::Duration;

use engine_api::video::ChunkRequest;
use policies::video::{self as pv, ChunkOrder, VideoConfig};
use serde_json::json;

use super::engine as calls;
use super::{fidelity_label, Stream, Streams};
use crate::metrics as m;
use crate::outbox::Stop;
use crate::reload::PolicyStore;

/// Streams are kept this long after they end (status and a late feed).
const KEEP_ENDED: Duration = Duration::from_secs(60);

mod moves;
mod plan;

use moves::{migrate_if_planned, rehome_lost};
use plan::{plan, Plan};

/// Drives `stream` until it ends.
pub async fn drive(streams: Arc<Streams>, stream: Arc<Stream>, policies: Arc<PolicyStore>) {
    let reason = loop {
        if let Some(reason) = stream.lock().ended {
            break reason;
        }
        if stream.abandoned(streams.now()) {
            break "abandoned";
        }
        if stream.lock().awaiting_reader {
            // Taken over from a dead gateway: wait for the client to resume
            // the feed here, making sure no other gateway took it meanwhile.
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if !super::adopt::still_owned(&streams, &stream.id).await {
                        break "moved";
                    }
                }
                () = stream.wake.notified() => {}
            }
            continue;
        }
        if stream.lock().playout.paused_for(streams.now()) > policies.current().video.max_pause_s {
            break "paused_too_long";
        }
        if !stream.feed.has_room() {
            // The reader is behind by a whole feed buffer: generate nothing
            // more (the state waits in the engine's host memory) until it
            // catches up; a reader that stops reading ends the stream.
            suspend(&streams, &stream).await;
            tokio::select! {
                r = stream.feed.room(streams.feed_stall) => match r {
                    Ok(()) => {}
                    Err(Stop::Gone) => break "client_gone",
                    Err(Stop::Stalled) => {
                        ::metrics::counter!(m::STREAM_RESETS, "why" => "video_feed_stall").increment(1);
                        break "reader_stalled";
                    }
                },
                () = stream.wake.notified() => {}
            }
            continue;
        }
        let cfg = policies.current().video.clone();
        migrate_if_planned(&streams, &stream, &cfg).await;
        if let Some(wait) =
            buffered_wait(&streams, &stream, &cfg).or_else(|| relaxed_yield(&streams, &stream, &cfg))
        {
            suspend_if_idle(&streams, &stream).await;
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stream.wake.notified() => {}
            }
            continue;
        }
        match next_chunk(&streams, &stream, &cfg).await {
            Ok(()) => {}
            Err(reason) => break reason,
        }
        let st = stream.lock();
        if stream.params.chunks.is_some_and(|n| st.next_index >= n) {
            break "completed";
        }
    };
    finish(&streams, &stream, reason).await;
}

/// How long to wait before asking for another chunk (enough buffered, or
/// paused with a full buffer); `None`: ask now.
fn buffered_wait(streams: &Streams, stream: &Stream, cfg: &VideoConfig) -> Option<Duration> {
    let st = stream.lock();
    let slack = st.playout.slack(streams.now());
    let excess = slack - cfg.max_buffer_s;
    if excess <= 0.0 {
        return None;
    }
    // Paused: slack stands still, wait for a resume (re-checked each second).
    let wait = if st.playout.paused() { 1.0 } else { excess.min(1.0) };
    Some(Duration::try_from_secs_f64(wait.max(0.005)).unwrap_or(Duration::from_secs(1)))
}

/// A paused stream with a full buffer is idle: its state goes to the
/// engine's host memory, freeing its arena slot (the engine resumes it
/// with the next chunk).
async fn suspend_if_idle(streams: &Streams, stream: &Stream) {
    if stream.lock().playout.paused() {
        suspend(streams, stream).await;
    }
}

/// Moves the stream's state to its engine's host memory (once).
async fn suspend(streams: &Streams, stream: &Stream) {
    let home = {
        let mut st = stream.lock();
        if st.suspended || st.ended.is_some() {
            return;
        }
        st.suspended = true;
        st.home
    };
    if let Err(e) = calls::suspend(&streams.pool, home, &stream.id).await {
        tracing::debug!(event = "video_suspend_failed", stream = %stream.id, error = %e);
    }
}

/// Credit tiers: a RELAXED stream does not ask for a chunk while its engine
/// has an URGENT one; it leaves the batch slot to it and looks again soon
/// (its credit falls as it plays, so it never waits long).
fn relaxed_yield(streams: &Streams, stream: &Stream, cfg: &VideoConfig) -> Option<Duration> {
    if cfg.order != ChunkOrder::Credit {
        return None;
    }
    let (home, relaxed) = {
        let st = stream.lock();
        let next_s = st.next.map_or(stream.chunk_s(), |(_, t)| t);
        let credit = pv::credit(st.playout.slack(streams.now()), 0.0, next_s);
        (st.home, pv::urgency(credit, next_s, cfg.alpha) == pv::Urgency::Relaxed)
    };
    if !relaxed {
        return None;
    }
    let urgent_there = streams.all().iter().any(|s| {
        if s.id == stream.id {
            return false;
        }
        let st = s.lock();
        st.ended.is_none() && st.home == home && st.urgency == pv::Urgency::Urgent
    });
    urgent_there.then_some(Duration::from_millis(50))
}

/// Elastic SP (SlackServe §4.3, Appendix C.3): the donor this chunk runs
/// with, if any. A stream with negative credit borrows the engine whose
/// streams are all RELAXED (or that has none) with the highest lowest
/// credit, not its home and not lent to another stream; it keeps it while
/// URGENT and releases it at the first chunk boundary out of that tier.
fn donor_for(
    streams: &Streams,
    stream: &Stream,
    cfg: &VideoConfig,
    credit: f64,
    home: usize,
) -> Option<usize> {
    let mut st = stream.lock();
    if !cfg.elastic_sp {
        st.donor = None;
        return None;
    }
    if let Some(d) = st.donor {
        if st.urgency != pv::Urgency::Urgent || !streams.pool.slot(d).routable_for_video() || d == home {
            st.donor = None;
            return None;
        }
        return Some(d);
    }
    if credit >= 0.0 {
        return None;
    }
    drop(st);
    // Per engine: the lowest credit of its live streams, and whether any
    // is not RELAXED or it is lent already.
    let n = streams.pool.len();
    let mut lowest = vec![f64::INFINITY; n];
    let mut ruled_out = vec![false; n];
    for s in streams.all() {
        if s.id == stream.id {
            continue;
        }
        let st = s.lock();
        if st.ended.is_some() {
            continue;
        }
        if let Some(d) = st.donor {
            ruled_out[d] = true;
        }
        if let Some(l) = lowest.get_mut(st.home) {
            *l = l.min(st.credit_s);
            ruled_out[st.home] |= st.urgency != pv::Urgency::Relaxed;
        }
    }
    let donor = (0..n)
        .filter(|&i| i != home && !ruled_out[i] && streams.pool.slot(i).routable_for_video())
        .max_by(|&a, &b| lowest[a].total_cmp(&lowest[b]).then(b.cmp(&a)))?;
    let mut st = stream.lock();
    st.donor = Some(donor);
    st.sp_borrows += 1;
    ::metrics::counter!(m::VIDEO_SP_BORROWS).increment(1);
    tracing::info!(event = "video_sp_borrow", stream = %stream.id, home, donor, credit_ms = credit * 1e3);
    Some(donor)
}

/// Asks the home engine for the next chunk and delivers it.
async fn next_chunk(streams: &Streams, stream: &Arc<Stream>, cfg: &VideoConfig) -> Result<(), &'static str> {
    let home = stream.lock().home;
    let Some(profile) = streams.profiles.get(home).await else {
        return rehome_lost(streams, stream).await;
    };
    let k = streams.per_engine().iter().find(|(i, _)| *i == home).map_or(1, |(_, n)| *n);
    let now = streams.now();
    let (req, plan, donor) = {
        let mut st = stream.lock();
        let slack = st.playout.slack(now);
        let mut plan = plan(cfg, &profile, slack, stream.chunk_s(), k);
        let credit = pv::credit(slack, 0.0, plan.expected_s);
        st.credit_s = credit;
        st.urgency = pv::urgency(credit, plan.expected_s, cfg.alpha);
        drop(st);
        let donor = donor_for(streams, stream, cfg, credit, home);
        let mut st = stream.lock();
        if donor.is_some() {
            plan.expected_s *= profile.sp2_factor;
        }
        st.next = Some((plan.fidelity, plan.expected_s));
        st.in_flight = Some((now, plan.expected_s));
        let key = cfg.order.key(streams.unix_s(now), credit, slack);
        let sp = if donor.is_some() { 2 } else { 1 };
        let at = st.replay.then(|| st.next_index.saturating_sub(st.epoch_base));
        (ChunkRequest { epoch: st.epoch, fidelity: plan.fidelity, key, credit, sp, at }, plan, donor)
    };
    if let Some(d) = donor {
        let (pool, ms) = (Arc::clone(&streams.pool), plan.expected_s * 1e3);
        tokio::spawn(async move {
            let _ = calls::lend(&pool, d, ms).await;
        });
    }
    stream.lock().suspended = false; // the engine resumes it for this chunk
    let asked = streams.now();
    let result = calls::chunk(&streams.pool, home, &stream.id, &req).await;
    stream.lock().in_flight = None;
    match result {
        Ok(out) => {
            {
                let mut st = stream.lock();
                if !out.replayed {
                    st.replay = false; // caught up: the engine made this one now
                }
                st.replay_waits = 0;
            }
            deliver(streams, stream, out, plan, home, asked);
            streams.record_home(stream);
            Ok(())
        }
        Err(e) if e.status == Some(http::StatusCode::CONFLICT) => after_conflict(streams, stream).await,
        // Replaying: the chunk asked for is being made (ask again), or is
        // older than the engine keeps (go on from the engine's next).
        Err(e) if e.status.is_some_and(|s| s.as_u16() == 425) => {
            let waits = {
                let st = &mut *stream.lock();
                under_way(&mut st.replay, &mut st.replay_waits)
            };
            tracing::debug!(event = "video_replay_wait", stream = %stream.id, waits);
            tokio::time::sleep(REPLAY_WAIT).await;
            Ok(())
        }
        Err(e) if e.status == Some(http::StatusCode::GONE) => {
            let index = {
                let mut st = stream.lock();
                st.replay = false;
                st.next_index
            };
            tracing::warn!(event = "video_replay_gap", stream = %stream.id, index, error = %e);
            ::metrics::counter!(m::VIDEO_ADOPTIONS, "trigger" => "replay", "result" => "gap").increment(1);
            let _ = stream.emit("gap", json!({"index": index, "reason": "older_than_the_engine_keeps"}));
            Ok(())
        }
        // The engine no longer has the session (it restarted, or a move
        // lost the state): start the stream over rather than end it.
        Err(e) if e.status == Some(http::StatusCode::NOT_FOUND) => {
            tracing::warn!(event = "video_session_missing", stream = %stream.id, engine = home, error = %e);
            rehome_lost(streams, stream).await
        }
        Err(e) => {
            tracing::warn!(event = "video_chunk_failed", stream = %stream.id, engine = home, error = %e);
            if streams.pool.slot(home).is_ready() && e.status.is_some() {
                return Err("engine_error");
            }
            rehome_lost(streams, stream).await
        }
    }
}

fn deliver(
    streams: &Streams,
    stream: &Stream,
    out: engine_api::video::ChunkOut,
    plan: Plan,
    engine: usize,
    asked: f64,
) {
    let now = streams.now();
    let mut st = stream.lock();
    if out.epoch != st.epoch {
        return; // made for the previous prompt
    }
    st.conflicts = 0;
    let (deadline, met) = st.playout.deliver(now);
    let index = st.next_index;
    st.next_index += 1;
    if met {
        st.on_time += 1;
    } else {
        st.stalls += 1;
        st.stall_s += now - deadline;
        let _ = stream.emit("stall", json!({"index": index, "late_ms": (now - deadline) * 1e3}));
        ::metrics::counter!(m::VIDEO_STALLS, "tier" => stream.tier.clone()).increment(1);
    }
    if st.ttfc_s.is_none() {
        st.ttfc_s = Some(now - stream.created);
    }
    ::metrics::counter!(m::VIDEO_CHUNKS, "tier" => stream.tier.clone(), "on_time" => if met { "true" } else { "false" }, "mode" => plan.mode)
        .increment(1);
    m::add_video_seconds(stream.chunk_s()); // cost per video minute
    let slack = st.playout.slack(now);
    let delivered = stream.emit_chunk(
        index,
        json!({
            "index": index,
            "prompt_epoch": st.epoch,
            "fidelity": fidelity_label(&out.fidelity),
            "mode": plan.mode,
            "quality": plan.quality,
            "ready_ms": (now - stream.created) * 1e3,
            "deadline_ms": (deadline - stream.created) * 1e3,
            "slack_ms": slack * 1e3,
            "engine": streams.pool.slot(engine).spec.id,
            "batch": out.batch,
            "compute_ms": out.compute_ms,
            "latency_ms": (now - asked) * 1e3,
            "sp": if st.donor.is_some() { 2 } else { 1 },
            "replayed": out.replayed,
            "frames": out.frames,
        }),
    );
    if !delivered && st.ended.is_none() {
        st.ended = Some("client_gone"); // the reader disconnected
    }
}

/// "Under way" answers in a row before a replaying driver stops asking by
/// index ([`REPLAY_WAIT`] apart: 2 s, well over a chunk's time).
const MAX_REPLAY_WAITS: u32 = 100;
/// How long a replaying driver waits before asking again for a chunk the
/// engine says is under way.
const REPLAY_WAIT: Duration = Duration::from_millis(20);

/// One more "under way" (425) answer while replaying: counted, and past
/// [`MAX_REPLAY_WAITS`] in a row the driver stops asking by index (an
/// engine that says so forever costs a bounded wait, then the stream goes
/// on from the engine's next chunk). Returns the count.
fn under_way(replay: &mut bool, waits: &mut u32) -> u32 {
    *waits += 1;
    if *waits > MAX_REPLAY_WAITS {
        *replay = false;
    }
    *waits
}

/// Conflicts in a row before the driver takes the engine's epoch.
const MAX_CONFLICTS: u32 = 3;

/// A chunk refused as of a stale epoch: a prompt switch overtook it, and
/// it is dropped. Several in a row mean the gateway's epoch and the
/// engine's disagree (an engine restarted, a switch cut short): the driver
/// switches the engine to the stream's current prompt again and takes the
/// epoch it answers, instead of asking again and again.
async fn after_conflict(streams: &Streams, stream: &Stream) -> Result<(), &'static str> {
    let (n, home, prompt) = {
        let mut st = stream.lock();
        st.conflicts += 1;
        (st.conflicts, st.home, st.prompt.clone())
    };
    if n < MAX_CONFLICTS {
        tokio::time::sleep(Duration::from_millis(20)).await;
        return Ok(());
    }
    tracing::warn!(event = "video_epoch_resync", stream = %stream.id, conflicts = n);
    match calls::prompt(&streams.pool, home, &stream.id, &prompt).await {
        Ok(epoch) => {
            let mut st = stream.lock();
            st.epoch = epoch; // the engine's, whichever side was ahead
            st.epoch_base = st.next_index;
            st.conflicts = 0;
            Ok(())
        }
        Err(_) => Err("epoch_mismatch"),
    }
}

async fn finish(streams: &Arc<Streams>, stream: &Arc<Stream>, reason: &'static str) {
    let (home, moving) = {
        let mut st = stream.lock();
        st.ended = Some(reason);
        (st.home, st.moving.take())
    };
    // Another gateway drives it now: its engine session is not ours to end.
    if reason == "moved" || !super::adopt::release(streams, stream).await {
        ::metrics::gauge!(m::VIDEO_STREAMS).decrement(1.0);
        stream.feed.finish();
        let (streams, stream) = (Arc::clone(streams), Arc::clone(stream));
        tokio::spawn(async move {
            tokio::time::sleep(KEEP_ENDED).await;
            streams.remove_exact(&stream);
        });
        return;
    }
    let _ = calls::end(&streams.pool, home, &stream.id).await;
    if let Some(m) = moving {
        let _ = calls::unstage(&streams.pool, m.to, &stream.id).await;
    }
    let st = stream.lock();
    let _ = stream.emit(
        "end",
        json!({
            "reason": reason,
            "chunks": st.next_index,
            "cpr": Stream::cpr(&st),
            "ttfc_ms": st.ttfc_s.map(|t| t * 1e3),
            "stalls": st.stalls,
            "stall_ms": st.stall_s * 1e3,
            "rehomes": st.rehomes,
            "migration_stall_ms": st.migration_stall_s * 1e3,
            "sp_borrows": st.sp_borrows,
        }),
    );
    drop(st);
    stream.feed.finish();
    ::metrics::gauge!(m::VIDEO_STREAMS).decrement(1.0);
    let (streams, stream) = (Arc::clone(streams), Arc::clone(stream));
    tokio::spawn(async move {
        tokio::time::sleep(KEEP_ENDED).await;
        streams.remove_exact(&stream);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_that_says_under_way_forever_is_asked_by_index_for_a_bounded_time() {
        let (mut replay, mut waits) = (true, 0);
        let mut asked = 0;
        while replay {
            under_way(&mut replay, &mut waits);
            asked += 1;
            assert!(asked <= 1000, "never stops asking by index");
        }
        assert_eq!(asked, MAX_REPLAY_WAITS + 1);
        assert!(REPLAY_WAIT * asked <= Duration::from_secs(3), "{:?}", REPLAY_WAIT * asked);
    }
}
