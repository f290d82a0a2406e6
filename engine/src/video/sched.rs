//! The video session scheduler: one task owns every session of the engine;
//! the HTTP handlers send it commands.
//!
//! Between batches it takes commands; then it forms the next coalesced
//! batch from the waiting chunk requests, lowest ordering key first (one
//! chunk per stream, at most `max_batch`), makes each member resident in
//! the state arena (resuming it from host memory, and suspending the
//! highest-credit resident outside the batch when the arena is full), and
//! runs the batch: the `cpu` backend steps every member's denoising step k
//! together (step by step, members in parallel), the `emulated` backend
//! waits the profile's batch time. States go back to their sessions; each
//! request gets its chunk.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policies::video::VideoProfile;
use tokio::sync::{mpsc, oneshot};

use super::batch::{placeholder_frames, run_cpu_batch, run_gpu_batch};
use super::model::{Resolution, StreamState, VideoModel};
use super::state::{self, Kv, Meta, Version};

mod arena;
mod plane;
mod steps;
use super::{ChunkOut, ChunkRequest, CreateSession, VideoError, VideoLoad};
use crate::backend::BackendKind;
use crate::gpu::video::VideoRunner;
use engine_api::video::RECENT_CHUNKS;

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct VideoConfig {
    pub backend: BackendKind,
    pub profile: VideoProfile,
    /// Streams whose state may be resident at once (the state arena).
    pub arena_slots: u32,
    /// Most chunks in one coalesced batch.
    pub max_batch: u32,
    /// cpu backend: chunks computed in parallel within a step.
    pub threads: usize,
    pub model_seed: u64,
    /// cuda backend: where batches run.
    pub gpu: Option<Arc<dyn VideoRunner>>,
    /// Bytes of each session's paged KV window (`--video-state-mib`; 0:
    /// none): what a migration moves besides the model state.
    pub state_bytes: usize,
}

impl std::fmt::Debug for dyn VideoRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VideoRunner({})", self.device_name())
    }
}

/// Where a session's state is.
#[derive(Debug)]
enum Place {
    Resident(StreamState),
    /// Serialised to host memory; its arena slot is free.
    Suspended(Vec<u8>),
    /// In the batch that is running.
    Busy,
}

impl Place {
    fn is_busy(&self) -> bool {
        matches!(self, Place::Busy)
    }
}

#[derive(Debug)]
struct Session {
    prompt: String,
    res: Resolution,
    latent_frames: u32,
    epoch: u32,
    place: Place,
    credit: f64,
    kv: Kv,
    /// Chunks of this epoch generated (the next one's index).
    generated: u64,
    /// The last [`RECENT_CHUNKS`] generated, oldest first, answered again
    /// to a request naming one (`ChunkRequest::at`).
    recent: VecDeque<ChunkOut>,
}

/// A copy received from another engine, not yet owned (see `Cmd::Stage`).
struct Staged {
    wire: state::Wire,
    kv: Kv,
    at: Instant,
}

pub(crate) struct Pending {
    pub(crate) id: String,
    pub(crate) req: ChunkRequest,
    reply: oneshot::Sender<Result<ChunkOut, VideoError>>,
    enqueued: Instant,
    /// Denoising steps still to run, once a chunk was preempted part-way
    /// (its progress kept); `None` before it starts.
    steps_left: Option<u32>,
}

mod handle;
use handle::Cmd;
pub use handle::{VideoEngine, COMMAND_QUEUE};

/// Parses and checks an exported session (untrusted input: an import may
/// come from anywhere; see [`state::parse`]). Returns the meta and the
/// model state's bytes.
pub fn parse_export(bytes: &[u8]) -> Result<(Meta, Vec<u8>), VideoError> {
    let wire = state::parse(bytes)?;
    if wire.meta.base.is_some() {
        return Err(VideoError::BadState); // a delta is not a session
    }
    Ok((wire.meta, wire.state_bytes))
}

struct Core {
    model: Arc<VideoModel>,
    cfg: VideoConfig,
    sessions: HashMap<String, Session>,
    /// Copies received from other engines (at most `arena_slots`).
    staged: HashMap<String, Staged>,
    /// Open transfer offers: session → (token, expiry).
    offers: HashMap<String, (String, Instant)>,
    pending: Vec<Pending>,
    load: VideoLoad,
    /// Donations to other engines' SP2 chunks: (until, step ms), at most
    /// `max_batch`.
    lends: Vec<(Instant, f64)>,
}

/// Steps a donated half is spread over (its per-step cost in a batch).
const LEND_STEPS: f64 = 4.0;

/// One member of a running batch.
pub(crate) struct Member {
    pub(crate) pending: Pending,
    pub(crate) state: StreamState,
    pub(crate) res: Resolution,
    pub(crate) latent_frames: u32,
}

impl Core {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        loop {
            if self.pending.is_empty() {
                match rx.recv().await {
                    Some(c) => self.command(c),
                    None => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.command(c);
            }
            let batch = self.form_batch();
            if batch.is_empty() {
                continue;
            }
            if self.cfg.backend == BackendKind::Emulated {
                self.run_steps(batch, &mut rx).await;
                continue;
            }
            let started = crate::clock::now();
            let members = self.execute(batch).await;
            let compute_ms = crate::clock::since(started).as_secs_f64() * 1e3;
            self.load.batches += 1;
            let size = members.len() as u32;
            ::metrics::histogram!(crate::metrics::VIDEO_BATCH).record(f64::from(size));
            for (m, frames) in members {
                self.complete(m, frames, size, started, compute_ms);
            }
        }
    }

    /// A member's chunk is done: its state goes back to its session and the
    /// request gets the chunk.
    fn complete(&mut self, m: Member, frames: Vec<String>, size: u32, started: Instant, compute_ms: f64) {
        let out = ChunkOut {
            index: m.state.chunks - 1,
            epoch: m.pending.req.epoch,
            fidelity: m.pending.req.fidelity,
            batch: size,
            queue_ms: (started.max(m.pending.enqueued) - m.pending.enqueued).as_secs_f64() * 1e3,
            compute_ms,
            frames,
            replayed: false,
        };
        if let Some(s) = self.sessions.get_mut(&m.pending.id) {
            s.kv.advance(m.state.chunks);
            s.generated = m.state.chunks;
            if s.recent.len() == RECENT_CHUNKS {
                s.recent.pop_front();
            }
            s.recent.push_back(out.clone());
            s.place = Place::Resident(m.state);
        }
        self.load.chunks += 1;
        let _ = m.pending.reply.send(Ok(out));
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::Create(c, reply) => {
                let _ = reply.send(self.create(c));
            }
            Cmd::Chunk(id, req, reply) => self.enqueue(id, req, reply),
            Cmd::Prompt(id, prompt, reply) => {
                let _ = reply.send(self.set_prompt(id, prompt));
            }
            Cmd::Suspend(id, reply) => {
                let _ = reply.send(self.suspend(&id));
            }
            Cmd::Resume(id, reply) => {
                let _ = reply.send(self.resume(&id, &[]).map(|_| ()));
            }
            Cmd::Export(id, reply) => {
                let _ = reply.send(self.export(&id));
            }
            Cmd::Import(id, bytes, reply) => {
                let _ = reply.send(self.import(id, &bytes));
            }
            Cmd::State(id, reply) => {
                let result = match self.sessions.get(&id).map(|s| &s.place) {
                    None => Err(VideoError::NoSession(id)),
                    Some(Place::Resident(st)) => Ok(st.to_bytes()),
                    Some(Place::Suspended(b)) => Ok(b.clone()),
                    Some(Place::Busy) => Err(VideoError::BadState),
                };
                let _ = reply.send(result);
            }
            Cmd::End(id, reply) => {
                let result = self.sessions.remove(&id).map(|_| ()).ok_or(VideoError::NoSession(id.clone()));
                self.forget_on_gpu(&id);
                self.fail_pending(&id);
                let _ = reply.send(result);
            }
            Cmd::Offer(id, token, reply) => {
                let _ = reply.send(self.offer(id, token));
            }
            Cmd::Snapshot(id, token, since, reply) => {
                let _ = reply.send(self.snapshot(&id, &token, since));
            }
            Cmd::Stage(id, bytes, reply) => {
                let _ = reply.send(self.stage(id, &bytes));
            }
            Cmd::Commit(id, delta, reply) => {
                let _ = reply.send(self.commit(id, &delta));
            }
            Cmd::Unstage(id, reply) => {
                let _ = reply.send(self.staged.remove(&id).map(|_| ()).ok_or(VideoError::NoSession(id)));
            }
            Cmd::Adopt(id, reply) => {
                let _ = reply.send(self.adopt(id));
            }
            Cmd::Lend(ms, reply) => {
                self.lend(ms);
                let _ = reply.send(Ok(()));
            }
            Cmd::Load(reply) => {
                let _ = reply.send(self.load());
            }
        }
    }

    fn create(&mut self, c: CreateSession) -> Result<(), VideoError> {
        if self.sessions.contains_key(&c.id) {
            return Err(VideoError::Exists(c.id));
        }
        let session = Session {
            place: Place::Resident(StreamState::new(&c.prompt)),
            prompt: c.prompt,
            res: c.resolution,
            latent_frames: c.latent_frames.max(1),
            epoch: 0,
            credit: 0.0,
            kv: Kv::new(self.cfg.state_bytes),
            generated: 0,
            recent: VecDeque::new(),
        };
        self.insert(c.id, session);
        Ok(())
    }

    /// Queues a chunk request of session `id`, or answers why not.
    fn enqueue(
        &mut self,
        id: String,
        req: ChunkRequest,
        reply: oneshot::Sender<Result<ChunkOut, VideoError>>,
    ) {
        let under_way = self.pending.iter().any(|p| p.id == id);
        let refused = match self.sessions.get_mut(&id) {
            None => Some(VideoError::NoSession(id.clone())),
            Some(_) if !(1..=2).contains(&req.sp) => Some(VideoError::BadSp(req.sp)),
            Some(s) if s.epoch != req.epoch => {
                Some(VideoError::StaleEpoch { got: req.epoch, current: s.epoch })
            }
            Some(s) if req.at.is_some_and(|at| at != s.generated || under_way || s.place.is_busy()) => {
                let at = req.at.unwrap_or_default();
                let kept = s.recent.iter().find(|c| c.index == at && c.epoch == req.epoch);
                let result = match kept {
                    Some(c) => Ok(ChunkOut { replayed: true, ..c.clone() }),
                    None if at >= s.generated => Err(VideoError::ChunkInFlight { at }),
                    None => Err(VideoError::ChunkGone { at, generated: s.generated, kept: s.recent.len() }),
                };
                let _ = reply.send(result);
                return;
            }
            Some(_) if self.cfg.profile.point(&req.fidelity).is_none() => {
                Some(VideoError::UnknownFidelity(req.fidelity.to_string()))
            }
            Some(s) => {
                s.credit = req.credit;
                None
            }
        };
        match refused {
            Some(e) => {
                let _ = reply.send(Err(e));
            }
            None => {
                self.pending.push(Pending { id, req, reply, enqueued: crate::clock::now(), steps_left: None })
            }
        }
    }

    /// A new prompt for session `id`: a new epoch, its state restarted, and
    /// the chunks queued for the old prompt answered `StaleEpoch`.
    fn set_prompt(&mut self, id: String, prompt: String) -> Result<u32, VideoError> {
        let result = match self.sessions.get_mut(&id) {
            None => Err(VideoError::NoSession(id.clone())),
            Some(s) => {
                s.epoch += 1;
                s.generated = 0;
                s.recent.clear();
                s.place = match s.place {
                    Place::Suspended(_) => Place::Suspended(StreamState::new(&prompt).to_bytes()),
                    _ => Place::Resident(StreamState::new(&prompt)),
                };
                s.prompt = prompt;
                Ok(s.epoch)
            }
        };
        if result.is_ok() {
            self.forget_on_gpu(&id);
        }
        let (stale, keep): (Vec<Pending>, Vec<Pending>) = self
            .pending
            .drain(..)
            .partition(|p| p.id == id && result.as_ref().is_ok_and(|e| p.req.epoch < *e));
        self.pending = keep;
        for p in stale {
            let current = *result.as_ref().unwrap_or(&0);
            let _ = p.reply.send(Err(VideoError::StaleEpoch { got: p.req.epoch, current }));
        }
        result
    }

    /// Lends `ms` of compute to a peer's SP chunk (at most `max_batch`
    /// lends at once, each at most a minute).
    fn lend(&mut self, ms: f64) {
        let now = crate::clock::now();
        self.lends.retain(|(until, _)| *until > now);
        if self.lends.len() < self.cfg.max_batch as usize {
            let ms = ms.clamp(0.0, 60_000.0);
            self.lends.push((now + Duration::from_secs_f64(ms / 1e3), ms / LEND_STEPS));
            self.load.lends += 1;
        }
    }

    fn load(&self) -> VideoLoad {
        let mut load = self.load.clone();
        load.sessions = self.sessions.len() as u32;
        load.resident = self.resident();
        load.suspended = load.sessions - load.resident;
        load.arena_slots = self.cfg.arena_slots;
        load.queued_chunks = self.pending.len() as u32;
        load
    }

    fn fail_pending(&mut self, id: &str) {
        let (gone, keep): (Vec<Pending>, Vec<Pending>) = self.pending.drain(..).partition(|p| p.id == id);
        self.pending = keep;
        for p in gone {
            let _ = p.reply.send(Err(VideoError::NoSession(id.to_string())));
        }
    }

    /// The next batch: lowest key first, one chunk per stream, every member
    /// resident (states taken out of their sessions).
    fn form_batch(&mut self) -> Vec<Member> {
        self.pending.sort_by(|a, b| a.req.key.total_cmp(&b.req.key));
        let mut members: Vec<Member> = Vec::new();
        let mut rest = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            if members.len() >= self.cfg.max_batch as usize {
                rest.push(p);
                continue;
            }
            let chosen: Vec<String> = members.iter().map(|m| m.pending.id.clone()).collect();
            match self.take_member(p, &chosen) {
                Ok(m) => members.push(m),
                Err(p) => rest.push(p),
            }
        }
        self.pending = rest;
        members
    }

    /// Makes `p`'s session resident (suspending another outside `chosen`
    /// if the arena is full) and takes its state for a batch; gives `p`
    /// back when it cannot run now.
    fn take_member(&mut self, p: Pending, chosen: &[String]) -> Result<Member, Pending> {
        if chosen.contains(&p.id) {
            return Err(p);
        }
        let mut keep = chosen.to_vec();
        keep.push(p.id.clone());
        if !matches!(self.resume(&p.id, &keep), Ok(true)) {
            return Err(p);
        }
        let s = self.sessions.get_mut(&p.id).expect("resumed above");
        match std::mem::replace(&mut s.place, Place::Busy) {
            Place::Resident(state) => {
                Ok(Member { res: s.res, latent_frames: s.latent_frames, state, pending: p })
            }
            other => {
                s.place = other;
                Err(p)
            }
        }
    }

    /// Runs a batch; returns each member with its frames (PNG, base64).
    async fn execute(&self, mut members: Vec<Member>) -> Vec<(Member, Vec<String>)> {
        match self.cfg.backend {
            BackendKind::Emulated => {
                let times: Vec<f64> = members
                    .iter()
                    .map(|m| self.cfg.profile.point(&m.pending.req.fidelity).map_or(0.0, |p| p.chunk_ms))
                    .collect();
                let max = times.iter().copied().fold(0.0, f64::max);
                let total = max + self.cfg.profile.batch_cost * (times.iter().sum::<f64>() - max);
                tokio::time::sleep(Duration::from_secs_f64(total / 1e3)).await;
                members
                    .into_iter()
                    .map(|mut m| {
                        m.state.chunks += 1;
                        let frames = placeholder_frames(&m.state, m.res, m.latent_frames);
                        (m, frames)
                    })
                    .collect()
            }
            BackendKind::Cuda if self.cfg.gpu.is_some() => {
                let (model, gpu) = (Arc::clone(&self.model), self.cfg.gpu.clone().expect("checked"));
                let threads = self.cfg.threads.max(1);
                let job = tokio::task::spawn_blocking(move || {
                    let frames = run_gpu_batch(&*gpu, &model, &mut members, threads);
                    members.into_iter().zip(frames).collect::<Vec<_>>()
                });
                job.await.expect("the video batch does not panic")
            }
            BackendKind::Cpu | BackendKind::Cuda => {
                let model = Arc::clone(&self.model);
                let threads = self.cfg.threads.max(1);
                let job = tokio::task::spawn_blocking(move || {
                    let frames = run_cpu_batch(&model, &mut members, threads);
                    members.into_iter().zip(frames).collect::<Vec<_>>()
                });
                job.await.expect("the video batch does not panic")
            }
        }
    }
}
