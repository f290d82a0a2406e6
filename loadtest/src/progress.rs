//! Progress output for long commands: a bar redrawn in place on a terminal,
//! plain periodic lines otherwise (CI logs, files), always on stderr so
//! stdout stays clean for results.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::runner::Live;

fn bar(fraction: f64) -> String {
    let filled = (fraction.clamp(0.0, 1.0) * 25.0).round() as usize;
    format!("[{}{}]", "#".repeat(filled), " ".repeat(25 - filled))
}

/// Progress through a known number of steps.
pub struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        Self { total: total.max(1), done: 0, tty: std::io::stderr().is_terminal() }
    }

    pub fn tick(&mut self) {
        self.done += 1;
        let pct = self.done * 100 / self.total;
        if self.tty {
            eprint!("\r{} {pct:3}% {}/{}", bar(self.done as f64 / self.total as f64), self.done, self.total);
            let _ = std::io::stderr().flush();
        } else if (self.done - 1) * 10 / self.total != self.done * 10 / self.total {
            eprintln!("progress: {pct}% ({}/{})", self.done, self.total);
        }
    }

    pub fn done(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// Live counters of a load run, redrawn every 250 ms on a terminal or
/// printed every 5 s otherwise, until `planned` requests are done. Returns
/// when they are; abort the task to stop it early.
pub async fn watch_run(live: Arc<Live>, planned: usize, duration_s: f64) {
    let tty = std::io::stderr().is_terminal();
    let every = if tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
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
        if tty {
            eprint!("\r\x1b[2K{} {line}", bar(elapsed / duration_s.max(1e-9)));
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("progress: {line}");
        }
        if done >= planned {
            if tty {
                eprintln!();
            }
            return;
        }
    }
}
