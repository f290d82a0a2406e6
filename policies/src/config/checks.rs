//! The checks of a policy document that span its entries (models, tiers,
//! tenants and their keys), each error naming the file, line and key path.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{ApiKey, Model, PolicyError, RawTenant, RawTier, Tenant, Tier, NOT_RELAYED, OWN};

/// Where a policy document's errors point: its file and the line of a key.
pub(super) struct At<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl At<'_> {
    pub fn invalid(&self, key: String, message: String) -> PolicyError {
        PolicyError::Invalid {
            file: self.file.to_string(),
            line: crate::text::line_of(self.text, &key),
            key,
            message,
        }
    }
}

/// At least one model; no passthrough parameter the gateway cannot relay
/// or owns.
pub(super) fn check_models(models: &[Model], at: &At) -> Result<(), PolicyError> {
    let invalid = |key: String, message: String| at.invalid(key, message);
    if models.is_empty() {
        return Err(invalid("models".into(), "at least one model is required".into()));
    }
    for (i, m) in models.iter().enumerate() {
        if let Some(p) = m.passthrough.iter().find(|p| NOT_RELAYED.contains(&p.as_str())) {
            let why = format!("`{p}` asks for answers the gateway cannot relay (not text or tool calls)");
            return Err(invalid(format!("models[{i}].passthrough"), why));
        }
        if let Some(p) = m.passthrough.iter().find(|p| OWN.contains(&p.as_str())) {
            return Err(invalid(format!("models[{i}].passthrough"), format!("`{p}` is the gateway's own")));
        }
    }
    Ok(())
}

/// The tiers, validated (E2E at least the TTFT, the output floor within
/// the cap, no degradation twice).
pub(super) fn tiers_of(raw: BTreeMap<String, RawTier>, at: &At) -> Result<Vec<Tier>, PolicyError> {
    let invalid = |key: String, message: String| at.invalid(key, message);
    let mut tiers = Vec::new();
    for (name, t) in raw {
        if t.e2e_ms < t.ttft_ms {
            return Err(invalid(
                format!("tiers.{name}.e2e_ms"),
                format!("must be >= ttft_ms ({})", t.ttft_ms),
            ));
        }
        let floor = t.output_floor_tokens.unwrap_or(32).min(t.max_output_tokens.get());
        if t.output_floor_tokens.is_some_and(|f| f == 0 || f > t.max_output_tokens.get()) {
            return Err(invalid(
                format!("tiers.{name}.output_floor_tokens"),
                format!("must be in [1, max_output_tokens ({})]", t.max_output_tokens),
            ));
        }
        let mut seen = Vec::new();
        for (i, d) in t.degradations.iter().enumerate() {
            if seen.contains(d) {
                return Err(invalid(format!("tiers.{name}.degradations[{i}]"), "listed twice".into()));
            }
            seen.push(*d);
        }
        tiers.push(Tier {
            name,
            ttft: Duration::from_millis(t.ttft_ms.get().into()),
            e2e: Duration::from_millis(t.e2e_ms.get().into()),
            max_output_tokens: t.max_output_tokens,
            max_context_tokens: t.max_context_tokens,
            priority_weight: t.priority_weight,
            output_floor_tokens: floor,
            max_concurrency: t.max_concurrency,
            requests_per_minute: t.requests_per_minute,
            max_video_streams: t.max_video_streams,
            video_streams_per_minute: t.video_streams_per_minute,
            tokens_per_minute: t.tokens_per_minute,
            degradations: t.degradations,
            overflow_class: t.overflow_class,
            unattainable: t.unattainable,
        });
    }
    if tiers.is_empty() {
        return Err(invalid("tiers".into(), "at least one tier is required".into()));
    }
    Ok(tiers)
}

/// Tenant index by API key, and by a key's lowercase SHA-256 hex.
pub(super) type KeyIndex = HashMap<ApiKey, usize>;
pub(super) type HashIndex = HashMap<String, usize>;

/// The tenants with their keys and key hashes (each key one tenant's), each
/// on a known tier.
pub(super) fn tenants_of(
    raw: Vec<RawTenant>,
    tiers: &[Tier],
    at: &At,
) -> Result<(Vec<Tenant>, KeyIndex, HashIndex), PolicyError> {
    let invalid = |key: String, message: String| at.invalid(key, message);
    let mut tenants = Vec::new();
    let mut keys = HashMap::new();
    let mut key_hashes = HashMap::new();
    let mut names = std::collections::HashSet::new();
    for (i, t) in raw.into_iter().enumerate() {
        if !names.insert(t.name.clone()) {
            return Err(invalid(
                format!("tenants[{i}].name"),
                format!("tenant `{}` is defined twice", t.name),
            ));
        }
        if let Some(why) = t.budget.problem() {
            return Err(invalid(format!("tenants[{i}].budget"), why.into()));
        }
        for (k, h) in t.key_hashes.iter().enumerate() {
            let path = format!("tenants[{i}].key_hashes[{k}]");
            let hex = h.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(path, "must be `sha256:` and 64 hex digits".into()));
            }
            if key_hashes.insert(hex.to_ascii_lowercase(), i).is_some() {
                return Err(invalid(path, "key is already assigned to another tenant".into()));
            }
        }
        let tier = tiers
            .iter()
            .position(|x| x.name == t.tier)
            .ok_or_else(|| invalid(format!("tenants[{i}].tier"), format!("unknown tier `{}`", t.tier)))?;
        for (k, key) in t.keys.into_iter().enumerate() {
            let path = format!("tenants[{i}].keys[{k}]");
            if key.0.trim().is_empty() {
                return Err(invalid(path, "must not be empty".into()));
            }
            if keys.insert(key, i).is_some() {
                return Err(invalid(path, "key is already assigned to another tenant".into()));
            }
        }
        tenants.push(Tenant { name: t.name, tier, budget: t.budget });
    }
    Ok((tenants, keys, key_hashes))
}
