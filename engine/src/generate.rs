//! One sequence's generation loop on the emulated backend.
//!
//! Prefill waits `profile.prefill(prompt_tokens)` and yields the first token;
//! each further token waits one decode step for the current batch size and
//! context. Every wait also watches the output channel: when the gateway
//! cancels (HTTP/2 RST_STREAM drops the response body and with it the
//! receiver), the loop stops at once and the [`SequenceGuard`] returns the
//! sequence's pages.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::api::{Event, FinishReason, GenerateRequest, Usage};
use crate::backend::emulated::TextSource;
use crate::load::SequenceGuard;
use crate::stop::{Step, StopMatcher};
use crate::Engine;

/// Runs one admitted sequence to completion or cancellation, writing NDJSON
/// event lines to `tx`.
pub async fn run(
    engine: Arc<Engine>,
    req: GenerateRequest,
    prompt_tokens: u32,
    mut guard: SequenceGuard,
    tx: mpsc::Sender<Bytes>,
) {
    let started = Instant::now();
    // Tokens are due at absolute deadlines so the timer's rounding does not
    // accumulate: the mean cadence is exactly the profile's.
    let mut due = tokio::time::Instant::now();
    let mut text = TextSource::new(&req.prompt, req.seed);
    let mut stops = StopMatcher::new(&req.stop);
    let mut generated: u32 = 0;
    let mut prefill_ms = 0.0;
    let finish = loop {
        if generated >= req.max_tokens {
            break FinishReason::Length;
        }
        let wait = if generated == 0 {
            engine.profile.prefill(prompt_tokens)
        } else {
            let batch = engine.load.batch_size();
            engine.profile.decode_step(batch, prompt_tokens + generated)
        };
        due += wait;
        if !pause(&tx, due).await {
            return; // cancelled: the guard releases on drop
        }
        if generated == 0 {
            prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        } else {
            engine.load.record_decode_step(wait.as_secs_f64() * 1e3);
        }
        let Some(token) = text.next_token() else { break FinishReason::Stop };
        generated += 1;
        if guard.ensure_tokens(u64::from(prompt_tokens) + u64::from(generated)).is_err() {
            // No page to grow into. Preemption (requeue at a token boundary)
            // comes with the scheduler; until then the sequence fails cleanly.
            let error = Event::Error {
                code: "kv_exhausted".into(),
                message: "KV cache exhausted mid-sequence".into(),
            };
            send(&tx, &error).await;
            return;
        }
        let (emit, stopped) = match stops.push(&token) {
            Step::Emit(t) => (t, false),
            Step::Stopped(t) => (t, true),
        };
        if !emit.is_empty() && !send(&tx, &Event::Token { text: emit }).await {
            return;
        }
        if stopped {
            break FinishReason::Stop;
        }
    };
    let tail = stops.finish();
    if !tail.is_empty() && !send(&tx, &Event::Token { text: tail }).await {
        return;
    }
    let usage = Usage { prompt_tokens, completion_tokens: generated };
    let done = Event::Done { finish_reason: finish, usage, queue_ms: 0.0, prefill_ms };
    send(&tx, &done).await;
    drop(guard);
}

/// Waits until `due` unless the receiver goes away first; `false` means
/// cancelled.
async fn pause(tx: &mpsc::Sender<Bytes>, due: tokio::time::Instant) -> bool {
    if due <= tokio::time::Instant::now() {
        tokio::task::yield_now().await;
        return !tx.is_closed();
    }
    tokio::select! {
        _ = tokio::time::sleep_until(due) => true,
        _ = tx.closed() => false,
    }
}

/// Writes one event line; `false` when the receiver is gone.
pub async fn send(tx: &mpsc::Sender<Bytes>, event: &Event) -> bool {
    tx.send(encode(event)).await.is_ok()
}

/// One NDJSON line.
pub fn encode(event: &Event) -> Bytes {
    let mut line = serde_json::to_vec(event).expect("events always serialise");
    line.push(b'\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::BackendKind;
    use crate::load::Load;

    fn engine(prefill_ms: u32, decode_ms: u32) -> Arc<Engine> {
        let doc = format!(
            "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, {prefill_ms}.0]]\n\
             [decode]\nbatch_points = [[1, {decode_ms}.0]]\n"
        );
        let profile = policies::LatencyProfile::parse("t", &doc).unwrap();
        let kv =
            crate::kv::KvConfig { total_pages: 64, page_tokens: 16, low_watermark: 0.0, high_watermark: 0.0 };
        Arc::new(Engine::new("e".into(), BackendKind::Emulated, profile, Load::new(kv, Default::default())))
    }

    fn request(max_tokens: u32) -> GenerateRequest {
        GenerateRequest {
            request_id: "r".into(),
            model: "m".into(),
            prompt: "hello".into(),
            max_tokens,
            temperature: None,
            seed: None,
            stop: vec![],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_arrive_on_the_profile_cadence_in_virtual_time() {
        let engine = engine(30, 7);
        let guard = engine.load.admit(2, 10).unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let t0 = tokio::time::Instant::now();
        tokio::spawn(run(Arc::clone(&engine), request(10), 2, guard, tx));
        let mut arrivals = Vec::new();
        while let Some(line) = rx.recv().await {
            let ev: Event = serde_json::from_slice(&line).unwrap();
            arrivals.push((t0.elapsed(), ev));
        }
        assert_eq!(arrivals.len(), 11, "10 tokens and done");
        assert_eq!(arrivals[0].0, Duration::from_millis(30), "first token after prefill");
        for (i, (at, _)) in arrivals[..10].iter().enumerate() {
            assert_eq!(*at, Duration::from_millis(30 + 7 * i as u64), "token {i}");
        }
        let Event::Done { finish_reason, usage, .. } = &arrivals[10].1 else { panic!("{:?}", arrivals[10]) };
        assert_eq!(*finish_reason, FinishReason::Length);
        assert_eq!(usage.completion_tokens, 10);
        assert_eq!(engine.load.snapshot().inflight_sequences, 0, "finished work is released");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_receiver_cancels_and_frees_pages_at_once() {
        let engine = engine(0, 1000);
        let guard = engine.load.admit(2, 1000).unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let task = tokio::spawn(run(Arc::clone(&engine), request(1000), 2, guard, tx));
        rx.recv().await.unwrap(); // first token
        assert_eq!(engine.load.snapshot().inflight_sequences, 1);
        let t = tokio::time::Instant::now();
        drop(rx);
        task.await.unwrap();
        assert_eq!(t.elapsed(), Duration::ZERO, "no waiting out the 1 s decode step");
        let s = engine.load.snapshot();
        assert_eq!((s.inflight_sequences, s.kv.free), (0, 64));
    }
}
