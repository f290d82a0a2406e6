//! Moving a stream between engines at its chunk boundaries (the control
//! tick's plan; asynchronous pre-copy or synchronous transfer) and taking
//! it over when its engine is lost (adopting a staged copy, or starting
//! over from the prompt).

use std::sync::Arc;

use engine_api::video::CreateSession;
use policies::video::{TransferMode, VideoConfig};
use serde_json::json;

use super::super::engine as calls;
use super::super::{Moving, Stream, Streams};
use crate::metrics as m;

/// Moves the stream if the control tick planned it, at a chunk boundary
/// (no chunk of it is in flight: its driver is here).
///
/// `async` transfer: the first boundary after the plan starts a pre-copy
/// in the background (the source offers the session under a one-time
/// token, the target pulls and stages a full copy straight from it) and
/// the stream keeps generating on the source; at the first boundary after
/// the copy is staged, the target pulls what changed since and commits,
/// and only then does the home switch and the source's copy end. The stall
/// is that last step. Any failure leaves the stream on the source.
///
/// `sync` transfer (the baseline): export from the source, through the
/// gateway, import on the target, the stream waiting throughout; a failed
/// import goes back to the source.
pub(super) async fn migrate_if_planned(streams: &Arc<Streams>, stream: &Arc<Stream>, cfg: &VideoConfig) {
    let started = streams.now();
    let step = {
        let mut st = stream.lock();
        match (&st.moving, st.move_to) {
            (Some(m), _) if m.staged => Step::Commit(m.clone()),
            (Some(_), _) => return, // the pre-copy is running
            (None, Some(to)) if to != st.home => {
                st.move_to = None;
                Step::Start { from: st.home, to }
            }
            _ => {
                st.move_to = None;
                return;
            }
        }
    };
    match (step, cfg.transfer) {
        (Step::Start { from, to }, TransferMode::Sync) => {
            if move_sync(streams, stream, from, to).await {
                switched(streams, stream, from, to, streams.now() - started);
            }
        }
        (Step::Start { from, to }, TransferMode::Async) => start_precopy(streams, stream, from, to, started),
        (Step::Commit(mv), _) => commit(streams, stream, mv, started).await,
    }
}

/// Starts an asynchronous move's pre-copy in the background: the source
/// offers the session, the target pulls and stages a full copy; the stream
/// keeps generating on the source and commits at a later boundary.
fn start_precopy(streams: &Arc<Streams>, stream: &Arc<Stream>, from: usize, to: usize, started: f64) {
    let token = transfer_token();
    stream.lock().moving = Some(Moving { to, from, token: token.clone(), staged: false, started });
    let (streams, stream) = (Arc::clone(streams), Arc::clone(stream));
    tokio::spawn(async move {
        let copied = match calls::offer(&streams.pool, from, &stream.id, &token).await {
            Ok(_) => calls::pull(&streams.pool, to, &stream.id, from, &token, false).await,
            Err(e) => Err(e),
        };
        let failed = {
            let mut st = stream.lock();
            match copied {
                Ok(p) if st.home == from && st.ended.is_none() => {
                    streams.measured_state_bytes(p.bytes);
                    ::metrics::histogram!(m::VIDEO_TRANSFER, "phase" => "copy").record(p.ms / 1e3);
                    if let Some(m) = st.moving.as_mut() {
                        m.staged = true;
                    }
                    stream.wake.notify_one();
                    None
                }
                outcome => {
                    st.moving = None;
                    Some(outcome.err())
                }
            }
        };
        if let Some(error) = failed {
            if let Some(e) = error {
                tracing::warn!(event = "video_precopy_failed", stream = %stream.id, from, to, error = %e);
            }
            let _ = calls::unstage(&streams.pool, to, &stream.id).await;
        }
    });
}

/// The switch of an asynchronous move (or a staged copy's adoption when
/// the source died meanwhile); the stall is this step.
async fn commit(streams: &Arc<Streams>, stream: &Arc<Stream>, mv: Moving, started: f64) {
    let committed = calls::pull(&streams.pool, mv.to, &stream.id, mv.from, &mv.token, true).await;
    stream.lock().moving = None;
    match committed {
        Ok(p) => {
            ::metrics::histogram!(m::VIDEO_TRANSFER, "phase" => "switch").record(p.ms / 1e3);
            switched(streams, stream, mv.from, mv.to, streams.now() - started);
            // The target owns it now; the source's copy goes.
            let _ = calls::end(&streams.pool, mv.from, &stream.id).await;
        }
        Err(e) => {
            tracing::warn!(event = "video_commit_failed", stream = %stream.id, from = mv.from, to = mv.to, error = %e);
            // Does the source still hold the session? If it does not
            // answer at all it is gone: the target's staged copy is
            // the last state it offloaded, and the stream goes on
            // from it (rehome_lost adopts it).
            let source = calls::offer(&streams.pool, mv.from, &stream.id, &mv.token).await;
            if source.as_ref().is_err_and(|e| e.status.is_none()) {
                stream.lock().moving = Some(mv);
                if let Err(reason) = rehome_lost(streams, stream).await {
                    tracing::error!(event = "video_state_lost", stream = %stream.id, reason);
                }
                return;
            }
            // The stream stays on the source, which still has it. The
            // target may have committed with its answer lost: its
            // copy goes too, so no second owner is left behind.
            let _ = calls::unstage(&streams.pool, mv.to, &stream.id).await;
            let _ = calls::end(&streams.pool, mv.to, &stream.id).await;
        }
    }
}

enum Step {
    Start { from: usize, to: usize },
    Commit(Moving),
}

/// 128 random bits, hex: a transfer's one-time token.
fn transfer_token() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut b).expect("the system RNG works");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The stream's home is now `to`: the move took `stall_s` of its time.
fn switched(streams: &Streams, stream: &Arc<Stream>, from: usize, to: usize, stall_s: f64) {
    let mut st = stream.lock();
    st.home = to;
    st.last_moved = Some(streams.now());
    st.rehomes += 1;
    st.migration_stall_s += stall_s;
    drop(st);
    streams.record_home(stream);
    ::metrics::counter!(m::VIDEO_REHOMES).increment(1);
    ::metrics::histogram!(m::VIDEO_MOVE_STALL).record(stall_s);
    tracing::info!(event = "video_rehomed", stream = %stream.id, from, to, stall_ms = stall_s * 1e3);
}

/// Export → import through the gateway; true when the target has it.
async fn move_sync(streams: &Streams, stream: &Stream, from: usize, to: usize) -> bool {
    let state = match calls::export(&streams.pool, from, &stream.id).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(event = "video_export_failed", stream = %stream.id, error = %e);
            return false;
        }
    };
    streams.measured_state_bytes(state.len() as u64);
    match calls::import(&streams.pool, to, &stream.id, state.clone()).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(event = "video_import_failed", stream = %stream.id, to, error = %e);
            if let Err(e) = calls::import(&streams.pool, from, &stream.id, state).await {
                tracing::error!(event = "video_state_lost", stream = %stream.id, error = %e);
            }
            false
        }
    }
}

/// The home engine is gone (it died, or no longer has the session). If a
/// move had staged a full copy on another engine, that engine adopts it
/// and the stream goes on from the state its source last offloaded;
/// otherwise it starts over from its prompt on the engine with the fewest
/// streams. Either way the feed says so (`recovered`, with what was kept):
/// never a silent loss of the stream's context.
pub(super) async fn rehome_lost(streams: &Streams, stream: &Arc<Stream>) -> Result<(), &'static str> {
    let (staged, lost) = {
        let mut st = stream.lock();
        let moving = st.moving.take();
        (moving.filter(|m| m.staged && m.from == st.home), st.home)
    };
    if let Some(m) = staged {
        if streams.pool.slot(m.to).is_ready() {
            if let Ok(v) = calls::adopt(&streams.pool, m.to, &stream.id).await {
                stream.lock().home = m.to;
                streams.record_home(stream);
                tracing::warn!(event = "video_adopted", stream = %stream.id, from = lost, engine = m.to,
                    state_chunks = v.chunks);
                recovered(streams, stream, "staged_copy", m.to, Some(v.chunks));
                return Ok(());
            }
        }
        let _ = calls::unstage(&streams.pool, m.to, &stream.id).await;
    }
    let home = policies::video::placement::home(&streams.per_engine()).ok_or("no_engine")?;
    let (prompt, epoch) = {
        let st = stream.lock();
        (st.prompt.clone(), st.epoch)
    };
    let create = CreateSession {
        id: stream.id.clone(),
        prompt,
        resolution: stream.params.resolution,
        latent_frames: stream.params.frames_per_chunk / 4,
    };
    calls::create(&streams.pool, home, &create).await.map_err(|_| "no_engine")?;
    for _ in 0..epoch {
        // Bring the new session to the stream's epoch (same prompt).
        let p = stream.lock().prompt.clone();
        calls::prompt(&streams.pool, home, &stream.id, &p).await.map_err(|_| "no_engine")?;
    }
    stream.lock().home = home;
    streams.record_home(stream);
    tracing::warn!(event = "video_restarted", stream = %stream.id, from = lost, engine = home);
    recovered(streams, stream, "prompt", home, None);
    Ok(())
}

/// Tells the feed the stream lost its engine and what it goes on from:
/// `staged_copy` (the state a move had copied, `state_chunks` chunks in)
/// or `prompt` (its context is gone; the next chunk starts from the prompt).
fn recovered(
    streams: &Streams,
    stream: &Stream,
    from: &'static str,
    engine: usize,
    state_chunks: Option<u64>,
) {
    let engine = streams.pool.slot(engine).spec.id.clone();
    ::metrics::counter!(m::VIDEO_RECOVERIES, "from" => from).increment(1);
    let next = {
        // The engine counts this epoch's chunks from the copy's (or from 0).
        let mut st = stream.lock();
        st.epoch_base = st.next_index.saturating_sub(state_chunks.unwrap_or(0));
        st.next_index
    };
    let _ = stream.emit(
        "recovered",
        json!({"reason": "engine_lost", "from": from, "engine": engine, "next_index": next, "state_chunks": state_chunks}),
    );
}
