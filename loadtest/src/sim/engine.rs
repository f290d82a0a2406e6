//! A simulated engine: the emulated backend's timing and the engine
//! scheduler's turn structure, in virtual time.
//!
//! Like `engine::scheduler`, every turn is one token boundary that runs
//! either a prefill batch formed by `policies::batching::form_prefill` (the
//! same function, the same limits) or one decode step over every running
//! sequence (continuous batching), with the same turn rule
//! (`batching::prefill_turn`: no further prefill batch once the running
//! sequences have gone `max_decode_stall_ms` without a token). Device time
//! comes from the latency
//! profile exactly as the emulated backend takes it: `prefill_batch` over
//! the members' computed and cached tokens for a prefill batch,
//! `decode_step(batch, Σ context)` per step.
//!
//! To be fast, decode steps are not events: between two moments that
//! matter to the outside (a sequence finishing, a sequence arriving) the
//! running batch is fixed, so a run of decode steps up to the next finish
//! is summed in one go; an arrival in the middle cuts the run at the token
//! boundary after it (the step in progress completes, as on a GPU).
//!
//! Simplifications, measured against live runs in the calibration table
//! (docs/benchmarks/fleet.md): KV is counted in tokens and reserved up front at
//! admission for the whole answer (the engine reserves prompt + 64 and grows
//! page by page, preempting when full: the simulation never preempts);
//! a cancelled sequence leaves the queue at once but a running one runs to
//! its end.
//!
//! The prefix cache (`engine --prefix-cache`) is modelled as the engine
//! keeps it: a prompt's full blocks are named once its prefill ends, a new
//! sequence reuses the longest named prefix of its blocks before its last
//! token and is charged prefill only for the rest, and named blocks are
//! evicted least recently used first when the pages not held by admitted
//! sequences cannot hold them all. Evictions are reported (the KV events)
//! for the fleet's prefix index. A sequence whose answer a later prompt
//! resends (a conversation with `answers = "received"`) carries the blocks
//! of its prompt and answer together, and names those its K/V filled when
//! it ends, as the engine names a generated answer's pages.

use std::time::Duration;

use policies::batching::{form_prefill, prefill_turn, BatchLimits, Queued};
use policies::LatencyProfile;

/// How every engine of the simulated fleet is configured.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub limits: BatchLimits,
    pub profile: LatencyProfile,
    /// KV capacity, tokens (pages × tokens per page).
    pub kv_tokens: u64,
    /// Admission stops when less than this fraction would stay free.
    pub kv_low_watermark: f64,
    /// Tokens per page (and per prefix block).
    pub page_tokens: u32,
    /// The engines keep prompts' pages for reuse.
    pub prefix_cache: bool,
}

/// A sequence handed to an engine.
#[derive(Debug, Clone)]
pub struct SimSeq {
    /// The request's index in the simulation.
    pub req: usize,
    pub prompt: u32,
    /// Tokens it will produce (its natural end or `max_tokens`).
    pub out: u32,
    pub key: f64,
    pub enqueued_at: f64,
    pub ttft_budget_ms: f64,
    /// The prompt's full blocks (chained hashes, `policies::prefix`).
    pub blocks: std::sync::Arc<[u64]>,
    /// The full blocks of prompt and answer, when a later prompt resends
    /// the answer (else empty): named as the sequence ends.
    pub answer: std::sync::Arc<[u64]>,
    /// Leading prompt tokens found cached at admission (set by the engine).
    pub cached: u32,
}

#[derive(Debug, Clone, Copy)]
struct Running {
    req: usize,
    prompt: u32,
    /// Engine step count at which it has produced its last token.
    end_step: u64,
    /// Engine step count when it joined.
    start_step: u64,
    kv: u64,
    prefill_ms: f64,
    first_at: f64,
    cached: u32,
}

#[derive(Debug, Clone)]
enum Phase {
    Idle,
    Prefill {
        batch: Vec<(SimSeq, u64)>,
        started: f64,
    },
    /// `steps` decode steps of a fixed batch, starting at `start`.
    Decode {
        start: f64,
        steps: u64,
    },
}

/// What a token boundary produced, for the gateway.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Out {
    FirstToken { req: usize },
    Finished { req: usize, tokens: u32, prefill_ms: f64, decode_ms: f64, batch: f64, cached: u32 },
}

/// Why an engine refused a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Kv,
    Draining,
}

/// One simulated engine.
#[derive(Debug)]
pub struct SimEngine {
    queue: Vec<(SimSeq, u64)>,
    running: Vec<Running>,
    steps_done: u64,
    ctx_sum: u64,
    phase: Phase,
    kv_used: u64,
    pub draining: bool,
    /// Device-busy seconds, for utilization.
    pub busy_s: f64,
    /// Bumped whenever the scheduled wake-up changes; stale wakes are ignored.
    pub gen: u64,
    batch_avg: f64,
    /// Running (or prefilling) sequences whose client went away: they leave
    /// at the next token boundary, as an RST_STREAM makes them leave a real
    /// engine.
    cancelled: Vec<usize>,
    /// Named prompt blocks: hash → last use, and last use → hash.
    named: std::collections::HashMap<u64, u64>,
    lru: std::collections::BTreeMap<u64, u64>,
    tick: u64,
    /// Blocks evicted since the fleet last drained them (its KV events).
    pub evicted: Vec<u64>,
    /// The [`SimSeq::answer`] blocks of running sequences that have them.
    answers: std::collections::HashMap<usize, std::sync::Arc<[u64]>>,
    /// Prompt tokens prefilled, and of those found cached.
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    /// When every running sequence last had a token, at the latest
    /// (`batching::prefill_turn`).
    tokens_at: f64,
}

impl Default for SimEngine {
    fn default() -> Self {
        Self {
            queue: Vec::new(),
            running: Vec::new(),
            steps_done: 0,
            ctx_sum: 0,
            phase: Phase::Idle,
            kv_used: 0,
            draining: false,
            busy_s: 0.0,
            gen: 0,
            batch_avg: 0.0,
            cancelled: Vec::new(),
            named: std::collections::HashMap::new(),
            lru: std::collections::BTreeMap::new(),
            tick: 0,
            evicted: Vec::new(),
            answers: std::collections::HashMap::new(),
            lookup_tokens: 0,
            hit_tokens: 0,
            tokens_at: 0.0,
        }
    }
}

fn step_s(cfg: &EngineConfig, batch: u32, context: u64) -> f64 {
    cfg.profile.decode_step_ms(batch, context.min(u64::from(u32::MAX)) as u32) / 1e3
}

fn secs(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0))
}

impl SimEngine {
    /// Sequences queued or running (none: it may stop).
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty() && matches!(self.phase, Phase::Idle)
    }

    /// KV tokens its sequences hold now.
    pub fn kv_used(&self) -> u64 {
        self.kv_used
    }

    /// KV tokens free above the low watermark.
    pub fn kv_headroom(&self, cfg: &EngineConfig) -> u64 {
        let usable = (cfg.kv_tokens as f64 * (1.0 - cfg.kv_low_watermark)) as u64;
        usable.saturating_sub(self.kv_used)
    }

    /// Marks `hash` used now.
    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        if let Some(old) = self.named.insert(hash, self.tick) {
            self.lru.remove(&old);
        }
        self.lru.insert(self.tick, hash);
    }

    /// A prompt's blocks are prefilled: named (or refreshed) in the cache.
    fn name_blocks(&mut self, blocks: &[u64], cfg: &EngineConfig) {
        if cfg.prefix_cache {
            for &h in blocks {
                self.touch(h);
            }
            self.evict_to_fit(cfg);
        }
    }

    /// Evicts named blocks, least recently used first, until they fit in
    /// the pages admitted sequences do not hold.
    fn evict_to_fit(&mut self, cfg: &EngineConfig) {
        let page = u64::from(cfg.page_tokens.max(1));
        let room = (cfg.kv_tokens.saturating_sub(self.kv_used) / page) as usize;
        while self.named.len() > room {
            let Some((_, h)) = self.lru.pop_first() else { break };
            self.named.remove(&h);
            self.evicted.push(h);
        }
    }

    /// Admits `seq` at `now`. Returns when the engine must wake next if
    /// that changed (the caller bumps nothing: `gen` is bumped here).
    pub fn enqueue(&mut self, now: f64, mut seq: SimSeq, cfg: &EngineConfig) -> Result<Option<f64>, Refused> {
        if self.draining {
            return Err(Refused::Draining);
        }
        let kv = u64::from(seq.prompt) + u64::from(seq.out);
        if kv > self.kv_headroom(cfg) {
            return Err(Refused::Kv);
        }
        self.kv_used += kv;
        if cfg.prefix_cache {
            // The longest named prefix of the blocks before the last token.
            let reusable = (seq.prompt.saturating_sub(1) / cfg.page_tokens.max(1)) as usize;
            let found = seq.blocks.iter().take(reusable).take_while(|h| self.named.contains_key(h)).count();
            for k in 0..found {
                self.touch(seq.blocks[k]);
            }
            seq.cached = found as u32 * cfg.page_tokens;
            self.evict_to_fit(cfg);
        }
        self.lookup_tokens += u64::from(seq.prompt);
        self.hit_tokens += u64::from(seq.cached);
        self.queue.push((seq, kv));
        match self.phase {
            Phase::Idle => {
                self.gen += 1;
                Ok(Some(now))
            }
            Phase::Prefill { .. } => Ok(None), // it looks at the queue when the batch ends
            // Cut the run at the first token boundary at or after now.
            Phase::Decode { start, steps } => Ok(self.cut(now, start, steps, cfg)),
        }
    }

    fn run_len(&self, cfg: &EngineConfig, steps: u64) -> f64 {
        let b = self.running.len() as u32;
        (0..steps).map(|i| step_s(cfg, b, self.ctx_sum + i * u64::from(b))).sum()
    }

    /// `req`'s client went away: a queued sequence leaves now, a running or
    /// prefilling one at the next token boundary. Returns when the engine
    /// must wake if that moved (a decode run cut short).
    pub fn cancel(&mut self, now: f64, req: usize, cfg: &EngineConfig) -> Option<f64> {
        if let Some(i) = self.queue.iter().position(|(s, _)| s.req == req) {
            let (_, kv) = self.queue.remove(i);
            self.kv_used -= kv;
            return None;
        }
        let running = self.running.iter().any(|r| r.req == req);
        let prefilling =
            matches!(&self.phase, Phase::Prefill { batch, .. } if batch.iter().any(|(s, _)| s.req == req));
        if !running && !prefilling {
            return None;
        }
        self.cancelled.push(req);
        if let Phase::Decode { start, steps } = self.phase {
            if running {
                return self.cut(now, start, steps, cfg);
            }
        }
        None
    }

    /// Cuts the decode run started at `start` at the first token boundary
    /// at or after `now`; returns that boundary when it moved the wake-up.
    fn cut(&mut self, now: f64, start: f64, steps: u64, cfg: &EngineConfig) -> Option<f64> {
        let b = self.running.len() as u32;
        let mut t = start;
        let mut done = 0;
        while done < steps && t < now {
            t += step_s(cfg, b, self.ctx_sum + done * u64::from(b));
            done += 1;
        }
        if done == steps {
            return None; // the run ends by now anyway
        }
        self.busy_s -= (start + self.run_len(cfg, steps)) - t;
        self.phase = Phase::Decode { start, steps: done };
        self.gen += 1;
        Some(t)
    }

    /// The token boundary the engine scheduled for `now`: completes the
    /// phase in progress, reports first tokens and finishes into `outs`,
    /// starts the next phase; returns when to wake next (None: idle).
    pub fn wake(&mut self, now: f64, cfg: &EngineConfig, outs: &mut Vec<Out>) -> Option<f64> {
        self.complete_phase(now, cfg, outs);
        self.leave_cancelled();
        self.leave_finished(now, cfg, outs);
        self.next_turn(now, cfg)
    }

    /// Ends the phase in progress: a prefill batch's members get their
    /// first token and run; a decode run adds its steps.
    fn complete_phase(&mut self, now: f64, cfg: &EngineConfig, outs: &mut Vec<Out>) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => {}
            Phase::Prefill { batch, started } => {
                let prefill_ms = (now - started) * 1e3;
                if self.running.is_empty() {
                    self.tokens_at = now; // the batch starts the running set
                }
                for (s, kv) in batch {
                    if let Some(i) = self.cancelled.iter().position(|&c| c == s.req) {
                        self.cancelled.swap_remove(i);
                        self.kv_used -= kv;
                        continue;
                    }
                    outs.push(Out::FirstToken { req: s.req });
                    self.name_blocks(&s.blocks, cfg);
                    if !s.answer.is_empty() {
                        self.answers.insert(s.req, s.answer);
                    }
                    let r = Running {
                        req: s.req,
                        prompt: s.prompt,
                        end_step: self.steps_done + u64::from(s.out.max(1)) - 1,
                        start_step: self.steps_done,
                        kv,
                        prefill_ms,
                        first_at: now,
                        cached: s.cached,
                    };
                    self.running.push(r);
                    self.ctx_sum += u64::from(s.prompt) + 1;
                }
            }
            Phase::Decode { steps, .. } => {
                let b = self.running.len() as u64;
                self.ctx_sum += steps * b;
                self.steps_done += steps;
                self.tokens_at = now;
                self.batch_avg =
                    if self.batch_avg == 0.0 { b as f64 } else { 0.9 * self.batch_avg + 0.1 * b as f64 };
            }
        }
    }

    /// Cancelled sequences leave at this boundary, silently.
    fn leave_cancelled(&mut self) {
        let steps_done = self.steps_done;
        let mut i = 0;
        while i < self.running.len() && !self.cancelled.is_empty() {
            let r = self.running[i];
            match self.cancelled.iter().position(|&c| c == r.req) {
                Some(c) => {
                    self.cancelled.swap_remove(c);
                    self.running.swap_remove(i);
                    let produced = (steps_done - r.start_step + 1).min(r.end_step - r.start_step + 1);
                    self.ctx_sum -= u64::from(r.prompt) + produced;
                    self.kv_used -= r.kv;
                    self.answers.remove(&r.req);
                }
                None => i += 1,
            }
        }
    }

    /// Finished sequences leave at this boundary.
    fn leave_finished(&mut self, now: f64, cfg: &EngineConfig, outs: &mut Vec<Out>) {
        let steps_done = self.steps_done;
        let batch = self.batch_avg.max(1.0);
        let mut i = 0;
        while i < self.running.len() {
            let r = self.running[i];
            if r.end_step <= steps_done {
                self.running.swap_remove(i);
                let produced = r.end_step - r.start_step + 1;
                self.ctx_sum -= u64::from(r.prompt) + produced;
                self.kv_used -= r.kv;
                if let Some(blocks) = self.answers.remove(&r.req) {
                    // Every position but the last token's holds K/V.
                    let n = (u64::from(r.prompt) + produced - 1) / u64::from(cfg.page_tokens.max(1));
                    self.name_blocks(&blocks[..blocks.len().min(n as usize)], cfg);
                }
                outs.push(Out::Finished {
                    req: r.req,
                    tokens: produced as u32,
                    prefill_ms: r.prefill_ms,
                    decode_ms: (now - r.first_at) * 1e3,
                    batch,
                    cached: r.cached,
                });
            } else {
                i += 1;
            }
        }
    }

    /// Starts the next phase: a prefill batch if batch formation picks one
    /// and the running sequences have not waited too long for a token, else
    /// a decode run; returns when it ends (None: idle).
    fn next_turn(&mut self, now: f64, cfg: &EngineConfig) -> Option<f64> {
        let may_prefill = prefill_turn(self.running.len() as u32, secs(now - self.tokens_at), &cfg.limits);
        if may_prefill && !self.queue.is_empty() {
            if let Some(end) = self.start_prefill(now, cfg) {
                return Some(end);
            }
        }
        if self.running.is_empty() {
            return None;
        }
        // Decode up to the next finish (an arrival cuts the run short); one
        // step when the turn rule held a queued prefill back.
        let next = self.running.iter().map(|r| r.end_step).min().expect("non-empty");
        let steps = if may_prefill || self.queue.is_empty() { (next - self.steps_done).max(1) } else { 1 };
        let d = self.run_len(cfg, steps);
        self.busy_s += d;
        self.phase = Phase::Decode { start: now, steps };
        Some(now + d)
    }

    /// The prefill batch `form_prefill` picks from the queue, started now;
    /// returns when it ends (None: it picks none).
    fn start_prefill(&mut self, now: f64, cfg: &EngineConfig) -> Option<f64> {
        let views: Vec<Queued> = self
            .queue
            .iter()
            .map(|(s, _)| Queued {
                id: s.req as u64,
                prompt_tokens: s.prompt - s.cached, // a cached prefix costs no linear work
                cached_tokens: s.cached,
                key: s.key,
                enqueued_at: secs(s.enqueued_at),
                ttft_budget: secs(s.ttft_budget_ms / 1e3),
            })
            .collect();
        let plan = form_prefill(&views, self.running.len() as u32, &cfg.limits, &cfg.profile, secs(now));
        if plan.admit.is_empty() {
            return None;
        }
        let mut batch = Vec::with_capacity(plan.admit.len());
        for id in &plan.admit {
            let i = self.queue.iter().position(|(s, _)| s.req as u64 == *id).expect("planned from the queue");
            batch.push(self.queue.swap_remove(i));
        }
        let d = plan.prefill.as_secs_f64();
        self.busy_s += d;
        self.phase = Phase::Prefill { batch, started: now };
        Some(now + d)
    }
}

#[cfg(test)]
mod tests;
