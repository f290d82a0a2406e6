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
    pub tls: TlsFiles,
    /// Largest request body accepted; larger gets 413.
    pub max_body_bytes: usize,
    /// The policy document (tiers, tenants, keys, models).
    pub policies: PathBuf,
    /// Engines to route to (standalone `serve`; `up` adds its children).
    pub engines: Vec<EngineSpec>,
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
            tls: TlsFiles::default(),
            max_body_bytes: 1 << 20,
            policies: "policies/default.toml".into(),
            engines: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Parse(PathBuf, toml::de::Error),
}

impl GatewayConfig {
    /// Reads `path`, or the defaults when `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_path_buf(), e))?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse(path.to_path_buf(), e))
    }
}
