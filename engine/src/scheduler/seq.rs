//! One admitted sequence as the scheduler holds it, and what happens when
//! it produces a token (stop sequences, limits, the final event).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::api::{Event, FinishReason, Usage};
use crate::backend::Token;
use crate::kv::PageSet;
use crate::stop::{Step, StopMatcher};
use policies::prefix::Block;

/// One admitted sequence.
pub(super) struct Seq<S> {
    pub(super) id: u64,
    pub(super) prompt_tokens: u32,
    pub(super) max_tokens: u32,
    pub(super) generated: u32,
    pub(super) key: f64,
    pub(super) enqueued_at: Duration,
    pub(super) ttft_budget: Duration,
    pub(super) pages: Option<PageSet>,
    pub(super) state: S,
    pub(super) stops: StopMatcher,
    pub(super) tx: mpsc::UnboundedSender<Bytes>,
    pub(super) preemptions: u32,
    pub(super) since_start: u32,
    pub(super) queue_ms: f64,
    pub(super) prefill_ms: f64,
    /// The prompt's full blocks (named in the prefix cache once prefilled).
    pub(super) blocks: Vec<Block>,
    /// Leading blocks that may come from the cache: those before the
    /// prompt's last token, which is always computed.
    pub(super) reusable: usize,
    /// Prompt tokens the first prefill found cached.
    pub(super) cached_tokens: u32,
    /// Its spans, when the gateway traces it (written when it is dropped).
    pub(super) trace: Option<Box<super::trace::SeqTrace>>,
}

impl<S> Seq<S> {
    pub(super) fn context(&self) -> u32 {
        self.prompt_tokens + self.generated
    }

    /// The blocks admission may share from the cache.
    pub(super) fn reuse(&self) -> &[Block] {
        &self.blocks[..self.reusable]
    }

    /// Leading context tokens its pages hold already (a cached prefix).
    pub(super) fn cached(&self) -> u32 {
        self.pages.as_ref().map_or(0, PageSet::cached_tokens)
    }

    /// Prompt plus output budget: what the sequence may still cost.
    pub(super) fn tokens(&self) -> u64 {
        u64::from(self.prompt_tokens) + u64::from(self.max_tokens)
    }

    pub(super) fn send(&self, event: &Event) {
        // A closed receiver is noticed at the next boundary and cleaned up.
        let _ = self.tx.send(event.to_line().into());
    }

    /// Applies one produced token; `true` when the sequence is finished
    /// (and its done event sent).
    pub(super) fn apply(&mut self, token: Token) -> bool {
        let Token::Text(text) = token else { return self.finish(FinishReason::Stop) };
        self.generated += 1;
        self.since_start += 1;
        let (emit, stopped) = match self.stops.push(&text) {
            Step::Emit(t) => (t, false),
            Step::Stopped(t) => (t, true),
        };
        if !emit.is_empty() {
            self.send(&Event::Token { text: emit });
        }
        if stopped {
            self.finish(FinishReason::Stop)
        } else if self.generated >= self.max_tokens {
            self.finish(FinishReason::Length)
        } else {
            false
        }
    }

    pub(super) fn finish(&mut self, finish_reason: FinishReason) -> bool {
        if let Some(t) = &mut self.trace {
            let reason = match finish_reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
            };
            t.ended(Ok(reason), self.generated);
        }
        let tail = self.stops.finish();
        if !tail.is_empty() {
            self.send(&Event::Token { text: tail });
        }
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.generated,
            cached_tokens: self.cached_tokens,
        };
        self.send(&Event::Done {
            finish_reason,
            usage,
            queue_ms: self.queue_ms,
            prefill_ms: self.prefill_ms,
        });
        true
    }

    pub(super) fn fail(&mut self, code: &str, message: &str) {
        let generated = self.generated;
        if let Some(t) = &mut self.trace {
            t.ended(Err(code.to_string()), generated);
        }
        self.send(&Event::Error { code: code.to_string(), message: message.to_string() });
    }
}
