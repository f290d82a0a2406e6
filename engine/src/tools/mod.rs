//! The engine's offline tools, the top layer: `engine profile` (a latency
//! profile measured on a backend), `engine gpu-check` (the GPU models
//! against the cpu backend) and `engine gpu-bench` (the GPU benchmarks).

pub mod gpu_bench;
pub mod gpu_check;
pub mod profile;

use crate::gpu;

/// `engine gpu-check`: every comparison of [`gpu_check`] on the first GPU,
/// printed one per line; true when all are within tolerance.
#[cfg(feature = "cuda")]
pub fn run_check() -> Result<bool, String> {
    use std::sync::Arc;
    let info = gpu::probe()?;
    eprintln!(
        "device: {} (compute capability {}.{})",
        info.name, info.compute_capability.0, info.compute_capability.1
    );
    let dev = gpu::open_device()?;
    let tol = gpu_check::Tolerances::GPU;
    let lm =
        crate::models::lm::ModelConfig { layers: 4, hidden: 512, heads: 8, ffn: 1536, vocab: 8192, seed: 0 };
    let video = |res, frames, chunks| gpu_check::video_vs_cpu(Arc::clone(&dev), tol, res, frames, chunks);
    let results = [
        ("video, tiny", video(crate::models::video::Resolution::Tiny, 3, 4)),
        ("video, small", video(crate::models::video::Resolution::Small, 2, 3)),
        ("lm", gpu_check::lm_vs_cpu(Arc::clone(&dev), tol, lm, 16)),
        ("lm, cached prefix", gpu_check::lm_prefix_reuse(Arc::clone(&dev), tol, lm, 8)),
        ("offload", gpu_check::offload_round_trip(Arc::clone(&dev))),
        ("diffusion", gpu_check::diffusion_vs_cpu(Arc::clone(&dev), tol)),
        // One member over a full W7 window of the 1.3B DiT (42,120 keys).
        ("dit", gpu_check::dit_vs_reference(Arc::clone(&dev), Some(42_120))),
    ];
    let mut failed = Vec::new();
    for (what, result) in results {
        failed.extend(gpu_check::report(&result.map_err(|e| format!("{what}: {e}"))?));
    }
    Ok(failed.is_empty())
}

/// `engine gpu-bench`: every benchmark of [`gpu_bench`] on the first GPU, as a
/// markdown table on standard output (progress on standard error).
#[cfg(feature = "cuda")]
pub fn run_bench(args: &gpu_bench::BenchArgs) -> Result<(), String> {
    let info = gpu::probe()?;
    let dev = gpu::open_device()?;
    let results = gpu_bench::run(dev, args, |m| {
        eprintln!("{:<48} {:>12.3} {:<13} {}", m.name, m.value, m.unit, m.note)
    })
    .map_err(|e| e.to_string())?;
    println!(
        "Backend `cuda`, {} (compute capability {}.{}), `engine gpu-bench`:\n",
        info.name, info.compute_capability.0, info.compute_capability.1
    );
    println!("| measurement | value | unit | notes |\n|---|---:|---|---|");
    for m in results {
        println!("| {} | {:.3} | {} | {} |", m.name, m.value, m.unit, m.note);
    }
    Ok(())
}

/// Without the `cuda` feature there is nothing to check.
#[cfg(not(feature = "cuda"))]
pub fn run_check() -> Result<bool, String> {
    Err(gpu::NO_CUDA.into())
}

/// Without the `cuda` feature there is nothing to measure.
#[cfg(not(feature = "cuda"))]
pub fn run_bench(_args: &gpu_bench::BenchArgs) -> Result<(), String> {
    Err(gpu::NO_CUDA.into())
}
