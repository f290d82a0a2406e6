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

use std::sync::Arc;

use kernels::video::{CHANNELS, DIM, MF, MI};
use kernels::{f32_bytes, f32s, i32_bytes, Arg, Device, DeviceError, Result, BLOCK};
use policies::video::Precision;

use crate::video::model::{Resolution, VideoModel};

pub use crate::video::BatchItem;

/// The model's weights on a device.
pub struct GpuVideo<D: Device> {
    dev: Arc<D>,
    /// wq, wk, wv, wo, w1, w2, to_rgb.
    w: Vec<D::Buf>,
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
    ctx_off: usize,
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
        Ok(Self { dev, w })
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    /// Denoises one chunk per item (step k of every member together) and
    /// decodes its frames; advances each item's state like the cpu backend.
    pub fn run_batch(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let dev = &*self.dev;
        // Layout and host data.
        let mut lay = Vec::with_capacity(items.len());
        let (mut x_host, mut ctx_host) = (Vec::new(), Vec::new());
        let (mut xt, mut ct, mut kvt) = (0usize, 0usize, 0usize);
        for it in items.iter() {
            let noise = VideoModel::noise(it.state, it.res, it.latent_frames);
            let ctx = VideoModel::context_tokens(it.state, &it.fidelity);
            let (n, m, side) = (noise.len() / CHANNELS, ctx.len() / CHANNELS, it.res.latent_side());
            let blocks = m / side;
            let keep = blocks - ((blocks as f64) * it.fidelity.sparsity()).floor() as usize;
            lay.push(Layout {
                x_off: xt,
                n,
                ctx_off: ct,
                m,
                kv_off: kvt,
                side,
                keep,
                col_off: kvt,
                fp8: it.fidelity.precision == Precision::Fp8,
                steps: usize::from(it.fidelity.steps.max(1)),
            });
            x_host.extend_from_slice(&noise);
            ctx_host.extend_from_slice(&ctx);
            xt += n;
            ct += m;
            kvt += m + n;
        }
        let x = dev.alloc(xt * CHANNELS * 4)?;
        dev.upload(&x, 0, &f32_bytes(&x_host))?;
        let ctx = dev.alloc(ct.max(1) * CHANNELS * 4)?;
        dev.upload(&ctx, 0, &f32_bytes(&ctx_host))?;
        let (keys, vals) = (dev.alloc(kvt * DIM * 4)?, dev.alloc(kvt * DIM * 4)?);
        let q = dev.alloc(xt * DIM * 4)?;
        let attn = dev.alloc(xt * DIM * 4)?;
        let (bscore, flags, cols) = (dev.alloc(kvt * 4)?, dev.alloc(kvt * 4)?, dev.alloc(kvt * 4)?);
        let ncols = dev.alloc(items.len() * 4)?;
        let (wq, wk, wv, wo, w1, w2, to_rgb) =
            (&self.w[0], &self.w[1], &self.w[2], &self.w[3], &self.w[4], &self.w[5], &self.w[6]);

        // Context keys and values, once per chunk.
        if ct > 0 {
            let (mut src, mut dst, mut flag) = (Vec::new(), Vec::new(), Vec::new());
            for l in &lay {
                for j in 0..l.m {
                    src.push((l.ctx_off + j) as i32);
                    dst.push((l.kv_off + j) as i32);
                    flag.push(i32::from(l.fp8));
                }
            }
            let idx = self.ints(&[&src, &dst, &flag])?;
            for (w, out) in [(wk, &keys), (wv, &vals)] {
                self.project(&ctx, &idx, ct, w, out)?;
            }
        }

        let max_steps = lay.iter().map(|l| l.steps).max().unwrap_or(1);
        for k in 0..max_steps {
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
            let tokens = tok_g.len();
            let idx = self.ints(&[&tok_g, &kv_dst, &flag, &tok_slot, &meta])?;
            let at = |i: usize| i * tokens * 4;
            let meta_at = at(4);
            let mp = dev.alloc(mparam.len() * 4)?;
            dev.upload(&mp, 0, &f32_bytes(&mparam))?;
            // Chunk keys and values (into each member's kv region after its
            // context) and queries (indexed like x).
            for (w, out, dst) in [(wk, &keys, at(1)), (wv, &vals, at(1)), (wq, &q, at(0))] {
                dev.launch(
                    "video_project",
                    grid(tokens),
                    &[
                        Arg::Buf(&x, 0),
                        Arg::Buf(&idx, at(0)),
                        Arg::Buf(&idx, dst),
                        Arg::Buf(&idx, at(2)),
                        Arg::Buf(w, 0),
                        Arg::Buf(out, 0),
                        Arg::I32(tokens as i32),
                    ],
                )?;
            }
            dev.launch(
                "video_select",
                (active.len() as u32, 1, 1),
                &[
                    Arg::Buf(&q, 0),
                    Arg::Buf(&keys, 0),
                    Arg::Buf(&idx, meta_at),
                    Arg::Buf(&bscore, 0),
                    Arg::Buf(&flags, 0),
                    Arg::Buf(&cols, 0),
                    Arg::Buf(&ncols, 0),
                ],
            )?;
            dev.launch(
                "video_attend",
                (tokens as u32, 1, 1),
                &[
                    Arg::Buf(&q, 0),
                    Arg::Buf(&keys, 0),
                    Arg::Buf(&vals, 0),
                    Arg::Buf(&idx, at(0)),
                    Arg::Buf(&idx, at(3)),
                    Arg::Buf(&idx, meta_at),
                    Arg::Buf(&cols, 0),
                    Arg::Buf(&ncols, 0),
                    Arg::Buf(&attn, 0),
                ],
            )?;
            dev.launch(
                "video_update",
                grid(tokens),
                &[
                    Arg::Buf(&x, 0),
                    Arg::Buf(&attn, 0),
                    Arg::Buf(&idx, at(0)),
                    Arg::Buf(&idx, at(3)),
                    Arg::Buf(&idx, meta_at),
                    Arg::Buf(&mp, 0),
                    Arg::Buf(wo, 0),
                    Arg::Buf(w1, 0),
                    Arg::Buf(w2, 0),
                    Arg::I32(tokens as i32),
                ],
            )?;
        }

        // Frames of every member in one launch.
        let mut meta = Vec::new();
        let (mut out_off, mut px_total, mut widest) = (Vec::new(), 0usize, 0usize);
        for (l, it) in lay.iter().zip(items.iter()) {
            meta.extend_from_slice(&[l.x_off as i32, l.n as i32, 0, 0, l.side as i32, 0, 0, 0]);
            out_off.push(px_total as i32);
            let pixels = (l.n / (l.side * l.side)) * 4 * it.res.pixels() * it.res.pixels();
            widest = widest.max(pixels);
            px_total += pixels * 3;
        }
        let idx = self.ints(&[&meta, &out_off])?;
        let rgb = dev.alloc(px_total)?;
        let g = grid(widest);
        dev.launch(
            "video_decode",
            (g.0, items.len() as u32, 1),
            &[
                Arg::Buf(&x, 0),
                Arg::Buf(to_rgb, 0),
                Arg::Buf(&idx, 0),
                Arg::Buf(&idx, meta.len() * 4),
                Arg::Buf(&rgb, 0),
            ],
        )?;
        let mut lat_bytes = vec![0u8; xt * CHANNELS * 4];
        dev.download(&x, 0, &mut lat_bytes)?;
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

    /// Several i32 arrays of one length packed into one buffer, in order
    /// (array `i` at byte `i · len · 4`); a last array may be shorter.
    fn ints(&self, arrays: &[&[i32]]) -> Result<D::Buf> {
        let len = arrays.first().map_or(0, |a| a.len());
        let mut all = Vec::with_capacity(len * arrays.len());
        for (i, a) in arrays.iter().enumerate() {
            if a.len() != len && i + 1 != arrays.len() {
                return Err(DeviceError("index arrays of different lengths".into()));
            }
            all.extend_from_slice(a);
        }
        let b = self.dev.alloc(all.len().max(1) * 4)?;
        self.dev.upload(&b, 0, &i32_bytes(&all))?;
        Ok(b)
    }

    /// `video_project` of `count` tokens whose src/dst/flag arrays are
    /// packed in `idx` (see [`GpuVideo::ints`]).
    fn project(&self, src: &D::Buf, idx: &D::Buf, count: usize, w: &D::Buf, out: &D::Buf) -> Result<()> {
        self.dev.launch(
            "video_project",
            grid(count),
            &[
                Arg::Buf(src, 0),
                Arg::Buf(idx, 0),
                Arg::Buf(idx, count * 4),
                Arg::Buf(idx, 2 * count * 4),
                Arg::Buf(w, 0),
                Arg::Buf(out, 0),
                Arg::I32(count as i32),
            ],
        )
    }
}

/// What the video scheduler calls on the cuda backend, whatever the device.
pub trait VideoRunner: Send + Sync {
    /// Runs one coalesced batch; see [`GpuVideo::run_batch`].
    fn run(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>>;
    /// The device, for logs.
    fn device_name(&self) -> String;
}

impl<D: Device> VideoRunner for GpuVideo<D> {
    fn run(&self, model: &VideoModel, items: &mut [BatchItem<'_>]) -> Result<Vec<ChunkResult>> {
        self.run_batch(model, items)
    }

    fn device_name(&self) -> String {
        self.dev.name()
    }
}

/// One chunk of a scratch stream, so the first real batch does not pay for
/// first launches.
pub fn warm_up<D: Device>(gpu: &GpuVideo<D>, model: &VideoModel) -> Result<()> {
    let mut state = crate::video::model::StreamState::new("warm up");
    let mut items = [BatchItem {
        state: &mut state,
        fidelity: policies::video::Fidelity::HIGHEST,
        res: Resolution::Tiny,
        latent_frames: 1,
    }];
    gpu.run_batch(model, &mut items).map(|_| ())
}
