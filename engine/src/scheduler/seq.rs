//! What the engine keeps of one admitted sequence beside the scheduling
//! state `policies::turn` holds: the backend's state, the stream its
//! events go to, stop sequences, the block chain its output continues and
//! its trace; and what happens when it produces a token (stop sequences,
//! limits, the final event).

use bytes::Bytes;
use policies::prefix::Chain;
use policies::turn::{self, Payload};
use tokio::sync::mpsc;

use crate::api::{Event, FinishReason, Usage};
use crate::backend::Token;
use crate::metrics as m;
use crate::stop::{Step, StopMatcher};

/// The engine's payload of a [`turn::Seq`].
pub(super) struct Job<S> {
    pub(super) state: S,
    pub(super) stops: StopMatcher,
    pub(super) tx: mpsc::UnboundedSender<Bytes>,
    /// The block chain continued by each generated token, while the
    /// backend's tokens round-trip and the cache is on.
    pub(super) chain: Option<Chain>,
    pub(super) queue_ms: f64,
    pub(super) prefill_ms: f64,
    /// Its spans, when the gateway traces it (written when it is dropped).
    pub(super) trace: Option<Box<super::trace::SeqTrace>>,
}

/// One admitted sequence as the scheduler holds it.
pub(super) type Seq<S> = turn::Seq<Job<S>>;

impl<S> Payload for Job<S> {
    fn preempted(seq: &mut Seq<S>) {
        if let Some(t) = &mut seq.payload.trace {
            t.preempted();
        }
        ::metrics::counter!(m::PREEMPTIONS).increment(1);
        tracing::debug!(event = "preempted", seq = seq.id, generated = seq.generated);
    }

    fn paused(seq: &mut Seq<S>) {
        if let Some(t) = &mut seq.payload.trace {
            t.paused();
        }
        ::metrics::counter!(m::PRIORITY_PAUSES).increment(1);
        tracing::debug!(event = "paused", seq = seq.id, generated = seq.generated, pauses = seq.pauses);
    }

    fn resumed(seq: &mut Seq<S>) {
        tracing::debug!(event = "resumed", seq = seq.id, generated = seq.generated);
    }

    fn failed(seq: &mut Seq<S>, code: &'static str, message: &'static str) {
        fail(seq, code, message);
    }
}

fn send<S>(seq: &Seq<S>, event: &Event) {
    // A closed receiver is noticed at the next boundary and cleaned up.
    let _ = seq.payload.tx.send(event.to_line().into());
}

/// Applies one produced token; `true` when the sequence is finished (and
/// its done event sent).
pub(super) fn apply<S>(seq: &mut Seq<S>, token: Token) -> bool {
    let Token::Text(text) = token else { return finish(seq, FinishReason::Stop) };
    seq.produced();
    extend_chain(seq, &text);
    let (emit, stopped) = match seq.payload.stops.push(&text) {
        Step::Emit(t) => (t, false),
        Step::Stopped(t) => (t, true),
    };
    if !emit.is_empty() {
        send(seq, &Event::Token { text: emit });
    }
    if stopped {
        finish(seq, FinishReason::Stop)
    } else if seq.generated >= seq.max_tokens {
        finish(seq, FinishReason::Length)
    } else {
        false
    }
}

/// Continues the block chain with a generated token's text; a token that
/// is not one piece ends the naming of this sequence's output.
fn extend_chain<S>(seq: &mut Seq<S>, text: &str) {
    let Some(chain) = &mut seq.payload.chain else { return };
    let piece = text.trim();
    if policies::tokens::count(piece) != 1 {
        seq.payload.chain = None;
        return;
    }
    if let Some(b) = chain.push(piece) {
        seq.blocks.push(b);
    }
}

/// Ends the sequence: its output's pages named for the next turn of the
/// conversation, the stop matcher's tail and the done event sent.
pub(super) fn finish<S>(seq: &mut Seq<S>, finish_reason: FinishReason) -> bool {
    seq.commit_output();
    let generated = seq.generated;
    if let Some(t) = &mut seq.payload.trace {
        let reason = match finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        t.ended(Ok(reason), generated);
    }
    let tail = seq.payload.stops.finish();
    if !tail.is_empty() {
        send(seq, &Event::Token { text: tail });
    }
    let usage = Usage {
        prompt_tokens: seq.prompt_tokens,
        completion_tokens: seq.generated,
        cached_tokens: seq.cached_tokens,
    };
    send(
        seq,
        &Event::Done {
            finish_reason,
            usage,
            queue_ms: seq.payload.queue_ms,
            prefill_ms: seq.payload.prefill_ms,
        },
    );
    true
}

pub(super) fn fail<S>(seq: &mut Seq<S>, code: &str, message: &str) {
    let generated = seq.generated;
    if let Some(t) = &mut seq.payload.trace {
        t.ended(Err(code.to_string()), generated);
    }
    send(seq, &Event::Error { code: code.to_string(), message: message.to_string() });
}
