//! One admitted sequence as the scheduler holds it, and what happens when
//! it produces a token (stop sequences, limits, the final event).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::api::{Event, FinishReason, Usage};
use crate::backend::Token;
use crate::kv::PageSet;
use crate::stop::{Step, StopMatcher};
use policies::prefix::{Block, Chain};

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
    /// Its standing for priority preemption (`None`: none).
    pub(super) priority: Option<crate::api::Priority>,
    /// Times it was paused for a higher class (its pages kept).
    pub(super) pauses: u32,
    pub(super) since_start: u32,
    pub(super) queue_ms: f64,
    pub(super) prefill_ms: f64,
    /// The context's full blocks: the prompt's (named in the prefix cache
    /// once prefilled), then those its output completes (named when it
    /// ends, see [`Seq::finish`]).
    pub(super) blocks: Vec<Block>,
    /// The block chain continued by each generated token, while the
    /// backend's tokens round-trip and the cache is on.
    pub(super) chain: Option<Chain>,
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
        self.extend_chain(&text);
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

    /// Continues the block chain with a generated token's text; a token
    /// that is not one piece ends the naming of this sequence's output.
    fn extend_chain(&mut self, text: &str) {
        let Some(chain) = &mut self.chain else { return };
        let piece = text.trim();
        if policies::tokens::count(piece) != 1 {
            self.chain = None;
            return;
        }
        if let Some(b) = chain.push(piece) {
            self.blocks.push(b);
        }
    }

    /// Names the pages the output filled, so that the next turn of a
    /// conversation, which resends this answer, finds them cached (as vLLM
    /// and SGLang keep generated tokens' pages). Only blocks every position
    /// of which holds K/V: the last token generated has none yet.
    fn commit_output(&mut self) {
        let Some(pages) = self.pages.as_mut() else { return };
        if self.generated == 0 {
            return; // nothing generated: the prefill named the prompt already
        }
        let computed = (self.prompt_tokens + self.generated - 1) / pages.page_tokens();
        pages.commit(&self.blocks[..self.blocks.len().min(computed as usize)]);
    }

    pub(super) fn finish(&mut self, finish_reason: FinishReason) -> bool {
        self.commit_output();
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
