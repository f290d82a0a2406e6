//! Running one coalesced batch of video chunks: the cpu backend's
//! step-synchronous denoising (step k of every member together, members in
//! parallel) and frames as PNG; the emulated backend's placeholder frames.

use super::model::{BatchItem, Resolution, StreamState, VideoModel};
use super::sched::Member;
use super::{base64, png};
use crate::gpu::video::VideoRunner;

/// The cpu backend's coalesced batch: denoising step k of every member
/// whose configuration has more than k steps, members in parallel; then
/// frames (PNG, base64) per member.
pub(crate) fn run_cpu_batch(model: &VideoModel, members: &mut [Member], threads: usize) -> Vec<Vec<String>> {
    let items = items_of(members, false);
    let res: Vec<Resolution> = items.iter().map(|i| i.res).collect();
    let latents = denoise_batch(model, items, threads);
    latents.iter().zip(res).map(|(l, r)| encode_frames(&model.decode(l, r), r)).collect()
}

/// The cuda backend's coalesced batch (one launch sequence per denoising
/// step for all members, see `crate::gpu::video`), frames encoded here. A
/// device error is logged and the batch recomputed on the host (the same
/// math), so a stream never loses a chunk to it; a failed GPU batch has
/// not advanced any state, so the host starts from where the GPU did.
pub(crate) fn run_gpu_batch(
    gpu: &dyn VideoRunner,
    model: &VideoModel,
    members: &mut [Member],
    threads: usize,
) -> Vec<Vec<String>> {
    let mut items = items_of(members, true);
    let res: Vec<Resolution> = items.iter().map(|i| i.res).collect();
    match gpu.run(model, &mut items) {
        Ok(out) => out.iter().zip(res).map(|(c, r)| encode_frames(&c.frames, r)).collect(),
        Err(e) => {
            tracing::error!(event = "gpu_batch_failed", device = %gpu.device_name(), error = %e, "recomputing the batch on the host");
            drop(items);
            run_cpu_batch(model, members, threads)
        }
    }
}

/// The batch items of the scheduler's members (naming their sessions when
/// the backend keeps state per session).
fn items_of(members: &mut [Member], sessions: bool) -> Vec<BatchItem<'_>> {
    members
        .iter_mut()
        .map(|m| BatchItem {
            session: sessions.then_some(m.pending.id.as_str()),
            state: &mut m.state,
            fidelity: m.pending.req.fidelity,
            res: m.res,
            latent_frames: m.latent_frames as usize,
        })
        .collect()
}

/// Denoises one chunk per item, step by step across the batch (step k of
/// every item that has more than k steps, items split over `threads`);
/// advances each state and returns each chunk's latent.
pub(crate) fn denoise_batch(
    model: &VideoModel,
    mut items: Vec<BatchItem<'_>>,
    threads: usize,
) -> Vec<Vec<f32>> {
    let mut latents: Vec<Vec<f32>> =
        items.iter().map(|m| VideoModel::noise(m.state, m.res, m.latent_frames)).collect();
    let max_steps = items.iter().map(|m| m.fidelity.steps).max().unwrap_or(0);
    for k in 0..usize::from(max_steps) {
        let mut work: Vec<(&BatchItem<'_>, &mut Vec<f32>)> =
            items.iter().zip(latents.iter_mut()).filter(|(m, _)| usize::from(m.fidelity.steps) > k).collect();
        let per = work.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|scope| {
            while !work.is_empty() {
                let part: Vec<_> = work.drain(..per.min(work.len())).collect();
                scope.spawn(move || {
                    for (m, x) in part {
                        let s = usize::from(m.fidelity.steps);
                        let (t, t_next) = (1.0 - k as f32 / s as f32, 1.0 - (k + 1) as f32 / s as f32);
                        model.step(x, m.state, &m.fidelity, m.res.latent_side(), t, t_next);
                    }
                });
            }
        });
    }
    for (m, latent) in items.iter_mut().zip(&latents) {
        model.finish_chunk(m.state, latent.clone());
    }
    latents
}

pub(crate) fn encode_frames(frames: &[Vec<u8>], res: Resolution) -> Vec<String> {
    let px = res.pixels() as u32;
    frames.iter().map(|f| base64(&png::encode_rgb(px, px, f))).collect()
}

/// Cheap frames for the emulated backend: a colour field seeded by the
/// prompt that drifts from chunk to chunk (watchable, not the model's).
pub(crate) fn placeholder_frames(state: &StreamState, res: Resolution, latent_frames: u32) -> Vec<String> {
    let px = res.pixels();
    let frames: Vec<Vec<u8>> = (0..latent_frames as usize * 4)
        .map(|f| {
            let t = state.chunks as f32 * 0.7 + f as f32 * 0.05;
            let mut img = vec![0u8; px * px * 3];
            for y in 0..px {
                for x in 0..px {
                    for c in 0..3 {
                        let p = state.prompt[c];
                        let v = ((x as f32 * 0.2 * p + y as f32 * 0.15 + t + c as f32 * 2.0).sin() * 0.5
                            + 0.5)
                            * 255.0;
                        img[(y * px + x) * 3 + c] = v as u8;
                    }
                }
            }
            img
        })
        .collect();
    encode_frames(&frames, res)
}
