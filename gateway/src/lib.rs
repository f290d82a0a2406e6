//! The SLO-aware HTTPS gateway in front of the inference engines.
//!
//! Owns the public listener ([`server`], [`tls`]), the request path
//! ([`service`]: auth, schema, dispatch, relay), the error taxonomy
//! ([`error`]), admission, brownout and the gate ([`admission`]), engine
//! discovery and routing ([`engines`], [`dispatch`]),
//! the NDJSON-to-SSE relay ([`relay`]), metrics ([`metrics`]), the dev PKI
//! ([`certs`]) and the embedded mode's engine children ([`supervisor`]).
//! Decisions come from the pure `policies` crate.

pub mod admission;
pub mod body;
pub mod certs;
pub mod config;
pub mod dispatch;
pub mod engines;
pub mod error;
pub mod metrics;
pub mod openai;
pub mod relay;
pub mod server;
pub mod service;
pub mod supervisor;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use policies::PolicyDocument;

use crate::config::GatewayConfig;
use crate::engines::EnginePool;
use crate::supervisor::{EngineLaunch, Supervisor};

/// The bundled policy document, used when the default path is absent.
pub const DEFAULT_POLICIES: &str = include_str!("../../policies/default.toml");

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct App {
    pub config: GatewayConfig,
    pub policy: Arc<PolicyDocument>,
    pub engines: Arc<EnginePool>,
    pub admission: Arc<admission::Admission>,
    id_prefix: u32,
    next_id: AtomicU64,
}

impl App {
    pub fn new(config: GatewayConfig, policy: PolicyDocument, engines: Arc<EnginePool>) -> Self {
        // Request ids are unique per process start without coordination.
        let id_prefix =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
        let admission = admission::Admission::new(Arc::clone(&engines));
        Self { config, policy: Arc::new(policy), engines, admission, id_prefix, next_id: AtomicU64::new(0) }
    }
}

/// Errors that stop the gateway from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("reading policies {0}: {1}")]
    ReadPolicies(PathBuf, std::io::Error),
    #[error(transparent)]
    Policy(#[from] policies::PolicyError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    #[error(transparent)]
    Supervisor(#[from] supervisor::SupervisorError),
    #[error("binding {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
    #[error("no engine became ready within {0:?}")]
    EnginesNotReady(Duration),
    #[error("no engines configured: add [[engines]] to the config or use `gateway up`")]
    NoEngines,
}

/// Reads the policy document; the bundled default stands in when the
/// default path does not exist (running outside the repository).
pub fn load_policies(path: &Path) -> Result<PolicyDocument, StartError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(PolicyDocument::parse(&path.display().to_string(), &text)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == Path::new("policies/default.toml") => {
            Ok(PolicyDocument::parse("bundled policies/default.toml", DEFAULT_POLICIES)?)
        }
        Err(e) => Err(StartError::ReadPolicies(path.to_path_buf(), e)),
    }
}

/// What `gateway up` needs beyond the gateway config.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub launch: EngineLaunch,
    /// Where the dev PKI lives (generated on first run).
    pub certs_dir: PathBuf,
}

/// Runs the embedded single-node system: dev certificates, N engine
/// children, and the gateway, until SIGINT/SIGTERM.
pub async fn run_up(mut config: GatewayConfig, opts: UpOptions) -> Result<(), StartError> {
    let pki = certs::DevPki::in_dir(&opts.certs_dir);
    if !pki.exists() {
        certs::generate(&opts.certs_dir)?;
        println!("generated development certificates in {}", opts.certs_dir.display());
    }
    config.tls.cert = pki.server_cert.clone();
    config.tls.key = pki.server_key.clone();
    let policy = load_policies(&config.policies)?;
    let tls = tls::server_config(&config.tls.cert, &config.tls.key)?;
    let sup = Supervisor::start(&opts.launch).await?;
    for c in &sup.children {
        let url = c.spec.url.authority().map_or_else(|| c.spec.url.to_string(), |a| format!("http://{a}"));
        println!("engine {} pid={} url={url} backend={}", c.spec.id, c.pid, opts.launch.backend.as_str());
    }
    config.engines.extend(sup.specs());
    let result = serve_until_signal(config, policy, tls, Some(&pki.ca_cert)).await;
    sup.shutdown().await;
    result
}

/// Runs a standalone gateway over the engines named in its config.
pub async fn run_serve(config: GatewayConfig) -> Result<(), StartError> {
    if config.engines.is_empty() {
        return Err(StartError::NoEngines);
    }
    let policy = load_policies(&config.policies)?;
    let tls = tls::server_config(&config.tls.cert, &config.tls.key)?;
    serve_until_signal(config, policy, tls, None).await
}

async fn serve_until_signal(
    config: GatewayConfig,
    policy: PolicyDocument,
    tls: Arc<rustls::ServerConfig>,
    ca: Option<&Path>,
) -> Result<(), StartError> {
    metrics::handle(); // install the recorder before the first metric
    let pool = EnginePool::new(config.engines.clone());
    let wait = Duration::from_secs(30);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        pool.poll_once().await;
        if pool.ready_count() == pool.len() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            if pool.ready_count() == 0 {
                return Err(StartError::EnginesNotReady(wait));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::spawn(Arc::clone(&pool).poll_forever());
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.map_err(|e| StartError::Bind(config.listen, e))?;
    let addr = listener.local_addr().map_err(|e| StartError::Bind(config.listen, e))?;
    let ready = pool.ready_count();
    let total = pool.len();
    let app = Arc::new(App::new(config, policy, pool));
    tokio::spawn(Arc::clone(&app.admission).run(Arc::clone(&app.policy)));
    println!("gateway listening on https://{addr} (HTTP/2 and HTTP/1.1 over TLS)");
    println!("ready: {ready}/{total} engines");
    if let Some(ca) = ca {
        print_example(addr, ca);
    }
    tracing::info!(event = "gateway_ready", %addr, ready, total);
    server::serve(app, listener, tls, async {
        engine::shutdown_signal(false).await;
    })
    .await;
    tracing::info!(event = "gateway_stopped");
    Ok(())
}

fn print_example(addr: std::net::SocketAddr, ca: &Path) {
    let host = if addr.ip().is_loopback() { format!("localhost:{}", addr.port()) } else { addr.to_string() };
    println!("try:");
    println!(
        "  curl --http2 --cacert {} https://{host}/v1/chat/completions \\\n    -H 'Authorization: Bearer sk-demo-gold' -H 'Content-Type: application/json' \\\n    -d '{{\"model\":\"synthetic-small\",\"stream\":true,\"max_tokens\":16,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'",
        ca.display()
    );
}
