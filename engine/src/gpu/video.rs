//! The chunked video model on a [`Device`]: one coalesced batch of chunks
//! runs as one launch sequence per denoising step, every member at once.
//!
//! Per batch: the members' starting noise (host-seeded, the cpu backend's)
//! and contexts (sink + window) are uploaded, and the contexts' keys and
//! values projected once (they do not change during a chunk). Per step k,
//! over the members with more than k steps: project the chunk tokens' keys,
//! values and queries (`video_project` ×3), pick each member's context
//! blocks (`video_select`), attend (`video_attend`), and the MLP, prediction
//! and path update (`video_update`). Then frames for every member
//! (`video_decode`) and one download of latents and pixels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kernels::video::{CHANNELS, DIM, MF, MI};
use kernels::{f32_bytes, f32s, Arg, Device, DeviceError, Result, BLOCK};
use policies::video::Precision;

use super::offload::StateStore;
use crate::video::model::{Resolution, VideoModel, MAX_WINDOW};

pub use crate::video::BatchItem;

/// The model's weights on a device, and the sessions' contexts kept there
/// between chunks.
pub struct GpuVideo<D: Device> {
    dev: Arc<D>,
    /// wq, wk, wv, wo, w1, w2, to_rgb.
    w: Vec<D::Buf>,
    contexts: Mutex<Contexts<D>>,
}

/// Each session's full context (sink, then up to [`MAX_WINDOW`] chunks,
/// oldest first) on the device or offloaded to pinned host memory, tagged
/// with the state it belongs to (prompt seed, chunks generated). A batch
/// uses a resident context instead of uploading it and leaves the updated
/// one behind; a tag that does not match the host state (a prompt switch,
/// an import) means the host state is uploaded again.
struct Contexts<D: Device> {
    store: StateStore<D>,
    tags: HashMap<String, (u64, u64)>,
    stats: ContextStats,
}

/// How batches found their contexts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextStats {
    /// Contexts found in device memory (including those whose restore the
    /// scheduler issued when it resumed the session).
    pub resident: u64,
    /// Restores issued from pinned memory (by a resume, or by a batch that
    /// found the context offloaded).
    pub restored: u64,
    /// Contexts uploaded from the host state.
    pub uploaded: u64,
    /// Contexts moved to pinned memory.
    pub offloaded: u64,
}

/// What a batch produced for one member.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkResult {
    /// The clean latent (tokens × CHANNELS).
    pub latent: Vec<f32>,
    /// RGB frames, 4 per latent frame, `pixels²·3` bytes each.
    pub frames: Vec<Vec<u8>>,
}

/// Where one member's data sits in the batch's buffers (tokens, except
/// `col_off`, which indexes the column arrays).
#[derive(Debug, Clone, Copy)]
struct Layout {
    x_off: usize,
    n: usize,
    m: usize,
    kv_off: usize,
    side: usize,
    keep: usize,
    col_off: usize,
    fp8: bool,
    steps: usize,
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
        let contexts = Contexts {
            store: StateStore::new(Arc::clone(&dev)),
            tags: HashMap::new(),
            stats: ContextStats::default(),
        };
        Ok(Self { dev, w, contexts: Mutex::new(contexts) })
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    fn contexts(&self) -> std::sync::MutexGuard<'_, Contexts<D>> {
        self.contexts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How batches found their contexts so far.
    pub fn context_stats(&self) -> ContextStats {
        self.contexts().stats
    }

    /// Starts moving `session`'s context to pinned host memory (the
    /// scheduler suspended it); the copy overlaps the next batch.
    pub fn offload(&self, session: &str) -> Result<()> {
        let mut c = self.contexts();
        if c.store.device_buf(session).is_some() {
            c.store.offload(session)?;
            c.stats.offloaded += 1;
        }
        Ok(())
    }

    /// Starts bringing `session`'s context back (the scheduler resumed it);
    /// the next batch's compute waits for the copy, nothing else does.
    pub fn restore(&self, session: &str) -> Result<()> {
        let mut c = self.contexts();
        if c.store.on_device(session) == Some(false) {
            c.store.restore(session)?;
            c.stats.restored += 1;
        }
        Ok(())
    }

    /// Drops `session`'s context (it ended, or its state was replaced).
    pub fn forget(&self, session: &str) {
        let mut c = self.contexts();
        c.tags.remove(session);
        if let Err(e) = c.store.remove(session) {
            tracing::warn!(event = "gpu_forget_failed", session, error = %e);
        }
    }

    /// Whether `session`'s context is in device memory.
    pub fn resident(&self, session: &str) -> Option<bool> {
        self.contexts().store.on_device(session)
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
        let dev = &*self.dev;
        let mut contexts = self.contexts();
        // Layout, noise, and where each member's full context is.
        let mut lay = Vec::with_capacity(items.len());
        let mut x_host = Vec::new();
        let mut temp: Vec<Option<D::Buf>> = Vec::new();
        let (mut xt, mut kvt) = (0usize, 0usize);
        for it in items.iter() {
            let noise = VideoModel::noise(it.state, it.res, it.latent_frames);
            let m = VideoModel::context_len(it.state, &it.fidelity);
            let (n, side) = (noise.len() / CHANNELS, it.res.latent_side());
            let blocks = m / side;
            let keep = blocks - ((blocks as f64) * it.fidelity.sparsity()).floor() as usize;
            lay.push(Layout {
                x_off: xt,
                n,
                m,
                kv_off: kvt,
                side,
                keep,
                col_off: kvt,
                fp8: it.fidelity.precision == Precision::Fp8,
                steps: usize::from(it.fidelity.steps.max(1)),
            });
            x_host.extend_from_slice(&noise);
            xt += n;
            kvt += m + n;
            temp.push(contexts.locate(dev, it)?);
        }

        // Host tables, one upload.
        let mut stage = Staging::default();
        // Context gathers: the sink and the last W chunks of the member's
        // full context, into its kv region.
        let ctx_proj: Vec<Option<[usize; 3]>> = lay
            .iter()
            .zip(items.iter())
            .map(|(l, it)| {
                (l.m > 0).then(|| {
                    let sink = usize::from(it.state.sink.is_some()) * l.n;
                    let w = usize::from(it.fidelity.window).min(it.state.window.len());
                    let first = it.state.window.len() - w;
                    let mut src: Vec<i32> = (0..sink as i32).collect();
                    src.extend((0..w * l.n).map(|j| (sink + first * l.n + j) as i32));
                    let dst: Vec<i32> = (0..l.m).map(|j| (l.kv_off + j) as i32).collect();
                    [stage.ints(&src), stage.ints(&dst), stage.ints(&vec![i32::from(l.fp8); l.m])]
                })
            })
            .collect();
        let max_steps = lay.iter().map(|l| l.steps).max().unwrap_or(1);
        let steps: Vec<StepTables> =
            (0..max_steps).map(|k| StepTables::build(&mut stage, &lay, items, k)).collect();
        let mut dmeta = Vec::new();
        let (mut out_off, mut px_total, mut widest) = (Vec::new(), 0usize, 0usize);
        for (l, it) in lay.iter().zip(items.iter()) {
            dmeta.extend_from_slice(&[l.x_off as i32, l.n as i32, 0, 0, l.side as i32, 0, 0, 0]);
            out_off.push(px_total as i32);
            let pixels = (l.n / (l.side * l.side)) * 4 * it.res.pixels() * it.res.pixels();
            widest = widest.max(pixels);
            px_total += pixels * 3;
        }
        let (dmeta_at, out_off_at) = (stage.ints(&dmeta), stage.ints(&out_off));
        let tables = stage.upload(dev)?;
        let x = dev.alloc(xt * CHANNELS * 4)?;
        dev.upload(&x, 0, &f32_bytes(&x_host))?;

        let (keys, vals) = (dev.alloc(kvt * DIM * 4)?, dev.alloc(kvt * DIM * 4)?);
        let q = dev.alloc(xt * DIM * 4)?;
        let attn = dev.alloc(xt * DIM * 4)?;
        let (bscore, flags, cols) = (dev.alloc(kvt * 4)?, dev.alloc(kvt * 4)?, dev.alloc(kvt * 4)?);
        let ncols = dev.alloc(items.len() * 4)?;
        let rgb = dev.alloc(px_total)?;
        let (wq, wk, wv, wo, w1, w2, to_rgb) =
            (&self.w[0], &self.w[1], &self.w[2], &self.w[3], &self.w[4], &self.w[5], &self.w[6]);
        let project = |src: &D::Buf, at: [usize; 3], count: usize, w: &D::Buf, out: &D::Buf| {
            dev.launch(
                "video_project",
                grid(count),
                &[
                    Arg::Buf(src, 0),
                    Arg::Buf(&tables, at[0]),
                    Arg::Buf(&tables, at[1]),
                    Arg::Buf(&tables, at[2]),
                    Arg::Buf(w, 0),
                    Arg::Buf(out, 0),
                    Arg::I32(count as i32),
                ],
            )
        };

        // Context keys and values, once per chunk.
        for (((l, it), tmp), at) in lay.iter().zip(items.iter()).zip(&temp).zip(&ctx_proj) {
            let Some(at) = at else { continue };
            let src = match (tmp, it.session) {
                (Some(b), _) => b,
                (None, Some(id)) => {
                    contexts.store.device_buf(id).ok_or_else(|| DeviceError("context vanished".into()))?
                }
                (None, None) => return Err(DeviceError("a member without a context buffer".into())),
            };
            for (w, out) in [(wk, &keys), (wv, &vals)] {
                project(src, *at, l.m, w, out)?;
            }
        }

        for st in &steps {
            // Chunk keys and values (into each member's kv region after its
            // context) and queries (indexed like x).
            for (w, out, dst) in [(wk, &keys, st.kv_dst), (wv, &vals, st.kv_dst), (wq, &q, st.tok_g)] {
                project(&x, [st.tok_g, dst, st.flag], st.tokens, w, out)?;
            }
            dev.launch(
                "video_select",
                (st.members as u32, 1, 1),
                &[
                    Arg::Buf(&q, 0),
                    Arg::Buf(&keys, 0),
                    Arg::Buf(&tables, st.meta),
                    Arg::Buf(&bscore, 0),
                    Arg::Buf(&flags, 0),
                    Arg::Buf(&cols, 0),
                    Arg::Buf(&ncols, 0),
                ],
            )?;
            dev.launch(
                "video_attend",
                (st.tokens as u32, 1, 1),
                &[
                    Arg::Buf(&q, 0),
                    Arg::Buf(&keys, 0),
                    Arg::Buf(&vals, 0),
                    Arg::Buf(&tables, st.tok_g),
                    Arg::Buf(&tables, st.tok_slot),
                    Arg::Buf(&tables, st.meta),
                    Arg::Buf(&cols, 0),
                    Arg::Buf(&ncols, 0),
                    Arg::Buf(&attn, 0),
                ],
            )?;
            dev.launch(
                "video_update",
                grid(st.tokens),
                &[
                    Arg::Buf(&x, 0),
                    Arg::Buf(&attn, 0),
                    Arg::Buf(&tables, st.tok_g),
                    Arg::Buf(&tables, st.tok_slot),
                    Arg::Buf(&tables, st.meta),
                    Arg::Buf(&tables, st.mparam),
                    Arg::Buf(wo, 0),
                    Arg::Buf(w1, 0),
                    Arg::Buf(w2, 0),
                    Arg::I32(st.tokens as i32),
                ],
            )?;
        }

        // Frames of every member in one launch.
        let g = grid(widest);
        dev.launch(
            "video_decode",
            (g.0, items.len() as u32, 1),
            &[
                Arg::Buf(&x, 0),
                Arg::Buf(to_rgb, 0),
                Arg::Buf(&tables, dmeta_at),
                Arg::Buf(&tables, out_off_at),
                Arg::Buf(&rgb, 0),
            ],
        )?;
        // Each session's next context, built on the device from its current
        // one and the new chunk (the cpu backend's `finish_chunk`).
        for ((l, it), tmp) in lay.iter().zip(items.iter()).zip(&temp) {
            if let Some(id) = it.session {
                contexts.advance(dev, id, it, tmp.as_ref(), (&x, l.x_off * CHANNELS * 4), l.n)?;
            }
        }
        let mut lat_bytes = vec![0u8; xt * CHANNELS * 4];
        dev.download(&x, 0, &mut lat_bytes)?;
        contexts.store.settle()?;
        let mut pix = vec![0u8; px_total];
        dev.download(&rgb, 0, &mut pix)?;
        let latents = f32s(&lat_bytes);
        let mut out = Vec::with_capacity(items.len());
        for ((l, it), off) in lay.iter().zip(items.iter_mut()).zip(&out_off) {
            let latent = latents[l.x_off * CHANNELS..(l.x_off + l.n) * CHANNELS].to_vec();
            let frame_bytes = it.res.pixels() * it.res.pixels() * 3;
            let count = (l.n / (l.side * l.side)) * 4;
            let start = *off as usize;
            let frames = (0..count)
                .map(|f| pix[start + f * frame_bytes..start + (f + 1) * frame_bytes].to_vec())
                .collect();
            model.finish_chunk(it.state, latent.clone());
            out.push(ChunkResult { latent, frames });
        }
        Ok(out)
    }
}

/// Host tables of a batch, gathered before anything launches and uploaded
/// in one copy; each array is addressed by its byte offset.
#[derive(Default)]
struct Staging {
    words: Vec<u32>,
}

impl Staging {
    fn ints(&mut self, v: &[i32]) -> usize {
        let at = self.words.len() * 4;
        self.words.extend(v.iter().map(|x| *x as u32));
        at
    }

    fn floats(&mut self, v: &[f32]) -> usize {
        let at = self.words.len() * 4;
        self.words.extend(v.iter().map(|x| x.to_bits()));
        at
    }

    fn upload<D: Device>(self, dev: &D) -> Result<D::Buf> {
        let bytes: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let b = dev.alloc(bytes.len().max(4))?;
        if !bytes.is_empty() {
            dev.upload(&b, 0, &bytes)?;
        }
        Ok(b)
    }
}

/// Where denoising step k's tables are: the members with more than k
/// steps (`meta`: MI ints each, `mparam`: MF floats each) and their chunk
/// tokens (index in x, member slot, destination in kv, fp8 flag).
struct StepTables {
    members: usize,
    tokens: usize,
    meta: usize,
    mparam: usize,
    tok_g: usize,
    tok_slot: usize,
    kv_dst: usize,
    flag: usize,
}

impl StepTables {
    fn build(stage: &mut Staging, lay: &[Layout], items: &[BatchItem<'_>], k: usize) -> Self {
        let active: Vec<usize> = (0..lay.len()).filter(|&i| lay[i].steps > k).collect();
        let (mut meta, mut mparam) = (Vec::new(), Vec::new());
        let (mut tok_g, mut tok_slot, mut kv_dst, mut flag) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (slot, &i) in active.iter().enumerate() {
            let l = lay[i];
            meta.extend_from_slice(&[
                l.x_off as i32,
                l.n as i32,
                l.kv_off as i32,
                l.m as i32,
                l.side as i32,
                l.keep as i32,
                l.col_off as i32,
                i32::from(l.fp8),
            ]);
            let s = l.steps;
            let (t, t_next) = (1.0 - k as f32 / s as f32, 1.0 - (k + 1) as f32 / s as f32);
            let mut row = items[i].state.prompt.clone();
            row.resize(CHANNELS, 0.0);
            row.extend_from_slice(&[
                items[i].state.chunks as f32,
                t,
                if t > 0.0 { t_next / t } else { 0.0 },
                0.0,
            ]);
            debug_assert_eq!(row.len(), MF);
            mparam.extend_from_slice(&row);
            for j in 0..l.n {
                tok_g.push((l.x_off + j) as i32);
                tok_slot.push(slot as i32);
                kv_dst.push((l.kv_off + l.m + j) as i32);
                flag.push(i32::from(l.fp8));
            }
        }
        debug_assert_eq!(meta.len(), active.len() * MI);
        StepTables {
            members: active.len(),
            tokens: tok_g.len(),
            meta: stage.ints(&meta),
            mparam: stage.floats(&mparam),
            tok_g: stage.ints(&tok_g),
            tok_slot: stage.ints(&tok_slot),
            kv_dst: stage.ints(&kv_dst),
            flag: stage.ints(&flag),
        }
    }
}

impl<D: Device> Contexts<D> {
    /// Makes the member's full context available on the device: resident
    /// (nothing to do), offloaded (restore issued), or uploaded from the
    /// host state. Returns a temporary buffer for a member without a
    /// session; sessions' contexts stay in the store.
    fn locate(&mut self, dev: &D, it: &BatchItem<'_>) -> Result<Option<D::Buf>> {
        let tag = (it.state.seed, it.state.chunks);
        let full = || -> Vec<u8> {
            let mut v = Vec::new();
            if let Some(s) = &it.state.sink {
                v.extend_from_slice(&f32_bytes(s));
            }
            for c in &it.state.window {
                v.extend_from_slice(&f32_bytes(c));
            }
            v
        };
        let Some(id) = it.session else {
            let bytes = full();
            let b = dev.alloc(bytes.len().max(4))?;
            dev.upload(&b, 0, &bytes)?;
            return Ok(Some(b));
        };
        match (self.tags.get(id) == Some(&tag), self.store.on_device(id)) {
            (true, Some(true)) => self.stats.resident += 1,
            (true, Some(false)) => {
                self.store.restore(id)?;
                self.stats.restored += 1;
            }
            _ => {
                let bytes = full();
                self.store.put(id, &bytes)?;
                self.tags.insert(id.to_string(), tag);
                self.stats.uploaded += 1;
            }
        }
        Ok(None)
    }

    /// Replaces `id`'s context by the one after this chunk: the sink (or
    /// the new chunk, for a first chunk), the window without its oldest
    /// chunk when full, then the new chunk (`n` tokens at `latent`).
    fn advance(
        &mut self,
        dev: &D,
        id: &str,
        it: &BatchItem<'_>,
        tmp: Option<&D::Buf>,
        latent: (&D::Buf, usize),
        n: usize,
    ) -> Result<()> {
        let chunk = n * CHANNELS * 4;
        let old = match tmp {
            Some(b) => b,
            None => self.store.device_buf(id).ok_or_else(|| DeviceError("context vanished".into()))?,
        };
        let has_sink = it.state.sink.is_some();
        let window = it.state.window.len();
        let drop = usize::from(window == MAX_WINDOW);
        let kept = window - drop;
        let next = dev.alloc((1 + kept + 1) * chunk)?;
        if has_sink {
            dev.copy((old, 0), (&next, 0), chunk)?;
        } else {
            dev.copy(latent, (&next, 0), chunk)?;
        }
        let from = (usize::from(has_sink) + drop) * chunk;
        if kept > 0 {
            dev.copy((old, from), (&next, chunk), kept * chunk)?;
        }
        dev.copy(latent, (&next, (1 + kept) * chunk), chunk)?;
        self.store.put_buf(id, next, (2 + kept) * chunk)?;
        self.tags.insert(id.to_string(), (it.state.seed, it.state.chunks + 1));
        Ok(())
    }
}

/// What the video scheduler calls on the cuda backend, whatever the device.
pub trait VideoRunner: Send + Sync {
    /// Runs one coalesced batch; see [`GpuVideo::run_batch`].
    fn run(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>>;
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
    let mut state = crate::video::model::StreamState::new("warm up");
    let mut items = [BatchItem {
        session: None,
        state: &mut state,
        fidelity: policies::video::Fidelity::HIGHEST,
        res: Resolution::Tiny,
        latent_frames: 1,
    }];
    gpu.run_batch(model, &mut items).map(|_| ())
}
