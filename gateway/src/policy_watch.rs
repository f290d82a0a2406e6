//! Reload triggers besides the admin API: SIGHUP, and the policy file
//! changing on disk (polled, debounced: a change is read once the file has
//! stayed the same for the debounce time, so an editor's partial writes are
//! never loaded). Both re-read the file and go through
//! [`PolicyStore::reload_file`]; an invalid file is rejected there and the
//! last good version keeps serving.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, SignalKind};

use crate::audit::Source;
use crate::reload::PolicyStore;

/// Reloads on every SIGHUP until the process ends.
pub async fn on_sighup(store: Arc<PolicyStore>) {
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => return tracing::error!(event = "sighup_handler_failed", error = %e),
    };
    while hup.recv().await.is_some() {
        reload(&store, Source::Signal);
    }
}

/// What identifies one state of the file: a rename (inode), a rewrite
/// (modification time) or a truncation (length) changes it.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Polls the policy file every `interval`; reloads once a change has held
/// still for `debounce`.
pub async fn watch_file(store: Arc<PolicyStore>, interval: Duration, debounce: Duration) {
    let Some(path) = store.path().map(Path::to_path_buf) else { return };
    let mut seen = stamp(&path);
    let mut pending: Option<(Stamp, tokio::time::Instant)> = None;
    let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = stamp(&path);
        if now == seen {
            pending = None;
            continue;
        }
        match pending {
            Some((s, since)) if s == now => {
                if since.elapsed() >= debounce {
                    seen = now;
                    pending = None;
                    if now.is_some() {
                        reload(&store, Source::File);
                    } else {
                        tracing::warn!(event = "policy_file_missing", path = %path.display());
                    }
                }
            }
            _ => pending = Some((now, tokio::time::Instant::now())),
        }
    }
}

fn reload(store: &PolicyStore, source: Source) {
    let label = source.label();
    match store.reload_file(source) {
        Ok(a) if a.applied => tracing::info!(event = "policy_reloaded", source = label, version = %a.version,
            previous = %a.previous, changes = a.changes.len()),
        Ok(a) => tracing::debug!(event = "policy_unchanged", source = label, version = %a.version),
        Err(e) => tracing::error!(event = "policy_reload_rejected", source = label, error = %e),
    }
}
