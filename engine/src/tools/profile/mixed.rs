//! The mixed steps `engine profile` times beside its single-prompt curves
//! (long prompts beside short ones, decode over mixed contexts, decode
//! right after a long prefill), and the attention term fitted to them.

use super::{median, step, Probe, ProfileArgs, ProfileError};
use crate::backend::Backend;
use policies::profile::StepCheck;

/// Makes a sequence of a prompt length with room for some decode steps.
pub(super) type NewProbe<'a, B> =
    dyn Fn(&mut B, u32, u32) -> Result<Probe<<B as Backend>::Seq>, ProfileError> + 'a;

/// Decode steps averaged per timed run: single steps of a few milliseconds
/// are noisy on a shared host.
pub(super) const DECODE_STEPS: u32 = 8;

/// How many mixed steps [`measure`] times.
pub(super) const MIXED_STEPS: usize = 8;

/// Times the steps a serving engine meets and the single-prompt curve does
/// not show: prefill batches mixing long and short prompts, decode steps
/// over mixed contexts, and a decode step right after a long prefill.
pub(super) fn measure<B: Backend>(
    backend: &mut B,
    args: &ProfileArgs,
    repeats: usize,
    new_probe: &NewProbe<'_, B>,
    report: &mut dyn FnMut(String, f64),
) -> Result<Vec<StepCheck>, ProfileError> {
    let long = args.prompts.iter().copied().max().unwrap_or(1024).max(64);
    let short = args.prompts.iter().copied().min().unwrap_or(16).max(1);
    let mut checks = prefills(backend, long, short, repeats, new_probe, report)?;
    checks.extend(decodes(backend, long, short, repeats, new_probe, report)?);
    Ok(checks)
}

/// Prefill batches mixing long and short prompts (`long`, `short`: the
/// longest and shortest profiled prompts).
fn prefills<B: Backend>(
    backend: &mut B,
    long: u32,
    short: u32,
    repeats: usize,
    new_probe: &NewProbe<'_, B>,
    report: &mut dyn FnMut(String, f64),
) -> Result<Vec<StepCheck>, ProfileError> {
    let batches: [(Vec<u32>, &str); 5] = [
        ([vec![long], vec![short; 4]].concat(), "one long prompt beside four short ones"),
        (vec![long / 4; 4], "four quarter-length prompts"),
        (vec![long / 16; 16], "sixteen prompts of a sixteenth"),
        (vec![long / 2, long / 4, long / 8, long / 8], "halving lengths"),
        ([vec![long / 4], vec![long / 16; 2], vec![short; 4]].concat(), "one medium, two small, four short"),
    ];
    let mut checks = Vec::new();
    for (sizes, note) in batches {
        let mut times = Vec::new();
        for i in 0..=repeats {
            let mut probes =
                sizes.iter().map(|&n| new_probe(backend, n, 1)).collect::<Result<Vec<_>, _>>()?;
            let t = step(backend, &mut probes, false).as_secs_f64() * 1e3;
            if i > 0 {
                times.push(t);
            }
        }
        let ms = median(times);
        report(format!("prefill {sizes:?}"), ms);
        checks.push(StepCheck { prefill: sizes, decode: vec![], ms, note: note.to_string() });
    }
    Ok(checks)
}

/// Decode steps over mixed contexts; the last one right after a long
/// prefill (the interleaving a serving engine runs: prefill, then decode).
fn decodes<B: Backend>(
    backend: &mut B,
    long: u32,
    short: u32,
    repeats: usize,
    new_probe: &NewProbe<'_, B>,
    report: &mut dyn FnMut(String, f64),
) -> Result<Vec<StepCheck>, ProfileError> {
    let spread: Vec<u32> = (0..16).map(|i| short + (long - short) * i / 15).collect();
    let steps: [(Vec<u32>, bool, &str); 3] = [
        ([vec![long], vec![short; 7]].concat(), false, "one long context beside seven short ones"),
        (spread, false, "sixteen contexts spread from the shortest to the longest prompt"),
        (vec![long / 2; 8], true, "right after a prefill of the longest prompt"),
    ];
    let room = (repeats as u32 + 2) * DECODE_STEPS;
    let mut checks = Vec::new();
    for (contexts, after_prefill, note) in steps {
        let mut probes =
            contexts.iter().map(|&n| new_probe(backend, n, room)).collect::<Result<Vec<_>, _>>()?;
        step(backend, &mut probes, false);
        let mut times = Vec::new();
        for i in 0..=repeats {
            let mut t = 0.0;
            for _ in 0..DECODE_STEPS {
                if after_prefill {
                    let mut p = vec![new_probe(backend, long, 1)?];
                    step(backend, &mut p, false);
                }
                t += step(backend, &mut probes, true).as_secs_f64() * 1e3;
            }
            if i > 0 {
                times.push(t / f64::from(DECODE_STEPS));
            }
        }
        let ms = median(times);
        // The contexts halfway through the timed steps.
        let at: Vec<u32> = probes.iter().map(|p| p.context - room / 2).collect();
        report(format!("decode contexts {contexts:?}"), ms);
        checks.push(StepCheck { prefill: vec![], decode: at, ms, note: note.to_string() });
    }
    Ok(checks)
}

/// The attention term (ms per 1k²) that best reproduces the mixed prefill
/// batches (least squares on relative error), between 0 and the largest
/// the single-prompt points allow.
pub(super) fn fit_attention(
    prefill: &[(u32, f64)],
    decode: &[(u32, f64)],
    ms_per_1k_context: f64,
    checks: &[StepCheck],
) -> f64 {
    let points =
        |v: &[(u32, f64)]| v.iter().map(|(x, ms)| format!("[{x}, {ms}]")).collect::<Vec<_>>().join(", ");
    let doc = format!(
        "model = \"m\"\nengine_class = \"c\"\n[prefill]\npoints = [{}]\n\
         [decode]\nbatch_points = [{}]\nms_per_1k_context = {ms_per_1k_context}\n",
        points(prefill),
        points(decode)
    );
    let Ok(measured) = policies::LatencyProfile::parse("fit", &doc) else { return 0.0 };
    let error = |q: f64| -> f64 {
        let Some(p) = measured.with_attention(q) else { return f64::INFINITY };
        checks
            .iter()
            .filter(|c| !c.prefill.is_empty())
            .map(|c| (c.predicted_ms(&p) / c.ms - 1.0).powi(2))
            .sum()
    };
    let sq = |n: u32| (f64::from(n) / 1000.0).powi(2);
    let max = prefill.iter().filter(|(n, _)| *n > 0).map(|&(n, ms)| ms / sq(n)).fold(f64::INFINITY, f64::min);
    if !max.is_finite() {
        return 0.0;
    }
    (0..=1000)
        .map(|i| max * f64::from(i) / 1000.0)
        .min_by(|a, b| error(*a).total_cmp(&error(*b)))
        .unwrap_or(0.0)
}
