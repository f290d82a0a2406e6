//! The cuda backend: the LM of [`crate::gpu::lm`] as the scheduler's
//! [`Backend`] (the same sampling as the cpu backend: [`run_step`] over the
//! device's logits), and everything the engine runs on one GPU at start.
//! Without the `cuda` feature its entry points say so.

use std::time::Duration;

use kernels::Device;

use super::cpu::{run_step, CpuSeq};
use super::{Backend, BackendKind, Slot};
use crate::api::GenerateRequest;
use crate::gpu;
#[cfg(feature = "cuda")]
use crate::gpu::cuda;
use crate::gpu::lm::GpuLm;
use crate::gpu::video::VideoRunner;

/// The LM as an engine backend: the scheduler's batches run on the device.
pub struct GpuBackend<D: Device> {
    pub lm: GpuLm<D>,
}

impl<D: Device> Backend for GpuBackend<D> {
    type Seq = CpuSeq;

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn start(&mut self, req: &GenerateRequest, prompt_tokens: u32) -> CpuSeq {
        CpuSeq::start(req, prompt_tokens, self.lm.cfg.vocab as u32)
    }

    fn prefill(&mut self, batch: &mut [Slot<'_, CpuSeq>]) -> Duration {
        run_step(batch, false, self.lm.page_tokens, |inputs| self.lm.forward(inputs));
        Duration::ZERO
    }

    fn decode(&mut self, batch: &mut [Slot<'_, CpuSeq>]) -> Duration {
        run_step(batch, true, self.lm.page_tokens, |inputs| self.lm.forward(inputs));
        Duration::ZERO
    }

    fn output_round_trips(&self) -> bool {
        true // one vocabulary word per token (`vocab::ROUND_TRIP_IDS`)
    }
}

/// Everything the cuda backend runs on one GPU: the LM scheduler's
/// backend, the video runner and the diffusion jobs' runner (the same
/// kernels over the diffusion model's weights).
pub type CudaParts<L> = (L, std::sync::Arc<dyn VideoRunner>, std::sync::Arc<dyn VideoRunner>);

/// The cuda backend's parts on one GPU. Compiles the kernels (NVRTC),
/// uploads every model's weights and runs one video chunk of each video
/// model to warm up; the engine is not ready before this returns.
///
/// `profile_class` is the engine class of the latency profile admission
/// will predict with; a profile measured on another GPU model is logged
/// (`profile_other_gpu`), since its times then stand in for this one's.
#[cfg(feature = "cuda")]
pub fn start_cuda(
    cfg: crate::models::lm::ModelConfig,
    pages: u32,
    page_tokens: u32,
    video_seed: u64,
    profile_class: &str,
) -> Result<CudaParts<GpuBackend<cuda::CudaDevice>>, String> {
    use std::sync::Arc;
    let started = crate::clock::now();
    let dev = gpu::open_device()?;
    let compiled_ms = crate::clock::since(started).as_secs_f64() * 1e3;
    let lm = GpuLm::new(Arc::clone(&dev), cfg, pages, page_tokens).map_err(|e| e.to_string())?;
    let video = gpu::warm_video(&dev, &crate::models::video::VideoModel::new(video_seed))?;
    let diffusion = gpu::warm_video(&dev, &crate::models::video::diffusion_model(video_seed))?;
    tracing::info!(
        event = "gpu_ready",
        device = %kernels::Device::name(&*dev),
        nvrtc_compile_ms = compiled_ms,
        ready_ms = crate::clock::since(started).as_secs_f64() * 1e3
    );
    let device = kernels::Device::name(&*dev);
    if !gpu::profile_fits_gpu(profile_class, &device) {
        tracing::warn!(
            event = "profile_other_gpu",
            profile_class,
            device = %device,
            "the latency profile was measured on another GPU model; admission predicts with its times \
             (run `engine profile --backend cuda` on this GPU and pass it with --profile)"
        );
    }
    Ok((GpuBackend { lm }, video, diffusion))
}

/// The LM alone on the first GPU (for `engine profile --backend cuda`),
/// and the device's name.
#[cfg(feature = "cuda")]
pub fn open_lm(
    cfg: crate::models::lm::ModelConfig,
    pages: u32,
    page_tokens: u32,
) -> Result<(GpuBackend<cuda::CudaDevice>, String), String> {
    let dev = gpu::open_device()?;
    let name = kernels::Device::name(&*dev);
    let lm = GpuLm::new(dev, cfg, pages, page_tokens).map_err(|e| e.to_string())?;
    Ok((GpuBackend { lm }, name))
}

/// Without the `cuda` feature there is no GPU to profile.
#[cfg(not(feature = "cuda"))]
pub fn open_lm(
    _cfg: crate::models::lm::ModelConfig,
    _pages: u32,
    _page_tokens: u32,
) -> Result<(crate::backend::cpu::Cpu, String), String> {
    Err(gpu::NO_CUDA.into())
}

/// Without the `cuda` feature there is no cuda backend.
#[cfg(not(feature = "cuda"))]
pub fn start_cuda(
    _cfg: crate::models::lm::ModelConfig,
    _pages: u32,
    _page_tokens: u32,
    _video_seed: u64,
    _profile_class: &str,
) -> Result<CudaParts<crate::backend::cpu::Cpu>, String> {
    Err(gpu::NO_CUDA.into())
}
