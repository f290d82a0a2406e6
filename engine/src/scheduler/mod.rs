//! The engine's scheduler: one task owns the waiting queue, the running
//! batch and every sequence's KV pages; everything else sends it commands.
//!
//! What runs at each token boundary is decided by `policies::turn` (the
//! turn rule, admission and KV growth, prefix reuse, preemption for KV
//! room and pausing for a higher class), the same state machine the
//! simulator drives in virtual time. This task drives it with real time:
//! apply commands, drop sequences whose client went away, ask for the next
//! step, run it on the backend and hand the tokens back. While the device
//! "works" (the time a backend step returns), the loop keeps answering
//! commands.
//!
//! A sequence preempted for KV room gives its pages back and is prefilled
//! again later (recompute), continuing exactly where it stopped; one
//! paused for a higher class keeps its pages and resumes without
//! recompute.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use policies::batching::{BatchHints, BatchLimits};
use policies::prefix::{Block, Chain};
use policies::turn::{self, Admitted, Spec, Step, Turns};
use tokio::sync::{mpsc, oneshot};

use crate::api::{FinishReason, GenerateRequest};
use crate::backend::{Backend, Slot, Token};
use crate::kv::KvAllocator;
use crate::metrics as m;

mod seq;
use crate::stop::StopMatcher;
use seq::{Job, Seq};

/// Scheduler settings: those of `policies::turn`.
pub use policies::turn::TurnConfig as SchedulerConfig;

/// Why the scheduler refused a sequence: `policies::turn`'s reasons, or
/// the scheduler task gone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Turn(#[from] turn::Refusal),
    #[error("scheduler stopped")]
    Stopped,
}

impl Refusal {
    /// Stable machine label for the gateway.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Turn(turn::Refusal::Draining) => "engine_draining",
            Refusal::Turn(turn::Refusal::Kv(k)) => k.code(),
            Refusal::Stopped => "engine_not_ready",
        }
    }
}

/// Counters the load report and metrics read.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SchedSnapshot {
    pub queued_sequences: u32,
    pub queued_tokens: u64,
    pub inflight_sequences: u32,
    pub inflight_tokens: u64,
    pub draining: bool,
    /// Mean decode step time, milliseconds (smoothed).
    pub decode_step_ms: f64,
    /// Mean sequences per decode step (smoothed), against `max_batch`.
    pub batch_achieved: f64,
    pub batch_target: u32,
    pub preemptions: u64,
    /// Sequences paused for a higher class so far, and paused now.
    pub pauses: u64,
    pub paused_sequences: u32,
    /// Prompt tokens of sequences prefilled so far (their first prefill),
    /// and of those found in the prefix cache.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

enum Command {
    Enqueue {
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
        /// The gateway's trace context, when it traces the request.
        trace: Option<telemetry::Context>,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    Snapshot {
        reply: oneshot::Sender<SchedSnapshot>,
    },
    Drain {
        reply: oneshot::Sender<()>,
    },
    Hints {
        /// `None`: only report the limits in force.
        hints: Option<BatchHints>,
        reply: oneshot::Sender<BatchLimits>,
    },
}

/// Handle to the scheduler task; cheap to clone.
///
/// The command channel is unbounded on purpose, and bounded by its
/// senders: every command but `start_drain` waits for its reply, so each
/// caller has at most one command queued, and the callers are the engine's
/// HTTP requests (at most `--max-connections` × `server::MAX_STREAMS` at
/// once) and its few control loops. A bounded channel would add a second
/// wait in front of the scheduler for nothing; a full one would have to
/// refuse or block a request the connection bound already admitted.
#[derive(Debug, Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Command>,
}

impl Scheduler {
    /// Starts the scheduler task with `backend`.
    pub fn spawn<B: Backend>(backend: B, kv: Arc<KvAllocator>, cfg: SchedulerConfig) -> Self {
        ::metrics::gauge!(m::BATCH_TARGET).set(f64::from(cfg.limits.max_batch));
        let (tx, rx) = mpsc::unbounded_channel();
        let core = Core {
            backend,
            base_limits: cfg.limits.clone(),
            turns: Turns::new(cfg, kv),
            drained: Vec::new(),
            origin: crate::clock::now(),
            stats: Stats::default(),
            device_free_at: tokio::time::Instant::now(),
        };
        if core.backend.kind().computes_on_host() {
            // Real host compute blocks for the length of a step: give the
            // scheduler its own thread (its own small runtime for timers and
            // channels) so the engine's network tasks never wait behind it.
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build();
            match rt {
                Ok(rt) => {
                    let spawned = std::thread::Builder::new()
                        .name("scheduler".into())
                        .spawn(move || rt.block_on(core.run(rx)));
                    if let Err(e) = spawned {
                        tracing::error!(event = "scheduler_thread_failed", error = %e);
                    }
                }
                Err(e) => tracing::error!(event = "scheduler_runtime_failed", error = %e),
            }
        } else {
            tokio::spawn(core.run(rx));
        }
        Self { tx }
    }

    /// Admits a sequence; its events go to `tx` as NDJSON lines.
    pub async fn enqueue(
        &self,
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
    ) -> Result<(), Refusal> {
        self.enqueue_traced(req, prompt_tokens, tx, None).await
    }

    /// [`Self::enqueue`] for a request the gateway traces: the sequence's
    /// spans go below `trace` (scheduler/trace.rs).
    pub async fn enqueue_traced(
        &self,
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
        trace: Option<telemetry::Context>,
    ) -> Result<(), Refusal> {
        let (reply, rx) = oneshot::channel();
        let command = Command::Enqueue { req, prompt_tokens, tx, trace, reply };
        self.tx.send(command).map_err(|_| Refusal::Stopped)?;
        rx.await.unwrap_or(Err(Refusal::Stopped))
    }

    pub async fn snapshot(&self) -> SchedSnapshot {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Snapshot { reply }).is_err() {
            return SchedSnapshot::default();
        }
        rx.await.unwrap_or_default()
    }

    /// Stops admitting; resolves once every admitted sequence has finished.
    pub async fn drain(&self) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Drain { reply }).is_ok() {
            let _ = rx.await;
        }
    }

    /// Applies batch-formation hints over the limits the engine started
    /// with (an unset hint restores the flag's value); returns the limits
    /// now in force. They apply from the next batch formed.
    pub async fn set_hints(&self, hints: Option<BatchHints>) -> Option<BatchLimits> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Hints { hints, reply }).ok()?;
        rx.await.ok()
    }

    /// Stops admitting without waiting.
    pub fn start_drain(&self) {
        let (reply, _) = oneshot::channel();
        let _ = self.tx.send(Command::Drain { reply });
    }
}

#[derive(Debug, Default)]
struct Stats {
    /// Sequences and tokens of the prefill batch on the device right now
    /// (neither queued nor running while it runs).
    prefilling: (u32, u64),
    decode_step_ms: f64,
    batch_achieved: f64,
}

fn smooth(old: f64, new: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        0.9 * old + 0.1 * new
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Prefill,
    Decode,
}

/// Runs one backend step over `seqs`; returns one token per sequence (in
/// order) and the device time the step takes.
fn compute<B: Backend>(backend: &mut B, seqs: &mut [Seq<B::Seq>], phase: Phase) -> (Vec<Token>, Duration) {
    let mut slots: Vec<Slot<'_, B::Seq>> = seqs
        .iter_mut()
        .map(|s| Slot {
            context: s.context(),
            cached: match phase {
                Phase::Prefill => s.cached(),
                Phase::Decode => 0,
            },
            pages: s.pages.as_ref().map_or(&[][..], |p| p.pages()),
            seq: &mut s.payload.state,
            out: None,
        })
        .collect();
    let device = match phase {
        Phase::Prefill => backend.prefill(&mut slots),
        Phase::Decode => backend.decode(&mut slots),
    };
    (slots.into_iter().map(|s| s.out.unwrap_or(Token::End)).collect(), device)
}

struct Core<B: Backend> {
    backend: B,
    /// The scheduling state (`policies::turn`).
    turns: Turns<Job<B::Seq>>,
    /// The limits from the engine's flags; hints apply over these.
    base_limits: BatchLimits,
    drained: Vec<oneshot::Sender<()>>,
    origin: Instant,
    stats: Stats,
    /// When the (emulated) device finishes its current step. Steps run back
    /// to back on the device's own clock, so timer rounding never
    /// accumulates: the mean cadence is exactly the profile's.
    device_free_at: tokio::time::Instant,
}

impl<B: Backend> Core<B> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.turns.is_empty() {
                for d in self.drained.drain(..) {
                    let _ = d.send(());
                }
                match rx.recv().await {
                    Some(c) => self.command(c),
                    None => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.command(c);
            }
            ::metrics::gauge!(m::RUNNING).set(self.turns.running().len() as f64);
            ::metrics::gauge!(m::QUEUED).set(self.turns.queue().len() as f64);
            // Token boundary: clients that went away free their pages now.
            self.turns.retain(|s| !s.payload.tx.is_closed());
            let progressed = self.turn(&mut rx).await;
            if !progressed {
                // Nothing could run (waiting sequences cannot get pages
                // yet): wait for a command instead of spinning.
                tokio::select! {
                    c = rx.recv() => match c {
                        Some(c) => self.command(c),
                        None => return,
                    },
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
        }
    }

    /// One token boundary: the step `policies::turn` picks; `false` if
    /// nothing could run.
    async fn turn(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        match self.turns.next(self.now()) {
            Step::Prefill(batch) => {
                self.prefill_step(batch, rx).await;
                true
            }
            Step::Decode => {
                self.decode_step(rx).await;
                true
            }
            Step::Idle => false,
        }
    }

    fn now(&self) -> Duration {
        crate::clock::since(self.origin)
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Enqueue { req, prompt_tokens, tx, trace, reply } => {
                let _ = reply.send(self.admit(req, prompt_tokens, tx, trace));
            }
            Command::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Command::Drain { reply } => {
                self.turns.drain();
                self.drained.push(reply);
            }
            Command::Hints { hints, reply } => {
                if let Some(hints) = hints {
                    let limits = hints.apply(&self.base_limits);
                    tracing::info!(event = "batching_hints", hints = ?hints, limits = ?limits);
                    self.turns.set_limits(limits);
                }
                let _ = reply.send(self.turns.config().limits.clone());
            }
        }
    }

    fn admit(
        &mut self,
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
        trace: Option<telemetry::Context>,
    ) -> Result<(), Refusal> {
        let (blocks, reusable, chain) = self.blocks(&req.prompt, prompt_tokens);
        let spec = Spec {
            prompt_tokens,
            max_tokens: req.max_tokens,
            key: req.priority_key,
            ttft_budget: req.ttft_budget_ms.map(|ms| Duration::from_millis(ms.into())),
            priority: req.priority.map(|p| turn::Priority {
                class: p.class,
                max_pauses: p.max_pauses,
                e2e_budget_ms: p.e2e_budget_ms,
            }),
            blocks,
            reusable,
        };
        let backend = &mut self.backend;
        let now = crate::clock::since(self.origin);
        let admitted = self.turns.admit(now, spec, |_| Job {
            state: backend.start(&req, prompt_tokens),
            stops: StopMatcher::new(&req.stop),
            tx,
            chain,
            queue_ms: 0.0,
            prefill_ms: 0.0,
            trace: trace::SeqTrace::start(trace, prompt_tokens),
        })?;
        if let Admitted::Finished(mut seq) = admitted {
            seq::finish(&mut seq, FinishReason::Length);
        }
        Ok(())
    }

    /// A prompt's full blocks for the prefix cache (none when it is off),
    /// how many of them may be shared (those before the last token), and
    /// the chain its output continues when the backend's tokens round-trip
    /// and the prompt is as many pieces as tokens.
    fn blocks(&self, prompt: &str, prompt_tokens: u32) -> (Vec<Block>, usize, Option<Chain>) {
        let kv = self.turns.kv();
        if !kv.prefix_cache() {
            return (Vec::new(), 0, None);
        }
        let page = kv.page_tokens();
        let (mut blocks, chain) = Chain::of(prompt, page);
        let chain = (self.backend.output_round_trips() && chain.pieces() == u64::from(prompt_tokens))
            .then_some(chain);
        blocks.truncate((prompt_tokens / page) as usize);
        let reusable = (prompt_tokens.saturating_sub(1) / page) as usize;
        let reusable = reusable.min(blocks.len());
        (blocks, reusable, chain)
    }

    fn snapshot(&self) -> SchedSnapshot {
        let t = &self.turns;
        let stats = t.stats();
        SchedSnapshot {
            queued_sequences: t.queue().len() as u32,
            queued_tokens: t.queue().iter().map(Seq::tokens).sum(),
            inflight_sequences: (t.running().len() + t.paused().len()) as u32 + self.stats.prefilling.0,
            inflight_tokens: t.running().iter().chain(t.paused()).map(Seq::tokens).sum::<u64>()
                + self.stats.prefilling.1,
            draining: t.draining(),
            decode_step_ms: self.stats.decode_step_ms,
            batch_achieved: self.stats.batch_achieved,
            batch_target: t.config().limits.max_batch,
            preemptions: stats.preemptions,
            pauses: stats.pauses,
            paused_sequences: t.paused().len() as u32,
            prompt_tokens: stats.prompt_tokens,
            cached_tokens: stats.cached_tokens,
        }
    }

    /// Waits out `device` time while still answering commands.
    async fn wait(&mut self, device: Duration, rx: &mut mpsc::UnboundedReceiver<Command>) {
        if device.is_zero() {
            return;
        }
        let due = crate::clock::step_start(self.device_free_at, tokio::time::Instant::now()) + device;
        self.device_free_at = due;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(due) => return,
                c = rx.recv() => match c {
                    Some(c) => self.command(c),
                    None => { tokio::time::sleep_until(due).await; return }
                },
            }
        }
    }
}

mod steps;
mod trace;

#[cfg(test)]
mod tests;
