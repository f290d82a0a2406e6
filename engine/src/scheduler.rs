//! The engine's scheduler: one task owns the waiting queue, the running
//! batch and every sequence's KV pages; everything else sends it commands.
//!
//! Each turn of the loop is one token boundary: apply commands, drop
//! sequences whose client went away, then run either a prefill batch (formed
//! by `policies::batching::form_prefill`) or one decode step over every
//! running sequence (continuous batching: sequences join after their
//! prefill and leave when they finish). While the device "works" (the time a
//! backend step returns), the loop keeps answering commands.
//!
//! Preemption happens only at token boundaries, when a running sequence
//! cannot grow its KV pages: the running sequence with the worst key that
//! has produced at least `min_quantum_tokens` since it last started, and
//! has been preempted fewer than `max_preemptions` times, gives its pages
//! back and returns to the queue; it is prefilled again later (recompute)
//! and continues exactly where it stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use policies::batching::{form_prefill, BatchLimits, Queued};
use policies::LatencyProfile;
use tokio::sync::{mpsc, oneshot};

use crate::api::{Event, FinishReason, GenerateRequest, Usage};
use crate::backend::{Backend, Slot, Token};
use crate::kv::{KvAllocator, KvRefusal, PageSet};
use crate::metrics as m;
use crate::stop::{Step, StopMatcher};

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
}

enum Command {
    Enqueue {
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    Snapshot {
        reply: oneshot::Sender<SchedSnapshot>,
    },
    Drain {
        reply: oneshot::Sender<()>,
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
            cfg,
            queue: Vec::new(),
            running: Vec::new(),
            draining: false,
            drained: Vec::new(),
            next_id: AtomicU64::new(1),
            origin: Instant::now(),
            stats: Stats::default(),
            device_free_at: tokio::time::Instant::now(),
        };
        tokio::spawn(core.run(rx));
        Self { tx }
    }

    /// Admits a sequence; its events go to `tx` as NDJSON lines.
    pub async fn enqueue(
        &self,
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
    ) -> Result<(), Refusal> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Enqueue { req, prompt_tokens, tx, reply }).map_err(|_| Refusal::Stopped)?;
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
}

fn smooth(old: f64, new: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        0.9 * old + 0.1 * new
    }
}

/// One admitted sequence.
struct Seq<S> {
    id: u64,
    prompt_tokens: u32,
    max_tokens: u32,
    generated: u32,
    key: f64,
    enqueued_at: Duration,
    ttft_budget: Duration,
    pages: Option<PageSet>,
    state: S,
    stops: StopMatcher,
    tx: mpsc::UnboundedSender<Bytes>,
    preemptions: u32,
    since_start: u32,
    arrived: Instant,
    queue_ms: f64,
    prefill_ms: f64,
}

impl<S> Seq<S> {
    fn context(&self) -> u32 {
        self.prompt_tokens + self.generated
    }

    /// Prompt plus output budget: what the sequence may still cost.
    fn tokens(&self) -> u64 {
        u64::from(self.prompt_tokens) + u64::from(self.max_tokens)
    }

    fn send(&self, event: &Event) {
        // A closed receiver is noticed at the next boundary and cleaned up.
        let _ = self.tx.send(event.to_line());
    }

    /// Applies one produced token; `true` when the sequence is finished
    /// (and its done event sent).
    fn apply(&mut self, token: Token) -> bool {
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

    fn finish(&mut self, finish_reason: FinishReason) -> bool {
        let tail = self.stops.finish();
        if !tail.is_empty() {
            self.send(&Event::Token { text: tail });
        }
        let usage = Usage { prompt_tokens: self.prompt_tokens, completion_tokens: self.generated };
        self.send(&Event::Done {
            finish_reason,
            usage,
            queue_ms: self.queue_ms,
            prefill_ms: self.prefill_ms,
        });
        true
    }

    fn fail(&self, code: &str, message: &str) {
        self.send(&Event::Error { code: code.to_string(), message: message.to_string() });
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
    queue: Vec<Seq<B::Seq>>,
    running: Vec<Seq<B::Seq>>,
    draining: bool,
    drained: Vec<oneshot::Sender<()>>,
    next_id: AtomicU64,
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
            if !self.prefill_step(&mut rx).await {
                self.decode_step(&mut rx).await;
            }
        }
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Enqueue { req, prompt_tokens, tx, reply } => {
                let _ = reply.send(self.admit(req, prompt_tokens, tx));
            }
            Command::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Command::Drain { reply } => {
                self.draining = true;
                self.drained.push(reply);
            }
        }
    }

    fn admit(
        &mut self,
        req: GenerateRequest,
        prompt_tokens: u32,
        tx: mpsc::UnboundedSender<Bytes>,
    ) -> Result<(), Refusal> {
        if self.draining {
            return Err(Refusal::Draining);
        }
        let reserve = self.cfg.output_reserve_tokens.min(req.max_tokens);
        let pages = self.kv.admit(u64::from(prompt_tokens) + u64::from(reserve))?;
        let state = self.backend.start(&req, prompt_tokens);
        let mut seq = Seq {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
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
            arrived: Instant::now(),
            queue_ms: 0.0,
            prefill_ms: 0.0,
        };
        if req.max_tokens == 0 {
            seq.finish(FinishReason::Length);
        } else {
            self.queue.push(seq);
        }
        Ok(())
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
        }
    }

    /// Waits out `device` time while still answering commands.
    async fn wait(&mut self, device: Duration, rx: &mut mpsc::UnboundedReceiver<Command>) {
        if device.is_zero() {
            return;
        }
        // Waking up to this late after the previous step is timer jitter, not
        // an idle device: the next step starts when the previous one ended.
        const TIMER_SLACK: Duration = Duration::from_millis(2);
        let now = tokio::time::Instant::now();
        let start = if now.saturating_duration_since(self.device_free_at) <= TIMER_SLACK {
            self.device_free_at
        } else {
            now
        };
        let due = start + device;
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
        let views: Vec<Queued> = self
            .queue
            .iter()
            .map(|s| Queued {
                id: s.id,
                prompt_tokens: s.context(),
                key: s.key,
                enqueued_at: s.enqueued_at,
                ttft_budget: s.ttft_budget,
            })
            .collect();
        let plan =
            form_prefill(&views, self.running.len() as u32, &self.cfg.limits, &self.cfg.profile, self.now());
        if plan.admit.is_empty() {
            return false;
        }
        let mut batch = Vec::with_capacity(plan.admit.len());
        for id in &plan.admit {
            let i = self.queue.iter().position(|s| s.id == *id).expect("planned ids come from the queue");
            let mut seq = self.queue.remove(i);
            if seq.pages.is_none() {
                // A preempted sequence returns: it was admitted already, so
                // only real exhaustion keeps it waiting.
                let tokens = u64::from(seq.context()) + u64::from(self.cfg.output_reserve_tokens);
                match self.kv.admit_running(tokens) {
                    Ok(p) => seq.pages = Some(p),
                    Err(_) => {
                        self.queue.push(seq);
                        continue;
                    }
                }
            }
            batch.push(seq);
        }
        if batch.is_empty() {
            return false;
        }
        let started = Instant::now();
        ::metrics::histogram!(m::PREFILL_BATCH_SIZE).record(batch.len() as f64);
        for s in batch.iter().filter(|s| s.generated == 0) {
            ::metrics::histogram!(m::FORMATION).record((started - s.arrived).as_secs_f64());
        }
        let (outs, device) = compute(&mut self.backend, &mut batch, Phase::Prefill);
        self.stats.prefilling = (batch.len() as u32, batch.iter().map(Seq::tokens).sum());
        self.wait(device, rx).await;
        self.stats.prefilling = (0, 0);
        let prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        ::metrics::histogram!(m::PREFILL).record(prefill_ms / 1e3);
        for (mut seq, out) in batch.into_iter().zip(outs) {
            if seq.generated == 0 {
                seq.queue_ms = (started - seq.arrived).as_secs_f64() * 1e3;
                seq.prefill_ms = prefill_ms;
            }
            if !seq.apply(out) {
                self.running.push(seq);
            }
        }
        true
    }

    /// One decode step over every running sequence.
    async fn decode_step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) {
        self.make_room();
        if self.running.is_empty() {
            return;
        }
        let started = Instant::now();
        let (outs, device) = compute(&mut self.backend, &mut self.running, Phase::Decode);
        let batch = outs.len();
        self.wait(device, rx).await;
        self.stats.decode_step_ms = smooth(self.stats.decode_step_ms, started.elapsed().as_secs_f64() * 1e3);
        self.stats.batch_achieved = smooth(self.stats.batch_achieved, batch as f64);
        ::metrics::histogram!(m::DECODE_STEP).record(started.elapsed().as_secs_f64());
        ::metrics::histogram!(m::BATCH_SIZE).record(batch as f64);
        let mut done = vec![false; batch];
        for (i, out) in outs.into_iter().enumerate() {
            done[i] = self.running[i].apply(out);
        }
        let mut i = 0;
        self.running.retain(|_| {
            i += 1;
            !done[i - 1]
        });
    }

    /// Gives every running sequence a page for its next token, preempting
    /// (or, failing that, ending) sequences when the cache is exhausted.
    fn make_room(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let need = u64::from(self.running[i].context()) + 1;
            let unit = self.cfg.extend_pages;
            let ok = self.running[i].pages.as_mut().is_some_and(|p| p.ensure(need, unit).is_ok());
            if ok {
                i += 1;
                continue;
            }
            match self.victim() {
                Some(v) => {
                    let mut seq = self.running.remove(v);
                    seq.pages = None; // pages back to the free list
                    seq.preemptions += 1;
                    seq.since_start = 0;
                    self.stats.preemptions += 1;
                    ::metrics::counter!(m::PREEMPTIONS).increment(1);
                    tracing::debug!(event = "preempted", seq = seq.id, generated = seq.generated);
                    self.queue.push(seq);
                    if v < i {
                        i -= 1;
                    }
                }
                None => {
                    let seq = self.running.remove(i);
                    seq.fail("kv_exhausted", "KV cache exhausted and no sequence may be preempted");
                }
            }
        }
    }

    /// The running sequence to preempt: worst key among those past their
    /// quantum and under the preemption cap.
    fn victim(&self) -> Option<usize> {
        self.running
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.since_start >= self.cfg.min_quantum_tokens && s.preemptions < self.cfg.max_preemptions
            })
            .max_by(|(_, a), (_, b)| a.key.total_cmp(&b.key).then(a.enqueued_at.cmp(&b.enqueued_at)))
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emulated::Emulated;
    use crate::kv::KvConfig;

    /// Prefill `prefill_ms` flat; decode 10 ms at batch 1, 12 ms at batch 2.
    fn profile(prefill_ms: u32) -> LatencyProfile {
        LatencyProfile::parse(
            "t",
            &format!(
                "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, {prefill_ms}.0]]\n\
                 [decode]\nbatch_points = [[1, 10.0], [2, 12.0], [3, 14.0]]\n"
            ),
        )
        .unwrap()
    }

    fn sched(
        prefill_ms: u32,
        pages: u32,
        page_tokens: u32,
        cfg: impl FnOnce(&mut SchedulerConfig),
    ) -> (Scheduler, Arc<KvAllocator>) {
        let kv = KvAllocator::new(KvConfig {
            total_pages: pages,
            page_tokens,
            low_watermark: 0.0,
            high_watermark: 0.0,
        });
        let mut c = SchedulerConfig {
            limits: BatchLimits::default(),
            profile: profile(prefill_ms),
            output_reserve_tokens: 0,
            extend_pages: 1,
            default_ttft: Duration::from_secs(10),
            max_preemptions: 2,
            min_quantum_tokens: 2,
        };
        cfg(&mut c);
        (Scheduler::spawn(Emulated { profile: profile(prefill_ms) }, Arc::clone(&kv), c), kv)
    }

    fn req(prompt: &str, max_tokens: u32) -> GenerateRequest {
        GenerateRequest {
            request_id: prompt.into(),
            model: "m".into(),
            prompt: prompt.into(),
            max_tokens,
            temperature: None,
            seed: None,
            stop: vec![],
            priority_key: None,
            ttft_budget_ms: None,
        }
    }

    /// Events of one sequence with their virtual arrival times.
    async fn collect(
        mut rx: mpsc::UnboundedReceiver<Bytes>,
        t0: tokio::time::Instant,
    ) -> Vec<(Duration, Event)> {
        let mut out = Vec::new();
        while let Some(line) = rx.recv().await {
            out.push((t0.elapsed(), serde_json::from_slice(&line).unwrap()));
        }
        out
    }

    fn text(events: &[(Duration, Event)]) -> String {
        events
            .iter()
            .filter_map(|(_, e)| if let Event::Token { text } = e { Some(text.as_str()) } else { None })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_follow_the_profile_and_sequences_join_at_token_boundaries() {
        let (s, _) = sched(30, 64, 16, |_| {});
        let t0 = tokio::time::Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(req("first", 5), 2, tx).await.unwrap();
        let first = tokio::spawn(collect(rx, t0));
        tokio::time::sleep(Duration::from_millis(45)).await; // mid decode step 2
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(req("second", 2), 2, tx).await.unwrap();
        let second = tokio::spawn(collect(rx, t0));
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        let at = |ev: &[(Duration, Event)]| ev.iter().map(|(t, _)| t.as_millis() as u64).collect::<Vec<_>>();
        // first: prefill 30; decode alone 40, 50; the second's prefill runs
        // 50..80 (decode waits); both decode at batch 2 (92); the second is
        // done and leaves, so the first decodes alone again (102).
        assert_eq!(at(&first), vec![30, 40, 50, 92, 102, 102], "{first:?}");
        // second: prefill 50..80 gives its first token; one decode at batch 2.
        assert_eq!(at(&second), vec![80, 92, 92]);
        assert!(matches!(first.last().unwrap().1, Event::Done { finish_reason: FinishReason::Length, .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_sequence_frees_its_pages_at_the_next_boundary() {
        let (s, kv) = sched(0, 64, 16, |_| {});
        let (tx, mut rx) = mpsc::unbounded_channel();
        s.enqueue(req("cancel me", 1000), 2, tx).await.unwrap();
        rx.recv().await.unwrap();
        assert!(kv.snapshot().free < 64);
        let t = tokio::time::Instant::now();
        drop(rx);
        while s.snapshot().await.inflight_sequences > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // One decode step (10 ms) plus this loop's 1 ms polling.
        assert!(t.elapsed() <= Duration::from_millis(11), "within one decode step: {:?}", t.elapsed());
        assert_eq!(kv.snapshot().free, 64);
    }

    #[tokio::test(start_paused = true)]
    async fn preemption_reclaims_pages_and_the_victim_resumes_with_identical_text() {
        // 6 pages of 4 tokens: two sequences growing to 2 + 10 tokens each
        // (3 pages each) cannot both fit with the extension headroom.
        let alone = {
            let (s, _) = sched(0, 64, 4, |_| {});
            let (tx, rx) = mpsc::unbounded_channel();
            s.enqueue(req("victim", 10), 2, tx).await.unwrap();
            text(&collect(rx, tokio::time::Instant::now()).await)
        };
        let (s, kv) = sched(0, 5, 4, |c| c.min_quantum_tokens = 1);
        let t0 = tokio::time::Instant::now();
        let mut rxs = Vec::new();
        for (p, key) in [("keeper", 1.0), ("victim", 9.0)] {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut r = req(p, 10);
            r.priority_key = Some(key);
            s.enqueue(r, 2, tx).await.unwrap();
            rxs.push(tokio::spawn(collect(rx, t0)));
        }
        let keeper = rxs.remove(0).await.unwrap();
        let victim = rxs.remove(0).await.unwrap();
        let snap = s.snapshot().await;
        assert!(snap.preemptions >= 1, "the cache forced a preemption");
        assert!(snap.preemptions <= 2, "the cap (2) holds");
        assert!(matches!(keeper.last().unwrap().1, Event::Done { .. }), "{keeper:?}");
        assert!(matches!(victim.last().unwrap().1, Event::Done { .. }), "{victim:?}");
        assert_eq!(text(&victim), alone, "preempted and resumed, the text is unchanged");
        assert_eq!(kv.snapshot().free, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_preemptible_victim_the_needy_sequence_fails_cleanly() {
        let (s, kv) = sched(0, 3, 4, |c| c.max_preemptions = 0);
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(req("big", 50), 2, tx).await.unwrap();
        let events = collect(rx, tokio::time::Instant::now()).await;
        let Event::Error { code, .. } = &events.last().unwrap().1 else { panic!("{events:?}") };
        assert_eq!(code, "kv_exhausted");
        assert_eq!(kv.snapshot().free, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn drain_refuses_new_work_and_resolves_when_in_flight_work_is_done() {
        let (s, _) = sched(5, 64, 16, |_| {});
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(req("running", 4), 2, tx).await.unwrap();
        let t0 = tokio::time::Instant::now();
        let events = tokio::spawn(collect(rx, t0));
        let drained = {
            let s = s.clone();
            tokio::spawn(async move {
                s.drain().await;
                t0.elapsed()
            })
        };
        tokio::task::yield_now().await;
        let (tx, _rx) = mpsc::unbounded_channel();
        assert_eq!(s.enqueue(req("late", 4), 2, tx).await, Err(Refusal::Draining));
        let events = events.await.unwrap();
        assert!(matches!(events.last().unwrap().1, Event::Done { .. }));
        assert_eq!(
            drained.await.unwrap(),
            events.last().unwrap().0,
            "drain ends when the last sequence does"
        );
    }
}
