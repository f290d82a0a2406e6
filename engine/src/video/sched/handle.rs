//! The handle to the video scheduler: one command per call, each answered
//! on its own oneshot, through a bounded queue.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::*;

pub(super) type Reply<T> = oneshot::Sender<Result<T, VideoError>>;

pub(super) enum Cmd {
    Create(CreateSession, Reply<()>),
    Chunk(String, ChunkRequest, oneshot::Sender<Result<ChunkOut, VideoError>>),
    Prompt(String, String, Reply<u32>),
    Suspend(String, Reply<()>),
    Resume(String, Reply<()>),
    Export(String, Reply<Vec<u8>>),
    Import(String, Vec<u8>, Reply<()>),
    State(String, Reply<Vec<u8>>),
    End(String, Reply<()>),
    Load(oneshot::Sender<VideoLoad>),
    /// Source: allow `token` to fetch the session; answers its version.
    Offer(String, String, Reply<Version>),
    /// Source: the session's wire form for an offered token: all of it, or
    /// what changed since a version. The session stays here.
    Snapshot(String, String, Option<Version>, Reply<Vec<u8>>),
    /// Target: keep a full copy aside (no chunks run on it).
    Stage(String, Vec<u8>, Reply<Version>),
    /// Target: apply the final delta to the staged copy and own the
    /// session.
    Commit(String, Vec<u8>, Reply<()>),
    /// Target: drop a staged copy.
    Unstage(String, Reply<()>),
    /// Target: own the staged copy as it is (its source is gone: the
    /// session resumes from the last state the source offloaded).
    Adopt(String, Reply<Version>),
    /// Donor: run another engine's SP2 half for this many ms (elastic SP,
    /// emulated): a batch slot and its coalescing cost.
    Lend(f64, Reply<()>),
}

/// Commands the video scheduler holds queued at most. Every caller waits
/// for its command's reply, so each has at most one queued; the callers are
/// the engine's HTTP requests (bounded by `--max-connections` × the streams
/// per connection) and its load reports. When more wait than this, a
/// caller waits for room (its request's own deadline bounds that), so the
/// queue's memory is bounded whatever the callers do.
pub const COMMAND_QUEUE: usize = 256;

/// Handle to the video scheduler; cheap to clone.
#[derive(Debug, Clone)]
pub struct VideoEngine {
    tx: mpsc::Sender<Cmd>,
    pub profile: Arc<VideoProfile>,
}

impl VideoEngine {
    pub fn spawn(cfg: VideoConfig) -> Self {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let profile = Arc::new(cfg.profile.clone());
        let core = Core {
            model: Arc::new(VideoModel::new(cfg.model_seed)),
            cfg,
            sessions: HashMap::new(),
            staged: HashMap::new(),
            offers: HashMap::new(),
            lends: Vec::new(),
            pending: Vec::new(),
            load: VideoLoad::default(),
        };
        tokio::spawn(core.run(rx));
        Self { tx, profile }
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, VideoError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.map_err(|_| VideoError::Stopped)?;
        rx.await.unwrap_or(Err(VideoError::Stopped))
    }

    pub async fn create(&self, c: CreateSession) -> Result<(), VideoError> {
        self.call(|r| Cmd::Create(c, r)).await
    }

    /// Queues the session's next chunk; resolves when it is generated.
    pub async fn chunk(&self, id: &str, req: ChunkRequest) -> Result<ChunkOut, VideoError> {
        self.call(|r| Cmd::Chunk(id.to_string(), req, r)).await
    }

    /// A prompt switch: a new epoch with fresh state; returns the epoch.
    pub async fn prompt(&self, id: &str, prompt: String) -> Result<u32, VideoError> {
        self.call(|r| Cmd::Prompt(id.to_string(), prompt, r)).await
    }

    pub async fn suspend(&self, id: &str) -> Result<(), VideoError> {
        self.call(|r| Cmd::Suspend(id.to_string(), r)).await
    }

    pub async fn resume(&self, id: &str) -> Result<(), VideoError> {
        self.call(|r| Cmd::Resume(id.to_string(), r)).await
    }

    /// Removes the session and returns it serialised (for migration).
    pub async fn export(&self, id: &str) -> Result<Vec<u8>, VideoError> {
        self.call(|r| Cmd::Export(id.to_string(), r)).await
    }

    pub async fn import(&self, id: &str, bytes: Vec<u8>) -> Result<(), VideoError> {
        self.call(|r| Cmd::Import(id.to_string(), bytes, r)).await
    }

    /// The model state's exact bytes, wherever it is (resident or suspended).
    pub async fn state(&self, id: &str) -> Result<Vec<u8>, VideoError> {
        self.call(|r| Cmd::State(id.to_string(), r)).await
    }

    pub async fn end(&self, id: &str) -> Result<(), VideoError> {
        self.call(|r| Cmd::End(id.to_string(), r)).await
    }

    pub async fn offer(&self, id: &str, token: String) -> Result<Version, VideoError> {
        self.call(|r| Cmd::Offer(id.to_string(), token, r)).await
    }

    pub async fn snapshot(
        &self,
        id: &str,
        token: String,
        since: Option<Version>,
    ) -> Result<Vec<u8>, VideoError> {
        self.call(|r| Cmd::Snapshot(id.to_string(), token, since, r)).await
    }

    pub async fn stage(&self, id: &str, bytes: Vec<u8>) -> Result<Version, VideoError> {
        self.call(|r| Cmd::Stage(id.to_string(), bytes, r)).await
    }

    pub async fn commit(&self, id: &str, delta: Vec<u8>) -> Result<(), VideoError> {
        self.call(|r| Cmd::Commit(id.to_string(), delta, r)).await
    }

    pub async fn unstage(&self, id: &str) -> Result<(), VideoError> {
        self.call(|r| Cmd::Unstage(id.to_string(), r)).await
    }

    /// Owns the staged copy without a final delta; answers its version.
    pub async fn adopt(&self, id: &str) -> Result<Version, VideoError> {
        self.call(|r| Cmd::Adopt(id.to_string(), r)).await
    }

    /// The staged copy's version, if one is kept.
    pub async fn staged(&self, id: &str) -> Option<Version> {
        // A zero-length stage is refused: used only to read the version.
        self.call(|r| Cmd::Stage(id.to_string(), Vec::new(), r)).await.ok()
    }

    /// Donates `ms` of this engine to another's sequence-parallel chunk.
    pub async fn lend(&self, ms: f64) -> Result<(), VideoError> {
        self.call(|r| Cmd::Lend(ms, r)).await
    }

    pub async fn load(&self) -> VideoLoad {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Load(reply)).await.is_err() {
            return VideoLoad::default();
        }
        rx.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn callers_beyond_the_queue_bound_wait_for_room_and_every_one_is_answered() {
        let profile = VideoProfile::parse("p", crate::VIDEO_PROFILE).unwrap();
        let engine = VideoEngine::spawn(VideoConfig {
            backend: BackendKind::Emulated,
            profile,
            arena_slots: 4,
            max_batch: 4,
            threads: 1,
            model_seed: 0,
            gpu: None,
            state_bytes: 0,
        });
        // Eight times the queue's bound at once: the channel holds at most
        // COMMAND_QUEUE of them, the rest wait to send; none is lost or
        // refused.
        let callers = 8 * COMMAND_QUEUE;
        let tasks: Vec<_> = (0..callers)
            .map(|i| {
                let e = engine.clone();
                tokio::spawn(async move { e.end(&format!("missing-{i}")).await })
            })
            .collect();
        let mut answered = 0;
        for t in tasks {
            assert!(
                matches!(t.await.unwrap(), Err(VideoError::NoSession(_))),
                "an unknown session is refused"
            );
            answered += 1;
        }
        assert_eq!(answered, callers);
        assert_eq!(engine.tx.max_capacity(), COMMAND_QUEUE);
    }
}
