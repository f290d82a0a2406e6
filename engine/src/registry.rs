//! Self-registration in a fleet's Redis (`engine --redis URL`): the engine
//! writes `slo:engine:{id}` = its base URL with a 10 s TTL every 3 s and
//! adds its id to `slo:engines`, so every gateway of the fleet discovers it
//! and forgets it within 10 s of its death. Redis being away only delays
//! registration; serving never depends on it. With a Sentinel URL
//! (`redis+sentinel://…`, the fleet-redis crate) the primary is resolved
//! again after every failed write, so registration follows a failover.

use std::time::Duration;

/// Registers until the process ends; spawn it.
pub async fn register(url: String, id: String, base: String) {
    let target = match fleet_redis::Target::parse(&url) {
        Ok(t) => t,
        // The error never repeats the URL (it may carry a password).
        Err(e) => return tracing::error!(event = "redis_url_invalid", error = %e),
    };
    let mut conn = None;
    loop {
        if conn.is_none() {
            conn = match target.client(Duration::from_secs(1)).await {
                Ok(client) => {
                    tokio::time::timeout(Duration::from_secs(1), client.get_multiplexed_async_connection())
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
                Err(e) => {
                    tracing::debug!(event = "engine_register_unresolved", engine = %id, error = %e);
                    None
                }
            };
        }
        if let Some(c) = conn.as_mut() {
            let mut pipe = redis::pipe();
            pipe.set_ex(format!("slo:engine:{id}"), &base, 10).ignore().sadd("slo:engines", &id).ignore();
            let write = pipe.query_async::<()>(c);
            match tokio::time::timeout(Duration::from_secs(1), write).await {
                Ok(Ok(())) => {}
                _ => {
                    tracing::debug!(event = "engine_register_failed", engine = %id);
                    conn = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}
