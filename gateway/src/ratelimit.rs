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

use std::sync::{Arc, OnceLock};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::wire::Dialect;

/// A caller's standing against one per-minute limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub limit: u32,
    pub used: u64,
}

impl Window {
    fn remaining(&self) -> u64 {
        u64::from(self.limit).saturating_sub(self.used)
    }
}

/// The caller's standing: its tier's request and token windows (those it
/// has), and the seconds until they reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
    pub reset_s: u32,
}

/// Where the router leaves the standing for the policy layer (a request
/// extension; set at most once).
#[derive(Debug, Default, Clone)]
pub(crate) struct RateSlot(Arc<OnceLock<Standing>>);

impl RateSlot {
    pub fn set(&self, standing: Standing) {
        let _ = self.0.set(standing);
    }

    /// Writes the standing's headers in `dialect`'s names.
    pub fn write(&self, h: &mut HeaderMap, dialect: Dialect) {
        let Some(s) = self.0.get() else { return };
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
                // OpenAI: a duration ("17s"); Anthropic: when, RFC 3339.
                Dialect::OpenAi => format!("{}s", s.reset_s),
                Dialect::Anthropic => crate::audit::rfc3339(
                    crate::clock::wall() + std::time::Duration::from_secs(u64::from(s.reset_s)),
                ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_name_each_limit_in_each_dialect() {
        let slot = RateSlot::default();
        let mut h = HeaderMap::new();
        slot.write(&mut h, Dialect::OpenAi);
        assert!(h.is_empty(), "nothing recorded: no headers");
        slot.set(Standing {
            requests: Some(Window { limit: 60, used: 5 }),
            tokens: Some(Window { limit: 1000, used: 1200 }),
            reset_s: 17,
        });
        slot.write(&mut h, Dialect::OpenAi);
        assert_eq!(h["x-ratelimit-limit-requests"], "60");
        assert_eq!(h["x-ratelimit-remaining-requests"], "55");
        assert_eq!(h["x-ratelimit-reset-requests"], "17s");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "0", "never negative");
        let mut a = HeaderMap::new();
        slot.write(&mut a, Dialect::Anthropic);
        assert_eq!(a["anthropic-ratelimit-requests-remaining"], "55");
        assert!(a["anthropic-ratelimit-tokens-reset"].to_str().unwrap().ends_with('Z'));
        assert!(!a.contains_key("x-ratelimit-limit-requests"));
    }
}
