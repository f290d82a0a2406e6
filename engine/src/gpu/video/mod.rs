//! The chunked video model on a [`Device`]: one coalesced batch of chunks
//! runs as one launch sequence per denoising step, every member at once.
//!
//! Per batch: the members' starting noise (host-seeded, the cpu backend's)
//! and contexts (sink + window) are uploaded, and the contexts' keys and
//! values projected once (they do not change during a chunk). Per step k,
//! over the members with more than k steps: project the chunk tokens' keys,
//! values and queries (`video_project` ×3), pick each member's context
//! blocks (`video_query_mean`, `video_key_dots`, `video_select`), attend
//! (`video_attend` over query tiles and column splits, then
//! `video_attend_merge`), and the MLP, prediction and path update
//! (`video_update`). Then frames for every member
//! (`video_decode`) and one download of latents and pixels.

mod contexts;
mod plan;

use std::sync::{Arc, Mutex, MutexGuard};

use kernels::video::CHANNELS;
use kernels::{f32_bytes, Arg, Device, Result, BLOCK};

pub use contexts::ContextStats;
use contexts::Contexts;
use plan::{Member, Plan, StepTables, Work};

pub use crate::models::video::BatchItem;
use crate::models::video::{Resolution, VideoModel};

/// The model's weights on a device, and the sessions' contexts kept there
/// between chunks.
pub struct GpuVideo<D: Device> {
    dev: Arc<D>,
    /// wq, wk, wv, wo, w1, w2, to_rgb.
    w: Vec<D::Buf>,
    contexts: Mutex<Contexts<D>>,
}

/// What a batch produced for one member.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkResult {
    /// The clean latent (tokens × CHANNELS).
    pub latent: Vec<f32>,
    /// RGB frames, 4 per latent frame, `pixels²·3` bytes each.
    pub frames: Vec<Vec<u8>>,
}

fn grid(n: usize) -> (u32, u32, u32) {
    ((n as u32).div_ceil(BLOCK).max(1), 1, 1)
}

impl<D: Device> GpuVideo<D> {
    /// Uploads the weights of `model`.
    pub fn new(dev: Arc<D>, model: &VideoModel) -> Result<Self> {
        let mut w = Vec::new();
        for t in model.tensors() {
            let b = dev.alloc(t.len() * 4)?;
            dev.upload(&b, 0, &f32_bytes(t))?;
            w.push(b);
        }
        let contexts = Mutex::new(Contexts::new(Arc::clone(&dev)));
        Ok(Self { dev, w, contexts })
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    fn contexts(&self) -> MutexGuard<'_, Contexts<D>> {
        self.contexts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How batches found their contexts so far.
    pub fn context_stats(&self) -> ContextStats {
        self.contexts().stats
    }

    /// Starts moving `session`'s context to pinned host memory (the
    /// scheduler suspended it); the copy overlaps the next batch.
    pub fn offload(&self, session: &str) -> Result<()> {
        self.contexts().offload(session)
    }

    /// Starts bringing `session`'s context back (the scheduler resumed it);
    /// the next batch's compute waits for the copy, nothing else does.
    pub fn restore(&self, session: &str) -> Result<()> {
        self.contexts().restore(session)
    }

    /// Drops `session`'s context (it ended, or its state was replaced).
    pub fn forget(&self, session: &str) {
        if let Err(e) = self.contexts().forget(session) {
            tracing::warn!(event = "gpu_forget_failed", session, error = %e);
        }
    }

    /// Whether `session`'s context is in device memory.
    pub fn resident(&self, session: &str) -> Option<bool> {
        self.contexts().on_device(session)
    }

    /// Denoises one chunk per item (step k of every member together) and
    /// decodes its frames; advances each item's state like the cpu backend.
    ///
    /// States advance only once every device call has succeeded: on an
    /// error no item's state has changed.
    ///
    /// Everything the launches index (per-step member tables, token lists,
    /// gather lists) is built on the host first and uploaded in one copy,
    /// with the noise in another; then the whole batch is launched without
    /// waiting, and the one download at the end waits for it.
    pub fn run_batch(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut contexts = self.contexts();
        let keys: Vec<String> = items.iter().enumerate().map(|(i, it)| contexts::key(it, i)).collect();
        let outcome = self.launch(&mut contexts, items, &keys);
        contexts.end_batch(items, &keys)?;
        let out = outcome?;
        for (it, r) in items.iter_mut().zip(&out) {
            model.finish_chunk(it.state, r.latent.clone());
        }
        Ok(out)
    }

    /// Everything of a batch on the device, up to its download.
    fn launch(
        &self,
        contexts: &mut Contexts<D>,
        items: &[BatchItem<'_>],
        keys: &[String],
    ) -> Result<Vec<ChunkResult>> {
        let dev = &*self.dev;
        for (it, key) in items.iter().zip(keys) {
            contexts.locate(it, key)?;
        }
        let members: Vec<Member<'_>> = items.iter().map(Member::chunk).collect();
        let (plan, stage) = Plan::build(&members);
        let work = Work::alloc(dev, &plan, stage)?;
        // Context keys and values, once per chunk.
        for ((l, at), key) in plan.lay.iter().zip(&plan.ctx_gather).zip(keys) {
            if let Some(at) = at {
                let src = contexts.buf(key)?;
                self.project(&work, src, *at, l.m, &self.w[1], &work.keys)?;
                self.project(&work, src, *at, l.m, &self.w[2], &work.vals)?;
            }
        }
        for st in &plan.steps {
            self.denoise_step(&work, st)?;
        }
        self.decode(&plan, &work)?;
        // Each session's next context, built on the device from its current
        // one and the new chunk (the cpu backend's `finish_chunk`).
        for ((l, it), key) in plan.lay.iter().zip(items).zip(keys) {
            if it.session.is_some() {
                contexts.advance(dev, key, it, (&work.x, l.x_off * CHANNELS * 4), l.n)?;
            }
        }
        let (latents, pixels) = work.read(dev, &plan)?;
        Ok(plan.results(&members, &latents, &pixels))
    }

    /// Diffusion jobs (issue 24): steps `from..to` of each job's schedule
    /// over its latent (no context), every job's step k in one launch
    /// sequence; the latents advance in place. The VAE decode is the
    /// caller's (on the host).
    pub fn run_steps(&self, jobs: &mut [StepJob<'_>]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let members: Vec<Member<'_>> = jobs
            .iter()
            .map(|j| Member {
                state: j.prompt,
                fidelity: policies::video::Fidelity::HIGHEST,
                res: j.res,
                latent_frames: j.latent.len() / (CHANNELS * j.res.latent_side() * j.res.latent_side()),
                start: Some(&j.latent[..]),
                from: j.from as usize,
                to: j.to as usize,
                total: j.total as usize,
            })
            .collect();
        let (plan, stage) = Plan::build(&members);
        let work = Work::alloc(&*self.dev, &plan, stage)?;
        for st in &plan.steps {
            self.denoise_step(&work, st)?;
        }
        let latents = work.latents(&*self.dev, &plan)?;
        for (j, l) in jobs.iter_mut().zip(&plan.lay) {
            j.latent.copy_from_slice(&latents[l.x_off * CHANNELS..(l.x_off + l.n) * CHANNELS]);
        }
        Ok(())
    }

    /// `video_project` of `count` tokens of `src` through `w` into `out`,
    /// by the gather table at `at` (source, destination, fp8 flag).
    fn project(
        &self,
        work: &Work<D::Buf>,
        src: &D::Buf,
        at: [usize; 3],
        count: usize,
        w: &D::Buf,
        out: &D::Buf,
    ) -> Result<()> {
        self.dev.launch(
            "video_project",
            grid(count),
            &[
                Arg::Buf(src, 0),
                Arg::Buf(&work.tables, at[0]),
                Arg::Buf(&work.tables, at[1]),
                Arg::Buf(&work.tables, at[2]),
                Arg::Buf(w, 0),
                Arg::Buf(out, 0),
                Arg::I32(count as i32),
            ],
        )
    }

    /// Each member's attention columns (`cols`, `ncols`): its mean query,
    /// that query's dot with every context key, the best blocks.
    fn select(&self, work: &Work<D::Buf>, st: &StepTables) -> Result<()> {
        let t = &work.tables;
        self.dev.launch(
            "video_query_mean",
            (st.members as u32, 1, 1),
            &[Arg::Buf(&work.q, 0), Arg::Buf(t, st.meta), Arg::Buf(&work.qmean, 0)],
        )?;
        if st.max_context > 0 {
            self.dev.launch(
                "video_key_dots",
                (grid(st.max_context).0, st.members as u32, 1),
                &[
                    Arg::Buf(&work.qmean, 0),
                    Arg::Buf(&work.keys, 0),
                    Arg::Buf(t, st.meta),
                    Arg::Buf(&work.dots, 0),
                ],
            )?;
        }
        self.dev.launch(
            "video_select",
            (st.members as u32, 1, 1),
            &[
                Arg::Buf(&work.dots, 0),
                Arg::Buf(t, st.meta),
                Arg::Buf(&work.bscore, 0),
                Arg::Buf(&work.flags, 0),
                Arg::Buf(&work.cols, 0),
                Arg::Buf(&work.ncols, 0),
            ],
        )?;
        Ok(())
    }

    /// Attention of every chunk token over its member's columns: the
    /// column splits' partial softmaxes, then their merge into `attn`.
    fn attend(&self, work: &Work<D::Buf>, st: &StepTables) -> Result<()> {
        let t = &work.tables;
        self.dev.launch(
            "video_attend",
            (st.tiles as u32, st.splits as u32, 1),
            &[
                Arg::Buf(&work.q, 0),
                Arg::Buf(&work.keys, 0),
                Arg::Buf(&work.vals, 0),
                Arg::Buf(t, st.tok_g),
                Arg::Buf(t, st.tok_slot),
                Arg::Buf(t, st.meta),
                Arg::Buf(&work.cols, 0),
                Arg::Buf(&work.ncols, 0),
                Arg::Buf(t, st.tile_tok),
                Arg::Buf(t, st.tile_cnt),
                Arg::Buf(&work.partial, 0),
            ],
        )?;
        self.dev.launch(
            "video_attend_merge",
            grid(st.tokens * kernels::video::DIM),
            &[
                Arg::Buf(&work.partial, 0),
                Arg::Buf(t, st.tok_g),
                Arg::I32(st.tokens as i32),
                Arg::I32(st.splits as i32),
                Arg::Buf(&work.attn, 0),
            ],
        )
    }

    /// One denoising step of every member with more than k steps.
    fn denoise_step(&self, work: &Work<D::Buf>, st: &StepTables) -> Result<()> {
        let (wq, wk, wv, wo, w1, w2) =
            (&self.w[0], &self.w[1], &self.w[2], &self.w[3], &self.w[4], &self.w[5]);
        let t = &work.tables;
        // Chunk keys and values (into each member's kv region after its
        // context) and queries (indexed like x).
        for (w, out, dst) in
            [(wk, &work.keys, st.kv_dst), (wv, &work.vals, st.kv_dst), (wq, &work.q, st.tok_g)]
        {
            self.project(work, &work.x, [st.tok_g, dst, st.flag], st.tokens, w, out)?;
        }
        self.select(work, st)?;
        self.attend(work, st)?;
        self.dev.launch(
            "video_update",
            grid(st.tokens),
            &[
                Arg::Buf(&work.x, 0),
                Arg::Buf(&work.attn, 0),
                Arg::Buf(t, st.tok_g),
                Arg::Buf(t, st.tok_slot),
                Arg::Buf(t, st.meta),
                Arg::Buf(t, st.mparam),
                Arg::Buf(wo, 0),
                Arg::Buf(w1, 0),
                Arg::Buf(w2, 0),
                Arg::I32(st.tokens as i32),
            ],
        )
    }

    /// Frames of every member in one launch.
    fn decode(&self, plan: &Plan, work: &Work<D::Buf>) -> Result<()> {
        self.dev.launch(
            "video_decode",
            (grid(plan.widest).0, plan.lay.len() as u32, 1),
            &[
                Arg::Buf(&work.x, 0),
                Arg::Buf(&self.w[6], 0),
                Arg::Buf(&work.tables, plan.decode_meta),
                Arg::Buf(&work.tables, plan.decode_out),
                Arg::Buf(&work.rgb, 0),
            ],
        )
    }
}

/// One diffusion job's steps for [`GpuVideo::run_steps`]: its latent at
/// step `from` of `total` (a whole number of latent frames), advanced to
/// step `to`.
pub struct StepJob<'a> {
    pub prompt: &'a crate::models::video::StreamState,
    pub res: Resolution,
    pub latent: &'a mut [f32],
    pub from: u32,
    pub to: u32,
    pub total: u32,
}

/// What the video scheduler calls on the cuda backend, whatever the device.
pub trait VideoRunner: Send + Sync {
    /// Runs one coalesced batch; see [`GpuVideo::run_batch`].
    fn run(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>>;
    /// Runs diffusion steps; see [`GpuVideo::run_steps`].
    fn steps(&self, jobs: &mut [StepJob<'_>]) -> Result<()>;
    /// The device, for logs.
    fn device_name(&self) -> String;
    /// The scheduler suspended `session`: move its device state out.
    fn offload(&self, _session: &str) {}
    /// The scheduler resumed `session`: bring its device state back.
    fn restore(&self, _session: &str) {}
    /// `session` ended or its state was replaced.
    fn forget(&self, _session: &str) {}
}

impl<D: Device> VideoRunner for GpuVideo<D> {
    fn run(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>> {
        self.run_batch(model, items)
    }

    fn steps(&self, jobs: &mut [StepJob<'_>]) -> Result<()> {
        self.run_steps(jobs)
    }

    fn device_name(&self) -> String {
        self.dev.name()
    }

    fn offload(&self, session: &str) {
        if let Err(e) = GpuVideo::offload(self, session) {
            tracing::warn!(event = "gpu_offload_failed", session, error = %e);
            self.forget(session);
        }
    }

    fn restore(&self, session: &str) {
        if let Err(e) = GpuVideo::restore(self, session) {
            tracing::warn!(event = "gpu_restore_failed", session, error = %e);
            self.forget(session);
        }
    }

    fn forget(&self, session: &str) {
        GpuVideo::forget(self, session);
    }
}

/// One chunk of a scratch stream, so the first real batch does not pay for
/// first launches.
pub fn warm_up<D: Device>(gpu: &GpuVideo<D>, model: &VideoModel) -> Result<()> {
    let mut state = crate::models::video::StreamState::new("warm up");
    let mut items = [BatchItem {
        session: None,
        state: &mut state,
        fidelity: policies::video::Fidelity::HIGHEST,
        res: Resolution::Tiny,
        latent_frames: 1,
    }];
    gpu.run_batch(model, &mut items).map(|_| ())
}
