//! The client's player: plays chunks out in real time as they arrive and
//! records what a viewer would notice. Time is a parameter (seconds).
//!
//! Playback of a prompt starts when its first chunk arrives. Chunk `i` of
//! the prompt is due at `start + i × D + time paused` (its playout
//! deadline); CPR counts chunks that arrived by it. Stalls are the player's
//! view: when the next chunk is not there when the cursor needs it, the
//! picture freezes until it arrives, and later chunks are needed that much
//! later. A prompt switch drops what was buffered and starts over.

/// One stream's player.
#[derive(Debug, Clone, Default)]
pub struct Player {
    chunk_s: f64,
    start: Option<f64>,
    /// Chunks of the current prompt that arrived.
    got: u32,
    paused_s: f64,
    paused_since: Option<f64>,
    /// Frozen time so far (shifts when the player needs later chunks).
    stalled_s: f64,
    pub on_time: u64,
    pub chunks: u64,
    pub stalls: u64,
    pub stall_s: f64,
    /// Lateness of each chunk against its deadline (negative: early), s.
    pub lateness: Vec<f64>,
}

impl Player {
    pub fn new(chunk_s: f64) -> Self {
        Self { chunk_s, ..Self::default() }
    }

    fn paused_until(&self, now: f64) -> f64 {
        self.paused_s + self.paused_since.map_or(0.0, |t| (now - t).max(0.0))
    }

    /// A chunk of the current prompt arrived at `now`.
    pub fn arrive(&mut self, now: f64) {
        let start = *self.start.get_or_insert(now);
        let i = f64::from(self.got);
        let deadline = start + i * self.chunk_s + self.paused_until(now);
        let needed = deadline + self.stalled_s;
        if now > needed + 1e-9 {
            self.stalls += 1;
            self.stall_s += now - needed;
            self.stalled_s += now - needed;
        }
        self.lateness.push(now - deadline);
        if now <= deadline + 1e-9 {
            self.on_time += 1;
        }
        self.got += 1;
        self.chunks += 1;
    }

    pub fn pause(&mut self, now: f64) {
        if self.paused_since.is_none() {
            self.paused_since = Some(now);
        }
    }

    pub fn resume(&mut self, now: f64) {
        if let Some(t) = self.paused_since.take() {
            self.paused_s += now - t;
        }
    }

    /// A prompt switch at `now`: the buffer is dropped, playback restarts
    /// with the new prompt's first chunk.
    pub fn switch(&mut self, now: f64) {
        let paused = self.paused_since.is_some();
        self.start = None;
        self.got = 0;
        self.paused_s = 0.0;
        self.stalled_s = 0.0;
        self.paused_since = paused.then_some(now);
    }

    pub fn cpr(&self) -> f64 {
        if self.chunks == 0 {
            1.0
        } else {
            self.on_time as f64 / self.chunks as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_time_chunks_and_a_stall_that_shifts_the_rest() {
        let mut p = Player::new(1.0);
        p.arrive(10.0); // playback starts
        p.arrive(10.5); // due 11
        p.arrive(12.5); // due 12: late 0.5, the picture froze 0.5 s
        p.arrive(13.2); // due 13 (late 0.2) but needed at 13.5: no new stall
        assert_eq!(p.chunks, 4);
        assert_eq!(p.on_time, 2);
        assert_eq!(p.stalls, 1);
        assert!((p.stall_s - 0.5).abs() < 1e-9);
        assert!((p.cpr() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn pauses_shift_deadlines_and_switches_restart() {
        let mut p = Player::new(1.0);
        p.arrive(0.0);
        p.pause(0.5);
        p.resume(2.5);
        p.arrive(2.9); // due 1 + 2 s paused = 3
        assert_eq!(p.on_time, 2);
        p.switch(3.0);
        p.arrive(4.0); // the new prompt's first chunk starts playback again
        p.arrive(4.9);
        assert_eq!(p.on_time, 4);
        assert_eq!(p.stalls, 0);
    }
}
