//! One engine as the gateway sees it: its address, readiness and role, the
//! work this gateway has on it (atomics, kept exact by `EngineLease`s), its
//! last load report and latency profile, and the numbers admission reads
//! of those per decision.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use engine_api::LoadReport;
use policies::LatencyProfile;

use super::EngineSpec;

/// One engine as the gateway sees it.
#[derive(Debug)]
pub struct EngineSlot {
    pub spec: EngineSpec,
    /// `Authorization` for an `openai` engine (its `api_key_env`).
    upstream_key: Option<http::HeaderValue>,
    pub(super) ready: AtomicBool,
    pub(super) inflight_tokens: AtomicU64,
    /// Sequences dispatched and not finished.
    pub(super) active: AtomicU32,
    /// Of those, how many per tier class (priority weight), while priority
    /// preemption is on: (class, count), a handful of entries.
    pub(super) classes: std::sync::Mutex<Vec<(u32, u32)>>,
    /// Their expected output tokens.
    pub(super) active_out: AtomicU64,
    /// Prompt tokens dispatched that have not produced a first token.
    pub(super) prefill_backlog: AtomicU64,
    /// Prompt + expected output tokens of every lease ever taken here, and
    /// its value when the last load report was requested: the difference
    /// is work the report cannot reflect yet.
    pub(super) leased_total: AtomicU64,
    pub(super) leased_at_report: AtomicU64,
    /// Swapped whole by the poller; the request path reads it without a
    /// lock or a copy.
    pub(super) last_report: ArcSwapOption<LoadReport>,
    /// The engine's latency profile, fetched once it first answers.
    pub(super) profile: ArcSwapOption<LatencyProfile>,
    /// The models an `openai` engine with `discover_models` lists at its
    /// `/v1/models` (its own ids), as of the last probe.
    pub(super) discovered_models: ArcSwapOption<Vec<String>>,
    /// What admission reads of them on every decision, as plain numbers
    /// (see [`AdmissionView`]); written with them.
    view: AdmissionAtomics,
    /// Found in the cluster registry (not configured): retired when it has
    /// been gone from the registry and unready past the engine TTL.
    pub(super) discovered: bool,
    /// Retired: never probed, routed to or listed; its index is reused by
    /// the next engine discovered.
    pub(super) retired: AtomicBool,
    /// When it last answered a probe (or was added).
    pub(super) last_seen: Mutex<std::time::Instant>,
    /// In the warm pool: ready, probed and given hints, but not routed to.
    pub(super) standby: AtomicBool,
    /// Leaving (scale-in): no new work; its running sequences finish.
    pub(super) draining: AtomicBool,
}

impl EngineSlot {
    pub(super) fn new(spec: EngineSpec, discovered: bool) -> Self {
        // An upstream's key is read from its environment variable once.
        let upstream_key = spec.upstream.api_key_env.as_deref().and_then(|var| {
            let key = std::env::var(var).ok()?;
            let mut v = http::HeaderValue::from_str(&format!("Bearer {}", key.trim())).ok()?;
            v.set_sensitive(true);
            Some(v)
        });
        Self {
            upstream_key,
            spec,
            discovered,
            retired: AtomicBool::new(false),
            last_seen: Mutex::new(crate::clock::now()),
            ready: AtomicBool::new(false),
            inflight_tokens: AtomicU64::new(0),
            active: AtomicU32::new(0),
            classes: std::sync::Mutex::new(Vec::new()),
            active_out: AtomicU64::new(0),
            prefill_backlog: AtomicU64::new(0),
            leased_total: AtomicU64::new(0),
            leased_at_report: AtomicU64::new(0),
            last_report: ArcSwapOption::empty(),
            profile: ArcSwapOption::empty(),
            discovered_models: ArcSwapOption::empty(),
            view: AdmissionAtomics::default(),
            standby: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }

    /// Marks the engine ready as a good probe would (unit tests).
    #[cfg(test)]
    pub(crate) fn set_ready(&self, on: bool) {
        self.ready.store(on, Ordering::Release);
    }

    /// Gives the engine a latency profile as a fetch would (unit tests).
    #[cfg(test)]
    pub(crate) fn set_profile(&self, p: LatencyProfile) {
        self.store_profile(p);
    }

    pub(super) fn store_profile(&self, p: LatencyProfile) {
        self.profile.store(Some(Arc::new(p)));
        self.view.has_profile.store(true, Ordering::Release);
    }

    pub(super) fn store_report(&self, report: Option<LoadReport>) {
        let v = &self.view;
        let (batch, free, low, page) = report.as_ref().map_or((1, 0, 0, 0), |r| {
            (r.batch_target, r.kv_pages_free, r.kv_low_watermark_pages, r.kv_page_tokens)
        });
        v.batch_target.store(batch, Ordering::Relaxed);
        v.kv_pages_free.store(free, Ordering::Relaxed);
        v.kv_low_watermark_pages.store(low, Ordering::Relaxed);
        v.kv_page_tokens.store(page, Ordering::Relaxed);
        self.last_report.store(report.map(Arc::new));
    }

    /// What admission needs of the last report and the profile, read from
    /// atomics; `None` until the profile is known.
    pub fn admission_view(&self) -> Option<AdmissionView> {
        let v = &self.view;
        if !v.has_profile.load(Ordering::Acquire) {
            return None;
        }
        Some(AdmissionView {
            class: Some(v.class.load(Ordering::Relaxed)).filter(|c| *c != usize::MAX),
            batch_target: v.batch_target.load(Ordering::Relaxed),
            kv_pages_free: v.kv_pages_free.load(Ordering::Relaxed),
            kv_low_watermark_pages: v.kv_low_watermark_pages.load(Ordering::Relaxed),
            kv_page_tokens: v.kv_page_tokens.load(Ordering::Relaxed),
        })
    }

    /// Remembers the admission class of this engine's profile.
    pub fn set_admission_class(&self, class: usize) {
        self.view.class.store(class, Ordering::Relaxed);
    }

    /// Ready and neither warm standby nor draining: new work may go here.
    pub fn routable(&self) -> bool {
        self.is_ready() && !self.is_standby() && !self.is_draining() && !self.is_retired()
    }

    /// Whether requests for `model` (a policy model id) may come here;
    /// `upstream_only`: requests only third-party engines may serve.
    pub fn serves(&self, model: &str, upstream_only: bool) -> bool {
        if upstream_only && self.spec.kind != super::EngineKind::Openai {
            return false;
        }
        let models = &self.spec.upstream.models;
        if !models.is_empty() {
            return models.iter().any(|m| m == model);
        }
        if self.spec.upstream.discover_models {
            // Until the first listing: nothing (the engine is not ready yet).
            return self.discovered_models.load().as_ref().is_some_and(|d| d.iter().any(|m| m == model));
        }
        true
    }

    /// Routable and able to run video sessions (this project's engines
    /// only: third-party servers serve text).
    pub fn routable_for_video(&self) -> bool {
        self.routable() && self.spec.kind == super::EngineKind::Native
    }

    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::Acquire)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Puts the engine in (or takes it out of) the warm pool.
    pub fn set_standby(&self, on: bool) {
        self.standby.store(on, Ordering::Release);
    }

    /// Starts (or cancels) draining: routing stops sending it work.
    pub fn set_draining(&self, on: bool) {
        self.draining.store(on, Ordering::Release);
    }

    /// The credential an `openai` engine is sent, if it has one.
    pub fn upstream_key(&self) -> Option<&http::HeaderValue> {
        self.upstream_key.as_ref()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// The gateway's count of sequences on this engine.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    /// Sequences of a class strictly below `class` this gateway has
    /// running or prefilling here (those leased with a class), and 0 for an
    /// engine that cannot pause sequences (third-party ones).
    pub fn active_below(&self, class: u32) -> u32 {
        if self.spec.kind != super::EngineKind::Native {
            return 0;
        }
        let classes = self.classes.lock().unwrap_or_else(|p| p.into_inner());
        classes.iter().filter(|(c, _)| *c < class).map(|(_, n)| n).sum()
    }

    /// One more (`+1`) or one fewer (`-1`) sequence of `class` here.
    pub(super) fn count_class(&self, class: u32, delta: i32) {
        let mut classes = self.classes.lock().unwrap_or_else(|p| p.into_inner());
        match classes.iter().position(|(c, _)| *c == class) {
            Some(i) => {
                classes[i].1 = classes[i].1.saturating_add_signed(delta);
                if classes[i].1 == 0 {
                    classes.swap_remove(i);
                }
            }
            None if delta > 0 => classes.push((class, delta.unsigned_abs())),
            None => {}
        }
    }

    /// Prompt plus output budget of what this gateway has running or
    /// prefilling here.
    pub fn inflight_tokens(&self) -> u64 {
        self.inflight_tokens.load(Ordering::Acquire)
    }

    pub fn active_out_tokens(&self) -> u64 {
        self.active_out.load(Ordering::Acquire)
    }

    pub fn prefill_backlog_tokens(&self) -> u64 {
        self.prefill_backlog.load(Ordering::Acquire)
    }

    /// KV tokens this gateway has sent since the last load report was asked
    /// for (the report's free pages do not include them yet).
    pub fn leased_since_report(&self) -> u64 {
        self.leased_total
            .load(Ordering::Acquire)
            .saturating_sub(self.leased_at_report.load(Ordering::Acquire))
    }

    /// The decode step time the engine last reported, ms (no report copy:
    /// read on every streamed request).
    pub fn decode_step_ms(&self) -> Option<f64> {
        self.last_report.load().as_ref().map(|r| r.decode_step_ms)
    }

    /// The latest load report, if the last probe got one.
    pub fn report(&self) -> Option<Arc<LoadReport>> {
        self.last_report.load_full()
    }

    pub fn profile(&self) -> Option<Arc<LatencyProfile>> {
        self.profile.load_full()
    }
}

/// The numbers admission reads of an engine per decision (from its last
/// load report and its profile), without touching either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionView {
    /// The admission class of its profile, once admission assigned one.
    pub class: Option<usize>,
    pub batch_target: u32,
    pub kv_pages_free: u32,
    pub kv_low_watermark_pages: u32,
    pub kv_page_tokens: u32,
}

#[derive(Debug)]
struct AdmissionAtomics {
    has_profile: AtomicBool,
    class: AtomicUsize,
    batch_target: AtomicU32,
    kv_pages_free: AtomicU32,
    kv_low_watermark_pages: AtomicU32,
    kv_page_tokens: AtomicU32,
}

impl Default for AdmissionAtomics {
    fn default() -> Self {
        Self {
            has_profile: AtomicBool::new(false),
            class: AtomicUsize::new(usize::MAX),
            batch_target: AtomicU32::new(1),
            kv_pages_free: AtomicU32::new(0),
            kv_low_watermark_pages: AtomicU32::new(0),
            kv_page_tokens: AtomicU32::new(0),
        }
    }
}
