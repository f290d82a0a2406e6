//! The public video API (docs/api.md): create a stream, read its events
//! (SSE), pause, resume, switch prompt, read its status, delete it. A
//! stream belongs to the tenant that created it; any other key gets 404.

use std::sync::Arc;

use engine_api::video::{CreateSession, Resolution};
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use policies::video::placement;
use policies::{PolicyDocument, Tenant, Tier};
use serde::Deserialize;
use serde_json::json;

use super::{adopt, chunk_time_s, driver, engine as calls, Stream, StreamParams};
use crate::body::GatewayBody;
use crate::error::ApiError;
use crate::metrics as m;
use crate::request::json_response;
use crate::App;

/// The routes under `/v1/video/streams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VideoRoute {
    Create,
    Status(String),
    Events(String),
    Pause(String),
    Resume(String),
    Prompt(String),
    Delete(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    prompt: String,
    fps: Option<u32>,
    frames_per_chunk: Option<u32>,
    resolution: Option<Resolution>,
    /// Frames to generate; absent or null: open-ended.
    length_frames: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptBody {
    prompt: String,
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidField { param: param.into(), message: message.into() }
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = inner.to_string();
        let named = || msg.split('`').nth(1).unwrap_or("?").to_string();
        if msg.starts_with("unknown field") {
            ApiError::UnknownParameters(vec![named()])
        } else if msg.starts_with("missing field") {
            invalid(&named(), format!("`{}` is required", named()))
        } else if inner.is_syntax() || inner.is_eof() {
            ApiError::InvalidJson(msg)
        } else {
            invalid(if path == "." { "body" } else { &path }, msg)
        }
    })
}

/// Serves one video route for `tenant`.
pub async fn handle(
    app: &App,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    route: VideoRoute,
    req: &mut crate::request::Req,
    hold: Option<crate::cluster::Hold>,
) -> Result<Response<GatewayBody>, ApiError> {
    let streams = &app.video;
    let find =
        |id: &str| streams.get(id, &tenant.name).ok_or_else(|| ApiError::StreamNotFound(id.to_string()));
    match route {
        VideoRoute::Create => {
            let body = req.take_read();
            create(app, policy, tenant, tier, &body, hold).await
        }
        VideoRoute::Status(id) => Ok(json_response(StatusCode::OK, &find(&id)?.status(streams.now()))),
        VideoRoute::Events(id) => {
            let from = cursor(req)?;
            // Here, unless it moved to another gateway; else taken over from
            // its owner, dead or alive (a resumed feed: `adopt`).
            let here = streams.get(&id, &tenant.name).filter(|s| s.lock().ended != Some("moved"));
            let s = match here {
                Some(s) => s,
                None => adopt::take_over(streams, &app.policies, &id, &tenant.name).await.map_err(
                    |r| match r {
                        adopt::Refused::NotFound => ApiError::StreamNotFound(id.clone()),
                        adopt::Refused::Unavailable => ApiError::VideoCapacity {
                            message: "the stream's record cannot be read or claimed right now; retry".into(),
                            retry_after_s: 1,
                        },
                    },
                )?,
            };
            let waiting = s.lock().awaiting_reader;
            if waiting {
                adopt::check_cursor(&s, from).map_err(|(lo, hi)| {
                    invalid("from_chunk", format!("this stream can resume from chunk {lo} to {hi}"))
                })?;
            }
            let feed = s.take_feed().ok_or(ApiError::StreamAlreadyWatched)?;
            if waiting {
                let budget = policy.video.initial_slack_factor * s.chunk_s();
                adopt::start_reader(&s, from, streams.now(), budget);
            }
            let mut resp = Response::new(feed.boxed_unsync());
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            Ok(resp)
        }
        VideoRoute::Pause(id) | VideoRoute::Resume(id) => {
            let pause = req.uri().path().ends_with("/pause");
            let s = find(&id)?;
            let now = streams.now();
            {
                let mut st = s.lock();
                if st.ended.is_some() {
                    return Err(ApiError::StreamEnded);
                }
                if pause {
                    st.playout.pause(now);
                } else if st.playout.paused() {
                    st.playout.resume(now);
                    streams.activated();
                }
            }
            s.wake.notify_one();
            Ok(json_response(StatusCode::OK, &s.status(now)))
        }
        VideoRoute::Prompt(id) => {
            let s = find(&id)?;
            let body = req.take_read();
            let p: PromptBody = parse(&body)?;
            check_prompt(&p.prompt)?;
            switch_prompt(app, policy, &s, p.prompt).await?;
            Ok(json_response(StatusCode::OK, &s.status(streams.now())))
        }
        VideoRoute::Delete(id) => {
            let s = find(&id)?;
            {
                let mut st = s.lock();
                if st.ended.is_none() {
                    st.ended = Some("deleted");
                }
            }
            s.hold(None); // ended: it no longer counts against the tenant
            s.wake.notify_one();
            Ok(json_response(StatusCode::OK, &json!({"id": id, "object": "video.stream", "deleted": true})))
        }
    }
}

/// Where a resumed feed starts: after `Last-Event-ID` (the last chunk the
/// client received), or at `?from_chunk=N`; `None` when neither is given.
fn cursor(req: &crate::request::Req) -> Result<Option<u64>, ApiError> {
    if let Some(v) =
        req.uri().query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("from_chunk=")))
    {
        return v
            .parse()
            .map(Some)
            .map_err(|_| invalid("from_chunk", "must be a chunk index (a non-negative integer)"));
    }
    match req.headers().get("last-event-id") {
        None => Ok(None),
        Some(v) => {
            v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()).map(|last| Some(last + 1)).ok_or(
                ApiError::InvalidHeader {
                    header: "last-event-id",
                    message: "must be the id of a chunk event (a non-negative integer)".into(),
                },
            )
        }
    }
}

/// A prompt is non-empty and within the engines' bound.
fn check_prompt(prompt: &str) -> Result<(), ApiError> {
    if prompt.trim().is_empty() {
        return Err(invalid("prompt", "must not be empty"));
    }
    let most = engine_api::video::MAX_PROMPT_BYTES;
    if prompt.len() > most {
        return Err(invalid("prompt", format!("at most {most} bytes")));
    }
    Ok(())
}

async fn create(
    app: &App,
    policy: &Arc<PolicyDocument>,
    tenant: &Tenant,
    tier: &Tier,
    body: &[u8],
    hold: Option<crate::cluster::Hold>,
) -> Result<Response<GatewayBody>, ApiError> {
    let cfg = &policy.video;
    let b: CreateBody = parse(body)?;
    check_prompt(&b.prompt)?;
    let fps = b.fps.unwrap_or(cfg.default_fps);
    if !(1..=60).contains(&fps) {
        return Err(invalid("fps", "must be between 1 and 60"));
    }
    let fpc = b.frames_per_chunk.unwrap_or(cfg.default_frames_per_chunk);
    if fpc == 0 || fpc % 4 != 0 || fpc > 48 {
        return Err(invalid(
            "frames_per_chunk",
            "must be a multiple of 4 (one latent frame is 4 pixel frames), at most 48",
        ));
    }
    if b.length_frames == Some(0) {
        return Err(invalid("length_frames", "must be positive (omit it for an open-ended stream)"));
    }
    let params = StreamParams {
        fps,
        frames_per_chunk: fpc,
        resolution: b.resolution.unwrap_or(Resolution::Tiny),
        chunks: b.length_frames.map(|f| f.div_ceil(u64::from(fpc))),
    };
    let streams = &app.video;
    if let Some(limit) = tier.max_video_streams.map(|v| v.get()) {
        if streams.live_of(&tenant.name) >= limit {
            return Err(ApiError::VideoStreamLimit { limit });
        }
    }
    if let Some(limit) = tier.video_streams_per_minute.map(|v| v.get()) {
        streams.take_creation(&tenant.name, limit, streams.now()).map_err(|retry_after_s| {
            ApiError::RateLimited { what: crate::error::Metered::VideoStreams, limit, retry_after_s }
        })?;
    }
    let chunk_s = f64::from(fpc) / f64::from(fps);
    let counts = streams.per_engine();
    let home = streams.place_new(cfg).ok_or(ApiError::NoReadyEngine)?;
    let resident = counts.iter().find(|(i, _)| *i == home).map_or(0, |(_, n)| *n);
    let profile = streams.profiles.get(home).await.ok_or(ApiError::NoReadyEngine)?;
    if let Err(batch_ms) = placement::can_keep_up(&profile, resident, chunk_s) {
        let message = format!(
            "every engine is full: even the fastest fidelity would take {batch_ms:.0} ms per chunk with one more stream, over the {:.0} ms a chunk plays for; retry later",
            chunk_s * 1e3
        );
        return Err(ApiError::VideoCapacity {
            message,
            retry_after_s: policy.admission.retry_after_min_s.max(5),
        });
    }
    let first_s = chunk_time_s(&profile, profile.best().chunk_ms, resident + 1);
    let budget_s = cfg.initial_slack_factor * first_s;
    let stream = streams.insert(&tenant.name, &tier.name, b.prompt.clone(), params.clone(), home, budget_s);
    stream.hold(hold);
    let session = CreateSession {
        id: stream.id.clone(),
        prompt: b.prompt,
        resolution: params.resolution,
        latent_frames: fpc / 4,
    };
    // From here to the driver's start in a task of its own: a client that
    // goes away mid-way must not leave a registered stream with no driver
    // (it would count against capacity forever). If it went away, the
    // stream's feed is never opened and the driver ends it (`abandoned`).
    let (streams2, stream2, policies) = (Arc::clone(streams), Arc::clone(&stream), Arc::clone(&app.policies));
    let started = tokio::spawn(async move {
        if let Err(e) = calls::create(&streams2.pool, home, &session).await {
            streams2.remove(&stream2.id);
            tracing::warn!(event = "video_create_failed", engine = home, error = %e);
            return Err(ApiError::EngineFailed(e.to_string()));
        }
        ::metrics::gauge!(m::VIDEO_STREAMS).increment(1.0);
        streams2.record_home(&stream2);
        tokio::spawn(driver::drive(Arc::clone(&streams2), stream2, policies));
        Ok(())
    });
    started.await.map_err(|e| ApiError::EngineFailed(format!("stream start: {e}")))??;
    let id = &stream.id;
    tracing::info!(event = "video_stream_created", stream = %id, tenant = %tenant.name, engine = home);
    Ok(json_response(
        StatusCode::CREATED,
        &json!({
            "id": id,
            "object": "video.stream",
            "events_url": format!("/v1/video/streams/{id}/events"),
            "status_url": format!("/v1/video/streams/{id}"),
            "fps": fps,
            "frames_per_chunk": fpc,
            "resolution": params.resolution,
            "length_frames": b.length_frames,
            "chunks": params.chunks,
            "home_engine": streams.pool.slot(home).spec.id,
            "initial_slack_ms": budget_s * 1e3,
        }),
    ))
}

/// Starts the stream over with a new prompt: the engine drops the old
/// prompt's state, slack resets to the initial budget.
async fn switch_prompt(
    app: &App,
    policy: &PolicyDocument,
    s: &Arc<Stream>,
    prompt: String,
) -> Result<(), ApiError> {
    let home = {
        let st = s.lock();
        if st.ended.is_some() {
            return Err(ApiError::StreamEnded);
        }
        st.home
    };
    let profile = app.video.profiles.get(home).await.ok_or(ApiError::NoReadyEngine)?;
    let k = app.video.per_engine().iter().find(|(i, _)| *i == home).map_or(1, |(_, n)| *n);
    let budget = policy.video.initial_slack_factor * chunk_time_s(&profile, profile.best().chunk_ms, k);
    // The engine's switch and ours happen together or not at all, even if
    // the client goes away in between: a task of its own.
    let (streams, s) = (Arc::clone(&app.video), Arc::clone(s));
    let switch = tokio::spawn(async move {
        let epoch = calls::prompt(&streams.pool, home, &s.id, &prompt)
            .await
            .map_err(|e| ApiError::EngineFailed(e.to_string()))?;
        let now = streams.now();
        let mut st = s.lock();
        st.epoch = st.epoch.max(epoch); // the engine's count, never backwards
        st.epoch_base = st.next_index;
        st.conflicts = 0;
        st.prompt = prompt;
        st.playout.switch_prompt(now, budget);
        drop(st);
        s.wake.notify_one();
        Ok(())
    });
    switch.await.map_err(|e| ApiError::EngineFailed(format!("prompt switch: {e}")))?
}
