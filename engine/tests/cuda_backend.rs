//! The cuda backend on a real GPU: the checks of `gpu_models.rs` (which
//! run on the host emulator everywhere) on the device, with the GPU's
//! tolerances. Built only with `--features cuda`; on a machine without a
//! GPU each test says loudly that it did not run. Compiling the kernels
//! needs only NVRTC, so that test runs wherever libnvrtc loads.

#![cfg(feature = "cuda")]

use std::sync::Arc;

use engine::backend::cpu::ModelConfig;
use engine::backend::{BackendChoice, BackendKind};
use engine::gpu::check::{self, Comparison, Tolerances};
use engine::gpu::cuda::{self, CudaDevice};
use engine::video::Resolution;

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
fn state_offloaded_to_pinned_memory_comes_back_exactly_on_the_gpu() {
    let Some(dev) = device("pinned offload/restore on the GPU") else { return };
    assert_all_ok(&check::offload_round_trip(dev).unwrap());
}
