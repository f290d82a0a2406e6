//! Progress output for long commands, always on stderr so stdout stays
//! clean for results: an `indicatif` bar redrawn in place on a terminal;
//! elsewhere (CI logs, files: indicatif draws nothing there) plain lines at
//! each tenth of the work, or every 5 s for a load run.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::runner::Live;

fn bar(len: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(template).expect("the progress templates are valid");
    bar.set_style(style.progress_chars("#>-"));
    bar
}

/// Progress through a known number of steps.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    done: usize,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        let total = total.max(1);
        let tty = std::io::stderr().is_terminal();
        let bar =
            tty.then(|| bar(total as u64, "[{bar:25}] {percent:>3}% {pos}/{len} {elapsed} (eta {eta})"));
        Self { bar, total, done: 0 }
    }

    pub fn tick(&mut self) {
        self.done += 1;
        match &self.bar {
            Some(bar) => bar.inc(1),
            None if (self.done - 1) * 10 / self.total != self.done * 10 / self.total => {
                eprintln!("progress: {}% ({}/{})", self.done * 100 / self.total, self.done, self.total);
            }
            None => {}
        }
    }

    pub fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// Live counters of a load run, redrawn every 250 ms on a terminal or
/// printed every 5 s otherwise, until `planned` requests are done. Returns
/// when they are; abort the task to stop it early.
pub async fn watch_run(live: Arc<Live>, planned: usize, duration_s: f64) {
    let tty = std::io::stderr().is_terminal();
    let every = if tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
    // The bar runs over the run's planned duration, in milliseconds.
    let shown = tty.then(|| bar((duration_s * 1e3).max(1.0) as u64, "[{bar:25}] {msg}"));
    let start = tokio::time::Instant::now();
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let done = live.done.load(Ordering::Relaxed) as usize;
        let elapsed = start.elapsed().as_secs_f64();
        let mut recent = std::mem::take(&mut *live.recent_ttft_ms.lock().expect("ttft lock"));
        recent.sort_by(f64::total_cmp);
        let p95 = crate::stats::sorted_percentile(&recent, 95.0)
            .map_or_else(|| "-".to_string(), |v| format!("{v:.0}ms"));
        let line = format!(
            "{elapsed:6.1}/{duration_s:.0}s sent {} in-flight {} ok {} rejected {} failed {} ttft-p95 {p95}",
            live.sent.load(Ordering::Relaxed),
            live.inflight.load(Ordering::Relaxed),
            live.ok.load(Ordering::Relaxed),
            live.rejected.load(Ordering::Relaxed),
            live.failed.load(Ordering::Relaxed),
        );
        match &shown {
            Some(bar) => {
                bar.set_position((elapsed * 1e3) as u64);
                bar.set_message(line);
            }
            None => eprintln!("progress: {line}"),
        }
        if done >= planned {
            if let Some(bar) = &shown {
                bar.finish();
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_templates_parse_and_count() {
        // `bar` panics on a bad template; a bar counts what it is told.
        let b = bar(10, "[{bar:25}] {percent:>3}% {pos}/{len} {elapsed} (eta {eta})");
        b.inc(3);
        assert_eq!(b.position(), 3);
        bar(1, "[{bar:25}] {msg}").set_message("x");
    }
}
