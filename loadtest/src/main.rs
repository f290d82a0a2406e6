//! `loadtest`: measure the gateway. See `loadtest --help`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "loadtest", version, about = "Load and latency measurements for the SLO-aware gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Gateway overhead: the same requests through the gateway and straight
    /// to the engine, interleaved; prints added latency and TBT difference.
    Overhead(loadtest::overhead::OverheadArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Overhead(args) => match loadtest::overhead::run(&args).await {
            Ok(report) => {
                print_overhead(&report);
                if let Some(path) = &args.out {
                    let json = serde_json::to_string_pretty(&report).expect("reports serialise");
                    if let Err(e) = std::fs::write(path, json) {
                        eprintln!("loadtest: writing {}: {e}", path.display());
                        return std::process::ExitCode::FAILURE;
                    }
                }
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loadtest: {e}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

fn print_overhead(r: &loadtest::overhead::OverheadReport) {
    let row = |name: &str, s: &loadtest::stats::Summary| {
        println!("{name:<28} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>9.3}", s.count, s.p50, s.p90, s.p99, s.max)
    };
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9}", "milliseconds", "n", "p50", "p90", "p99", "max");
    row("non-streaming via gateway", &r.nonstream_gateway_ms);
    row("non-streaming direct", &r.nonstream_direct_ms);
    row("TBT via gateway", &r.tbt_gateway_ms);
    row("TBT direct", &r.tbt_direct_ms);
    println!("added latency: p50 {:+.3} ms, p99 {:+.3} ms", r.added_p50_ms, r.added_p99_ms);
    println!("TBT difference: p50 {:+.3} ms, p99 {:+.3} ms", r.tbt_diff_p50_ms, r.tbt_diff_p99_ms);
}
