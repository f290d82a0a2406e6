//! The policy document: tiers, tenants with their API keys, and models.
//!
//! Parsed from TOML into types that cannot hold invalid values. Unknown keys
//! are errors. Errors name the file, the line where TOML points at one, and
//! the key path. Besides tiers, tenants and models the document holds the
//! `[admission]`, `[estimator]`, `[brownout]` and `[routing]` sections, each
//! owned by its module and defaulted when absent. Every knob is listed in
//! docs/policies.md.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

mod checks;

use checks::{check_models, tenants_of, tiers_of, At};

use crate::admission::{AdmissionConfig, Degradation};
use crate::autoscale::AutoscaleConfig;
use crate::batching::BatchHints;
use crate::brownout::BrownoutConfig;
use crate::estimate::EstimatorConfig;
use crate::routing::RoutingConfig;
use crate::video::VideoConfig;

/// A policy document that failed to load. Both kinds name the file, the
/// line and the key path (`tiers.gold.e2e_ms`); `Display` gives
/// `file:line:column: `key`: message`, as compilers do.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not valid TOML, or a key of the wrong type or unknown. `key` is empty
    /// for a syntax error (no key path exists yet).
    #[error("{file}:{line}:{column}: {}{message}", key_prefix(key))]
    Parse { file: String, line: usize, column: usize, key: String, message: String },
    /// Well-formed but inconsistent (a cross-field check failed). `line` is
    /// where the key (or, when it is missing, its table) is written.
    #[error("{file}:{}: `{key}`: {message}", line.map_or_else(|| "?".to_string(), |l| l.to_string()))]
    Invalid { file: String, line: Option<usize>, key: String, message: String },
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("`{key}`: ")
    }
}

/// An API key. Its `Debug` shows only a prefix, so keys never reach logs.
#[derive(Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Keys are looked up by the presented `&str` (no copy per request); the
/// derived `Hash` and `Eq` are the `String`'s, hence `str`'s.
impl std::borrow::Borrow<str> for ApiKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix: String = self.0.chars().take(4).collect();
        write!(f, "ApiKey({prefix}…redacted)")
    }
}

/// `[cost]`: what an engine costs, for GPU-seconds in money, and what a
/// token costs a caller (usage and spend, budgets in dollars).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostConfig {
    /// Price of one GPU-hour (one engine) of a class not listed below.
    pub default_gpu_hour: f64,
    /// Price per GPU-hour by engine class (`engine_class` of its profile).
    pub gpu_hour: BTreeMap<String, f64>,
    /// Price per million tokens of a model not listed in `tokens`.
    pub default_tokens: TokenPrice,
    /// Price per million tokens by model id: what the usage export and the
    /// dollar budgets count.
    pub tokens: BTreeMap<String, TokenPrice>,
}

/// A model's price per million prompt (input) and completion (output)
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl Default for CostConfig {
    fn default() -> Self {
        Self {
            default_gpu_hour: 2.0,
            gpu_hour: BTreeMap::new(),
            default_tokens: TokenPrice::default(),
            tokens: BTreeMap::new(),
        }
    }
}

/// A spending limit (`budget` of a tenant, or of an API key made at run
/// time): tokens (prompt + completion) per UTC day and month, dollars per
/// UTC month at `[cost.tokens]` prices. Unset: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_month: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_month: Option<f64>,
}

impl Budget {
    /// What is wrong with it, if anything.
    pub fn problem(&self) -> Option<&'static str> {
        match self.usd_per_month {
            Some(usd) if !(usd.is_finite() && usd >= 0.0) => Some("usd_per_month must be a price >= 0"),
            _ => None,
        }
    }

    pub fn is_set(&self) -> bool {
        *self != Budget::default()
    }
}

impl CostConfig {
    /// What `prompt` and `completion` tokens of `model` cost, in dollars.
    pub fn token_cost(&self, model: &str, prompt: u64, completion: u64) -> f64 {
        let p = self.tokens.get(model).unwrap_or(&self.default_tokens);
        (prompt as f64 * p.input_per_mtok + completion as f64 * p.output_per_mtok) / 1e6
    }

    /// Price of one GPU-hour of `class`.
    pub fn price(&self, class: &str) -> f64 {
        self.gpu_hour.get(class).copied().unwrap_or(self.default_gpu_hour)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(self.default_gpu_hour) {
            return Err(("cost.default_gpu_hour".into(), "must be a price >= 0".into()));
        }
        let price_ok = |p: &TokenPrice| ok(p.input_per_mtok) && ok(p.output_per_mtok);
        if !price_ok(&self.default_tokens) {
            return Err(("cost.default_tokens".into(), "prices must be >= 0".into()));
        }
        if let Some((model, _)) = self.tokens.iter().find(|(_, p)| !price_ok(p)) {
            return Err((format!("cost.tokens.{model}"), "prices must be >= 0".into()));
        }
        match self.gpu_hour.iter().find(|(_, v)| !ok(**v)) {
            Some((class, _)) => Err((format!("cost.gpu_hour.{class}"), "must be a price >= 0".into())),
            None => Ok(()),
        }
    }
}

/// A service tier: the latency targets and caps its tenants get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub name: String,
    /// Time-to-first-token budget (D_TTFT).
    pub ttft: Duration,
    /// End-to-end budget (D_E2E): time to the last token.
    pub e2e: Duration,
    /// Output tokens a request may ask for; larger `max_tokens` is clamped.
    pub max_output_tokens: NonZeroU32,
    /// Prompt tokens a request may carry; more is a 400.
    pub max_context_tokens: NonZeroU32,
    /// Relative share under contention: the engine's ordering key divides
    /// estimated work by it, and it is the tenant's deficit round-robin weight.
    pub priority_weight: NonZeroU32,
    /// The degradation ladder never lowers `max_tokens` below this.
    pub output_floor_tokens: u32,
    /// Requests one tenant of this tier may have open at once (429 beyond).
    pub max_concurrency: Option<NonZeroU32>,
    /// Requests one tenant may start per wall-clock minute (429 beyond).
    pub requests_per_minute: Option<NonZeroU32>,
    /// Live video streams per tenant (429 `video_stream_limit` beyond).
    pub max_video_streams: Option<NonZeroU32>,
    /// Video streams a tenant may create per minute, per gateway.
    pub video_streams_per_minute: Option<NonZeroU32>,
    /// Prompt + `max_tokens` tokens one tenant may ask for per minute.
    pub tokens_per_minute: Option<NonZeroU32>,
    /// Allowed degradations, in the order they are tried.
    pub degradations: Vec<Degradation>,
    /// Engine class the `faster_class` degradation moves requests to.
    pub overflow_class: Option<String>,
    /// What to do with a request whose SLO even an idle engine of any
    /// class it may use cannot meet (not an overload: retrying never helps).
    pub unattainable: crate::admission::Unattainable,
}

/// A tenant: who is calling, and on which tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub name: String,
    /// Index into [`PolicyDocument::tiers`].
    pub tier: usize,
    /// The tenant's spending limit (all its keys together).
    pub budget: Budget,
}

/// A model the gateway serves.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub id: String,
    #[serde(default = "default_owner")]
    pub owned_by: String,
    /// Request parameters the gateway does not honour itself but passes to
    /// third-party engines (`kind = "openai"`) serving this model, e.g.
    /// `response_format` or a server's own sampling knobs (`top_k`,
    /// `min_p`, `repetition_penalty`, or `tools`, `n`, `logprobs`, whose
    /// answers the gateway relays as the engine wrote them): a request using
    /// one goes only to such engines.
    #[serde(default)]
    pub passthrough: Vec<String>,
}

/// Parameters that change the answer's shape (more than one text per
/// request): passed through, the answer is relayed as the engine wrote it
/// (ids and model re-stamped) rather than re-encoded from its text.
pub const SHAPE_CHANGING: &[&str] = &[
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "echo",
];

/// Parameters the gateway cannot relay (answers that are not text or tool
/// calls): never passed through.
pub const NOT_RELAYED: &[&str] = &["audio", "modalities", "prediction"];

/// Parameters the gateway sets or honours itself: never passed through as
/// they are.
const OWN: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "seed",
    "stop",
    "stream",
    "stream_options",
];

fn default_owner() -> String {
    "slo-gateway".to_string()
}

/// A validated policy document.
#[derive(Debug, Clone)]
pub struct PolicyDocument {
    pub models: Vec<Model>,
    pub tiers: Vec<Tier>,
    pub tenants: Vec<Tenant>,
    pub admission: AdmissionConfig,
    pub estimator: EstimatorConfig,
    pub brownout: BrownoutConfig,
    pub routing: RoutingConfig,
    /// Batch-formation hints for the engines (`[batching]`).
    pub batching: BatchHints,
    /// Streaming video scheduling (`[video]`).
    pub video: VideoConfig,
    /// `[autoscale]`: engines serving and warm (policies::autoscale).
    pub autoscale: AutoscaleConfig,
    /// `[diffusion]`: the image and video pool scheduler (GenServe).
    pub diffusion: crate::diffusion::SchedConfig,
    /// `[cost]`: prices per GPU-hour.
    pub cost: CostConfig,
    /// `[oserve]`: workload types (policies::oserve).
    pub oserve: crate::oserve::OserveConfig,
    /// Content hash of the document text (12 hex digits): the version in
    /// response headers and metrics.
    pub version: String,
    keys: HashMap<ApiKey, usize>,
    /// SHA-256 hex digests of keys (`key_hashes`) -> tenant.
    key_hashes: HashMap<String, usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    models: Vec<Model>,
    tiers: BTreeMap<String, RawTier>,
    #[serde(default)]
    tenants: Vec<RawTenant>,
    #[serde(default)]
    admission: AdmissionConfig,
    #[serde(default)]
    estimator: EstimatorConfig,
    /// `None` when absent: the shipped levels apply to whichever of their
    /// tiers exist; levels written out must name only existing tiers.
    brownout: Option<BrownoutConfig>,
    #[serde(default)]
    routing: RoutingConfig,
    #[serde(default)]
    batching: BatchHints,
    #[serde(default)]
    video: VideoConfig,
    #[serde(default)]
    autoscale: AutoscaleConfig,
    #[serde(default)]
    diffusion: crate::diffusion::SchedConfig,
    #[serde(default)]
    cost: CostConfig,
    #[serde(default)]
    oserve: crate::oserve::OserveConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    ttft_ms: NonZeroU32,
    e2e_ms: NonZeroU32,
    max_output_tokens: NonZeroU32,
    max_context_tokens: NonZeroU32,
    #[serde(default = "one")]
    priority_weight: NonZeroU32,
    output_floor_tokens: Option<u32>,
    max_concurrency: Option<NonZeroU32>,
    requests_per_minute: Option<NonZeroU32>,
    #[serde(default)]
    max_video_streams: Option<NonZeroU32>,
    #[serde(default)]
    video_streams_per_minute: Option<NonZeroU32>,
    tokens_per_minute: Option<NonZeroU32>,
    #[serde(default = "all_degradations")]
    degradations: Vec<Degradation>,
    overflow_class: Option<String>,
    #[serde(default)]
    unattainable: crate::admission::Unattainable,
}

fn all_degradations() -> Vec<Degradation> {
    vec![Degradation::ReduceOutput, Degradation::Greedy, Degradation::FasterClass]
}

fn one() -> NonZeroU32 {
    NonZeroU32::MIN
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    tier: String,
    #[serde(default)]
    keys: Vec<ApiKey>,
    /// Keys given by their SHA-256 (`sha256:<64 hex>`), so the document
    /// need not hold the secrets.
    #[serde(default)]
    key_hashes: Vec<String>,
    #[serde(default)]
    budget: Budget,
}

impl PolicyDocument {
    /// Parses and validates `text`; `file` only labels errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, PolicyError> {
        let de = toml::Deserializer::parse(text).map_err(|e| parse_error(file, text, "", &e))?;
        let raw: RawDocument = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            parse_error(file, text, key.trim_start_matches('.'), e.inner())
        })?;
        let at = At { file, text };
        let invalid = |key: String, message: String| at.invalid(key, message);
        check_models(&raw.models, &at)?;
        let tiers = tiers_of(raw.tiers, &at)?;
        let (tenants, keys, key_hashes) = tenants_of(raw.tenants, &tiers, &at)?;
        let section = |(key, message): (&str, String)| invalid(key.to_string(), message);
        raw.admission.validate().map_err(section)?;
        raw.estimator.validate().map_err(section)?;
        raw.routing.validate().map_err(section)?;
        if raw.batching.long_prompt_tokens.is_some() {
            let message = "set it in [routing]: engines get the routing value".to_string();
            return Err(invalid("batching.long_prompt_tokens".into(), message));
        }
        raw.batching.validate().map_err(|(key, message)| invalid(key, message))?;
        raw.video.validate().map_err(section)?;
        raw.autoscale.validate().map_err(section)?;
        raw.diffusion.validate().map_err(|message| {
            let key = message.split(':').next().unwrap_or("diffusion").to_string();
            invalid(key, message)
        })?;
        if let Some(t) = raw.diffusion.tier_slo_scale.keys().find(|t| !tiers.iter().any(|x| &x.name == *t)) {
            return Err(invalid(format!("diffusion.tier_slo_scale.{t}"), "unknown tier".into()));
        }
        raw.cost.validate().map_err(|(key, message)| invalid(key, message))?;
        raw.oserve.validate().map_err(|(key, message)| invalid(key, message))?;
        let explicit = raw.brownout.is_some();
        let brownout = raw.brownout.unwrap_or_default();
        brownout.validate().map_err(|(key, message)| invalid(key, message))?;
        for (i, level) in brownout.levels.iter().enumerate().filter(|_| explicit) {
            if let Some(t) = level.tiers.keys().find(|t| !tiers.iter().any(|x| &x.name == *t)) {
                return Err(invalid(format!("brownout.levels[{i}].tiers.{t}"), "unknown tier".into()));
            }
        }
        Ok(Self {
            models: raw.models,
            tiers,
            tenants,
            admission: raw.admission,
            estimator: raw.estimator,
            brownout,
            routing: raw.routing,
            batching: raw.batching,
            video: raw.video,
            autoscale: raw.autoscale,
            diffusion: raw.diffusion,
            cost: raw.cost,
            oserve: raw.oserve,
            version: version_of(text),
            keys,
            key_hashes,
        })
    }

    /// The hints every engine gets: `[batching]` plus the routing lane.
    pub fn engine_hints(&self) -> BatchHints {
        BatchHints { long_prompt_tokens: Some(self.routing.long_prompt_tokens), ..self.batching.clone() }
    }

    /// The tier with this name.
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == name)
    }

    /// The tenant owning `key`, with its tier.
    pub fn authenticate(&self, key: &str) -> Option<(&Tenant, &Tier)> {
        self.key_owner(key).map(|i| self.tenant_at(i))
    }

    /// The index of the tenant owning `key` (stable for this document).
    pub fn key_owner(&self, key: &str) -> Option<usize> {
        self.keys.get(key).copied()
    }

    /// The index of the tenant owning the key whose SHA-256 is `hex`
    /// (lowercase), listed in its `key_hashes`.
    pub fn hashed_key_owner(&self, hex: &str) -> Option<usize> {
        self.key_hashes.get(hex).copied()
    }

    /// The index of the tenant named `name`.
    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }

    /// Tenant `i` of this document ([`Self::key_owner`]), with its tier.
    ///
    /// # Panics
    /// If `i` is not a tenant index of this document.
    pub fn tenant_at(&self, i: usize) -> (&Tenant, &Tier) {
        let tenant = &self.tenants[i];
        (tenant, &self.tiers[tenant.tier])
    }

    /// The model with this id.
    pub fn model(&self, id: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.id == id)
    }
}

/// FNV-1a 64 of the text, as 12 hex digits.
pub fn version_of(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

fn parse_error(file: &str, text: &str, key: &str, e: &toml::de::Error) -> PolicyError {
    let (line, column) = crate::text::line_column(text, e.span().map_or(0, |s| s.start));
    let message = e.message().trim().to_string();
    PolicyError::Parse { file: file.to_string(), line, column, key: key.to_string(), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"
[[models]]
id = "m1"

[tiers.gold]
ttft_ms = 500
e2e_ms = 10000
max_output_tokens = 1024
max_context_tokens = 8192
priority_weight = 4

[[tenants]]
name = "acme"
tier = "gold"
keys = ["sk-acme-1", "sk-acme-2"]
"#;

    #[test]
    fn authenticates_keys_to_tenant_and_tier() {
        let doc = PolicyDocument::parse("p.toml", DOC).unwrap();
        let (tenant, tier) = doc.authenticate("sk-acme-2").unwrap();
        assert_eq!(tenant.name, "acme");
        assert_eq!(tier.name, "gold");
        assert_eq!(tier.ttft, Duration::from_millis(500));
        assert!(doc.authenticate("sk-nope").is_none());
        assert!(doc.model("m1").is_some() && doc.model("m2").is_none());
    }

    #[test]
    fn passthrough_lists_only_parameters_the_gateway_can_relay() {
        let with = |list: &str| DOC.replace("id = \"m1\"", &format!("id = \"m1\"\npassthrough = [{list}]"));
        let doc = PolicyDocument::parse("p.toml", &with("\"response_format\", \"top_k\"")).unwrap();
        assert_eq!(doc.model("m1").unwrap().passthrough, ["response_format", "top_k"]);
        let shaped = PolicyDocument::parse("p.toml", &with("\"tools\", \"n\", \"logprobs\"")).unwrap();
        assert_eq!(shaped.model("m1").unwrap().passthrough.len(), 3, "relayed verbatim");
        for (list, why) in [
            ("\"audio\"", "cannot relay"),
            ("\"modalities\"", "cannot relay"),
            ("\"max_tokens\"", "gateway's own"),
        ] {
            let e = PolicyDocument::parse("p.toml", &with(list)).unwrap_err().to_string();
            assert!(e.contains("models[0].passthrough") && e.contains(why), "{e}");
        }
        assert!(PolicyDocument::parse("p.toml", DOC).unwrap().model("m1").unwrap().passthrough.is_empty());
    }

    #[test]
    fn times_that_would_overflow_a_duration_are_refused_with_their_key() {
        for (knob, value) in
            [("control_tick_s", "1e20"), ("max_buffer_s", "1e300"), ("rehome_cooldown_s", "1e19")]
        {
            let text = format!("{DOC}\n[video]\n{knob} = {value}\n");
            let e = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
            assert!(e.contains(&format!("video.{knob}")), "{e}");
        }
    }

    #[test]
    fn preemption_and_warm_pool_knobs_out_of_range_are_refused_with_file_line_and_key() {
        for (section, knob, value) in [
            ("admission", "max_pauses", "0"),
            ("admission", "max_pauses", "9"),
            ("autoscale", "queue_window_s", "0.5"),
            ("autoscale", "burst_horizon_s", "-1"),
            ("autoscale", "warm_margin", "-1"),
        ] {
            let text = format!("{DOC}\n[{section}]\n{knob} = {value}\n");
            let e = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
            assert!(
                e.starts_with("p.toml:") && e.contains(&format!("`{section}.{knob}`")),
                "{knob} = {value}: {e}"
            );
        }
        let text = format!("{DOC}\n[autoscale]\nburst_source = \"guess\"\n");
        let e = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
        assert!(e.contains("autoscale.burst_source"), "{e}");
    }

    #[test]
    fn unknown_key_is_an_error_with_its_line() {
        let text = DOC.replace("priority_weight = 4", "priority_weight = 4\nbogus = 1");
        match PolicyDocument::parse("p.toml", &text).unwrap_err() {
            PolicyError::Parse { line, key, message, .. } => {
                assert_eq!(line, 11, "{message}");
                assert_eq!(key, "tiers.gold.bogus", "{message}");
                assert!(message.contains("bogus"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let text = format!("oops = 1\n{DOC}");
        match PolicyDocument::parse("p.toml", &text).unwrap_err() {
            PolicyError::Parse { line, message, .. } => {
                assert_eq!(line, 1, "{message}");
                assert!(message.contains("oops"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn cross_field_checks_name_the_key_path() {
        let text = DOC.replace("tier = \"gold\"", "tier = \"platinum\"");
        let err = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:14: `tenants[0].tier`: ") && err.contains("platinum"), "{err}");
        let text = DOC.replace("e2e_ms = 10000", "e2e_ms = 100");
        let err = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:7: `tiers.gold.e2e_ms`: must be >= ttft_ms"), "{err}");
        let text = DOC.replace("ttft_ms = 500", "ttft_ms = \"fast\"");
        let err = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:6:11: `tiers.gold.ttft_ms`: invalid type"), "{err}");
        let text = DOC.replace("\"sk-acme-2\"", "\"sk-acme-1\"");
        let err = PolicyDocument::parse("p.toml", &text).unwrap_err().to_string();
        assert!(err.contains("tenants[0].keys[1]"), "{err}");
        let text = DOC.replace("max_output_tokens = 1024", "max_output_tokens = 0");
        assert!(PolicyDocument::parse("p.toml", &text).is_err());
    }

    #[test]
    fn keys_are_redacted_in_debug() {
        let doc = PolicyDocument::parse("p.toml", DOC).unwrap();
        let shown = format!("{doc:?}");
        assert!(!shown.contains("sk-acme-1"), "{shown}");
    }
}
