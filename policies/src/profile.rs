//! Latency profiles: how long prefill and decode take on one engine class.
//!
//! A profile is a small TOML file under `policies/profiles/`, measured on a
//! backend (`engine profile`, later) or taken from published tables. The
//! emulated engine backend replays it; admission reads it as its prior.
//! Curves are piecewise linear between measured points and extrapolate with
//! the last segment's slope, so a profile with a few points covers any size.
//!
//! A prefill batch is not one long prompt: its rows share every weight read
//! and GEMM, but each sequence attends only to its own context. So the
//! prefill curve (measured one prompt at a time) splits into a part linear
//! in the batch's tokens and a per-sequence attention term,
//! `attention_ms_per_1k2` × (context² − cached²) / 10⁶: a batch of sixteen
//! 64-token prompts costs the linear part of 1,024 tokens plus sixteen small
//! attention terms, not one 1,024-token prompt. `engine profile` measures
//! the term from mixed batches and records the mixed steps it timed as
//! `[[checks]]`, which the model must reproduce (`tests::shipped_profiles_
//! reproduce_their_measured_mixed_steps`). Without the key (0) a batch
//! costs the curve at its total tokens, as published tables give it.

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
    /// The prefill curve less its attention term: the part linear in a
    /// batch's tokens (weights, GEMMs, norms).
    prefill: Vec<(f64, f64)>,
    /// Per-sequence attention, milliseconds per (1,000 tokens)².
    attention_ms_per_1k2: f64,
    decode_batch: Vec<(f64, f64)>,
    decode_ms_per_1k_context: f64,
    /// Mixed steps measured on the profiled backend.
    pub checks: Vec<StepCheck>,
}

/// One mixed step a backend was timed at, kept in its profile so the model
/// can be held to it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCheck {
    /// A prefill batch: each member's prompt tokens (nothing cached).
    #[serde(default)]
    pub prefill: Vec<u32>,
    /// A decode step: each member's context tokens.
    #[serde(default)]
    pub decode: Vec<u32>,
    /// The measured time, milliseconds.
    pub ms: f64,
    /// How it was taken, for humans.
    #[serde(default)]
    pub note: String,
}

impl StepCheck {
    /// What `profile` predicts for this step, milliseconds.
    pub fn predicted_ms(&self, profile: &LatencyProfile) -> f64 {
        if self.decode.is_empty() {
            profile.prefill_batch_ms(self.prefill.iter().map(|&n| (n, 0)))
        } else {
            let context = self.decode.iter().fold(0u32, |a, &c| a.saturating_add(c));
            profile.decode_step_ms(self.decode.len() as u32, context)
        }
    }
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
    #[serde(default)]
    checks: Vec<StepCheck>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrefill {
    /// `[prompt_tokens, milliseconds]` pairs, one prompt at a time.
    points: Vec<(f64, f64)>,
    /// Per-sequence attention, milliseconds per (1,000 tokens)².
    #[serde(default)]
    attention_ms_per_1k2: f64,
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
        let q = raw.prefill.attention_ms_per_1k2;
        if !(q.is_finite() && q >= 0.0) {
            return Err(invalid("prefill.attention_ms_per_1k2", "must be a finite number >= 0"));
        }
        let linear: Vec<(f64, f64)> = raw.prefill.points.iter().map(|&(n, ms)| (n, ms - q * sq(n))).collect();
        if linear.iter().any(|&(_, ms)| ms < 0.0) {
            return Err(invalid(
                "prefill.attention_ms_per_1k2",
                "is more than the prefill points take: a prompt's attention cannot exceed its whole prefill",
            ));
        }
        for (i, c) in raw.checks.iter().enumerate() {
            if c.prefill.is_empty() == c.decode.is_empty() || !(c.ms.is_finite() && c.ms >= 0.0) {
                return Err(ProfileError::Invalid {
                    file: file.to_string(),
                    key: "checks",
                    message: format!(
                        "entry {}: needs exactly one of `prefill` or `decode` and a finite `ms` >= 0",
                        i + 1
                    ),
                });
            }
        }
        Ok(Self {
            model: raw.model,
            engine_class: raw.engine_class,
            prefill: linear,
            attention_ms_per_1k2: q,
            decode_batch: raw.decode.batch_points,
            decode_ms_per_1k_context: slope,
            checks: raw.checks,
        })
    }

    /// The same measured curves with another attention term (`None` if it
    /// exceeds what the prefill points take): how `engine profile` fits it.
    pub fn with_attention(&self, ms_per_1k2: f64) -> Option<Self> {
        let q = self.attention_ms_per_1k2;
        let prefill: Vec<(f64, f64)> =
            self.prefill.iter().map(|&(n, ms)| (n, ms + (q - ms_per_1k2) * sq(n))).collect();
        let ok = ms_per_1k2.is_finite() && ms_per_1k2 >= 0.0 && prefill.iter().all(|&(_, ms)| ms >= 0.0);
        ok.then(|| Self { prefill, attention_ms_per_1k2: ms_per_1k2, ..self.clone() })
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
            attention_ms_per_1k2: self.attention_ms_per_1k2 * f,
            decode_batch: times(&self.decode_batch),
            decode_ms_per_1k_context: self.decode_ms_per_1k_context * f,
            checks: Vec::new(),
        }
    }

    /// Time to prefill a prompt of `prompt_tokens` tokens.
    pub fn prefill(&self, prompt_tokens: u32) -> Duration {
        ms(self.prefill_ms(prompt_tokens))
    }

    /// Time to prefill a batch: each member's `(computed, cached)` tokens
    /// (the prompt after its cached prefix, and the prefix). The linear
    /// part is charged on the computed tokens together; each member's
    /// attention on its own rows against its whole context.
    pub fn prefill_batch(&self, members: impl IntoIterator<Item = (u32, u32)>) -> Duration {
        ms(self.prefill_batch_ms(members))
    }

    /// [`Self::prefill_batch`] in milliseconds.
    pub fn prefill_batch_ms(&self, members: impl IntoIterator<Item = (u32, u32)>) -> f64 {
        let (mut tokens, mut attention) = (0.0, 0.0);
        for (computed, cached) in members {
            let (m, c) = (f64::from(computed), f64::from(cached));
            tokens += m;
            attention += sq(m + c) - sq(c);
        }
        clamp_ms(interpolate(&self.prefill, tokens) + self.attention_ms_per_1k2 * attention)
    }

    /// The per-sequence attention term, milliseconds per (1,000 tokens)².
    pub fn attention_ms_per_1k2(&self) -> f64 {
        self.attention_ms_per_1k2
    }

    /// Time of one decode step for a batch of `batch` sequences holding
    /// `context_tokens` tokens of context in total.
    pub fn decode_step(&self, batch: u32, context_tokens: u32) -> Duration {
        ms(self.decode_step_ms(batch, context_tokens))
    }

    /// [`Self::prefill`] in milliseconds (no `Duration` on hot paths).
    pub fn prefill_ms(&self, prompt_tokens: u32) -> f64 {
        self.prefill_batch_ms([(prompt_tokens, 0)])
    }

    /// [`Self::decode_step`] in milliseconds.
    pub fn decode_step_ms(&self, batch: u32, context_tokens: u32) -> f64 {
        let base = interpolate(&self.decode_batch, f64::from(batch.max(1)));
        let ctx = f64::from(context_tokens) / 1000.0 * self.decode_ms_per_1k_context;
        clamp_ms(base + ctx)
    }
}

/// `(tokens / 1,000)²`: the unit of the attention term.
fn sq(tokens: f64) -> f64 {
    (tokens / 1000.0) * (tokens / 1000.0)
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
    fn a_prefill_batch_shares_the_linear_part_and_pays_each_members_attention() {
        // 1 ms + 0.1 ms per token, and 0.5 ms per (1k tokens)² of attention.
        let doc = DOC.replace("[[0, 5.0], [1000, 105.0]]", "[[0, 1.0], [2000, 203.0]]").replace(
            "points = [[0, 1.0], [2000, 203.0]]",
            "points = [[0, 1.0], [2000, 203.0]]\nattention_ms_per_1k2 = 0.5",
        );
        let p = LatencyProfile::parse("t.toml", &doc).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // One prompt: the measured curve itself at its points.
        assert!(close(p.prefill_ms(2000), 203.0), "{}", p.prefill_ms(2000));
        assert!(close(p.prefill_ms(1000), 101.0 + 0.5), "{}", p.prefill_ms(1000));
        // Two 1,000-token prompts: the 2,000-token linear part, two 1k² terms.
        assert!(close(p.prefill_batch_ms([(1000, 0), (1000, 0)]), 201.0 + 1.0));
        assert!(p.prefill_batch_ms([(1000, 0), (1000, 0)]) < p.prefill_ms(2000));
        // A cached prefix costs no linear work, but its new rows attend to it.
        let cached = p.prefill_batch_ms([(1000, 1000)]);
        assert!(close(cached, 101.0 + 0.5 * (4.0 - 1.0)), "{cached}");
        // The same points with another term: a single prompt costs the same.
        let other = p.with_attention(0.25).unwrap();
        assert!(close(other.prefill_ms(2000), 203.0), "{}", other.prefill_ms(2000));
        assert!(close(other.prefill_batch_ms([(1000, 0), (1000, 0)]), 202.0 + 0.5));
        assert!(p.with_attention(60.0).is_none(), "more than the points take");
        // Without the key a batch costs the curve at its total.
        let flat = LatencyProfile::parse("t.toml", DOC).unwrap();
        assert_eq!(flat.prefill_batch_ms([(500, 0), (500, 0)]), flat.prefill_ms(1000));
        assert_eq!(flat.prefill_batch_ms([(500, 500)]), flat.prefill_ms(500));
    }

    #[test]
    fn shipped_profiles_reproduce_their_measured_mixed_steps() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let Ok(p) = LatencyProfile::parse(&path.display().to_string(), &text) else {
                continue; // video and diffusion profiles
            };
            for c in &p.checks {
                let predicted = c.predicted_ms(&p);
                let err = (predicted / c.ms - 1.0).abs();
                assert!(
                    err <= 0.15,
                    "{}: {c:?}: predicted {predicted:.2} ms ({:+.0}%)",
                    path.display(),
                    err * 100.0
                );
                checked += 1;
            }
        }
        assert!(checked >= 8, "the cpu profile records its mixed steps ({checked} checked)");
    }

    #[test]
    fn rejects_an_attention_term_larger_than_the_prefill_and_malformed_checks() {
        let doc = DOC
            .replace("[[0, 5.0], [1000, 105.0]]", "[[0, 5.0], [1000, 105.0]]\nattention_ms_per_1k2 = 200.0");
        let err = LatencyProfile::parse("t.toml", &doc).unwrap_err().to_string();
        assert!(err.contains("prefill.attention_ms_per_1k2"), "{err}");
        let both = format!("{DOC}\n[[checks]]\nprefill = [1]\ndecode = [1]\nms = 1.0\n");
        let err = LatencyProfile::parse("t.toml", &both).unwrap_err().to_string();
        assert!(err.contains("checks") && err.contains("entry 1"), "{err}");
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
