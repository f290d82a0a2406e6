//! `gateway`: the SLO-aware HTTPS gateway, its embedded single-node mode,
//! and its tools.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gateway::config::GatewayConfig;
use gateway::supervisor::EngineLaunch;

// mimalloc, unless built with `--features system-alloc` (the C library's
// malloc, which heap profilers such as heaptrack see).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "gateway", version, about = "SLO-aware HTTP/2 gateway for generative-AI inference")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of the `up` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start the embedded single-node system: dev certificates (first run),
    /// N engine child processes and the gateway. Ctrl-C stops everything.
    Up {
        /// Public HTTPS address.
        #[arg(long, default_value = "127.0.0.1:8443")]
        listen: SocketAddr,
        /// Engine child processes to start with.
        #[arg(long, default_value_t = 2)]
        engines: usize,
        /// Autoscale the engines (policies::autoscale: warm pool, drain on
        /// scale-in) with at least this many serving; turns `[autoscale]`
        /// on whatever the policy says. Engines that exit are restarted
        /// either way.
        #[arg(long)]
        min_engines: Option<u32>,
        /// ... and at most this many engines in all (serving + warm).
        #[arg(long)]
        max_engines: Option<u32>,
        /// Engine backend.
        #[arg(long, default_value = "emulated",
              value_parser = clap::builder::PossibleValuesParser::new(engine_api::BACKENDS))]
        backend: String,
        /// Policy document (tiers, tenants, keys, models).
        #[arg(long, default_value = "policies/default.toml")]
        policies: PathBuf,
        /// Latency profile for emulated engines (bundled default if omitted).
        #[arg(long)]
        profile: Option<PathBuf>,
        /// Directory of the development PKI (created on first run).
        #[arg(long, default_value = "certs")]
        certs: PathBuf,
        /// Gateway config file (listener limits and so on); flags override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// A flag for every engine child, repeatable, e.g.
        /// `--engine-arg=--kv-pages=4096 --engine-arg=--max-batch=32`
        /// (`engine --help` lists them).
        #[arg(long = "engine-arg", allow_hyphen_values = true)]
        engine_args: Vec<String>,
        /// Also start this many engines of a second, faster class (ids o0,
        /// o1, …) with --overflow-profile: the class a tier's
        /// `overflow_class` names for the `faster_class` degradation.
        #[arg(long, default_value_t = 0, requires = "overflow_profile")]
        overflow_engines: usize,
        /// Latency profile of the overflow engines (its engine_class is the
        /// class name).
        #[arg(long)]
        overflow_profile: Option<PathBuf>,
        /// Admin API address (HTTPS, bearer token). Without `[admin]` tokens
        /// in --config, a development token is made in the certs directory
        /// (`certs/admin.token`, id `dev`).
        #[arg(long)]
        admin_listen: Option<SocketAddr>,
        /// Share cluster state with other gateways in this Redis
        /// (`redis://127.0.0.1:6379`); engines register there too.
        #[arg(long)]
        redis: Option<String>,
        /// Also serve the public API without TLS on this address (HTTP/1.1
        /// and h2c), for a gateway behind a TLS-terminating load balancer.
        /// Off unless given.
        #[arg(long)]
        plaintext_listen: Option<SocketAddr>,
        /// Keep the API keys made at run time and the usage counts in this
        /// directory (`keys.json`, `usage.json`) across restarts, when no
        /// Redis holds them.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Policy document tools.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Run the gateway alone, over the engines listed in its config file.
    Serve {
        /// Gateway config file with [tls] and [[engines]].
        #[arg(long)]
        config: PathBuf,
        /// Share cluster state with other gateways in this Redis, and
        /// discover the engines registered there.
        #[arg(long)]
        redis: Option<String>,
        /// Also serve the public API without TLS on this address (HTTP/1.1
        /// and h2c), for a gateway behind a TLS-terminating load balancer.
        /// Off unless given.
        #[arg(long)]
        plaintext_listen: Option<SocketAddr>,
        /// Keep the API keys made at run time and the usage counts in this
        /// directory (`keys.json`, `usage.json`) across restarts, when no
        /// Redis holds them.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Write a development CA (ca.pem) and a server certificate for
    /// localhost / 127.0.0.1 / ::1 (and each --san) signed by it.
    Certs {
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// Another name or IP address the server certificate covers (a
        /// development fleet's hosts); repeatable, at most 16.
        #[arg(long = "san", num_args = 1, action = clap::ArgAction::Append)]
        san: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate policy documents offline, as the gateway would on reload:
    /// prints `FILE: ok` with the version, or each error with its file,
    /// line, key path and what is wrong. Exits 1 if any file is invalid.
    Check {
        /// Policy documents (TOML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Runtime::new().expect("the tokio runtime starts");
    let result: Result<(), String> = rt.block_on(async {
        // Traces go out only when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is
        // set (docs/operations.md "Tracing"); the guard flushes at exit.
        let _traces = match telemetry::init("slo-gateway", &format!("gateway-{}", std::process::id())) {
            Ok(guard) => guard,
            Err(e) => return Err(format!("tracing: {e}")),
        };
        match Cli::parse().command {
            Command::Up {
                listen,
                engines,
                min_engines,
                max_engines,
                backend,
                policies,
                profile,
                certs,
                config,
                engine_args,
                overflow_engines,
                overflow_profile,
                admin_listen,
                redis,
                plaintext_listen,
                state_dir,
            } => {
                let mut cfg = GatewayConfig::load(config.as_deref()).map_err(|e| e.to_string())?;
                cfg.state_dir = state_dir.or(cfg.state_dir);
                cfg.listen = listen;
                cfg.policies = policies;
                if let Some(a) = admin_listen {
                    cfg.admin.listen = a;
                }
                cfg.plaintext_listen = plaintext_listen.or(cfg.plaintext_listen);
                if let Some(url) = redis {
                    cfg.cluster.redis = Some(url); // the children get it in their environment
                }
                let overflow =
                    overflow_profile.filter(|_| overflow_engines > 0).map(|p| (overflow_engines, p));
                let launch = EngineLaunch {
                    count: engines,
                    backend,
                    profile,
                    extra_args: engine_args,
                    overflow,
                    secrets: Default::default(),
                };
                let bounds = match (min_engines, max_engines) {
                    (None, None) => None,
                    (min, max) => {
                        let min = min.unwrap_or(1);
                        let max = max.unwrap_or((engines as u32).max(min));
                        if min == 0 || min > max {
                            return Err(format!("need 1 <= --min-engines ({min}) <= --max-engines ({max})"));
                        }
                        Some((min, max))
                    }
                };
                let opts = gateway::UpOptions { launch, certs_dir: certs, bounds };
                gateway::run_up(cfg, opts).await.map_err(|e| e.to_string())
            }
            Command::Serve { config, redis, plaintext_listen, state_dir } => {
                let mut cfg = GatewayConfig::load(Some(&config)).map_err(|e| e.to_string())?;
                cfg.state_dir = state_dir.or(cfg.state_dir);
                cfg.plaintext_listen = plaintext_listen.or(cfg.plaintext_listen);
                if redis.is_some() {
                    cfg.cluster.redis = redis;
                }
                gateway::run_serve(cfg).await.map_err(|e| e.to_string())
            }
            Command::Certs { out, san } => {
                if san.len() > 16 || san.iter().any(|n| n.is_empty() || n.len() > 253) {
                    return Err("--san: at most 16 names, each 1-253 bytes".into());
                }
                let pki = gateway::certs::generate_for(&out, &san).map_err(|e| e.to_string())?;
                println!(
                    "wrote {} (trust this), {} and {}",
                    pki.ca_cert.display(),
                    pki.server_cert.display(),
                    pki.server_key.display()
                );
                Ok(())
            }
            Command::Policy { command: PolicyCommand::Check { files } } => check_policies(&files),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `gateway policy check`: every file is checked; the first error of each
/// invalid one is printed.
fn check_policies(files: &[PathBuf]) -> Result<(), String> {
    let mut bad = 0;
    for path in files {
        let shown = path.display().to_string();
        let result = std::fs::read_to_string(path)
            .map_err(|e| format!("{shown}: {e}"))
            .and_then(|text| policies::PolicyDocument::parse(&shown, &text).map_err(|e| e.to_string()));
        match result {
            Ok(doc) => println!(
                "{shown}: ok (version {}; {} tiers, {} tenants, {} models)",
                doc.version,
                doc.tiers.len(),
                doc.tenants.len(),
                doc.models.len()
            ),
            Err(e) => {
                eprintln!("{e}");
                bad += 1;
            }
        }
    }
    match bad {
        0 => Ok(()),
        n => Err(format!("{n} of {} policy documents invalid", files.len())),
    }
}
