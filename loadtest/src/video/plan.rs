//! Video workloads, planned before the run from a seed: when each stream
//! arrives, how long it is, and when it switches prompt or pauses.
//!
//! - `steady`: Poisson arrivals at the rate.
//! - `burst`: 70% of the streams Poisson, plus three burst points at 20%,
//!   50% and 80% of the run, each bringing 10% of all streams at once.
//! - `prompt-switch`: steady, each stream switching prompt 1-3 times by its
//!   length (81 frames: once; 129 or 161: twice; 241: three times), evenly
//!   spread over its playing time.
//! - `pause`: steady, each stream pausing 1-3 times by its length, each
//!   pause 20% of the stream's duration.
//! - `surge`: Poisson at the rate for the first third of the run, at three
//!   times the rate for the second, back at the rate for the last (the
//!   live autoscaling benchmark's trace).
//!
//! Stream lengths are uniform in {81, 129, 161, 241} frames.

use policies::rng::SplitMix;

/// The shapes of video load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VideoWorkload {
    Steady,
    Burst,
    PromptSwitch,
    Pause,
    Surge,
}

impl VideoWorkload {
    pub fn label(self) -> &'static str {
        match self {
            VideoWorkload::Steady => "steady",
            VideoWorkload::Burst => "burst",
            VideoWorkload::PromptSwitch => "prompt-switch",
            VideoWorkload::Pause => "pause",
            VideoWorkload::Surge => "surge",
        }
    }
}

pub const LENGTHS: [u32; 4] = [81, 129, 161, 241];

/// One planned stream. Times in seconds from the start of the run; switch
/// and pause times from the stream's own start.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedStream {
    pub at: f64,
    pub length_frames: u32,
    pub switches: Vec<f64>,
    /// `(start, duration)`.
    pub pauses: Vec<(f64, f64)>,
}

/// Events per stream by its length (1-3).
fn events_for(length: u32) -> usize {
    match length {
        0..=100 => 1,
        101..=200 => 2,
        _ => 3,
    }
}

/// Plans `rate × duration` streams (at least one; `surge`: five thirds as
/// many, its middle third at three times the rate).
pub fn plan(workload: VideoWorkload, rate: f64, duration_s: f64, fps: u32, seed: u64) -> Vec<PlannedStream> {
    let mut rng = SplitMix(seed);
    let n = ((rate * duration_s).round() as usize).max(1);
    let poisson = |rng: &mut SplitMix, count: usize| -> Vec<f64> {
        // Uniform order statistics over the run: a Poisson process given its count.
        let mut t: Vec<f64> = (0..count).map(|_| rng.unit_f64() * duration_s).collect();
        t.sort_by(f64::total_cmp);
        t
    };
    let times = match workload {
        VideoWorkload::Surge => {
            // A Poisson process in each third, given its count.
            let third = duration_s / 3.0;
            let mut t = Vec::new();
            for (k, factor) in [1.0, 3.0, 1.0].into_iter().enumerate() {
                let count = (rate * factor * third).round() as usize;
                t.extend((0..count).map(|_| (k as f64 + rng.unit_f64()) * third));
            }
            t.sort_by(f64::total_cmp);
            if t.is_empty() {
                t.push(0.0);
            }
            t
        }
        VideoWorkload::Burst => {
            let per_burst = (n as f64 * 0.1).round() as usize;
            let mut t = poisson(&mut rng, n.saturating_sub(3 * per_burst));
            for at in [0.2, 0.5, 0.8] {
                t.extend(std::iter::repeat_n(at * duration_s, per_burst));
            }
            t.sort_by(f64::total_cmp);
            t
        }
        _ => poisson(&mut rng, n),
    };
    times
        .into_iter()
        .map(|at| {
            let length_frames = LENGTHS[(rng.next_u64() % 4) as usize];
            let play_s = f64::from(length_frames) / f64::from(fps);
            let k = events_for(length_frames);
            let spread = |i: usize| play_s * (i + 1) as f64 / (k + 1) as f64;
            let (switches, pauses) = match workload {
                VideoWorkload::PromptSwitch => ((0..k).map(spread).collect(), Vec::new()),
                VideoWorkload::Pause => (Vec::new(), (0..k).map(|i| (spread(i), 0.2 * play_s)).collect()),
                _ => (Vec::new(), Vec::new()),
            };
            PlannedStream { at, length_frames, switches, pauses }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_bring_ten_percent_each_at_their_points() {
        let p = plan(VideoWorkload::Burst, 2.0, 50.0, 16, 1);
        assert_eq!(p.len(), 100);
        for at in [10.0, 25.0, 40.0] {
            assert!(p.iter().filter(|s| s.at == at).count() >= 10, "burst at {at}");
        }
        assert!(p.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn a_surge_triples_the_rate_in_the_middle_third_and_falls_back() {
        let p = plan(VideoWorkload::Surge, 1.0, 90.0, 16, 3);
        let in_third = |k: f64| p.iter().filter(|s| s.at >= k * 30.0 && s.at < (k + 1.0) * 30.0).count();
        assert_eq!((in_third(0.0), in_third(1.0), in_third(2.0)), (30, 90, 30));
        assert!(p.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(p.iter().all(|s| s.switches.is_empty() && s.pauses.is_empty()));
    }

    #[test]
    fn lengths_switches_and_pauses_follow_the_spec() {
        let p = plan(VideoWorkload::PromptSwitch, 1.0, 200.0, 16, 2);
        for l in LENGTHS {
            assert!(p.iter().any(|s| s.length_frames == l), "length {l} drawn");
        }
        for s in &p {
            assert_eq!(s.switches.len(), events_for(s.length_frames));
            assert!(s.switches.iter().all(|&t| t > 0.0 && t < f64::from(s.length_frames) / 16.0));
        }
        let p = plan(VideoWorkload::Pause, 1.0, 100.0, 16, 3);
        for s in &p {
            assert!((1..=3).contains(&s.pauses.len()));
            let play = f64::from(s.length_frames) / 16.0;
            assert!(s.pauses.iter().all(|&(_, d)| (d - 0.2 * play).abs() < 1e-9));
        }
        assert_eq!(
            plan(VideoWorkload::Steady, 1.0, 30.0, 16, 4),
            plan(VideoWorkload::Steady, 1.0, 30.0, 16, 4)
        );
    }
}
