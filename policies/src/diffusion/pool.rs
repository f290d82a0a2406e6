//! The GPU pool as a state machine: jobs arrive, batches and rounds end,
//! and [`Pool::schedule`] turns the scheduler's plan into actions. The
//! gateway drives it with engines' answers, the simulator with computed
//! completion times; both pass `now`.

use std::collections::{BTreeMap, HashSet, VecDeque};

use super::{
    on_time, plan, DiffusionProfile, Gpu, ImageReq, JobKind, Mode, Place, SchedConfig, SizeId, Snapshot,
    VideoReq,
};

/// What one GPU is doing.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuUse {
    Free,
    /// Running an image batch.
    Images,
    /// In a video's SP group for a round (the lead runs; helpers are held).
    Video(u64),
    /// Decoding a finished video (VAE on one GPU).
    Decode(u64),
}

/// Why the pool refuses a job: a closed set, each with its wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// `max_jobs` are unfinished.
    QueueFull,
    /// The deadline is shorter than the job takes even alone on the pool.
    DeadlineInfeasible,
    /// Not on time behind the work ahead of it.
    DeadlineUnmeetable,
}

impl RefuseReason {
    pub fn label(self) -> &'static str {
        match self {
            RefuseReason::QueueFull => "queue_full",
            RefuseReason::DeadlineInfeasible => "deadline_infeasible",
            RefuseReason::DeadlineUnmeetable => "deadline_unmeetable",
        }
    }
}

/// Why a request is refused, and when to try again.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: RefuseReason,
    pub retry_after_ms: f64,
    pub predicted_ms: f64,
}

/// What the executor must do after a decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Run one image batch on `gpu`; call [`Pool::batch_done`] at its end.
    Images { gpu: Gpu, size: SizeId, ids: Vec<u64> },
    /// Run `steps` denoising steps of video `id` on `gpus` (lead first);
    /// `from` is the GPU holding its state when that is not the lead (the
    /// state moves first). Call [`Pool::round_done`] at the round's end.
    Video { id: u64, gpus: Vec<Gpu>, steps: u32, from: Option<Gpu> },
    /// Video `id` paused at a step boundary; its state stays on `home`.
    Pause { id: u64, home: Gpu },
    /// Decode video `id` on `gpu`; call [`Pool::decode_done`] at its end.
    Decode { id: u64, gpu: Gpu },
}

#[derive(Debug, Clone)]
enum VState {
    Waiting(Place),
    Running { gpus: Vec<Gpu>, steps: u32 },
    Decoding { gpu: Gpu },
}

#[derive(Debug, Clone)]
struct VideoJob {
    req: VideoReq,
    state: VState,
    pauses: u32,
    degrees: Vec<u32>,
}

/// Counters the reports read.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PoolStats {
    pub decisions: u64,
    pub pauses: u64,
    pub resumes: u64,
    pub sp_changes: u64,
    pub migrations: u64,
    pub batches: u64,
    pub batched_images: u64,
}

/// The pool's jobs and GPUs.
#[derive(Debug, Clone)]
pub struct Pool {
    gpus: Vec<GpuUse>,
    images: Vec<ImageReq>,
    videos: BTreeMap<u64, VideoJob>,
    cancelled: HashSet<u64>,
    /// The last [`RECENT_IMAGES`] image arrivals (time, size), for the
    /// image reserve.
    recent: VecDeque<(f64, SizeId)>,
    pub stats: PoolStats,
}

/// Image arrivals the reserve's rate is measured over.
const RECENT_IMAGES: usize = 32;
/// Oldest arrival that counts towards the rate, ms.
const RECENT_WINDOW_MS: f64 = 120_000.0;

impl Pool {
    pub fn new(gpus: usize) -> Self {
        Self {
            gpus: vec![GpuUse::Free; gpus],
            images: Vec::new(),
            videos: BTreeMap::new(),
            cancelled: HashSet::new(),
            recent: VecDeque::new(),
            stats: PoolStats::default(),
        }
    }

    pub fn gpus(&self) -> &[GpuUse] {
        &self.gpus
    }

    /// Images waiting and videos not finished.
    pub fn jobs(&self) -> usize {
        self.images.len() + self.videos.len()
    }

    pub fn submit_image(&mut self, req: ImageReq) {
        if self.recent.len() == RECENT_IMAGES {
            self.recent.pop_front();
        }
        self.recent.push_back((req.arrival_ms, req.size));
        self.images.push(req);
    }

    /// GPUs the images arriving now keep busy on average (Little's law:
    /// recent arrival rate × mean solo time), rounded up; 0 without a rate.
    pub fn image_reserve(&self, now_ms: f64, profile: &DiffusionProfile) -> usize {
        let recent: Vec<&(f64, SizeId)> =
            self.recent.iter().filter(|(t, _)| now_ms - t <= RECENT_WINDOW_MS).collect();
        if recent.len() < 2 {
            return 0;
        }
        let span = (now_ms - recent[0].0).max(1.0);
        let rate = recent.len() as f64 / span;
        let mean = recent.iter().map(|(_, s)| profile.image_ms(*s, 1)).sum::<f64>() / recent.len() as f64;
        ((rate * mean).ceil() as usize).min(self.gpus.len())
    }

    pub fn submit_video(&mut self, req: VideoReq) {
        let id = req.id;
        let job = VideoJob { req, state: VState::Waiting(Place::Queued), pauses: 0, degrees: Vec::new() };
        self.videos.insert(id, job);
    }

    /// Ids of the images waiting for a GPU.
    pub fn waiting_images(&self) -> impl Iterator<Item = u64> + '_ {
        self.images.iter().map(|i| i.id)
    }

    /// Steps a video has left, and how often it was paused (`None` once done).
    pub fn video_progress(&self, id: u64) -> Option<(u32, u32)> {
        self.videos.get(&id).map(|v| (v.req.steps_left, v.pauses))
    }

    /// Whether a new job due at `deadline_ms` can be admitted: its finish
    /// predicted from the work due no later than it spread over the pool
    /// (preemption and SP make this a fair estimate: earlier deadlines go
    /// first), plus its fastest solo time. `Ok` carries the prediction.
    pub fn admit(
        &self,
        job: &JobKind,
        now_ms: f64,
        deadline_ms: f64,
        profile: &DiffusionProfile,
        cfg: &SchedConfig,
    ) -> Result<f64, Refusal> {
        let n = self.gpus.len().max(1) as f64;
        let p0 = cfg.default_sp;
        let ahead: f64 = self
            .images
            .iter()
            .filter(|i| i.deadline_ms <= deadline_ms)
            .map(|i| profile.image_ms(i.size, 1))
            .sum::<f64>()
            + self
                .videos
                .values()
                .filter(|v| v.req.deadline_ms <= deadline_ms)
                .map(|v| {
                    f64::from(v.req.steps_left)
                        * profile.video_step_ms(v.req.size, v.req.frames, p0)
                        * f64::from(p0)
                        + profile.video_vae_ms(v.req.size, v.req.frames)
                })
                .sum::<f64>();
        let wait = ahead / n;
        let best = match *job {
            JobKind::Image { size, .. } => profile.image_ms(size, 1),
            JobKind::Video { size, frames } => {
                let widest = cfg.sp_degrees.iter().copied().filter(|&p| p as usize <= self.gpus.len()).max();
                let p = if cfg.mode == Mode::GenServe { widest.unwrap_or(p0) } else { p0 };
                profile.video_ms(size, frames, p)
            }
        };
        let predicted = now_ms + wait + best;
        let refuse =
            |reason| Err(Refusal { reason, retry_after_ms: wait.max(1000.0), predicted_ms: predicted });
        if self.jobs() >= cfg.max_jobs {
            return refuse(RefuseReason::QueueFull);
        }
        if cfg.admission && !on_time(now_ms + best, deadline_ms) {
            return refuse(RefuseReason::DeadlineInfeasible);
        }
        if cfg.admission && !on_time(predicted, deadline_ms) {
            return refuse(RefuseReason::DeadlineUnmeetable);
        }
        Ok(predicted)
    }

    /// Drops a job: a waiting image or video at once, a running round or
    /// decode when it ends (its GPUs are freed then, not reused by it).
    pub fn cancel(&mut self, id: u64) {
        self.images.retain(|i| i.id != id);
        match self.videos.get(&id).map(|v| &v.state) {
            Some(VState::Waiting(_)) => {
                self.videos.remove(&id);
            }
            Some(_) => {
                self.cancelled.insert(id);
            }
            None => {}
        }
    }

    /// An image batch on `gpu` ended.
    pub fn batch_done(&mut self, gpu: Gpu) {
        if let Some(g) = self.gpus.get_mut(usize::from(gpu)) {
            *g = GpuUse::Free;
        }
    }

    /// A round of video `id` ended: at a boundary again, or decoding on its
    /// lead when no step is left (the helpers are freed).
    pub fn round_done(&mut self, id: u64) -> Option<Action> {
        let job = self.videos.get_mut(&id)?;
        let VState::Running { gpus, steps } = job.state.clone() else { return None };
        job.req.steps_left = job.req.steps_left.saturating_sub(steps);
        if self.cancelled.remove(&id) {
            self.videos.remove(&id);
            self.free(&gpus);
            return None;
        }
        if job.req.steps_left > 0 {
            job.state = VState::Waiting(Place::Boundary { gpus });
            return None;
        }
        let lead = gpus[0];
        job.state = VState::Decoding { gpu: lead };
        self.free(&gpus[1..]);
        self.gpus[usize::from(lead)] = GpuUse::Decode(id);
        Some(Action::Decode { id, gpu: lead })
    }

    /// Video `id` is decoded: it leaves the pool. Returns the SP degrees of
    /// its rounds, in order, and its pauses.
    pub fn decode_done(&mut self, id: u64) -> Option<(Vec<u32>, u32)> {
        let job = self.videos.remove(&id)?;
        self.cancelled.remove(&id);
        if let VState::Decoding { gpu } = job.state {
            self.free(&[gpu]);
        }
        Some((job.degrees, job.pauses))
    }

    fn free(&mut self, gpus: &[Gpu]) {
        for &g in gpus {
            self.gpus[usize::from(g)] = GpuUse::Free;
        }
    }

    /// Plans the GPUs that are free or held at a round boundary and
    /// returns what to start. Call after every event.
    pub fn schedule(&mut self, now_ms: f64, profile: &DiffusionProfile, cfg: &SchedConfig) -> Vec<Action> {
        let mut avail: Vec<Gpu> =
            (0..self.gpus.len()).filter(|&g| self.gpus[g] == GpuUse::Free).map(|g| g as Gpu).collect();
        let mut videos = Vec::new();
        for job in self.videos.values() {
            if let VState::Waiting(place) = &job.state {
                if let Place::Boundary { gpus } = place {
                    avail.extend(gpus);
                }
                videos.push(VideoReq { place: place.clone(), ..job.req.clone() });
            }
        }
        if avail.is_empty() || (self.images.is_empty() && videos.is_empty()) {
            return Vec::new();
        }
        avail.sort_unstable();
        self.stats.decisions += 1;
        let image_reserve = self.image_reserve(now_ms, profile);
        let idle = avail.len() == self.gpus.len();
        let snap =
            Snapshot { now_ms, avail: &avail, images: &self.images, videos: &videos, image_reserve, idle };
        let decision = plan(&snap, profile, cfg);
        let mut actions = Vec::new();
        for b in decision.batches {
            self.images.retain(|i| !b.ids.contains(&i.id));
            self.gpus[usize::from(b.gpu)] = GpuUse::Images;
            self.stats.batches += 1;
            self.stats.batched_images += b.ids.len() as u64;
            actions.push(Action::Images { gpu: b.gpu, size: b.size, ids: b.ids });
        }
        let mut ran = HashSet::new();
        for r in decision.runs {
            ran.insert(r.id);
            actions.push(self.start_round(r.id, r.gpus, r.steps));
        }
        for v in &videos {
            if let (Place::Boundary { gpus }, false) = (&v.place, ran.contains(&v.id)) {
                let job = self.videos.get_mut(&v.id).expect("snapshot video is in the pool");
                job.state = VState::Waiting(Place::Paused { home: gpus[0] });
                job.pauses += 1;
                self.stats.pauses += 1;
                for &g in gpus {
                    if self.gpus[usize::from(g)] == GpuUse::Video(v.id) {
                        self.gpus[usize::from(g)] = GpuUse::Free;
                    }
                }
                actions.push(Action::Pause { id: v.id, home: gpus[0] });
            }
        }
        actions
    }

    fn start_round(&mut self, id: u64, gpus: Vec<Gpu>, steps: u32) -> Action {
        let job = self.videos.get_mut(&id).expect("planned video is in the pool");
        let from = match &job.state {
            VState::Waiting(Place::Paused { home }) => {
                self.stats.resumes += 1;
                Some(*home)
            }
            VState::Waiting(Place::Boundary { gpus: old }) => {
                if old.len() != gpus.len() {
                    self.stats.sp_changes += 1;
                }
                // GPUs it held and no longer uses are free again.
                for &g in old {
                    if !gpus.contains(&g) && self.gpus[usize::from(g)] == GpuUse::Video(id) {
                        self.gpus[usize::from(g)] = GpuUse::Free;
                    }
                }
                Some(old[0])
            }
            _ => None,
        }
        .filter(|&home| home != gpus[0]);
        if from.is_some() {
            self.stats.migrations += 1;
        }
        for &g in &gpus {
            self.gpus[usize::from(g)] = GpuUse::Video(id);
        }
        job.degrees.push(gpus.len() as u32);
        job.state = VState::Running { gpus: gpus.clone(), steps };
        Action::Video { id, gpus, steps, from }
    }
}
