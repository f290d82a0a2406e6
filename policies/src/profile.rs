//! Latency profiles: how long prefill and decode take on one engine class.
//!
//! A profile is a small TOML file under `policies/profiles/`, measured on a
//! backend (`engine profile`, later) or taken from published tables. The
//! emulated engine backend replays it; admission reads it as its prior.
//! Curves are piecewise linear between measured points and extrapolate with
//! the last segment's slope, so a profile with a few points covers any size.

use std::time::Duration;

use serde::Deserialize;

/// Errors loading a profile, naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: `{key}`: {message}")]
    Invalid { file: String, key: &'static str, message: String },
}

/// A validated latency profile. Construct with [`LatencyProfile::parse`].
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyProfile {
    /// Model the profile was measured for.
    pub model: String,
    /// Engine / GPU class, e.g. `emulated-a100`.
    pub engine_class: String,
    prefill: Vec<(f64, f64)>,
    decode_batch: Vec<(f64, f64)>,
    decode_ms_per_1k_context: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    model: String,
    engine_class: String,
    #[serde(default)]
    #[allow(dead_code)] // free text for humans: where the numbers came from
    source: String,
    prefill: RawPrefill,
    decode: RawDecode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrefill {
    /// `[prompt_tokens, milliseconds]` pairs.
    points: Vec<(f64, f64)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDecode {
    /// `[batch_size, milliseconds per decode step]` pairs at zero context.
    batch_points: Vec<(f64, f64)>,
    /// Extra step time per 1,000 tokens of context summed over the batch
    /// (attention reads every sequence's KV cache).
    #[serde(default)]
    ms_per_1k_context: f64,
}

impl LatencyProfile {
    /// Parses and validates a profile document; `file` is only used in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ProfileError> {
        let raw: RawProfile = toml::from_str(text)
            .map_err(|e| ProfileError::Parse { file: file.to_string(), message: e.to_string() })?;
        let invalid = |key, message: &str| ProfileError::Invalid {
            file: file.to_string(),
            key,
            message: message.to_string(),
        };
        check_curve(&raw.prefill.points).map_err(|m| invalid("prefill.points", m))?;
        check_curve(&raw.decode.batch_points).map_err(|m| invalid("decode.batch_points", m))?;
        let slope = raw.decode.ms_per_1k_context;
        if !(slope.is_finite() && slope >= 0.0) {
            return Err(invalid("decode.ms_per_1k_context", "must be a finite number >= 0"));
        }
        Ok(Self {
            model: raw.model,
            engine_class: raw.engine_class,
            prefill: raw.prefill.points,
            decode_batch: raw.decode.batch_points,
            decode_ms_per_1k_context: slope,
        })
    }

    /// The same curves with every time multiplied by `factor` (a slower or
    /// faster device; the simulator's predictor-error runs).
    pub fn scaled(&self, factor: f64) -> Self {
        let f = if factor.is_finite() && factor > 0.0 { factor } else { 1.0 };
        let times = |pts: &[(f64, f64)]| pts.iter().map(|&(x, ms)| (x, ms * f)).collect();
        Self {
            model: self.model.clone(),
            engine_class: self.engine_class.clone(),
            prefill: times(&self.prefill),
            decode_batch: times(&self.decode_batch),
            decode_ms_per_1k_context: self.decode_ms_per_1k_context * f,
        }
    }

    /// Time to prefill a prompt of `prompt_tokens` tokens.
    pub fn prefill(&self, prompt_tokens: u32) -> Duration {
        ms(self.prefill_ms(prompt_tokens))
    }

    /// Time of one decode step for a batch of `batch` sequences holding
    /// `context_tokens` tokens of context in total.
    pub fn decode_step(&self, batch: u32, context_tokens: u32) -> Duration {
        ms(self.decode_step_ms(batch, context_tokens))
    }

    /// [`Self::prefill`] in milliseconds (no `Duration` on hot paths).
    pub fn prefill_ms(&self, prompt_tokens: u32) -> f64 {
        clamp_ms(interpolate(&self.prefill, f64::from(prompt_tokens)))
    }

    /// [`Self::decode_step`] in milliseconds.
    pub fn decode_step_ms(&self, batch: u32, context_tokens: u32) -> f64 {
        let base = interpolate(&self.decode_batch, f64::from(batch.max(1)));
        let ctx = f64::from(context_tokens) / 1000.0 * self.decode_ms_per_1k_context;
        clamp_ms(base + ctx)
    }
}

/// At most a day, never negative or NaN.
fn clamp_ms(v: f64) -> f64 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(0.0, 86_400_000.0)
    }
}

/// Milliseconds as a `Duration`, at most a day: a profile comes from an
/// engine, and no curve it sends (huge values, extrapolated slopes) may
/// overflow a `Duration` or an `Instant` built from it.
fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(clamp_ms(v) / 1000.0)
}

fn check_curve(points: &[(f64, f64)]) -> Result<(), &'static str> {
    if points.is_empty() {
        return Err("needs at least one [x, milliseconds] point");
    }
    if points.iter().any(|&(x, y)| !x.is_finite() || !y.is_finite() || x < 0.0 || y < 0.0) {
        return Err("points must be finite and non-negative");
    }
    if points.windows(2).any(|w| w[1].0 <= w[0].0) {
        return Err("x values must be strictly increasing");
    }
    Ok(())
}

/// Piecewise-linear interpolation; flat before the first point, last-segment
/// slope after the last one. `points` is validated non-empty and increasing.
fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    let (x0, y0) = points[0];
    if x <= x0 || points.len() == 1 {
        return y0;
    }
    let seg = points.windows(2).find(|w| x <= w[1].0).unwrap_or(&points[points.len() - 2..]);
    let ((xa, ya), (xb, yb)) = (seg[0], seg[1]);
    ya + (yb - ya) * (x - xa) / (xb - xa)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"
        model = "m"
        engine_class = "emulated-test"
        [prefill]
        points = [[0, 5.0], [1000, 105.0]]
        [decode]
        batch_points = [[1, 10.0], [9, 18.0]]
        ms_per_1k_context = 2.0
    "#;

    #[test]
    fn interpolates_and_extrapolates() {
        let p = LatencyProfile::parse("t.toml", DOC).unwrap();
        assert_eq!(p.prefill(0), Duration::from_millis(5));
        assert_eq!(p.prefill(500), Duration::from_millis(55));
        assert_eq!(p.prefill(2000), Duration::from_millis(205));
        assert_eq!(p.decode_step(1, 0), Duration::from_millis(10));
        assert_eq!(p.decode_step(5, 0), Duration::from_millis(14));
        assert_eq!(p.decode_step(1, 1000), Duration::from_millis(12));
        assert_eq!(p.decode_step(0, 0), p.decode_step(1, 0), "batch 0 counts as 1");
        let huge = LatencyProfile::parse(
            "p",
            "model = \"m\"\nengine_class = \"c\"\n[prefill]\npoints = [[0, 0.0], [1e-300, 1e300]]\n[decode]\nbatch_points = [[1, 1e308]]\nms_per_1k_context = 1e308\n",
        )
        .unwrap();
        assert_eq!(huge.prefill(u32::MAX), Duration::from_secs(86_400), "saturates instead of overflowing");
        assert_eq!(huge.decode_step(u32::MAX, u32::MAX), Duration::from_secs(86_400));
    }

    #[test]
    fn rejects_bad_curves_naming_the_key() {
        let bad = DOC.replace("[[1, 10.0], [9, 18.0]]", "[[9, 10.0], [1, 18.0]]");
        let err = LatencyProfile::parse("t.toml", &bad).unwrap_err().to_string();
        assert!(err.contains("t.toml") && err.contains("decode.batch_points"), "{err}");
        let unknown = format!("{DOC}\nbogus = 1\n");
        let err = LatencyProfile::parse("t.toml", &unknown).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
    }
}
