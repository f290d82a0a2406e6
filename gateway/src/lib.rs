//! The SLO-aware HTTPS gateway in front of the inference engines.
//!
//! Owns the public listener ([`server`], [`tls`]), the request path
//! ([`service`]: auth, schema, dispatch, relay), the error taxonomy
//! ([`error`]), admission, brownout and the gate ([`admission`]), the
//! active policy version and its reloads ([`reload`], [`policy_watch`],
//! [`audit`]) with the admin listener ([`admin`]), the engines' batching
//! hints ([`hints`]), video streams ([`video`]), engine
//! discovery and routing ([`engines`], [`dispatch`]),
//! the NDJSON-to-SSE relay ([`relay`]), metrics ([`metrics`]), the dev PKI
//! ([`certs`]) and the embedded mode's engine children ([`supervisor`]).
//! Decisions come from the pure `policies` crate.
#![forbid(unsafe_code)]

pub(crate) mod admin;
pub(crate) mod admission;
pub(crate) mod audit;
pub(crate) mod body;
pub mod certs;
pub mod clock;
pub(crate) mod cluster;
pub mod config;
pub(crate) mod diffusion;
pub(crate) mod dispatch;
pub(crate) mod engine_bin;
pub(crate) mod engines;
pub(crate) mod error;
pub(crate) mod fleet;
#[doc(hidden)]
pub mod fuzzing;
/// The cluster state's Redis side, for the cluster tests (not an API).
#[doc(hidden)]
pub mod cluster_testing {
    pub use crate::cluster::redis::RedisState;
    pub use crate::cluster::streams::{MAX_SWEEP, SWEEP_BATCH};
    pub use crate::cluster::{wall_ms, ClusterConfig, Denied, Limits};
}
pub(crate) mod headers;
pub(crate) mod hints;
pub(crate) mod keys;
pub(crate) mod limits;
pub mod metrics;
pub(crate) mod openai;
pub(crate) mod oserve;
pub(crate) mod outbox;
pub(crate) mod permit;
mod player;
pub(crate) mod policy_watch;
pub(crate) mod ratelimit;
pub(crate) mod relay;
pub(crate) mod reload;
pub(crate) mod request;
pub(crate) mod server;
pub(crate) mod service;
pub(crate) mod stack;
pub mod supervisor;
#[cfg(any(test, feature = "test-util"))]
pub mod testkit;
pub(crate) mod tls;
mod trace;
pub(crate) mod upstream;
pub(crate) mod usage;
pub(crate) mod video;
pub mod wire;
pub(crate) mod workers;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use policies::PolicyDocument;

use crate::config::GatewayConfig;
use crate::engines::EnginePool;
use crate::reload::PolicyStore;
use crate::supervisor::{EngineLaunch, Supervisor};

/// The bundled policy document, used when the default path is absent.
pub const DEFAULT_POLICIES: &str = include_str!("../../policies/default.toml");

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct App {
    pub config: GatewayConfig,
    /// The active policy version: each request takes one snapshot.
    pub policies: Arc<PolicyStore>,
    pub engines: Arc<EnginePool>,
    pub admission: Arc<admission::Admission>,
    /// Video streams.
    pub video: Arc<video::Streams>,
    /// Images and whole-video jobs (GenServe).
    pub diffusion: Arc<diffusion::Diffusion>,
    /// State shared with the fleet's other gateways (or in memory).
    pub cluster: Arc<cluster::Cluster>,
    /// Capacity: the autoscaler, warm pool and (embedded mode) supervisor.
    pub fleet: Arc<fleet::FleetControl>,
    /// The Responses API's stored responses.
    pub(crate) responses: Arc<wire::responses::ResponseStore>,
    /// API keys made at run time (`/admin/keys`).
    pub(crate) keys: Arc<keys::KeyStore>,
    /// Usage and spend per tenant, key, model and day.
    pub(crate) usage: Arc<usage::UsageStore>,
    id_prefix: u32,
    next_id: AtomicU64,
    /// Set on SIGTERM: `/readyz` says 503 `draining` while the listeners
    /// still accept (`limits.shutdown_grace_ms`).
    pub draining: std::sync::atomic::AtomicBool,
}

impl App {
    pub fn new(
        config: GatewayConfig,
        policies: Arc<PolicyStore>,
        engines: Arc<EnginePool>,
        policy_key: Option<cluster::signing::PolicyKey>,
        control: Control,
    ) -> Self {
        // Request ids are unique per process start without coordination.
        let id_prefix = crate::clock::wall()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
        let admission = admission::Admission::new(Arc::clone(&engines));
        let cluster = Arc::new(cluster::Cluster::new(config.cluster.clone(), config.listen, policy_key));
        let video = video::Streams::new(Arc::clone(&engines), Arc::clone(&cluster), &config.limits);
        let diffusion = diffusion::Diffusion::new(Arc::clone(&engines));
        let fleet = fleet::FleetControl::new(
            Arc::clone(&engines),
            Arc::clone(&admission),
            control.supervisor,
            control.bounds,
            Some(Arc::clone(&video)),
        );
        let responses =
            Arc::new(wire::responses::ResponseStore::shared(config.responses.clone(), Arc::clone(&cluster)));
        let state = |file: &str| config.state_dir.as_ref().map(|d| d.join(file));
        let keys = Arc::new(keys::KeyStore::open(state("keys.json")));
        let usage = Arc::new(usage::UsageStore::open(state("usage.json")));
        if config.cluster.redis.is_some() {
            usage.set_clustered();
        } else if config.state_dir.is_none() {
            tracing::warn!(
                event = "no_state_dir",
                "API keys made at run time and usage counts live in memory only: \
                set state_dir (or [cluster] redis) to keep them across restarts"
            );
        }
        Self {
            responses,
            keys,
            usage,
            config,
            policies,
            engines,
            admission,
            video,
            diffusion,
            cluster,
            fleet,
            id_prefix,
            draining: std::sync::atomic::AtomicBool::new(false),
            next_id: AtomicU64::new(0),
        }
    }
}

/// Who carries out capacity decisions: the embedded mode's supervisor (with
/// `--min-engines/--max-engines` bounds), or nobody (exported only).
#[derive(Debug, Clone, Default)]
pub struct Control {
    pub supervisor: Option<Arc<Supervisor>>,
    pub bounds: Option<(u32, u32)>,
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
    #[error("starting the connection workers: {0}")]
    Workers(std::io::Error),
    #[error("cluster: {0}")]
    PolicyKey(String),
    #[error("cluster.redis: {0}")]
    RedisUrl(String),
    #[error("no engine became ready within {0:?}")]
    EnginesNotReady(Duration),
    #[error("no engines configured: add [[engines]] to the config, give --redis to discover them, or use `gateway up`")]
    NoEngines,
}

/// A policy document read at start: the document, its text, and the file
/// it came from (`None`: the bundled default).
#[derive(Debug)]
pub struct Loaded {
    pub doc: PolicyDocument,
    pub text: String,
    pub file: Option<PathBuf>,
}

/// Reads the policy document. Only the embedded development mode
/// (`bundled_ok`: `gateway up`) falls back to the bundled default, with its
/// public demo keys, when the default path does not exist (running outside
/// the repository); a production gateway without its policy file fails.
pub fn load_policies(path: &Path, bundled_ok: bool) -> Result<Loaded, StartError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let doc = PolicyDocument::parse(&path.display().to_string(), &text)?;
            Ok(Loaded { doc, text, file: Some(path.to_path_buf()) })
        }
        Err(e)
            if bundled_ok
                && e.kind() == std::io::ErrorKind::NotFound
                && path == Path::new("policies/default.toml") =>
        {
            let doc = PolicyDocument::parse("bundled policies/default.toml", DEFAULT_POLICIES)?;
            Ok(Loaded { doc, text: DEFAULT_POLICIES.to_string(), file: None })
        }
        Err(e) => Err(StartError::ReadPolicies(path.to_path_buf(), e)),
    }
}

/// The admin tokens from the config, or (`gateway up` only, when the config
/// names none) the development token in the certificates directory.
fn admin_tokens(config: &GatewayConfig, dev_dir: Option<&Path>) -> Result<Vec<admin::Token>, StartError> {
    let mut tokens = Vec::new();
    for t in &config.admin.tokens {
        tokens.push(admin::Token::new(t.id.clone(), t.secret()?));
    }
    if let (true, Some(dir)) = (tokens.is_empty(), dev_dir) {
        let (path, secret) = certs::dev_admin_token(dir)?;
        println!("admin token `dev` in {}", path.display());
        tokens.push(admin::Token::new("dev".into(), secret));
    }
    Ok(tokens)
}

/// What `gateway up` needs beyond the gateway config.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub launch: EngineLaunch,
    /// Where the dev PKI lives (generated on first run).
    pub certs_dir: PathBuf,
    /// `--min-engines`/`--max-engines`: autoscale the primary engines
    /// between these (starting from `launch.count`).
    pub bounds: Option<(u32, u32)>,
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
    let policy = load_policies(&config.policies, true)?;
    let tokens = admin_tokens(&config, Some(&opts.certs_dir))?;
    let tls = tls::server_config(&config.tls.cert, &config.tls.key)?;
    let mut launch = opts.launch.clone();
    let token = match config.engine_token()? {
        Some(t) => t,
        None => certs::dev_engine_token(&opts.certs_dir)?.1,
    };
    launch.secrets.api_token = Some(token.clone());
    launch.secrets.redis_url = config.cluster.redis.clone();
    if config.cluster.redis.is_some()
        && config.cluster.policy_key_file.is_none()
        && std::env::var_os(cluster::signing::KEY_ENV).is_none()
    {
        // The development fleet signs its policies with a key beside the
        // dev certificates; gateways started beside it use the same file.
        config.cluster.policy_key_file = Some(certs::dev_policy_key(&opts.certs_dir)?.0);
    }
    let sup = Supervisor::start(&launch).await?;
    for (id, pid, url) in sup.running() {
        let url = url.trim_end_matches('/');
        println!("engine {id} pid={pid} url={url} backend={}", opts.launch.backend.as_str());
    }
    if let Some((min, max)) = opts.bounds {
        println!("autoscaling engines between {min} and {max} (warm pool, restarts, drain on scale-in)");
    }
    config.engines.extend(sup.specs());
    let control = Control { supervisor: Some(Arc::clone(&sup)), bounds: opts.bounds };
    let result =
        serve_until_signal(config, Some(token), policy, tls, tokens, Some(&pki.ca_cert), control).await;
    sup.shutdown().await;
    result
}

/// Runs a standalone gateway over the engines named in its config.
pub async fn run_serve(config: GatewayConfig) -> Result<(), StartError> {
    if config.engines.is_empty() && config.cluster.redis.is_none() {
        return Err(StartError::NoEngines);
    }
    let policy = load_policies(&config.policies, false)?;
    let tokens = admin_tokens(&config, None)?;
    let tls = tls::server_config(&config.tls.cert, &config.tls.key)?;
    let engine_token = config.engine_token()?;
    serve_until_signal(config, engine_token, policy, tls, tokens, None, Control::default()).await
}

async fn serve_until_signal(
    config: GatewayConfig,
    engine_token: Option<String>,
    policy: Loaded,
    tls: Arc<rustls::ServerConfig>,
    admin_tokens: Vec<admin::Token>,
    ca: Option<&Path>,
    control: Control,
) -> Result<(), StartError> {
    metrics::handle(); // install the recorder before the first metric
    if let Some(url) = &config.cluster.redis {
        fleet_redis::Target::parse(url).map_err(StartError::RedisUrl)?;
    }
    let policy_key = config.cluster.policy_key().map_err(StartError::PolicyKey)?;
    if config.cluster.redis.is_some() && policy_key.is_none() {
        tracing::warn!(
            event = "policy_convergence_off",
            why = "no cluster.policy_key_file or GATEWAY_POLICY_KEY"
        );
    }
    let pool = EnginePool::new(config.engines.clone(), &config.limits, engine_token.as_deref());
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
    // The background loops: owned here, stopped and joined on shutdown.
    let mut background = tokio::task::JoinSet::new();
    background.spawn(Arc::clone(&pool).poll_forever());
    if let Some(sup) = &control.supervisor {
        sup.attach(Arc::clone(&pool)); // restarts and new engines join the pool
    }
    hints::push_all(&pool, &policy.doc.engine_hints()).await; // before the first request
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.map_err(|e| StartError::Bind(config.listen, e))?;
    let addr = listener.local_addr().map_err(|e| StartError::Bind(config.listen, e))?;
    let ready = pool.ready_count();
    let total = pool.len();
    let admin_cfg = config.admin.clone();
    let store = Arc::new(PolicyStore::with_write_through(
        policy.doc,
        &policy.text,
        policy.file,
        admin_cfg.audit_log.clone(),
        admin_cfg.write_through,
    ));
    let app = Arc::new(App::new(config, Arc::clone(&store), pool, policy_key, control));
    background.spawn(Arc::clone(&app.fleet).run(Arc::clone(&store), Arc::clone(&app.cluster)));
    background.spawn(Arc::clone(&app.admission).run(store.subscribe()));
    background.spawn(hints::follow(Arc::clone(&app.engines), store.subscribe()));
    background.spawn(video::control::run(
        Arc::clone(&app.video),
        Arc::clone(&store),
        Arc::clone(&app.cluster),
    ));
    background.spawn(video::adopt::run(Arc::clone(&app.video), Arc::clone(&store)));
    background.spawn(cluster::sync::run(
        Arc::clone(&app.cluster),
        Arc::clone(&app.engines),
        Arc::clone(&store),
    ));
    background.spawn(policy_watch::on_sighup(Arc::clone(&store)));
    background.spawn(usage::run(Arc::clone(&app)));
    if admin_cfg.watch {
        let interval = Duration::from_millis(admin_cfg.watch_interval_ms);
        let debounce = Duration::from_millis(admin_cfg.debounce_ms);
        background.spawn(policy_watch::watch_file(Arc::clone(&store), interval, debounce));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin_listener = tokio::net::TcpListener::bind(admin_cfg.listen)
        .await
        .map_err(|e| StartError::Bind(admin_cfg.listen, e))?;
    let admin_addr = admin_listener.local_addr().map_err(|e| StartError::Bind(admin_cfg.listen, e))?;
    if admin_tokens.is_empty() {
        println!("admin listening on https://{admin_addr} (metrics only: no [admin] tokens configured)");
    } else {
        println!("admin listening on https://{admin_addr} (metrics; admin API with a bearer admin token)");
    }
    let admin = Arc::new(admin::Admin { app: Arc::clone(&app), tokens: admin_tokens });
    let admin_handler = move |req| admin::handle(Arc::clone(&admin), req);
    let admin_tls = Arc::clone(&tls);
    let admin_limits = server::ListenerLimits::admin(&app.config.limits);
    let admin_task = tokio::spawn(async move {
        let mut stop = stop_rx;
        server::serve(admin_handler, admin_listener, Some(admin_tls), admin_limits, None, async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    });
    let plaintext = match app.config.plaintext_listen {
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at).await.map_err(|e| StartError::Bind(at, e))?;
            let plain_addr = l.local_addr().map_err(|e| StartError::Bind(at, e))?;
            if !plain_addr.ip().is_loopback() {
                tracing::warn!(event = "plaintext_listener", addr = %plain_addr, "API keys cross this listener unencrypted: put it behind a TLS-terminating load balancer only");
            }
            println!("gateway listening on http://{plain_addr} (plaintext: HTTP/1.1 and h2c)");
            Some(l)
        }
        None => None,
    };
    let signal = shutdown_signal();
    println!("gateway listening on https://{addr} (HTTP/2 and HTTP/1.1 over TLS)");
    println!("ready: {ready}/{total} engines");
    if let Some(ca) = ca {
        print_example(addr, ca);
    }
    tracing::info!(event = "gateway_ready", %addr, ready, total, policy_version = %store.current().version);
    let public = stack::public(Arc::clone(&app));
    let handler = move |req| tower::ServiceExt::oneshot(public.clone(), req);
    let public_limits = server::ListenerLimits::public(&app.config.limits);
    let plain_limits = server::ListenerLimits::plaintext(&app.config.limits);
    let workers = workers::Workers::start(app.config.limits.workers()).map_err(StartError::Workers)?;
    // Both public listeners stop on the one signal.
    let (quit_tx, quit_rx) = tokio::sync::watch::channel(false);
    let quit = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|q| *q).await;
    };
    let plain = async {
        if let Some(l) = plaintext {
            server::serve(handler.clone(), l, None, plain_limits, Some(&workers), quit(quit_rx.clone()))
                .await;
        }
    };
    let public = server::serve(
        handler.clone(),
        listener,
        Some(tls),
        public_limits,
        Some(&workers),
        quit(quit_rx.clone()),
    );
    tokio::join!(public, plain, async {
        if signal.await == Stop::Terminate {
            // Out of rotation first: balancers probing /readyz stop sending
            // while connections are still accepted and served.
            app.draining.store(true, std::sync::atomic::Ordering::Relaxed);
            let grace = std::time::Duration::from_millis(app.config.limits.shutdown_grace_ms);
            tracing::info!(event = "gateway_draining", grace_ms = grace.as_millis() as u64);
            tokio::time::sleep(grace).await;
        }
        let _ = quit_tx.send(true);
    });
    drop(workers); // joins the worker threads
    let _ = stop_tx.send(true);
    let _ = admin_task.await;
    // Loops, not work: stopping them at an await point loses nothing.
    background.shutdown().await;
    // What the last second counted: to Redis, or to the state file.
    usage::sync_usage(&app).await;
    app.usage.save();
    tracing::info!(event = "gateway_stopped");
    Ok(())
}

/// Which stop was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGINT: an interactive stop, at once.
    Interrupt,
    /// SIGTERM: an orchestrator's, after the drain grace.
    Terminate,
}

/// Resolves on SIGINT or SIGTERM; the handlers are installed by this call,
/// so a signal that arrives before the future is polled is not lost.
fn shutdown_signal() -> impl std::future::Future<Output = Stop> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    async move {
        tokio::select! {
            _ = int.recv() => Stop::Interrupt,
            _ = term.recv() => Stop::Terminate,
        }
    }
}

fn print_example(addr: std::net::SocketAddr, ca: &Path) {
    let host = if addr.ip().is_loopback() { format!("localhost:{}", addr.port()) } else { addr.to_string() };
    println!("try:");
    println!(
        "  curl --http2 --cacert {} https://{host}/v1/chat/completions \\\n    -H 'Authorization: Bearer sk-demo-gold' -H 'Content-Type: application/json' \\\n    -d '{{\"model\":\"synthetic-small\",\"stream\":true,\"max_tokens\":16,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'",
        ca.display()
    );
}
