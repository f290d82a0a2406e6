use super::*;

fn engine(backend: BackendKind) -> DiffusionEngine {
    let text = crate::DIFFUSION_PROFILE.to_string();
    let profile = DiffusionProfile::parse("genserve", &text).unwrap();
    DiffusionEngine::new(backend, profile, text, 0)
}

fn steps(n: u32) -> StepsRequest {
    StepsRequest {
        prompt: "a red kite over the sea".into(),
        size: "256x448".into(),
        frames: 81,
        total_steps: 50,
        steps: n,
        sp: 1,
        seed: 3,
    }
}

#[tokio::test]
async fn pause_resume_and_moving_engines_give_the_same_video() {
    let straight = engine(BackendKind::Cpu);
    assert_eq!(
        straight.steps("v", steps(50)).await.unwrap(),
        StepsResponse { steps_done: 50, steps_left: 0 }
    );
    let want = straight.decode("v").await.unwrap();
    assert_eq!(straight.videos(), 0, "decoding drops the state");
    // Three rounds with pauses, the middle one on another engine.
    let (a, b) = (engine(BackendKind::Cpu), engine(BackendKind::Cpu));
    assert_eq!(a.steps("v", steps(20)).await.unwrap().steps_left, 30);
    let state = a.export("v").unwrap();
    assert_eq!(a.videos(), 0, "export hands the state over");
    b.import("v", &state).unwrap();
    assert_eq!(b.steps("v", steps(5)).await.unwrap().steps_done, 25);
    a.import("v", &b.export("v").unwrap()).unwrap();
    assert!(matches!(a.decode("v").await, Err(DiffusionError::Invalid(_))), "not before the last step");
    assert_eq!(a.steps("v", steps(40)).await.unwrap(), StepsResponse { steps_done: 50, steps_left: 0 });
    let got = a.decode("v").await.unwrap();
    assert_eq!(got, want, "the same animated PNG");
    assert!(got.windows(4).any(|w| w == b"acTL"));
}

#[tokio::test]
async fn images_come_back_at_the_requested_size_and_batching_changes_nothing() {
    let e = engine(BackendKind::Cpu);
    let req = |prompts: Vec<&str>| ImagesRequest {
        size: "512x512".into(),
        prompts: prompts.into_iter().map(String::from).collect(),
        seed: 9,
    };
    let one = e.images(req(vec!["a cat"])).await.unwrap();
    let two = e.images(req(vec!["a cat", "a dog"])).await.unwrap();
    assert_eq!(one[0], two[0], "an image does not depend on its batch");
    assert_ne!(two[0], two[1]);
    let png = &one[0];
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 512, "width");
    assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 512, "height");
    let bad = e.images(ImagesRequest { size: "3x3".into(), ..req(vec!["x"]) }).await;
    assert_eq!(bad.unwrap_err(), DiffusionError::UnknownSize("3x3".into()));
}

#[tokio::test(start_paused = true)]
async fn emulated_steps_take_the_profiles_time_at_the_sp_degree() {
    let e = engine(BackendKind::Emulated);
    let t0 = tokio::time::Instant::now();
    e.steps("v", StepsRequest { sp: 4, steps: 5, ..steps(5) }).await.unwrap();
    let want = 5.0 * e.profile.video_step_ms(0, 81, 4);
    let took = t0.elapsed().as_secs_f64() * 1000.0;
    assert!((took - want).abs() < 5.0, "{took} ms vs {want} ms");
    let t1 = tokio::time::Instant::now();
    e.steps("v", StepsRequest { sp: 1, steps: 5, ..steps(5) }).await.unwrap();
    assert!(t1.elapsed().as_secs_f64() * 1000.0 > 1.5 * want, "SP 1 is slower (256p: SP 4 is 1.8x)");
}

#[test]
fn imports_are_checked() {
    let e = engine(BackendKind::Cpu);
    assert!(matches!(e.import("v", b"{}"), Err(DiffusionError::BadState(_))));
    assert!(matches!(e.import("v", b"{\"floats\": 3}\n12"), Err(DiffusionError::BadState(_))));
    let ok = b"{\"prompt\":\"p\",\"seed\":1,\"size\":\"480x832\",\"frames\":81,\"total\":50,\"done\":60,\"floats\":0}\n";
    assert!(matches!(e.import("v", ok), Err(DiffusionError::BadState(_))), "done past total");
}

#[tokio::test]
async fn an_engine_keeps_at_most_its_bound_of_video_states() {
    let e = engine(BackendKind::Emulated);
    let state = {
        let src = engine(BackendKind::Emulated);
        tokio::time::pause();
        src.steps("seed", steps(1)).await.unwrap();
        src.export("seed").unwrap()
    };
    for i in 0..MAX_VIDEOS {
        e.import(&format!("v{i}"), &state).unwrap();
    }
    assert_eq!(e.steps("one-more", steps(1)).await.unwrap_err(), DiffusionError::Full);
    assert_eq!(e.import("one-more", &state).unwrap_err(), DiffusionError::Full);
    e.import("v0", &state).unwrap(); // replacing one it keeps is fine
    assert!(e.drop_video("v0"));
    assert_eq!(e.steps("one-more", steps(1)).await.unwrap().steps_done, 1, "a slot freed");
    assert_eq!(e.videos(), MAX_VIDEOS);
}

/// The cuda backend's path on the host emulator of the kernels.
fn on_emulated_gpu() -> DiffusionEngine {
    let dev = Arc::new(kernel_emu::Emu::new());
    let gpu = crate::gpu::video::GpuVideo::new(dev, &model(0)).unwrap();
    engine(BackendKind::Cuda).with_gpu(Some(Arc::new(gpu)))
}

#[tokio::test]
async fn on_the_gpu_an_image_batch_and_a_paused_video_give_the_hosts_pictures() {
    let batch =
        || ImagesRequest { size: "512x512".into(), prompts: vec!["a kite".into(), "a fox".into()], seed: 5 };
    let (gpu, host) = (on_emulated_gpu(), engine(BackendKind::Cpu));
    let got = gpu.images(batch()).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got, host.images(batch()).await.unwrap(), "the same PNGs as the host's");
    let short = |n| StepsRequest { total_steps: 6, ..steps(n) };
    for e in [&gpu, &host] {
        assert_eq!(e.steps("v", short(4)).await.unwrap().steps_left, 2);
        assert_eq!(e.steps("v", short(4)).await.unwrap(), StepsResponse { steps_done: 6, steps_left: 0 });
    }
    assert_eq!(gpu.decode("v").await.unwrap(), host.decode("v").await.unwrap());
}

/// A device that fails every call.
struct Broken;

impl VideoRunner for Broken {
    fn run(
        &self,
        _: &VideoModel,
        _: &mut [crate::video::BatchItem<'_>],
    ) -> kernels::Result<Vec<crate::gpu::video::ChunkResult>> {
        Err(kernels::DeviceError("gone".into()))
    }
    fn steps(&self, _: &mut [StepJob<'_>]) -> kernels::Result<()> {
        Err(kernels::DeviceError("gone".into()))
    }
    fn device_name(&self) -> String {
        "broken".into()
    }
}

#[tokio::test]
async fn a_failing_device_keeps_the_videos_state_and_says_so() {
    let e = engine(BackendKind::Cpu);
    assert_eq!(e.steps("v", steps(10)).await.unwrap().steps_done, 10);
    let before = e.export("v").unwrap();
    let broken = engine(BackendKind::Cuda).with_gpu(Some(Arc::new(Broken)));
    broken.import("v", &before).unwrap();
    let err = broken.steps("v", steps(10)).await.unwrap_err();
    assert!(matches!(err, DiffusionError::Failed(_)), "{err:?}");
    assert_eq!(err.code(), "engine_error");
    assert_eq!(broken.export("v").unwrap(), before, "the state is exactly as before the failed round");
    let img = ImagesRequest { size: "512x512".into(), prompts: vec!["a kite".into()], seed: 0 };
    assert!(matches!(broken.images(img).await, Err(DiffusionError::Failed(_))));
}
