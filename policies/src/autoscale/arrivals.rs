//! Arrival statistics read from a cumulative counter: arrivals per time bin
//! over a sliding window, their volatility, and the observed burst factor.

use std::collections::VecDeque;

/// Arrivals per fixed-width time bin over a sliding window of bins, read
/// from a cumulative counter: the input of every volatility metric
/// (TurboServe Appendix A). Bins with no observation in them count zero.
#[derive(Debug, Clone, Default)]
pub struct ArrivalBins {
    /// (bin index, arrivals in it), oldest first; the newest is filling.
    bins: VecDeque<(i64, u64)>,
    last: Option<u64>,
}

impl ArrivalBins {
    /// Records the counter's value `total` at `now` (seconds): what it grew
    /// by since the last call lands in `now`'s bin of `bin_s`; at most
    /// `window` complete bins are kept.
    pub fn observe(&mut self, now: f64, total: u64, bin_s: f64, window: usize) {
        let bin = (now / bin_s).floor() as i64;
        let new = total.saturating_sub(self.last.unwrap_or(total));
        self.last = Some(total);
        match self.bins.back_mut() {
            Some((b, n)) if *b >= bin => *n += new,
            _ => {
                let from = self.bins.back().map_or(bin, |(b, _)| b + 1);
                for empty in from.max(bin - window as i64)..bin {
                    self.bins.push_back((empty, 0));
                }
                self.bins.push_back((bin, new));
            }
        }
        while self.bins.len() > window + 1 {
            self.bins.pop_front();
        }
    }

    /// The complete bins' counts (the newest bin is still filling), newest
    /// first.
    pub fn complete(&self) -> Vec<f64> {
        self.bins.iter().rev().skip(1).map(|(_, n)| *n as f64).collect()
    }

    /// Mean and standard deviation of the complete bins; `None` with fewer
    /// than two.
    pub fn mean_std(&self) -> Option<(f64, f64)> {
        mean_std(&self.complete())
    }

    /// Coefficient of variation (std / mean); 0 without arrivals.
    pub fn cv(&self) -> f64 {
        match self.mean_std() {
            Some((mean, std)) if mean > 0.0 => std / mean,
            _ => 0.0,
        }
    }

    /// Standard deviation of arrivals per bin in units of Poisson noise,
    /// std / √mean: 1 for Poisson arrivals at any rate, above 1 for bursts
    /// (TurboServe's σ(t) made independent of the fleet's size, so one
    /// table serves 8 engines and 256); 0 without arrivals.
    pub fn dispersion(&self) -> f64 {
        VolatilityMeasure::Dispersion.of(&self.complete())
    }
}

/// How the video scaler measures the volatility of activations per bin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VolatilityMeasure {
    /// std / √mean ([`ArrivalBins::dispersion`]): 1 for Poisson arrivals
    /// at any rate, so one table serves any fleet size (the product).
    #[default]
    Dispersion,
    /// The plain standard deviation of activations per bin (TurboServe's
    /// σ): grows as √rate for the same burstiness, so its table holds only
    /// at the fleet size it was profiled at.
    Std,
}

impl VolatilityMeasure {
    /// The measure of per-bin counts `counts` (0 for fewer than two bins or
    /// no activations).
    pub fn of(self, counts: &[f64]) -> f64 {
        match (self, mean_std(counts)) {
            (Self::Dispersion, Some((mean, std))) if mean > 0.0 => std / mean.sqrt(),
            (Self::Std, Some((mean, std))) if mean > 0.0 => std,
            _ => 0.0,
        }
    }
}

/// Mean and (population) standard deviation of `v`; `None` with fewer
/// than two values.
fn mean_std(v: &[f64]) -> Option<(f64, f64)> {
    if v.len() < 2 {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    Some((mean, var.sqrt()))
}

/// Arrivals per second over a trailing horizon, for the observed burst
/// factor of the warm pool (Vennamaneni §4.4's λ_burst from what arrived,
/// not from a configured multiple).
#[derive(Debug, Clone, Default)]
pub struct BurstHistory {
    bins: ArrivalBins,
}

/// Standard deviations of Poisson noise taken off a window's peak and
/// added to its base before they are compared.
const BURST_NOISE_Z: f64 = 3.0;

impl BurstHistory {
    /// Records the arrivals counter's value `total` at `now` (seconds).
    pub fn observe(&mut self, now: f64, total: u64, horizon_s: f64) {
        self.bins.observe(now, total, 1.0, horizon_s.max(2.0) as usize);
    }

    /// The largest rise of arrivals from one `t_cold`-long window to the
    /// next within the horizon, each window's Poisson noise discounted
    /// (peak − z√peak over base + z√base), at least 1; `None` until the
    /// horizon holds two windows.
    pub fn factor(&self, t_cold: f64) -> Option<f64> {
        let w = (t_cold.round() as usize).max(1);
        let mut bins = self.bins.complete(); // newest first
        if bins.len() < 2 * w {
            return None;
        }
        bins.reverse();
        let mut prefix = Vec::with_capacity(bins.len() + 1);
        prefix.push(0.0);
        for b in &bins {
            prefix.push(prefix.last().copied().unwrap_or(0.0) + b);
        }
        let sum = |from: usize| prefix[from + w] - prefix[from];
        let z = BURST_NOISE_Z;
        let rise = (0..=bins.len() - 2 * w)
            .map(|i| {
                let (base, peak) = (sum(i), sum(i + w));
                let (lo, hi) = (peak - z * peak.sqrt(), base + z * base.sqrt());
                if hi > 0.0 {
                    lo / hi
                } else {
                    1.0
                }
            })
            .fold(1.0, f64::max);
        Some(rise)
    }
}
