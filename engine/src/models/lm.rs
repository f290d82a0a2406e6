//! A small decoder-only transformer with weights generated from a seed.
//!
//! Pre-norm blocks (RMSNorm → multi-head attention with rotary positions →
//! RMSNorm → SwiGLU MLP), a separate output head, fp32 throughout. Every
//! sequence starts with a fixed begin-of-sequence token whose K/V are
//! computed once at load and kept outside the paged cache (an attention
//! sink, and the context an empty prompt generates from).
//!
//! K/V of every other position live in the [`KvArena`]: fixed-size pages
//! allocated once at start and addressed by the [`PageId`]s the engine's
//! allocator hands out; position `p` of a sequence is slot `p % page_tokens`
//! of its `p / page_tokens`-th page.

use std::sync::Arc;

use super::math::{dot, matmul, rmsnorm, rope, softmax, swiglu, Packed, Pool};
use crate::kv::PageId;
use policies::rng::SplitMix;

/// Shape of the synthetic model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelConfig {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// MLP inner width.
    pub ffn: usize,
    /// Vocabulary size, including the end-of-sequence token 0.
    pub vocab: usize,
    /// Seed the weights are generated from.
    pub seed: u64,
}

impl ModelConfig {
    /// Checks the shape; the message names the offending flag's meaning.
    pub fn validate(&self) -> Result<(), String> {
        if self.layers == 0 || self.hidden == 0 || self.heads == 0 || self.ffn == 0 {
            return Err("layers, hidden size, heads and MLP width must be positive".into());
        }
        if self.hidden % self.heads != 0 || (self.hidden / self.heads) % 2 != 0 {
            return Err(format!(
                "hidden size {} must split into {} heads of an even width",
                self.hidden, self.heads
            ));
        }
        if self.vocab < 2 {
            return Err("the vocabulary needs at least 2 tokens".into());
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Weights read per decode step (every matrix once), in parameters.
    pub fn streamed_parameters(&self) -> usize {
        let h = self.hidden;
        self.layers * (4 * h * h + 3 * h * self.ffn) + self.vocab * h
    }

    /// Bytes of K/V cache per token of context.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * 2 * self.hidden * std::mem::size_of::<f32>()
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V projections stacked: (3·hidden) × hidden.
    wqkv: Arc<Packed>,
    wo: Arc<Packed>,
    mlp_norm: Vec<f32>,
    /// Gate and up projections stacked: (2·ffn) × hidden.
    w_gate_up: Arc<Packed>,
    /// hidden × ffn.
    w_down: Arc<Packed>,
}

/// The weights, plus the begin-of-sequence token's K/V and logits.
pub struct Model {
    pub cfg: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Arc<Packed>,
    bos_k: Vec<Vec<f32>>,
    bos_v: Vec<Vec<f32>>,
    bos_logits: Vec<f32>,
    /// Rotary frequency of each dimension pair of a head.
    inv_freq: Vec<f32>,
    /// Workers for large matrix products.
    pool: Pool,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// Uniform weights with variance `scale² / fan_in`.
fn tensor(rng: &mut SplitMix, rows: usize, fan_in: usize, scale: f32) -> Vec<f32> {
    let a = scale * (3.0 / fan_in as f32).sqrt();
    (0..rows * fan_in).map(|_| (2.0 * rng.unit() - 1.0) * a).collect()
}

/// Paged K/V memory for every layer; owned by the backend, indexed by the
/// allocator's page ids.
pub struct KvArena {
    page_tokens: usize,
    pages: usize,
    hidden: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl std::fmt::Debug for KvArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvArena").field("pages", &self.pages).field("page_tokens", &self.page_tokens).finish()
    }
}

impl KvArena {
    /// Allocates the whole cache up front.
    pub fn new(cfg: &ModelConfig, pages: u32, page_tokens: u32) -> Self {
        let (pages, page_tokens) = (pages as usize, page_tokens.max(1) as usize);
        let n = cfg.layers * pages * page_tokens * cfg.hidden;
        Self { page_tokens, pages, hidden: cfg.hidden, k: vec![0.0; n], v: vec![0.0; n] }
    }

    /// Positions `pages` can hold.
    pub fn capacity(&self, pages: &[PageId]) -> usize {
        pages.len() * self.page_tokens
    }

    /// Tokens per page.
    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }

    fn at(&self, layer: usize, pages: &[PageId], pos: usize) -> usize {
        let page = pages[pos / self.page_tokens] as usize;
        debug_assert!(page < self.pages);
        ((layer * self.pages + page) * self.page_tokens + pos % self.page_tokens) * self.hidden
    }
}

/// One sequence's share of a forward pass: `tokens` at positions
/// `start..start + tokens.len()`, with K/V in `pages`.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub pages: &'a [PageId],
}

/// The weights as generated from the seed, row-major (`rows × fan_in`), before
/// any backend lays them out: the cpu backend packs them, the GPU backend
/// uploads them as bf16. Norm gains are all one.
pub struct Weights {
    /// vocab × hidden.
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    /// vocab × hidden.
    pub lm_head: Vec<f32>,
}

/// One block's matrices, row-major `out × in`.
pub struct LayerWeights {
    /// Q, K and V stacked: (3·hidden) × hidden.
    pub wqkv: Vec<f32>,
    /// hidden × hidden.
    pub wo: Vec<f32>,
    /// Gate and up stacked: (2·ffn) × hidden.
    pub w_gate_up: Vec<f32>,
    /// hidden × ffn.
    pub w_down: Vec<f32>,
}

impl Weights {
    /// The weights of `cfg.seed`.
    pub fn generate(cfg: &ModelConfig) -> Self {
        let (h, f) = (cfg.hidden, cfg.ffn);
        let mut rng = SplitMix(cfg.seed ^ 0xD1B5_4A32_D192_ED03);
        let residual = 1.0 / (2.0 * cfg.layers as f32).sqrt();
        // Unit variance per entry; the head gives logits a spread of about 3,
        // so sampling at temperature 1 is varied but not uniform.
        let embed = tensor(&mut rng, cfg.vocab, h, (h as f32).sqrt());
        let layers = (0..cfg.layers)
            .map(|_| LayerWeights {
                wqkv: tensor(&mut rng, 3 * h, h, 1.0),
                wo: tensor(&mut rng, h, h, residual),
                w_gate_up: tensor(&mut rng, 2 * f, h, 1.0),
                w_down: tensor(&mut rng, h, f, residual),
            })
            .collect();
        let lm_head = tensor(&mut rng, cfg.vocab, h, 3.0);
        Self { embed, layers, lm_head }
    }
}

/// Each sequence's logits from the rows of `logits` (`vocab` wide, one per
/// sequence with tokens, in order); a sequence without tokens generates
/// from the begin-of-sequence token, `bos`.
pub(crate) fn per_sequence(
    seqs: &[SeqInput<'_>],
    logits: &[f32],
    vocab: usize,
    bos: &[f32],
) -> Vec<Vec<f32>> {
    let mut rows = logits.chunks_exact(vocab);
    seqs.iter()
        .map(|inp| {
            if inp.tokens.is_empty() {
                bos.to_vec()
            } else {
                rows.next().map(<[f32]>::to_vec).unwrap_or_default()
            }
        })
        .collect()
}

/// Rotary frequency of each dimension pair of a head.
pub fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    (0..cfg.head_dim() / 2).map(|i| 10000f32.powf(-((2 * i) as f32) / cfg.head_dim() as f32)).collect()
}

impl Model {
    /// Generates the weights from `cfg.seed`.
    pub fn new(cfg: ModelConfig, threads: usize) -> Self {
        let (h, f) = (cfg.hidden, cfg.ffn);
        let w = Weights::generate(&cfg);
        let layers = w
            .layers
            .iter()
            .map(|l| Layer {
                attn_norm: vec![1.0; h],
                wqkv: Arc::new(Packed::new(&l.wqkv, h)),
                wo: Arc::new(Packed::new(&l.wo, h)),
                mlp_norm: vec![1.0; h],
                w_gate_up: Arc::new(Packed::new(&l.w_gate_up, h)),
                w_down: Arc::new(Packed::new(&l.w_down, f)),
            })
            .collect();
        let mut model = Self {
            cfg,
            embed: w.embed,
            layers,
            final_norm: vec![1.0; h],
            lm_head: Arc::new(Packed::new(&w.lm_head, h)),
            bos_k: Vec::new(),
            bos_v: Vec::new(),
            bos_logits: Vec::new(),
            pool: Pool::new(threads),
            inv_freq: inv_freq(&cfg),
        };
        model.init_bos();
        model
    }

    /// Runs the begin-of-sequence token (id 0, position 0) through the
    /// network once; it attends only to itself.
    fn init_bos(&mut self) {
        let h = self.cfg.hidden;
        let mut x = self.embed[..h].to_vec();
        let (mut xn, mut qkv, mut tmp) = (vec![0.0; h], vec![0.0; 3 * h], vec![0.0; h]);
        for layer in &self.layers {
            rmsnorm(&x, &layer.attn_norm, &mut xn);
            matmul(&xn, &layer.wqkv, &mut qkv, &self.pool);
            // Rotation at position 0 is the identity; softmax over one
            // score is 1, so the attention output is V itself.
            self.bos_k.push(qkv[h..2 * h].to_vec());
            self.bos_v.push(qkv[2 * h..].to_vec());
            matmul(&qkv[2 * h..], &layer.wo, &mut tmp, &self.pool);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
            self.mlp(layer, &mut x);
        }
        self.bos_logits = self.head(&x);
    }

    /// The residual SwiGLU block, in place on every row of `x`.
    fn mlp(&self, layer: &Layer, x: &mut [f32]) {
        let (h, f) = (self.cfg.hidden, self.cfg.ffn);
        let n = x.len() / h;
        let (mut xn, mut gu, mut act, mut tmp) =
            (vec![0.0; n * h], vec![0.0; n * 2 * f], vec![0.0; n * f], vec![0.0; n * h]);
        rmsnorm(x, &layer.mlp_norm, &mut xn);
        matmul(&xn, &layer.w_gate_up, &mut gu, &self.pool);
        for (gr, ar) in gu.chunks_exact(2 * f).zip(act.chunks_exact_mut(f)) {
            swiglu(&gr[..f], &gr[f..], ar);
        }
        matmul(&act, &layer.w_down, &mut tmp, &self.pool);
        x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
    }

    /// Final norm and output head over rows of `x`: vocab logits per row.
    fn head(&self, x: &[f32]) -> Vec<f32> {
        let mut normed = vec![0.0; x.len()];
        rmsnorm(x, &self.final_norm, &mut normed);
        let mut logits = vec![0.0; x.len() / self.cfg.hidden * self.cfg.vocab];
        matmul(&normed, &self.lm_head, &mut logits, &self.pool);
        logits
    }

    /// Runs every sequence's tokens through the network as one batch,
    /// writing their K/V into `kv`, and returns each sequence's logits for
    /// the token after its last one. Sequences must own pages for every
    /// position they process (the caller checks [`KvArena::capacity`]).
    pub fn forward(&self, kv: &mut KvArena, seqs: &[SeqInput<'_>]) -> Vec<Vec<f32>> {
        let (h, hd) = (self.cfg.hidden, self.cfg.head_dim());
        // Row r of the batch: (sequence, position).
        let rows: Vec<(usize, usize)> = seqs
            .iter()
            .enumerate()
            .flat_map(|(s, inp)| (0..inp.tokens.len()).map(move |i| (s, inp.start + i)))
            .collect();
        let n = rows.len();
        let mut x = Vec::with_capacity(n * h);
        for inp in seqs {
            for &t in inp.tokens {
                let t = (t as usize).min(self.cfg.vocab - 1);
                x.extend_from_slice(&self.embed[t * h..(t + 1) * h]);
            }
        }
        let (mut xn, mut qkv, mut att, mut tmp) =
            (vec![0.0; n * h], vec![0.0; n * 3 * h], vec![0.0; n * h], vec![0.0; n * h]);
        let mut scores = Vec::new();
        // Rotation (cos, sin pairs) of each row's position, shared by every
        // layer and head; the sink takes position 0, so token p is at p + 1.
        let mut rot = Vec::with_capacity(n * hd);
        for &(_, pos) in &rows {
            for &freq in &self.inv_freq {
                let (sin, cos) = ((pos + 1) as f32 * freq).sin_cos();
                rot.extend_from_slice(&[cos, sin]);
            }
        }
        for (l, layer) in self.layers.iter().enumerate() {
            rmsnorm(&x, &layer.attn_norm, &mut xn);
            matmul(&xn, &layer.wqkv, &mut qkv, &self.pool);
            // Rotate Q and K, then store every row's K/V before any row
            // attends, so a prompt's rows see each other (causally).
            for (r, &(s, pos)) in rows.iter().enumerate() {
                let row = &mut qkv[r * 3 * h..(r + 1) * 3 * h];
                let rot = &rot[r * hd..(r + 1) * hd];
                for head in 0..self.cfg.heads {
                    rope(&mut row[head * hd..(head + 1) * hd], rot);
                    rope(&mut row[h + head * hd..h + (head + 1) * hd], rot);
                }
                let at = kv.at(l, seqs[s].pages, pos);
                kv.k[at..at + h].copy_from_slice(&row[h..2 * h]);
                kv.v[at..at + h].copy_from_slice(&row[2 * h..]);
            }
            for (r, &(s, pos)) in rows.iter().enumerate() {
                let q = &qkv[r * 3 * h..r * 3 * h + h];
                self.attend(kv, l, seqs[s].pages, pos, q, &mut scores, &mut att[r * h..(r + 1) * h]);
            }
            matmul(&att, &layer.wo, &mut tmp, &self.pool);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
            self.mlp(layer, &mut x);
        }
        // Logits only for each sequence's last row.
        let mut last = Vec::new();
        let mut row = 0;
        for inp in seqs {
            row += inp.tokens.len();
            if !inp.tokens.is_empty() {
                last.extend_from_slice(&x[(row - 1) * h..row * h]);
            }
        }
        per_sequence(seqs, &self.head(&last), self.cfg.vocab, &self.bos_logits)
    }

    /// One row's attention at position `pos` of layer `l`: every head
    /// against the sink and positions `0..=pos`, walking the cache position
    /// by position (each position's K/V row is contiguous). `scores` is
    /// scratch laid out as `[head * ctx + 1 + p]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        kv: &KvArena,
        l: usize,
        pages: &[PageId],
        pos: usize,
        q: &[f32],
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let (h, hd, heads) = (self.cfg.hidden, self.cfg.head_dim(), self.cfg.heads);
        let scale = 1.0 / (hd as f32).sqrt();
        let ctx = pos + 2;
        scores.clear();
        scores.resize(heads * ctx, 0.0);
        for head in 0..heads {
            let hs = head * hd..(head + 1) * hd;
            scores[head * ctx] = dot(&q[hs.clone()], &self.bos_k[l][hs]) * scale;
        }
        for p in 0..=pos {
            let at = kv.at(l, pages, p);
            let krow = &kv.k[at..at + h];
            for head in 0..heads {
                let hs = head * hd..(head + 1) * hd;
                scores[head * ctx + 1 + p] = dot(&q[hs.clone()], &krow[hs]) * scale;
            }
        }
        for head_scores in scores.chunks_exact_mut(ctx) {
            softmax(head_scores);
        }
        for head in 0..heads {
            let hs = head * hd..(head + 1) * hd;
            let w = scores[head * ctx];
            for (o, v) in out[hs.clone()].iter_mut().zip(&self.bos_v[l][hs]) {
                *o = w * v;
            }
        }
        for p in 0..=pos {
            let at = kv.at(l, pages, p);
            let vrow = &kv.v[at..at + h];
            for head in 0..heads {
                let hs = head * hd..(head + 1) * hd;
                let w = scores[head * ctx + 1 + p];
                for (o, v) in out[hs.clone()].iter_mut().zip(&vrow[hs]) {
                    *o += w * v;
                }
            }
        }
    }
}
