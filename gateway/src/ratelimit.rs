//! The rate-limit headers clients and SDKs read: OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` on every answer
//! whose caller's tier has a per-minute limit, Anthropic's
//! `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}` on the
//! Messages API's answers.
//!
//! The router records the caller's standing once its tenant limits are
//! counted (granted or refused) into a [`RateSlot`] the policy layer put
//! in the request; the policy layer writes the headers on the answer,
//! error answers included.

use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::wire::Dialect;

/// A caller's standing against one limit: its size, what is used of it,
/// and the seconds until it resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub limit: u64,
    pub used: u64,
    pub reset_s: u64,
}

impl Window {
    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// The caller's standing: the requests trio (the tier's
/// `requests_per_minute`) and the tokens trio (the tier's
/// `tokens_per_minute`, else the tightest token budget of the tenant or
/// the key, whose reset is then a day or a month away).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Standing {
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
}

/// Where the router leaves the standing for the policy layer (a request
/// extension).
#[derive(Debug, Default, Clone)]
pub(crate) struct RateSlot(Arc<Mutex<Standing>>);

impl RateSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Standing> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tier's per-minute windows (they win over a budget's tokens).
    pub fn minute(&self, requests: Option<Window>, tokens: Option<Window>) {
        let mut s = self.lock();
        s.requests = requests.or(s.requests);
        s.tokens = tokens.or(s.tokens);
    }

    /// A token budget, when no per-minute token window is set.
    pub fn budget(&self, tokens: Window) {
        self.lock().tokens.get_or_insert(tokens);
    }

    /// Writes the standing's headers in `dialect`'s names.
    pub fn write(&self, h: &mut HeaderMap, dialect: Dialect) {
        let s = *self.lock();
        for (what, window) in [("requests", s.requests), ("tokens", s.tokens)] {
            let Some(w) = window else { continue };
            let names = match dialect {
                Dialect::OpenAi => [
                    format!("x-ratelimit-limit-{what}"),
                    format!("x-ratelimit-remaining-{what}"),
                    format!("x-ratelimit-reset-{what}"),
                ],
                Dialect::Anthropic => [
                    format!("anthropic-ratelimit-{what}-limit"),
                    format!("anthropic-ratelimit-{what}-remaining"),
                    format!("anthropic-ratelimit-{what}-reset"),
                ],
            };
            let reset = match dialect {
                // OpenAI: a duration ("17s", "6h0m0s"); Anthropic: when, RFC 3339.
                Dialect::OpenAi => duration(w.reset_s),
                Dialect::Anthropic => {
                    crate::audit::rfc3339(crate::clock::wall() + std::time::Duration::from_secs(w.reset_s))
                }
            };
            let values = [w.limit.to_string(), w.remaining().to_string(), reset];
            for (name, value) in names.into_iter().zip(values) {
                if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                    h.insert(n, v);
                }
            }
        }
    }
}

/// Seconds as OpenAI writes a reset: `17s`, `6m0s`, `2h5m0s`.
fn duration(s: u64) -> String {
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_name_each_limit_in_each_dialect() {
        let slot = RateSlot::default();
        let mut h = HeaderMap::new();
        slot.write(&mut h, Dialect::OpenAi);
        assert!(h.is_empty(), "nothing recorded: no headers");
        slot.budget(Window { limit: 1_000_000, used: 10, reset_s: 86_000 });
        slot.minute(
            Some(Window { limit: 60, used: 5, reset_s: 17 }),
            Some(Window { limit: 1000, used: 1200, reset_s: 17 }),
        );
        slot.write(&mut h, Dialect::OpenAi);
        assert_eq!(h["x-ratelimit-limit-requests"], "60");
        assert_eq!(h["x-ratelimit-remaining-requests"], "55");
        assert_eq!(h["x-ratelimit-reset-requests"], "17s");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "0", "never negative; the minute's window wins");
        let only_budget = RateSlot::default();
        only_budget.budget(Window { limit: 500, used: 120, reset_s: 7_384 });
        let mut b = HeaderMap::new();
        only_budget.write(&mut b, Dialect::OpenAi);
        assert_eq!(
            (&b["x-ratelimit-limit-tokens"], &b["x-ratelimit-remaining-tokens"]),
            (&"500".parse::<HeaderValue>().unwrap(), &"380".parse::<HeaderValue>().unwrap())
        );
        assert_eq!(b["x-ratelimit-reset-tokens"], "2h3m4s");
        assert!(!b.contains_key("x-ratelimit-limit-requests"));
        let mut a = HeaderMap::new();
        slot.write(&mut a, Dialect::Anthropic);
        assert_eq!(a["anthropic-ratelimit-requests-remaining"], "55");
        assert!(a["anthropic-ratelimit-tokens-reset"].to_str().unwrap().ends_with('Z'));
        assert!(!a.contains_key("x-ratelimit-limit-requests"));
    }
}
