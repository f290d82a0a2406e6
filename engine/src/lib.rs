//! An inference engine process: one per GPU (or emulated GPU).
//!
//! Owns the internal HTTP/2 API ([`api`], [`server`]), the generation loop
//! ([`generate`]), load and KV-page accounting ([`load`]) and the execution
//! backends ([`backend`]). The gateway talks to it only over the network,
//! except that it reuses [`api`] types and [`cli`] options so the wire format
//! and the child-process flags have one definition.

pub mod api;
pub mod backend;
pub mod body;
pub mod cli;
pub mod generate;
pub mod kv;
pub mod load;
pub mod server;
pub mod stop;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use policies::LatencyProfile;
use tokio::io::AsyncReadExt;

use crate::backend::BackendKind;
use crate::cli::EngineArgs;
use crate::load::Load;

/// The bundled default latency profile.
pub const DEFAULT_PROFILE: &str = include_str!("../../policies/profiles/emulated-a100-8b.toml");

/// One engine's shared state.
#[derive(Debug)]
pub struct Engine {
    pub id: String,
    pub backend: BackendKind,
    pub profile: LatencyProfile,
    pub load: Arc<Load>,
    ready: AtomicBool,
    draining: AtomicBool,
    /// Origin of the times fed to the KV slope (the allocator takes time as
    /// a parameter).
    started: std::time::Instant,
}

impl Engine {
    pub fn new(id: String, backend: BackendKind, profile: LatencyProfile, load: Load) -> Self {
        Self {
            id,
            backend,
            profile,
            load: Arc::new(load),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            started: std::time::Instant::now(),
        }
    }

    /// Ready and not draining.
    pub fn accepting(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.draining.load(Ordering::SeqCst)
    }

    pub fn load_report(&self) -> api::LoadReport {
        self.load.sample_kv(self.started.elapsed().as_secs_f64());
        let s = self.load.snapshot();
        api::LoadReport {
            engine_id: self.id.clone(),
            backend: self.backend.as_str().to_string(),
            engine_class: self.profile.engine_class.clone(),
            ready: self.accepting(),
            draining: self.draining.load(Ordering::SeqCst),
            queued_sequences: 0,
            queued_tokens: 0,
            inflight_sequences: s.inflight_sequences,
            inflight_tokens: s.inflight_tokens,
            kv_pages_free: s.kv.free,
            kv_pages_total: s.kv.total,
            kv_admitting: s.kv.admitting,
            kv_consumption_pages_per_s: s.kv.slope,
            decode_step_ms: s.decode_step_ms,
        }
    }
}

/// Errors starting an engine.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("reading profile {0}: {1}")]
    ReadProfile(String, std::io::Error),
    #[error(transparent)]
    Profile(#[from] policies::profile::ProfileError),
    #[error("binding {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
}

/// Runs an engine until SIGINT/SIGTERM (or stdin EOF with
/// `--exit-on-stdin-eof`). Prints one ready line on stdout once it accepts
/// work: `engine ready id=<id> listen=<addr> backend=<backend>`; supervisors
/// parse `listen=` from it.
pub async fn run(args: EngineArgs) -> Result<(), StartError> {
    let (name, text) = match &args.profile {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| StartError::ReadProfile(p.display().to_string(), e))?;
            (p.display().to_string(), text)
        }
        None => ("bundled emulated-a100-8b.toml".to_string(), DEFAULT_PROFILE.to_string()),
    };
    let profile = LatencyProfile::parse(&name, &text)?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.map_err(|e| StartError::Bind(args.listen, e))?;
    let addr = listener.local_addr().map_err(|e| StartError::Bind(args.listen, e))?;
    let engine = Arc::new(Engine::new(
        args.id.clone(),
        args.backend,
        profile,
        Load::new(args.kv_config(), args.reserve_policy()),
    ));
    // Emulated warm-up is loading the profile; real backends compile kernels
    // and run a warm-up batch before this point.
    engine.ready.store(true, Ordering::SeqCst);
    println!("engine ready id={} listen={} backend={}", engine.id, addr, engine.backend.as_str());
    tracing::info!(event = "engine_ready", id = %engine.id, %addr, backend = engine.backend.as_str(), class = %engine.profile.engine_class);
    server::serve(engine, listener, shutdown_signal(args.exit_on_stdin_eof)).await;
    Ok(())
}

/// Resolves on SIGINT, SIGTERM, or (when asked) standard input closing.
pub async fn shutdown_signal(watch_stdin: bool) {
    let stdin_closed = async {
        if watch_stdin {
            let mut buf = [0u8; 64];
            let mut stdin = tokio::io::stdin();
            while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        } else {
            std::future::pending::<()>().await;
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler installs");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        () = stdin_closed => {}
    }
}
