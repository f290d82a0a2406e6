//! Abusive HTTP/2 peers (the rapid-reset shape of CVE-2023-44487): a
//! connection that opens streams and resets them before their answer, or
//! opens streams faster than any client needs, is closed. The gateway's
//! public and admin listeners and the engine's internal listener each keep
//! one [`Watch`] per connection.
//!
//! Per connection: the outcome of its last [`WINDOW`] streams (finished, or
//! reset by the peer prematurely: within the watch's `premature` window of
//! opening, before its answer ended: Envoy's "premature reset"), and a
//! token bucket of new streams (`rate` per second, a burst of `burst`).
//! More than half of a full window reset, or an empty bucket, marks the
//! connection abusive; the listener then closes it at once. A peer that
//! cancels a few requests, or all of a short burst, is never closed: the
//! window must be full first.
//!
//! What "finished" means is the listener's: the gateway marks a stream
//! finished when its answer went out whole and counts a reset within
//! [`PREMATURE`] of opening; the engine, whose peer is a gateway relaying
//! its clients' cancellations, marks a stream finished once its response
//! head is ready and counts every reset before that (an attacker resets
//! before any answer; a gateway cancels answers under way).
//!
//! The work of a stream reset before dispatch is dropped: hyper drops the
//! handler's future when the peer resets the stream, so admission stops at
//! its next await; the listeners' handlers first wait until the bytes that
//! could carry the stream's reset are read ([`fair`]), then yield once.
//! [`Fair`] also bounds what one connection's task reads in a turn.

pub mod fair;

pub use fair::{Fair, Reads};

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Streams whose outcomes are kept per connection.
pub const WINDOW: usize = 100;
/// A stream reset this soon after it opened, before its answer ended, is
/// a premature reset; one that lived longer was a client changing its mind.
pub const PREMATURE: std::time::Duration = std::time::Duration::from_secs(1);

/// Premature resets among the last [`WINDOW`] streams that make a
/// connection suspect ([`Watch::is_suspect`]).
pub const SUSPECT_RESETS: usize = WINDOW / 4;
/// How long the engine's [`settle`] holds a suspect connection's new
/// stream: a reset its peer wrote after the request, in a later segment,
/// arrives meanwhile and the stream is dropped before any work.
pub const SUSPECT_HOLD: std::time::Duration = std::time::Duration::from_millis(10);

/// Why a connection was closed as abusive (the metric's `why`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abuse {
    /// More than half of its last [`WINDOW`] streams reset prematurely.
    Resets,
    /// New streams faster than `max_new_streams_per_s`.
    StreamRate,
    /// Closed by the HTTP/2 library's own protections (GOAWAY
    /// ENHANCE_YOUR_CALM: too many streams reset before the server
    /// accepted them, too many locally reset streams, a flood of frames);
    /// found in the connection's error by [`h2_calm`].
    H2Calm,
}

impl Abuse {
    pub fn label(self) -> &'static str {
        match self {
            Abuse::Resets => "rapid_reset",
            Abuse::StreamRate => "stream_rate",
            Abuse::H2Calm => "h2_calm",
        }
    }
}

#[derive(Debug)]
struct Window {
    /// true: reset before its answer.
    outcomes: VecDeque<bool>,
    resets: usize,
    /// Stream tokens left, and when they were last refilled.
    tokens: f64,
    refilled: Instant,
}

/// One connection's stream outcomes and stream rate.
#[derive(Debug)]
pub struct Watch {
    window: Mutex<Window>,
    rate: f64,
    burst: f64,
    /// A stream reset sooner than this after it opened is premature.
    premature: std::time::Duration,
    /// Set once, when the connection is found abusive.
    why: OnceLock<Abuse>,
    notify: Notify,
}

impl Watch {
    /// `rate`: new streams per second (0: unbounded); `burst`: the bucket.
    /// A stream reset within [`PREMATURE`] of opening is premature.
    pub fn new(rate: f64, burst: f64) -> Arc<Self> {
        Self::with_premature(rate, burst, PREMATURE)
    }

    /// [`Watch::new`] with the premature window: a stream reset before
    /// [`Stream::finished`] and sooner than `premature` after it opened
    /// counts as a premature reset (`Duration::MAX`: every reset before
    /// finished does).
    pub fn with_premature(rate: f64, burst: f64, premature: std::time::Duration) -> Arc<Self> {
        Arc::new(Self {
            window: Mutex::new(Window {
                outcomes: VecDeque::with_capacity(WINDOW),
                resets: 0,
                tokens: burst,
                refilled: Instant::now(),
            }),
            rate,
            burst: burst.max(1.0),
            premature,
            why: OnceLock::new(),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new stream: takes a token; false (and the connection marked) when
    /// the bucket is empty.
    pub fn open(self: &Arc<Self>) -> Stream {
        if self.rate > 0.0 {
            let mut w = self.lock();
            let now = Instant::now();
            w.tokens = (w.tokens + now.duration_since(w.refilled).as_secs_f64() * self.rate).min(self.burst);
            w.refilled = now;
            if w.tokens < 1.0 {
                drop(w);
                self.trip(Abuse::StreamRate);
            } else {
                w.tokens -= 1.0;
            }
        }
        Stream { watch: Arc::clone(self), opened: Instant::now(), done: false }
    }

    fn record(&self, reset: bool) {
        let mut w = self.lock();
        if w.outcomes.len() == WINDOW && w.outcomes.pop_front() == Some(true) {
            w.resets -= 1;
        }
        w.outcomes.push_back(reset);
        w.resets += usize::from(reset);
        let abusive = w.outcomes.len() == WINDOW && w.resets * 2 > WINDOW;
        drop(w);
        if abusive {
            self.trip(Abuse::Resets);
        }
    }

    fn trip(&self, why: Abuse) {
        if self.why.set(why).is_ok() {
            self.notify.notify_one();
        }
    }

    /// Whether at least [`SUSPECT_RESETS`] of its last [`WINDOW`] streams
    /// were reset prematurely: on its way to being closed, or a client
    /// cancelling a lot. The engine holds its new streams a moment
    /// ([`settle`]).
    pub fn is_suspect(&self) -> bool {
        self.lock().resets >= SUSPECT_RESETS
    }

    pub fn is_tripped(&self) -> bool {
        self.why.get().is_some()
    }

    /// Resolves once the connection is marked abusive, with why.
    pub async fn tripped(&self) -> Abuse {
        loop {
            let notified = self.notify.notified();
            if let Some(&why) = self.why.get() {
                return why;
            }
            notified.await;
        }
    }
}

/// What a listener's handler awaits before any work on a new stream, so
/// that a stream its peer reset right after the request (rapid reset) is
/// dropped first: hyper looks for a RST_STREAM each time the handler is
/// pending. With `read` (the connection's [`Reads`] behind a [`Fair`]
/// socket and its [`Reads::mark`] when the stream was accepted; HTTP/2
/// only), first waits until the bytes that could carry the reset are read
/// (bounded by [`fair::CATCH_UP_MAX`]). Then holds a suspect connection's
/// stream for `suspect_hold` (a reset its peer wrote after a pause arrives
/// meanwhile) and yields once. An honest connection's stream only yields.
///
/// The engine holds ([`SUSPECT_HOLD`]): a stream that reaches its
/// scheduler costs accelerator time. The gateway does not: held streams
/// measured worse for an honest tenant beside the attack (the honest p99
/// at 1.36x of unloaded at the median of 10 runs against 1.23x without),
/// and no attack stream reached admission either way (docs/reliability.md).
pub async fn settle(watch: &Watch, read: Option<(&Reads, u64)>, suspect_hold: std::time::Duration) {
    if let Some((reads, mark)) = read.filter(|(r, m)| !r.is_caught_up(*m)) {
        let _ = tokio::time::timeout(fair::CATCH_UP_MAX, reads.caught_up(mark)).await;
    }
    if !suspect_hold.is_zero() && watch.is_suspect() {
        tokio::time::sleep(suspect_hold).await;
    }
    tokio::task::yield_now().await;
}

/// Whether a connection ended because the HTTP/2 library sent GOAWAY with
/// ENHANCE_YOUR_CALM on its own (its bounds on streams reset before they
/// were accepted, on locally reset streams, on frame floods): the same
/// abuse as [`Abuse::Resets`], caught one layer down before the handler saw
/// the streams. Walks the error's sources for the `h2` error.
pub fn h2_calm(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(err);
    while let Some(e) = at {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.is_library() && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        at = e.source();
    }
    false
}

/// One stream's outcome: dropped before [`Stream::finished`] within the
/// watch's premature window of opening, it counts as a premature reset.
#[derive(Debug)]
pub struct Stream {
    watch: Arc<Watch>,
    opened: Instant,
    done: bool,
}

impl Stream {
    /// Its answer went out whole.
    pub fn finished(&mut self) {
        if !self.done {
            self.done = true;
            self.watch.record(false);
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.done {
            self.watch.record(self.opened.elapsed() < self.watch.premature);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn more_than_half_of_a_full_window_reset_trips_and_a_few_cancels_do_not() {
        let w = Watch::new(0.0, 1.0);
        // Every stream of a short burst cancelled: the window is not full.
        for _ in 0..WINDOW - 1 {
            drop(w.open());
        }
        assert!(!w.is_tripped());
        // A full window with exactly half reset: still honest.
        let w = Watch::new(0.0, 1.0);
        for i in 0..WINDOW {
            let mut s = w.open();
            if i % 2 == 0 {
                s.finished();
            }
        }
        assert!(!w.is_tripped(), "half is not more than half");
        drop(w.open()); // the oldest (finished) leaves, a reset comes in
        assert!(w.is_tripped());
        assert_eq!(w.tripped().await, Abuse::Resets);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_cancelled_after_a_second_is_not_premature() {
        let w = Watch::new(0.0, 1.0);
        for _ in 0..WINDOW {
            let s = w.open();
            tokio::time::advance(PREMATURE).await;
            drop(s);
        }
        assert!(!w.is_tripped());
    }

    #[tokio::test(start_paused = true)]
    async fn settle_waits_at_most_its_bounds() {
        let honest = Watch::new(0.0, 1.0);
        // A connection whose reading is stuck (its peer reads none of our
        // writes, hyper reads no more frames): the stream goes on after
        // CATCH_UP_MAX, not never.
        let stuck = Reads::new();
        let t = Instant::now();
        settle(&honest, Some((&stuck, stuck.mark())), SUSPECT_HOLD).await;
        assert_eq!(t.elapsed(), fair::CATCH_UP_MAX);
        // Without a read to wait for, an honest connection's stream only
        // yields, held or not.
        let t = Instant::now();
        settle(&honest, None, SUSPECT_HOLD).await;
        assert_eq!(t.elapsed(), std::time::Duration::ZERO);
        // A suspect one is held exactly the hold where the listener asks
        // for it, and not at all where it does not.
        let suspect = Watch::new(0.0, 1.0);
        for _ in 0..SUSPECT_RESETS {
            drop(suspect.open());
        }
        assert!(suspect.is_suspect() && !suspect.is_tripped());
        let t = Instant::now();
        settle(&suspect, None, SUSPECT_HOLD).await;
        assert_eq!(t.elapsed(), SUSPECT_HOLD);
        let t = Instant::now();
        settle(&suspect, None, std::time::Duration::ZERO).await;
        assert_eq!(t.elapsed(), std::time::Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_stream_rate_is_a_token_bucket() {
        let w = Watch::new(100.0, 10.0);
        for _ in 0..10 {
            w.open().finished();
        }
        assert!(!w.is_tripped(), "the burst");
        tokio::time::advance(std::time::Duration::from_millis(100)).await; // 10 more tokens
        for _ in 0..10 {
            w.open().finished();
        }
        assert!(!w.is_tripped());
        w.open().finished();
        assert_eq!(w.tripped().await, Abuse::StreamRate);
    }
}
