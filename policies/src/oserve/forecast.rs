//! Per-type arrival forecasts for the next planning interval (OServe §5.1):
//! an LSTM over the last 50 intervals, as in the paper, and two baselines,
//! the moving average and additive Holt-Winters. RRMSE (root mean squared
//! error over the mean) scores them.
//!
//! The LSTM is written here rather than taken from a crate: one layer of
//! 16 cells over a scalar series is ~150 lines with its gradients, trains
//! in seconds on a CPU, and keeps the policies crate free of a tensor
//! library (the control plane only runs inference on 50 numbers). Each
//! window is scaled by its own mean (the network learns shapes, not
//! levels); the network predicts every next value of a window (sequence to
//! sequence), trained by backpropagation through time with Adam,
//! deterministically from a seed.

use crate::rng::SplitMix;

/// Root mean squared error of `pred` against `actual`, over the mean of
/// `actual`.
pub fn rrmse(pred: &[f64], actual: &[f64]) -> f64 {
    let n = pred.len().min(actual.len());
    if n == 0 {
        return f64::NAN;
    }
    let mse = (0..n).map(|i| (pred[i] - actual[i]).powi(2)).sum::<f64>() / n as f64;
    mse.sqrt() / (actual[..n].iter().sum::<f64>() / n as f64)
}

/// The mean of the last `window` values.
pub fn moving_average(history: &[f64], window: usize) -> f64 {
    let w = window.clamp(1, history.len().max(1));
    let tail = &history[history.len().saturating_sub(w)..];
    if tail.is_empty() {
        0.0
    } else {
        tail.iter().sum::<f64>() / tail.len() as f64
    }
}

/// Additive Holt-Winters: level, trend and a season of `season` intervals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoltWinters {
    pub alpha: f64,
    pub beta: f64,
    pub gamma: f64,
    pub season: usize,
}

impl HoltWinters {
    /// One-step-ahead forecasts of `series[1..]` (each from what precedes
    /// it); the first season initialises the state.
    pub fn one_step(&self, series: &[f64]) -> Vec<f64> {
        let m = self.season.max(1);
        if series.len() <= m {
            return series.iter().skip(1).map(|_| series[0]).collect();
        }
        let mean = series[..m].iter().sum::<f64>() / m as f64;
        let (mut level, mut trend) = (mean, 0.0);
        let mut seasonal: Vec<f64> = series[..m].iter().map(|v| v - mean).collect();
        let mut out: Vec<f64> = series[1..m].to_vec();
        for t in m..series.len() {
            out.push((level + trend + seasonal[t % m]).max(0.0));
            let y = series[t];
            let prev = level;
            level = self.alpha * (y - seasonal[t % m]) + (1.0 - self.alpha) * (level + trend);
            trend = self.beta * (level - prev) + (1.0 - self.beta) * trend;
            seasonal[t % m] = self.gamma * (y - level) + (1.0 - self.gamma) * seasonal[t % m];
        }
        out
    }

    /// The parameters (on a 0.1 grid) with the least one-step error on
    /// `series`.
    pub fn fit(series: &[f64], season: usize) -> HoltWinters {
        let grid: Vec<f64> = (1..10).map(|i| f64::from(i) / 10.0).collect();
        let mut best = (f64::INFINITY, HoltWinters { alpha: 0.5, beta: 0.1, gamma: 0.1, season });
        for &alpha in &grid {
            for &beta in &grid[..3] {
                for &gamma in &grid[..5] {
                    let hw = HoltWinters { alpha, beta, gamma, season };
                    let e = rrmse(&hw.one_step(series), &series[1..]);
                    if e < best.0 {
                        best = (e, hw);
                    }
                }
            }
        }
        best.1
    }
}

/// Cells of the LSTM.
pub const HIDDEN: usize = 16;
/// Intervals of history the LSTM reads (the paper's 50 minutes).
pub const WINDOW: usize = 50;

/// A one-layer LSTM over a scalar series, with a linear read-out.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lstm {
    /// Gate weights, 4·HIDDEN rows (input, forget, cell, output) of
    /// 1 + HIDDEN columns ([x; h]), and biases.
    w: Vec<f64>,
    b: Vec<f64>,
    /// Read-out.
    v: Vec<f64>,
    bv: f64,
}

const COLS: usize = 1 + HIDDEN;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// What one step keeps for the backward pass.
struct Step {
    x: f64,
    h_prev: Vec<f64>,
    c_prev: Vec<f64>,
    gates: Vec<f64>,
    tanh_c: Vec<f64>,
    h: Vec<f64>,
}

/// Gradients, shaped like the parameters.
struct Grads {
    w: Vec<f64>,
    b: Vec<f64>,
    v: Vec<f64>,
    bv: f64,
}

impl Lstm {
    pub fn new(seed: u64) -> Lstm {
        let mut rng = SplitMix(seed);
        let k = 1.0 / (HIDDEN as f64).sqrt();
        let w: Vec<f64> = (0..4 * HIDDEN * COLS).map(|_| (rng.unit_f64() * 2.0 - 1.0) * k).collect();
        let mut b = vec![0.0; 4 * HIDDEN];
        b[HIDDEN..2 * HIDDEN].iter_mut().for_each(|x| *x = 1.0); // forget gate open
        let v = (0..HIDDEN).map(|_| (rng.unit_f64() * 2.0 - 1.0) * k).collect();
        Lstm { w, b, v, bv: 0.0 }
    }

    fn forward(&self, xs: &[f64]) -> (Vec<Step>, Vec<f64>) {
        let (mut h, mut c) = (vec![0.0; HIDDEN], vec![0.0; HIDDEN]);
        let (mut steps, mut ys) = (Vec::with_capacity(xs.len()), Vec::with_capacity(xs.len()));
        for &x in xs {
            let mut gates = vec![0.0; 4 * HIDDEN];
            for (r, g) in gates.iter_mut().enumerate() {
                let row = &self.w[r * COLS..(r + 1) * COLS];
                *g = self.b[r] + row[0] * x + row[1..].iter().zip(&h).map(|(a, b)| a * b).sum::<f64>();
            }
            for (r, g) in gates.iter_mut().enumerate() {
                *g = if (2 * HIDDEN..3 * HIDDEN).contains(&r) { g.tanh() } else { sigmoid(*g) };
            }
            let c_new: Vec<f64> =
                (0..HIDDEN).map(|u| gates[HIDDEN + u] * c[u] + gates[u] * gates[2 * HIDDEN + u]).collect();
            let tanh_c: Vec<f64> = c_new.iter().map(|v| v.tanh()).collect();
            let h_new: Vec<f64> = (0..HIDDEN).map(|u| gates[3 * HIDDEN + u] * tanh_c[u]).collect();
            ys.push(self.bv + self.v.iter().zip(&h_new).map(|(a, b)| a * b).sum::<f64>());
            steps.push(Step { x, h_prev: h, c_prev: c, gates, tanh_c, h: h_new.clone() });
            (h, c) = (h_new, c_new);
        }
        (steps, ys)
    }

    /// Mean squared error of predicting `xs[t + 1]` from `xs[..=t]`, and
    /// its gradients (backpropagation through time).
    fn loss_and_grads(&self, xs: &[f64]) -> (f64, Grads) {
        let n = xs.len() - 1;
        let (steps, ys) = self.forward(&xs[..n]);
        let mut g =
            Grads { w: vec![0.0; self.w.len()], b: vec![0.0; self.b.len()], v: vec![0.0; HIDDEN], bv: 0.0 };
        let mut loss = 0.0;
        let (mut dh_next, mut dc_next) = (vec![0.0; HIDDEN], vec![0.0; HIDDEN]);
        for t in (0..n).rev() {
            let s = &steps[t];
            let err = ys[t] - xs[t + 1];
            loss += err * err / n as f64;
            let dy = 2.0 * err / n as f64;
            g.bv += dy;
            let mut dz = vec![0.0; 4 * HIDDEN];
            for u in 0..HIDDEN {
                g.v[u] += dy * s.h[u];
                let dh = dy * self.v[u] + dh_next[u];
                let (i, f, gg, o) =
                    (s.gates[u], s.gates[HIDDEN + u], s.gates[2 * HIDDEN + u], s.gates[3 * HIDDEN + u]);
                let dc = dh * o * (1.0 - s.tanh_c[u] * s.tanh_c[u]) + dc_next[u];
                dz[u] = dc * gg * i * (1.0 - i);
                dz[HIDDEN + u] = dc * s.c_prev[u] * f * (1.0 - f);
                dz[2 * HIDDEN + u] = dc * i * (1.0 - gg * gg);
                dz[3 * HIDDEN + u] = dh * s.tanh_c[u] * o * (1.0 - o);
                dc_next[u] = dc * f;
            }
            dh_next.iter_mut().for_each(|v| *v = 0.0);
            for (r, &d) in dz.iter().enumerate() {
                g.b[r] += d;
                let row = &self.w[r * COLS..(r + 1) * COLS];
                let gw = &mut g.w[r * COLS..(r + 1) * COLS];
                gw[0] += d * s.x;
                for u in 0..HIDDEN {
                    gw[1 + u] += d * s.h_prev[u];
                    dh_next[u] += d * row[1 + u];
                }
            }
        }
        (loss, g)
    }

    /// Trains on `series` (raw counts): windows of `WINDOW + 1` values,
    /// each divided by the mean of its first `WINDOW` (so the network
    /// learns shapes, not levels, and a level it never saw in training is
    /// no different), `epochs` passes with Adam.
    pub fn train(series: &[f64], epochs: usize, seed: u64) -> Lstm {
        let mut m = Lstm::new(seed);
        if series.len() < 3 {
            return m;
        }
        let len = (WINDOW + 1).min(series.len());
        let windows: Vec<Vec<f64>> = (0..=series.len() - len)
            .step_by(5)
            .map(|s| {
                let w = &series[s..s + len];
                let scale = local_scale(&w[..len - 1]);
                w.iter().map(|v| v / scale).collect()
            })
            .collect();
        let mut adam = Adam::new(m.w.len() + m.b.len() + HIDDEN + 1);
        for _ in 0..epochs {
            for w in &windows {
                let (_, g) = m.loss_and_grads(w);
                let mut flat: Vec<f64> = g.w;
                flat.extend(g.b);
                flat.extend(g.v);
                flat.push(g.bv);
                adam.step(&mut m, &flat);
            }
        }
        m
    }

    /// The parameters have this build's shape and are finite (a model file
    /// read back is checked before use).
    pub fn is_well_formed(&self) -> bool {
        self.w.len() == 4 * HIDDEN * COLS
            && self.b.len() == 4 * HIDDEN
            && self.v.len() == HIDDEN
            && self.w.iter().chain(&self.b).chain(&self.v).chain([&self.bv]).all(|x| x.is_finite())
    }

    /// The next value after `history` (raw counts; the last `WINDOW` read,
    /// scaled by their mean).
    pub fn forecast(&self, history: &[f64]) -> f64 {
        let tail = &history[history.len().saturating_sub(WINDOW)..];
        if tail.is_empty() {
            return 0.0;
        }
        let scale = local_scale(tail);
        let xs: Vec<f64> = tail.iter().map(|v| v / scale).collect();
        let (_, ys) = self.forward(&xs);
        (ys.last().copied().unwrap_or(0.0) * scale).max(0.0)
    }
}

/// A model file of `loadtest oserve-train`: one LSTM per `[oserve]` type,
/// in the types' order, trained on series of `interval_s`-second counts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LstmModels {
    pub interval_s: f64,
    pub types: Vec<String>,
    pub models: Vec<Lstm>,
}

impl LstmModels {
    /// A model file read back is usable: one well-formed model per type,
    /// and the types are `names` (the policy's, in order).
    pub fn check(&self, names: &[&str]) -> Result<(), String> {
        if self.models.len() != self.types.len() || self.models.iter().any(|l| !l.is_well_formed()) {
            return Err("one well-formed model per type expected".into());
        }
        if self.types.iter().map(String::as_str).ne(names.iter().copied()) {
            return Err(format!("trained for types {:?}, the policy has {names:?}", self.types));
        }
        Ok(())
    }
}

/// The mean of a window, kept away from zero.
fn local_scale(w: &[f64]) -> f64 {
    (w.iter().sum::<f64>() / w.len().max(1) as f64).max(1e-9)
}

/// Adam over the model's parameters in order (w, b, v, bv).
struct Adam {
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl Adam {
    fn new(n: usize) -> Adam {
        Adam { m: vec![0.0; n], v: vec![0.0; n], t: 0 }
    }

    fn step(&mut self, model: &mut Lstm, grad: &[f64]) {
        let (lr, b1, b2, eps): (f64, f64, f64, f64) = (0.01, 0.9, 0.999, 1e-8);
        self.t += 1;
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        let params =
            model.w.iter_mut().chain(model.b.iter_mut()).chain(model.v.iter_mut()).chain([&mut model.bv]);
        for (((p, g), m), v) in params.zip(grad).zip(self.m.iter_mut()).zip(self.v.iter_mut()) {
            let g = g.clamp(-5.0, 5.0);
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
        }
    }
}

#[cfg(test)]
pub(crate) fn gradient_check(seed: u64) -> f64 {
    // Largest relative difference between the analytic and numerical
    // gradients of a few weights on a short random series.
    let mut rng = SplitMix(seed);
    let m = Lstm::new(seed);
    let xs: Vec<f64> = (0..8).map(|_| rng.unit_f64() * 2.0).collect();
    let (_, g) = m.loss_and_grads(&xs);
    // The central difference of the loss in one parameter, against `analytic`.
    let check = |param: &dyn Fn(&mut Lstm) -> &mut f64, analytic: f64| {
        let h = 1e-6;
        let (mut a, mut b) = (m.clone(), m.clone());
        *param(&mut a) += h;
        *param(&mut b) -= h;
        let num = (a.loss_and_grads(&xs).0 - b.loss_and_grads(&xs).0) / (2.0 * h);
        (num - analytic).abs() / (num.abs() + analytic.abs()).max(1e-8)
    };
    let mut worst: f64 = 0.0;
    for idx in [0usize, 5, COLS + 3, 2 * HIDDEN * COLS + 7, 3 * HIDDEN * COLS + 1, 4 * HIDDEN * COLS - 1] {
        worst = worst.max(check(&|l: &mut Lstm| &mut l.w[idx], g.w[idx]));
    }
    for idx in [0usize, HIDDEN + 2, 3 * HIDDEN + 5] {
        worst = worst.max(check(&|l: &mut Lstm| &mut l.b[idx], g.b[idx]));
    }
    worst
}
