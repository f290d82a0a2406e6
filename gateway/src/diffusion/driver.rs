//! The driver: the one task that owns the pool. It takes requests and
//! engine results as messages, asks the scheduler what to start after each,
//! and starts it (one task per engine call, reporting back as a message).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use engine_api::diffusion::{self as api, ImagesResponse, StepsRequest};
use http::Method;
use policies::diffusion::{
    Action, DiffusionProfile, Gpu, GpuUse, ImageReq, JobKind, Place, Pool, RefuseReason, SchedConfig,
    VideoReq,
};
use tokio::sync::{mpsc, oneshot};

use super::{Diffusion, Due, ImagesDone, Msg, VideoRecord};
use crate::error::{ApiError, Overload};
use crate::metrics as m;
use crate::reload::PolicyStore;
use crate::video::engine::call;

/// An engine call's outcome, back to the driver.
pub(crate) enum Done {
    Batch { gpu: Gpu, ids: Vec<u64>, result: Result<Vec<String>, String> },
    Round { id: u64, result: Result<(), String> },
    Decoded { id: u64, result: Result<Bytes, String> },
}

/// The pool, its profile and which engine each GPU is.
struct Ctx {
    pool: Pool,
    profile: DiffusionProfile,
    engines: Vec<usize>,
}

struct ImageWait {
    /// Gateway clock, ms.
    deadline_ms: f64,
    images: Vec<Option<String>>,
    reply: Option<oneshot::Sender<Result<ImagesDone, ApiError>>>,
    predicted_ms: f64,
}

struct VideoRun {
    record: Arc<VideoRecord>,
    deadline_ms: f64,
    frames: u32,
    /// The GPU holding its state between rounds.
    home: Option<Gpu>,
    cancelled: bool,
}

#[derive(Default)]
struct State {
    ctx: Option<Ctx>,
    next_id: u64,
    /// Image id → (request, index in it, prompt).
    images: HashMap<u64, (u64, usize, String)>,
    requests: HashMap<u64, ImageWait>,
    videos: HashMap<u64, VideoRun>,
    by_name: HashMap<String, u64>,
}

/// Engine calls: the profile's time, four times over, plus 10 s.
fn budget(ms: f64) -> Duration {
    Duration::from_secs_f64((ms * 4.0 + 10_000.0).min(3_600_000.0) / 1000.0)
}

pub(super) async fn drive(svc: Arc<Diffusion>, mut rx: mpsc::Receiver<Msg>, policies: Arc<PolicyStore>) {
    let mut st = State::default();
    while let Some(msg) = rx.recv().await {
        let now = svc.now_ms();
        let cfg = policies.current().diffusion.clone();
        match msg {
            Msg::Images { size, prompts, due, reply } => {
                let r = st.images_request(&svc, &cfg, now, &size, prompts, due).await;
                match r {
                    Ok((key, predicted_ms)) => {
                        let wait = st.requests.get_mut(&key).expect("just added");
                        wait.reply = Some(reply);
                        wait.predicted_ms = predicted_ms;
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Msg::Video { record, due, reply } => {
                let _ = reply.send(st.video_request(&svc, &cfg, now, record, due).await);
            }
            Msg::Cancel(name) => st.cancel(&svc, &name),
            Msg::Done(done) => st.done(&svc, done),
        }
        st.schedule(&svc, now, &cfg);
    }
}

impl State {
    /// The pool, built (or rebuilt while idle) over the routable native
    /// engines, with the first one's diffusion profile.
    async fn ctx(&mut self, svc: &Diffusion) -> Result<&mut Ctx, ApiError> {
        let engines: Vec<usize> = {
            let slots = svc.engines.snapshot();
            (0..slots.len()).filter(|&i| slots[i].routable_for_video()).collect()
        };
        let idle = |c: &Ctx| c.pool.jobs() == 0 && c.pool.gpus().iter().all(|g| *g == GpuUse::Free);
        let stale = match &self.ctx {
            None => true,
            Some(c) => idle(c) && c.engines != engines && !engines.is_empty(),
        };
        if stale {
            let first = *engines.first().ok_or(ApiError::NoReadyEngine)?;
            let text =
                call(&svc.engines, first, Method::GET, api::PROFILE_PATH, Vec::new(), Duration::from_secs(5))
                    .await
                    .map_err(|e| ApiError::EngineFailed(format!("diffusion profile: {e}")))?;
            let profile =
                DiffusionProfile::parse("engine diffusion profile", &String::from_utf8_lossy(&text))
                    .map_err(|e| ApiError::EngineFailed(e.to_string()))?;
            tracing::info!(event = "diffusion_pool", gpus = engines.len(), model = %profile.model);
            self.ctx = Some(Ctx { pool: Pool::new(engines.len()), profile, engines });
        }
        Ok(self.ctx.as_mut().expect("built above"))
    }

    async fn images_request(
        &mut self,
        svc: &Diffusion,
        cfg: &SchedConfig,
        now: f64,
        size: &str,
        prompts: Vec<String>,
        due: Due,
    ) -> Result<(u64, f64), ApiError> {
        let ctx = self.ctx(svc).await?;
        let Some(s) = ctx.profile.image_size(size) else {
            let sizes: Vec<&str> = ctx.profile.images.iter().map(|i| i.size.as_str()).collect();
            return Err(invalid("size", format!("`{size}` is not offered; one of {}", sizes.join(", "))));
        };
        let kind = JobKind::Image { size: s, n: prompts.len() as u32 };
        let deadline = now + deadline_in(due, cfg.solo_ms(&ctx.profile, &kind));
        let predicted =
            ctx.pool.admit(&kind, now, deadline, &ctx.profile, cfg).map_err(|r| refused("image", r))?;
        self.next_id += 1;
        let key = self.next_id;
        let n = prompts.len();
        for (i, prompt) in prompts.into_iter().enumerate() {
            self.next_id += 1;
            let id = self.next_id;
            self.images.insert(id, (key, i, prompt));
            let ctx = self.ctx.as_mut().expect("built above");
            ctx.pool.submit_image(ImageReq { id, size: s, arrival_ms: now, deadline_ms: deadline });
        }
        let wait = ImageWait {
            deadline_ms: deadline,
            images: vec![None; n],
            reply: None,
            predicted_ms: predicted - now,
        };
        self.requests.insert(key, wait);
        Ok((key, predicted - now))
    }

    async fn video_request(
        &mut self,
        svc: &Diffusion,
        cfg: &SchedConfig,
        now: f64,
        record: Arc<VideoRecord>,
        due: Due,
    ) -> Result<f64, ApiError> {
        let ctx = self.ctx(svc).await?;
        let Some(s) = ctx.profile.video_size(&record.size) else {
            let sizes: Vec<&str> = ctx.profile.videos.iter().map(|v| v.size.as_str()).collect();
            return Err(invalid(
                "size",
                format!("`{}` is not offered; one of {}", record.size, sizes.join(", ")),
            ));
        };
        if record.seconds == 0 || record.seconds > ctx.profile.max_seconds {
            return Err(invalid("seconds", format!("1 to {} seconds", ctx.profile.max_seconds)));
        }
        let frames = ctx.profile.frames(record.seconds);
        let kind = JobKind::Video { size: s, frames };
        let deadline = now + deadline_in(due, cfg.solo_ms(&ctx.profile, &kind));
        let predicted =
            ctx.pool.admit(&kind, now, deadline, &ctx.profile, cfg).map_err(|r| refused("video", r))?;
        svc.insert(Arc::clone(&record))?;
        let steps = ctx.profile.video_steps;
        self.next_id += 1;
        let id = self.next_id;
        let ctx = self.ctx.as_mut().expect("built above");
        ctx.pool.submit_video(VideoReq {
            id,
            size: s,
            frames,
            arrival_ms: now,
            deadline_ms: deadline,
            steps_left: steps,
            place: Place::Queued,
        });
        self.by_name.insert(record.id.clone(), id);
        self.videos
            .insert(id, VideoRun { record, deadline_ms: deadline, frames, home: None, cancelled: false });
        Ok(predicted - now)
    }

    fn cancel(&mut self, svc: &Arc<Diffusion>, name: &str) {
        let (Some(id), Some(ctx)) = (self.by_name.remove(name), self.ctx.as_mut()) else { return };
        ctx.pool.cancel(id);
        if ctx.pool.video_progress(id).is_none() {
            // Not running: gone from the pool now; its paused state too.
            if let Some(run) = self.videos.remove(&id) {
                drop_state(svc, ctx, run.home, &run.record.id);
            }
        } else if let Some(run) = self.videos.get_mut(&id) {
            run.cancelled = true; // its round or decode ends first
        }
    }

    fn done(&mut self, svc: &Arc<Diffusion>, done: Done) {
        match done {
            Done::Batch { gpu, ids, result } => {
                let Some(ctx) = self.ctx.as_mut() else { return };
                ctx.pool.batch_done(gpu);
                self.deliver_images(&ids, result, svc.now_ms());
            }
            Done::Round { id, result } => self.round_done(svc, id, result),
            Done::Decoded { id, result } => self.decoded(svc, id, result),
        }
    }

    /// A round ended: progress, or the decode after the last step; a failed
    /// or cancelled video leaves the pool and its state is dropped.
    fn round_done(&mut self, svc: &Arc<Diffusion>, id: u64, result: Result<(), String>) {
        let Some(ctx) = self.ctx.as_mut() else { return };
        let failed = result.err();
        if failed.is_some() {
            ctx.pool.cancel(id);
        }
        let decode = ctx.pool.round_done(id);
        let Some(run) = self.videos.get_mut(&id) else { return };
        if failed.is_some() || run.cancelled {
            if let Some(e) = failed {
                ::metrics::counter!(m::DIFFUSION_JOBS, "kind" => "video", "outcome" => "failed").increment(1);
                run.record.update(|s| fail(s, "engine_failed", e, svc.now_ms()));
            }
            let run = self.videos.remove(&id).expect("present");
            drop_state(svc, ctx, run.home, &run.record.id);
            return;
        }
        let left = ctx.pool.video_progress(id).map_or(0, |(left, _)| left);
        let total = ctx.profile.video_steps.max(1);
        run.record.update(|s| s.progress = (total - left.min(total)) * 99 / total);
        if let Some(a) = decode {
            start(svc, ctx, &mut self.videos, &self.images, a);
        }
    }

    /// A video is decoded (or its decode failed): it is done.
    fn decoded(&mut self, svc: &Arc<Diffusion>, id: u64, result: Result<Bytes, String>) {
        let Some(ctx) = self.ctx.as_mut() else { return };
        ctx.pool.decode_done(id);
        let Some(run) = self.videos.remove(&id) else { return };
        let now = svc.now_ms();
        let outcome = match (&result, now <= run.deadline_ms) {
            (Err(_), _) => "failed",
            (Ok(_), true) => "met",
            (Ok(_), false) => "late",
        };
        ::metrics::counter!(m::DIFFUSION_JOBS, "kind" => "video", "outcome" => outcome).increment(1);
        run.record.update(|s| match result {
            Ok(bytes) => {
                s.status = "completed";
                s.progress = 100;
                let unix = crate::clock::unix_s();
                s.completed_at = Some(unix as u64);
                s.completed_at_ms = Some((unix * 1000.0) as u64);
                s.content = Some(bytes);
                s.finished_ms = Some(now);
            }
            Err(e) => fail(s, "engine_failed", e, now),
        });
        if run.cancelled {
            svc.forget(&run.record.id);
        }
    }

    fn deliver_images(&mut self, ids: &[u64], result: Result<Vec<String>, String>, now: f64) {
        for (k, id) in ids.iter().enumerate() {
            let Some((key, index, _)) = self.images.remove(id) else { continue };
            let Some(wait) = self.requests.get_mut(&key) else { continue };
            match &result {
                Ok(pngs) => wait.images[index] = pngs.get(k).cloned(),
                Err(e) => {
                    if let Some(reply) = wait.reply.take() {
                        ::metrics::counter!(m::DIFFUSION_JOBS, "kind" => "image", "outcome" => "failed")
                            .increment(1);
                        let _ = reply.send(Err(ApiError::EngineFailed(e.clone())));
                    }
                }
            }
            if wait.reply.is_none() || wait.images.iter().all(Option::is_some) {
                let wait = self.requests.remove(&key).expect("present");
                if let Some(reply) = wait.reply {
                    let outcome = if now <= wait.deadline_ms { "met" } else { "late" };
                    ::metrics::counter!(m::DIFFUSION_JOBS, "kind" => "image", "outcome" => outcome)
                        .increment(1);
                    let images = wait.images.into_iter().flatten().collect();
                    let _ = reply.send(Ok(ImagesDone { images, predicted_ms: wait.predicted_ms }));
                }
                // Images of a failed request still queued are dropped.
                self.images.retain(|_, (k2, _, _)| *k2 != key);
            }
        }
    }

    fn schedule(&mut self, svc: &Arc<Diffusion>, now: f64, cfg: &SchedConfig) {
        let Some(ctx) = self.ctx.as_mut() else { return };
        // A client that left (its request's answer can no longer be sent)
        // wants none of its images that have not started.
        let gone: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, w)| w.reply.as_ref().is_some_and(|r| r.is_closed()))
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            self.requests.remove(&key);
            self.images.retain(|_, (k, _, _)| *k != key);
        }
        // Images whose request failed or left are no longer wanted.
        let orphans: Vec<u64> =
            ctx.pool.waiting_images().filter(|id| !self.images.contains_key(id)).collect();
        orphans.into_iter().for_each(|id| ctx.pool.cancel(id));
        let before = ctx.pool.stats.clone();
        for action in ctx.pool.schedule(now, &ctx.profile, cfg) {
            start(svc, ctx, &mut self.videos, &self.images, action);
        }
        let after = &ctx.pool.stats;
        ::metrics::counter!(m::DIFFUSION_PAUSES).increment(after.pauses - before.pauses);
        ::metrics::counter!(m::DIFFUSION_SP_CHANGES).increment(after.sp_changes - before.sp_changes);
        ::metrics::counter!(m::DIFFUSION_MIGRATIONS).increment(after.migrations - before.migrations);
        ::metrics::gauge!(m::DIFFUSION_WAITING).set(ctx.pool.jobs() as f64);
    }
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::InvalidField { param: param.into(), message }
}

fn deadline_in(due: Due, solo_ms: f64) -> f64 {
    match due {
        Due::In(ms) => ms,
        Due::Scale(sigma) => sigma * solo_ms,
    }
}

fn refused(kind: &'static str, r: policies::diffusion::Refusal) -> ApiError {
    ::metrics::counter!(m::DIFFUSION_REFUSED, "kind" => kind, "reason" => r.reason.label()).increment(1);
    let what = match r.reason {
        RefuseReason::QueueFull => "the image and video queue is full".to_string(),
        RefuseReason::DeadlineInfeasible => {
            "the deadline is shorter than this job takes even alone on the pool".to_string()
        }
        RefuseReason::DeadlineUnmeetable => {
            format!("predicted to finish in {:.0} ms, after its deadline", r.predicted_ms)
        }
    };
    ApiError::Overloaded {
        reason: Overload::Diffusion(r.reason),
        message: format!("{what}; retry later or with a longer x-slo-e2e-ms"),
        retry_after_s: (r.retry_after_ms / 1000.0).ceil().clamp(1.0, 3600.0) as u32,
    }
}

fn fail(s: &mut super::VideoStatus, code: &str, message: String, now: f64) {
    s.status = "failed";
    s.error = Some((code.to_string(), message));
    s.finished_ms = Some(now);
}

fn drop_state(svc: &Arc<Diffusion>, ctx: &Ctx, home: Option<Gpu>, name: &str) {
    let Some(engine) = home.map(|g| ctx.engines[usize::from(g)]) else { return };
    let (svc, path) = (Arc::clone(svc), format!("{}{name}", api::VIDEOS_PREFIX));
    tokio::spawn(async move {
        let _ = call(&svc.engines, engine, Method::DELETE, &path, Vec::new(), Duration::from_secs(5)).await;
    });
}

/// Sends an engine call's outcome back to the driver.
async fn report(back: mpsc::Sender<Msg>, d: Done) {
    let _ = back.send(Msg::Done(d)).await;
}

/// Carries out one action in a task of its own.
fn start(
    svc: &Arc<Diffusion>,
    ctx: &Ctx,
    videos: &mut HashMap<u64, VideoRun>,
    images: &HashMap<u64, (u64, usize, String)>,
    action: Action,
) {
    match action {
        Action::Images { gpu, size, ids } => start_images(svc, ctx, images, gpu, size, ids),
        Action::Video { id, gpus, steps, from } => {
            let Some(run) = videos.get_mut(&id) else { return };
            start_round(svc, ctx, run, id, gpus, steps, from);
        }
        Action::Decode { id, gpu } => {
            let Some(run) = videos.get(&id) else { return };
            let engine = ctx.engines[usize::from(gpu)];
            let size = ctx.profile.video_size(&run.record.size).unwrap_or(0);
            let timeout = budget(ctx.profile.video_vae_ms(size, run.frames));
            let path = format!("{}{}/decode", api::VIDEOS_PREFIX, run.record.id);
            let (pool, back) = (Arc::clone(&svc.engines), svc.tx.clone());
            tokio::spawn(async move {
                let r = call(&pool, engine, Method::POST, &path, Vec::new(), timeout).await;
                report(back, Done::Decoded { id, result: r.map_err(|e| e.to_string()) }).await;
            });
        }
        Action::Pause { .. } => {}
    }
}

fn start_images(
    svc: &Arc<Diffusion>,
    ctx: &Ctx,
    images: &HashMap<u64, (u64, usize, String)>,
    gpu: Gpu,
    size: policies::diffusion::SizeId,
    ids: Vec<u64>,
) {
    let engine = ctx.engines[usize::from(gpu)];
    let prompts: Vec<String> =
        ids.iter().map(|id| images.get(id).map_or(String::new(), |x| x.2.clone())).collect();
    let body = api::ImagesRequest { size: ctx.profile.images[size].size.clone(), prompts, seed: ids[0] };
    let timeout = budget(ctx.profile.image_ms(size, ids.len() as u32));
    let (pool, back) = (Arc::clone(&svc.engines), svc.tx.clone());
    tokio::spawn(async move {
        let body = serde_json::to_vec(&body).expect("serialises");
        let r = call(&pool, engine, Method::POST, api::IMAGES_PATH, body, timeout).await;
        let result = r.map_err(|e| e.to_string()).and_then(|b| {
            serde_json::from_slice::<ImagesResponse>(&b).map(|r| r.images).map_err(|e| e.to_string())
        });
        report(back, Done::Batch { gpu, ids, result }).await;
    });
}

fn start_round(
    svc: &Arc<Diffusion>,
    ctx: &Ctx,
    run: &mut VideoRun,
    id: u64,
    gpus: Vec<Gpu>,
    steps: u32,
    from: Option<Gpu>,
) {
    run.home = Some(gpus[0]);
    run.record.update(|s| s.status = "in_progress");
    let lead = ctx.engines[usize::from(gpus[0])];
    let from = from.map(|g| ctx.engines[usize::from(g)]);
    let size = ctx.profile.video_size(&run.record.size).unwrap_or(0);
    let timeout = budget(f64::from(steps) * ctx.profile.video_step_ms(size, run.frames, gpus.len() as u32));
    let body = StepsRequest {
        prompt: run.record.prompt.clone(),
        size: run.record.size.clone(),
        frames: run.frames,
        total_steps: ctx.profile.video_steps,
        steps,
        sp: gpus.len() as u32,
        seed: id,
    };
    let name = run.record.id.clone();
    let (pool, back) = (Arc::clone(&svc.engines), svc.tx.clone());
    tokio::spawn(async move {
        let result = round(&pool, &name, from, lead, body, timeout).await;
        report(back, Done::Round { id, result }).await;
    });
}

/// One round: the state moves to the lead first when it is elsewhere.
async fn round(
    pool: &crate::engines::EnginePool,
    name: &str,
    from: Option<usize>,
    lead: usize,
    body: StepsRequest,
    timeout: Duration,
) -> Result<(), String> {
    let path = |op: &str| format!("{}{name}/{op}", api::VIDEOS_PREFIX);
    if let Some(from) = from {
        let state = call(pool, from, Method::GET, &path("state"), Vec::new(), Duration::from_secs(30))
            .await
            .map_err(|e| format!("moving the paused state: {e}"))?;
        call(pool, lead, Method::PUT, &path("state"), state.to_vec(), Duration::from_secs(30))
            .await
            .map_err(|e| format!("moving the paused state: {e}"))?;
    }
    let body = serde_json::to_vec(&body).expect("serialises");
    call(pool, lead, Method::POST, &path("steps"), body, timeout).await.map(|_| ()).map_err(|e| e.to_string())
}
