//! The GPU pool in virtual time: the production [`Pool`] and scheduler,
//! with every batch, round and decode timed by the profile.

use std::collections::BinaryHeap;

use policies::diffusion::{
    Action, DiffusionProfile, ImageReq, JobKind, Pool, PoolStats, SchedConfig, VideoReq,
};
use serde::Serialize;

use super::workload::Request;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Arrival(usize),
    BatchDone { gpu: u16, first: usize },
    RoundDone(u64),
    DecodeDone(u64),
}

type At = crate::sim::timed::Timed<Event>;

/// One run's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub images: usize,
    pub videos: usize,
    pub images_met: usize,
    pub videos_met: usize,
    /// Share of requests done by their deadline, percent.
    pub sar: f64,
    pub image_sar: f64,
    pub video_sar: f64,
    /// Mean time from an image's arrival to its batch's start, ms.
    pub mean_image_wait_ms: f64,
    /// Per request: finish time − arrival, ms (in trace order).
    pub latency_ms: Vec<f64>,
    pub stats: PoolStats,
    /// Wall time of each scheduling decision on this machine, µs.
    #[serde(skip)]
    pub decision_us: Vec<f64>,
}

fn pct(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// Runs `trace` on a pool of `gpus` under `cfg`.
pub fn run(trace: &[Request], gpus: usize, profile: &DiffusionProfile, cfg: &SchedConfig) -> Outcome {
    let mut pool = Pool::new(gpus);
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<At>, t: f64, e: Event| {
        seq += 1;
        heap.push(At { t, seq, ev: e });
    };
    for (k, r) in trace.iter().enumerate() {
        push(&mut heap, r.at_ms, Event::Arrival(k));
    }
    let mut finish = vec![f64::NAN; trace.len()];
    let mut started = vec![f64::NAN; trace.len()];
    let mut batches: Vec<Vec<u64>> = Vec::new();
    let mut decision_us = Vec::new();
    while let Some(At { t: now, ev: event, .. }) = heap.pop() {
        let mut follow = Vec::new();
        match event {
            Event::Arrival(k) => submit(&mut pool, &trace[k], k as u64, profile),
            Event::BatchDone { gpu, first } => {
                pool.batch_done(gpu);
                for &id in &batches[first] {
                    finish[id as usize] = now;
                }
            }
            Event::RoundDone(id) => follow.extend(pool.round_done(id)),
            Event::DecodeDone(id) => {
                pool.decode_done(id);
                finish[id as usize] = now;
            }
        }
        let t0 = crate::clock::now();
        follow.extend(pool.schedule(now, profile, cfg));
        decision_us.push(crate::clock::since(t0).as_secs_f64() * 1e6);
        for action in follow {
            match action {
                Action::Images { gpu, size, ids } => {
                    let end = now + profile.image_ms(size, ids.len() as u32);
                    ids.iter().for_each(|&id| started[id as usize] = now);
                    batches.push(ids);
                    push(&mut heap, end, Event::BatchDone { gpu, first: batches.len() - 1 });
                }
                Action::Video { id, gpus, steps, from } => {
                    let JobKind::Video { size, frames } = trace[id as usize].kind else { continue };
                    let step = profile.video_step_ms(size, frames, gpus.len() as u32);
                    let moved = if from.is_some() { profile.migrate_ms } else { 0.0 };
                    push(&mut heap, now + moved + f64::from(steps) * step, Event::RoundDone(id));
                }
                Action::Decode { id, .. } => {
                    let JobKind::Video { size, frames } = trace[id as usize].kind else { continue };
                    push(&mut heap, now + profile.video_vae_ms(size, frames), Event::DecodeDone(id));
                }
                Action::Pause { .. } => {}
            }
        }
    }
    summarize(trace, &finish, &started, pool.stats.clone(), decision_us)
}

fn submit(pool: &mut Pool, r: &Request, id: u64, profile: &DiffusionProfile) {
    match r.kind {
        JobKind::Image { size, .. } => {
            pool.submit_image(ImageReq { id, size, arrival_ms: r.at_ms, deadline_ms: r.deadline_ms })
        }
        JobKind::Video { size, frames } => pool.submit_video(VideoReq {
            id,
            size,
            frames,
            arrival_ms: r.at_ms,
            deadline_ms: r.deadline_ms,
            steps_left: profile.video_steps,
            place: policies::diffusion::Place::Queued,
        }),
    }
}

fn summarize(
    trace: &[Request],
    finish: &[f64],
    started: &[f64],
    stats: PoolStats,
    decision_us: Vec<f64>,
) -> Outcome {
    let met = |k: usize| policies::diffusion::on_time(finish[k], trace[k].deadline_ms);
    let (mut images, mut videos, mut images_met, mut videos_met) = (0, 0, 0, 0);
    let mut wait = 0.0;
    for (k, r) in trace.iter().enumerate() {
        if r.video {
            videos += 1;
            videos_met += usize::from(met(k));
        } else {
            images += 1;
            images_met += usize::from(met(k));
            wait += started[k] - r.at_ms;
        }
    }
    Outcome {
        images,
        videos,
        images_met,
        videos_met,
        sar: pct(images_met + videos_met, images + videos),
        image_sar: pct(images_met, images),
        video_sar: pct(videos_met, videos),
        mean_image_wait_ms: if images == 0 { 0.0 } else { wait / images as f64 },
        latency_ms: trace.iter().zip(finish).map(|(r, f)| f - r.at_ms).collect(),
        stats,
        decision_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::workload::{generate, Mix, Resolutions, Spec};
    use policies::diffusion::Mode;

    fn profile() -> DiffusionProfile {
        let text = include_str!("../../../policies/profiles/genserve-emulated.toml");
        DiffusionProfile::parse("genserve-emulated.toml", text).unwrap()
    }

    #[test]
    fn every_request_finishes_and_each_step_of_the_ablation_helps_at_the_anchor() {
        let p = profile();
        let spec = Spec {
            mix: Mix::Balanced,
            resolutions: Resolutions::Skewed,
            rate_per_min: 24.0,
            sigma: 1.0,
            requests: 100,
            video_seconds: 5,
        };
        let mut sar = Vec::new();
        for mode in [Mode::Fcfs, Mode::Preempt, Mode::Dp, Mode::GenServe] {
            let cfg = SchedConfig { mode, ..SchedConfig::default() };
            let mut met = 0;
            for seed in 1..=5 {
                let trace = generate(&spec, &p, &cfg, seed);
                let o = run(&trace, 8, &p, &cfg);
                for (k, l) in o.latency_ms.iter().enumerate() {
                    assert!(
                        l.is_finite() && *l > 0.0,
                        "{mode:?} seed {seed}: request {k} unfinished: {:?}",
                        trace[k]
                    );
                }
                for (r, l) in trace.iter().zip(&o.latency_ms) {
                    assert!(*l >= r.solo_ms * 0.14 - 1e-6, "{mode:?}: no request beats its SP-8 time");
                }
                met += o.images_met + o.videos_met;
            }
            sar.push(met);
        }
        assert!(sar.windows(2).all(|w| w[1] > w[0]), "FCFS < +preemption < +DP < +SP: {sar:?}");
    }

    /// At σ = 1 a deadline is the solo time itself: a video alone must meet
    /// it whether it runs in one call or in ten rounds (the rounds' sum of
    /// step times must not land past it by a rounding error).
    #[test]
    fn a_video_alone_meets_a_deadline_of_its_solo_time_under_every_scheduler() {
        let p = profile();
        for mode in [Mode::Fcfs, Mode::Preempt, Mode::Dp, Mode::GenServe] {
            let cfg = SchedConfig { mode, ..SchedConfig::default() };
            for (size, v) in p.videos.iter().enumerate() {
                for seconds in 1..=p.max_seconds {
                    let kind = JobKind::Video { size, frames: p.frames(seconds) };
                    let solo_ms = cfg.solo_ms(&p, &kind);
                    let (at_ms, deadline_ms) = (1000.0 / 3.0, 1000.0 / 3.0 + solo_ms);
                    let r = Request {
                        at_ms,
                        video: true,
                        size: v.size.clone(),
                        kind,
                        seconds,
                        solo_ms,
                        deadline_ms,
                    };
                    let o = run(&[r], 8, &p, &cfg);
                    assert_eq!(
                        o.videos_met, 1,
                        "{mode:?} {} {seconds} s: {} ms for {solo_ms} ms",
                        v.size, o.latency_ms[0]
                    );
                }
            }
        }
    }
}
