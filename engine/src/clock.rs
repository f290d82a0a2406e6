//! This crate's clock: the workspace's one clock (the `clock` crate), so
//! that a test pausing tokio's time pauses every reading of it.

pub use ::clock::{now, since, unix_s, wall};

use std::time::Duration;

/// How late a timer may wake after a device step ended and still count as
/// running the next step right behind it (tokio fires on whole
/// milliseconds): that lateness is timer jitter, not an idle device.
pub const TIMER_SLACK: Duration = Duration::from_millis(2);

/// When a device step that is ready at `now` starts: where the previous
/// one ended (`prev_end`) if `now` is within [`TIMER_SLACK`] of it, so the
/// timer's lateness does not add up over back-to-back steps; else `now`.
pub fn step_start(prev_end: tokio::time::Instant, now: tokio::time::Instant) -> tokio::time::Instant {
    if now.saturating_duration_since(prev_end) <= TIMER_SLACK {
        prev_end
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_step_ready_within_the_timer_slack_starts_where_the_previous_one_ended() {
        let end = tokio::time::Instant::now();
        let late = |ms| end + Duration::from_micros(ms);
        assert_eq!(step_start(end, late(1_300)), end, "timer lateness is not device time");
        assert_eq!(step_start(end, late(2_000)), end);
        assert_eq!(step_start(end, late(2_001)), late(2_001), "past the slack the device sat idle");
        assert_eq!(step_start(late(500), end), late(500), "a step cannot start before the last ended");
    }
}
