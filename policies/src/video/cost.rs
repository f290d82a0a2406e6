//! What a chunk of a streaming DiT costs at each fidelity configuration: a
//! model from the DiT's shapes and two rates measured on a GPU (a whole
//! forward at the highest fidelity, and the fused attention kernel).
//!
//! A chunk is S denoising forwards plus one pass that writes the KV cache.
//! A forward's work splits in two: the products (projections, MLP, adaLN:
//! fixed per chunk) and the attention, whose keys are the chunk itself, the
//! cached context the configuration keeps (the sink and W earlier chunks,
//! less the blocks sparsity skips) and the text tokens. The products' time
//! is what the measured forward leaves after its attention at the measured
//! kernel rate.
//!
//! fp8 is SlackServe's: SageAttention2's online quantization of the
//! attention only ("without quantizing model weights"), so it shortens the
//! attention share of a forward and nothing else. [`Rates::fp8_attention`]
//! is its time relative to fp16 attention.

use super::{Fidelity, Precision};

/// A DiT's shapes (what its cost depends on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DitShape {
    pub hidden: usize,
    pub blocks: usize,
    pub ffn: usize,
    /// Tokens of one latent frame.
    pub frame_tokens: usize,
    /// Latent frames per chunk.
    pub chunk_frames: usize,
    /// Text tokens the cross-attention reads.
    pub text_tokens: usize,
}

impl DitShape {
    /// Wan 2.1's 1.3B text-to-video DiT at 480p (60 × 104 latents in 2 × 2
    /// patches a frame), 3 latent frames a chunk, as the causal streaming
    /// variants serve it.
    pub const WAN_1_3B: DitShape = DitShape {
        hidden: 1536,
        blocks: 30,
        ffn: 8960,
        frame_tokens: 1560,
        chunk_frames: 3,
        text_tokens: 512,
    };

    /// Tokens of one chunk.
    pub fn chunk_tokens(&self) -> usize {
        self.frame_tokens * self.chunk_frames
    }
}

/// The tokens a chunk computes and the cached context it attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkShape {
    pub tokens: usize,
    pub context: usize,
}

impl ChunkShape {
    /// A chunk deep in a stream at `fid`: the sink chunk and `window`
    /// earlier chunks, of whose frames sparsity keeps
    /// [`Fidelity::kept_blocks`].
    pub fn at(shape: &DitShape, fid: &Fidelity) -> Self {
        let frames = (usize::from(fid.window) + 1) * shape.chunk_frames;
        ChunkShape { tokens: shape.chunk_tokens(), context: fid.kept_blocks(frames) * shape.frame_tokens }
    }
}

/// Floating-point operations of one forward over a chunk (a multiply-add
/// counts 2): the products, and the two attentions.
pub fn forward_flops(shape: &DitShape, s: ChunkShape) -> (f64, f64) {
    let (n, h, f, b) = (s.tokens as f64, shape.hidden as f64, shape.ffn as f64, shape.blocks as f64);
    let gemm = b * 2.0 * n * h * (3.0 * h + h + h + h + 2.0 * f);
    let keys = (s.context + s.tokens) as f64 + shape.text_tokens as f64;
    let attention = b * 4.0 * n * keys * h;
    (gemm, attention)
}

/// Forwards per chunk: the denoising steps and the cache pass.
pub fn forwards(fid: &Fidelity) -> usize {
    usize::from(fid.steps) + 1
}

/// Rates measured on one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// One forward at [`Fidelity::HIGHEST`], ms.
    pub forward_ms: f64,
    /// The attention kernel's rate, TFLOP/s.
    pub attention_tflops: f64,
    /// fp8 attention's time relative to fp16's.
    pub fp8_attention: f64,
}

impl Rates {
    /// The DiT on an H100 (docs/benchmarks/gpu.md "The DiT on the GPU"): a
    /// forward at S4-r0.0-W7 in 414.853 ms, the fused attention at 95.325
    /// TFLOP/s. fp8 attention at half fp16's time: SageAttention2's INT8/FP8
    /// kernels run about 2x FlashAttention's fp16 rate on Hopper (the
    /// papers report 2-3x); not measured here (no fp8 kernel yet).
    pub const H100_DIT: Rates = Rates { forward_ms: 414.853, attention_tflops: 95.325, fp8_attention: 0.5 };

    /// The same H100 with a production attention kernel: the products as
    /// measured (the forward less its 385.787 ms of attention at 95.325
    /// TFLOP/s: 29.066 ms), the attention at FlashAttention-3's published H100 rates, 740
    /// TFLOP/s in fp16 and 1.2 PFLOP/s in fp8 (Shah et al. 2024), so fp8
    /// attention takes 0.617 of fp16's time. What the shipped emulated
    /// video profile models (the serving stacks of the seeds use such
    /// kernels); this project's own kernel puts 93% of a forward in
    /// attention, FlashAttention-3 about 63%.
    pub const H100_FA3: Rates = Rates {
        forward_ms: 29.066 + 385.787 * 95.325 / 740.0,
        attention_tflops: 740.0,
        fp8_attention: 740.0 / 1200.0,
    };

    /// fp16 attention time of one forward at `fid`, ms.
    pub fn attention_ms(&self, shape: &DitShape, fid: &Fidelity) -> f64 {
        let (_, attention) = forward_flops(shape, ChunkShape::at(shape, fid));
        attention / (self.attention_tflops * 1e12) * 1e3
    }

    /// The products' time of one forward (every configuration's), ms.
    pub fn rest_ms(&self, shape: &DitShape) -> f64 {
        self.forward_ms - self.attention_ms(shape, &Fidelity::HIGHEST)
    }

    /// One chunk at `fid`, ms: its forwards, fp8 shortening their attention.
    pub fn chunk_ms(&self, shape: &DitShape, fid: &Fidelity) -> f64 {
        let precision = match fid.precision {
            Precision::Fp16 => 1.0,
            Precision::Fp8 => self.fp8_attention,
        };
        forwards(fid) as f64 * (self.rest_ms(shape) + self.attention_ms(shape, fid) * precision)
    }

    /// The share of a chunk's time at `fid` that is attention.
    pub fn attention_share(&self, shape: &DitShape, fid: &Fidelity) -> f64 {
        let precision = if fid.precision == Precision::Fp8 { self.fp8_attention } else { 1.0 };
        forwards(fid) as f64 * self.attention_ms(shape, fid) * precision / self.chunk_ms(shape, fid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: DitShape = DitShape::WAN_1_3B;

    #[test]
    fn fp8_shortens_the_attention_share_only() {
        // A known split: 100 ms a forward, 40 of them attention at S4-r0-W7.
        let att = SHAPE.blocks as f64
            * 4.0
            * SHAPE.chunk_tokens() as f64
            * ((8 * SHAPE.chunk_frames * SHAPE.frame_tokens + SHAPE.chunk_tokens() + SHAPE.text_tokens)
                as f64)
            * SHAPE.hidden as f64;
        let rates = Rates { forward_ms: 100.0, attention_tflops: att / 40e-3 / 1e12, fp8_attention: 0.5 };
        let top = Fidelity::HIGHEST;
        assert!((rates.attention_ms(&SHAPE, &top) - 40.0).abs() < 1e-9);
        assert!((rates.chunk_ms(&SHAPE, &top) - 500.0).abs() < 1e-9, "5 forwards of 100 ms");
        let fp8 = Fidelity { precision: Precision::Fp8, ..top };
        assert!((rates.chunk_ms(&SHAPE, &fp8) - 5.0 * (60.0 + 20.0)).abs() < 1e-9, "only the 40 ms halve");
        assert!((rates.attention_share(&SHAPE, &top) - 0.4).abs() < 1e-9);
        assert!((rates.attention_share(&SHAPE, &fp8) - 0.25).abs() < 1e-9);
        // Less context, less attention: fp8 then gains less.
        let narrow = Fidelity { window: 1, sparsity_pct: 90, ..top };
        let gain = |f: Fidelity| {
            rates.chunk_ms(&SHAPE, &f) / rates.chunk_ms(&SHAPE, &Fidelity { precision: Precision::Fp8, ..f })
        };
        assert!(gain(narrow) < gain(top), "{} < {}", gain(narrow), gain(top));
        assert!(gain(top) < 2.0, "never the whole chunk");
    }

    #[test]
    fn the_measured_h100_forward_is_mostly_attention_at_the_widest_context() {
        // 42,632 keys for each of 4,680 queries at 95 TFLOP/s: 386 of the
        // 415 ms (this project's kernel; a faster one shrinks the share).
        let r = Rates::H100_DIT;
        let share = r.attention_share(&SHAPE, &Fidelity::HIGHEST);
        assert!((0.90..0.95).contains(&share), "{share}");
        let narrow = Fidelity { steps: 2, sparsity_pct: 90, window: 1, precision: Precision::Fp16 };
        assert!(r.attention_share(&SHAPE, &narrow) < 0.7, "{}", r.attention_share(&SHAPE, &narrow));
        // FlashAttention-3's rates keep the products as measured.
        let fa3 = Rates::H100_FA3;
        assert!(
            (fa3.rest_ms(&SHAPE) - r.rest_ms(&SHAPE)).abs() < 0.01,
            "{} {}",
            fa3.rest_ms(&SHAPE),
            r.rest_ms(&SHAPE)
        );
        let share = fa3.attention_share(&SHAPE, &Fidelity::HIGHEST);
        assert!((0.60..0.66).contains(&share), "{share}");
        assert!((r.chunk_ms(&SHAPE, &Fidelity::HIGHEST) - 5.0 * 414.853).abs() < 1e-6);
    }
}
