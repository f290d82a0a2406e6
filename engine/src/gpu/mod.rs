//! The GPU backend: the engine's two synthetic models written against
//! [`kernels::Device`], so the same code runs on an NVIDIA GPU ([`cuda`],
//! the `cuda` feature) and, in tests, on the host emulator of the kernels
//! (`kernel-emu`), where it is checked against the cpu backend.
//!
//! - [`lm`]: the language model with a paged K/V cache on the device;
//! - [`video`]: the chunked video model, a coalesced batch of chunks per
//!   launch sequence;
//! - [`offload`]: session state to and from pinned host memory on the
//!   copy stream;
//! - [`check`]: the comparisons against the cpu backend (tests, and
//!   `engine gpu-check` on a GPU machine);
//! - [`bench`]: the GPU benchmarks (`engine gpu-bench`).

pub mod bench;
pub mod check;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dit;
pub mod lm;
pub mod offload;
pub mod video;

/// A GPU the probe found.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub memory_bytes: usize,
}

/// The first GPU, or why there is none.
#[cfg(feature = "cuda")]
pub fn probe() -> Result<GpuInfo, String> {
    cuda::probe()
}

/// The first GPU, or why there is none.
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<GpuInfo, String> {
    Err(NO_CUDA.into())
}

/// What every GPU entry point says in an engine built without the feature.
#[cfg(not(feature = "cuda"))]
const NO_CUDA: &str =
    "this engine was built without the `cuda` feature (build with `--features engine/cuda`)";

/// Device 0, kernels compiled. Probed first: without a loadable driver
/// the CUDA bindings would panic rather than answer an error.
#[cfg(feature = "cuda")]
fn open_device() -> Result<std::sync::Arc<cuda::CudaDevice>, String> {
    probe()?;
    cuda::CudaDevice::open(0).map(std::sync::Arc::new).map_err(|e| e.to_string())
}

/// `model`'s weights on `dev`, warmed up by one chunk.
#[cfg(feature = "cuda")]
fn warm_video(
    dev: &std::sync::Arc<cuda::CudaDevice>,
    model: &crate::video::model::VideoModel,
) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    let gpu = video::GpuVideo::new(std::sync::Arc::clone(dev), model).map_err(|e| e.to_string())?;
    video::warm_up(&gpu, model).map_err(|e| e.to_string())?;
    Ok(std::sync::Arc::new(gpu))
}

/// Everything the cuda backend runs on one GPU: the LM scheduler's
/// backend, the video runner and the diffusion jobs' runner (the same
/// kernels over the diffusion model's weights).
pub type CudaParts<L> = (L, std::sync::Arc<dyn video::VideoRunner>, std::sync::Arc<dyn video::VideoRunner>);

/// The cuda backend's parts on one GPU. Compiles the kernels (NVRTC),
/// uploads every model's weights and runs one video chunk of each video
/// model to warm up; the engine is not ready before this returns.
///
/// `profile_class` is the engine class of the latency profile admission
/// will predict with; a profile measured on another GPU model is logged
/// (`profile_other_gpu`), since its times then stand in for this one's.
#[cfg(feature = "cuda")]
pub fn start_cuda(
    cfg: crate::backend::cpu::ModelConfig,
    pages: u32,
    page_tokens: u32,
    video_seed: u64,
    profile_class: &str,
) -> Result<CudaParts<lm::GpuBackend<cuda::CudaDevice>>, String> {
    use std::sync::Arc;
    let started = crate::clock::now();
    let dev = open_device()?;
    let compiled_ms = crate::clock::since(started).as_secs_f64() * 1e3;
    let lm = lm::GpuLm::new(Arc::clone(&dev), cfg, pages, page_tokens).map_err(|e| e.to_string())?;
    let video = warm_video(&dev, &crate::video::model::VideoModel::new(video_seed))?;
    let diffusion = warm_video(&dev, &crate::diffusion::model(video_seed))?;
    tracing::info!(
        event = "gpu_ready",
        device = %kernels::Device::name(&*dev),
        nvrtc_compile_ms = compiled_ms,
        ready_ms = crate::clock::since(started).as_secs_f64() * 1e3
    );
    let device = kernels::Device::name(&*dev);
    if !profile_fits_gpu(profile_class, &device) {
        tracing::warn!(
            event = "profile_other_gpu",
            profile_class,
            device = %device,
            "the latency profile was measured on another GPU model; admission predicts with its times \
             (run `engine profile --backend cuda` on this GPU and pass it with --profile)"
        );
    }
    Ok((lm::GpuBackend { lm }, video, diffusion))
}

/// The LM alone on the first GPU (for `engine profile --backend cuda`),
/// and the device's name.
#[cfg(feature = "cuda")]
pub fn open_lm(
    cfg: crate::backend::cpu::ModelConfig,
    pages: u32,
    page_tokens: u32,
) -> Result<(lm::GpuBackend<cuda::CudaDevice>, String), String> {
    let dev = open_device()?;
    let name = kernels::Device::name(&*dev);
    let lm = lm::GpuLm::new(dev, cfg, pages, page_tokens).map_err(|e| e.to_string())?;
    Ok((lm::GpuBackend { lm }, name))
}

/// Without the `cuda` feature there is no GPU to profile.
#[cfg(not(feature = "cuda"))]
pub fn open_lm(
    _cfg: crate::backend::cpu::ModelConfig,
    _pages: u32,
    _page_tokens: u32,
) -> Result<(crate::backend::cpu::Cpu, String), String> {
    Err(NO_CUDA.into())
}

/// Without the `cuda` feature there is no cuda backend.
#[cfg(not(feature = "cuda"))]
pub fn start_cuda(
    _cfg: crate::backend::cpu::ModelConfig,
    _pages: u32,
    _page_tokens: u32,
    _video_seed: u64,
    _profile_class: &str,
) -> Result<CudaParts<crate::backend::cpu::Cpu>, String> {
    Err(NO_CUDA.into())
}

/// Whether a cuda profile of `engine_class` was measured on a GPU named
/// `device`: `engine profile --backend cuda` names its class `cuda-` and
/// the device's name in lowercase with dashes (`NVIDIA H200` →
/// `cuda-nvidia-h200`); a class that is a prefix of this device's (one
/// measured on `NVIDIA H100` serves `NVIDIA H100 80GB HBM3`) fits too.
pub fn profile_fits_gpu(engine_class: &str, device: &str) -> bool {
    let slug: String = device.trim().to_lowercase().split_whitespace().collect::<Vec<_>>().join("-");
    let Some(measured) = engine_class.strip_prefix("cuda-") else { return false };
    slug == measured || slug.starts_with(&format!("{measured}-"))
}

/// `engine gpu-check`: every comparison of [`check`] on the first GPU,
/// printed one per line; true when all are within tolerance.
#[cfg(feature = "cuda")]
pub fn run_check() -> Result<bool, String> {
    use std::sync::Arc;
    let info = probe()?;
    eprintln!(
        "device: {} (compute capability {}.{})",
        info.name, info.compute_capability.0, info.compute_capability.1
    );
    let dev = open_device()?;
    let tol = check::Tolerances::GPU;
    let lm = crate::backend::cpu::ModelConfig {
        layers: 4,
        hidden: 512,
        heads: 8,
        ffn: 1536,
        vocab: 8192,
        seed: 0,
    };
    let video = |res, frames, chunks| check::video_vs_cpu(Arc::clone(&dev), tol, res, frames, chunks);
    let results = [
        ("video, tiny", video(crate::video::Resolution::Tiny, 3, 4)),
        ("video, small", video(crate::video::Resolution::Small, 2, 3)),
        ("lm", check::lm_vs_cpu(Arc::clone(&dev), tol, lm, 16)),
        ("lm, cached prefix", check::lm_prefix_reuse(Arc::clone(&dev), tol, lm, 8)),
        ("offload", check::offload_round_trip(Arc::clone(&dev))),
        ("diffusion", check::diffusion_vs_cpu(Arc::clone(&dev), tol)),
        // One member over a full W7 window of the 1.3B DiT (42,120 keys).
        ("dit", check::dit_vs_reference(Arc::clone(&dev), Some(42_120))),
    ];
    let mut failed = Vec::new();
    for (what, result) in results {
        failed.extend(check::report(&result.map_err(|e| format!("{what}: {e}"))?));
    }
    Ok(failed.is_empty())
}

/// `engine gpu-bench`: every benchmark of [`bench`] on the first GPU, as a
/// markdown table on standard output (progress on standard error).
#[cfg(feature = "cuda")]
pub fn run_bench(args: &bench::BenchArgs) -> Result<(), String> {
    let info = probe()?;
    let dev = open_device()?;
    let results =
        bench::run(dev, args, |m| eprintln!("{:<48} {:>12.3} {:<13} {}", m.name, m.value, m.unit, m.note))
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
    Err(NO_CUDA.into())
}

/// Without the `cuda` feature there is nothing to measure.
#[cfg(not(feature = "cuda"))]
pub fn run_bench(_args: &bench::BenchArgs) -> Result<(), String> {
    Err(NO_CUDA.into())
}

/// The video model alone on the first GPU (for `engine profile --video
/// --backend cuda`).
#[cfg(feature = "cuda")]
pub fn open_video(seed: u64) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    warm_video(&open_device()?, &crate::video::model::VideoModel::new(seed))
}

/// The diffusion model alone on the first GPU (for `engine profile
/// --diffusion --backend cuda`).
#[cfg(feature = "cuda")]
pub fn open_diffusion(seed: u64) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    warm_video(&open_device()?, &crate::diffusion::model(seed))
}

/// Without the `cuda` feature there is no GPU to profile.
#[cfg(not(feature = "cuda"))]
pub fn open_diffusion(_seed: u64) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    Err(NO_CUDA.into())
}

/// Without the `cuda` feature there is no GPU to profile.
#[cfg(not(feature = "cuda"))]
pub fn open_video(_seed: u64) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    Err(NO_CUDA.into())
}

#[cfg(test)]
mod tests {
    use super::profile_fits_gpu;

    #[test]
    fn a_profile_fits_the_gpu_it_was_measured_on_and_no_other() {
        // The bundled profile's class, and the names nvidia-smi gives.
        assert!(profile_fits_gpu("cuda-nvidia-h200", "NVIDIA H200"));
        assert!(profile_fits_gpu("cuda-nvidia-h100", "NVIDIA H100 80GB HBM3"));
        assert!(profile_fits_gpu("cuda-nvidia-h100-80gb-hbm3", " NVIDIA H100 80GB HBM3 "));
        // Another model, a name that only starts alike, another backend.
        assert!(!profile_fits_gpu("cuda-nvidia-h200", "NVIDIA H100 80GB HBM3"));
        assert!(!profile_fits_gpu("cuda-nvidia-h10", "NVIDIA H100 80GB HBM3"));
        assert!(!profile_fits_gpu("emulated-a100", "NVIDIA A100-SXM4-80GB"));
    }
}
