use super::dp::{image_batches, Score};
use super::*;
use crate::rng::SplitMix;

fn profile() -> DiffusionProfile {
    let text = include_str!("../../profiles/genserve-emulated.toml");
    DiffusionProfile::parse("genserve-emulated.toml", text).unwrap()
}

fn cfg(mode: Mode) -> SchedConfig {
    SchedConfig { mode, ..SchedConfig::default() }
}

fn video(
    id: u64,
    size: SizeId,
    now: f64,
    slack_x: f64,
    steps_left: u32,
    place: Place,
    p: &DiffusionProfile,
) -> VideoReq {
    let frames = p.frames(5);
    let solo = p.video_ms(size, frames, 2);
    VideoReq { id, size, frames, arrival_ms: now - 1.0, deadline_ms: now + solo * slack_x, steps_left, place }
}

fn image(id: u64, size: SizeId, now: f64, budget: f64) -> ImageReq {
    ImageReq { id, size, arrival_ms: now - 1.0, deadline_ms: now + budget }
}

#[test]
fn profile_tables_follow_the_paper_shape() {
    let p = profile();
    let v720 = p.video_size("720x1280").unwrap();
    let f = p.frames(5);
    assert_eq!(f, 81);
    let sp8 = p.video_step_ms(v720, f, 1) / p.video_step_ms(v720, f, 8);
    assert!((6.8..7.2).contains(&sp8), "720p SP8 speed-up {sp8}");
    let v256 = p.video_size("256x448").unwrap();
    assert!(p.video_step_ms(v256, f, 1) / p.video_step_ms(v256, f, 8) < 3.5, "SP scales poorly at 256p");
    let small = p.image_size("512x512").unwrap();
    let big = p.image_size("1024x1024").unwrap();
    let gain = |s| 4.0 * p.image_ms(s, 1) / p.image_ms(s, 4);
    assert!(gain(small) > 2.0 && gain(big) < 1.5, "batching pays at low resolution only");
    assert!(p.image_size("9x9").is_none());
    let bad = include_str!("../../profiles/genserve-emulated.toml").replace("sp_comm = 0.2", "sp_comm = -1");
    let err = DiffusionProfile::parse("x.toml", &bad).unwrap_err().to_string();
    assert!(err.contains("x.toml") && err.contains("480x832"), "{err}");
}

#[test]
fn fcfs_blocks_behind_the_head() {
    let p = profile();
    let now = 1000.0;
    let videos = [video(1, 2, now, 3.0, 50, Place::Queued, &p)];
    let mut images = vec![image(2, 0, now, 5000.0)];
    images[0].arrival_ms = now; // after the video
    let avail = [0];
    let snap = Snapshot {
        now_ms: now,
        avail: &avail,
        images: &images,
        videos: &videos,
        image_reserve: 0,
        idle: false,
    };
    let plan = plan(&snap, &p, &cfg(Mode::Fcfs));
    assert!(plan.runs.is_empty() && plan.batches.is_empty(), "the video (SP 2) blocks the image: {plan:?}");
}

#[test]
fn edf_batches_grow_only_while_the_earliest_deadline_holds() {
    let p = profile();
    let now = 0.0;
    let s = p.image_size("512x512").unwrap();
    // Budget for a batch of 3 but not of 4.
    let budget = (p.image_ms(s, 3) + p.image_ms(s, 4)) / 2.0;
    let mut images: Vec<ImageReq> = (0..6).map(|i| image(i, s, now, budget + i as f64)).collect();
    images.push(image(9, p.image_size("1024x1024").unwrap(), now, budget));
    let avail = [0, 1, 2];
    let snap =
        Snapshot { now_ms: now, avail: &avail, images: &images, videos: &[], image_reserve: 0, idle: false };
    let batches = image_batches(&snap, &p, 3, 8);
    let sizes: Vec<usize> = batches.iter().map(|(b, _)| b.ids.len()).collect();
    assert_eq!(sizes, vec![3, 3, 1], "the hopeless large image goes last: {batches:?}");
    assert_eq!(batches[0].0.ids, vec![0, 1, 2], "earliest deadlines first");
    assert!(
        batches.iter().all(|(b, _)| b.ids.iter().all(|&id| (id == 9) == (b.size != s))),
        "one size per batch"
    );
}

/// Everything the DP plan keeps reachable, scored the way the paper counts
/// (videos recoverable + images meeting their deadline).
fn evaluate(snap: &Snapshot, p: &DiffusionProfile, c: &SchedConfig, degrees: &[u32]) -> Option<Score> {
    let used: u32 = degrees.iter().sum();
    if used as usize > snap.avail.len() {
        return None;
    }
    let mut s = Score::default();
    for (v, &d) in snap.videos.iter().zip(degrees) {
        let o = video_outlook(v, (d > 0).then_some(d), snap, p, c);
        if d == 0 {
            // The rule the DP keeps: never pause a running video into a miss.
            let keeps = matches!(&v.place, Place::Boundary { gpus }
                if video_outlook(v, Some(gpus.len() as u32), snap, p, c).recoverable);
            if keeps && !o.recoverable {
                return None;
            }
        }
        s.meets += u32::from(o.recoverable);
        s.value += o.laxity;
    }
    for (_, bs) in image_batches(snap, p, snap.avail.len() - used as usize, p.max_batch) {
        s.meets += bs.meets;
        s.value += bs.value;
    }
    Some(s)
}

fn random_snapshot(
    rng: &mut SplitMix,
    p: &DiffusionProfile,
    avail: &mut Vec<Gpu>,
) -> (Vec<ImageReq>, Vec<VideoReq>) {
    let now = 10_000.0;
    let n = 1 + (rng.next_u64() % 8) as usize;
    *avail = (0..n as Gpu).collect();
    let images = (0..rng.next_u64() % 6)
        .map(|i| image(100 + i, (rng.next_u64() % 3) as usize, now, 500.0 + rng.unit_f64() * 8000.0))
        .collect();
    let mut held = 0;
    let videos = (0..rng.next_u64() % 4)
        .map(|i| {
            let steps = 1 + (rng.next_u64() % 50) as u32;
            let place = if held + 2 <= n && rng.unit_f64() < 0.4 {
                held += 2;
                Place::Boundary { gpus: vec![held as Gpu - 2, held as Gpu - 1] }
            } else if rng.unit_f64() < 0.5 {
                Place::Paused { home: (rng.next_u64() % n as u64) as Gpu }
            } else {
                Place::Queued
            };
            video(i, (rng.next_u64() % 3) as usize, now, 0.3 + rng.unit_f64() * 2.0, steps, place, p)
        })
        .collect();
    (images, videos)
}

/// The snapshot of a [`random_snapshot`] case (no image reserve).
fn at_random_time<'a>(
    avail: &'a [Gpu],
    images: &'a [ImageReq],
    videos: &'a [VideoReq],
    idle: bool,
) -> Snapshot<'a> {
    Snapshot { now_ms: 10_000.0, avail, images, videos, image_reserve: 0, idle }
}

#[test]
fn dp_matches_brute_force_on_small_instances() {
    let p = profile();
    let mut rng = SplitMix(24);
    for mode in [Mode::Dp, Mode::GenServe] {
        let c = cfg(mode);
        for case in 0..400 {
            let mut avail = Vec::new();
            let (images, videos) = random_snapshot(&mut rng, &p, &mut avail);
            let snap = at_random_time(&avail, &images, &videos, false);
            let plan = plan_dp(&snap, &p, &c);
            let chosen: Vec<u32> = videos
                .iter()
                .map(|v| plan.runs.iter().find(|r| r.id == v.id).map_or(0, |r| r.gpus.len() as u32))
                .collect();
            let got = evaluate(&snap, &p, &c, &chosen).expect("the DP's plan is feasible");
            // Every assignment of degrees to videos.
            let options: Vec<u32> = if mode == Mode::GenServe { vec![0, 1, 2, 4, 8] } else { vec![0, 2] };
            let mut best: Option<Score> = None;
            let mut idx = vec![0usize; videos.len()];
            loop {
                let degrees: Vec<u32> = idx.iter().map(|&k| options[k]).collect();
                let ok = videos.iter().zip(&degrees).all(|(v, &d)| match (&v.place, mode) {
                    (Place::Boundary { gpus }, Mode::Dp) => d == 0 || d == gpus.len() as u32,
                    // Narrower than the default degree only while images wait.
                    (_, Mode::GenServe) => d != 1 || !images.is_empty(),
                    _ => true,
                });
                if let Some(s) = ok.then(|| evaluate(&snap, &p, &c, &degrees)).flatten() {
                    if best.is_none_or(|b| s.beats(b)) {
                        best = Some(s);
                    }
                }
                let Some(k) = (0..idx.len()).find(|&k| idx[k] + 1 < options.len()) else { break };
                idx[k] += 1;
                idx[..k].iter_mut().for_each(|x| *x = 0);
            }
            let best = best.unwrap();
            assert_eq!(got.meets, best.meets, "case {case} {mode:?}: {plan:?}");
            assert!(
                (got.value - best.value).abs() < 1e-6,
                "case {case}: value {} vs {}",
                got.value,
                best.value
            );
            // GPUs are used once, and only available ones.
            let mut used: Vec<Gpu> = plan
                .runs
                .iter()
                .flat_map(|r| r.gpus.clone())
                .chain(plan.batches.iter().map(|b| b.gpu))
                .collect();
            used.sort_unstable();
            let n = used.len();
            used.dedup();
            assert_eq!(used.len(), n, "case {case}: a GPU assigned twice: {plan:?}");
            assert!(used.iter().all(|g| avail.contains(g)));
        }
    }
}

/// Runs one video with no other work from a boundary, in rounds, at the
/// degree it holds; returns its finish time.
fn finish_alone(v: &VideoReq, now: f64, p: &DiffusionProfile) -> f64 {
    let d = match &v.place {
        Place::Boundary { gpus } => gpus.len() as u32,
        _ => 2,
    };
    now + f64::from(v.steps_left) * p.video_step_ms(v.size, v.frames, d) + p.video_vae_ms(v.size, v.frames)
}

#[test]
fn preemption_never_costs_a_deadline_that_running_on_would_meet() {
    // Property: a running video the plan pauses, if it would have met its
    // deadline running on, still meets it when it resumes after a round's
    // wait at its degree (what the pool does once the images are served).
    let p = profile();
    let mut rng = SplitMix(7);
    let mut paused = 0;
    for mode in [Mode::Preempt, Mode::Dp, Mode::GenServe] {
        let c = cfg(mode);
        for _ in 0..2000 {
            let mut avail = Vec::new();
            let (images, videos) = random_snapshot(&mut rng, &p, &mut avail);
            let now = 10_000.0;
            let snap = Snapshot {
                now_ms: now,
                avail: &avail,
                images: &images,
                videos: &videos,
                image_reserve: 0,
                idle: false,
            };
            let plan = plan(&snap, &p, &c);
            for v in videos.iter().filter(|v| matches!(v.place, Place::Boundary { .. })) {
                if plan.runs.iter().any(|r| r.id == v.id) || finish_alone(v, now, &p) > v.deadline_ms {
                    continue;
                }
                paused += 1;
                let Place::Boundary { gpus } = &v.place else { unreachable!() };
                let wait = f64::from(c.round_steps.min(v.steps_left))
                    * p.video_step_ms(v.size, v.frames, gpus.len() as u32);
                assert!(
                    finish_alone(v, now + wait, &p) <= v.deadline_ms,
                    "{mode:?} paused {v:?} into a miss"
                );
            }
        }
    }
    assert!(paused > 50, "the property was exercised ({paused} pauses)");
}

#[test]
fn genserve_widens_sp_on_idle_gpus_and_narrows_it_for_images() {
    let p = profile();
    let c = cfg(Mode::GenServe);
    let now = 0.0;
    let v720 = p.video_size("720x1280").unwrap();
    let v = video(1, v720, now, 1.0, 50, Place::Boundary { gpus: vec![0, 1] }, &p);
    let avail: Vec<Gpu> = (0..8).collect();
    let snap = Snapshot {
        now_ms: now,
        avail: &avail,
        images: &[],
        videos: std::slice::from_ref(&v),
        image_reserve: 0,
        idle: false,
    };
    let alone = plan_dp(&snap, &p, &c);
    assert_eq!(alone.runs[0].gpus.len(), 8, "idle GPUs go to the video: {alone:?}");
    assert_eq!(&alone.runs[0].gpus[..2], &[0, 1], "it keeps the GPUs it holds");
    let reserved = plan_dp(&Snapshot { image_reserve: 3, ..snap }, &p, &c);
    assert_eq!(reserved.runs[0].gpus.len(), 4, "widens only past the image reserve: {reserved:?}");
    let mut late = v.clone();
    late.deadline_ms = 1.0;
    let full = Snapshot { image_reserve: 8, videos: std::slice::from_ref(&late), ..snap };
    assert!(plan_dp(&full, &p, &c).runs.is_empty(), "a hopeless video leaves reserved GPUs alone");
    let idle = plan_dp(&Snapshot { idle: true, ..full }, &p, &c);
    assert_eq!(idle.runs[0].gpus.len(), 2, "but runs at its base degree on an idle pool: {idle:?}");
    let v = video(1, v720, now, 3.0, 50, Place::Boundary { gpus: (0..8).collect() }, &p);
    let images: Vec<ImageReq> = (0..4).map(|i| image(10 + i, 2, now, 5000.0)).collect();
    let snap = Snapshot {
        now_ms: now,
        avail: &avail,
        images: &images,
        videos: std::slice::from_ref(&v),
        image_reserve: 0,
        idle: false,
    };
    let mixed = plan_dp(&snap, &p, &c);
    let sp = mixed.runs[0].gpus.len();
    assert!(sp < 8 && sp > 0, "degree drops for images but the video keeps going: {mixed:?}");
    assert_eq!(mixed.batches.iter().map(|b| b.ids.len()).sum::<usize>(), 4, "{mixed:?}");
}

#[test]
fn genserve_narrows_below_the_default_degree_only_for_waiting_images() {
    let p = profile();
    let c = cfg(Mode::GenServe);
    let mut rng = SplitMix(7);
    let mut narrowed = 0;
    for case in 0..2000 {
        let mut avail = Vec::new();
        let (images, videos) = random_snapshot(&mut rng, &p, &mut avail);
        let plan = plan_dp(&at_random_time(&avail, &images, &videos, case % 2 == 0), &p, &c);
        let below = plan.runs.iter().any(|r| (r.gpus.len() as u32) < c.default_sp);
        assert!(!below || !images.is_empty(), "case {case}: narrowed with no image waiting: {plan:?}");
        narrowed += usize::from(below);
    }
    assert!(narrowed > 0, "images waiting do make videos narrow");
}

#[test]
fn pool_runs_rounds_pauses_resumes_and_decodes() {
    let p = profile();
    let c = SchedConfig { round_steps: 10, ..cfg(Mode::Preempt) };
    let mut pool = Pool::new(2);
    let v = video(1, 0, 0.0, 2.5, 50, Place::Queued, &p);
    pool.submit_video(v);
    let a = pool.schedule(0.0, &p, &c);
    assert!(
        matches!(&a[..], [Action::Video { id: 1, gpus, steps: 10, from: None }] if gpus == &[0, 1]),
        "{a:?}"
    );
    pool.submit_image(image(5, 0, 100.0, 2000.0));
    assert!(pool.schedule(100.0, &p, &c).is_empty(), "no GPU until the round ends");
    assert_eq!(pool.round_done(1), None);
    let a = pool.schedule(200.0, &p, &c);
    assert!(a.contains(&Action::Pause { id: 1, home: 0 }), "{a:?}");
    assert!(a.iter().any(|x| matches!(x, Action::Images { ids, .. } if ids == &[5])), "{a:?}");
    assert_eq!(pool.video_progress(1), Some((40, 1)));
    let a = pool.schedule(250.0, &p, &c);
    assert!(a.is_empty(), "one GPU free, the video needs two: {a:?}");
    pool.batch_done(0);
    pool.batch_done(1);
    let a = pool.schedule(1500.0, &p, &c);
    assert!(matches!(&a[..], [Action::Video { id: 1, from: None, .. }]), "resumes on its home: {a:?}");
    for _ in 0..4 {
        if let Some(d) = pool.round_done(1) {
            assert_eq!(d, Action::Decode { id: 1, gpu: 0 });
            assert_eq!(pool.gpus()[1], GpuUse::Free, "helpers are free during the decode");
            break;
        }
        pool.schedule(2000.0, &p, &c);
    }
    assert_eq!(pool.decode_done(1), Some((vec![2, 2, 2, 2, 2], 1)));
    assert_eq!(pool.jobs(), 0);
    assert!(pool.gpus().iter().all(|g| *g == GpuUse::Free));
}

#[test]
fn cancelled_jobs_free_their_gpus_at_the_boundary() {
    let p = profile();
    let c = cfg(Mode::GenServe);
    let mut pool = Pool::new(4);
    pool.submit_video(video(1, 1, 0.0, 2.0, 50, Place::Queued, &p));
    pool.submit_image(image(2, 0, 0.0, 100.0));
    pool.cancel(2);
    let a = pool.schedule(0.0, &p, &c);
    assert!(a.iter().all(|x| !matches!(x, Action::Images { .. })), "{a:?}");
    pool.cancel(1);
    assert_eq!(pool.round_done(1), None);
    assert_eq!(pool.jobs(), 0);
    assert!(pool.gpus().iter().all(|g| *g == GpuUse::Free));
}

#[test]
fn admission_refuses_what_the_pool_cannot_meet_with_a_reason() {
    let p = profile();
    let c = SchedConfig { max_jobs: 8, ..cfg(Mode::GenServe) };
    let mut pool = Pool::new(2);
    let img = JobKind::Image { size: 0, n: 1 };
    let solo = p.image_ms(0, 1);
    assert!(pool.admit(&img, 0.0, solo * 1.01, &p, &c).is_ok());
    let r = pool.admit(&img, 0.0, solo * 0.5, &p, &c).unwrap_err();
    assert_eq!(r.reason.label(), "deadline_infeasible");
    // Six images due first keep both GPUs busy for three image times.
    for id in 0..6 {
        pool.submit_image(image(id, 0, 0.0, solo * 1.2));
    }
    let r = pool.admit(&img, 0.0, solo * 1.5, &p, &c).unwrap_err();
    assert_eq!(r.reason.label(), "deadline_unmeetable");
    assert!(r.predicted_ms > 3.9 * solo, "{r:?}");
    assert!(pool.admit(&img, 0.0, solo * 5.0, &p, &c).is_ok(), "a later deadline fits behind them");
    // A long video due later does not count against an earlier image.
    pool.submit_video(video(9, 2, 0.0, 1.0, 50, Place::Queued, &p));
    assert!(pool.admit(&img, 0.0, solo * 5.0, &p, &c).is_ok());
    pool.submit_image(image(10, 0, 0.0, 1e9));
    assert_eq!(pool.admit(&img, 0.0, 1e9, &p, &c).unwrap_err().reason.label(), "queue_full");
    let off = SchedConfig { admission: false, max_jobs: 100, ..c.clone() };
    assert!(pool.admit(&img, 0.0, solo * 0.5, &p, &off).is_ok(), "admission off queues everything");
}
