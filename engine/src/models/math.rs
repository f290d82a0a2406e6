//! The few dense kernels the synthetic transformer needs, written so that a
//! row's result never depends on which other rows share the call: every
//! output element is one dot product with a fixed summation order. That is
//! what makes a sequence's output bit-identical alone or batched, and after
//! a preemption's recompute.

use std::ops::Range;
use std::sync::{mpsc, Arc};

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
///
/// With a [`Pool`], large products split their panels (output columns)
/// across its workers; each element is still computed the same way.
pub fn matmul(x: &[f32], w: &Arc<Packed>, out: &mut [f32], pool: &Pool) {
    let (k, n) = (w.k, w.n);
    let rows = x.len() / k;
    debug_assert_eq!(out.len(), rows * n);
    let panels = n.div_ceil(NR);
    // Below a few rows the product is bound by reading the weights, which
    // more threads do not speed up; small products are not worth a hand-off.
    let threads = if rows >= 4 && rows * n * k >= 1 << 20 { (pool.workers.len() + 1).min(panels) } else { 1 };
    if threads == 1 {
        panel_range(x, w, 0..panels, out);
        return;
    }
    let per = panels.div_ceil(threads);
    let ranges: Vec<Range<usize>> =
        (0..threads).map(|t| t * per..((t + 1) * per).min(panels)).filter(|r| !r.is_empty()).collect();
    let shared: Arc<[f32]> = Arc::from(x);
    let (reply, results) = mpsc::channel();
    for (i, (r, worker)) in ranges[1..].iter().zip(&pool.workers).enumerate() {
        let job = Job {
            x: Arc::clone(&shared),
            w: Arc::clone(w),
            panels: r.clone(),
            part: i + 1,
            reply: reply.clone(),
        };
        if let Err(mpsc::SendError(job)) = worker.send(job) {
            // A worker that is gone: do its share here.
            job.run();
        }
    }
    drop(reply);
    let mut first = vec![0.0; rows * cols_of(n, &ranges[0])];
    panel_range(x, w, ranges[0].clone(), &mut first);
    place(&first, n, &ranges[0], out);
    for (part, data) in results {
        place(&data, n, &ranges[part], out);
    }
}

fn place(part: &[f32], n: usize, panels: &Range<usize>, out: &mut [f32]) {
    let (c0, cols) = (panels.start * NR, cols_of(n, panels));
    for (row, src) in part.chunks_exact(cols).enumerate() {
        out[row * n + c0..row * n + c0 + cols].copy_from_slice(src);
    }
}

/// One share of a product handed to a worker.
struct Job {
    x: Arc<[f32]>,
    w: Arc<Packed>,
    panels: Range<usize>,
    part: usize,
    reply: mpsc::Sender<(usize, Vec<f32>)>,
}

impl Job {
    fn run(self) {
        let rows = self.x.len() / self.w.k;
        let mut data = vec![0.0; rows * cols_of(self.w.n, &self.panels)];
        panel_range(&self.x, &self.w, self.panels.clone(), &mut data);
        let _ = self.reply.send((self.part, data));
    }
}

/// Worker threads for large products: `threads - 1` of them (the caller is
/// the last). They exit when the pool is dropped.
#[derive(Debug)]
pub struct Pool {
    workers: Vec<mpsc::Sender<Job>>,
}

impl Pool {
    pub fn new(threads: usize) -> Self {
        let workers = (1..threads.max(1))
            .filter_map(|i| {
                let (tx, rx) = mpsc::channel::<Job>();
                std::thread::Builder::new()
                    .name(format!("cpu-gemm-{i}"))
                    .spawn(move || rx.into_iter().for_each(Job::run))
                    .ok()
                    .map(|_| tx)
            })
            .collect();
        Self { workers }
    }
}

/// Output columns covered by a range of panels.
fn cols_of(n: usize, panels: &Range<usize>) -> usize {
    (panels.end * NR).min(n) - panels.start * NR
}

/// Panels `panels` of `x · wᵀ` into `out` (rows × their columns).
fn panel_range(x: &[f32], w: &Packed, panels: Range<usize>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the function only requires the AVX2 and FMA instruction
        // sets, and both were detected on this CPU on the line above.
        unsafe { kernel_avx2_fma(x, w, panels, out) };
        return;
    }
    kernel::<false>(x, w, panels, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2_fma(x: &[f32], w: &Packed, panels: Range<usize>, out: &mut [f32]) {
    kernel::<true>(x, w, panels, out);
}

#[inline(always)]
fn kernel<const FMA: bool>(x: &[f32], w: &Packed, panels: Range<usize>, out: &mut [f32]) {
    let k = w.k;
    let rows = x.len() / k;
    let stride = cols_of(w.n, &panels);
    let c0 = panels.start * NR;
    for p in panels {
        let panel = &w.panels[p * k * NR..(p + 1) * k * NR];
        let cols = (w.n - p * NR).min(NR);
        let at = p * NR - c0;
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
                out[(r + i) * stride + at..(r + i) * stride + at + cols].copy_from_slice(&row[..cols]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use policies::rng::SplitMix;

    #[test]
    fn dot_matches_naive_sum_and_matmul_rows_are_independent() {
        let mut rng = SplitMix(7);
        let a: Vec<f32> = (0..37).map(|_| rng.unit() - 0.5).collect();
        let b: Vec<f32> = (0..37).map(|_| rng.unit() - 0.5).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-5);

        let (k, n) = (72, 245); // big enough to be split across threads, odd sizes
        let w: Vec<f32> = (0..k * n).map(|_| rng.unit() - 0.5).collect();
        let x: Vec<f32> = (0..k * 70).map(|_| rng.unit() - 0.5).collect();
        let packed = Arc::new(Packed::new(&w, k));
        let (one_thread, three) = (Pool::new(1), Pool::new(3));
        let mut all = vec![0.0; 70 * n];
        matmul(&x, &packed, &mut all, &one_thread);
        let mut threaded = vec![0.0; 70 * n];
        matmul(&x, &packed, &mut threaded, &three);
        assert_eq!(all, threaded, "threads split columns, never change a result");
        for r in [0, 3, 4, 31, 69] {
            let mut one = vec![0.0; n];
            matmul(&x[r * k..(r + 1) * k], &packed, &mut one, &three);
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
