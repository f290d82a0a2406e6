//! CUDA kernels of the engine's synthetic models, and the device interface
//! the GPU models are written against.
//!
//! - The CUDA C sources in `kernels/cuda/` (`common.cuh`, `lm.cu`,
//!   `video.cu`, `dit.cu`) are one program, compiled at run time with NVRTC
//!   for the device's architecture during the engine's warm-up ([`source`],
//!   [`nvrtc_options`]). They cover what the models need beyond matrix
//!   products: paged-KV attention and the decode GEMV, RMSNorm, rotary
//!   positions, SwiGLU, windowed chunk attention with block sparsity, fp8
//!   e4m3 round trips, frame decoding, and the DiT's adaLN, GELU and fused
//!   flash attention on the tensor cores (`mma.sync`, `ldmatrix`,
//!   `cp.async` through helpers the emulator implements warp by warp).
//!   Matrix products go through cuBLAS ([`Device::gemm`]).
//! - [`Device`] is what a model needs from a GPU: buffers, copies, kernel
//!   launches by name with `cuLaunchKernel`-style arguments, a GEMM, and
//!   asynchronous offload/restore to pinned host memory. The engine
//!   implements it on CUDA (cudarc, `cuda` feature) and `kernel-emu`
//!   implements it on the host by compiling the same sources as C++, so
//!   the models' GPU code is tested against the cpu backend on machines
//!   without a GPU.
//!
//! The kernels' reference math is the engine's cpu backend
//! (`engine::backend::cpu::math`, `engine::video::model`): GPU results are
//! checked against it, within the tolerances in `docs/architecture.md`.
//! This crate has no dependencies.
#![forbid(unsafe_code)]

use std::fmt;

/// Threads per block of every kernel (the sources' reductions assume it).
pub const BLOCK: u32 = 128;

/// The video model's shape, shared by the sources (as defines) and the
/// engine's host model.
pub mod video {
    /// Latent channels per token.
    pub const CHANNELS: usize = 8;
    /// Attention width.
    pub const DIM: usize = 32;
    /// MLP width.
    pub const HIDDEN: usize = 32;
    /// Ints per member row of `meta`: x_off, n, kv_off, m, side, keep,
    /// col_off, flags (bit 0: fp8).
    pub const MI: usize = 8;
    /// Floats per member row of `mparam`: the prompt (CHANNELS), the
    /// chunk's index, t, t_next / t, one spare.
    pub const MF: usize = 12;
    /// Query tokens per `video_attend` block (`AQ`); the host groups each
    /// member's tokens into tiles of this many.
    pub const ATTEND_QUERIES: usize = 64;
    /// Key/value columns a `video_attend` block stages at a time (`AK`).
    pub const ATTEND_COLUMNS: usize = 64;
}

/// The source files, in compile order.
pub const FILES: [(&str, &str); 4] = [
    ("common.cuh", include_str!("../cuda/common.cuh")),
    ("lm.cu", include_str!("../cuda/lm.cu")),
    ("video.cu", include_str!("../cuda/video.cu")),
    ("dit.cu", include_str!("../cuda/dit.cu")),
];

/// Every kernel entry point (`extern "C" __global__`) in [`FILES`].
pub const KERNELS: [&str; 25] = [
    "to_bf16",
    "add_into",
    "gather_rows",
    "lm_embed",
    "lm_rmsnorm",
    "lm_rope_store",
    "lm_attention",
    "lm_swiglu",
    "lm_gemv",
    "video_project",
    "video_query_mean",
    "video_key_dots",
    "video_select",
    "video_attend",
    "video_attend_merge",
    "video_update",
    "video_decode",
    "dit_attention",
    "dit_attention_async",
    "dit_modulate",
    "dit_to_heads",
    "dit_set",
    "dit_gelu",
    "dit_gated_add",
    "dit_fill",
];

/// The DiT video model's kernels (`dit.cu`): its attention's tile shape.
pub mod dit {
    /// Head width the attention kernel is written for.
    pub const HEAD_DIM: usize = 128;
    /// Query rows per attention block (16 per warp).
    pub const QUERIES: usize = 64;
    /// Keys `dit_attention` stages in shared memory per step.
    pub const KEYS: usize = 64;
    /// Keys `dit_attention_async` stages per step (two stages deep).
    pub const ASYNC_KEYS: usize = 32;
    /// i64 words per member row of the attention's `meta`: q offset, q
    /// head stride, queries, k/v offset, k/v head stride, keys, output
    /// offset, spare (offsets and strides in elements).
    pub const META: usize = 8;
}

/// Rows up to which the LM's products run as a bandwidth-bound GEMV
/// (`lm_gemv`) rather than through cuBLAS.
pub const GEMV_ROWS: usize = 8;

/// Preprocessor defines every build of the sources gets (NVRTC and the
/// host emulator alike).
pub fn defines() -> Vec<(&'static str, String)> {
    vec![
        ("BLOCK", BLOCK.to_string()),
        ("CHANNELS", video::CHANNELS.to_string()),
        ("DIM", video::DIM.to_string()),
        ("HIDDEN", video::HIDDEN.to_string()),
        ("AQ", video::ATTEND_QUERIES.to_string()),
        ("AK", video::ATTEND_COLUMNS.to_string()),
        ("HD", dit::HEAD_DIM.to_string()),
        ("FA_Q", dit::QUERIES.to_string()),
        ("FA_K", dit::KEYS.to_string()),
        ("FA_KA", dit::ASYNC_KEYS.to_string()),
        ("GEMV_ROWS", GEMV_ROWS.to_string()),
    ]
}

/// The whole program as one translation unit, each file introduced by a
/// `#line` directive so compiler messages name the file and line.
pub fn source() -> String {
    let mut out = String::new();
    for (name, text) in FILES {
        out.push_str(&format!("#line 1 \"kernels/cuda/{name}\"\n"));
        out.push_str(text);
        out.push('\n');
    }
    out
}

/// NVRTC options for a device of compute capability `cc` (major, minor):
/// real code for that architecture, C++17, the defines, fast paths that
/// keep IEEE division and square root.
pub fn nvrtc_options(cc: (i32, i32)) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture=sm_{}{}", cc.0, cc.1), "--std=c++17".to_string()];
    o.extend(defines().into_iter().map(|(k, v)| format!("-D{k}={v}")));
    o
}

/// What a device call failed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError(pub String);

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeviceError {}

pub type Result<T> = std::result::Result<T, DeviceError>;

/// One kernel argument, as `cuLaunchKernel` takes them.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a, B> {
    /// A device pointer: the buffer's base plus a byte offset.
    Buf(&'a B, usize),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// `C = A · Bᵀ` with A `m × k` and B `n × k` as row-major bf16 bits, C
/// `m × n` row-major f32, or bf16 bits when `bf16_out` (fp32 accumulation
/// either way). Offsets in elements.
#[derive(Debug, Clone, Copy)]
pub struct Gemm<'a, B> {
    pub a: (&'a B, usize),
    pub b: (&'a B, usize),
    pub c: (&'a B, usize),
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bf16_out: bool,
}

/// What a model needs from a GPU. Work is issued in order on one compute
/// stream; `download` waits for it. Offload and restore run on a copy
/// stream of their own against pinned host memory, ordered after the
/// compute issued before them, so they overlap compute issued after.
pub trait Device: Send + Sync + 'static {
    /// Device memory.
    type Buf: Send + Sync;
    /// Pinned (page-locked) host memory.
    type Host: Send;

    /// What the device is, for logs and profiles ("NVIDIA H100 80GB HBM3").
    fn name(&self) -> String;
    /// A zeroed buffer of `bytes`.
    fn alloc(&self, bytes: usize) -> Result<Self::Buf>;
    /// Host to device at a byte offset (ordered on the compute stream).
    fn upload(&self, dst: &Self::Buf, offset: usize, src: &[u8]) -> Result<()>;
    /// Device to host at a byte offset, after all issued work.
    fn download(&self, src: &Self::Buf, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Device to device (ordered on the compute stream).
    fn copy(&self, src: (&Self::Buf, usize), dst: (&Self::Buf, usize), bytes: usize) -> Result<()>;
    /// Launches `kernel` (one of [`KERNELS`]) with `grid` blocks of [`BLOCK`] threads.
    fn launch(&self, kernel: &str, grid: (u32, u32, u32), args: &[Arg<'_, Self::Buf>]) -> Result<()>;
    /// A bf16 product with fp32 accumulation (cuBLAS).
    fn gemm(&self, g: Gemm<'_, Self::Buf>) -> Result<()>;
    /// Pinned host memory of `bytes`.
    fn alloc_host(&self, bytes: usize) -> Result<Self::Host>;
    /// The pinned memory's bytes (valid once the copy into it has finished).
    fn host_bytes<'h>(&self, host: &'h Self::Host) -> &'h [u8];
    /// Starts copying `bytes` of `src` into `dst` on the copy stream, after
    /// the compute issued so far. Finished after [`Device::wait_copies`].
    fn offload(&self, src: (&Self::Buf, usize), dst: &mut Self::Host, bytes: usize) -> Result<()>;
    /// Starts copying `bytes` of `src` into `dst` on the copy stream; compute
    /// issued afterwards waits for it.
    fn restore(&self, src: &Self::Host, dst: (&Self::Buf, usize), bytes: usize) -> Result<()>;
    /// Blocks until the copy stream is idle.
    fn wait_copies(&self) -> Result<()>;
    /// Blocks until all issued work has finished.
    fn synchronize(&self) -> Result<()>;
}

/// f32s as their little-endian bytes (what [`Device::upload`] takes).
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i32s as their little-endian bytes.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes back to f32s.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// f32 to bf16 bits, round to nearest even: what the `to_bf16` kernel does.
pub fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 0x40) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// bf16 bits to f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_listed_and_every_listed_kernel_exists() {
        let src = source();
        let found: Vec<&str> = src
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .map(|rest| {
                // `__launch_bounds__(...)` may stand between `void` and the name.
                let rest = match rest.strip_prefix("__launch_bounds__(") {
                    Some(r) => r.split_once(')').map_or(r, |(_, after)| after),
                    None => rest,
                };
                rest.split('(').next().unwrap_or_default().trim()
            })
            .collect();
        let mut want = KERNELS.to_vec();
        want.sort_unstable();
        let mut got = found.clone();
        got.sort_unstable();
        assert_eq!(got, want, "KERNELS must list exactly the sources' entry points");
    }

    #[test]
    fn options_target_the_device_and_carry_the_shape() {
        let o = nvrtc_options((9, 0));
        assert_eq!(o[0], "--gpu-architecture=sm_90");
        assert!(o.contains(&"-DBLOCK=128".to_string()) && o.contains(&"-DCHANNELS=8".to_string()));
        assert!(source().contains("#line 1 \"kernels/cuda/video.cu\""));
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_to_f32(bf16_bits(1.0)), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(bf16_to_f32(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(bf16_to_f32(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert!(bf16_to_f32(bf16_bits(f32::NAN)).is_nan());
        let x = 0.123_456_7f32;
        assert!((bf16_to_f32(bf16_bits(x)) - x).abs() <= x * 2f32.powi(-8));
    }
}
