//! The engine's video routes (`/engine/v1/video/…`, docs/api.md):
//! sessions, chunks, prompt switches, suspend / resume, export / import.

use super::Target;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;

use crate::http::{error, json, read_json, EngineBody};
use crate::video::{ChunkRequest, CreateSession, VideoError};
use crate::Engine;
use engine_api::video::{Lend, Offer, PromptSwitch};

fn video_error(e: &VideoError) -> Response<EngineBody> {
    let status = match e {
        VideoError::NoSession(_) => StatusCode::NOT_FOUND,
        VideoError::Exists(_) | VideoError::StaleEpoch { .. } => StatusCode::CONFLICT,
        // 425 Too Early: retry once the chunk under way is done.
        VideoError::ChunkInFlight { .. } => StatusCode::from_u16(425).expect("a valid status"),
        VideoError::ChunkGone { .. } => StatusCode::GONE,
        VideoError::UnknownFidelity(_) | VideoError::BadState | VideoError::BadSp(_) => {
            StatusCode::BAD_REQUEST
        }
        VideoError::Stopped | VideoError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        VideoError::NoOffer(_) => StatusCode::FORBIDDEN,
        VideoError::Transfer(_) => StatusCode::BAD_GATEWAY,
    };
    error(status, e.code(), &e.to_string())
}

pub(crate) fn bytes(content_type: &'static str, body: Vec<u8>) -> Response<EngineBody> {
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(Either::Left(Full::new(Bytes::from(body))))
        .expect("static response parts are valid")
}

fn done<T: serde::Serialize>(status: StatusCode, r: Result<T, VideoError>) -> Response<EngineBody> {
    match r {
        Ok(v) => json(status, &v),
        Err(e) => video_error(&e),
    }
}

/// A body of `T` that passes its wire type's own bounds (`validate`), or
/// the typed 400 that names the field.
async fn read_valid<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
    validate: fn(&T) -> Result<(), String>,
) -> Result<T, Response<EngineBody>> {
    let t = read_json::<T>(req).await?;
    validate(&t).map_err(|message| error(StatusCode::BAD_REQUEST, "invalid_request", &message))?;
    Ok(t)
}

/// `pull` and `commit`: where the session is and the token it was offered
/// under.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Pull {
    from: String,
    token: String,
}

/// Most bytes one pull accepts: a session's KV window and model state.
fn pull_limit(engine: &Engine) -> usize {
    engine.video_state_bytes + (64 << 20)
}

/// Serves one video route.
pub(crate) async fn handle(
    engine: &Engine,
    req: Request<Incoming>,
    target: Target<'_>,
) -> Response<EngineBody> {
    let v = &engine.video;
    match (req.method().clone(), target.id, target.action) {
        (Method::GET, None, "profile") => {
            bytes("application/toml", engine.video_profile_toml.clone().into_bytes())
        }
        (Method::GET, None, "load") => json(StatusCode::OK, &v.load().await),
        (Method::POST, None, "lend") => match read_valid(req, Lend::validate).await {
            Ok(l) => done(StatusCode::OK, v.lend(l.ms).await.map(|()| serde_json::json!({}))),
            Err(resp) => resp,
        },
        (Method::POST, None, "sessions") => match read_valid(req, CreateSession::validate).await {
            Ok(c) => done(StatusCode::CREATED, v.create(c).await.map(|()| serde_json::json!({}))),
            Err(resp) => resp,
        },
        (Method::POST, Some(id), "chunk") => match read_valid(req, ChunkRequest::validate).await {
            Ok(c) => done(StatusCode::OK, v.chunk(id, c).await),
            Err(resp) => resp,
        },
        (Method::POST, Some(id), "prompt") => match read_valid(req, PromptSwitch::validate).await {
            Ok(p) => done(
                StatusCode::OK,
                v.prompt(id, p.prompt).await.map(|epoch| serde_json::json!({"epoch": epoch})),
            ),
            Err(resp) => resp,
        },
        (Method::POST, Some(id), "suspend") => {
            done(StatusCode::OK, v.suspend(id).await.map(|()| serde_json::json!({})))
        }
        (Method::POST, Some(id), "resume") => {
            done(StatusCode::OK, v.resume(id).await.map(|()| serde_json::json!({})))
        }
        (Method::GET, Some(id), "state") => match v.state(id).await {
            Ok(b) => bytes("application/octet-stream", b),
            Err(e) => video_error(&e),
        },
        (Method::POST, Some(id), "export") => match v.export(id).await {
            Ok(b) => bytes("application/octet-stream", b),
            Err(e) => video_error(&e),
        },
        (Method::PUT, Some(id), "import") => {
            let id = id.to_string();
            // A session's state: its KV window and model state.
            match Limited::new(req.into_body(), pull_limit(engine)).collect().await {
                Ok(c) => done(
                    StatusCode::CREATED,
                    v.import(&id, c.to_bytes().to_vec()).await.map(|()| serde_json::json!({})),
                ),
                Err(e) => error(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string()),
            }
        }
        (Method::POST, Some(id), "offer") => match read_valid(req, Offer::validate).await {
            Ok(o) => done(StatusCode::OK, v.offer(id, o.token).await),
            Err(resp) => resp,
        },
        (Method::GET, Some(id), "snapshot") => {
            let token = req.headers().get(crate::video::transfer::TOKEN_HEADER).and_then(|t| t.to_str().ok());
            let since = crate::video::transfer::since_of(req.uri().query());
            match v.snapshot(id, token.unwrap_or_default().to_string(), since).await {
                Ok(b) => bytes("application/octet-stream", b),
                Err(e) => video_error(&e),
            }
        }
        (Method::POST, Some(id), "pull") => match read_json::<Pull>(req).await {
            Ok(p) => {
                let started = crate::clock::now();
                let pulled =
                    crate::video::transfer::pull(&p.from, id, &p.token, None, pull_limit(engine)).await;
                let staged = match pulled {
                    Ok(b) => v.stage(id, b.clone()).await.map(|ver| (ver, b.len())),
                    Err(e) => Err(e),
                };
                done(
                    StatusCode::OK,
                    staged.map(|(ver, n)| {
                        serde_json::json!({"epoch": ver.epoch, "chunks": ver.chunks, "bytes": n,
                            "ms": crate::clock::since(started).as_secs_f64() * 1e3})
                    }),
                )
            }
            Err(resp) => resp,
        },
        (Method::POST, Some(id), "commit") => {
            match read_json::<Pull>(req).await {
                Ok(p) => {
                    let started = crate::clock::now();
                    let since = v.staged(id).await;
                    let result =
                        match crate::video::transfer::pull(&p.from, id, &p.token, since, pull_limit(engine))
                            .await
                        {
                            Ok(b) => v.commit(id, b.clone()).await.map(|()| b.len()),
                            Err(e) => Err(e),
                        };
                    done(
                    StatusCode::OK,
                    result.map(
                        |n| serde_json::json!({"bytes": n, "ms": crate::clock::since(started).as_secs_f64() * 1e3}),
                    ),
                )
                }
                Err(resp) => resp,
            }
        }
        (Method::POST, Some(id), "adopt") => done(StatusCode::OK, v.adopt(id).await),
        (Method::DELETE, Some(id), "staged") => {
            done(StatusCode::OK, v.unstage(id).await.map(|()| serde_json::json!({})))
        }
        (Method::DELETE, Some(id), "") => {
            done(StatusCode::OK, v.end(id).await.map(|()| serde_json::json!({})))
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such video route"),
    }
}
