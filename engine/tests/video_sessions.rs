//! The video session scheduler through its public handle: suspend and
//! resume restore bit-identical state, export / import continue the same
//! video on another engine, a full arena suspends the highest-credit
//! resident, ready chunks coalesce, and a prompt switch drops stale chunks.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use engine::backend::BackendKind;
use engine::video::{ChunkRequest, CreateSession, Resolution, VideoConfig, VideoEngine, VideoError};
use policies::video::{Fidelity, Precision, VideoProfile};

mod common;
fn profile() -> VideoProfile {
    common::video_profile("cpu-test", 3)
}

fn engine(backend: BackendKind, arena_slots: u32) -> VideoEngine {
    VideoEngine::spawn(VideoConfig {
        backend,
        profile: profile(),
        arena_slots,
        max_batch: 8,
        threads: 2,
        model_seed: 1,
        gpu: None,
        state_bytes: 0,
    })
}

fn create(id: &str, prompt: &str) -> CreateSession {
    CreateSession { id: id.into(), prompt: prompt.into(), resolution: Resolution::Tiny, latent_frames: 3 }
}

fn req(epoch: u32, credit: f64) -> ChunkRequest {
    ChunkRequest { epoch, fidelity: Fidelity::HIGHEST, key: credit, credit, sp: 1, at: None }
}

#[tokio::test]
async fn suspend_then_resume_restores_bit_identical_state_and_output() {
    let v = engine(BackendKind::Cpu, 4);
    v.create(create("a", "a lighthouse at dusk")).await.unwrap();
    v.create(create("b", "a lighthouse at dusk")).await.unwrap();
    for _ in 0..2 {
        v.chunk("a", req(0, 1.0)).await.unwrap();
        v.chunk("b", req(0, 1.0)).await.unwrap();
    }
    let before = v.state("a").await.unwrap();
    v.suspend("a").await.unwrap();
    assert_eq!(v.load().await.suspended, 1);
    assert_eq!(v.state("a").await.unwrap(), before, "host copy is exact");
    v.resume("a").await.unwrap();
    assert_eq!(v.state("a").await.unwrap(), before);
    // The next chunk is the same as the one of a stream never suspended.
    let a = v.chunk("a", req(0, 1.0)).await.unwrap();
    let b = v.chunk("b", req(0, 1.0)).await.unwrap();
    assert_eq!(a.index, 2);
    assert_eq!(a.frames, b.frames);
    assert_eq!(a.frames.len(), 12);
    // Export / import on another engine continues the same video.
    let other = engine(BackendKind::Cpu, 4);
    let bytes = v.export("a").await.unwrap();
    assert_eq!(v.chunk("a", req(0, 1.0)).await.unwrap_err(), VideoError::NoSession("a".into()));
    other.import("a", bytes).await.unwrap();
    let a = other.chunk("a", req(0, 1.0)).await.unwrap();
    let b = v.chunk("b", req(0, 1.0)).await.unwrap();
    assert_eq!((a.index, &a.frames), (3, &b.frames));
}

#[tokio::test]
async fn a_full_arena_suspends_the_highest_credit_resident() {
    let v = engine(BackendKind::Emulated, 2);
    for id in ["x", "y", "z"] {
        v.create(create(id, id)).await.unwrap();
    }
    assert_eq!(v.load().await.resident, 2, "the third starts suspended");
    v.chunk("x", req(0, 5.0)).await.unwrap();
    v.chunk("y", req(0, 0.5)).await.unwrap();
    // z needs a slot: x has the most credit and goes.
    v.chunk("z", req(0, 0.1)).await.unwrap();
    let load = v.load().await;
    assert_eq!((load.resident, load.suspended), (2, 1));
    assert!(v.state("x").await.is_ok());
    let before = load.suspends;
    v.chunk("y", req(0, 0.2)).await.unwrap(); // resident: no suspension
    assert_eq!(v.load().await.suspends, before);
}

#[tokio::test]
async fn coalesces_ready_chunks_and_drops_stale_epochs() {
    let v = engine(BackendKind::Emulated, 8);
    for id in ["p", "q", "r"] {
        v.create(create(id, id)).await.unwrap();
    }
    let (a, b, c) =
        tokio::join!(v.chunk("p", req(0, 1.0)), v.chunk("q", req(0, 2.0)), v.chunk("r", req(0, 3.0)));
    let sizes = [a.unwrap().batch, b.unwrap().batch, c.unwrap().batch];
    assert!(sizes.iter().any(|&s| s >= 2), "ready chunks share a batch: {sizes:?}");
    assert_eq!(v.prompt("p", "something else".into()).await.unwrap(), 1);
    assert_eq!(v.chunk("p", req(0, 1.0)).await.unwrap_err(), VideoError::StaleEpoch { got: 0, current: 1 });
    let fresh = v.chunk("p", req(1, 1.0)).await.unwrap();
    assert_eq!(fresh.index, 0, "a new prompt starts over");
    let odd = Fidelity { steps: 9, sparsity_pct: 0, window: 7, precision: Precision::Fp16 };
    let bad = ChunkRequest { fidelity: odd, ..req(1, 1.0) };
    assert!(matches!(v.chunk("p", bad).await, Err(VideoError::UnknownFidelity(_))));
}

#[tokio::test]
async fn a_malformed_import_is_refused_and_the_scheduler_keeps_serving() {
    let v = engine(BackendKind::Cpu, 4);
    v.create(create("a", "a lighthouse at dusk")).await.unwrap();
    v.chunk("a", req(0, 1.0)).await.unwrap();
    let good = v.export("a").await.unwrap();
    let meta_len = u32::from_le_bytes(good[..4].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&good[4..4 + meta_len]).unwrap();
    let with_meta = |m: serde_json::Value| {
        let m = m.to_string().into_bytes();
        let mut out = (m.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&m);
        out.extend_from_slice(&good[4 + meta_len..]);
        out
    };
    let mut huge = meta.clone();
    huge["latent_frames"] = 1_000_000.into(); // a chunk of gigabytes
    let mut other_shape = meta.clone();
    other_shape["latent_frames"] = 2.into(); // the stored chunks hold 3
    let mut short_prompt = good.clone();
    // The state's prompt vector length (right after seed and chunk count).
    let at = 4 + meta_len + 16;
    short_prompt[at..at + 8].copy_from_slice(&1u64.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", good[..good.len() - 3].to_vec()),
        ("meta length past the end", u32::MAX.to_le_bytes().to_vec()),
        ("huge latent_frames", with_meta(huge)),
        ("wrong chunk shape", with_meta(other_shape)),
        ("short prompt vector", short_prompt),
    ];
    for (what, bytes) in cases {
        assert_eq!(v.import("x", bytes).await.unwrap_err(), VideoError::BadState, "{what}");
    }
    // The good bytes still import, and the scheduler is alive.
    v.import("a", good).await.unwrap();
    assert_eq!(v.chunk("a", req(0, 1.0)).await.unwrap().index, 1);
}

/// An emulated engine at 100 ms per denoising step (400 ms at the highest
/// fidelity's 4 steps), batches of at most `max_batch`.
fn stepped(max_batch: u32) -> VideoEngine {
    let mut p = profile();
    p.configs.iter_mut().for_each(|c| c.chunk_ms = f64::from(c.fidelity.steps) * 100.0);
    VideoEngine::spawn(VideoConfig {
        backend: BackendKind::Emulated,
        profile: p,
        arena_slots: 8,
        max_batch,
        threads: 1,
        model_seed: 1,
        gpu: None,
        state_bytes: 0,
    })
}

#[tokio::test(start_paused = true)]
async fn an_urgent_chunk_preempts_a_full_batch_at_the_next_step_boundary() {
    // 100 ms per denoising step, 4 steps at the highest fidelity; batches
    // of at most 2: two RELAXED chunks take 4 × 150 ms together.
    let v = stepped(2);
    for id in ["r1", "r2", "u"] {
        v.create(create(id, id)).await.unwrap();
    }
    let start = tokio::time::Instant::now();
    let relaxed = {
        let v = v.clone();
        tokio::spawn(async move {
            let (a, b) = tokio::join!(v.chunk("r1", req(0, 10.0)), v.chunk("r2", req(0, 11.0)));
            (a.unwrap(), b.unwrap(), start.elapsed())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(160)).await;
    let urgent = v.chunk("u", req(0, -1.0)).await.unwrap();
    let urgent_at = start.elapsed();
    let (r1, r2, relaxed_at) = relaxed.await.unwrap();
    // Without preemption it would wait for the batch (600 ms) and then run
    // its 4 steps: 1000 ms. It takes the least urgent member's place at the
    // first step boundary after it arrives instead (r2 may have joined r1
    // at r1's first boundary), and is done by 900 ms.
    assert!(urgent_at.as_millis() <= 900, "urgent done at {urgent_at:?}");
    assert_eq!(v.load().await.preemptions, 1);
    // Nothing lost: the preempted chunk resumed from its progress.
    assert_eq!((r1.index, r2.index, urgent.index), (0, 0, 0));
    assert!(
        relaxed_at >= urgent_at,
        "the preempted chunk finished after the urgent one: {relaxed_at:?} {urgent_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_sp2_chunk_takes_the_profiles_share_of_the_time_and_a_donor_pays_for_its_half() {
    let v = stepped(4);
    v.create(create("s", "s")).await.unwrap();
    let timed = |sp: u8| {
        let v = v.clone();
        async move {
            let t = tokio::time::Instant::now();
            v.chunk("s", ChunkRequest { sp, ..req(0, 1.0) }).await.unwrap();
            t.elapsed().as_millis()
        }
    };
    assert_eq!(timed(1).await, 400);
    assert_eq!(timed(2).await, 240, "sp2_factor 0.6 of 400 ms");
    assert!(matches!(v.chunk("s", ChunkRequest { sp: 3, ..req(0, 1.0) }).await, Err(VideoError::BadSp(3))));
    // Lending 1 s to another engine's SP2 chunk slows this engine's own
    // batches while it lasts (a slot and its coalescing cost).
    v.lend(1000.0).await.unwrap();
    assert!(timed(1).await > 400);
    assert_eq!(v.load().await.lends, 1);
}

#[tokio::test]
async fn staged_copies_are_bounded_by_the_arena_and_snapshots_need_an_offer() {
    let source = engine(BackendKind::Emulated, 8);
    let target = engine(BackendKind::Emulated, 1);
    let token = "0123456789abcdef".to_string();
    let mut copies = Vec::new();
    for id in ["x", "y"] {
        source.create(create(id, id)).await.unwrap();
        assert!(matches!(source.snapshot(id, token.clone(), None).await, Err(VideoError::NoOffer(_))));
        source.offer(id, token.clone()).await.unwrap();
        assert!(matches!(
            source.snapshot(id, "wrong-token-000000".into(), None).await,
            Err(VideoError::NoOffer(_))
        ));
        copies.push(source.snapshot(id, token.clone(), None).await.unwrap());
    }
    // One arena slot: one staged copy; a second peer's waits its turn.
    target.stage("x", copies[0].clone()).await.unwrap();
    assert_eq!(target.stage("y", copies[1].clone()).await, Err(VideoError::Busy));
    target.unstage("x").await.unwrap();
    target.stage("y", copies[1].clone()).await.unwrap();
}

/// A gateway resuming a stream another gateway drove asks for chunks by
/// index: those already generated come back from the engine's recent
/// chunks, byte-identical and marked replayed, the next is generated, one
/// under way is "ask again", and one past the recent window is gone.
#[tokio::test(start_paused = true)]
async fn chunks_asked_for_by_index_replay_the_recent_ones_and_generate_the_next() {
    let v = stepped(4);
    v.create(create("s", "s")).await.unwrap();
    let at = |i: u64| ChunkRequest { at: Some(i), ..req(0, 1.0) };
    let mut made = Vec::new();
    for _ in 0..engine_api::video::RECENT_CHUNKS + 2 {
        made.push(v.chunk("s", req(0, 1.0)).await.unwrap());
    }
    let last = made.len() as u64 - 1;
    // The last one again: replayed, same frames, no time spent.
    let t = tokio::time::Instant::now();
    let again = v.chunk("s", at(last)).await.unwrap();
    assert_eq!(t.elapsed().as_millis(), 0);
    assert!(again.replayed && !made[last as usize].replayed);
    assert_eq!((again.index, &again.frames), (last, &made[last as usize].frames));
    // The oldest still kept, and the one before it (gone).
    let oldest = last + 1 - engine_api::video::RECENT_CHUNKS as u64;
    assert_eq!(v.chunk("s", at(oldest)).await.unwrap().index, oldest);
    assert!(matches!(v.chunk("s", at(oldest - 1)).await, Err(VideoError::ChunkGone { .. })));
    // The next by index is generated. Asked for twice at once, the second
    // is told it is under way (ask again); asked for while its batch runs,
    // a request waits for the batch and gets it replayed.
    let (first, second) = tokio::join!(v.chunk("s", at(last + 1)), v.chunk("s", at(last + 1)));
    let first = first.unwrap();
    assert!(!first.replayed && first.index == last + 1);
    assert!(matches!(second, Err(VideoError::ChunkInFlight { at }) if at == last + 1), "{second:?}");
    let a = v.clone();
    let running = tokio::spawn(async move { a.chunk("s", at(last + 2)).await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await; // it takes 400 ms
    let waited = v.chunk("s", at(last + 2)).await.unwrap();
    assert!(!running.await.unwrap().unwrap().replayed && waited.replayed && waited.index == last + 2);
    // Past what was generated: "in flight" (the caller asks again later),
    // never a chunk labelled with an index it is not.
    assert!(matches!(v.chunk("s", at(last + 5)).await, Err(VideoError::ChunkInFlight { .. })));
    // A new prompt starts the count over and drops the old chunks.
    assert_eq!(v.prompt("s", "t".into()).await.unwrap(), 1);
    let fresh = ChunkRequest { at: Some(0), ..req(1, 1.0) };
    assert_eq!(v.chunk("s", fresh).await.unwrap().index, 0);
}
