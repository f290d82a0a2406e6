//! The cuda backend on a real GPU: the checks of `gpu_models.rs` (which
//! run on the host emulator everywhere) on the device, with the GPU's
//! tolerances. Built only with `--features cuda`; on a machine without a
//! GPU each test says loudly that it did not run. Compiling the kernels
//! needs only NVRTC, so that test runs wherever libnvrtc loads.

#![cfg(feature = "cuda")]

use std::sync::Arc;

use engine::backend::cpu::ModelConfig;
use engine::backend::cuda::GpuBackend;
use engine::backend::{BackendChoice, BackendKind};
use engine::gpu::cuda::{self, CudaDevice};
use engine::gpu::lm::GpuLm;
use engine::tools::gpu_check::{self as check, Comparison, Tolerances};
use engine::video::Resolution;

mod common;

fn skipped(what: &str, why: &str) {
    eprintln!("\n**********\n*** SKIPPED: {what} did not run: {why}\n**********\n");
}

fn device(what: &str) -> Option<Arc<CudaDevice>> {
    match engine::gpu::probe() {
        Ok(_) => {
            Some(Arc::new(CudaDevice::open(0).expect("a GPU answered the probe but could not be opened")))
        }
        Err(why) => {
            skipped(what, &why);
            None
        }
    }
}

fn assert_all_ok(results: &[Comparison]) {
    let failed = check::report(results);
    assert!(failed.is_empty(), "outside tolerance: {failed:#?}");
}

#[test]
fn the_kernels_compile_with_nvrtc_for_ampere_and_hopper() {
    if !cuda::nvrtc_present() {
        skipped("compiling kernels/cuda with NVRTC", "libnvrtc could not be loaded");
        return;
    }
    for cc in [(8, 0), (9, 0)] {
        let ptx = cuda::compile_kernels(cc).unwrap_or_else(|log| panic!("sm_{}{}: {log}", cc.0, cc.1));
        for k in kernels::KERNELS {
            assert!(ptx.contains(&format!(".entry {k}(")), "sm_{}{}: no entry {k} in the PTX", cc.0, cc.1);
        }
    }
}

#[test]
fn auto_picks_cuda_when_a_gpu_answers() {
    let Some(_dev) = device("--backend auto on a GPU") else { return };
    let (kind, why) = BackendChoice::Auto.resolve();
    assert_eq!(kind, BackendKind::Cuda, "{why}");
}

#[test]
fn video_batches_on_the_gpu_match_the_cpu_backend() {
    let Some(dev) = device("the GPU video model against the cpu backend") else { return };
    assert_all_ok(&check::video_vs_cpu(Arc::clone(&dev), Tolerances::GPU, Resolution::Tiny, 3, 4).unwrap());
    assert_all_ok(&check::video_vs_cpu(dev, Tolerances::GPU, Resolution::Small, 2, 3).unwrap());
}

#[test]
fn the_lm_on_the_gpu_matches_the_cpu_backend() {
    let Some(dev) = device("the GPU LM against the cpu backend") else { return };
    let cfg = ModelConfig { layers: 4, hidden: 512, heads: 8, ffn: 1536, vocab: 8192, seed: 0 };
    assert_all_ok(&check::lm_vs_cpu(dev, Tolerances::GPU, cfg, 16).unwrap());
}

#[test]
fn the_lm_on_the_gpu_reuses_cached_prefix_pages() {
    let Some(dev) = device("the GPU LM over a cached prefix") else { return };
    let cfg = ModelConfig { layers: 4, hidden: 512, heads: 8, ffn: 1536, vocab: 8192, seed: 0 };
    assert_all_ok(&check::lm_prefix_reuse(dev, Tolerances::GPU, cfg, 8).unwrap());
}

/// The scheduler over the GPU LM, the prefix cache on and off: bf16
/// products over fewer rows may round differently, so a rare token may
/// flip; the agreement is printed and bounded, not assumed exact.
#[tokio::test]
async fn the_gpu_backend_serves_prompts_from_the_prefix_cache() {
    let Some(dev) = device("the GPU backend with the prefix cache") else { return };
    let cfg = ModelConfig { layers: 4, hidden: 512, heads: 8, ffn: 1536, vocab: 8192, seed: 0 };
    let lm = || GpuBackend { lm: GpuLm::new(Arc::clone(&dev), cfg, 512, 4).unwrap() };
    let (same, hit_tokens) = common::text::prefix_cache_agreement(lm, 8).await;
    eprintln!("prefix cache on the GPU: {same}/8 texts identical, {hit_tokens} tokens served from the cache");
    assert!(same >= 7, "{same}/8 texts agree with and without the cache");
    assert!(hit_tokens >= 7 * 24, "seven prompts found the system prompt's pages: {hit_tokens}");
}

#[test]
fn diffusion_jobs_on_the_gpu_match_the_host() {
    let Some(dev) = device("diffusion jobs on the GPU against the host") else { return };
    assert_all_ok(&check::diffusion_vs_cpu(dev, Tolerances::GPU).unwrap());
}

#[test]
fn state_offloaded_to_pinned_memory_comes_back_exactly_on_the_gpu() {
    let Some(dev) = device("pinned offload/restore on the GPU") else { return };
    assert_all_ok(&check::offload_round_trip(dev).unwrap());
}

#[test]
fn without_a_gpu_opening_the_cuda_backend_is_an_error_not_a_panic() {
    let Err(why) = engine::gpu::probe() else {
        skipped("the no-GPU error path", "a GPU answered");
        return;
    };
    let cfg = ModelConfig { layers: 1, hidden: 64, heads: 4, ffn: 128, vocab: 256, seed: 0 };
    let Err(lm) = engine::backend::cuda::open_lm(cfg, 8, 4) else {
        panic!("open_lm succeeded without a GPU")
    };
    assert_eq!(lm, why);
    let Err(video) = engine::gpu::open_video(0) else { panic!("open_video succeeded without a GPU") };
    assert_eq!(video, why);
}
