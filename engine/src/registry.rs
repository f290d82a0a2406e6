//! Self-registration in a fleet's Redis (`engine --redis URL`): the engine
//! writes `slo:engine:{id}` = its base URL with a 10 s TTL every 3 s and
//! adds its id to `slo:engines`, so every gateway of the fleet discovers it
//! and forgets it within 10 s of its death. Redis being away only delays
//! registration; serving never depends on it.

use std::time::Duration;

/// Registers until the process ends; spawn it.
pub async fn register(url: String, id: String, base: String) {
    let client = match redis::Client::open(url.as_str()) {
        Ok(c) => c,
        // The URL may carry a password: it is not logged.
        Err(e) => return tracing::error!(event = "redis_url_invalid", error = %e),
    };
    let mut conn = None;
    loop {
        if conn.is_none() {
            conn = tokio::time::timeout(Duration::from_secs(1), client.get_multiplexed_async_connection())
                .await
                .ok()
                .and_then(Result::ok);
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
