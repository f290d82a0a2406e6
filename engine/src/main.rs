//! `engine`: one inference engine process (see the `engine` library docs).

use clap::Parser;

#[derive(Parser)]
#[command(name = "engine", version, about = "Inference engine process behind the SLO-aware gateway")]
struct Cli {
    #[command(flatten)]
    args: engine::cli::EngineArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match engine::run(Cli::parse().args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engine: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
