//! The engine's diffusion routes (`/engine/v1/diffusion/…`, docs/api.md).

use super::Target;
use engine_api::diffusion::{self as api, ImagesResponse};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::video::bytes;
use crate::diffusion::{DiffusionError, MAX_STATE_BYTES};
use crate::http::{error, json, read_json, EngineBody};
use crate::Engine;

fn failed(e: &DiffusionError) -> Response<EngineBody> {
    let status = match e {
        DiffusionError::NoVideo(_) => StatusCode::NOT_FOUND,
        DiffusionError::Mismatch(_) => StatusCode::CONFLICT,
        DiffusionError::Full => StatusCode::SERVICE_UNAVAILABLE,
        DiffusionError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    };
    error(status, e.code(), &e.to_string())
}

/// Serves one diffusion route.
pub(crate) async fn handle(
    engine: &Engine,
    req: Request<Incoming>,
    target: Target<'_>,
) -> Response<EngineBody> {
    let d = &engine.diffusion;
    if (target.id, target.action) == (None, "profile") && req.method() == Method::GET {
        return bytes("application/toml", d.profile_toml.clone().into_bytes());
    }
    if (target.id, target.action) == (None, "images") && req.method() == Method::POST {
        if !engine.accepting() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_not_ready",
                "engine is not taking new work",
            );
        }
        let body: api::ImagesRequest = match read_json(req).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        return match d.images(body).await {
            Ok(pngs) => json(
                StatusCode::OK,
                &ImagesResponse { images: pngs.iter().map(|p| crate::video::base64(p)).collect() },
            ),
            Err(e) => failed(&e),
        };
    }
    let Some(id) = target.id else {
        return error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "no such diffusion route");
    };
    if id.len() > api::MAX_ID_BYTES {
        return error(StatusCode::BAD_REQUEST, "invalid_request", "video id: 1 to 128 bytes");
    }
    let id = id.to_string();
    match (req.method().clone(), target.action) {
        (Method::POST, "steps") => {
            if !engine.accepting() {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "engine_not_ready",
                    "engine is not taking new work",
                );
            }
            match read_json::<api::StepsRequest>(req).await {
                Ok(body) => match d.steps(&id, body).await {
                    Ok(r) => json(StatusCode::OK, &r),
                    Err(e) => failed(&e),
                },
                Err(resp) => resp,
            }
        }
        (Method::POST, "decode") => match d.decode(&id).await {
            Ok(apng) => bytes("image/apng", apng),
            Err(e) => failed(&e),
        },
        (Method::GET, "state") => match d.export(&id) {
            Ok(b) => bytes("application/octet-stream", b),
            Err(e) => failed(&e),
        },
        (Method::PUT, "state") => {
            let body = match Limited::new(req.into_body(), MAX_STATE_BYTES).collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string()),
            };
            match d.import(&id, &body) {
                Ok(()) => json(StatusCode::OK, &serde_json::json!({"id": id})),
                Err(e) => failed(&e),
            }
        }
        (Method::DELETE, "") => {
            json(StatusCode::OK, &serde_json::json!({"id": id, "deleted": d.drop_video(&id)}))
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such diffusion route"),
    }
}
