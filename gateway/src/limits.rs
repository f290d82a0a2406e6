//! The gateway's resource bounds (`[limits]` in the gateway config): what a
//! client, a connection, a response stream or an engine may cost at most,
//! and how long each may take. docs/operations.md ("Limits") says what
//! each does, how to tune it and what to watch.

use std::time::Duration;

use serde::Deserialize;

use crate::outbox::Stall;

/// Every bound of the gateway process. Zero is never a valid value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Open connections on the public listener; past it new connections
    /// are closed at once (`gateway_connections_refused_total`).
    pub max_connections: usize,
    /// Open connections on the admin listener.
    pub max_admin_connections: usize,
    /// Concurrent HTTP/2 streams per client connection (SETTINGS).
    pub max_streams_per_connection: u32,
    /// New HTTP/2 streams one client connection may open per second (a
    /// burst of `max_streams_per_connection`); past it the connection is
    /// closed (`gateway_connections_closed_total{why="stream_rate"}`), as is
    /// one that resets more than half of its last 100 streams before their
    /// answer (`why="rapid_reset"`).
    pub max_new_streams_per_s: u32,
    /// TLS handshake, and (HTTP/1.1) the request head, must arrive within this.
    pub header_read_timeout_ms: u64,
    /// A connection with no request open for this long is closed (HTTP/2:
    /// GOAWAY, then close).
    pub idle_timeout_ms: u64,
    /// A request body must arrive whole within this (408 otherwise).
    pub body_read_timeout_ms: u64,
    /// HTTP/2: before an answer sent without reading the request body (401,
    /// 404, 413, ...), the body is read and discarded up to this many bytes
    /// and ...
    pub drain_body_bytes: usize,
    /// ... for at most this long; past either, or when the body is declared
    /// larger, the answer goes out and the stream is reset (NO_ERROR).
    pub drain_body_timeout_ms: u64,
    /// Bytes of a streamed response buffered for a client that is not
    /// reading (per stream, plus one event).
    pub stream_buffer_bytes: usize,
    /// A client whose buffer stays full this long without taking
    /// `min_send_rate_bytes_per_s` is reset and everything it held released.
    pub write_stall_timeout_ms: u64,
    pub min_send_rate_bytes_per_s: u64,
    /// The longest silence allowed between two events of an engine stream
    /// after its first token; the floor when the engine reports its step
    /// time (then 50 steps are allowed if that is longer).
    pub engine_event_timeout_ms: u64,
    /// HTTP/2 PINGs on gateway->engine connections: the interval, and how
    /// long an answer may take before the connection (and its streams) is
    /// failed and the engine leaves rotation until a probe answers.
    pub engine_keepalive_interval_ms: u64,
    pub engine_keepalive_timeout_ms: u64,
    /// HTTP/2 connections to each engine (streams are spread over them),
    /// per connection worker.
    pub engine_connections: usize,
    /// Connection workers of the public listener: threads that each run a
    /// single-threaded runtime (`gateway/src/workers.rs`). Absent: one per
    /// core.
    pub worker_threads: Option<usize>,
    /// Bytes of unread events a video stream's feed holds; past it the
    /// stream stops generating (and is suspended) until the reader catches up.
    pub video_feed_buffer_bytes: usize,
    /// On SIGTERM (an orchestrator's stop), `/readyz` answers 503
    /// `draining` for this long while the listeners still accept, so load
    /// balancers stop sending before connections are refused; then GOAWAY
    /// and the drain. 0: stop accepting at once. SIGINT (an interactive
    /// stop) never waits.
    pub shutdown_grace_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 16_384,
            max_admin_connections: 64,
            max_streams_per_connection: 1024,
            max_new_streams_per_s: 10_000,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            body_read_timeout_ms: 30_000,
            drain_body_bytes: 4 << 20,
            drain_body_timeout_ms: 2_000,
            stream_buffer_bytes: 64 << 10,
            write_stall_timeout_ms: 10_000,
            min_send_rate_bytes_per_s: 64,
            engine_event_timeout_ms: 30_000,
            engine_keepalive_interval_ms: 2_000,
            engine_keepalive_timeout_ms: 3_000,
            engine_connections: 2,
            worker_threads: None,
            video_feed_buffer_bytes: 4 << 20,
            shutdown_grace_ms: 2_000,
        }
    }
}

/// Steps of silence allowed when the engine reports its step time.
const EVENT_TIMEOUT_STEPS: f64 = 50.0;

/// Most connection workers.
const MAX_WORKERS: usize = 256;

impl Limits {
    /// Connection workers to start: `worker_threads`, else one per core.
    pub fn workers(&self) -> usize {
        self.worker_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(1, MAX_WORKERS)
    }

    /// Checks that no bound is zero; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        let values = [
            ("max_connections", self.max_connections as u64),
            ("max_admin_connections", self.max_admin_connections as u64),
            ("max_streams_per_connection", u64::from(self.max_streams_per_connection)),
            ("max_new_streams_per_s", u64::from(self.max_new_streams_per_s)),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("drain_body_bytes", self.drain_body_bytes as u64),
            ("drain_body_timeout_ms", self.drain_body_timeout_ms),
            ("stream_buffer_bytes", self.stream_buffer_bytes as u64),
            ("write_stall_timeout_ms", self.write_stall_timeout_ms),
            ("engine_event_timeout_ms", self.engine_event_timeout_ms),
            ("engine_keepalive_interval_ms", self.engine_keepalive_interval_ms),
            ("engine_keepalive_timeout_ms", self.engine_keepalive_timeout_ms),
            ("engine_connections", self.engine_connections as u64),
            ("video_feed_buffer_bytes", self.video_feed_buffer_bytes as u64),
        ];
        match values.iter().find(|(_, v)| *v == 0) {
            Some((key, _)) => Err(format!("limits.{key} must be greater than 0")),
            None if self.worker_threads.is_some_and(|n| !(1..=MAX_WORKERS).contains(&n)) => {
                Err(format!("limits.worker_threads must be 1 to {MAX_WORKERS}"))
            }
            None if self.engine_connections > 64 => {
                Err("limits.engine_connections must be at most 64".into())
            }
            None if self.shutdown_grace_ms > 600_000 => {
                Err("limits.shutdown_grace_ms must be at most 600000".into())
            }
            None => Ok(()),
        }
    }

    /// The stall rule for streamed responses.
    pub fn stall(&self) -> Stall {
        Stall {
            timeout: Duration::from_millis(self.write_stall_timeout_ms),
            min_rate: self.min_send_rate_bytes_per_s,
        }
    }

    /// The longest silence allowed mid-stream from an engine whose last
    /// reported decode step took `step_ms` (if it reported one).
    pub fn event_timeout(&self, step_ms: Option<f64>) -> Duration {
        let floor = Duration::from_millis(self.engine_event_timeout_ms);
        let steps = step_ms
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(Duration::ZERO, |s| Duration::from_secs_f64((s * EVENT_TIMEOUT_STEPS / 1e3).min(3600.0)));
        floor.max(steps)
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    pub fn drain_body_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_body_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_bound_is_refused_with_its_key() {
        let l = Limits { write_stall_timeout_ms: 0, ..Limits::default() };
        assert_eq!(l.validate().unwrap_err(), "limits.write_stall_timeout_ms must be greater than 0");
        assert!(Limits::default().validate().is_ok());
        let l = Limits { worker_threads: Some(0), ..Limits::default() };
        assert_eq!(l.validate().unwrap_err(), "limits.worker_threads must be 1 to 256");
        assert_eq!(Limits { worker_threads: Some(3), ..Limits::default() }.workers(), 3);
    }

    #[test]
    fn the_event_timeout_grows_with_a_slow_engine_step_and_never_below_the_floor() {
        let l = Limits { engine_event_timeout_ms: 5_000, ..Limits::default() };
        assert_eq!(l.event_timeout(None), Duration::from_secs(5));
        assert_eq!(l.event_timeout(Some(20.0)), Duration::from_secs(5));
        assert_eq!(l.event_timeout(Some(500.0)), Duration::from_secs(25));
        assert_eq!(l.event_timeout(Some(f64::NAN)), Duration::from_secs(5));
    }
}
