//! The playout model of one stream, its slack, service credit and urgency
//! tier. Time is a parameter (seconds on any fixed clock).
//!
//! Playback starts when the first chunk is delivered; chunk `i` (counted
//! from the start of the current prompt) must be ready by `start + i × D +
//! time paused since start`, where `D` is the chunk duration. Stalls do not
//! move deadlines (a late chunk is late; CPR counts it). Slack `P` is the
//! playable video buffered ahead of the cursor: `ready × D − (now − start −
//! paused)`; before the first chunk it is what is left of the initial budget
//! (4 × the estimated first-chunk time). A prompt switch drops what was
//! buffered for the old prompt and starts over with the initial budget.

use serde::{Deserialize, Serialize};

/// How urgently a stream needs its next chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Urgency {
    /// Credit below α × the next chunk's time.
    Urgent,
    Normal,
    /// Credit above 2α × the next chunk's time.
    Relaxed,
}

/// The tier of a stream with credit `credit_s` whose next chunk takes
/// `next_s`.
pub fn urgency(credit_s: f64, next_s: f64, alpha: f64) -> Urgency {
    if credit_s < alpha * next_s {
        Urgency::Urgent
    } else if credit_s > 2.0 * alpha * next_s {
        Urgency::Relaxed
    } else {
        Urgency::Normal
    }
}

/// Service credit `C = P − (R + T)`: slack less the remaining time of the
/// chunk in progress and the time of the next one.
pub fn credit(slack_s: f64, in_progress_s: f64, next_s: f64) -> f64 {
    slack_s - (in_progress_s + next_s)
}

/// One stream's playout clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Playout {
    /// Chunk duration `D` in seconds (frames per chunk / fps).
    pub chunk_s: f64,
    /// Initial slack budget of the current prompt.
    budget_s: f64,
    /// When the current prompt began (creation or the last switch).
    origin: f64,
    /// When playback of the current prompt started (first chunk delivered).
    start: Option<f64>,
    /// Paused time since `start` (or since `origin` before it), ended pauses.
    paused_s: f64,
    paused_since: Option<f64>,
    /// Chunks delivered for the current prompt.
    ready: u32,
}

impl Playout {
    pub fn new(now: f64, chunk_s: f64, budget_s: f64) -> Self {
        Self { chunk_s, budget_s, origin: now, start: None, paused_s: 0.0, paused_since: None, ready: 0 }
    }

    pub fn started(&self) -> bool {
        self.start.is_some()
    }

    pub fn paused(&self) -> bool {
        self.paused_since.is_some()
    }

    /// How long the stream has been paused (0 when playing).
    pub fn paused_for(&self, now: f64) -> f64 {
        self.paused_since.map_or(0.0, |t| (now - t).max(0.0))
    }

    /// Chunks delivered for the current prompt.
    pub fn ready(&self) -> u32 {
        self.ready
    }

    fn paused_until(&self, now: f64) -> f64 {
        self.paused_s + self.paused_since.map_or(0.0, |t| (now - t).max(0.0))
    }

    /// Playback time consumed so far (the cursor), never past what is ready.
    pub fn cursor(&self, now: f64) -> f64 {
        match self.start {
            None => 0.0,
            Some(s) => (now - s - self.paused_until(now)).clamp(0.0, f64::from(self.ready) * self.chunk_s),
        }
    }

    /// Slack `P` at `now`, seconds; negative when behind the deadlines.
    pub fn slack(&self, now: f64) -> f64 {
        match self.start {
            None => self.budget_s - (now - self.origin - self.paused_until(now)),
            Some(s) => f64::from(self.ready) * self.chunk_s - (now - s - self.paused_until(now)),
        }
    }

    /// Deadline of chunk `i` of the current prompt (0-based), once playback
    /// started; before it, the first chunk's deadline is the end of the
    /// initial budget.
    pub fn deadline(&self, i: u32, now: f64) -> f64 {
        match self.start {
            None => self.origin + self.budget_s + self.paused_until(now) + f64::from(i) * self.chunk_s,
            Some(s) => s + f64::from(i) * self.chunk_s + self.paused_until(now),
        }
    }

    /// A chunk was delivered at `now`; returns its deadline and whether it
    /// met it.
    pub fn deliver(&mut self, now: f64) -> (f64, bool) {
        if self.start.is_none() {
            self.start = Some(now);
            self.paused_s = 0.0; // deadlines count pauses since playback began
            if self.paused_since.is_some() {
                self.paused_since = Some(now);
            }
        }
        let deadline = self.deadline(self.ready, now);
        self.ready += 1;
        (deadline, now <= deadline + 1e-9)
    }

    pub fn pause(&mut self, now: f64) {
        if self.paused_since.is_none() {
            self.paused_since = Some(now);
        }
    }

    pub fn resume(&mut self, now: f64) {
        if let Some(t) = self.paused_since.take() {
            self.paused_s += (now - t).max(0.0);
        }
    }

    /// A prompt switch: buffered chunks are dropped, slack resets to the
    /// (new) initial budget.
    pub fn switch_prompt(&mut self, now: f64, budget_s: f64) {
        let paused = self.paused();
        *self = Self::new(now, self.chunk_s, budget_s);
        if paused {
            self.paused_since = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_and_tiers_on_hand_computed_cases() {
        // D = 0.75 s; T = 0.2 s; α = 2: urgent below 0.4, relaxed above 0.8.
        assert_eq!(credit(1.5, 0.1, 0.2), 1.2);
        assert_eq!(urgency(1.2, 0.2, 2.0), Urgency::Relaxed);
        assert_eq!(urgency(0.8, 0.2, 2.0), Urgency::Normal);
        assert_eq!(urgency(0.39, 0.2, 2.0), Urgency::Urgent);
        assert_eq!(urgency(-1.0, 0.2, 2.0), Urgency::Urgent);
    }

    #[test]
    fn slack_counts_down_the_budget_then_follows_playback() {
        let mut p = Playout::new(10.0, 0.75, 2.0);
        assert_eq!(p.slack(10.5), 1.5);
        assert_eq!(p.deadline(0, 10.5), 12.0);
        let (deadline, met) = p.deliver(11.0); // playback starts
        assert!(met && deadline == 11.0);
        assert_eq!(p.slack(11.0), 0.75);
        assert!((p.slack(11.5) - 0.25).abs() < 1e-9);
        p.deliver(11.6); // chunk 1 due at 11.75: met
        assert!((p.slack(11.6) - 0.9).abs() < 1e-9);
        assert_eq!(p.cursor(13.0), 1.5, "the cursor never passes what is ready");
        // Chunk 2 due at 12.5; delivered at 12.6: late.
        let (deadline, met) = p.deliver(12.6);
        assert!((deadline - 12.5).abs() < 1e-9 && !met);
    }

    #[test]
    fn a_chunk_request_that_waits_ages_against_later_ones() {
        use crate::video::ChunkOrder;
        // A new stream asks once at t = 0 with 2 s of budget; a playing
        // stream with 1.45 s of slack asks again at t = 1.8. At batch time
        // (t = 1.8) the new stream has 0.2 s of slack left: its chunk must
        // run first.
        let new = Playout::new(0.0, 0.75, 2.0);
        let mut playing = Playout::new(0.0, 0.75, 2.0);
        for t in [1.0, 1.0, 1.0] {
            playing.deliver(t); // 2.25 s ready at 1.0: 1.45 s of slack at 1.8
        }
        let next_s = 0.1;
        let asked_new = (0.0, credit(new.slack(0.0), 0.0, next_s), new.slack(0.0));
        let asked_playing = (1.8, credit(playing.slack(1.8), 0.0, next_s), playing.slack(1.8));
        assert!(asked_new.1 > asked_playing.1, "when each asked, the new stream had more credit");
        assert!(credit(new.slack(1.8), 0.0, next_s) < credit(playing.slack(1.8), 0.0, next_s));
        for order in [ChunkOrder::Credit, ChunkOrder::LeastSlack, ChunkOrder::Fifo] {
            let key = |(at, c, s): (f64, f64, f64)| order.key(at, c, s);
            assert!(key(asked_new) < key(asked_playing), "{order:?}: the waiting request runs first");
        }
    }

    #[test]
    fn pauses_shift_later_deadlines() {
        let mut p = Playout::new(0.0, 1.0, 4.0);
        p.deliver(1.0);
        p.pause(1.5);
        assert!((p.slack(3.0) - 0.5).abs() < 1e-9, "slack holds while paused");
        p.resume(3.5);
        assert!((p.deadline(1, 3.5) - 4.0).abs() < 1e-9); // 1 + 1 + 2 s paused
        assert!((p.slack(3.5) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_prompt_switch_resets_slack_to_the_initial_budget() {
        let mut p = Playout::new(0.0, 0.75, 2.0);
        for t in [0.5, 0.6, 0.7, 0.8] {
            p.deliver(t);
        }
        assert!(p.slack(1.0) > 2.0);
        p.switch_prompt(1.0, 1.2);
        assert_eq!(p.ready(), 0);
        assert!(!p.started());
        assert_eq!(p.slack(1.0), 1.2);
        assert_eq!(p.slack(1.5), 0.7);
    }
}
