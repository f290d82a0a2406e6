//! A simulated engine: the engine's own scheduler (`policies::turn`) with
//! the emulated backend's timing, in virtual time.
//!
//! Every turn is one token boundary at which `policies::turn` picks the
//! next step, exactly as the live engine's scheduler task asks it: a
//! prefill batch (formed by `policies::batching::form_prefill`, the turn
//! rule `batching::prefill_turn` bounding how long running sequences wait
//! for a token) or one decode step over every running sequence
//! (continuous batching); KV pages are reserved at admission (prompt plus
//! the output reserve), grown page by page and reclaimed by preemption
//! when the cache runs out (`policies::kv`, the engine's own allocator and
//! prefix cache); lower tiers' sequences are paused for higher ones when
//! the gateway asks for priority preemption. Device time comes from the
//! latency profile exactly as the emulated backend takes it:
//! `prefill_batch` over the members' computed and cached tokens for a
//! prefill batch, `decode_step(batch, Σ context)` per step.
//!
//! To be fast, decode steps are not events: while no decision could
//! differ between two token boundaries (`Turns::fusable`: no prefill held
//! by the turn rule, no priority decision pending, pages enough for every
//! running sequence to grow), a run of decode steps up to the next finish
//! is summed in one go; an arrival in the middle cuts the run at the
//! token boundary after it (the step in progress completes, as on a GPU).
//! Pages are taken as the engine takes them, before each step: when an
//! arrival or a cancel looks at the cache mid-run, the running sequences
//! hold pages for the steps begun by then, and a run's end tops them up
//! for the rest.
//!
//! What differs from the live engine, measured in the calibration table
//! (docs/benchmarks/fleet.md): prompts are not text, so prefix blocks are
//! named by hash alone (a hash collision, at 2^-64, would be a false hit
//! the engine's content check catches); a sequence's output length is known
//! at admission (its natural end or `max_tokens`), and one that ends by
//! itself ends at its last token (the engine spends one more decode step
//! to see the end).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use policies::batching::BatchLimits;
use policies::kv::{KvAllocator, KvConfig};
use policies::prefix::Block;
use policies::turn::{self, Admitted, Payload, Spec, Step, TurnConfig, Turns};
use policies::LatencyProfile;

/// How every engine of the simulated fleet is configured.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub limits: BatchLimits,
    pub profile: LatencyProfile,
    /// KV capacity, tokens (pages × tokens per page).
    pub kv_tokens: u64,
    /// Admission stops when less than this fraction would stay free, and
    /// resumes once this high fraction is free again.
    pub kv_low_watermark: f64,
    pub kv_high_watermark: f64,
    /// Tokens per page (and per prefix block).
    pub page_tokens: u32,
    /// The engines keep prompts' pages for reuse.
    pub prefix_cache: bool,
    /// Output tokens reserved at admission (`engine --kv-output-reserve`).
    pub output_reserve_tokens: u32,
    /// Pages a running sequence grows by (`--kv-extend-pages`).
    pub extend_pages: u32,
    /// Preemption bounds (`--max-preemptions`, `--min-quantum-tokens`).
    pub max_preemptions: u32,
    pub min_quantum_tokens: u32,
}

impl EngineConfig {
    /// An engine with these limits, profile and cache, and every other
    /// setting at the engine's defaults.
    pub fn new(limits: BatchLimits, profile: LatencyProfile, kv_tokens: u64, page_tokens: u32) -> Self {
        Self {
            limits,
            profile,
            kv_tokens,
            kv_low_watermark: 0.05,
            kv_high_watermark: 0.15,
            page_tokens,
            prefix_cache: true,
            output_reserve_tokens: 64,
            extend_pages: 2,
            max_preemptions: 2,
            min_quantum_tokens: 16,
        }
    }

    fn turns(&self) -> TurnConfig {
        TurnConfig {
            limits: self.limits.clone(),
            profile: self.profile.clone(),
            output_reserve_tokens: self.output_reserve_tokens,
            extend_pages: self.extend_pages,
            default_ttft: Duration::from_secs(2),
            max_preemptions: self.max_preemptions,
            min_quantum_tokens: self.min_quantum_tokens,
        }
    }

    fn kv(&self) -> KvConfig {
        let page = self.page_tokens.max(1);
        KvConfig {
            total_pages: u32::try_from(self.kv_tokens / u64::from(page)).unwrap_or(u32::MAX),
            page_tokens: page,
            low_watermark: self.kv_low_watermark,
            high_watermark: self.kv_high_watermark,
            prefix_cache: self.prefix_cache,
        }
    }
}

/// A sequence handed to an engine.
#[derive(Debug, Clone)]
pub struct SimSeq {
    /// The request's index in the simulation.
    pub req: usize,
    pub prompt: u32,
    /// Tokens it will produce (its natural end or `max_tokens`).
    pub out: u32,
    /// The request's `max_tokens` (the output reserve is capped by it).
    pub max_tokens: u32,
    pub key: f64,
    pub enqueued_at: f64,
    pub ttft_budget_ms: f64,
    /// Its standing for priority preemption, when the gateway asks for it.
    pub priority: Option<turn::Priority>,
    /// The prompt's full blocks (chained hashes, `policies::prefix`).
    pub blocks: Arc<[u64]>,
    /// The full blocks of prompt and answer, when a later prompt resends
    /// the answer (else empty): named as the sequence ends.
    pub answer: Arc<[u64]>,
}

/// What a token boundary produced, for the gateway.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Out {
    FirstToken {
        req: usize,
    },
    Finished {
        req: usize,
        tokens: u32,
        prefill_ms: f64,
        decode_ms: f64,
        batch: f64,
        cached: u32,
    },
    /// The engine ended the sequence with an error event (`kv_exhausted`).
    Failed {
        req: usize,
        code: &'static str,
    },
}

/// Why an engine refused a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Kv,
    Draining,
}

/// The simulator's payload of a `policies::turn` sequence.
#[derive(Debug)]
struct Job {
    req: usize,
    out: u32,
    answer: Arc<[u64]>,
    prefill_ms: f64,
    first_at: f64,
    /// Its client went away while it was on the device.
    cancelled: bool,
    /// Where the engine's error events go.
    failures: Arc<Mutex<Vec<(usize, &'static str)>>>,
}

impl Payload for Job {
    fn failed(seq: &mut turn::Seq<Self>, code: &'static str, _message: &'static str) {
        if let Ok(mut f) = seq.payload.failures.lock() {
            f.push((seq.payload.req, code));
        }
    }
}

#[derive(Debug)]
enum Phase {
    Idle,
    Prefill {
        batch: Vec<turn::Seq<Job>>,
        started: f64,
    },
    /// `steps` decode steps of a fixed batch, starting at `start`.
    Decode {
        start: f64,
        steps: u64,
    },
}

/// One simulated engine.
#[derive(Debug)]
pub struct SimEngine {
    turns: Turns<Job>,
    phase: Phase,
    pub draining: bool,
    /// Device-busy seconds, for utilization.
    pub busy_s: f64,
    /// Bumped whenever the scheduled wake-up changes; stale wakes are ignored.
    pub gen: u64,
    batch_avg: f64,
    /// Blocks evicted since the fleet last drained them (its KV events).
    pub evicted: Vec<u64>,
    /// The last KV event read.
    events_seen: u64,
    /// Running or paused sequences whose client went away: they leave at
    /// the next token boundary, as an RST_STREAM makes them leave a real
    /// engine.
    cancelled: Vec<usize>,
    failures: Arc<Mutex<Vec<(usize, &'static str)>>>,
    /// Free KV pages after the last change (routing reads it per decision).
    kv_free: u32,
}

fn secs(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0))
}

/// The blocks of `hashes` as the KV cache keeps them (content unchecked).
fn blocks(hashes: &[u64]) -> Vec<Block> {
    hashes.iter().map(|&hash| Block { hash, content: Box::default() }).collect()
}

impl SimEngine {
    pub fn new(cfg: &EngineConfig) -> Self {
        let kv = KvAllocator::new(cfg.kv());
        Self {
            kv_free: kv.free_pages(),
            turns: Turns::new(cfg.turns(), kv),
            phase: Phase::Idle,
            draining: false,
            busy_s: 0.0,
            gen: 0,
            batch_avg: 0.0,
            evicted: Vec::new(),
            events_seen: 0,
            cancelled: Vec::new(),
            failures: Arc::default(),
        }
    }

    /// Sequences queued or running (none: it may stop).
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty() && matches!(self.phase, Phase::Idle)
    }

    /// KV tokens its sequences hold now.
    pub fn kv_used(&self) -> u64 {
        let kv = self.turns.kv();
        u64::from(kv.total_pages() - self.kv_free) * u64::from(kv.page_tokens())
    }

    /// KV tokens free above the low watermark.
    pub fn kv_headroom(&self) -> u64 {
        let kv = self.turns.kv();
        u64::from(self.kv_free.saturating_sub(kv.low_pages())) * u64::from(kv.page_tokens())
    }

    /// Prompt tokens prefilled so far, and of those found cached.
    pub fn lookup_tokens(&self) -> u64 {
        self.turns.stats().prompt_tokens
    }

    pub fn hit_tokens(&self) -> u64 {
        self.turns.stats().cached_tokens
    }

    /// Sequences preempted for KV room so far.
    pub fn preemptions(&self) -> u64 {
        self.turns.stats().preemptions
    }

    /// The KV cache's evictions since the last call, into `evicted`; the
    /// free pages routing reads.
    fn read_events(&mut self) {
        let kv = self.turns.kv();
        self.kv_free = kv.free_pages();
        if kv.last_seq() != self.events_seen {
            self.events_seen = kv.evicted_since(self.events_seen, &mut self.evicted);
        }
    }

    /// Admits `seq` at `now`. Returns when the engine must wake next if
    /// that changed (the caller bumps nothing: `gen` is bumped here).
    pub fn enqueue(&mut self, now: f64, seq: SimSeq) -> Result<Option<f64>, Refused> {
        if self.draining {
            return Err(Refused::Draining);
        }
        let kv = self.turns.kv();
        let (blocks, reusable) = if kv.prefix_cache() {
            let reusable = (seq.prompt.saturating_sub(1) / kv.page_tokens()) as usize;
            (blocks(&seq.blocks), reusable)
        } else {
            (Vec::new(), 0)
        };
        let spec = Spec {
            prompt_tokens: seq.prompt,
            max_tokens: seq.max_tokens.max(seq.out),
            key: Some(seq.key),
            ttft_budget: Some(secs(seq.ttft_budget_ms / 1e3)),
            priority: seq.priority,
            blocks,
            reusable,
        };
        let failures = Arc::clone(&self.failures);
        let job = |_| Job {
            req: seq.req,
            out: seq.out.max(1),
            answer: seq.answer,
            prefill_ms: 0.0,
            first_at: 0.0,
            cancelled: false,
            failures,
        };
        // Mid-run, the engine has grown its running sequences' pages for
        // the steps begun by now.
        let mid_run = match self.phase {
            Phase::Decode { start, steps } => Some((start, steps, self.begun(now, start, steps))),
            _ => None,
        };
        if let Some((_, _, (begun, _))) = mid_run {
            self.turns.extend(begun);
        }
        let admitted = self.turns.admit(secs(seq.enqueued_at.min(now)), spec, job);
        self.read_events();
        match admitted {
            Ok(Admitted::Queued(_)) => {}
            // `out` is at least 1: nothing is admitted finished.
            Ok(Admitted::Finished(_)) => return Ok(None),
            Err(turn::Refusal::Draining) => return Err(Refused::Draining),
            Err(turn::Refusal::Kv(_)) => return Err(Refused::Kv),
        }
        match (&self.phase, mid_run) {
            // Cut the run at the first token boundary at or after now.
            (_, Some((start, steps, begun))) => Ok(self.cut_at(start, steps, begun)),
            (Phase::Idle, _) => {
                self.gen += 1;
                Ok(Some(now))
            }
            _ => Ok(None), // a prefill batch: it looks at the queue when it ends
        }
    }

    /// Σ context of the running batch now.
    fn context(&self) -> u64 {
        self.turns.running().iter().map(|s| u64::from(s.context())).sum()
    }

    fn run_len(&self, steps: u64) -> f64 {
        let b = self.turns.running().len() as u32;
        let ctx = self.context();
        let profile = &self.turns.config().profile;
        (0..steps).map(|i| step_s(profile, b, ctx + i * u64::from(b))).sum()
    }

    /// Of the decode run of `steps` started at `start`: the steps begun
    /// before `now`, and when the last of them ends.
    fn begun(&self, now: f64, start: f64, steps: u64) -> (u64, f64) {
        let b = self.turns.running().len() as u32;
        let ctx = self.context();
        let profile = &self.turns.config().profile;
        let mut t = start;
        let mut done = 0;
        while done < steps && t < now {
            t += step_s(profile, b, ctx + done * u64::from(b));
            done += 1;
        }
        (done, t)
    }

    /// `req`'s client went away: a queued sequence leaves now, a running or
    /// prefilling one at the next token boundary. Returns when the engine
    /// must wake if that moved (a decode run cut short).
    pub fn cancel(&mut self, now: f64, req: usize) -> Option<f64> {
        let queued = self.turns.queue().iter().any(|s| s.payload.req == req);
        if queued {
            self.turns.retain(|s| s.payload.req != req);
            self.kv_free = self.turns.kv().free_pages();
            return None;
        }
        let mut found = false;
        if let Phase::Prefill { batch, .. } = &mut self.phase {
            for s in batch.iter_mut().filter(|s| s.payload.req == req) {
                s.payload.cancelled = true;
                found = true;
            }
        }
        // (A running or paused sequence is marked through the turns'
        // retain at the next boundary: note it here.)
        let running = self.turns.running().iter().chain(self.turns.paused()).any(|s| s.payload.req == req);
        if running {
            self.cancelled.push(req);
        }
        if !running && !found {
            return None;
        }
        if let Phase::Decode { start, steps } = self.phase {
            if running {
                return self.cut(now, start, steps);
            }
        }
        None
    }

    /// Cuts the decode run started at `start` at the first token boundary
    /// at or after `now`; returns that boundary when it moved the wake-up.
    /// The running sequences' pages grow for the steps begun by `now`.
    fn cut(&mut self, now: f64, start: f64, steps: u64) -> Option<f64> {
        let begun = self.begun(now, start, steps);
        self.cut_at(start, steps, begun)
    }

    /// [`Self::cut`] with the steps begun, and when they end, known.
    fn cut_at(&mut self, start: f64, steps: u64, (done, t): (u64, f64)) -> Option<f64> {
        self.turns.extend(done);
        if done == steps {
            return None; // the run ends by now anyway
        }
        self.busy_s -= (start + self.run_len(steps)) - t;
        self.phase = Phase::Decode { start, steps: done };
        self.gen += 1;
        Some(t)
    }

    /// The token boundary the engine scheduled for `now`: completes the
    /// phase in progress, reports first tokens, finishes and failures into
    /// `outs`, starts the next phase; returns when to wake next (None: idle).
    pub fn wake(&mut self, now: f64, outs: &mut Vec<Out>) -> Option<f64> {
        self.complete_phase(now, outs);
        if !self.cancelled.is_empty() {
            let cancelled = std::mem::take(&mut self.cancelled);
            self.turns.retain(|s| !cancelled.contains(&s.payload.req));
        }
        let next = self.next_turn(now);
        self.read_events();
        if let Ok(mut f) = self.failures.lock() {
            outs.extend(f.drain(..).map(|(req, code)| Out::Failed { req, code }));
        }
        next
    }

    /// Ends the phase in progress: a prefill batch's members get their
    /// first token and run; a decode run's steps give every running
    /// sequence as many tokens.
    fn complete_phase(&mut self, now: f64, outs: &mut Vec<Out>) {
        let batch_avg = &mut self.batch_avg;
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => {}
            Phase::Prefill { batch, started } => {
                let prefill_ms = (now - started) * 1e3;
                let batch_now = *batch_avg;
                self.turns.prefilled(secs(now), batch, |s| {
                    if s.payload.cancelled {
                        return true;
                    }
                    if s.generated == 0 {
                        s.payload.prefill_ms = prefill_ms;
                        s.payload.first_at = now;
                        outs.push(Out::FirstToken { req: s.payload.req });
                    }
                    s.produced();
                    finish_if_done(s, now, batch_now, outs)
                });
            }
            Phase::Decode { steps, .. } => {
                let b = self.turns.running().len() as f64;
                *batch_avg = if *batch_avg == 0.0 { b } else { 0.9 * *batch_avg + 0.1 * b };
                let batch_now = *batch_avg;
                self.turns.extend(steps);
                let n = u32::try_from(steps).unwrap_or(u32::MAX);
                let cancelled = &self.cancelled;
                self.turns.decoded(secs(now), |s| {
                    if cancelled.contains(&s.payload.req) {
                        return true; // leaves silently
                    }
                    s.generated += n;
                    s.since_start += n;
                    finish_if_done(s, now, batch_now, outs)
                });
            }
        }
    }

    /// Starts the step `policies::turn` picks: a prefill batch, or a run
    /// of decode steps up to the next finish as far as nothing could
    /// decide otherwise; returns when it ends (None: idle).
    fn next_turn(&mut self, now: f64) -> Option<f64> {
        match self.turns.next(secs(now)) {
            Step::Idle => None,
            Step::Prefill(batch) => {
                let members: Vec<(u32, u32)> = batch
                    .iter()
                    .map(|s| {
                        let cached = s.cached().min(s.context());
                        (s.context() - cached, cached)
                    })
                    .collect();
                let d = self.turns.config().profile.prefill_batch(members).as_secs_f64();
                self.busy_s += d;
                self.phase = Phase::Prefill { batch, started: now };
                Some(now + d)
            }
            Step::Decode => {
                let next = self
                    .turns
                    .running()
                    .iter()
                    .map(|s| u64::from(s.payload.out.saturating_sub(s.generated).max(1)))
                    .min()
                    .unwrap_or(1);
                let steps = self.turns.fusable(secs(now), next);
                let d = self.run_len(steps);
                self.busy_s += d;
                self.phase = Phase::Decode { start: now, steps };
                Some(now + d)
            }
        }
    }
}

/// A sequence that has produced its `out` tokens ends: the pages its
/// answer filled are named (when a later prompt resends it) and its finish
/// is reported.
fn finish_if_done(s: &mut turn::Seq<Job>, now: f64, batch: f64, outs: &mut Vec<Out>) -> bool {
    if s.generated < s.payload.out {
        return false;
    }
    if !s.payload.answer.is_empty() {
        s.blocks = blocks(&s.payload.answer);
        s.commit_output();
    }
    outs.push(Out::Finished {
        req: s.payload.req,
        tokens: s.generated,
        prefill_ms: s.payload.prefill_ms,
        decode_ms: (now - s.payload.first_at) * 1e3,
        batch: batch.max(1.0),
        cached: s.cached_tokens,
    });
    true
}

fn step_s(profile: &LatencyProfile, batch: u32, context: u64) -> f64 {
    profile.decode_step_ms(batch, context.min(u64::from(u32::MAX)) as u32) / 1e3
}

#[cfg(test)]
mod tests;
