//! Percentiles over recorded samples.

/// Nearest-rank percentile (`q` in 0..=100) of `samples`; `None` if empty.
pub fn percentile(samples: &[f64], q: f64) -> Option<f64> {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    sorted_percentile(&v, q)
}

/// [`percentile`] of samples already sorted ascending.
pub fn sorted_percentile(v: &[f64], q: f64) -> Option<f64> {
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    (!v.is_empty()).then(|| v[rank.clamp(1, v.len()) - 1])
}

/// The median of the finite values of `v` (mean of the middle two for an
/// even count); NaN when there are none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Count, p50, p90, p95, p99 and max of a sample set, for reports.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for an empty set.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Self::of_sorted(&v)
    }

    /// Like [`Summary::of`] for samples already sorted ascending.
    pub fn of_sorted(v: &[f64]) -> Option<Self> {
        let at = |q| sorted_percentile(v, q);
        Some(Self {
            count: v.len(),
            p50: at(50.0)?,
            p90: at(90.0)?,
            p95: at(95.0)?,
            p99: at(99.0)?,
            max: at(100.0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 0.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
