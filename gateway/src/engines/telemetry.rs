//! What third-party engines say about their load, read from their
//! Prometheus endpoints (issue 22): the text exposition format parsed
//! within bounds, and each flavour's gauges mapped onto one [`Telemetry`].
//!
//! Metric names, from each project's documentation and source:
//!
//! | flavour | running | waiting | KV in use (0..1) |
//! | --- | --- | --- | --- |
//! | vLLM | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc` (V1), `vllm:gpu_cache_usage_perc` (V0) |
//! | SGLang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//! | TGI | `tgi_batch_current_size` | `tgi_queue_size` | — |
//! | llama.cpp server | `llamacpp:requests_processing` | `llamacpp:requests_deferred` | `llamacpp:kv_cache_usage_ratio` |
//!
//! A gauge with labels (vLLM and SGLang label by model) is summed over its
//! series. What a flavour does not expose stays `None`, and the gateway
//! falls back to its own counts.

/// Longest exposition read (bytes): a scrape past it is cut there.
pub const MAX_EXPOSITION_BYTES: usize = 4 << 20;

/// Which server an external engine is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavour {
    Vllm,
    Sglang,
    Tgi,
    Llamacpp,
    /// Any other OpenAI-compatible server: no metrics are read.
    #[default]
    Generic,
}

/// An external engine's load as its metrics tell it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Telemetry {
    /// Requests being generated.
    pub running: Option<f64>,
    /// Requests queued at the engine, not yet started.
    pub waiting: Option<f64>,
    /// Share of the KV cache in use, 0 to 1.
    pub kv_usage: Option<f64>,
}

impl Flavour {
    /// The gauges this flavour's server exposes, in preference order for
    /// each quantity.
    fn names(self) -> (&'static [&'static str], &'static [&'static str], &'static [&'static str]) {
        match self {
            Flavour::Vllm => (
                &["vllm:num_requests_running"],
                &["vllm:num_requests_waiting"],
                &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            ),
            Flavour::Sglang => {
                (&["sglang:num_running_reqs"], &["sglang:num_queue_reqs"], &["sglang:token_usage"])
            }
            Flavour::Tgi => (&["tgi_batch_current_size"], &["tgi_queue_size"], &[]),
            Flavour::Llamacpp => (
                &["llamacpp:requests_processing"],
                &["llamacpp:requests_deferred"],
                &["llamacpp:kv_cache_usage_ratio"],
            ),
            Flavour::Generic => (&[], &[], &[]),
        }
    }

    /// Whether the server has a metrics endpoint worth scraping.
    pub fn has_metrics(self) -> bool {
        self != Flavour::Generic
    }

    /// Reads this flavour's gauges from a scrape.
    pub fn read(self, exposition: &str) -> Telemetry {
        let (running, waiting, kv) = self.names();
        let first = |names: &[&str]| names.iter().find_map(|n| sum_of(exposition, n));
        Telemetry {
            running: first(running),
            waiting: first(waiting),
            kv_usage: first(kv).map(|v| v.clamp(0.0, 1.0)),
        }
    }
}

/// The sum over the series of gauge `name` (`None` if it has none, or a
/// value that is not a finite non-negative number).
fn sum_of(exposition: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for (metric, value) in samples(exposition) {
        if metric == name {
            if !(value.is_finite() && value >= 0.0) {
                return None;
            }
            *total.get_or_insert(0.0) += value;
        }
    }
    total
}

/// `(name, value)` of each sample line of a Prometheus text exposition
/// (labels and timestamps dropped; comments and malformed lines skipped),
/// within [`MAX_EXPOSITION_BYTES`].
pub fn samples(exposition: &str) -> impl Iterator<Item = (&str, f64)> {
    let mut end = exposition.len().min(MAX_EXPOSITION_BYTES);
    while !exposition.is_char_boundary(end) {
        end -= 1;
    }
    exposition[..end].lines().filter_map(sample)
}

fn sample(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_ascii_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    if rest.starts_with('{') {
        rest = &rest[label_end(rest)?..];
    }
    let value = rest.split_ascii_whitespace().next()?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, value))
}

/// The index just past the `}` closing the label set that `s` starts with
/// (label values may hold `}` inside quotes, and escaped quotes).
fn label_end(s: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
