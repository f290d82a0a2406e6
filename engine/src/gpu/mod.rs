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
//! - [`dit`]: the DiT-shaped video model.
//!
//! Below the backends: the cuda backend (`backend::cuda`) drives [`lm`],
//! the video and diffusion schedulers drive [`video`]'s runner, and the
//! offline tools (`tools::gpu_check`, `tools::gpu_bench`) compare and
//! time them.

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
pub(crate) const NO_CUDA: &str =
    "this engine was built without the `cuda` feature (build with `--features engine/cuda`)";

/// Device 0, kernels compiled. Probed first: without a loadable driver
/// the CUDA bindings would panic rather than answer an error.
#[cfg(feature = "cuda")]
pub(crate) fn open_device() -> Result<std::sync::Arc<cuda::CudaDevice>, String> {
    probe()?;
    cuda::CudaDevice::open(0).map(std::sync::Arc::new).map_err(|e| e.to_string())
}

/// `model`'s weights on `dev`, warmed up by one chunk.
#[cfg(feature = "cuda")]
pub(crate) fn warm_video(
    dev: &std::sync::Arc<cuda::CudaDevice>,
    model: &crate::models::video::VideoModel,
) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    let gpu = video::GpuVideo::new(std::sync::Arc::clone(dev), model).map_err(|e| e.to_string())?;
    video::warm_up(&gpu, model).map_err(|e| e.to_string())?;
    Ok(std::sync::Arc::new(gpu))
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

/// The video model alone on the first GPU (for `engine profile --video
/// --backend cuda`).
#[cfg(feature = "cuda")]
pub fn open_video(seed: u64) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    warm_video(&open_device()?, &crate::models::video::VideoModel::new(seed))
}

/// The diffusion model alone on the first GPU (for `engine profile
/// --diffusion --backend cuda`).
#[cfg(feature = "cuda")]
pub fn open_diffusion(seed: u64) -> Result<std::sync::Arc<dyn video::VideoRunner>, String> {
    warm_video(&open_device()?, &crate::models::video::diffusion_model(seed))
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
