//! Images and whole videos on the engines' GPUs (GenServe, issue 24).
//!
//! The native engines form one GPU pool ([`policies::diffusion::Pool`]),
//! owned by one driver task: requests and engine results arrive as
//! messages, and after each the pool's scheduler (the policy's
//! `[diffusion]` mode) decides what starts where; tasks carry each action
//! out on the engines (`/engine/v1/diffusion/…`) and report back. Image
//! requests wait for their PNGs; a video is a job the client polls
//! (`/v1/videos`), kept for `result_ttl_s` once done. Every job belongs to
//! the tenant that made it: another key gets 404.
//!
//! The pool's GPUs are the native engines routable when the first job
//! arrives; the set is rebuilt when the pool is idle and it changed (an
//! engine that leaves mid-job fails that job's next call: the job fails
//! with the engine's error, never silently).

mod driver;
mod form;
pub mod routes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::engines::EnginePool;
use crate::error::{ApiError, Overload};
use crate::reload::PolicyStore;
use policies::diffusion::RefuseReason;

/// Messages the driver takes at once before a sender waits.
const INBOX: usize = 1024;
/// How long an API request waits for room in a full inbox before a 503
/// `queue_full` (the driver's own completions always wait: none is lost).
const INBOX_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Video records kept (live and finished) across all tenants.
const MAX_RECORDS: usize = 4096;

/// Where a video job stands, as the API reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoStatus {
    /// `queued`, `in_progress`, `completed`, `failed`.
    pub status: &'static str,
    pub progress: u32,
    pub completed_at: Option<u64>,
    /// Unix milliseconds (not in OpenAI's object; load tests measure with it).
    pub completed_at_ms: Option<u64>,
    pub error: Option<(String, String)>,
    pub content: Option<Bytes>,
    /// Gateway clock (ms) when it finished, for the TTL.
    pub finished_ms: Option<f64>,
}

/// One video job.
#[derive(Debug)]
pub struct VideoRecord {
    pub id: String,
    pub tenant: String,
    pub model: String,
    pub prompt: String,
    pub size: String,
    pub seconds: u32,
    pub created_at: u64,
    pub state: Mutex<VideoStatus>,
}

impl VideoStatus {
    /// A job just accepted.
    pub fn queued() -> Self {
        VideoStatus {
            status: "queued",
            progress: 0,
            completed_at: None,
            completed_at_ms: None,
            error: None,
            content: None,
            finished_ms: None,
        }
    }
}

impl VideoRecord {
    pub fn status(&self) -> VideoStatus {
        self.state.lock().expect("video lock").clone()
    }

    /// The OpenAI video object.
    pub fn object(&self, ttl_s: u64) -> serde_json::Value {
        let s = self.status();
        json!({
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": s.status,
            "progress": s.progress,
            "created_at": self.created_at,
            "completed_at": s.completed_at,
            "completed_at_ms": s.completed_at_ms,
            "expires_at": s.completed_at.map(|c| c + ttl_s),
            "error": s.error.as_ref().map(|(code, message)| json!({"code": code, "message": message})),
            "prompt": self.prompt,
            "seconds": self.seconds.to_string(),
            "size": self.size,
            "remixed_from_video_id": null,
        })
    }

    fn update(&self, f: impl FnOnce(&mut VideoStatus)) {
        f(&mut self.state.lock().expect("video lock"));
    }
}

/// A request's deadline: explicit (`x-slo-e2e-ms`) or σ × solo latency.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Due {
    In(f64),
    Scale(f64),
}

/// What the routes ask the driver.
pub(crate) enum Msg {
    Images {
        size: String,
        prompts: Vec<String>,
        due: Due,
        reply: oneshot::Sender<Result<ImagesDone, ApiError>>,
    },
    Video {
        record: Arc<VideoRecord>,
        due: Due,
        reply: oneshot::Sender<Result<f64, ApiError>>,
    },
    Cancel(String),
    Done(driver::Done),
}

/// An images request's answer: base64 PNGs and the prediction it was
/// admitted with.
#[derive(Debug)]
pub struct ImagesDone {
    pub images: Vec<String>,
    pub predicted_ms: f64,
}

/// The images and videos service.
#[derive(Debug)]
pub struct Diffusion {
    engines: Arc<EnginePool>,
    tx: mpsc::Sender<Msg>,
    rx: Mutex<Option<mpsc::Receiver<Msg>>>,
    videos: Mutex<HashMap<String, Arc<VideoRecord>>>,
    started: std::time::Instant,
}

impl Diffusion {
    pub fn new(engines: Arc<EnginePool>) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(INBOX);
        Arc::new(Self {
            engines,
            tx,
            rx: Mutex::new(Some(rx)),
            videos: Mutex::new(HashMap::new()),
            started: crate::clock::now(),
        })
    }

    /// Milliseconds on the gateway's clock (the pool's time).
    pub fn now_ms(&self) -> f64 {
        crate::clock::since(self.started).as_secs_f64() * 1000.0
    }

    /// Starts the driver on first use.
    fn ensure_driver(self: &Arc<Self>, policies: &Arc<PolicyStore>) {
        if let Some(rx) = self.rx.lock().expect("rx lock").take() {
            tokio::spawn(driver::drive(Arc::clone(self), rx, Arc::clone(policies)));
        }
    }

    pub(crate) async fn send(
        self: &Arc<Self>,
        policies: &Arc<PolicyStore>,
        msg: Msg,
    ) -> Result<(), ApiError> {
        self.ensure_driver(policies);
        match tokio::time::timeout(INBOX_WAIT, self.tx.send(msg)).await {
            Ok(sent) => {
                sent.map_err(|_| ApiError::EngineFailed("the diffusion scheduler has stopped".into()))
            }
            Err(_) => Err(ApiError::Overloaded {
                reason: Overload::Diffusion(RefuseReason::QueueFull),
                message: format!("the image and video scheduler is {INBOX} messages behind; retry later"),
                retry_after_s: 2,
            }),
        }
    }

    /// The tenant's video `id` (404 for anyone else, or once expired).
    pub fn video(&self, id: &str, tenant: &str, ttl_s: u64) -> Option<Arc<VideoRecord>> {
        let now = self.now_ms();
        let mut videos = self.videos.lock().expect("videos lock");
        let expired =
            |r: &VideoRecord| r.status().finished_ms.is_some_and(|f| now - f > ttl_s as f64 * 1000.0);
        videos.retain(|_, r| !expired(r));
        videos.get(id).filter(|r| r.tenant == tenant).cloned()
    }

    /// The tenant's videos, newest first (at most `limit`).
    pub fn list(&self, tenant: &str, limit: usize) -> Vec<Arc<VideoRecord>> {
        let videos = self.videos.lock().expect("videos lock");
        let mut mine: Vec<_> = videos.values().filter(|r| r.tenant == tenant).cloned().collect();
        mine.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        mine.truncate(limit);
        mine
    }

    /// Keeps a new record; the oldest finished ones make room.
    fn insert(&self, record: Arc<VideoRecord>) -> Result<(), ApiError> {
        let mut videos = self.videos.lock().expect("videos lock");
        if videos.len() >= MAX_RECORDS {
            let oldest = videos
                .values()
                .filter_map(|r| r.status().finished_ms.map(|f| (f, r.id.clone())))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            match oldest {
                Some((_, id)) => {
                    videos.remove(&id);
                }
                None => {
                    return Err(ApiError::Overloaded {
                        reason: Overload::Diffusion(RefuseReason::QueueFull),
                        message: format!("{MAX_RECORDS} video jobs are unfinished; retry later"),
                        retry_after_s: 5,
                    })
                }
            }
        }
        videos.insert(record.id.clone(), record);
        Ok(())
    }

    fn forget(&self, id: &str) {
        self.videos.lock().expect("videos lock").remove(id);
    }

    /// Jobs and records for `/readyz` detail.
    pub fn detail(&self) -> serde_json::Value {
        let videos = self.videos.lock().expect("videos lock");
        let live = videos.values().filter(|r| r.status().finished_ms.is_none()).count();
        json!({"video_records": videos.len(), "videos_unfinished": live})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: usize) -> Arc<VideoRecord> {
        Arc::new(VideoRecord {
            id: format!("video_{id}"),
            tenant: "t".into(),
            model: "m".into(),
            prompt: "p".into(),
            size: "256x448".into(),
            seconds: 4,
            created_at: id as u64,
            state: Mutex::new(VideoStatus::queued()),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_inbox_answers_queue_full_after_a_bounded_wait() {
        let pool = EnginePool::new(Vec::new(), &crate::limits::Limits::default(), None);
        let d = Diffusion::new(pool);
        // The driver never runs: its receiver is held here, unread.
        let _rx = d.rx.lock().unwrap().take().unwrap();
        for i in 0..INBOX {
            d.tx.try_send(Msg::Cancel(format!("v{i}"))).unwrap();
        }
        let text = include_str!("../../../policies/default.toml");
        let doc = policies::PolicyDocument::parse("default.toml", text).unwrap();
        let store = Arc::new(PolicyStore::new(doc, text, None, None));
        let t = tokio::time::Instant::now();
        let err = d.send(&store, Msg::Cancel("one more".into())).await.unwrap_err();
        assert!(
            matches!(
                err,
                ApiError::Overloaded {
                    reason: Overload::Diffusion(RefuseReason::QueueFull),
                    retry_after_s: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(t.elapsed(), INBOX_WAIT, "the sender waited exactly the bound");
    }

    #[test]
    fn records_are_bounded_and_the_oldest_finished_make_room() {
        let pool = EnginePool::new(Vec::new(), &crate::limits::Limits::default(), None);
        let d = Diffusion::new(pool);
        for i in 0..MAX_RECORDS {
            d.insert(record(i)).unwrap();
        }
        // All unfinished: the next one is refused with a reason and a retry.
        let Err(ApiError::Overloaded { reason, retry_after_s, .. }) = d.insert(record(MAX_RECORDS)) else {
            panic!("the bound holds")
        };
        assert_eq!((reason.code(), retry_after_s), ("queue_full", 5));
        // Two finish; a new record replaces the one that finished first.
        let finish = |id: &str, at: f64| {
            d.videos.lock().unwrap()[id].update(|s| {
                s.status = "completed";
                s.finished_ms = Some(at);
            })
        };
        finish("video_7", 20.0);
        finish("video_3", 10.0);
        d.insert(record(MAX_RECORDS)).unwrap();
        let videos = d.videos.lock().unwrap();
        assert_eq!(videos.len(), MAX_RECORDS);
        assert!(!videos.contains_key("video_3") && videos.contains_key("video_7"));
        assert!(videos.contains_key(&format!("video_{MAX_RECORDS}")));
    }
}
