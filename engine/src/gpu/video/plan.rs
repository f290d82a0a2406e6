//! A batch's layout on the device, worked out on the host before anything
//! launches: where each member's tokens sit, every index table the kernels
//! read (uploaded in one copy), and the work buffers.

use kernels::video::{ATTEND_COLUMNS, ATTEND_QUERIES, CHANNELS, DIM, MF, MI};
use kernels::{f32_bytes, f32s, Device, Result};
use policies::video::Precision;

use super::{BatchItem, ChunkResult};
use crate::models::video::{Resolution, StreamState, VideoModel};
use policies::video::Fidelity;

/// Where one member's data sits in the batch's buffers (tokens, except
/// `col_off`, which indexes the column arrays).
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub x_off: usize,
    /// Chunk tokens.
    pub n: usize,
    /// Context tokens at the member's fidelity.
    pub m: usize,
    pub kv_off: usize,
    pub side: usize,
    /// Context blocks kept at its sparsity.
    pub keep: usize,
    pub col_off: usize,
    pub fp8: bool,
    /// Denoising steps `from..to` of a schedule of `total` run here.
    pub from: usize,
    pub to: usize,
    pub total: usize,
}

/// One member of a batch as the plan sees it: a video chunk (from noise,
/// all its steps, after its context) or a diffusion job's latent (some of
/// its steps, no context).
pub(super) struct Member<'a> {
    pub state: &'a StreamState,
    pub fidelity: Fidelity,
    pub res: Resolution,
    pub latent_frames: usize,
    /// The latent to start from (the noise of the state's next chunk when
    /// `None`).
    pub start: Option<&'a [f32]>,
    pub from: usize,
    pub to: usize,
    pub total: usize,
}

impl<'a> Member<'a> {
    /// A video chunk: every step of its fidelity, from noise.
    pub fn chunk(it: &'a BatchItem<'_>) -> Self {
        let steps = usize::from(it.fidelity.steps.max(1));
        Member {
            state: it.state,
            fidelity: it.fidelity,
            res: it.res,
            latent_frames: it.latent_frames,
            start: None,
            from: 0,
            to: steps,
            total: steps,
        }
    }
}

/// Host tables of a batch, uploaded in one copy; each array is addressed
/// by its byte offset.
#[derive(Default)]
pub(super) struct Staging {
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
pub(super) struct StepTables {
    pub members: usize,
    pub tokens: usize,
    pub meta: usize,
    pub mparam: usize,
    pub tok_g: usize,
    pub tok_slot: usize,
    pub kv_dst: usize,
    pub flag: usize,
    /// `video_attend`'s query tiles (first token's index in `tok_g`, count):
    /// up to `ATTEND_QUERIES` tokens of one member each.
    pub tiles: usize,
    pub tile_tok: usize,
    pub tile_cnt: usize,
    /// Column splits per tile (`video_attend`'s grid is tiles × splits).
    pub splits: usize,
    /// Context tokens of the member with the most (`video_key_dots`' grid).
    pub max_context: usize,
}

/// Blocks `video_attend` aims for per step: about four per multiprocessor
/// of a 132-SM Hopper GPU, enough to fill it when a batch is short.
const ATTEND_TARGET_BLOCKS: usize = 512;

/// Column splits for `tiles` query tiles whose members have at most
/// `columns` columns: enough blocks to fill the GPU, at least one staged
/// tile of columns per split.
fn attend_splits(tiles: usize, columns: usize) -> usize {
    ATTEND_TARGET_BLOCKS.div_ceil(tiles.max(1)).clamp(1, columns.div_ceil(ATTEND_COLUMNS).max(1))
}

impl StepTables {
    fn build(stage: &mut Staging, lay: &[Layout], items: &[Member<'_>], k: usize) -> Self {
        let active: Vec<usize> = (0..lay.len()).filter(|&i| (lay[i].from..lay[i].to).contains(&k)).collect();
        let (mut meta, mut mparam) = (Vec::new(), Vec::new());
        let (mut tok_g, mut tok_slot, mut kv_dst, mut flag) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut tile_tok, mut tile_cnt, mut columns, mut max_context) = (Vec::new(), Vec::new(), 0, 0);
        for (slot, &i) in active.iter().enumerate() {
            let l = lay[i];
            let row = [l.x_off, l.n, l.kv_off, l.m, l.side, l.keep, l.col_off, usize::from(l.fp8)];
            meta.extend(row.iter().map(|&v| v as i32));
            let s = l.total;
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
            columns = columns.max(l.keep * l.side + l.n);
            max_context = max_context.max(l.m);
            for t in (0..l.n).step_by(ATTEND_QUERIES) {
                tile_tok.push((tok_g.len() + t) as i32);
                tile_cnt.push((l.n - t).min(ATTEND_QUERIES) as i32);
            }
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
            tiles: tile_tok.len(),
            splits: attend_splits(tile_tok.len(), columns),
            max_context,
            tile_tok: stage.ints(&tile_tok),
            tile_cnt: stage.ints(&tile_cnt),
        }
    }
}

/// The batch worked out on the host.
pub(super) struct Plan {
    pub lay: Vec<Layout>,
    /// Every member's starting noise, in `x` order.
    noise: Vec<f32>,
    /// Per member with a context: its gather table (source token in its
    /// full context, destination in kv, fp8 flag), byte offsets.
    pub ctx_gather: Vec<Option<[usize; 3]>>,
    pub steps: Vec<StepTables>,
    /// `video_decode`'s member rows and output offsets (byte offsets).
    pub decode_meta: usize,
    pub decode_out: usize,
    /// Each member's first byte in the frame buffer.
    out_off: Vec<usize>,
    /// Pixels of the largest member (the decode grid), bytes of all frames.
    pub widest: usize,
    pixel_bytes: usize,
    /// Chunk tokens and kv rows of the whole batch.
    tokens: usize,
    kv: usize,
}

impl Plan {
    /// The plan of `items` and its tables, to upload.
    pub fn build(items: &[Member<'_>]) -> (Plan, Staging) {
        let mut stage = Staging::default();
        let (mut lay, mut noise) = (Vec::with_capacity(items.len()), Vec::new());
        let (mut tokens, mut kv) = (0, 0);
        for it in items {
            let n = VideoModel::chunk_tokens(it.res, it.latent_frames);
            match it.start {
                Some(x) => noise.extend_from_slice(&x[..n * CHANNELS]),
                None => noise.extend(VideoModel::noise(it.state, it.res, it.latent_frames)),
            }
            let (m, side) = (VideoModel::context_len(it.state, &it.fidelity), it.res.latent_side());
            let keep = it.fidelity.kept_blocks(m / side);
            let fp8 = it.fidelity.precision == Precision::Fp8;
            let (from, to, total) = (it.from, it.to.min(it.total), it.total.max(1));
            lay.push(Layout {
                x_off: tokens,
                n,
                m,
                kv_off: kv,
                side,
                keep,
                col_off: kv,
                fp8,
                from,
                to,
                total,
            });
            tokens += n;
            kv += m + n;
        }
        let ctx_gather =
            lay.iter().zip(items).map(|(l, it)| (l.m > 0).then(|| gather(&mut stage, l, it))).collect();
        let first = lay.iter().map(|l| l.from).min().unwrap_or(0);
        let last = lay.iter().map(|l| l.to).max().unwrap_or(0);
        let steps = (first..last).map(|k| StepTables::build(&mut stage, &lay, items, k)).collect();
        let (mut meta, mut out_off, mut pixel_bytes, mut widest) = (Vec::new(), Vec::new(), 0, 0);
        for (l, it) in lay.iter().zip(items) {
            meta.extend_from_slice(&[l.x_off as i32, l.n as i32, 0, 0, l.side as i32, 0, 0, 0]);
            out_off.push(pixel_bytes);
            let pixels = (l.n / (l.side * l.side)) * 4 * it.res.pixels() * it.res.pixels();
            widest = widest.max(pixels);
            pixel_bytes += pixels * 3;
        }
        let decode_meta = stage.ints(&meta);
        let decode_out = stage.ints(&out_off.iter().map(|&o| o as i32).collect::<Vec<_>>());
        let plan = Plan {
            lay,
            noise,
            ctx_gather,
            steps,
            decode_meta,
            decode_out,
            out_off,
            widest,
            pixel_bytes,
            tokens,
            kv,
        };
        (plan, stage)
    }

    /// Floats of `video_attend`'s partial results at the widest step.
    pub fn partial_floats(&self) -> usize {
        self.steps.iter().map(|st| st.tokens * st.splits * (DIM + 2)).max().unwrap_or(0)
    }

    /// Each member's latent and frames from the downloaded buffers.
    pub fn results(&self, items: &[Member<'_>], latents: &[f32], pixels: &[u8]) -> Vec<ChunkResult> {
        self.lay
            .iter()
            .zip(items)
            .zip(&self.out_off)
            .map(|((l, it), &start)| {
                let latent = latents[l.x_off * CHANNELS..(l.x_off + l.n) * CHANNELS].to_vec();
                let size = it.res.pixels() * it.res.pixels() * 3;
                let count = (l.n / (l.side * l.side)) * 4;
                let frames =
                    (0..count).map(|f| pixels[start + f * size..start + (f + 1) * size].to_vec()).collect();
                ChunkResult { latent, frames }
            })
            .collect()
    }
}

/// The context gather of one member: the sink and the last W chunks of its
/// full context (sink, then the window) into its kv region.
fn gather(stage: &mut Staging, l: &Layout, it: &Member<'_>) -> [usize; 3] {
    let sink = usize::from(it.state.sink.is_some()) * l.n;
    let w = usize::from(it.fidelity.window).min(it.state.window.len());
    let first = it.state.window.len() - w;
    let mut src: Vec<i32> = (0..sink as i32).collect();
    src.extend((0..w * l.n).map(|j| (sink + first * l.n + j) as i32));
    let dst: Vec<i32> = (0..l.m).map(|j| (l.kv_off + j) as i32).collect();
    [stage.ints(&src), stage.ints(&dst), stage.ints(&vec![i32::from(l.fp8); l.m])]
}

/// The batch's device buffers.
pub(super) struct Work<B> {
    pub tables: B,
    pub x: B,
    pub keys: B,
    pub vals: B,
    pub q: B,
    pub attn: B,
    /// `video_attend`'s partial results (per token and split: DIM + 2).
    pub partial: B,
    /// Each member's mean query (DIM floats) and its dot with every
    /// context key (indexed like `cols`).
    pub qmean: B,
    pub dots: B,
    pub bscore: B,
    pub flags: B,
    pub cols: B,
    pub ncols: B,
    pub rgb: B,
}

impl<B> Work<B> {
    /// Uploads the tables and the noise, allocates the rest.
    pub fn alloc<D: Device<Buf = B>>(dev: &D, plan: &Plan, stage: Staging) -> Result<Self> {
        let x = dev.alloc(plan.tokens * CHANNELS * 4)?;
        dev.upload(&x, 0, &f32_bytes(&plan.noise))?;
        Ok(Work {
            tables: stage.upload(dev)?,
            x,
            keys: dev.alloc(plan.kv * DIM * 4)?,
            vals: dev.alloc(plan.kv * DIM * 4)?,
            q: dev.alloc(plan.tokens * DIM * 4)?,
            attn: dev.alloc(plan.tokens * DIM * 4)?,
            partial: dev.alloc(plan.partial_floats().max(1) * 4)?,
            qmean: dev.alloc(plan.lay.len().max(1) * DIM * 4)?,
            dots: dev.alloc(plan.kv.max(1) * 4)?,
            bscore: dev.alloc(plan.kv * 4)?,
            flags: dev.alloc(plan.kv * 4)?,
            cols: dev.alloc(plan.kv * 4)?,
            ncols: dev.alloc(plan.lay.len() * 4)?,
            rgb: dev.alloc(plan.pixel_bytes)?,
        })
    }

    /// Downloads the latents (waits for the batch).
    pub fn latents<D: Device<Buf = B>>(&self, dev: &D, plan: &Plan) -> Result<Vec<f32>> {
        let mut latents = vec![0u8; plan.tokens * CHANNELS * 4];
        dev.download(&self.x, 0, &mut latents)?;
        Ok(f32s(&latents))
    }

    /// Downloads the latents and the frames (waits for the batch).
    pub fn read<D: Device<Buf = B>>(&self, dev: &D, plan: &Plan) -> Result<(Vec<f32>, Vec<u8>)> {
        let latents = self.latents(dev, plan)?;
        let mut pixels = vec![0u8; plan.pixel_bytes];
        dev.download(&self.rgb, 0, &mut pixels)?;
        Ok((latents, pixels))
    }
}
