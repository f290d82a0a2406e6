//! The active policy version and how it changes: build, validate, swap
//! atomically, record; keep the last good version on failure.
//!
//! Readers take a snapshot ([`PolicyStore::current`], an `Arc` clone): a
//! request reads one version from its start to the end of its response
//! stream, so requests admitted under a version finish under it while new
//! requests see the next. Changes are serialised by one lock; each is
//! validated completely before anything is swapped, and recorded in the
//! audit trail whether applied or rejected. A document whose text hashes to
//! the active version is a no-op (the file watcher sees our own writes).
//!
//! Changes made through the admin API are also written to the policy file
//! (temporary file + rename, so it is never half-written) when the gateway
//! runs from one, so SIGHUP or a restart keeps them.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use policies::text::{self, Change};
use policies::{PolicyDocument, PolicyError};
use serde::Serialize;
use tokio::sync::watch;

use crate::audit::{rfc3339, Audit, AuditEntry, Outcome, Source};
use crate::metrics as m;

/// Versions kept for `GET /admin/policies/history` and rollback.
const HISTORY: usize = 32;

/// One version that served.
#[derive(Debug, Clone, Serialize)]
pub struct VersionRecord {
    pub version: String,
    pub applied_at: String,
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// What changed from the version before it.
    pub summary: String,
    #[serde(skip)]
    text: Arc<str>,
}

/// Whether to apply a validated document or only report on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Apply,
    DryRun,
}

/// A document that validated.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub version: String,
    pub previous: String,
    pub changes: Vec<Change>,
    /// Swapped in (false for a dry run or an unchanged document).
    pub applied: bool,
    /// For admin API changes with a policy file: whether it was written.
    pub persisted: Option<Result<(), String>>,
}

/// Why a change did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] PolicyError),
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the gateway runs on the bundled policy document; there is no file to reload")]
    NoFile,
    #[error("version {0} is not in the recent history")]
    UnknownVersion(String),
}

struct Inner {
    history: VecDeque<VersionRecord>,
    audit: Audit,
    /// The last document refused, so the file watcher does not report the
    /// same invalid file again after a SIGHUP already did.
    last_rejected: Option<String>,
}

/// The active policy document, its recent versions and the audit trail.
pub struct PolicyStore {
    active: watch::Sender<Arc<PolicyDocument>>,
    inner: Mutex<Inner>,
    /// The policy file, when the gateway runs from one.
    path: Option<PathBuf>,
    /// Write admin API changes to `path`.
    write_through: bool,
}

impl std::fmt::Debug for PolicyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyStore")
            .field("version", &self.current().version)
            .field("path", &self.path)
            .finish()
    }
}

impl PolicyStore {
    /// Starts from `doc`, parsed from `text` (read from `path` when it came
    /// from a file).
    pub fn new(doc: PolicyDocument, text: &str, path: Option<PathBuf>, audit_log: Option<PathBuf>) -> Self {
        Self::with_write_through(doc, text, path, audit_log, true)
    }

    /// As [`PolicyStore::new`]; `write_through: false` keeps admin API
    /// changes in memory only.
    pub fn with_write_through(
        doc: PolicyDocument,
        text: &str,
        path: Option<PathBuf>,
        audit_log: Option<PathBuf>,
        write_through: bool,
    ) -> Self {
        let record = VersionRecord {
            version: doc.version.clone(),
            applied_at: rfc3339(crate::clock::wall()),
            source: Source::Startup.label(),
            admin: None,
            summary: "initial version".into(),
            text: Arc::from(text),
        };
        version_gauge(None, &doc.version);
        let (active, _) = watch::channel(Arc::new(doc));
        let inner = Mutex::new(Inner {
            history: VecDeque::from([record]),
            audit: Audit::new(audit_log),
            last_rejected: None,
        });
        Self { active, inner, path, write_through }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The active version: hold it for as long as one request lasts.
    pub fn current(&self) -> Arc<PolicyDocument> {
        Arc::clone(&self.active.borrow())
    }

    /// Wakes on every swap (the admission loop follows the active version).
    pub fn subscribe(&self) -> watch::Receiver<Arc<PolicyDocument>> {
        self.active.subscribe()
    }

    /// The policy file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The active version's record and its text with tenant keys redacted.
    pub fn active_record(&self) -> (VersionRecord, String) {
        let inner = self.lock();
        let r = inner.history.back().expect("history always holds the active version").clone();
        let shown = text::redact_keys(&r.text);
        (r, shown)
    }

    /// The active version's full text (tenant keys included: for
    /// publishing to the cluster, never for showing).
    pub fn active_text(&self) -> String {
        self.lock().history.back().map(|r| r.text.to_string()).unwrap_or_default()
    }

    /// Recent versions, newest (active) first.
    pub fn history(&self) -> Vec<VersionRecord> {
        self.lock().history.iter().rev().cloned().collect()
    }

    /// Recent audit entries, newest first.
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.lock().audit.recent()
    }

    /// Records a change made beside the document (an API key made,
    /// rotated or revoked) in the same audit trail.
    pub fn record_audit(&self, entry: AuditEntry) {
        self.lock().audit.record(entry);
    }

    /// Validates `text` and, in [`Mode::Apply`], swaps it in. `label` names
    /// the document in errors (a path, or the admin API).
    pub fn apply(
        &self,
        label: &str,
        text: &str,
        source: Source,
        mode: Mode,
    ) -> Result<Accepted, ReloadError> {
        let mut inner = self.lock();
        let old = inner.history.back().expect("history always holds the active version").clone();
        let doc = match PolicyDocument::parse(label, text) {
            Ok(doc) => doc,
            Err(e) => {
                let version = policies::config::version_of(text);
                let repeat =
                    source == Source::File && inner.last_rejected.as_deref() == Some(version.as_str());
                if mode == Mode::Apply && !repeat {
                    let entry =
                        AuditEntry::new(Outcome::Rejected, &source, &version, &old.version, e.to_string());
                    inner.audit.record(entry);
                    reload_counter(&source, "rejected");
                    inner.last_rejected = Some(version);
                }
                return Err(e.into());
            }
        };
        let changes = text::diff(&old.text, text);
        let mut accepted = Accepted {
            version: doc.version.clone(),
            previous: old.version.clone(),
            changes,
            applied: false,
            persisted: None,
        };
        if mode == Mode::DryRun || doc.version == old.version {
            return Ok(accepted);
        }
        let summary = text::summary(&accepted.changes);
        let entry = AuditEntry::new(Outcome::Applied, &source, &doc.version, &old.version, summary.clone());
        if source.token_id().is_some() && self.write_through {
            accepted.persisted = self.path.as_deref().map(|p| persist(p, text).map_err(|e| e.to_string()));
        }
        version_gauge(Some(&old.version), &doc.version);
        self.active.send_replace(Arc::new(doc));
        if inner.history.len() == HISTORY {
            inner.history.pop_front();
        }
        inner.history.push_back(VersionRecord {
            version: entry.version.clone(),
            applied_at: entry.at.clone(),
            source: entry.source,
            admin: entry.admin.clone(),
            summary,
            text: Arc::from(text),
        });
        inner.audit.record(entry);
        reload_counter(&source, "applied");
        accepted.applied = true;
        Ok(accepted)
    }

    /// Re-reads the policy file and applies it (SIGHUP, a file change,
    /// `POST /admin/policies/reload`).
    pub fn reload_file(&self, source: Source) -> Result<Accepted, ReloadError> {
        let path = self.path.as_deref().ok_or(ReloadError::NoFile)?;
        match std::fs::read_to_string(path) {
            Ok(text) => self.apply(&path.display().to_string(), &text, source, Mode::Apply),
            Err(e) => {
                let mut inner = self.lock();
                let previous = inner.history.back().map(|r| r.version.clone()).unwrap_or_default();
                let summary = format!("reading {}: {e}", path.display());
                inner.audit.record(AuditEntry::new(Outcome::Rejected, &source, "-", &previous, summary));
                reload_counter(&source, "rejected");
                Err(ReloadError::Read(path.to_path_buf(), e))
            }
        }
    }

    /// Applies the text of a recent `version` again.
    pub fn rollback(&self, version: &str, source: Source, mode: Mode) -> Result<Accepted, ReloadError> {
        let text = {
            let inner = self.lock();
            let r = inner.history.iter().find(|r| r.version == version);
            r.map(|r| Arc::clone(&r.text)).ok_or_else(|| ReloadError::UnknownVersion(version.to_string()))?
        };
        self.apply(&format!("version {version}"), &text, source, mode)
    }
}

/// Writes `text` to `path` atomically: a temporary file beside it, then a
/// rename over it. The file keeps its mode (it holds API keys: a 0600 file
/// stays 0600); a new file is created 0600.
fn persist(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777);
    let name = path.file_name().map_or_else(|| "policies".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn version_gauge(old: Option<&str>, new: &str) {
    if let Some(old) = old {
        ::metrics::gauge!(m::POLICY_VERSION, "version" => old.to_string()).set(0.0);
    }
    ::metrics::gauge!(m::POLICY_VERSION, "version" => new.to_string()).set(1.0);
}

fn reload_counter(source: &Source, result: &'static str) {
    ::metrics::counter!(m::POLICY_RELOADS, "source" => source.label(), "result" => result).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc_text(ttft: u32) -> String {
        crate::DEFAULT_POLICIES.replacen("ttft_ms = 500", &format!("ttft_ms = {ttft}"), 1)
    }

    fn store(dir: &Path) -> PolicyStore {
        let text = doc_text(500);
        let path = dir.join("policies.toml");
        std::fs::write(&path, &text).unwrap();
        let doc = PolicyDocument::parse("p", &text).unwrap();
        PolicyStore::new(doc, &text, Some(path), None)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("reload-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn swaps_atomically_and_old_snapshots_keep_their_version() {
        let dir = scratch("swap");
        let s = store(&dir);
        let before = s.current();
        let rx = s.subscribe();
        let api = Source::Api { token_id: "ops".into() };
        let a = s.apply("api", &doc_text(250), api, Mode::Apply).unwrap();
        assert!(a.applied);
        assert_eq!(a.changes.len(), 1);
        assert_eq!(a.changes[0].to_string(), "tiers.gold.ttft_ms: 500 -> 250");
        assert_eq!(before.tier("gold").unwrap().ttft.as_millis(), 500, "a held snapshot never changes");
        assert_eq!(s.current().tier("gold").unwrap().ttft.as_millis(), 250);
        assert!(rx.has_changed().unwrap());
        // Written through to the file, so the next SIGHUP keeps it: unchanged.
        assert_eq!(a.persisted, Some(Ok(())));
        let again = s.reload_file(Source::Signal).unwrap();
        assert!(!again.applied && again.changes.is_empty());
        assert_eq!(s.history().len(), 2);
        assert_eq!(s.history()[0].admin.as_deref(), Some("ops"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn invalid_and_dry_run_change_nothing() {
        let dir = scratch("invalid");
        let s = store(&dir);
        let v0 = s.current().version.clone();
        let bad = doc_text(500).replace("e2e_ms = 20000", "e2e_ms = 20000\nbogus = 1");
        let err = s.apply("p.toml", &bad, Source::File, Mode::Apply).unwrap_err().to_string();
        assert!(err.contains("tiers.gold.bogus"), "{err}");
        let dry =
            s.apply("api", &doc_text(300), Source::Api { token_id: "ops".into() }, Mode::DryRun).unwrap();
        assert!(!dry.applied);
        assert_eq!(dry.changes.len(), 1);
        assert_eq!(s.current().version, v0);
        // The watcher finding the file SIGHUP already reported adds nothing.
        assert!(s.apply("p.toml", &bad, Source::Signal, Mode::Apply).is_err());
        assert!(s.apply("p.toml", &bad, Source::File, Mode::Apply).is_err());
        let audit = s.audit();
        assert_eq!(audit.len(), 2, "dry runs and repeats are not changes: {audit:?}");
        assert_eq!(audit[0].outcome, Outcome::Rejected);
        assert_eq!(audit[0].source, "signal");
        assert_eq!(audit[1].source, "file");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_written_policy_file_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("mode");
        let path = dir.join("policies.toml");
        std::fs::write(&path, doc_text(500)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        persist(&path, &doc_text(250)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), doc_text(250));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        persist(&path, &doc_text(300)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn without_write_through_api_changes_stay_in_memory() {
        let dir = scratch("memory");
        let text = doc_text(500);
        let path = dir.join("policies.toml");
        std::fs::write(&path, &text).unwrap();
        let doc = PolicyDocument::parse("p", &text).unwrap();
        let s = PolicyStore::with_write_through(doc, &text, Some(path.clone()), None, false);
        let a = s.apply("api", &doc_text(250), Source::Api { token_id: "ops".into() }, Mode::Apply).unwrap();
        assert!(a.applied && a.persisted.is_none());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        // The file is still the source of truth for SIGHUP.
        assert!(s.reload_file(Source::Signal).unwrap().applied);
        assert_eq!(s.current().tier("gold").unwrap().ttft.as_millis(), 500);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rolls_back_to_a_recent_version() {
        let dir = scratch("rollback");
        let s = store(&dir);
        let v0 = s.current().version.clone();
        s.apply("api", &doc_text(250), Source::Signal, Mode::Apply).unwrap();
        let r = s.rollback(&v0, Source::Rollback { token_id: "ops".into() }, Mode::Apply).unwrap();
        assert!(r.applied);
        assert_eq!(s.current().version, v0);
        assert!(matches!(
            s.rollback("nope", Source::Signal, Mode::Apply),
            Err(ReloadError::UnknownVersion(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
