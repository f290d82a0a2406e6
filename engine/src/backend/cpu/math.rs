//! The few dense kernels the synthetic transformer needs, written so that a
//! row's result never depends on which other rows share the call: every
//! output element is one dot product with a fixed summation order. That is
//! what makes a sequence's output bit-identical alone or batched, and after
//! a preemption's recompute.

/// Lanes of the dot product's partial sums; wide enough for the compiler
/// to keep several SIMD accumulators busy.
const LANES: usize = 16;

/// `a · b` with `LANES` partial sums combined in a fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let (ca, ra) = a.split_at(a.len() - a.len() % LANES);
    let (cb, rb) = b.split_at(ca.len());
    for (x, y) in ca.chunks_exact(LANES).zip(cb.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[i] += x * y;
    }
    // Pairwise, fixed order.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// Output columns per packed weight panel (two AVX registers of f32).
const NR: usize = 16;
/// Rows of `x` per micro-kernel call: each weight load feeds this many
/// fused multiply-adds.
const MR: usize = 4;

/// A weight matrix of `n` output features × `k` inputs, packed for the
/// kernel: panels of [`NR`] output features stored input-major, so the
/// kernel streams each panel once per block of rows with unit stride.
#[derive(Clone)]
pub struct Packed {
    n: usize,
    k: usize,
    panels: Vec<f32>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({}x{})", self.n, self.k)
    }
}

impl Packed {
    /// Packs row-major `w` (`n` rows of `k`); the last panel is zero-padded.
    pub fn new(w: &[f32], k: usize) -> Self {
        let n = w.len() / k;
        let panels_n = n.div_ceil(NR);
        let mut panels = vec![0.0; panels_n * NR * k];
        for (j, row) in w.chunks_exact(k).enumerate() {
            let (p, c) = (j / NR, j % NR);
            for (kk, v) in row.iter().enumerate() {
                panels[(p * k + kk) * NR + c] = *v;
            }
        }
        Self { n, k, panels }
    }

    pub fn rows(&self) -> usize {
        self.n
    }
}

/// `out[r][j] = x[r] · w[j]` for `x`: rows × k; `out`: rows × n.
///
/// Every output element is one multiply-add chain over `k` in order, so a
/// row's result is the same whatever rows share the call. Weights stream
/// from memory once per call however many rows there are, which is where
/// batching wins: a decode step of 8 sequences reads the weights once, not
/// 8 times. On x86-64 with AVX2 and FMA (detected at run time) the same
/// kernel is compiled for those units and uses fused multiply-adds; results
/// then differ from the portable path in the last bits, never between rows.
pub fn matmul(x: &[f32], w: &Packed, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the function only requires the AVX2 and FMA instruction
        // sets, and both were detected on this CPU on the line above.
        unsafe { matmul_avx2_fma(x, w, out) };
        return;
    }
    matmul_kernel::<false>(x, w, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn matmul_avx2_fma(x: &[f32], w: &Packed, out: &mut [f32]) {
    matmul_kernel::<true>(x, w, out);
}

#[inline(always)]
fn matmul_kernel<const FMA: bool>(x: &[f32], w: &Packed, out: &mut [f32]) {
    let (k, n) = (w.k, w.n);
    let rows = x.len() / k;
    debug_assert_eq!(out.len(), rows * n);
    for (p, panel) in w.panels.chunks_exact(k * NR).enumerate() {
        let cols = (n - p * NR).min(NR);
        let mut r = 0;
        while r < rows {
            let take = (rows - r).min(MR);
            let xs = &x[r * k..(r + take) * k];
            let mut res = [[0f32; NR]; MR];
            match take {
                4 => res = micro::<4, FMA>(xs, k, panel),
                3 => res[..3].copy_from_slice(&micro::<3, FMA>(xs, k, panel)),
                2 => res[..2].copy_from_slice(&micro::<2, FMA>(xs, k, panel)),
                _ => res[..1].copy_from_slice(&micro::<1, FMA>(xs, k, panel)),
            }
            for (i, row) in res[..take].iter().enumerate() {
                out[(r + i) * n + p * NR..(r + i) * n + p * NR + cols].copy_from_slice(&row[..cols]);
            }
            r += take;
        }
    }
}

/// `R` rows × [`NR`] columns: per input index, one weight vector load and
/// `R` broadcasts feed `R × NR` multiply-adds.
#[inline(always)]
fn micro<const R: usize, const FMA: bool>(xs: &[f32], k: usize, panel: &[f32]) -> [[f32; NR]; R] {
    let mut acc = [[0f32; NR]; R];
    let rows: [&[f32]; R] = std::array::from_fn(|r| &xs[r * k..(r + 1) * k]);
    for (kk, wv) in panel.chunks_exact(NR).enumerate() {
        let wv: &[f32; NR] = wv.try_into().expect("panels are NR wide");
        for r in 0..R {
            let xv = rows[r][kk];
            for c in 0..NR {
                acc[r][c] = if FMA { xv.mul_add(wv[c], acc[r][c]) } else { acc[r][c] + xv * wv[c] };
            }
        }
    }
    acc
}

/// Root-mean-square normalisation with a learned gain, row by row.
pub fn rmsnorm(x: &[f32], gain: &[f32], out: &mut [f32]) {
    let h = gain.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = dot(xr, xr) / h as f32;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(gain) {
            *o = v * inv * g;
        }
    }
}

/// Rotary position embedding on one head's vector: dimension pair `i` is
/// rotated by the angle whose (cos, sin) is `rot[2i], rot[2i + 1]`.
pub fn rope(v: &mut [f32], rot: &[f32]) {
    for (pair, cs) in v.chunks_exact_mut(2).zip(rot.chunks_exact(2)) {
        let (a, b, c, s) = (pair[0], pair[1], cs[0], cs[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

/// In-place softmax.
pub fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for x in v.iter_mut() {
        *x /= sum;
    }
}

/// SiLU(gate) · up, the SwiGLU activation.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// splitmix64: seeds weights and samplers without a dependency.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_sum_and_matmul_rows_are_independent() {
        let mut rng = SplitMix(7);
        let a: Vec<f32> = (0..37).map(|_| rng.unit() - 0.5).collect();
        let b: Vec<f32> = (0..37).map(|_| rng.unit() - 0.5).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-5);

        let (k, n) = (40, 21);
        let w: Vec<f32> = (0..k * n).map(|_| rng.unit() - 0.5).collect();
        let x: Vec<f32> = (0..k * 70).map(|_| rng.unit() - 0.5).collect();
        let packed = Packed::new(&w, k);
        let mut all = vec![0.0; 70 * n];
        matmul(&x, &packed, &mut all);
        for r in [0, 3, 4, 31, 69] {
            let mut one = vec![0.0; n];
            matmul(&x[r * k..(r + 1) * k], &packed, &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r} depends on its neighbours");
            for j in 0..n {
                let want = dot(&x[r * k..(r + 1) * k], &w[j * k..(j + 1) * k]);
                assert!((one[j] - want).abs() < 1e-4, "row {r} col {j}: {} vs {want}", one[j]);
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_rope_keeps_length() {
        let mut v = vec![1.0, 2.0, 3.0, -50.0];
        softmax(&mut v);
        assert!((v.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(v[2] > v[1] && v[1] > v[0]);
        let mut r = vec![0.3, -0.4, 1.0, 2.0];
        let before = dot(&r, &r);
        let (sin, cos) = 0.7f32.sin_cos();
        rope(&mut r, &[cos, sin, 1.0, 0.0]);
        assert!((dot(&r, &r) - before).abs() < 1e-5);
    }
}
