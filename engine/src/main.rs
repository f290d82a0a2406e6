//! `engine`: one inference engine process (see the `engine` library docs).
//!
//! `engine [FLAGS]` serves; `engine profile --backend <b> --out FILE`
//! measures the backend and writes a latency profile; `engine gpu-check`
//! and `engine gpu-bench` check and measure the cuda backend on a GPU.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "engine",
    version,
    about = "Inference engine process behind the SLO-aware gateway",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: engine::cli::EngineArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Measure prefill and decode timings of a backend and write a latency
    /// profile that `emulated` replays and the gateway's estimator loads.
    Profile(Box<engine::tools::profile::ProfileArgs>),
    /// Run both models on the GPU and on the cpu backend and compare their
    /// outputs within the documented tolerances (exit 1 when one is out).
    GpuCheck,
    /// Measure the GPU: dense bf16 GEMM rate, the video model's achieved
    /// rate, coalescing, pinned offload/restore bandwidth, LM decode.
    GpuBench(engine::tools::gpu_bench::BenchArgs),
    /// Write the DiT-shaped video model's profile from rates `engine
    /// gpu-bench` measured on a GPU (runs anywhere).
    DitProfile(engine::gpu::dit::ModelledProfileArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Profile(p)) if p.diffusion => engine::tools::profile::run_diffusion(&p)
            .map(|()| eprintln!("wrote {} (diffusion profile)", p.out.display())),
        Some(Command::Profile(p)) if p.video => engine::tools::profile::run_video(&p).map(|n| {
            eprintln!("wrote {} ({n} video configurations)", p.out.display());
        }),
        Some(Command::Profile(p)) => engine::tools::profile::run(&p).map(|m| {
            eprintln!(
                "wrote {} ({} prefill points, {} decode points, {:.4} ms per 1k context)",
                p.out.display(),
                m.prefill.len(),
                m.decode.len(),
                m.ms_per_1k_context
            );
        }),
        Some(Command::GpuCheck) => match engine::tools::run_check() {
            Ok(true) => Ok(()),
            Ok(false) => Err(engine::StartError::Gpu("some GPU results are outside tolerance".into()).into()),
            Err(e) => Err(engine::StartError::Gpu(e).into()),
        },
        Some(Command::GpuBench(b)) => {
            engine::tools::run_bench(&b).map_err(|e| engine::StartError::Gpu(e).into())
        }
        Some(Command::DitProfile(a)) => engine::gpu::dit::modelled_profile(&a)
            .and_then(|text| std::fs::write(&a.out, text).map_err(|e| format!("{}: {e}", a.out.display())))
            .map(|()| eprintln!("wrote {}", a.out.display()))
            .map_err(|e| engine::StartError::Gpu(e).into()),
        None => match tokio::runtime::Runtime::new() {
            Ok(rt) => rt.block_on(serve(cli.args)).map_err(Into::into),
            Err(e) => {
                eprintln!("engine: starting the runtime: {e}");
                return std::process::ExitCode::FAILURE;
            }
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engine: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Serves until stopped, exporting the spans of the sequences the gateway
/// traces (OTEL_* as the gateway's: `gateway up` passes its environment on).
async fn serve(args: engine::cli::EngineArgs) -> Result<(), engine::StartError> {
    let _traces = telemetry::init("slo-engine", &args.id).map_err(engine::StartError::Tracing)?;
    engine::run(args).await
}
