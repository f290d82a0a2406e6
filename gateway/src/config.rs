//! The gateway's own configuration (listener, TLS files, limits, engines),
//! as opposed to the policy document, which SREs tune separately.
//!
//! Read from an optional TOML file (`--config`); command-line flags override
//! it. Unknown keys are errors.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engines::EngineSpec;

/// Gateway process configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Public HTTPS listener.
    pub listen: SocketAddr,
    /// An opt-in second public listener without TLS (HTTP/1.1 and h2c),
    /// for a gateway behind a TLS-terminating load balancer (a Kubernetes
    /// ingress or cloud load balancer). Same routes, auth and bounds; its
    /// connections count under `listener="plaintext"`. Unset: none.
    pub plaintext_listen: Option<SocketAddr>,
    pub tls: TlsFiles,
    /// Largest request body accepted; larger gets 413.
    pub max_body_bytes: usize,
    /// The policy document (tiers, tenants, keys, models).
    pub policies: PathBuf,
    /// Engines to route to (standalone `serve`; `up` adds its children).
    pub engines: Vec<EngineSpec>,
    /// File holding the engines' API token (else the `ENGINE_API_TOKEN`
    /// environment variable; `gateway up` makes one for its children).
    pub engine_token_file: Option<PathBuf>,
    /// The admin listener and policy reload.
    pub admin: AdminConfig,
    /// Shared state of a fleet of gateways (Redis), or in memory.
    pub cluster: crate::cluster::ClusterConfig,
    /// Bounds on connections, streams, buffers and waits.
    pub limits: crate::limits::Limits,
    /// What the Responses API stores (count, bytes, time per tenant).
    pub responses: crate::wire::responses::ResponsesConfig,
    /// Where the gateway keeps what must survive a restart when no Redis
    /// holds it: the API keys made at run time (`keys.json`) and the usage
    /// counts (`usage.json`). Unset: in memory only (a warning at start).
    pub state_dir: Option<PathBuf>,
}

/// The admin API (its own listener) and how policy changes are picked up.
/// Docs: docs/operations.md.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Admin HTTPS listener (the public listener's certificate). Loopback
    /// by default: the admin API is for operators on the host.
    pub listen: SocketAddr,
    /// Bearer tokens allowed on the admin API, each with an id that the
    /// audit log records. None configured: the admin listener is off
    /// (`gateway up` then makes a development token, see `--help`).
    pub tokens: Vec<AdminToken>,
    /// Append-only JSON-lines audit log of every applied or rejected policy
    /// change (unset: the log is kept only in memory and in the gateway's
    /// own log).
    pub audit_log: Option<PathBuf>,
    /// Reload when the policy file changes on disk.
    pub watch: bool,
    /// How often the policy file is checked for changes.
    pub watch_interval_ms: u64,
    /// A change is read once the file has been unchanged this long (editors
    /// write in several steps).
    pub debounce_ms: u64,
    /// Write documents applied through the admin API to the policy file, so
    /// SIGHUP and restarts keep them (off: they live until the file is
    /// reloaded).
    pub write_through: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 9444).into(),
            tokens: Vec::new(),
            audit_log: None,
            watch: true,
            watch_interval_ms: 500,
            debounce_ms: 500,
            write_through: true,
        }
    }
}

/// One admin token: `token = "..."` inline or `token_file = "path"` (the
/// file's trimmed content).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminToken {
    pub id: String,
    token: Option<String>,
    token_file: Option<PathBuf>,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken").field("id", &self.id).field("token_file", &self.token_file).finish()
    }
}

impl AdminToken {
    /// A token given by value.
    pub fn new(id: &str, secret: &str) -> Self {
        Self { id: id.to_string(), token: Some(secret.to_string()), token_file: None }
    }

    /// The secret, read from its file when it lives in one.
    pub fn secret(&self) -> Result<String, ConfigError> {
        let secret = match (&self.token, &self.token_file) {
            (Some(t), None) => t.trim().to_string(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| ConfigError::Read(path.clone(), e))?
                .trim()
                .to_string(),
            _ => {
                return Err(ConfigError::Token(
                    self.id.clone(),
                    "set exactly one of `token` and `token_file`",
                ))
            }
        };
        if secret.len() < 16 {
            return Err(ConfigError::Token(self.id.clone(), "must be at least 16 characters"));
        }
        Ok(secret)
    }
}

/// Certificate chain and private key of the public listener (PEM).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Default for TlsFiles {
    fn default() -> Self {
        Self { cert: "certs/server.pem".into(), key: "certs/server.key".into() }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 8443).into(),
            plaintext_listen: None,
            tls: TlsFiles::default(),
            max_body_bytes: 1 << 20,
            policies: "policies/default.toml".into(),
            engines: Vec::new(),
            engine_token_file: None,
            admin: AdminConfig::default(),
            cluster: crate::cluster::ClusterConfig::default(),
            limits: crate::limits::Limits::default(),
            responses: Default::default(),
            state_dir: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Parse(PathBuf, toml::de::Error),
    #[error("admin token `{0}`: {1}")]
    Token(String, &'static str),
    #[error("{0}: {1}")]
    Invalid(PathBuf, String),
}

impl GatewayConfig {
    /// The engines' API token: `engine_token_file`, else `ENGINE_API_TOKEN`.
    pub fn engine_token(&self) -> Result<Option<String>, ConfigError> {
        let token = match &self.engine_token_file {
            Some(p) => Some(
                std::fs::read_to_string(p).map_err(|e| ConfigError::Read(p.clone(), e))?.trim().to_string(),
            ),
            None => std::env::var(engine_api::TOKEN_ENV).ok().map(|t| t.trim().to_string()),
        };
        match token {
            Some(t) if t.len() < engine_api::MIN_TOKEN_LEN => {
                Err(ConfigError::Token("engine".into(), "must be at least 16 characters"))
            }
            t => Ok(t),
        }
    }

    /// Reads `path`, or the defaults when `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_path_buf(), e))?;
        let config: Self = toml::from_str(&text).map_err(|e| ConfigError::Parse(path.to_path_buf(), e))?;
        config.limits.validate().map_err(|e| ConfigError::Invalid(path.to_path_buf(), e))?;
        for e in &config.engines {
            e.validate()
                .map_err(|m| ConfigError::Invalid(path.to_path_buf(), format!("engine {}: {m}", e.id)))?;
        }
        Ok(config)
    }
}
