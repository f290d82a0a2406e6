//! A video model with a real causal DiT's shapes, on a [`Device`]: the
//! compute of a streaming video chunk as SlackServe and TurboServe serve
//! it (a Wan-2.1-1.3B-class denoiser: hidden width 1,536, 30 blocks, 12
//! heads of 128, MLP 8,960, cross-attention to 512 text tokens; a chunk of
//! 3 latent frames of 1,560 tokens each attending to the cached context of
//! earlier chunks), with random weights.
//!
//! Each block: adaLN-modulated self-attention over [cached context ‖ the
//! chunk] (fused flash attention, `dit_attention`), cross-attention to the
//! prompt's cached text keys and values, and a GELU MLP; the products go
//! through cuBLAS in bf16 with fp32 accumulation and bf16 outputs; the
//! residual stream is f32. A chunk runs `steps` denoising forwards and one
//! more over the clean chunk that writes its keys and values into the
//! cache for the chunks after it (as causal video DiTs with a KV cache
//! do). The fidelity knobs act as the profile model says: steps, the
//! window (past chunks kept besides the sink) and sparsity (context frames
//! skipped) set how many forwards and how many keys; fp8 attention has no
//! kernel of its own here yet (see docs/benchmarks/gpu.md, "DiT").
//!
//! What this model is for: chunk times and achieved rates of real shapes
//! (`engine gpu-bench`, `engine profile --video --dit`), which the
//! gateway's and the simulator's video profiles are built from. It does not
//! serve video (its weights are random); [`reference_forward`] is the same
//! network on the host, which the tests compare the device's output with
//! on a tiny configuration of the same code.

use std::sync::Arc;

use kernels::dit::{HEAD_DIM, META, QUERIES};
use kernels::{bf16_bits, bf16_to_f32, f32s, Arg, Device, DeviceError, Gemm, Result, BLOCK};
use policies::video::cost::Rates;
use policies::video::Fidelity;

/// Which attention kernel the DiT runs (both compute the same function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AttentionKernel {
    /// `dit_attention`: tiles staged through registers (measured on H100).
    #[default]
    Staged,
    /// `dit_attention_async`: cp.async double buffering and ldmatrix (not
    /// yet measured on a GPU).
    Async,
}

impl AttentionKernel {
    pub fn kernel(self) -> &'static str {
        match self {
            AttentionKernel::Staged => "dit_attention",
            AttentionKernel::Async => "dit_attention_async",
        }
    }
}

/// A DiT's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DitConfig {
    /// What the cost depends on (widths, blocks, tokens): `cfg.hidden`
    /// and the rest read through it.
    pub shape: DitShape,
    pub heads: usize,
    pub seed: u32,
}

impl std::ops::Deref for DitConfig {
    type Target = DitShape;
    fn deref(&self) -> &DitShape {
        &self.shape
    }
}

impl DitConfig {
    /// Wan 2.1's 1.3B text-to-video DiT at 480p, as the causal streaming
    /// variants use it (3 latent frames per chunk).
    pub const WAN_1_3B: DitConfig = DitConfig { shape: DitShape::WAN_1_3B, heads: 12, seed: 7 };

    /// The same code at a size the host reference and the emulator run in
    /// seconds (heads are still 128 wide; ragged tiles on purpose).
    pub const TINY: DitConfig = DitConfig {
        shape: DitShape {
            hidden: 256,
            blocks: 2,
            ffn: 384,
            frame_tokens: 30,
            chunk_frames: 3,
            text_tokens: 20,
        },
        heads: 2,
        seed: 11,
    };

    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.hidden != self.heads * HEAD_DIM {
            return Err(format!("hidden ({}) must be heads × {HEAD_DIM}", self.hidden));
        }
        if self.ffn % 8 != 0 || self.blocks == 0 || self.frame_tokens == 0 || self.text_tokens == 0 {
            return Err("ffn must be a multiple of 8; blocks, frame and text tokens >= 1".into());
        }
        Ok(())
    }

    /// Parameters of the blocks (the four attention projections of each
    /// attention, the MLP).
    pub fn params(&self) -> f64 {
        let (h, f) = (self.hidden as f64, self.ffn as f64);
        self.blocks as f64 * (8.0 * h * h + 2.0 * h * f)
    }
}

// The chunk's shape, its work and its forwards: the cost model's
// (`policies::video::cost`), so the profiles and the kernels count alike.
pub use policies::video::cost::{forward_flops, forwards, ChunkShape, DitShape};

/// `dit_fill`'s values on the host: `n` bf16 values uniform in `[-amp,
/// amp)` from (seed, index), bit for bit.
pub fn fill_host(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut h = (i as u32).wrapping_mul(0x9E37_79B9)
                ^ ((i >> 32) as u32).wrapping_mul(0x85EB_CA6B)
                ^ seed.wrapping_mul(0xC2B2_AE35);
            h ^= h >> 16;
            h = h.wrapping_mul(0x7FEB_352D);
            h ^= h >> 15;
            h = h.wrapping_mul(0x846C_A68B);
            h ^= h >> 16;
            let u = (h >> 8) as f32 * (1.0 / 16_777_216.0) * 2.0 - 1.0;
            bf16_to_f32(bf16_bits(u * amp))
        })
        .collect()
}

/// Seeds of a block's tensors (weights) and of a member's caches.
fn seed(cfg: &DitConfig, block: usize, tensor: u32) -> u32 {
    cfg.seed.wrapping_mul(1_000_003).wrapping_add(block as u32 * 16 + tensor)
}

const W_QKV: u32 = 0;
const W_O: u32 = 1;
const W_CQ: u32 = 2;
const W_CO: u32 = 3;
const W_UP: u32 = 4;
const W_DOWN: u32 = 5;
const MOD: u32 = 6;
const CTX_K: u32 = 7;
const CTX_V: u32 = 8;
const TEXT_K: u32 = 9;
const TEXT_V: u32 = 10;
const INPUT: u32 = 11;

/// The six adaLN vectors of a block (shift, scale, gate of the attention;
/// the same of the MLP), small around 0.
fn modulation(cfg: &DitConfig, block: usize) -> Vec<f32> {
    fill_host(6 * cfg.hidden, seed(cfg, block, MOD), 0.1)
}

fn fill<D: Device>(dev: &D, buf: &D::Buf, offset: usize, n: usize, seed: u32, amp: f32) -> Result<()> {
    dev.launch(
        "dit_fill",
        ((n as u32).div_ceil(BLOCK).max(1), 1, 1),
        &[Arg::Buf(buf, offset * 2), Arg::I64(n as i64), Arg::I32(seed as i32), Arg::F32(amp)],
    )
}

struct Block<B> {
    wqkv: B,
    wo: B,
    cq: B,
    co: B,
    up: B,
    down: B,
    /// shift, scale, gate (attention), shift, scale, gate (MLP): f32.
    modulation: B,
}

/// The model's weights on a device.
pub struct GpuDit<D: Device> {
    dev: Arc<D>,
    pub cfg: DitConfig,
    blocks: Vec<Block<D::Buf>>,
    /// `hidden` zeros (f32): the cross-attention's plain LayerNorm.
    zeros: D::Buf,
    /// The attention kernel the forwards run.
    pub attention: AttentionKernel,
}

impl<D: Device> GpuDit<D> {
    /// Random weights of `cfg`, generated on the device.
    pub fn new(dev: Arc<D>, cfg: DitConfig) -> Result<Self> {
        cfg.validate().map_err(DeviceError)?;
        let (h, f) = (cfg.hidden, cfg.ffn);
        let weight = |n: usize, k: usize, b: usize, t: u32| -> Result<D::Buf> {
            let buf = dev.alloc(n * k * 2)?;
            fill(&*dev, &buf, 0, n * k, seed(&cfg, b, t), (3.0 / k as f32).sqrt())?;
            Ok(buf)
        };
        let mut blocks = Vec::new();
        for b in 0..cfg.blocks {
            let m = dev.alloc(6 * h * 4)?;
            dev.upload(&m, 0, &kernels::f32_bytes(&modulation(&cfg, b)))?;
            blocks.push(Block {
                wqkv: weight(3 * h, h, b, W_QKV)?,
                wo: weight(h, h, b, W_O)?,
                cq: weight(h, h, b, W_CQ)?,
                co: weight(h, h, b, W_CO)?,
                up: weight(f, h, b, W_UP)?,
                down: weight(h, f, b, W_DOWN)?,
                modulation: m,
            });
        }
        let zeros = dev.alloc(h * 4)?;
        Ok(Self { dev, cfg, blocks, zeros, attention: AttentionKernel::default() })
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }
}

/// A batch of members' caches and work buffers: each member's context
/// keys and values per block (random, as if earlier chunks had written
/// them), room for its chunk's, and its prompt's text keys and values.
pub struct DitBatch<D: Device> {
    shapes: Vec<ChunkShape>,
    hidden: usize,
    /// First row of each member in the batch's token-major activations.
    rows: Vec<usize>,
    k: D::Buf,
    v: D::Buf,
    text_k: D::Buf,
    text_v: D::Buf,
    /// Attention `meta` of every block: self-attention then cross-attention,
    /// [block][2][member][META] i64.
    meta: D::Buf,
    x: D::Buf,
    xb: D::Buf,
    qkv: D::Buf,
    q: D::Buf,
    att: D::Buf,
    y: D::Buf,
    mid: D::Buf,
}

impl<D: Device> DitBatch<D> {
    /// Allocates and fills the caches of `shapes` (one per member) for
    /// `model`; member i's context is generated from seed `seeds[i]`.
    pub fn new(model: &GpuDit<D>, shapes: &[ChunkShape], seeds: &[u32]) -> Result<Self> {
        let (cfg, dev) = (&model.cfg, &*model.dev);
        if shapes.is_empty() || shapes.len() != seeds.len() || shapes.iter().any(|s| s.tokens == 0) {
            return Err(DeviceError(
                "a batch needs a member, one seed per member, and tokens in each".into(),
            ));
        }
        let (h, heads, t) = (cfg.hidden, cfg.heads, cfg.text_tokens);
        let per_block = |s: &ChunkShape| heads * (s.context + s.tokens) * HEAD_DIM;
        let cache: usize = shapes.iter().map(|s| cfg.blocks * per_block(s)).sum();
        let text = shapes.len() * cfg.blocks * heads * t * HEAD_DIM;
        let (k, v) = (dev.alloc(cache * 2)?, dev.alloc(cache * 2)?);
        let (text_k, text_v) = (dev.alloc(text * 2)?, dev.alloc(text * 2)?);
        let mut rows = Vec::new();
        let mut meta: Vec<i64> = vec![0; cfg.blocks * 2 * shapes.len() * META];
        let (mut row, mut kbase) = (0usize, 0usize);
        for (i, (s, &sd)) in shapes.iter().zip(seeds).enumerate() {
            rows.push(row);
            let cap = s.context + s.tokens;
            for b in 0..cfg.blocks {
                let at = kbase + b * per_block(s);
                for head in 0..heads {
                    let off = at + head * cap * HEAD_DIM;
                    let n = s.context * HEAD_DIM;
                    let sb = sd.wrapping_mul(977).wrapping_add((b * heads + head) as u32);
                    fill(dev, &k, off, n, seed(cfg, 0, CTX_K) ^ sb, 1.0)?;
                    fill(dev, &v, off, n, seed(cfg, 0, CTX_V) ^ sb, 1.0)?;
                }
                let tb = (i * cfg.blocks + b) * heads * t * HEAD_DIM;
                let st = sd.wrapping_mul(131).wrapping_add(b as u32);
                fill(dev, &text_k, tb, heads * t * HEAD_DIM, seed(cfg, 0, TEXT_K) ^ st, 1.0)?;
                fill(dev, &text_v, tb, heads * t * HEAD_DIM, seed(cfg, 0, TEXT_V) ^ st, 1.0)?;
                let members = shapes.len();
                let m = &mut meta[((b * 2) * members + i) * META..][..META];
                m.copy_from_slice(&[
                    (row * h) as i64,
                    (s.tokens * HEAD_DIM) as i64,
                    s.tokens as i64,
                    at as i64,
                    (cap * HEAD_DIM) as i64,
                    cap as i64,
                    (row * h) as i64,
                    0,
                ]);
                let m = &mut meta[((b * 2 + 1) * members + i) * META..][..META];
                m.copy_from_slice(&[
                    (row * h) as i64,
                    (s.tokens * HEAD_DIM) as i64,
                    s.tokens as i64,
                    tb as i64,
                    (t * HEAD_DIM) as i64,
                    t as i64,
                    (row * h) as i64,
                    0,
                ]);
            }
            kbase += cfg.blocks * per_block(s);
            row += s.tokens;
        }
        let meta_buf = dev.alloc(meta.len() * 8)?;
        let bytes: Vec<u8> = meta.iter().flat_map(|x| x.to_le_bytes()).collect();
        dev.upload(&meta_buf, 0, &bytes)?;
        let n = row;
        Ok(Self {
            shapes: shapes.to_vec(),
            hidden: h,
            rows,
            k,
            v,
            text_k,
            text_v,
            meta: meta_buf,
            x: dev.alloc(n * h * 4)?,
            xb: dev.alloc(n * h * 2)?,
            qkv: dev.alloc(n * 3 * h * 2)?,
            q: dev.alloc(n * h * 2)?,
            att: dev.alloc(n * h * 2)?,
            y: dev.alloc(n * h * 2)?,
            mid: dev.alloc(n * cfg.ffn * 2)?,
        })
    }

    /// Token rows of the batch.
    pub fn tokens(&self) -> usize {
        self.shapes.iter().map(|s| s.tokens).sum()
    }

    /// The residual stream after the last forward (token-major f32).
    pub fn output(&self, dev: &D) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; self.tokens() * self.hidden * 4];
        dev.download(&self.x, 0, &mut bytes)?;
        Ok(f32s(&bytes))
    }
}

impl<D: Device> GpuDit<D> {
    /// One chunk of every member of `batch`: the input latents (one random
    /// draw over the batch's rows), `fid.steps` denoising forwards and the
    /// cache pass. The window and sparsity are the batch's shapes'
    /// (`ChunkShape::at` the same `fid`). Issued on the compute stream; not
    /// waited for.
    pub fn chunk(&self, batch: &DitBatch<D>, fid: &Fidelity) -> Result<()> {
        self.start(batch)?;
        for _ in 0..forwards(fid) {
            self.forward(batch)?;
        }
        Ok(())
    }

    /// The batch's residual stream set to its input latents.
    pub fn start(&self, batch: &DitBatch<D>) -> Result<()> {
        let (dev, h) = (&*self.dev, self.cfg.hidden);
        let n = batch.tokens() * h;
        fill(dev, &batch.xb, 0, n, seed(&self.cfg, 0, INPUT), 1.0)?;
        dev.launch("dit_set", grid(n), &[Arg::Buf(&batch.x, 0), Arg::Buf(&batch.xb, 0), Arg::I64(n as i64)])
    }

    /// One forward through every block; each block writes the chunk's keys
    /// and values after the member's context.
    pub fn forward(&self, batch: &DitBatch<D>) -> Result<()> {
        let (dev, cfg) = (&*self.dev, &self.cfg);
        let (h, f, heads) = (cfg.hidden, cfg.ffn, cfg.heads);
        let n = batch.tokens();
        let members = batch.shapes.len();
        let q_tiles = batch.shapes.iter().map(|s| s.tokens.div_ceil(QUERIES)).max().unwrap_or(1) as u32;
        let scale_log2 = std::f32::consts::LOG2_E / (HEAD_DIM as f32).sqrt();
        let gemm = |a: &D::Buf, w: &D::Buf, c: &D::Buf, n_out: usize, k: usize| {
            dev.gemm(Gemm { a: (a, 0), b: (w, 0), c: (c, 0), m: n, n: n_out, k, bf16_out: true })
        };
        let modulate = |m: &D::Buf, shift: usize, scale: usize| {
            dev.launch(
                "dit_modulate",
                (n as u32, 1, 1),
                &[
                    Arg::Buf(&batch.x, 0),
                    Arg::Buf(m, shift * h * 4),
                    Arg::Buf(m, scale * h * 4),
                    Arg::Buf(&batch.xb, 0),
                    Arg::I32(h as i32),
                ],
            )
        };
        let add = |gate: Option<(&D::Buf, usize)>| {
            let g = match gate {
                Some((m, at)) => Arg::Buf(m, at * h * 4),
                None => Arg::I64(0),
            };
            dev.launch(
                "dit_gated_add",
                grid(n * h),
                &[
                    Arg::Buf(&batch.x, 0),
                    Arg::Buf(&batch.y, 0),
                    g,
                    Arg::I32(h as i32),
                    Arg::I64((n * h) as i64),
                ],
            )
        };
        // Member i's rows of `src` (token-major, rows of `stride`, from
        // column `col`) into head-major `dst` at `off` with `head_stride`.
        let to_heads =
            |src: &D::Buf, stride: usize, col: usize, i: usize, dst: &D::Buf, off: usize, hs: usize| {
                let s = batch.shapes[i];
                dev.launch(
                    "dit_to_heads",
                    (s.tokens as u32, 1, 1),
                    &[
                        Arg::Buf(src, batch.rows[i] * stride * 2),
                        Arg::I32(stride as i32),
                        Arg::I32(col as i32),
                        Arg::Buf(dst, 0),
                        Arg::I64(off as i64),
                        Arg::I64(hs as i64),
                        Arg::I32(heads as i32),
                    ],
                )
            };
        let attend = |k: &D::Buf, v: &D::Buf, meta_at: usize| {
            dev.launch(
                self.attention.kernel(),
                (q_tiles, heads as u32, members as u32),
                &[
                    Arg::Buf(&batch.q, 0),
                    Arg::Buf(k, 0),
                    Arg::Buf(v, 0),
                    Arg::Buf(&batch.att, 0),
                    Arg::Buf(&batch.meta, meta_at * 8),
                    Arg::F32(scale_log2),
                    Arg::I32(h as i32),
                ],
            )
        };
        let mut kbase = 0usize;
        let bases: Vec<usize> = batch
            .shapes
            .iter()
            .map(|s| {
                let b = kbase;
                kbase += cfg.blocks * heads * (s.context + s.tokens) * HEAD_DIM;
                b
            })
            .collect();
        for (b, blk) in self.blocks.iter().enumerate() {
            // Self-attention over [context ‖ chunk].
            modulate(&blk.modulation, 0, 1)?;
            gemm(&batch.xb, &blk.wqkv, &batch.qkv, 3 * h, h)?;
            for (i, s) in batch.shapes.iter().enumerate() {
                let cap = s.context + s.tokens;
                let at = bases[i] + b * heads * cap * HEAD_DIM + s.context * HEAD_DIM;
                to_heads(&batch.qkv, 3 * h, 0, i, &batch.q, batch.rows[i] * h, s.tokens * HEAD_DIM)?;
                to_heads(&batch.qkv, 3 * h, h, i, &batch.k, at, cap * HEAD_DIM)?;
                to_heads(&batch.qkv, 3 * h, 2 * h, i, &batch.v, at, cap * HEAD_DIM)?;
            }
            attend(&batch.k, &batch.v, (b * 2) * members * META)?;
            gemm(&batch.att, &blk.wo, &batch.y, h, h)?;
            add(Some((&blk.modulation, 2)))?;
            // Cross-attention to the prompt.
            dev.launch(
                "dit_modulate",
                (n as u32, 1, 1),
                &[
                    Arg::Buf(&batch.x, 0),
                    Arg::Buf(&self.zeros, 0),
                    Arg::Buf(&self.zeros, 0),
                    Arg::Buf(&batch.xb, 0),
                    Arg::I32(h as i32),
                ],
            )?;
            gemm(&batch.xb, &blk.cq, &batch.y, h, h)?;
            for (i, s) in batch.shapes.iter().enumerate() {
                to_heads(&batch.y, h, 0, i, &batch.q, batch.rows[i] * h, s.tokens * HEAD_DIM)?;
            }
            attend(&batch.text_k, &batch.text_v, (b * 2 + 1) * members * META)?;
            gemm(&batch.att, &blk.co, &batch.y, h, h)?;
            add(None)?;
            // MLP.
            modulate(&blk.modulation, 3, 4)?;
            gemm(&batch.xb, &blk.up, &batch.mid, f, h)?;
            dev.launch("dit_gelu", grid(n * f), &[Arg::Buf(&batch.mid, 0), Arg::I64((n * f) as i64)])?;
            gemm(&batch.mid, &blk.down, &batch.y, h, f)?;
            add(Some((&blk.modulation, 5)))?;
        }
        Ok(())
    }

    /// The self-attention of block 0 alone with `kernel` (its rate).
    pub fn attention_only(&self, batch: &DitBatch<D>, kernel: AttentionKernel) -> Result<()> {
        let members = batch.shapes.len();
        let q_tiles = batch.shapes.iter().map(|s| s.tokens.div_ceil(QUERIES)).max().unwrap_or(1) as u32;
        self.dev.launch(
            kernel.kernel(),
            (q_tiles, self.cfg.heads as u32, members as u32),
            &[
                Arg::Buf(&batch.q, 0),
                Arg::Buf(&batch.k, 0),
                Arg::Buf(&batch.v, 0),
                Arg::Buf(&batch.att, 0),
                Arg::Buf(&batch.meta, 0),
                Arg::F32(std::f32::consts::LOG2_E / (HEAD_DIM as f32).sqrt()),
                Arg::I32(self.cfg.hidden as i32),
            ],
        )
    }
}

fn grid(n: usize) -> (u32, u32, u32) {
    ((n as u32).div_ceil(BLOCK).max(1), 1, 1)
}

/// Attention of one head on the host in f64: `q` (nq × HEAD_DIM), `k` and
/// `v` (nk × HEAD_DIM), row-major; the reference of `dit_attention`.
pub fn reference_attention(q: &[f32], k: &[f32], v: &[f32], nq: usize, nk: usize) -> Vec<f32> {
    let d = HEAD_DIM;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; nq * d];
    let mut p = vec![0f64; nk];
    for i in 0..nq {
        let qi = &q[i * d..][..d];
        let mut mx = f64::NEG_INFINITY;
        for (j, pj) in p.iter_mut().enumerate() {
            let kj = &k[j * d..][..d];
            *pj = qi.iter().zip(kj).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * scale;
            mx = mx.max(*pj);
        }
        let mut sum = 0.0;
        for pj in p.iter_mut() {
            *pj = (*pj - mx).exp();
            sum += *pj;
        }
        for c in 0..d {
            let acc: f64 = p.iter().enumerate().map(|(j, pj)| pj * f64::from(v[j * d + c])).sum();
            out[i * d + c] = (acc / sum) as f32;
        }
    }
    out
}

fn bf16(x: f32) -> f32 {
    bf16_to_f32(bf16_bits(x))
}

/// `x · wᵀ` on the host with bf16 inputs (as given) and the output rounded
/// to bf16, as the device's products.
fn host_gemm(x: &[f32], w: &[f32], rows: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * n];
    for r in 0..rows {
        let xr = &x[r * k..][..k];
        for c in 0..n {
            let wc = &w[c * k..][..k];
            out[r * n + c] = bf16(xr.iter().zip(wc).map(|(a, b)| a * b).sum());
        }
    }
    out
}

fn host_modulate(x: &[f32], shift: &[f32], scale: &[f32], h: usize) -> Vec<f32> {
    x.chunks(h)
        .flat_map(|row| {
            let mean = row.iter().sum::<f32>() / h as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + 1e-6).sqrt();
            row.iter()
                .enumerate()
                .map(move |(i, v)| bf16((v - mean) * inv * (1.0 + scale[i]) + shift[i]))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The whole chunk of [`GpuDit::chunk`] for one member on the host (f32,
/// bf16 where the device rounds): the residual stream after `forwards`
/// forwards, token-major. The same weights, caches and input as the device
/// from the same configuration, member seed and first row in the batch
/// (the input latents are one draw over the batch's rows). Meant for
/// [`DitConfig::TINY`]: it is a plain triple loop.
pub fn reference_forward(
    cfg: &DitConfig,
    shape: ChunkShape,
    member_seed: u32,
    first_row: usize,
    forwards: usize,
) -> Vec<f32> {
    let (h, f, heads, t) = (cfg.hidden, cfg.ffn, cfg.heads, cfg.text_tokens);
    let (n, m) = (shape.tokens, shape.context);
    let cap = m + n;
    let weight = |rows: usize, k: usize, b: usize, tensor: u32| {
        fill_host(rows * k, seed(cfg, b, tensor), (3.0 / k as f32).sqrt())
    };
    // Caches per block and head, as `DitBatch::new` fills them.
    let mut kc = Vec::new();
    let mut vc = Vec::new();
    let mut tk = Vec::new();
    let mut tv = Vec::new();
    for b in 0..cfg.blocks {
        let (mut kb, mut vb) = (Vec::new(), Vec::new());
        for head in 0..heads {
            let sb = member_seed.wrapping_mul(977).wrapping_add((b * heads + head) as u32);
            let mut kh = fill_host(m * HEAD_DIM, seed(cfg, 0, CTX_K) ^ sb, 1.0);
            let mut vh = fill_host(m * HEAD_DIM, seed(cfg, 0, CTX_V) ^ sb, 1.0);
            kh.resize(cap * HEAD_DIM, 0.0);
            vh.resize(cap * HEAD_DIM, 0.0);
            kb.push(kh);
            vb.push(vh);
        }
        kc.push(kb);
        vc.push(vb);
        let st = member_seed.wrapping_mul(131).wrapping_add(b as u32);
        tk.push(fill_host(heads * t * HEAD_DIM, seed(cfg, 0, TEXT_K) ^ st, 1.0));
        tv.push(fill_host(heads * t * HEAD_DIM, seed(cfg, 0, TEXT_V) ^ st, 1.0));
    }
    let mut x = fill_host((first_row + n) * h, seed(cfg, 0, INPUT), 1.0).split_off(first_row * h);
    let zeros = vec![0f32; h];
    let heads_of = |src: &[f32], width: usize, col: usize, head: usize| -> Vec<f32> {
        (0..n).flat_map(|r| src[r * width + col + head * HEAD_DIM..][..HEAD_DIM].to_vec()).collect()
    };
    let attend_all = |qsrc: &[f32], width: usize, keys: &dyn Fn(usize) -> (Vec<f32>, Vec<f32>, usize)| {
        let mut out = vec![0f32; n * h];
        for head in 0..heads {
            let q = heads_of(qsrc, width, 0, head);
            let (k, v, nk) = keys(head);
            let o = reference_attention(&q, &k, &v, n, nk);
            for r in 0..n {
                for c in 0..HEAD_DIM {
                    out[r * h + head * HEAD_DIM + c] = bf16(o[r * HEAD_DIM + c]);
                }
            }
        }
        out
    };
    for _ in 0..forwards {
        for b in 0..cfg.blocks {
            let md = modulation(cfg, b);
            let mv = |i: usize| &md[i * h..][..h];
            let xb = host_modulate(&x, mv(0), mv(1), h);
            let qkv = host_gemm(&xb, &weight(3 * h, h, b, W_QKV), n, 3 * h, h);
            for head in 0..heads {
                let kh = heads_of(&qkv, 3 * h, h, head);
                let vh = heads_of(&qkv, 3 * h, 2 * h, head);
                kc[b][head][m * HEAD_DIM..].copy_from_slice(&kh);
                vc[b][head][m * HEAD_DIM..].copy_from_slice(&vh);
            }
            let att = attend_all(&qkv, 3 * h, &|head| (kc[b][head].clone(), vc[b][head].clone(), cap));
            let y = host_gemm(&att, &weight(h, h, b, W_O), n, h, h);
            for (i, xi) in x.iter_mut().enumerate() {
                *xi += mv(2)[i % h] * y[i];
            }
            let xb = host_modulate(&x, &zeros, &zeros, h);
            let q = host_gemm(&xb, &weight(h, h, b, W_CQ), n, h, h);
            let att = attend_all(&q, h, &|head| {
                let r = head * t * HEAD_DIM..(head + 1) * t * HEAD_DIM;
                (tk[b][r.clone()].to_vec(), tv[b][r].to_vec(), t)
            });
            let y = host_gemm(&att, &weight(h, h, b, W_CO), n, h, h);
            for (xi, yi) in x.iter_mut().zip(&y) {
                *xi += yi;
            }
            let xb = host_modulate(&x, mv(3), mv(4), h);
            let mid: Vec<f32> = host_gemm(&xb, &weight(f, h, b, W_UP), n, f, h)
                .into_iter()
                .map(|v| bf16(0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044_715 * v * v * v)).tanh())))
                .collect();
            let y = host_gemm(&mid, &weight(h, f, b, W_DOWN), n, h, f);
            for (i, xi) in x.iter_mut().enumerate() {
                *xi += mv(5)[i % h] * y[i];
            }
        }
    }
    x
}

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(1e-30)).sqrt()
}

/// Runs `kernel` alone on random bf16 inputs with the given ragged
/// members ((queries, keys) each, `heads` heads) and returns the worst
/// relative L2 error of any member and head against
/// [`reference_attention`]. The output is poisoned first, so a row the
/// kernel did not write fails.
pub fn check_attention<D: Device>(
    dev: &D,
    kernel: AttentionKernel,
    members: &[(usize, usize)],
    heads: usize,
    seed0: u32,
) -> Result<f64> {
    let d = HEAD_DIM;
    let h = heads * d;
    let (mut q_all, mut k_all, mut v_all, mut meta) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rows = 0usize;
    for (i, &(nq, nk)) in members.iter().enumerate() {
        let s = seed0.wrapping_add(i as u32 * 7);
        meta.extend_from_slice(&[
            q_all.len() as i64,
            (nq * d) as i64,
            nq as i64,
            k_all.len() as i64,
            (nk * d) as i64,
            nk as i64,
            (rows * h) as i64,
            0,
        ]);
        q_all.extend(fill_host(heads * nq * d, s, 1.0));
        k_all.extend(fill_host(heads * nk * d, s ^ 0x55, 1.0));
        v_all.extend(fill_host(heads * nk * d, s ^ 0xAA, 1.0));
        rows += nq;
    }
    let up = |v: &[f32]| -> Result<D::Buf> {
        let b = dev.alloc(v.len().max(1) * 2)?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| bf16_bits(*x).to_le_bytes()).collect();
        dev.upload(&b, 0, &bytes)?;
        Ok(b)
    };
    let (q, k, v) = (up(&q_all)?, up(&k_all)?, up(&v_all)?);
    let o = dev.alloc(rows * h * 2)?;
    dev.upload(&o, 0, &vec![0xFFu8; rows * h * 2])?; // NaN bf16
    let mb = dev.alloc(meta.len() * 8)?;
    dev.upload(&mb, 0, &meta.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    let tiles = members.iter().map(|m| m.0.div_ceil(QUERIES)).max().unwrap_or(1) as u32;
    dev.launch(
        kernel.kernel(),
        (tiles, heads as u32, members.len() as u32),
        &[
            Arg::Buf(&q, 0),
            Arg::Buf(&k, 0),
            Arg::Buf(&v, 0),
            Arg::Buf(&o, 0),
            Arg::Buf(&mb, 0),
            Arg::F32(std::f32::consts::LOG2_E / (d as f32).sqrt()),
            Arg::I32(h as i32),
        ],
    )?;
    let mut bytes = vec![0u8; rows * h * 2];
    dev.download(&o, 0, &mut bytes)?;
    let out: Vec<f32> =
        bytes.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect();
    let mut worst = 0f64;
    let mut row = 0usize;
    for (i, &(nq, nk)) in members.iter().enumerate() {
        let (qo, ko) = (meta[i * META] as usize, meta[i * META + 3] as usize);
        for head in 0..heads {
            let qh = &q_all[qo + head * nq * d..][..nq * d];
            let kh = &k_all[ko + head * nk * d..][..nk * d];
            let vh = &v_all[ko + head * nk * d..][..nk * d];
            let want = reference_attention(qh, kh, vh, nq, nk);
            let got: Vec<f32> = (0..nq).flat_map(|r| out[(row + r) * h + head * d..][..d].to_vec()).collect();
            worst = worst.max(rel_l2(&got, &want));
        }
        row += nq;
    }
    Ok(worst)
}

/// Options of `engine dit-profile`: the DiT's video profile from rates
/// measured on a GPU (no GPU needed to run it).
#[derive(Debug, Clone, clap::Args)]
pub struct ModelledProfileArgs {
    /// One denoising forward at the highest fidelity, ms (`engine
    /// gpu-bench`'s "DiT denoising forward, largest configuration").
    #[arg(long)]
    pub forward_ms: f64,
    /// The attention kernel's rate, TFLOP/s (`engine gpu-bench`'s "DiT
    /// flash attention").
    #[arg(long)]
    pub attention_tflops: f64,
    /// A coalesced batch of k chunks takes chunk × (1 + batch_cost (k − 1))
    /// (from `engine gpu-bench`'s coalescing rows).
    #[arg(long)]
    pub batch_cost: f64,
    /// The GPU the rates were measured on, as nvidia-smi names it.
    #[arg(long)]
    pub gpu: String,
    /// Where and when the rates were measured (the profile's `source`).
    #[arg(long)]
    pub measured: String,
    /// The video profile whose quality column the written profile carries
    /// (the DiT's weights are random).
    #[arg(long, default_value = "policies/profiles/video-cuda-h200.toml")]
    pub quality_from: std::path::PathBuf,
    #[arg(long)]
    pub out: std::path::PathBuf,
}

/// A chunk's time at `fid` from two measured rates: a forward is the
/// products and elementwise work (the same at every fidelity: the chunk's
/// tokens do not change) plus its attention at the kernel's rate. `rest_ms`
/// is the first, derived from a measured forward.
pub fn modelled_chunk_ms(cfg: &DitConfig, fid: &Fidelity, rest_ms: f64, attention_tflops: f64) -> f64 {
    let rates = Rates { forward_ms: rest_ms, attention_tflops, fp8_attention: 1.0 };
    let attention = rates.attention_ms(cfg, fid);
    forwards(fid) as f64 * (rest_ms + attention)
}

/// The non-attention time of a forward, ms, from a measured forward at the
/// highest fidelity and the attention kernel's measured rate.
pub fn rest_ms(cfg: &DitConfig, forward_ms: f64, attention_tflops: f64) -> f64 {
    Rates { forward_ms, attention_tflops, fp8_attention: 1.0 }.rest_ms(cfg)
}

/// `engine dit-profile`: every fp16 configuration of the sweep for which
/// `--quality-from` has a quality, timed by [`modelled_chunk_ms`]; the
/// profile's TOML.
pub fn modelled_profile(a: &ModelledProfileArgs) -> std::result::Result<String, String> {
    let cfg = DitConfig::WAN_1_3B;
    let text =
        std::fs::read_to_string(&a.quality_from).map_err(|e| format!("{}: {e}", a.quality_from.display()))?;
    let quality = policies::video::VideoProfile::parse(&a.quality_from.display().to_string(), &text)
        .map_err(|e| e.to_string())?;
    let rest = rest_ms(&cfg, a.forward_ms, a.attention_tflops);
    if rest.is_nan() || rest <= 0.0 || !(0.0..=1.0).contains(&a.batch_cost) {
        return Err(format!(
            "the rates leave {rest:.1} ms for the products (must be > 0) or batch_cost is outside [0, 1]"
        ));
    }
    let class: String = a.gpu.trim().to_lowercase().split_whitespace().collect::<Vec<_>>().join("-");
    let mut out = format!(
        "# The DiT-shaped video model (engine/src/gpu/dit.rs: Wan-2.1-1.3B shapes, hidden 1536, 30 blocks,\n\
         # 12 heads of 128, MLP 8960, 512 text tokens; a chunk = 3 latent frames x 1560 tokens attending to\n\
         # the sink and W earlier chunks, S denoising forwards + 1 cache pass) on {gpu}.\n\
         # chunk_ms: {rest:.1} ms of products per forward plus its attention at {att} TFLOP/s, both from\n\
         # the measured forward ({fwd} ms at S4-r0.0-W7) and attention kernel ({att} TFLOP/s) of\n\
         # {measured}; the same model predicts the measured S4-r0.0-W3 chunk within 3%\n\
         # (docs/benchmarks/gpu.md, \"The DiT on the GPU\"). Written by `engine dit-profile`.\n\
         # quality: the synthetic model's measured SSIM at the same configuration (from {q}), since the\n\
         # DiT's weights are random. fp8 rows are absent: there is no fp8 attention kernel yet.\n\
         model = \"dit-wan-1.3b-shape\"\n\
         engine_class = \"cuda-{class}\"\n\
         source = \"modelled from rates measured on {gpu}: {measured}\"\n\
         latent_frames = {frames}\n\
         batch_cost = {bc}\n\
         sp2_factor = 0.6\n",
        gpu = a.gpu,
        att = a.attention_tflops,
        fwd = a.forward_ms,
        measured = a.measured,
        q = a.quality_from.display(),
        frames = cfg.chunk_frames,
        bc = a.batch_cost,
    );
    let mut n = 0;
    for fid in Fidelity::sweep().into_iter().filter(|f| f.precision == policies::video::Precision::Fp16) {
        let Some(q) = quality.configs.iter().find(|c| c.fidelity == fid) else { continue };
        let ms = modelled_chunk_ms(&cfg, &fid, rest, a.attention_tflops);
        out.push_str(&format!(
            "\n[[configs]]\nsteps = {}\nsparsity = {:.1}\nwindow = {}\nprecision = \"fp16\"\nchunk_ms = {:.1}\nquality = {}\n",
            fid.steps,
            fid.sparsity(),
            fid.window,
            ms,
            q.quality
        ));
        n += 1;
    }
    if n == 0 {
        return Err(format!("{} has no fp16 configuration of the sweep", a.quality_from.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wan_shape_has_its_parameter_count_and_chunk_flops() {
        let cfg = DitConfig::WAN_1_3B;
        cfg.validate().unwrap();
        DitConfig::TINY.validate().unwrap();
        // Wan 2.1 1.3B: ~1.3-1.4B parameters in its 30 blocks.
        assert!((1.3e9..1.45e9).contains(&cfg.params()), "{}", cfg.params());
        let s = ChunkShape::at(&cfg, &Fidelity::HIGHEST);
        assert_eq!(s, ChunkShape { tokens: 4680, context: 8 * 3 * 1560 });
        let (gemm, attention) = forward_flops(&cfg, s);
        // 2 · tokens · parameters for the products, less the
        // cross-attention's K and V projections (the prompt's are cached);
        // attention over the sink, 7 chunks, the chunk and the prompt.
        let cross_kv = 30.0 * 2.0 * 1536.0 * 1536.0;
        assert!((gemm / (2.0 * 4680.0 * (cfg.params() - cross_kv)) - 1.0).abs() < 1e-9);
        let keys = (s.context + s.tokens + cfg.text_tokens) as f64;
        assert!((attention - 30.0 * 4.0 * 4680.0 * keys * 1536.0).abs() < 1.0);
        // Sparsity drops context frames; a short window keeps the sink.
        let sparse =
            Fidelity { steps: 2, sparsity_pct: 90, window: 1, precision: Fidelity::HIGHEST.precision };
        assert_eq!(ChunkShape::at(&cfg, &sparse).context, 1560);
        assert_eq!(forwards(&sparse), 3);
    }

    #[test]
    fn the_dit_config_rejects_heads_the_kernel_was_not_written_for() {
        let bad = DitConfig { heads: 24, ..DitConfig::WAN_1_3B };
        assert!(bad.validate().unwrap_err().contains("heads × 128"));
    }

    /// The bundled profile is what `engine dit-profile` writes from the
    /// rates measured on the H100 (docs/benchmarks/gpu.md): no hand edits.
    #[test]
    fn the_bundled_dit_profile_is_the_model_of_the_measured_rates() {
        let text = include_str!("../../../policies/profiles/video-dit-cuda-h100.toml");
        let p = policies::video::VideoProfile::parse("video-dit-cuda-h100.toml", text).unwrap();
        assert_eq!(p.configs.len(), 45);
        assert!((p.batch_cost - 0.84).abs() < 1e-9);
        let cfg = DitConfig::WAN_1_3B;
        let rest = rest_ms(&cfg, 414.853, 95.325);
        for c in &p.configs {
            let want = modelled_chunk_ms(&cfg, &c.fidelity, rest, 95.325);
            assert!((c.chunk_ms - want).abs() < 0.051, "{}: {} vs {want}", c.fidelity, c.chunk_ms);
        }
        let highest = p.configs.iter().find(|c| c.fidelity == Fidelity::HIGHEST).unwrap();
        // Five forwards of the measured 414.853 ms.
        assert!((highest.chunk_ms - 5.0 * 414.853).abs() < 0.1);
    }

    #[test]
    fn host_fill_is_deterministic_bf16_and_bounded() {
        let a = fill_host(1000, 3, 0.5);
        assert_eq!(a, fill_host(1000, 3, 0.5));
        assert_ne!(a, fill_host(1000, 4, 0.5));
        assert!(a.iter().all(|v| v.abs() <= 0.5 && bf16(*v) == *v));
        let mean = a.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}
