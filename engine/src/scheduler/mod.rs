//! The engine's scheduler: one task owns the waiting queue, the running
//! batch and every sequence's KV pages; everything else sends it commands.
//!
//! Each turn of the loop is one token boundary: apply commands, drop
//! sequences whose client went away, then run either a prefill batch (formed
//! by `policies::batching::form_prefill`) or one decode step over every
//! running sequence (continuous batching: sequences join after their
//! prefill and leave when they finish). Prefill batches go first, but not
//! once the running sequences have waited `max_decode_stall_ms` for a token
//! (`batching::prefill_turn`). While the device "works" (the time a backend
//! step returns), the loop keeps answering commands.
//!
//! Preemption happens only at token boundaries, when a running sequence
//! cannot grow its KV pages: the running sequence with the worst key that
//! has produced at least `min_quantum_tokens` since it last started, and
//! has been preempted fewer than `max_preemptions` times, gives its pages
//! back and returns to the queue; it is prefilled again later (recompute)
//! and continues exactly where it stopped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use policies::batching::{form_prefill, prefill_turn, BatchHints, BatchLimits, Queued};
use policies::LatencyProfile;
use tokio::sync::{mpsc, oneshot};

use crate::api::{FinishReason, GenerateRequest};
use crate::backend::{Backend, Slot, Token};
use crate::kv::{KvAllocator, KvRefusal};
use crate::metrics as m;
use policies::prefix::{Block, Chain};

mod seq;
use crate::stop::StopMatcher;
use seq::Seq;

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub limits: BatchLimits,
    /// Used by batch formation to predict prefill time.
    pub profile: LatencyProfile,
    /// Output tokens reserved at admission beyond the prompt (capped by
    /// `max_tokens`): the over-estimate of the output.
    pub output_reserve_tokens: u32,
    /// KV pages added at a time when a sequence outgrows its pages.
    pub extend_pages: u32,
    /// TTFT budget when the gateway sends none.
    pub default_ttft: Duration,
    pub max_preemptions: u32,
    pub min_quantum_tokens: u32,
}

/// Why the scheduler refused a sequence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("engine is draining")]
    Draining,
    #[error(transparent)]
    Kv(#[from] KvRefusal),
    #[error("scheduler stopped")]
    Stopped,
}

impl Refusal {
    /// Stable machine label for the gateway.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Draining => "engine_draining",
            Refusal::Kv(k) => k.code(),
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
            kv,
            base_limits: cfg.limits.clone(),
            cfg,
            queue: Vec::new(),
            running: Vec::new(),
            draining: false,
            drained: Vec::new(),
            next_id: 0,
            origin: crate::clock::now(),
            stats: Stats::default(),
            device_free_at: tokio::time::Instant::now(),
            tokens_at: Duration::ZERO,
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
    preemptions: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
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
            seq: &mut s.state,
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
    kv: Arc<KvAllocator>,
    cfg: SchedulerConfig,
    /// The limits from the engine's flags; hints apply over these.
    base_limits: BatchLimits,
    queue: Vec<Seq<B::Seq>>,
    running: Vec<Seq<B::Seq>>,
    draining: bool,
    drained: Vec<oneshot::Sender<()>>,
    next_id: u64,
    origin: Instant,
    stats: Stats,
    /// When the (emulated) device finishes its current step. Steps run back
    /// to back on the device's own clock, so timer rounding never
    /// accumulates: the mean cadence is exactly the profile's.
    device_free_at: tokio::time::Instant,
    /// When every running sequence last had a token, at the latest (on
    /// `now()`'s clock): the end of the last decode step, or of the prefill
    /// that started the running batch.
    tokens_at: Duration,
}

impl<B: Backend> Core<B> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.queue.is_empty() && self.running.is_empty() {
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
            ::metrics::gauge!(m::RUNNING).set(self.running.len() as f64);
            ::metrics::gauge!(m::QUEUED).set(self.queue.len() as f64);
            // Token boundary: clients that went away free their pages now.
            self.queue.retain(|s| !s.tx.is_closed());
            self.running.retain(|s| !s.tx.is_closed());
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

    /// One token boundary: a prefill batch or a decode step, in the order
    /// `batching::prefill_turn` gives; `false` if neither could run.
    async fn turn(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        let stalled = self.now().saturating_sub(self.tokens_at);
        let prefill_first = prefill_turn(self.running.len() as u32, stalled, &self.cfg.limits);
        if prefill_first && self.prefill_step(rx).await {
            return true;
        }
        self.decode_step(rx).await || (!prefill_first && self.prefill_step(rx).await)
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
                self.draining = true;
                self.drained.push(reply);
            }
            Command::Hints { hints, reply } => {
                if let Some(hints) = hints {
                    self.cfg.limits = hints.apply(&self.base_limits);
                    tracing::info!(event = "batching_hints", hints = ?hints, limits = ?self.cfg.limits);
                }
                let _ = reply.send(self.cfg.limits.clone());
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
        if self.draining {
            return Err(Refusal::Draining);
        }
        let reserve = self.cfg.output_reserve_tokens.min(req.max_tokens);
        let (blocks, reusable, chain) = self.blocks(&req.prompt, prompt_tokens);
        let pages = self.kv.admit(u64::from(prompt_tokens) + u64::from(reserve), &blocks[..reusable])?;
        let state = self.backend.start(&req, prompt_tokens);
        let mut seq = Seq {
            id: {
                self.next_id += 1;
                self.next_id
            },
            prompt_tokens,
            max_tokens: req.max_tokens,
            generated: 0,
            key: req.priority_key.unwrap_or((u64::from(prompt_tokens) + u64::from(req.max_tokens)) as f64),
            enqueued_at: self.now(),
            ttft_budget: req
                .ttft_budget_ms
                .map_or(self.cfg.default_ttft, |ms| Duration::from_millis(ms.into())),
            pages: Some(pages),
            state,
            stops: StopMatcher::new(&req.stop),
            tx,
            preemptions: 0,
            since_start: 0,
            queue_ms: 0.0,
            prefill_ms: 0.0,
            blocks,
            reusable,
            chain,
            cached_tokens: 0,
            trace: trace::SeqTrace::start(trace, prompt_tokens),
        };
        if req.max_tokens == 0 {
            seq.finish(FinishReason::Length);
        } else {
            self.queue.push(seq);
        }
        Ok(())
    }

    /// A prompt's full blocks for the prefix cache (none when it is off),
    /// how many of them may be shared (those before the last token), and
    /// the chain its output continues when the backend's tokens round-trip
    /// and the prompt is as many pieces as tokens.
    fn blocks(&self, prompt: &str, prompt_tokens: u32) -> (Vec<Block>, usize, Option<Chain>) {
        if !self.kv.prefix_cache() {
            return (Vec::new(), 0, None);
        }
        let page = self.kv.page_tokens();
        let (mut blocks, chain) = Chain::of(prompt, page);
        let chain = (self.backend.output_round_trips() && chain.pieces() == u64::from(prompt_tokens))
            .then_some(chain);
        blocks.truncate((prompt_tokens / page) as usize);
        let reusable = (prompt_tokens.saturating_sub(1) / page) as usize;
        let reusable = reusable.min(blocks.len());
        (blocks, reusable, chain)
    }

    fn snapshot(&self) -> SchedSnapshot {
        SchedSnapshot {
            queued_sequences: self.queue.len() as u32,
            queued_tokens: self.queue.iter().map(Seq::tokens).sum(),
            inflight_sequences: self.running.len() as u32 + self.stats.prefilling.0,
            inflight_tokens: self.running.iter().map(Seq::tokens).sum::<u64>() + self.stats.prefilling.1,
            draining: self.draining,
            decode_step_ms: self.stats.decode_step_ms,
            batch_achieved: self.stats.batch_achieved,
            batch_target: self.cfg.limits.max_batch,
            preemptions: self.stats.preemptions,
            prompt_tokens: self.stats.prompt_tokens,
            cached_tokens: self.stats.cached_tokens,
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

    /// Runs a prefill batch if batch formation picks one; `false` if not.
    async fn prefill_step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        let mut batch = self.take_planned();
        if batch.is_empty() {
            return false;
        }
        let started = self.now();
        // Wall time only for the spans of traced sequences.
        let started_wall = batch.iter().any(|s| s.trace.is_some()).then(crate::clock::wall);
        ::metrics::histogram!(m::PREFILL_BATCH_SIZE).record(batch.len() as f64);
        for s in batch.iter_mut().filter(|s| s.generated == 0) {
            s.queue_ms = (started - s.enqueued_at).as_secs_f64() * 1e3;
            s.cached_tokens = s.cached();
            self.stats.prompt_tokens += u64::from(s.prompt_tokens);
            self.stats.cached_tokens += u64::from(s.cached_tokens);
            ::metrics::histogram!(m::FORMATION).record(s.queue_ms / 1e3);
            ::metrics::counter!(m::PREFIX_LOOKUP_TOKENS).increment(u64::from(s.prompt_tokens));
            ::metrics::counter!(m::PREFIX_HIT_TOKENS).increment(u64::from(s.cached_tokens));
        }
        let (outs, device) = compute(&mut self.backend, &mut batch, Phase::Prefill);
        self.stats.prefilling = (batch.len() as u32, batch.iter().map(Seq::tokens).sum());
        self.wait(device, rx).await;
        self.stats.prefilling = (0, 0);
        let prefill_ms = (self.now() - started).as_secs_f64() * 1e3;
        ::metrics::histogram!(m::PREFILL).record(prefill_ms / 1e3);
        if self.running.is_empty() {
            // The batch starts the running set: its first tokens are the
            // newest the running sequences have.
            self.tokens_at = self.now();
        }
        let outs_len = batch.len();
        for (mut seq, out) in batch.into_iter().zip(outs) {
            // The prompt's pages hold its K/V now: later prompts may share them.
            if let Some(pages) = seq.pages.as_mut() {
                pages.commit(&seq.blocks);
            }
            if seq.generated == 0 {
                seq.prefill_ms = prefill_ms;
            }
            let (size, cached) = (outs_len, seq.cached_tokens);
            if let (Some(t), Some(at)) = (&mut seq.trace, started_wall) {
                t.prefilled(at, size, cached);
            }
            if !seq.apply(out) {
                self.running.push(seq);
            }
        }
        true
    }

    /// Takes the sequences batch formation picks out of the queue. A
    /// preempted one gets pages again first; it stays queued while the cache
    /// is full, and ends if it has outgrown the whole cache.
    fn take_planned(&mut self) -> Vec<Seq<B::Seq>> {
        let views: Vec<Queued> = self
            .queue
            .iter()
            .map(|s| Queued {
                id: s.id,
                // What the prefill will compute: the cached prefix is free.
                prompt_tokens: s.context() - s.cached(),
                key: s.key,
                enqueued_at: s.enqueued_at,
                ttft_budget: s.ttft_budget,
            })
            .collect();
        let plan =
            form_prefill(&views, self.running.len() as u32, &self.cfg.limits, &self.cfg.profile, self.now());
        let mut batch = Vec::with_capacity(plan.admit.len());
        for id in &plan.admit {
            let i = self.queue.iter().position(|s| s.id == *id).expect("planned ids come from the queue");
            let mut seq = self.queue.remove(i);
            if seq.pages.is_none() {
                // A preempted sequence returns: it was admitted already, so
                // only real exhaustion keeps it waiting. It needs room for
                // its context and its next token.
                let tokens = u64::from(seq.context()) + 1;
                match self.kv.admit_running(tokens, seq.reuse()) {
                    Ok(p) => seq.pages = Some(p),
                    Err(_) if self.kv.pages_for(tokens) > self.kv.total_pages() => {
                        seq.fail("kv_exhausted", "the sequence has outgrown the whole KV cache");
                        continue;
                    }
                    Err(_) => {
                        self.queue.push(seq);
                        continue;
                    }
                }
            }
            batch.push(seq);
        }
        batch
    }

    /// One decode step over every running sequence; `false` if none runs.
    async fn decode_step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        self.make_room();
        if self.running.is_empty() {
            return false;
        }
        let started = crate::clock::now();
        let (outs, device) = compute(&mut self.backend, &mut self.running, Phase::Decode);
        let batch = outs.len();
        self.wait(device, rx).await;
        self.tokens_at = self.now();
        self.stats.decode_step_ms =
            smooth(self.stats.decode_step_ms, crate::clock::since(started).as_secs_f64() * 1e3);
        self.stats.batch_achieved = smooth(self.stats.batch_achieved, batch as f64);
        ::metrics::histogram!(m::DECODE_STEP).record(crate::clock::since(started).as_secs_f64());
        ::metrics::histogram!(m::BATCH_SIZE).record(batch as f64);
        let mut done = vec![false; batch];
        for (i, out) in outs.into_iter().enumerate() {
            if let Some(t) = &mut self.running[i].trace {
                t.decoded(batch);
            }
            done[i] = self.running[i].apply(out);
        }
        let mut i = 0;
        self.running.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        true
    }
}

mod preempt;
mod trace;

#[cfg(test)]
mod tests;
