//! Diffusion jobs (GenServe, issue 24): image batches and whole videos
//! denoised step by step on this engine's GPU lane.
//!
//! The gateway's pool scheduler decides what runs where; the engine runs
//! one job at a time (an image batch to completion, or a round of a
//! video's steps) and keeps each video's state between rounds: paused in
//! place, or exported and imported when the scheduler resumes it on another
//! engine. The synthetic model is the chunked video DiT's step
//! (`video::model`) over a latent of the job's own: an image is one latent
//! frame, a video `⌈frames / 20⌉` (at most 4); a step at level `t` depends
//! only on the latent, the prompt and `t`, so a paused and resumed job
//! produces the same pixels as an uninterrupted one.
//!
//! Backends: `cpu` and `cuda` compute every step at the model's resolution
//! (images and videos up to 512 px a side at 32 × 32 pixels, larger at
//! 64 × 64) and take the time that takes: `cpu` on the host, one prompt
//! after another; `cuda` with the video model's kernels over the diffusion
//! model's weights, every prompt of an image batch in one launch sequence
//! per step (`GpuVideo::run_steps`); the latent goes up and comes back each
//! round (a paused video's state stays on the host, where export and
//! import read it), and the VAE decode and PNG encoding run on the host; `emulated` computes the same steps at 32 × 32
//! and waits until the profile's time has passed (`T_img(b)` per batch,
//! `T_step(p)` per step at SP degree `p`). Sequence parallelism is
//! emulated only: the lead engine runs the steps at the profile's `T_step(p)`
//! and the gateway holds the `p − 1` helpers idle; no activations move
//! between engines. Images come back at the requested size (the model's
//! picture scaled up, nearest neighbour); a video as an animated PNG at the
//! model's resolution, 4 frames per latent frame.

pub mod profile;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_api::diffusion::{ImagesRequest, StepsRequest, StepsResponse};
use engine_api::video::{Fidelity, Resolution};
use policies::diffusion::{parse_size, DiffusionProfile, SizeId};

use crate::backend::BackendKind;
use crate::gpu::video::{StepJob, VideoRunner};
use crate::video::model::{StreamState, VideoModel, CHANNELS};
use crate::video::png;

impl std::fmt::Debug for DiffusionEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffusionEngine")
            .field("model", &self.profile.model)
            .field("videos", &self.videos())
            .finish()
    }
}

/// Videos whose state this engine keeps at once (running or paused).
pub const MAX_VIDEOS: usize = 64;
/// Most bytes one exported state may have (import bound).
pub const MAX_STATE_BYTES: usize = 16 << 20;

/// Why a diffusion call failed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DiffusionError {
    #[error("size `{0}` is not in this engine's diffusion profile")]
    UnknownSize(String),
    #[error("no video `{0}` on this engine")]
    NoVideo(String),
    #[error("video `{0}` does not match the job it was created as")]
    Mismatch(String),
    #[error("this engine already keeps {MAX_VIDEOS} videos")]
    Full,
    #[error("bad state: {0}")]
    BadState(String),
    #[error("{0}")]
    Invalid(String),
    /// The device or a compute task failed; the job's state is unchanged.
    #[error("{0}")]
    Failed(String),
}

impl DiffusionError {
    pub fn code(&self) -> &'static str {
        match self {
            DiffusionError::UnknownSize(_) => "unknown_size",
            DiffusionError::NoVideo(_) => "no_video",
            DiffusionError::Mismatch(_) => "mismatch",
            DiffusionError::Full => "too_many_videos",
            DiffusionError::BadState(_) => "bad_state",
            DiffusionError::Invalid(_) => "invalid_request",
            DiffusionError::Failed(_) => "engine_error",
        }
    }
}

/// One video's state between rounds.
#[derive(Debug, Clone, PartialEq)]
struct VideoJob {
    prompt: String,
    seed: u64,
    size: String,
    frames: u32,
    total: u32,
    done: u32,
    latent: Vec<f32>,
}

/// The engine's diffusion side.
pub struct DiffusionEngine {
    pub profile: DiffusionProfile,
    pub profile_toml: String,
    backend: BackendKind,
    model: Arc<VideoModel>,
    /// The diffusion model on the GPU (the cuda backend).
    gpu: Option<Arc<dyn VideoRunner>>,
    /// One job at a time on this GPU.
    lane: tokio::sync::Mutex<()>,
    videos: Mutex<HashMap<String, VideoJob>>,
}

/// The model's resolution for a requested size (see the module docs).
fn model_res(backend: BackendKind, size: &str) -> Resolution {
    let (w, h) = parse_size(size).unwrap_or((1, 1));
    match backend {
        BackendKind::Emulated => Resolution::Tiny,
        _ if w.max(h) <= 512 => Resolution::Tiny,
        _ => Resolution::Small,
    }
}

fn latent_frames(backend: BackendKind, frames: u32) -> usize {
    match backend {
        BackendKind::Emulated => 1,
        _ => frames.div_ceil(20).clamp(1, 4) as usize,
    }
}

/// The diffusion jobs' model (its own weights, not the live video's).
pub fn model(seed: u64) -> VideoModel {
    crate::models::video::diffusion_model(seed)
}

/// Steps `from..to` of `total` of each latent (all at `res`, one prompt
/// each): on the GPU as one batch when there is one, else on the host one
/// after another. On an error no latent has changed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn advance(
    gpu: Option<&dyn VideoRunner>,
    model: &VideoModel,
    res: Resolution,
    latents: &mut [Vec<f32>],
    prompts: &[StreamState],
    from: u32,
    to: u32,
    total: u32,
) -> Result<(), DiffusionError> {
    let side = res.latent_side();
    let Some(gpu) = gpu else {
        for (x, p) in latents.iter_mut().zip(prompts) {
            (from..to).for_each(|k| step(model, x, p, side, k, total));
        }
        return Ok(());
    };
    let mut jobs: Vec<StepJob<'_>> = latents
        .iter_mut()
        .zip(prompts)
        .map(|(x, prompt)| StepJob { prompt, res, latent: x, from, to, total })
        .collect();
    gpu.steps(&mut jobs).map_err(|e| DiffusionError::Failed(format!("device: {e}")))
}

fn noise(seed: u64, prompt: &str, len: usize) -> Vec<f32> {
    let mut state = StreamState::new(prompt);
    state.seed ^= seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = policies::rng::SplitMix(state.seed);
    (0..len).map(|_| rng.normal() as f32).collect()
}

/// One denoising step `k` of `total` on `latent`.
fn step(model: &VideoModel, latent: &mut [f32], prompt: &StreamState, side: usize, k: u32, total: u32) {
    let (t, t_next) = (1.0 - k as f32 / total as f32, 1.0 - (k + 1) as f32 / total as f32);
    model.step(latent, prompt, &Fidelity::HIGHEST, side, t, t_next);
}

/// `rgb` (`side × side`) scaled to `w × h`, nearest neighbour.
fn scale(rgb: &[u8], side: usize, w: u32, h: u32) -> Vec<u8> {
    let (w, h) = (w as usize, h as usize);
    let mut out = vec![0u8; w * h * 3];
    for y in 0..h {
        let sy = y * side / h;
        for x in 0..w {
            let sx = x * side / w;
            out[(y * w + x) * 3..(y * w + x) * 3 + 3]
                .copy_from_slice(&rgb[(sy * side + sx) * 3..(sy * side + sx) * 3 + 3]);
        }
    }
    out
}

impl DiffusionEngine {
    pub fn new(
        backend: BackendKind,
        profile: DiffusionProfile,
        profile_toml: String,
        model_seed: u64,
    ) -> Self {
        Self {
            profile,
            profile_toml,
            backend,
            model: Arc::new(model(model_seed)),
            gpu: None,
            lane: tokio::sync::Mutex::new(()),
            videos: Mutex::new(HashMap::new()),
        }
    }

    /// Runs the jobs' steps on `gpu` (the cuda backend) rather than the host.
    pub fn with_gpu(mut self, gpu: Option<Arc<dyn VideoRunner>>) -> Self {
        self.gpu = gpu;
        self
    }

    fn image_size(&self, size: &str) -> Result<SizeId, DiffusionError> {
        self.profile.image_size(size).ok_or_else(|| DiffusionError::UnknownSize(size.to_string()))
    }

    /// Runs one image batch; PNGs in prompt order.
    pub async fn images(&self, req: ImagesRequest) -> Result<Vec<Vec<u8>>, DiffusionError> {
        req.validate().map_err(DiffusionError::Invalid)?;
        let size = self.image_size(&req.size)?;
        let _lane = self.lane.lock().await;
        let start = crate::clock::now();
        let (backend, model, steps) = (self.backend, Arc::clone(&self.model), self.profile.image_steps);
        let gpu = self.gpu.clone();
        let (w, h) = parse_size(&req.size).expect("profile sizes parse");
        let pngs = tokio::task::spawn_blocking(move || {
            let res = model_res(backend, &req.size);
            let side = res.latent_side();
            let prompts: Vec<StreamState> = req.prompts.iter().map(|p| StreamState::new(p)).collect();
            let mut xs: Vec<Vec<f32>> = (req.prompts.iter().enumerate())
                .map(|(i, p)| noise(req.seed.wrapping_add(i as u64), p, side * side * CHANNELS))
                .collect();
            advance(gpu.as_deref(), &model, res, &mut xs, &prompts, 0, steps, steps)?;
            let png = |x: &Vec<f32>| {
                let frame = model.decode(x, res).swap_remove(0);
                png::encode_rgb(w, h, &scale(&frame, res.pixels(), w, h))
            };
            Ok::<_, DiffusionError>(xs.iter().map(png).collect::<Vec<_>>())
        })
        .await
        .map_err(|e| DiffusionError::Failed(format!("image task failed: {e}")))??;
        if self.backend == BackendKind::Emulated {
            let target = self.profile.image_ms(size, pngs.len() as u32);
            sleep_until(start, target).await;
        }
        Ok(pngs)
    }

    /// Runs `req.steps` more steps of video `id` (creating it on the first
    /// call); the state stays here for the next round.
    pub async fn steps(&self, id: &str, req: StepsRequest) -> Result<StepsResponse, DiffusionError> {
        req.validate().map_err(DiffusionError::Invalid)?;
        let size = self
            .profile
            .video_size(&req.size)
            .ok_or_else(|| DiffusionError::UnknownSize(req.size.clone()))?;
        let _lane = self.lane.lock().await;
        let mut job = self.take_or_create(id, &req)?;
        let start = crate::clock::now();
        let n = req.steps.min(job.total - job.done);
        let (backend, model, gpu) = (self.backend, Arc::clone(&self.model), self.gpu.clone());
        let id_owned = id.to_string();
        let ran = tokio::task::spawn_blocking(move || {
            let res = model_res(backend, &job.size);
            let state = StreamState::new(&job.prompt);
            let mut latent = [std::mem::take(&mut job.latent)];
            let (from, total) = (job.done, job.total);
            let ran = advance(gpu.as_deref(), &model, res, &mut latent, &[state], from, from + n, total);
            [job.latent] = latent;
            if ran.is_ok() {
                job.done += n;
            }
            (job, ran)
        })
        .await;
        let (job, ran) = ran.map_err(|e| DiffusionError::Failed(format!("step task failed: {e}")))?;
        let out = StepsResponse { steps_done: job.done, steps_left: job.total - job.done };
        self.videos.lock().expect("videos lock").insert(id_owned, job);
        ran?;
        if self.backend == BackendKind::Emulated {
            let target = f64::from(n) * self.profile.video_step_ms(size, req.frames, req.sp);
            sleep_until(start, target).await;
        }
        Ok(out)
    }

    fn take_or_create(&self, id: &str, req: &StepsRequest) -> Result<VideoJob, DiffusionError> {
        let mut videos = self.videos.lock().expect("videos lock");
        if let Some(job) = videos.remove(id) {
            if job.size != req.size || job.frames != req.frames || job.total != req.total_steps {
                videos.insert(id.to_string(), job);
                return Err(DiffusionError::Mismatch(id.to_string()));
            }
            return Ok(job);
        }
        if videos.len() >= MAX_VIDEOS {
            return Err(DiffusionError::Full);
        }
        let res = model_res(self.backend, &req.size);
        let len = latent_frames(self.backend, req.frames) * res.latent_side() * res.latent_side() * CHANNELS;
        Ok(VideoJob {
            prompt: req.prompt.clone(),
            seed: req.seed,
            size: req.size.clone(),
            frames: req.frames,
            total: req.total_steps,
            done: 0,
            latent: noise(req.seed, &req.prompt, len),
        })
    }

    /// Decodes a finished video (VAE on this engine) into an animated PNG
    /// and drops its state.
    pub async fn decode(&self, id: &str) -> Result<Vec<u8>, DiffusionError> {
        let _lane = self.lane.lock().await;
        let job = self.take(id)?;
        if job.done < job.total {
            let left = job.total - job.done;
            self.videos.lock().expect("videos lock").insert(id.to_string(), job);
            return Err(DiffusionError::Invalid(format!("{left} steps left before decoding")));
        }
        let size = self
            .profile
            .video_size(&job.size)
            .ok_or_else(|| DiffusionError::UnknownSize(job.size.clone()))?;
        let start = crate::clock::now();
        let (backend, model, fps) = (self.backend, Arc::clone(&self.model), self.profile.video_fps);
        let frames = job.frames;
        let apng = tokio::task::spawn_blocking(move || {
            let res = model_res(backend, &job.size);
            let rgb = model.decode(&job.latent, res);
            let px = res.pixels() as u32;
            png::encode_apng(px, px, &rgb, u16::try_from(fps).unwrap_or(u16::MAX))
        })
        .await
        .map_err(|e| DiffusionError::Invalid(format!("decode task failed: {e}")))?;
        if self.backend == BackendKind::Emulated {
            sleep_until(start, self.profile.video_vae_ms(size, frames)).await;
        }
        Ok(apng)
    }

    fn take(&self, id: &str) -> Result<VideoJob, DiffusionError> {
        self.videos.lock().expect("videos lock").remove(id).ok_or_else(|| DiffusionError::NoVideo(id.into()))
    }

    /// Drops a video's state (cancelled, or moved away); whether it was here.
    pub fn drop_video(&self, id: &str) -> bool {
        self.videos.lock().expect("videos lock").remove(id).is_some()
    }

    /// Videos kept here.
    pub fn videos(&self) -> usize {
        self.videos.lock().expect("videos lock").len()
    }

    /// A video's state as bytes (removed here: the importer owns it next).
    pub fn export(&self, id: &str) -> Result<Vec<u8>, DiffusionError> {
        let job = self.take(id)?;
        let head = serde_json::json!({
            "prompt": job.prompt, "seed": job.seed, "size": job.size,
            "frames": job.frames, "total": job.total, "done": job.done, "floats": job.latent.len(),
        });
        let mut out = serde_json::to_vec(&head).expect("serialises");
        out.push(b'\n');
        job.latent.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        Ok(out)
    }

    /// Takes a state exported by another engine.
    pub fn import(&self, id: &str, bytes: &[u8]) -> Result<(), DiffusionError> {
        let bad = |m: &str| DiffusionError::BadState(m.to_string());
        let nl = bytes.iter().position(|&b| b == b'\n').ok_or_else(|| bad("no header"))?;
        let head: serde_json::Value =
            serde_json::from_slice(&bytes[..nl]).map_err(|e| bad(&e.to_string()))?;
        let get = |k: &str| head.get(k).and_then(serde_json::Value::as_u64).ok_or_else(|| bad(k));
        let text = |k: &str| {
            head.get(k).and_then(serde_json::Value::as_str).map(str::to_string).ok_or_else(|| bad(k))
        };
        let floats = get("floats")? as usize;
        let body = &bytes[nl + 1..];
        if body.len() != floats * 4 {
            return Err(bad("latent length"));
        }
        let size = text("size")?;
        if self.profile.video_size(&size).is_none() {
            return Err(DiffusionError::UnknownSize(size));
        }
        let (total, done) = (get("total")? as u32, get("done")? as u32);
        let frames = get("frames")? as u32;
        let res = model_res(self.backend, &size);
        let want = latent_frames(self.backend, frames) * res.latent_side() * res.latent_side() * CHANNELS;
        if done > total || floats != want {
            return Err(bad("steps or latent shape"));
        }
        let latent = body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let job = VideoJob { prompt: text("prompt")?, seed: get("seed")?, size, frames, total, done, latent };
        let mut videos = self.videos.lock().expect("videos lock");
        if !videos.contains_key(id) && videos.len() >= MAX_VIDEOS {
            return Err(DiffusionError::Full);
        }
        videos.insert(id.to_string(), job);
        Ok(())
    }
}

/// The last part of an emulated wait, slept on a blocking thread.
const FINE_WAIT: Duration = Duration::from_millis(2);

/// Waits until `ms` have passed since `start` (the emulated backend's
/// time: computing the picture already took some of it). tokio's timer
/// fires on whole milliseconds, up to ~1.5 ms late each time: a video run
/// in ten rounds would end ~12 ms after the same video run in one call,
/// an artefact no GPU has. So the last [`FINE_WAIT`] is a thread sleep
/// (the kernel's high-resolution timer: ~0.1 ms late).
async fn sleep_until(start: std::time::Instant, ms: f64) {
    let target = Duration::from_secs_f64(ms.clamp(0.0, 86_400_000.0) / 1000.0);
    let spent = crate::clock::since(start);
    if target.saturating_sub(FINE_WAIT) > spent {
        tokio::time::sleep(target - FINE_WAIT - spent).await;
    }
    let rest = target.saturating_sub(crate::clock::since(start));
    if !rest.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

#[cfg(test)]
mod tests;
