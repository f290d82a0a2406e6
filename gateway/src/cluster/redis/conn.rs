//! The connection to the fleet's Redis primary: dialled on first use, at
//! most once per [`REDIAL`], re-resolved after a failover, and dialled for
//! the request path in a task of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::metrics as m;

/// The connection to the primary, made on first use (a gateway starts
/// without Redis). Direct: one `ConnectionManager`, which reconnects by
/// itself. Sentinel: dropped on a connection-level error (the primary died,
/// or was demoted and answers `READONLY`) and re-resolved through the
/// sentinels, at most once per [`REDIAL`].
pub(super) struct Conn {
    pub(super) target: fleet_redis::Target,
    pub(super) current: ArcSwapOption<ConnectionManager>,
    /// Held while dialling; the earliest next attempt.
    dial: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Whether a failed dial was logged since the last good one (the first
    /// failure is a warning with its cause, the rest debug: one a REDIAL).
    dial_failed: AtomicBool,
    /// A dial for the request path is in flight (in a task of its own, so
    /// that no caller's timeout cuts it short): at most one at a time.
    dialing: AtomicBool,
}

/// The least time between two resolutions of the primary (each asks the
/// sentinels over new connections: bounded, whatever fails).
const REDIAL: Duration = Duration::from_millis(500);

impl Conn {
    pub(super) fn new(target: fleet_redis::Target) -> Self {
        Self {
            target,
            current: ArcSwapOption::empty(),
            dial: tokio::sync::Mutex::new(None),
            dial_failed: AtomicBool::new(false),
            dialing: AtomicBool::new(false),
        }
    }

    /// Drops the connection after `e` when the primary may have moved.
    pub(super) fn invalidate(&self, e: &redis::RedisError) {
        let moved = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if moved && self.target.follows_failover() && self.current.swap(None).is_some() {
            tracing::warn!(event = "redis_primary_lost", target = ?self.target, error = %e);
        }
    }

    /// The connection to the primary, dialled if there is none (at most
    /// once per [`REDIAL`]; each step bounded by `timeout`, at least 200 ms).
    pub(super) async fn get(&self, timeout: Duration) -> redis::RedisResult<ConnectionManager> {
        if let Some(c) = self.current.load_full() {
            return Ok((*c).clone());
        }
        let mut next = self.dial.lock().await;
        if let Some(c) = self.current.load_full() {
            return Ok((*c).clone()); // another caller dialled meanwhile
        }
        let now = tokio::time::Instant::now();
        if next.is_some_and(|at| now < at) {
            return Err(redis::RedisError::from((redis::ErrorKind::Io, "redis: redialling shortly")));
        }
        *next = Some(now + REDIAL);
        let client = self.target.client(timeout.max(Duration::from_millis(200))).await.map_err(|e| {
            if let fleet_redis::Resolve::Sentinel(why) = &e {
                ::metrics::counter!(m::CLUSTER_SENTINEL_ERRORS, "reason" => why.as_str()).increment(1);
                tracing::warn!(event = "redis_sentinel_unusable", target = ?self.target, reason = why.as_str());
            }
            redis::RedisError::from(e)
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(timeout.max(Duration::from_millis(200))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let c = match client.get_connection_manager_with_config(config).await {
            Ok(c) => c,
            Err(e) => {
                // The cause an operator needs (refused, a certificate not
                // trusted, a password refused), once per outage.
                if !self.dial_failed.swap(true, Ordering::AcqRel) {
                    tracing::warn!(event = "redis_dial_failed", target = ?self.target, error = %e);
                } else {
                    tracing::debug!(event = "redis_dial_failed", target = ?self.target, error = %e);
                }
                return Err(e);
            }
        };
        self.dial_failed.store(false, Ordering::Release);
        if self.target.follows_failover() {
            tracing::info!(event = "redis_primary", target = ?self.target, addr = ?client.get_connection_info().addr());
        }
        self.current.store(Some(Arc::new(c.clone())));
        Ok(c)
    }

    pub(super) async fn get_timed(
        this: &Arc<Self>,
        timeout: Duration,
    ) -> redis::RedisResult<ConnectionManager> {
        if let Some(c) = this.current.load_full() {
            return Ok((*c).clone());
        }
        if this.dialing.swap(true, Ordering::AcqRel) {
            return Err(redis::RedisError::from((redis::ErrorKind::Io, "redis: dialling")));
        }
        /// Clears `dialing` however the dial ends.
        struct Dialing(Arc<Conn>);
        impl Drop for Dialing {
            fn drop(&mut self) {
                self.0.dialing.store(false, Ordering::Release);
            }
        }
        let flag = Dialing(Arc::clone(this));
        let dial = tokio::spawn(async move { flag.0.get(timeout).await });
        match tokio::time::timeout(timeout, dial).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(redis::RedisError::from((redis::ErrorKind::Io, "redis: dial failed"))),
            Err(_) => Err(super::timeout_err()),
        }
    }
}
