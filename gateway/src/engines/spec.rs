//! An engine entry of the gateway's config: where it is, what it speaks
//! (`native` or `openai`), and an `openai` engine's settings, validated.

use http::Uri;

use super::telemetry;

/// Where an engine is, and what it speaks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    pub id: String,
    /// Base URL, e.g. `http://127.0.0.1:9000`.
    #[serde(with = "uri_string")]
    pub url: Uri,
    /// `native` (this project's engine, the default) or `openai` (a
    /// third-party OpenAI-compatible server: docs/engines.md).
    #[serde(default)]
    pub kind: EngineKind,
    /// What an `openai` engine is and how to reach it (an inline table:
    /// `upstream = { flavour = "llamacpp", max_batch = 4 }`).
    #[serde(default)]
    pub upstream: Upstream,
}

/// The protocol an engine speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    #[default]
    Native,
    Openai,
}

/// An `openai` engine's settings (unset for native engines).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Which server it is: `vllm`, `sglang`, `tgi`, `llamacpp`, `generic`
    /// (which metrics the gateway reads).
    #[serde(default)]
    pub flavour: telemetry::Flavour,
    /// Environment variable holding the upstream's API key (sent as
    /// `Authorization: Bearer`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The model id the upstream serves, sent in place of the request's.
    #[serde(default)]
    pub served_model: Option<String>,
    /// The public model ids (the policy's) this engine serves; empty: every
    /// model of the policy (or, with `discover_models`, those it lists).
    #[serde(default)]
    pub models: Vec<String>,
    /// Serve the policy's models that the upstream's own `/v1/models` lists
    /// (its ids must be the policy's), read on every probe. Ignored when
    /// `models` is given.
    #[serde(default)]
    pub discover_models: bool,
    /// Requests it runs at once (llama.cpp's `--parallel` slots, vLLM's
    /// `--max-num-seqs`): the gateway's gate holds the rest.
    #[serde(default)]
    pub max_batch: Option<u32>,
    /// A latency profile to start the estimator from (else the bundled
    /// conservative default, corrected online).
    #[serde(default)]
    pub profile: Option<std::path::PathBuf>,
    /// PEM file of the CA(s) an `https://` upstream's certificate chains to,
    /// trusted besides the system's bundle.
    #[serde(default)]
    pub ca: Option<std::path::PathBuf>,
    /// The upstream's KV cache in tokens: with the flavour's KV-usage
    /// gauge, admission's KV headroom check (else none).
    #[serde(default)]
    pub kv_tokens: Option<u64>,
}

impl EngineSpec {
    /// What the config cannot mean: `upstream` settings on a native
    /// engine, a native engine over TLS (they speak cleartext HTTP/2 on a
    /// private network), an upstream URL that is neither `http://` nor
    /// `https://`.
    pub fn validate(&self) -> Result<(), String> {
        let scheme = self.url.scheme_str();
        match self.kind {
            EngineKind::Native if self.upstream != Upstream::default() => {
                Err("`upstream` settings need kind = \"openai\"".into())
            }
            EngineKind::Native if scheme != Some("http") => {
                Err(format!("url {}: this project's engines are reached over http://", self.url))
            }
            EngineKind::Openai if scheme != Some("http") && scheme != Some("https") => {
                Err(format!("url {}: an upstream is http:// or https://", self.url))
            }
            EngineKind::Openai if self.upstream.max_batch == Some(0) => {
                Err("upstream.max_batch must be > 0".into())
            }
            _ => Ok(()),
        }
    }

    /// This project's engine at `url`.
    pub fn native(id: impl Into<String>, url: Uri) -> Self {
        Self { id: id.into(), url, kind: EngineKind::Native, upstream: Upstream::default() }
    }
}

mod uri_string {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
