//! The one clock of the gateway, the engine and the harness: every reading
//! of the time goes through here, re-exported as each crate's `clock`
//! module (`clippy.toml` forbids `Instant::now`, `Instant::elapsed` and
//! `SystemTime::now` elsewhere).
//! `now` is tokio's clock, which is the system's except in tests that
//! pause time: there the whole process sees the paused, virtual time.
#![forbid(unsafe_code)]
#![allow(clippy::disallowed_methods)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The monotonic time now.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Time since `t` (zero if `t` is later).
pub fn since(t: Instant) -> std::time::Duration {
    now().saturating_duration_since(t)
}

/// The wall-clock time now (timestamps for people and other machines,
/// never for measuring intervals).
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// The wall-clock time now as Unix seconds.
pub fn unix_s() -> f64 {
    wall().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
