//! What the admission tests share: the shipped policy, the bundled A100
//! profile, and a fleet of candidates on it.

use super::controller::Request;
use super::{Candidate, Controller};
use crate::{LatencyProfile, PolicyDocument};

pub fn policy() -> PolicyDocument {
    PolicyDocument::parse("default.toml", include_str!("../../default.toml")).unwrap()
}

pub fn profile() -> LatencyProfile {
    LatencyProfile::parse("p.toml", include_str!("../../profiles/emulated-a100-8b.toml")).unwrap()
}

/// `n` engines of the profile's class with `slots` decode slots, `active`
/// of them busy (200 expected output tokens each).
pub fn engines(ctl: &mut Controller, n: usize, slots: u32, active: u32) -> Vec<Candidate> {
    let class = ctl.class_of(&profile());
    (0..n)
        .map(|idx| Candidate {
            idx,
            class,
            slots,
            active,
            active_out_tokens: u64::from(active) * 200,
            prefill_backlog_tokens: 0,
            kv_headroom_tokens: 1 << 30,
            long_lane: false,
            cached_tokens: 0,
            preemptible: 0,
        })
        .collect()
}

/// A request of `tenant` on `tier` with `prompt` tokens asking for `max`.
pub fn req<'a>(p: &'a PolicyDocument, tier: &str, tenant: &'a str, prompt: u32, max: u32) -> Request<'a> {
    let tier = p.tiers.iter().find(|t| t.name == tier).unwrap();
    Request {
        tenant,
        tier,
        model: "m",
        prompt_tokens: prompt,
        max_tokens: max,
        sampling: false,
        ttft_hint_ms: None,
        e2e_hint_ms: None,
        prefix_blocks: 0,
    }
}
