//! A small seeded pseudo-random generator (SplitMix64) shared by everything
//! that must be reproducible from a seed: the cpu backend's weights and
//! sampling, the load generator's arrivals and request sizes, and later the
//! simulator. Not for anything security-related.

/// SplitMix64: one `u64` of state, full period, good enough statistics for
/// workloads and synthetic weights, and identical output on every platform.
/// Deliberately not `Copy`: copying a generator silently repeats its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 24 bits (exact in `f32`).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [0, 1) with 53 bits (exact in `f64`).
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in (0, 1]: safe to take the logarithm of.
    pub fn open_unit_f64(&mut self) -> f64 {
        1.0 - self.unit_f64()
    }

    /// Exponentially distributed with the given rate (mean `1 / rate`).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -self.open_unit_f64().ln() / rate
    }

    /// Standard normal (Box-Muller; one of the pair is discarded, which keeps
    /// the generator stateless beyond its `u64`).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.open_unit_f64(), self.unit_f64());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix;

    #[test]
    fn seeded_streams_repeat_and_moments_are_right() {
        let (mut a, mut b) = (SplitMix(42), SplitMix(42));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut r = SplitMix(7);
        let n = 200_000;
        let exp_mean = (0..n).map(|_| r.exponential(4.0)).sum::<f64>() / n as f64;
        assert!((exp_mean - 0.25).abs() < 0.005, "{exp_mean}");
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "{mean} {var}");
        assert!((0..10_000).all(|_| (0.0..1.0).contains(&r.unit_f64()) && r.open_unit_f64() > 0.0));
    }
}
