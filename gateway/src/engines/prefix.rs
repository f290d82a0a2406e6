//! Where prompt prefixes are cached, as this gateway knows it (issue 23).
//!
//! One [`PrefixIndex`] (pure, `policies::prefix`) per gateway, fed two ways:
//!
//! - **approximate**: every prompt dispatched to an engine is recorded
//!   there ([`PrefixView::record`]), so the next prompt with the same
//!   prefix follows it at once, and engines without events (third-party
//!   ones) get affinity too;
//! - **precise**: each probe of a native engine also reads its KV events
//!   (`GET /engine/v1/kv-events?after=N`): blocks stored and evicted, in
//!   order. A gap (events the engine no longer keeps), a new epoch (the
//!   engine restarted) or a first read gets a snapshot of every cached
//!   block instead, replacing what the index held for that engine. Several
//!   gateways each keep their own index from the same events.
//!
//! Bounds: the index holds at most `[routing.prefix] index_blocks` blocks;
//! one events answer is read up to [`MAX_EVENTS_BYTES`], at most
//! [`MAX_READS_PER_PROBE`] answers per probe, all within the probe timeout.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use engine_api::KvEvents;
use http_body_util::{BodyExt, Full, Limited};
use policies::prefix::{AffinityConfig, PrefixIndex};

use super::{join, EnginePool};

/// One events answer, read at most this far (a snapshot of a large cache
/// is about 20 bytes a block).
pub const MAX_EVENTS_BYTES: usize = 8 << 20;
/// Answers read per probe when the engine says there are more.
pub const MAX_READS_PER_PROBE: usize = 8;

/// The gateway's prefix index and each engine's place in its event stream.
#[derive(Debug)]
pub struct PrefixView {
    index: Mutex<PrefixIndex>,
    /// Per engine index: (epoch, last sequence number read).
    cursors: Mutex<Vec<Option<(u64, u64)>>>,
    /// The policy's block size and index bound, as last configured.
    block_tokens: AtomicU32,
    capacity: AtomicUsize,
}

impl Default for PrefixView {
    fn default() -> Self {
        let cfg = AffinityConfig::default();
        Self {
            index: Mutex::new(PrefixIndex::new(cfg.index_blocks)),
            cursors: Mutex::new(Vec::new()),
            block_tokens: AtomicU32::new(cfg.block_tokens),
            capacity: AtomicUsize::new(cfg.index_blocks),
        }
    }
}

impl PrefixView {
    fn index(&self) -> std::sync::MutexGuard<'_, PrefixIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies the policy's `[routing.prefix]` (a reload may change it):
    /// a new block size empties the index, whose hashes no longer match.
    pub fn configure(&self, cfg: &AffinityConfig) {
        let bt = self.block_tokens.swap(cfg.block_tokens, Ordering::AcqRel);
        let cap = self.capacity.swap(cfg.index_blocks, Ordering::AcqRel);
        if bt != cfg.block_tokens || cap != cfg.index_blocks {
            *self.index() = PrefixIndex::new(cfg.index_blocks);
            self.cursors.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// For each of `engines` engines, the leading blocks of `hashes` it
    /// holds (empty, without allocating, for a prompt without blocks).
    pub fn matched(&self, hashes: &[u64], engines: usize) -> Vec<u32> {
        if hashes.is_empty() {
            return Vec::new();
        }
        self.index().matched(hashes, engines)
    }

    /// A prompt with these block hashes was sent to engine `idx`.
    pub fn record(&self, idx: usize, hashes: &[u64]) {
        if let (false, Ok(idx)) = (hashes.is_empty(), u16::try_from(idx)) {
            self.index().record(idx, hashes);
        }
    }

    /// Engine `idx` is gone or replaced: nothing is cached there.
    pub fn forget(&self, idx: usize) {
        if let Ok(i) = u16::try_from(idx) {
            self.index().forget_engine(i);
        }
        if let Some(c) = self.cursors.lock().unwrap_or_else(|p| p.into_inner()).get_mut(idx) {
            *c = None;
        }
    }

    /// Folds one events answer of engine `idx` into the index; returns the
    /// sequence number to read after next, or `None` when the answer does
    /// not apply (another block size).
    pub fn apply(&self, idx: usize, ev: &KvEvents) -> Option<u64> {
        let Ok(engine) = u16::try_from(idx) else { return None };
        if ev.page_tokens != self.block_tokens.load(Ordering::Acquire) {
            return None;
        }
        let mut cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        if cursors.len() <= idx {
            cursors.resize(idx + 1, None);
        }
        let mut index = self.index();
        match &ev.snapshot {
            // Nothing logged since the last read: the index already holds
            // what this snapshot says, plus the prompts dispatched since,
            // which wiping would lose. (An engine that has named no page
            // yet answers every read, `after=0`, with an empty snapshot.)
            Some(_) if cursors[idx] == Some((ev.epoch, ev.last_seq)) => {}
            Some(hashes) => {
                index.forget_engine(engine);
                index.record(engine, hashes);
            }
            None => {
                if cursors[idx].is_none_or(|(epoch, _)| epoch != ev.epoch) {
                    return None; // events of an epoch not started from a snapshot
                }
                for e in &ev.events {
                    index.record(engine, &e.stored);
                    for h in &e.evicted {
                        index.remove(engine, *h);
                    }
                }
            }
        }
        cursors[idx] = Some((ev.epoch, ev.last_seq));
        Some(ev.last_seq)
    }

    /// For `/readyz`: blocks indexed, and per engine index the KV-event
    /// sequence number read up to (`null`: none read yet).
    pub fn detail(&self) -> serde_json::Value {
        let blocks = self.index().len();
        let cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        let read: Vec<Option<u64>> = cursors.iter().map(|c| c.map(|(_, seq)| seq)).collect();
        serde_json::json!({"blocks": blocks, "events_read": read})
    }

    /// The sequence number to ask engine `idx` for events after (0: a
    /// snapshot, for a new reader).
    fn after(&self, idx: usize) -> (u64, Option<u64>) {
        let cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        match cursors.get(idx).copied().flatten() {
            Some((epoch, seq)) => (seq, Some(epoch)),
            None => (0, None),
        }
    }
}

impl EnginePool {
    /// Reads native engine `idx`'s KV events into the prefix index (part
    /// of its probe; bounded in bytes and reads).
    pub(super) async fn read_kv_events(&self, idx: usize) {
        let slot = self.slot(idx);
        for _ in 0..MAX_READS_PER_PROBE {
            let (after, epoch) = self.prefix.after(idx);
            let Some(uri) = join(&slot.spec.url, &format!("{}?after={after}", engine_api::KV_EVENTS_PATH))
            else {
                return;
            };
            let Ok(req) = http::Request::get(uri).body(Full::new(Bytes::new())) else { return };
            let Ok(resp) = self.probe_send(req).await else { return };
            if !resp.status().is_success() {
                return; // an engine without the endpoint: the approximate index serves
            }
            let Ok(body) = Limited::new(resp.into_body(), MAX_EVENTS_BYTES).collect().await else { return };
            let Ok(ev) = serde_json::from_slice::<KvEvents>(&body.to_bytes()) else { return };
            if epoch.is_some_and(|e| e != ev.epoch) && ev.snapshot.is_none() {
                // The engine restarted: start over from a snapshot.
                self.prefix.forget(idx);
                continue;
            }
            if self.prefix.apply(idx, &ev).is_none() || !ev.more {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_api::KvEvent;

    fn events(epoch: u64, last_seq: u64, events: Vec<KvEvent>, snapshot: Option<Vec<u64>>) -> KvEvents {
        KvEvents { engine_id: "e".into(), epoch, page_tokens: 16, last_seq, more: false, events, snapshot }
    }

    #[test]
    fn events_move_the_index_and_a_new_epoch_needs_a_snapshot() {
        let v = PrefixView::default();
        let p = [11, 12, 13];
        // Events before any snapshot do not apply.
        assert_eq!(
            v.apply(0, &events(1, 1, vec![KvEvent { seq: 1, stored: p.to_vec(), evicted: vec![] }], None)),
            None
        );
        assert_eq!(v.matched(&p, 2), vec![0, 0]);
        assert_eq!(v.apply(0, &events(1, 1, vec![], Some(p.to_vec()))), Some(1));
        assert_eq!(v.matched(&p, 2), vec![3, 0]);
        assert_eq!(v.after(0), (1, Some(1)));
        // Eviction of the middle block cuts the match there.
        let ev = KvEvent { seq: 2, stored: vec![], evicted: vec![12] };
        assert_eq!(v.apply(0, &events(1, 2, vec![ev], None)), Some(2));
        assert_eq!(v.matched(&p, 2), vec![1, 0]);
        // The same sequence numbers from another epoch (a restarted engine) are ignored.
        let ev = KvEvent { seq: 3, stored: vec![12, 13], evicted: vec![] };
        assert_eq!(v.apply(0, &events(2, 3, vec![ev], None)), None);
        assert_eq!(v.matched(&p, 2), vec![1, 0]);
        // A snapshot replaces what the engine held.
        assert_eq!(v.apply(0, &events(2, 3, vec![], Some(vec![99]))), Some(3));
        assert_eq!(v.matched(&p, 2), vec![0, 0]);
        // Another block size: not this gateway's hashes.
        let mut other = events(2, 4, vec![], Some(p.to_vec()));
        other.page_tokens = 32;
        assert_eq!(v.apply(0, &other), None);
        // A replaced engine starts empty and from a snapshot.
        v.record(1, &p);
        v.forget(1);
        assert_eq!(v.matched(&p, 2), vec![0, 0]);
        assert_eq!(v.after(1), (0, None));
    }

    #[test]
    fn a_snapshot_with_nothing_new_keeps_the_prompts_dispatched_since() {
        let v = PrefixView::default();
        let p = [21, 22];
        // An engine with an empty cache, read before and after a dispatch:
        // its empty snapshots (nothing logged, last_seq 0) keep the record.
        assert_eq!(v.apply(0, &events(1, 0, vec![], Some(vec![]))), Some(0));
        v.record(0, &p);
        assert_eq!(v.apply(0, &events(1, 0, vec![], Some(vec![]))), Some(0));
        assert_eq!(v.matched(&p, 1), vec![2], "the dispatched prompt is still indexed");
        // A snapshot past the cursor (the log moved on) replaces it.
        assert_eq!(v.apply(0, &events(1, 5, vec![], Some(vec![21]))), Some(5));
        assert_eq!(v.matched(&p, 1), vec![1]);
        // So does one of another epoch (a restarted engine), at any seq.
        assert_eq!(v.apply(0, &events(2, 5, vec![], Some(vec![]))), Some(5));
        assert_eq!(v.matched(&p, 1), vec![0]);
    }

    #[test]
    fn a_new_block_size_empties_the_index() {
        let v = PrefixView::default();
        v.record(0, &[1, 2]);
        v.configure(&AffinityConfig::default());
        assert_eq!(v.matched(&[1, 2], 1), vec![2], "same settings: kept");
        v.configure(&AffinityConfig { block_tokens: 32, ..AffinityConfig::default() });
        assert_eq!(v.matched(&[1, 2], 1), vec![0]);
    }
}

#[cfg(test)]
mod read_tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    use super::MAX_EVENTS_BYTES;
    use crate::engines::{EngineConnector, EnginePool, EngineSpec};

    /// An engine on an in-memory pipe: its load report, and `events` at
    /// the KV-events path.
    fn serve(id: &'static str, events: Bytes) -> tokio::io::DuplexStream {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let body = match req.uri().path() {
                engine_api::LOAD_PATH => {
                    Bytes::from(serde_json::to_vec(&crate::testkit::load_report(id)).unwrap())
                }
                engine_api::KV_EVENTS_PATH => events.clone(),
                _ => Bytes::new(),
            };
            let status = if body.is_empty() { StatusCode::NOT_FOUND } else { StatusCode::OK };
            async move { Ok::<_, Infallible>(Response::builder().status(status).body(Full::new(body)).unwrap()) }
        });
        tokio::spawn(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(theirs), service),
        );
        ours
    }

    #[tokio::test]
    async fn an_engine_answering_more_than_the_bound_is_read_no_further() {
        let snapshot = |hashes: Vec<u64>| {
            let ev = engine_api::KvEvents {
                engine_id: "e".into(),
                epoch: 1,
                page_tokens: 16,
                last_seq: 9,
                more: false,
                events: Vec::new(),
                snapshot: Some(hashes),
            };
            Bytes::from(serde_json::to_vec(&ev).unwrap())
        };
        let good = snapshot(vec![1, 2, 3]);
        // Half a million 19-digit hashes: past the 8 MiB bound.
        let huge = snapshot((0..500_000u64).map(|i| u64::MAX - i).collect());
        assert!(huge.len() > MAX_EVENTS_BYTES);
        let dial: crate::engines::connect::Dial = Arc::new(move |uri| match uri.host()? {
            "good.pipe" => Some(serve("good", good.clone())),
            "huge.pipe" => Some(serve("huge", huge.clone())),
            _ => None,
        });
        let connector = EngineConnector::tcp(std::time::Duration::from_secs(1)).with_dial(dial);
        let specs = ["good", "huge"]
            .iter()
            .map(|id| EngineSpec::native(*id, format!("http://{id}.pipe").parse().unwrap()))
            .collect();
        let pool = EnginePool::with_connector(specs, &crate::limits::Limits::default(), None, connector);
        pool.poll_once().await;
        let detail = pool.prefix.detail();
        assert_eq!(detail["blocks"], 3, "only the good engine's snapshot: {detail}");
        assert_eq!(detail["events_read"][0], 9);
        assert!(detail["events_read"][1].is_null(), "the oversized answer is dropped: {detail}");
        assert!(pool.snapshot()[1].is_ready(), "an oversized events answer costs the index, not readiness");
    }
}
