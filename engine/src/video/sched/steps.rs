//! Step-boundary scheduling (SlackServe §4.1, the emulated backend): a
//! batch runs one denoising step at a time, and between steps
//!
//! - a member whose steps are done leaves with its chunk at once;
//! - new chunk requests are taken in, and waiting chunks fill free batch
//!   slots, lowest ordering key (credit) first;
//! - a waiting chunk with a lower key than a running member's preempts it
//!   when the batch is full: the member goes back to the queue with its
//!   progress (steps left) kept, and resumes from there later.
//!
//! So an URGENT chunk waits at most one step, not a whole batch of RELAXED
//! ones. A step of the batch takes the longest member's step plus the
//! coalescing cost of the others (the profile's batch model, per step).
//!
//! Commands run at step boundaries too, except those for a session in
//! the batch: they wait until its chunk is done (and later commands for
//! that session wait behind them, in order), so a transfer, a prompt
//! switch or an end never waits for a whole batch that keeps refilling.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Cmd, Core, Member, Place};
use crate::video::batch::placeholder_frames;

/// The session a command is about (`None`: the engine as a whole).
fn session_of(c: &Cmd) -> Option<&str> {
    match c {
        Cmd::Create(c, _) => Some(&c.id),
        Cmd::Chunk(id, ..)
        | Cmd::Prompt(id, ..)
        | Cmd::Suspend(id, _)
        | Cmd::Resume(id, _)
        | Cmd::Export(id, _)
        | Cmd::Import(id, ..)
        | Cmd::State(id, _)
        | Cmd::End(id, _)
        | Cmd::Offer(id, ..)
        | Cmd::Snapshot(id, ..)
        | Cmd::Stage(id, ..)
        | Cmd::Commit(id, ..)
        | Cmd::Unstage(id, _)
        | Cmd::Adopt(id, _) => Some(id),
        Cmd::Load(_) | Cmd::Lend(..) => None,
    }
}

/// A member of the stepping batch.
struct Running {
    member: Member,
    steps_left: u32,
    step_ms: f64,
    since: Instant,
}

impl Core {
    fn running(&self, member: Member) -> Running {
        let steps = u32::from(member.pending.req.fidelity.steps.max(1));
        let mut chunk_ms = self.cfg.profile.point(&member.pending.req.fidelity).map_or(0.0, |p| p.chunk_ms);
        if member.pending.req.sp == 2 {
            chunk_ms *= self.cfg.profile.sp2_factor;
        }
        let steps_left = member.pending.steps_left.unwrap_or(steps).clamp(1, steps);
        Running { step_ms: chunk_ms / f64::from(steps), steps_left, since: crate::clock::now(), member }
    }

    pub(super) async fn run_steps(&mut self, batch: Vec<Member>, rx: &mut mpsc::Receiver<Cmd>) {
        let mut running: Vec<Running> = batch.into_iter().map(|m| self.running(m)).collect();
        let mut deferred: Vec<Cmd> = Vec::new();
        self.load.batches += 1;
        ::metrics::histogram!(crate::metrics::VIDEO_BATCH).record(running.len() as f64);
        let mut device_free_at = tokio::time::Instant::now();
        while !running.is_empty() {
            // Donated halves of other engines' chunks run in the batch too.
            let now = crate::clock::now();
            self.lends.retain(|(until, _)| *until > now);
            let lent = self.lends.iter().map(|(_, ms)| *ms);
            let max = running.iter().map(|r| r.step_ms).chain(lent.clone()).fold(0.0, f64::max);
            let sum: f64 = running.iter().map(|r| r.step_ms).chain(lent).sum();
            let step_ms = max + self.cfg.profile.batch_cost * (sum - max);
            // Steps run back to back: each ends `step_ms` after the previous
            // one did (tokio's timer lateness, ~1 ms a step, does not add up
            // over a chunk's steps).
            let start = crate::clock::step_start(device_free_at, tokio::time::Instant::now());
            device_free_at = start + Duration::from_secs_f64(step_ms / 1e3);
            tokio::time::sleep_until(device_free_at).await;
            let size = running.len() as u32;
            let mut still = Vec::new();
            for mut r in running {
                r.steps_left -= 1;
                if r.steps_left > 0 {
                    still.push(r);
                    continue;
                }
                let mut m = r.member;
                m.state.chunks += 1;
                let frames = placeholder_frames(&m.state, m.res, m.latent_frames);
                self.complete(m, frames, size, r.since, crate::clock::since(r.since).as_secs_f64() * 1e3);
            }
            running = still;
            // The step boundary: commands for sessions not in the batch
            // run now; those for a member wait until it leaves (so do later
            // ones for the same session, in order).
            while let Ok(c) = rx.try_recv() {
                deferred.push(c);
            }
            let blocked: Vec<String> = running.iter().map(|r| r.member.pending.id.clone()).collect();
            for c in std::mem::take(&mut deferred) {
                match session_of(&c) {
                    Some(id) if blocked.iter().any(|b| b == id) => deferred.push(c),
                    _ => self.command(c),
                }
            }
            self.refill(&mut running);
        }
        for c in deferred {
            self.command(c);
        }
    }

    /// Free slots take the most urgent waiting chunks; then each waiting
    /// chunk more urgent than the least urgent member takes its place.
    fn refill(&mut self, running: &mut Vec<Running>) {
        if self.pending.is_empty() {
            return;
        }
        self.pending.sort_by(|a, b| a.req.key.total_cmp(&b.req.key));
        let mut rest = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let chosen: Vec<String> = running.iter().map(|r| r.member.pending.id.clone()).collect();
            if running.len() + self.lends.len() >= self.cfg.max_batch as usize {
                let Some(worst) = (0..running.len()).max_by(|&a, &b| {
                    running[a].member.pending.req.key.total_cmp(&running[b].member.pending.req.key)
                }) else {
                    rest.push(p);
                    continue;
                };
                if p.req.key >= running[worst].member.pending.req.key {
                    rest.push(p);
                    continue;
                }
                // Preempt: back to the queue with its progress.
                let out = running.swap_remove(worst);
                let mut m = out.member;
                if let Some(s) = self.sessions.get_mut(&m.pending.id) {
                    s.place = Place::Resident(m.state);
                    m.pending.steps_left = Some(out.steps_left);
                    self.load.preemptions += 1;
                    ::metrics::counter!(crate::metrics::VIDEO_PREEMPTIONS).increment(1);
                    rest.push(m.pending);
                } else {
                    continue; // the session ended meanwhile: nothing to keep
                }
            }
            let chosen: Vec<String> =
                chosen.into_iter().filter(|id| running.iter().any(|r| r.member.pending.id == *id)).collect();
            match self.take_member(p, &chosen) {
                Ok(m) => {
                    let r = self.running(m);
                    running.push(r);
                }
                Err(p) => rest.push(p),
            }
        }
        self.pending = rest;
    }
}
