//! One sequence's generation loop on the emulated backend.
//!
//! Prefill waits `profile.prefill(prompt_tokens)` and yields the first token;
//! each further token waits one decode step for the current batch size and
//! context. Every wait also watches the output channel: when the gateway
//! cancels (HTTP/2 RST_STREAM drops the response body and with it the
//! receiver), the loop stops at once and the [`SequenceGuard`] returns the
//! sequence's pages.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    guard: SequenceGuard,
    tx: mpsc::Sender<Bytes>,
) {
    let started = Instant::now();
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
        if !pause(&tx, wait).await {
            return; // cancelled: the guard releases on drop
        }
        if generated == 0 {
            prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        } else {
            engine.load.record_decode_step(wait.as_secs_f64() * 1e3);
        }
        let Some(token) = text.next_token() else { break FinishReason::Stop };
        generated += 1;
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

/// Waits `d` unless the receiver goes away first; `false` means cancelled.
async fn pause(tx: &mpsc::Sender<Bytes>, d: Duration) -> bool {
    if d.is_zero() {
        tokio::task::yield_now().await;
        return !tx.is_closed();
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
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
