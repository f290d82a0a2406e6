//! Tenant limits kept in this process: the single-gateway default and the
//! fallback
//! while Redis is unreachable (everything, at a fraction of the global
//! limits). Windows are fixed wall-clock minutes, as in Redis.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{retry_after_window, Denied, Grant, Limits};

#[derive(Debug, Default)]
struct Tenant {
    open: u32,
    window: u64,
    requests: u32,
    tokens: u64,
}

/// Per-tenant counters.
#[derive(Debug, Default)]
pub struct Local {
    tenants: Mutex<HashMap<String, Tenant>>,
}

impl Local {
    /// Checks and takes: concurrency (when set), then this minute's
    /// requests and tokens.
    pub fn acquire(&self, tenant: &str, limits: Limits, tokens: u64, now_ms: u64) -> Result<Grant, Denied> {
        let mut all = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let t = all.entry(tenant.to_string()).or_default();
        let window = now_ms / 60_000;
        if t.window != window {
            (t.window, t.requests, t.tokens) = (window, 0, 0);
        }
        if let Some(limit) = limits.max_concurrency.filter(|l| t.open >= *l) {
            return Err(Denied::Concurrency { limit });
        }
        if let Some(limit) = limits.requests_per_minute.filter(|l| t.requests >= *l) {
            return Err(Denied::Requests { limit, retry_after_s: retry_after_window(now_ms) });
        }
        if let Some(limit) = limits.tokens_per_minute.filter(|l| t.tokens + tokens > u64::from(*l)) {
            return Err(Denied::Tokens { limit, retry_after_s: retry_after_window(now_ms) });
        }
        t.requests += 1;
        t.tokens += tokens;
        let counted = limits.max_concurrency.is_some();
        if counted {
            t.open += 1;
        }
        let used = super::Used { requests: u64::from(t.requests), tokens: t.tokens };
        Ok(Grant { tenant: tenant.to_string(), used, lease: None, local: counted })
    }

    pub fn release(&self, tenant: &str) {
        let mut all = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = all.get_mut(tenant) {
            t.open = t.open.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_concurrency_hold_and_reset() {
        let l = Local::default();
        let limits =
            Limits { max_concurrency: Some(2), requests_per_minute: Some(3), tokens_per_minute: Some(100) };
        let t0 = 120_000; // the start of a minute
        let a = l.acquire("t", limits, 10, t0).unwrap();
        let _b = l.acquire("t", limits, 10, t0 + 1).unwrap();
        assert_eq!(l.acquire("t", limits, 10, t0 + 2).unwrap_err(), Denied::Concurrency { limit: 2 });
        l.release(&a.tenant);
        let _c = l.acquire("t", limits, 10, t0 + 3).unwrap();
        l.release("t");
        assert_eq!(
            l.acquire("t", limits, 10, t0 + 4).unwrap_err(),
            Denied::Requests { limit: 3, retry_after_s: 60 }
        );
        // The next minute starts over; tokens count too.
        assert!(l.acquire("t", limits, 90, t0 + 60_000).is_ok());
        l.release("t");
        assert!(matches!(l.acquire("t", limits, 20, t0 + 60_001), Err(Denied::Tokens { limit: 100, .. })));
        // Other tenants are separate.
        assert!(l.acquire("u", limits, 10, t0).is_ok());
    }
}
