//! The policy audit trail: every applied or rejected change, with when,
//! from where (signal, file, admin API with the token id), the version and
//! what changed. Kept in memory (the most recent, for `GET
//! /admin/policies/audit`), appended to a JSON-lines file when configured,
//! and logged as `event = "policy_audit"`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Entries kept in memory.
const KEPT: usize = 256;

/// Where a policy change came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The file read when the gateway started.
    Startup,
    /// SIGHUP.
    Signal,
    /// The file changed on disk.
    File,
    /// `PUT /admin/policies` or `POST /admin/policies/reload` by this admin
    /// token id.
    Api { token_id: String },
    /// `POST /admin/policies/rollback` by this admin token id.
    Rollback { token_id: String },
    /// Published by another gateway of the fleet (Redis).
    Cluster,
}

impl Source {
    /// Stable label for metrics and the audit log.
    pub fn label(&self) -> &'static str {
        match self {
            Source::Startup => "startup",
            Source::Signal => "signal",
            Source::File => "file",
            Source::Api { .. } => "api",
            Source::Rollback { .. } => "rollback",
            Source::Cluster => "cluster",
        }
    }

    pub fn token_id(&self) -> Option<&str> {
        match self {
            Source::Api { token_id } | Source::Rollback { token_id } => Some(token_id),
            _ => None,
        }
    }
}

/// What happened to a proposed document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Validated and swapped in.
    Applied,
    /// Invalid: the previous version keeps serving.
    Rejected,
}

/// One line of the audit log.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEntry {
    /// RFC 3339, UTC.
    pub at: String,
    pub outcome: Outcome,
    pub source: &'static str,
    /// The admin token id, for API changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// Content hash of the proposed document (also for a rejected one).
    pub version: String,
    /// The version serving before (and, when rejected, still serving).
    pub previous: String,
    /// What changed (applied) or why it was refused (rejected).
    pub summary: String,
}

impl AuditEntry {
    pub fn new(outcome: Outcome, source: &Source, version: &str, previous: &str, summary: String) -> Self {
        Self {
            at: rfc3339(crate::clock::wall()),
            outcome,
            source: source.label(),
            admin: source.token_id().map(str::to_string),
            version: version.to_string(),
            previous: previous.to_string(),
            summary,
        }
    }
}

/// The audit trail.
#[derive(Debug)]
pub struct Audit {
    recent: VecDeque<AuditEntry>,
    file: Option<PathBuf>,
}

impl Audit {
    pub fn new(file: Option<PathBuf>) -> Self {
        Self { recent: VecDeque::new(), file }
    }

    /// Records `entry` everywhere it goes. A file that cannot be written is
    /// logged, never fatal: the change itself already happened.
    pub fn record(&mut self, entry: AuditEntry) {
        tracing::warn!(event = "policy_audit", outcome = ?entry.outcome, source = entry.source,
            admin = entry.admin.as_deref().unwrap_or("-"), version = %entry.version,
            previous = %entry.previous, summary = %entry.summary);
        if let Some(path) = &self.file {
            if let Err(e) = append(path, &entry) {
                tracing::error!(event = "audit_log_write_failed", path = %path.display(), error = %e);
            }
        }
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(entry);
    }

    /// The most recent entries, newest first.
    pub fn recent(&self) -> Vec<AuditEntry> {
        self.recent.iter().rev().cloned().collect()
    }
}

fn append(path: &std::path::Path, entry: &AuditEntry) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
    line.push(b'\n');
    f.write_all(&line) // one write per line: lines never interleave
}

/// `t` as RFC 3339 in UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_382_893_250);
        assert_eq!(rfc3339(t), "2026-11-22T21:28:13.250Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn appends_json_lines_and_keeps_the_newest_first() {
        let dir = std::env::temp_dir().join(format!("audit-test-{}", std::process::id()));
        let path = dir.join("sub/audit.jsonl");
        let mut audit = Audit::new(Some(path.clone()));
        let api = Source::Api { token_id: "ops".into() };
        audit.record(AuditEntry::new(Outcome::Applied, &api, "bbb", "aaa", "x: 1 -> 2".into()));
        audit.record(AuditEntry::new(Outcome::Rejected, &Source::Signal, "ccc", "bbb", "bad".into()));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["admin"], "ops");
        assert_eq!(lines[0]["outcome"], "applied");
        assert_eq!(lines[1]["source"], "signal");
        assert!(lines[1].get("admin").is_none());
        assert_eq!(audit.recent()[0].version, "ccc");
        let _ = std::fs::remove_dir_all(dir);
    }
}
