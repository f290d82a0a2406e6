//! The GPU backend's models on the host emulator of the kernels
//! (`kernel-emu`: kernels/cuda compiled as C++, blocks of 128 real threads,
//! shared memory and barriers as on a GPU), checked against the cpu
//! backend. The same checks run on a real GPU in `cuda_backend.rs` and with
//! `engine gpu-check`.

use std::sync::Arc;

use engine::backend::cpu::ModelConfig;
use engine::backend::cuda::GpuBackend;
use engine::backend::BackendKind;
use engine::gpu::lm::GpuLm;
use engine::gpu::video::{ChunkResult, GpuVideo, StepJob, VideoRunner};
use engine::tools::gpu_check::{self as check, Comparison, Tolerances};
use engine::video::model::VideoModel;
use engine::video::{BatchItem, ChunkRequest, CreateSession, Resolution, VideoConfig, VideoEngine};
use kernel_emu::Emu;
use kernels::DeviceError;
use policies::video::Fidelity;

mod common;

fn assert_all_ok(results: &[Comparison]) {
    let failed = check::report(results);
    assert!(failed.is_empty(), "outside tolerance: {failed:#?}");
}

#[test]
fn video_batches_on_the_emulated_gpu_match_the_cpu_backend() {
    // Three configurations coalesced per chunk, four chunks: sink, window,
    // block sparsity and fp8 all in play from the second chunk on.
    let r = check::video_vs_cpu(Arc::new(Emu::new()), Tolerances::EMULATOR, Resolution::Tiny, 2, 4).unwrap();
    assert_eq!(r.len(), 6);
    assert_all_ok(&r);
}

#[test]
fn the_lm_on_the_emulated_gpu_matches_the_cpu_backend_over_scattered_pages() {
    let cfg = ModelConfig { layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 256, seed: 3 };
    let r = check::lm_vs_cpu(Arc::new(Emu::new()), Tolerances::EMULATOR, cfg, 8).unwrap();
    assert_all_ok(&r);
}

#[test]
fn the_emulated_gpu_lm_reuses_a_cached_prefix_like_a_fresh_prefill() {
    let cfg = ModelConfig { layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 256, seed: 3 };
    let r = check::lm_prefix_reuse(Arc::new(Emu::new()), Tolerances::EMULATOR, cfg, 6).unwrap();
    assert_eq!(r.len(), 2);
    assert_all_ok(&r);
}

#[tokio::test]
async fn the_emulated_gpu_backend_gives_the_same_text_with_the_prefix_cache() {
    let cfg = ModelConfig { layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 512, seed: 7 };
    let lm = || GpuBackend { lm: GpuLm::new(Arc::new(Emu::new()), cfg, 512, 4).unwrap() };
    let (same, hit_tokens) = common::text::prefix_cache_agreement(lm, 2).await;
    assert_eq!(same, 2, "both texts (greedy, sampled) agree with and without the cache");
    assert!(hit_tokens >= 24, "the second prompt found the system prompt's pages: {hit_tokens}");
}

#[test]
fn diffusion_jobs_on_the_emulated_gpu_match_the_host() {
    let r = check::diffusion_vs_cpu(Arc::new(Emu::new()), Tolerances::EMULATOR).unwrap();
    assert_eq!(r.len(), 2);
    assert_all_ok(&r);
}

#[test]
fn state_offloaded_to_pinned_memory_comes_back_exactly() {
    assert_all_ok(&check::offload_round_trip(Arc::new(Emu::new())).unwrap());
}

#[test]
fn pinned_buffers_are_reused_up_to_their_bound() {
    use engine::gpu::offload::StateStore;
    let dev = Arc::new(Emu::new());
    let state: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let cycle = |store: &mut StateStore<Emu>| {
        store.offload("a").unwrap();
        store.settle().unwrap();
        store.restore("a").unwrap();
        store.settle().unwrap();
    };
    let mut store = StateStore::new(Arc::clone(&dev));
    store.put("a", &state).unwrap();
    (0..3).for_each(|_| cycle(&mut store));
    assert_eq!(store.pinned_allocs, 1, "one pinned buffer serves every offload");
    assert_eq!(store.spare_bytes(), 4096);
    assert_eq!(store.read("a").unwrap(), state, "the bytes survive reuse");
    store.offload("a").unwrap();
    store.remove("a").unwrap();
    assert_eq!(store.spare_bytes(), 4096, "a removed state's pinned buffer is kept too");
    // Below one state's size, nothing is kept: every offload allocates.
    let mut tight = StateStore::with_spare_limit(dev, 1024);
    tight.put("a", &state).unwrap();
    (0..3).for_each(|_| cycle(&mut tight));
    assert_eq!((tight.pinned_allocs, tight.spare_bytes()), (3, 0));
    assert_eq!(tight.read("a").unwrap(), state);
}

/// A device that fails every batch.
struct Broken;

impl VideoRunner for Broken {
    fn run(&self, _: &VideoModel, _: &mut [BatchItem<'_>]) -> kernels::Result<Vec<ChunkResult>> {
        Err(DeviceError("the device fell off the bus".into()))
    }
    fn steps(&self, _: &mut [StepJob<'_>]) -> kernels::Result<()> {
        Err(DeviceError("the device fell off the bus".into()))
    }
    fn device_name(&self) -> String {
        "broken".into()
    }
}

fn video_engine(runner: Arc<dyn VideoRunner>) -> VideoEngine {
    VideoEngine::spawn(VideoConfig {
        backend: BackendKind::Cuda,
        profile: common::video_profile("gpu-test", 2),
        arena_slots: 4,
        max_batch: 4,
        threads: 1,
        model_seed: 1,
        gpu: Some(runner),
        state_bytes: 0,
    })
}

async fn chunks(video: &VideoEngine, n: usize) -> Vec<engine::video::ChunkOut> {
    let mut out = Vec::new();
    for _ in 0..n {
        let req =
            ChunkRequest { epoch: 0, fidelity: Fidelity::HIGHEST, key: 0.0, credit: 0.0, sp: 1, at: None };
        out.push(video.chunk("s", req).await.unwrap());
    }
    out
}

fn session() -> CreateSession {
    CreateSession { id: "s".into(), prompt: "a kite".into(), resolution: Resolution::Tiny, latent_frames: 2 }
}

#[tokio::test]
async fn the_video_scheduler_keeps_contexts_on_the_gpu_and_offloads_them_on_suspend() {
    let model = VideoModel::new(1);
    let gpu = Arc::new(GpuVideo::new(Arc::new(Emu::new()), &model).unwrap());
    let video = video_engine(gpu.clone());
    video.create(session()).await.unwrap();
    let first = chunks(&video, 2).await;
    assert_eq!(first.iter().map(|c| c.index).collect::<Vec<_>>(), vec![0, 1]);
    assert!(first.iter().all(|c| c.frames.len() == 8), "4 pixel frames per latent frame");
    assert_eq!(gpu.resident("s"), Some(true));
    // Suspending moves the context to pinned memory; the next chunk
    // resumes the session and brings it back instead of uploading it.
    video.suspend("s").await.unwrap();
    assert_eq!(gpu.resident("s"), Some(false));
    let next = chunks(&video, 1).await;
    assert_eq!(next[0].index, 2);
    // Uploaded once; found on the device for chunks 1 and 2 (the resume
    // issued the restore before the batch); offloaded and restored once.
    let st = gpu.context_stats();
    assert_eq!((st.uploaded, st.resident, st.offloaded, st.restored), (1, 2, 1, 1), "{st:?}");
    // Ending the session frees its device state.
    video.end("s").await.unwrap();
    assert_eq!(gpu.resident("s"), None);
}

#[tokio::test]
async fn a_failing_device_loses_no_chunk() {
    let video = video_engine(Arc::new(Broken));
    video.create(session()).await.unwrap();
    // The failing device's batches are recomputed on the host.
    let out = chunks(&video, 2).await;
    assert_eq!(out.iter().map(|c| c.index).collect::<Vec<_>>(), vec![0, 1]);
    assert!(out.iter().all(|c| c.frames.len() == 8));
}

#[test]
fn the_gpu_benchmark_harness_runs_end_to_end_on_the_emulator() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        b: engine::tools::gpu_bench::BenchArgs,
    }
    let args = Cli::parse_from([
        "bench",
        "--repeats",
        "1",
        "--gemm-size",
        "32",
        "--video-resolution",
        "tiny",
        "--video-latent-frames",
        "1",
        "--coalesce",
        "2",
        "--offload-mib",
        "1",
        "--lm-context",
        "8",
        "--lm-steps",
        "2",
        "--lm-layers",
        "1",
        "--lm-hidden",
        "32",
        "--lm-heads",
        "2",
        "--lm-ffn",
        "32",
        "--lm-vocab",
        "64",
        "--lm-batches",
        "1,2",
        "--bandwidth-mib",
        "1",
        // The DiT section runs on a GPU only: on the emulator its
        // forwards take minutes (128 real threads meeting at a barrier per
        // tensor-core product); its model is checked here by
        // `the_dit_on_the_emulated_gpu_matches_its_host_reference`.
        "--only",
        "video,offload,lm",
    ])
    .b;
    let results = engine::tools::gpu_bench::run(Arc::new(Emu::new()), &args, |_| {}).unwrap();
    let names: Vec<&str> = results.iter().map(|m| m.name.as_str()).collect();
    // GEMM, bandwidth; video: chunk, rate, cpu, coalescing; offload 2; LM 2.
    assert_eq!(results.len(), 10, "{names:?}");
    assert!(results.iter().all(|m| m.value.is_finite() && m.value > 0.0), "{results:#?}");
}

/// The DiT's two flash-attention kernels against the f64 reference on
/// random inputs:
/// ragged members in one launch (queries and keys not multiples of the
/// 64-wide tiles, so the last query tile is partial and the last key tile
/// masked; a member with fewer keys than one tile), two heads, the output
/// poisoned first. Then the tiny DiT (the same code as the 1.3B
/// configuration) against the host reference of the same network: two
/// members of different context coalesced, two forwards (the second reads
/// the keys and values the first wrote).
#[test]
fn the_dit_on_the_emulated_gpu_matches_its_host_reference() {
    let r = check::dit_vs_reference(Arc::new(Emu::new()), None).unwrap();
    assert_eq!(r.len(), 4);
    assert_all_ok(&r);
}
