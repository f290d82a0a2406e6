//! The synthetic chunked video model ("DiT") computed on the host.
//!
//! A chunk is `L` latent frames of `h × w` tokens with `C` channels (4 pixel
//! frames per latent frame, 4× spatial upsampling). It starts as noise
//! seeded by the prompt and the chunk's index and is denoised in `S` steps.
//! Each step predicts the clean latent with one attention layer over the
//! chunk's own tokens plus a context of the prompt's first chunk (the sink)
//! and the last `W` chunks, and a small MLP, then moves along the straight
//! noise-to-prediction path (DDIM-like). Attention skips a share `ρ` of the
//! context's key blocks (one block per latent frame row), keeping the blocks
//! whose mean key scores best against the mean query; fp8 quantises the
//! activations to e4m3 and back. Every knob changes both the cost and the
//! output, which is what the fidelity profile measures.
//!
//! The model's state of one stream ([`StreamState`]) is the prompt
//! embedding, the sink and the window of past chunks; it serialises to
//! bytes exactly (suspend to host memory, export for migration).

use policies::rng::SplitMix;
use policies::video::{Fidelity, Precision};

use super::math::{dot, softmax};

/// Latent channels per token (the kernels' shape: `kernels::video`).
pub const CHANNELS: usize = kernels::video::CHANNELS;
/// Attention width.
const DIM: usize = kernels::video::DIM;
/// MLP width.
const HIDDEN: usize = kernels::video::HIDDEN;
/// Widest window any configuration uses (state keeps this many chunks).
pub const MAX_WINDOW: usize = 7;

pub use engine_api::video::Resolution;

/// The model's weights (generated from a seed; small).
#[derive(Debug, Clone)]
pub struct VideoModel {
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
    /// Latent channels to RGB.
    to_rgb: Vec<f32>,
}

fn weights(rng: &mut SplitMix, rows: usize, cols: usize, scale: f32) -> Vec<f32> {
    (0..rows * cols).map(|_| (rng.unit() * 2.0 - 1.0) * scale).collect()
}

/// `out[j] = Σ_i x[i] · w[i][j]` for a row-major `w` of `x.len() × out.len()`.
fn project(x: &[f32], w: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for (i, xi) in x.iter().enumerate() {
        let row = &w[i * out.len()..(i + 1) * out.len()];
        for (o, wij) in out.iter_mut().zip(row) {
            *o += xi * wij;
        }
    }
}

/// e4m3 round trip: 3 mantissa bits, saturating at ±448.
pub fn fp8(x: f32) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    let clamped = x.clamp(-448.0, 448.0);
    let e = clamped.abs().log2().floor().max(-6.0);
    let step = (e - 3.0).exp2();
    (clamped / step).round() * step
}

/// One stream's model state.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamState {
    /// Per-channel conditioning from the prompt.
    pub prompt: Vec<f32>,
    /// Seed of the prompt (noise per chunk derives from it).
    pub seed: u64,
    /// The first chunk of the current prompt (attention sink).
    pub sink: Option<Vec<f32>>,
    /// The last chunks, oldest first (at most [`MAX_WINDOW`]).
    pub window: Vec<Vec<f32>>,
    /// Chunks generated for the current prompt.
    pub chunks: u64,
}

impl StreamState {
    pub fn new(prompt: &str) -> Self {
        let seed = prompt
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let mut rng = SplitMix(seed);
        let prompt = (0..CHANNELS).map(|_| rng.unit() * 2.0 - 1.0).collect();
        Self { prompt, seed, sink: None, window: Vec::new(), chunks: 0 }
    }

    /// Exact bytes of the state (f32 bit patterns, little-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.seed.to_le_bytes());
        out.extend_from_slice(&self.chunks.to_le_bytes());
        let put = |out: &mut Vec<u8>, v: &[f32]| {
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for x in v {
                out.extend_from_slice(&x.to_bits().to_le_bytes());
            }
        };
        put(&mut out, &self.prompt);
        out.push(u8::from(self.sink.is_some()));
        if let Some(s) = &self.sink {
            put(&mut out, s);
        }
        out.extend_from_slice(&(self.window.len() as u64).to_le_bytes());
        for c in &self.window {
            put(&mut out, c);
        }
        out
    }

    /// Whether every vector has the length the model expects for chunks of
    /// `latent_frames` at `res` (a deserialised state must, before use).
    pub fn fits(&self, res: Resolution, latent_frames: usize) -> bool {
        let chunk = VideoModel::chunk_tokens(res, latent_frames) * CHANNELS;
        self.prompt.len() == CHANNELS
            && self.sink.as_ref().is_none_or(|s| s.len() == chunk)
            && self.window.iter().all(|w| w.len() == chunk)
    }

    /// The state [`StreamState::to_bytes`] wrote; `None` if malformed.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let mut at = 0usize;
        let u64_at = |at: &mut usize| -> Option<u64> {
            let b = bytes.get(*at..*at + 8)?;
            *at += 8;
            Some(u64::from_le_bytes(b.try_into().ok()?))
        };
        let seed = u64_at(&mut at)?;
        let chunks = u64_at(&mut at)?;
        let vec_at = |at: &mut usize| -> Option<Vec<f32>> {
            let n = usize::try_from(u64::from_le_bytes(bytes.get(*at..*at + 8)?.try_into().ok()?)).ok()?;
            *at += 8;
            let end = at.checked_add(n.checked_mul(4)?)?;
            let body = bytes.get(*at..end)?;
            *at = end;
            Some(
                body.chunks_exact(4)
                    .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect(),
            )
        };
        let prompt = vec_at(&mut at)?;
        let has_sink = *bytes.get(at)?;
        at += 1;
        let sink = if has_sink == 1 { Some(vec_at(&mut at)?) } else { None };
        let n = u64_at(&mut at)?;
        let mut window = Vec::new();
        for _ in 0..n.min(MAX_WINDOW as u64) {
            window.push(vec_at(&mut at)?);
        }
        (at == bytes.len()).then_some(Self { prompt, seed, sink, window, chunks })
    }
}

impl VideoModel {
    pub fn new(seed: u64) -> Self {
        let mut rng = SplitMix(seed);
        let a = (1.0 / CHANNELS as f32).sqrt();
        let b = (1.0 / DIM as f32).sqrt();
        Self {
            wq: weights(&mut rng, CHANNELS, DIM, a * 2.0),
            wk: weights(&mut rng, CHANNELS, DIM, a * 2.0),
            wv: weights(&mut rng, CHANNELS, DIM, a),
            wo: weights(&mut rng, DIM, CHANNELS, b),
            w1: weights(&mut rng, CHANNELS, HIDDEN, a),
            w2: weights(&mut rng, HIDDEN, CHANNELS, b * 0.5),
            to_rgb: weights(&mut rng, CHANNELS, 3, 1.0),
        }
    }

    /// The weights as the GPU model uploads them, each row-major `in × out`:
    /// wq, wk, wv (CHANNELS × DIM), wo (DIM × CHANNELS), w1 (CHANNELS ×
    /// HIDDEN), w2 (HIDDEN × CHANNELS), to_rgb (CHANNELS × 3).
    pub fn tensors(&self) -> [&[f32]; 7] {
        [&self.wq, &self.wk, &self.wv, &self.wo, &self.w1, &self.w2, &self.to_rgb]
    }

    /// The context a chunk attends to at `fid`: the sink and the last
    /// `W` chunks, concatenated (tokens × CHANNELS).
    pub fn context_tokens(state: &StreamState, fid: &Fidelity) -> Vec<f32> {
        let mut ctx = Vec::new();
        if let Some(s) = &state.sink {
            ctx.extend_from_slice(s);
        }
        let w = usize::from(fid.window).min(state.window.len());
        for c in &state.window[state.window.len() - w..] {
            ctx.extend_from_slice(c);
        }
        ctx
    }

    /// Tokens of the context a chunk attends to at `fid` (what
    /// [`VideoModel::context_tokens`] returns, counted without copying).
    pub fn context_len(state: &StreamState, fid: &Fidelity) -> usize {
        let sink = state.sink.as_ref().map_or(0, Vec::len);
        let w = usize::from(fid.window).min(state.window.len());
        let window: usize = state.window[state.window.len() - w..].iter().map(Vec::len).sum();
        (sink + window) / CHANNELS
    }

    /// Tokens of one chunk.
    pub fn chunk_tokens(res: Resolution, latent_frames: usize) -> usize {
        latent_frames * res.latent_side() * res.latent_side()
    }

    /// The starting noise of the stream's next chunk.
    pub fn noise(state: &StreamState, res: Resolution, latent_frames: usize) -> Vec<f32> {
        let mut rng = SplitMix(state.seed ^ state.chunks.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        (0..Self::chunk_tokens(res, latent_frames) * CHANNELS).map(|_| rng.normal() as f32).collect()
    }

    /// One denoising step of one chunk: `x` (the noisy latent at level `t`)
    /// becomes the latent at level `t_next`.
    pub fn step(&self, x: &mut [f32], state: &StreamState, fid: &Fidelity, side: usize, t: f32, t_next: f32) {
        let n = x.len() / CHANNELS;
        let q8 = |v: &mut [f32]| {
            if fid.precision == Precision::Fp8 {
                v.iter_mut().for_each(|x| *x = fp8(*x));
            }
        };
        let ctx = Self::context_tokens(state, fid);
        let m = ctx.len() / CHANNELS;
        // Keys and values of the context and of the chunk itself.
        let all: Vec<f32> = ctx.iter().chain(x.iter()).copied().collect();
        let total = m + n;
        let mut keys = vec![0f32; total * DIM];
        let mut vals = vec![0f32; total * DIM];
        for j in 0..total {
            project(&all[j * CHANNELS..(j + 1) * CHANNELS], &self.wk, &mut keys[j * DIM..(j + 1) * DIM]);
            project(&all[j * CHANNELS..(j + 1) * CHANNELS], &self.wv, &mut vals[j * DIM..(j + 1) * DIM]);
        }
        q8(&mut keys);
        q8(&mut vals);
        let mut queries = vec![0f32; n * DIM];
        for i in 0..n {
            project(&x[i * CHANNELS..(i + 1) * CHANNELS], &self.wq, &mut queries[i * DIM..(i + 1) * DIM]);
        }
        q8(&mut queries);
        // Block sparsity over the context: blocks are latent-frame rows.
        let block = side.max(1);
        let blocks = m / block;
        let keep_blocks = fid.kept_blocks(blocks);
        let mut kept: Vec<usize> = (0..blocks).collect();
        if keep_blocks < blocks {
            let mut qmean = vec![0f32; DIM];
            for i in 0..n {
                for d in 0..DIM {
                    qmean[d] += queries[i * DIM + d] / n as f32;
                }
            }
            let mut scored: Vec<(f32, usize)> = (0..blocks)
                .map(|b| {
                    let s: f32 = (b * block..(b + 1) * block)
                        .map(|j| dot(&qmean, &keys[j * DIM..(j + 1) * DIM]))
                        .sum();
                    (s, b)
                })
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            kept = scored.iter().take(keep_blocks).map(|(_, b)| *b).collect();
            kept.sort_unstable();
        }
        let mut cols: Vec<usize> = kept.iter().flat_map(|b| b * block..(b + 1) * block).collect();
        cols.extend(m..total);
        let scale = 1.0 / (DIM as f32).sqrt();
        let mut scores = vec![0f32; cols.len()];
        let mut attn = vec![0f32; DIM];
        let mut out = vec![0f32; CHANNELS];
        let mut hidden = vec![0f32; HIDDEN];
        let mut mlp = vec![0f32; CHANNELS];
        let mut pred = vec![0f32; x.len()];
        for i in 0..n {
            let q = &queries[i * DIM..(i + 1) * DIM];
            for (s, &j) in scores.iter_mut().zip(&cols) {
                *s = dot(q, &keys[j * DIM..(j + 1) * DIM]) * scale;
            }
            softmax(&mut scores);
            attn.fill(0.0);
            for (p, &j) in scores.iter().zip(&cols) {
                for (a, v) in attn.iter_mut().zip(&vals[j * DIM..(j + 1) * DIM]) {
                    *a += p * v;
                }
            }
            project(&attn, &self.wo, &mut out);
            let xi = &x[i * CHANNELS..(i + 1) * CHANNELS];
            project(xi, &self.w1, &mut hidden);
            hidden.iter_mut().for_each(|h| *h = h.tanh());
            q8(&mut hidden);
            project(&hidden, &self.w2, &mut mlp);
            // The prediction: a smooth field conditioned on the prompt and
            // the context, pulled towards what attention saw.
            let (fy, fx) = ((i / side) % side, i % side);
            let frame = i / (side * side);
            for c in 0..CHANNELS {
                let phase = state.prompt[c] * 3.0 + (state.chunks as f32 * 3.0 + frame as f32) * 0.25;
                let field =
                    (fx as f32 * 0.35 * state.prompt[(c + 1) % CHANNELS] + fy as f32 * 0.3 + phase).sin();
                pred[i * CHANNELS + c] = 0.55 * field + 0.6 * out[c] + 0.3 * mlp[c] + 0.1 * xi[c] * t;
            }
        }
        // Straight path from noise to the prediction: x_next = p + (t'/t)(x − p).
        let ratio = if t > 0.0 { t_next / t } else { 0.0 };
        for (xv, p) in x.iter_mut().zip(&pred) {
            *xv = p + ratio * (*xv - p);
        }
    }

    /// Generates the stream's next chunk at `fid` from `noise` and advances
    /// the state (the chunk joins the window; the first is also the sink).
    pub fn finish_chunk(&self, state: &mut StreamState, latent: Vec<f32>) {
        if state.sink.is_none() {
            state.sink = Some(latent.clone());
        }
        state.window.push(latent);
        if state.window.len() > MAX_WINDOW {
            state.window.remove(0);
        }
        state.chunks += 1;
    }

    /// Whole chunk: noise, `S` steps, state update. Returns the latent.
    pub fn generate(
        &self,
        state: &mut StreamState,
        fid: &Fidelity,
        res: Resolution,
        latent_frames: usize,
    ) -> Vec<f32> {
        let mut x = Self::noise(state, res, latent_frames);
        let s = usize::from(fid.steps.max(1));
        for k in 0..s {
            let (t, t_next) = (1.0 - k as f32 / s as f32, 1.0 - (k + 1) as f32 / s as f32);
            self.step(&mut x, state, fid, res.latent_side(), t, t_next);
        }
        self.finish_chunk(state, x.clone());
        x
    }

    /// RGB frames of a chunk: 4 pixel frames per latent frame (blending
    /// towards the next latent frame), each `4·side` square, bilinear.
    pub fn decode(&self, latent: &[f32], res: Resolution) -> Vec<Vec<u8>> {
        let side = res.latent_side();
        let px = res.pixels();
        let per = side * side * CHANNELS;
        let frames = latent.len() / per;
        let rgb_of = |f: usize| -> Vec<f32> {
            let lat = &latent[f * per..(f + 1) * per];
            let mut out = vec![0f32; side * side * 3];
            for i in 0..side * side {
                project(&lat[i * CHANNELS..(i + 1) * CHANNELS], &self.to_rgb, &mut out[i * 3..i * 3 + 3]);
            }
            out
        };
        let lat_rgb: Vec<Vec<f32>> = (0..frames).map(rgb_of).collect();
        let mut out = Vec::new();
        for f in 0..frames {
            let next = &lat_rgb[(f + 1).min(frames - 1)];
            for sub in 0..4 {
                let a = sub as f32 / 4.0;
                let mut img = vec![0u8; px * px * 3];
                for y in 0..px {
                    let fy = (y as f32 + 0.5) / 4.0 - 0.5;
                    let (y0, wy) = (fy.floor().clamp(0.0, (side - 1) as f32) as usize, fy - fy.floor());
                    let y1 = (y0 + 1).min(side - 1);
                    for x in 0..px {
                        let fx = (x as f32 + 0.5) / 4.0 - 0.5;
                        let (x0, wx) = (fx.floor().clamp(0.0, (side - 1) as f32) as usize, fx - fx.floor());
                        let x1 = (x0 + 1).min(side - 1);
                        for c in 0..3 {
                            let at = |r: &Vec<f32>, yy: usize, xx: usize| r[(yy * side + xx) * 3 + c];
                            let bil = |r: &Vec<f32>| {
                                let top = at(r, y0, x0) * (1.0 - wx) + at(r, y0, x1) * wx;
                                let bot = at(r, y1, x0) * (1.0 - wx) + at(r, y1, x1) * wx;
                                top * (1.0 - wy) + bot * wy
                            };
                            let v = bil(&lat_rgb[f]) * (1.0 - a) + bil(next) * a;
                            img[(y * px + x) * 3 + c] = (255.0 / (1.0 + (-1.5 * v).exp())).round() as u8;
                        }
                    }
                }
                out.push(img);
            }
        }
        out
    }
}

/// Mean SSIM of two RGB frame sequences of `side × side` pixels (8 × 8
/// windows, per channel); 1.0 for identical frames.
pub fn ssim(a: &[Vec<u8>], b: &[Vec<u8>], side: usize) -> f64 {
    const C1: f64 = (0.01 * 255.0) * (0.01 * 255.0);
    const C2: f64 = (0.03 * 255.0) * (0.03 * 255.0);
    let mut total = 0.0;
    let mut count = 0usize;
    for (fa, fb) in a.iter().zip(b) {
        for wy in (0..side).step_by(8) {
            for wx in (0..side).step_by(8) {
                for c in 0..3 {
                    let (mut sa, mut sb, mut saa, mut sbb, mut sab, mut n) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
                    for y in wy..(wy + 8).min(side) {
                        for x in wx..(wx + 8).min(side) {
                            let (va, vb) = (
                                f64::from(fa[(y * side + x) * 3 + c]),
                                f64::from(fb[(y * side + x) * 3 + c]),
                            );
                            sa += va;
                            sb += vb;
                            saa += va * va;
                            sbb += vb * vb;
                            sab += va * vb;
                            n += 1.0;
                        }
                    }
                    let (ma, mb) = (sa / n, sb / n);
                    let (va, vb, cov) = (saa / n - ma * ma, sbb / n - mb * mb, sab / n - ma * mb);
                    total += ((2.0 * ma * mb + C1) * (2.0 * cov + C2))
                        / ((ma * ma + mb * mb + C1) * (va + vb + C2));
                    count += 1;
                }
            }
        }
    }
    if count == 0 {
        1.0
    } else {
        total / count as f64
    }
}

/// One member of a coalesced batch.
pub struct BatchItem<'a> {
    /// The session, when the chunk belongs to one (the cuda backend keeps
    /// its context on the device between chunks).
    pub session: Option<&'a str>,
    pub state: &'a mut StreamState,
    pub fidelity: Fidelity,
    pub res: Resolution,
    pub latent_frames: usize,
}

/// The diffusion jobs' model (its own weights, not the live video's).
pub fn diffusion_model(seed: u64) -> VideoModel {
    VideoModel::new(seed ^ 0xD1FF_0510)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_keeps_three_mantissa_bits() {
        assert_eq!(fp8(1.0), 1.0);
        assert_eq!(fp8(1.05), 1.0); // 1.05 rounds to 1 (steps of 1/8)
        assert_eq!(fp8(1.125), 1.125);
        assert_eq!(fp8(1000.0), 448.0);
        assert_eq!(fp8(-3.3), -3.25);
    }

    #[test]
    fn state_bytes_round_trip_exactly() {
        let model = VideoModel::new(7);
        let mut st = StreamState::new("a red fox in the snow");
        for _ in 0..3 {
            model.generate(&mut st, &Fidelity::HIGHEST, Resolution::Tiny, 3);
        }
        let back = StreamState::from_bytes(&st.to_bytes()).unwrap();
        assert_eq!(back, st);
        assert!(StreamState::from_bytes(&st.to_bytes()[..20]).is_none());
    }

    #[test]
    fn chunks_evolve_and_lower_fidelity_costs_quality() {
        let model = VideoModel::new(7);
        let res = Resolution::Tiny;
        let run = |fid: Fidelity| {
            let mut st = StreamState::new("waves on a beach");
            (0..4).map(|_| model.decode(&model.generate(&mut st, &fid, res, 3), res)).collect::<Vec<_>>()
        };
        let reference = run(Fidelity::HIGHEST);
        assert_eq!(reference[0].len(), 12, "12 pixel frames per chunk");
        assert_eq!(reference[0][0].len(), 32 * 32 * 3);
        assert!(ssim(&reference[0], &reference[1], 32) < 0.99, "consecutive chunks differ");
        assert_eq!(ssim(&reference[2], &reference[2], 32), 1.0);
        let low = run(Fidelity { steps: 2, sparsity_pct: 90, window: 1, precision: Precision::Fp8 });
        let q = ssim(&reference[3], &low[3], 32);
        assert!(q < 0.9999 && q > 0.3, "quality {q}");
        // Another prompt is another video.
        let mut other = StreamState::new("a city at night");
        let o = model.decode(&model.generate(&mut other, &Fidelity::HIGHEST, res, 3), res);
        assert!(ssim(&reference[0], &o, 32) < 0.95);
    }
}
