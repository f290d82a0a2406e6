//! The public images and videos API (docs/api.md "Images", "Videos"),
//! shaped like OpenAI's so its clients work unmodified:
//! `POST /v1/images/generations` answers with base64 PNGs;
//! `POST /v1/videos` (JSON or multipart form) creates a job,
//! `GET /v1/videos[/{id}]` reports it, `GET /v1/videos/{id}/content` returns
//! the finished video (an animated PNG), `DELETE /v1/videos/{id}` cancels it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{header, HeaderValue, Response, StatusCode};
use policies::{PolicyDocument, Tenant, Tier};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::oneshot;

use super::{form, Due, Msg, VideoRecord, VideoStatus};
use crate::body::GatewayBody;
use crate::error::ApiError;
use crate::request::{json_response, Req};
use crate::App;

/// Longest prompt accepted (characters).
const MAX_PROMPT_CHARS: usize = 32_000;
/// Longest explicit deadline (`x-slo-e2e-ms`): a day.
const MAX_DEADLINE_MS: f64 = 86_400_000.0;
/// Suggested poll interval for `GET /v1/videos/{id}` (`openai-poll-after-ms`).
const POLL_AFTER_MS: &str = "250";

/// The routes under `/v1/images` and `/v1/videos`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffusionRoute {
    Images,
    CreateVideo,
    ListVideos,
    Video(String),
    Content(String),
    DeleteVideo(String),
}

impl DiffusionRoute {
    pub fn takes_body(&self) -> bool {
        matches!(self, Self::Images | Self::CreateVideo)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImagesBody {
    prompt: String,
    model: Option<String>,
    n: Option<i64>,
    size: Option<String>,
    response_format: Option<String>,
    output_format: Option<String>,
    stream: Option<bool>,
    // Accepted and not acted on (the synthetic model has no such knobs).
    #[allow(dead_code)]
    quality: Option<String>,
    #[allow(dead_code)]
    style: Option<String>,
    #[allow(dead_code)]
    user: Option<String>,
    #[allow(dead_code)]
    background: Option<String>,
    #[allow(dead_code)]
    moderation: Option<String>,
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidField { param: param.into(), message: message.into() }
}

fn unsupported(param: &str, message: &str) -> ApiError {
    ApiError::UnsupportedParameter { param: param.into(), message: message.into() }
}

/// The request's deadline: `x-slo-e2e-ms`, or σ of its tier.
fn due(req: &Req, policy: &PolicyDocument, tier: &Tier) -> Result<Due, ApiError> {
    match req.headers().get("x-slo-e2e-ms") {
        None => Ok(Due::Scale(policy.diffusion.slo_scale_of(&tier.name))),
        Some(v) => explicit_deadline(v).map(Due::In),
    }
}

/// An explicit `x-slo-e2e-ms`: milliseconds, finite, above 0, at most a day.
fn explicit_deadline(v: &HeaderValue) -> Result<f64, ApiError> {
    match v.to_str().ok().and_then(|s| s.trim().parse::<f64>().ok()) {
        Some(ms) if ms.is_finite() && ms > 0.0 && ms <= MAX_DEADLINE_MS => Ok(ms),
        _ => Err(ApiError::InvalidHeader {
            header: "x-slo-e2e-ms",
            message: "milliseconds, a number > 0 and at most a day".into(),
        }),
    }
}

fn model(policy: &PolicyDocument, asked: Option<String>) -> Result<String, ApiError> {
    let models = &policy.diffusion.models;
    match asked {
        None => Ok(models[0].clone()),
        Some(m) if models.contains(&m) => Ok(m),
        Some(m) => Err(ApiError::ModelNotFound(m)),
    }
}

fn prompt_ok(prompt: &str) -> Result<(), ApiError> {
    if prompt.trim().is_empty() {
        return Err(invalid("prompt", "`prompt` must not be empty"));
    }
    if prompt.chars().count() > MAX_PROMPT_CHARS {
        return Err(invalid("prompt", format!("at most {MAX_PROMPT_CHARS} characters")));
    }
    Ok(())
}

/// Serves one images or videos route for `tenant`.
pub async fn handle(
    app: &Arc<App>,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    route: DiffusionRoute,
    req: &mut Req,
) -> Result<Response<GatewayBody>, ApiError> {
    let ttl = policy.diffusion.result_ttl_s;
    let svc = &app.diffusion;
    let find =
        |id: &str| svc.video(id, &tenant.name, ttl).ok_or_else(|| ApiError::VideoNotFound(id.to_string()));
    match route {
        DiffusionRoute::Images => images(app, policy, tier, req).await,
        DiffusionRoute::CreateVideo => create_video(app, policy, (tenant, tier), req).await,
        DiffusionRoute::ListVideos => {
            let limit = query(req, "limit").and_then(|v| v.parse::<usize>().ok()).unwrap_or(20).clamp(1, 100);
            let data: Vec<_> = svc.list(&tenant.name, limit).iter().map(|r| r.object(ttl)).collect();
            let (first, last) = (data.first().map(|v| v["id"].clone()), data.last().map(|v| v["id"].clone()));
            Ok(json_response(
                StatusCode::OK,
                &json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false}),
            ))
        }
        DiffusionRoute::Video(id) => {
            let mut resp = json_response(StatusCode::OK, &find(&id)?.object(ttl));
            resp.headers_mut().insert("openai-poll-after-ms", HeaderValue::from_static(POLL_AFTER_MS));
            Ok(resp)
        }
        DiffusionRoute::Content(id) => content(&*find(&id)?, query(req, "variant")),
        DiffusionRoute::DeleteVideo(id) => {
            let record = find(&id)?;
            svc.forget(&record.id);
            svc.send(&app.policies, Msg::Cancel(record.id.clone())).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"id": record.id, "object": "video.deleted", "deleted": true}),
            ))
        }
    }
}

fn query(req: &Req, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
}

async fn images(
    app: &Arc<App>,
    policy: &Arc<PolicyDocument>,
    tier: &Tier,
    req: &mut Req,
) -> Result<Response<GatewayBody>, ApiError> {
    let raw = req.take_read();
    let body: ImagesBody = crate::video::routes::parse(&raw)?;
    prompt_ok(&body.prompt)?;
    let model = model(policy, body.model)?;
    let max = policy.diffusion.max_images;
    let n = body.n.unwrap_or(1);
    if !(1..=i64::from(max)).contains(&n) {
        return Err(invalid("n", format!("`n` must be 1 to {max}")));
    }
    if body.response_format.as_deref().is_some_and(|f| f != "b64_json") {
        return Err(unsupported("response_format", "only `b64_json` is served (images are not hosted)"));
    }
    if body.output_format.as_deref().is_some_and(|f| f != "png") {
        return Err(unsupported("output_format", "only `png`"));
    }
    if body.stream == Some(true) {
        return Err(unsupported("stream", "images are returned whole"));
    }
    let size = body.size.unwrap_or_else(|| "1024x1024".into());
    let (tx, rx) = oneshot::channel();
    let msg = Msg::Images {
        size: size.clone(),
        prompts: vec![body.prompt; n as usize],
        due: due(req, policy, tier)?,
        reply: tx,
    };
    app.diffusion.send(&app.policies, msg).await?;
    let done = rx
        .await
        .map_err(|_| ApiError::EngineFailed("the diffusion scheduler dropped the request".into()))??;
    let data: Vec<_> = done.images.iter().map(|b| json!({"b64_json": b, "revised_prompt": null})).collect();
    let created = crate::clock::unix_s() as u64;
    let mut resp = json_response(
        StatusCode::OK,
        &json!({"created": created, "data": data, "model": model, "size": size, "output_format": "png"}),
    );
    decision(&mut resp, policy.diffusion.admission, done.predicted_ms);
    Ok(resp)
}

fn decision(resp: &mut Response<GatewayBody>, admission: bool, predicted_ms: f64) {
    let h = resp.headers_mut();
    h.insert("x-admission", HeaderValue::from_static("admitted"));
    let reason = if admission { "deadline_feasible" } else { "admission_off" };
    h.insert("x-admission-reason", HeaderValue::from_static(reason));
    if let Ok(v) = HeaderValue::from_str(&format!("{predicted_ms:.1}")) {
        h.insert("x-predicted-e2e-ms", v);
    }
}

/// The create form's fields, from JSON or `multipart/form-data`.
fn create_fields(req: &Req, raw: &[u8]) -> Result<std::collections::BTreeMap<String, String>, ApiError> {
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Some(b) = form::boundary(ct) {
        return form::fields(raw, &b).map_err(|e| match e {
            Some(name) => unsupported(&name, "files are not accepted (text-to-video only)"),
            None => ApiError::BodyRead("malformed multipart/form-data body".into()),
        });
    }
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(raw).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    v.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            serde_json::Value::Number(n) => Ok((k, n.to_string())),
            _ if k == "input_reference" => Err(unsupported(&k, "text-to-video only")),
            _ => Err(invalid(&k, format!("`{k}` must be a string or a number"))),
        })
        .collect()
}

static NEXT_VIDEO: AtomicU64 = AtomicU64::new(0);

async fn create_video(
    app: &Arc<App>,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    req: &mut Req,
) -> Result<Response<GatewayBody>, ApiError> {
    let raw = req.take_read();
    let mut f = create_fields(req, &raw)?;
    if let Some(k) = f.keys().find(|k| !["prompt", "model", "seconds", "size"].contains(&k.as_str())) {
        return Err(if k == "input_reference" {
            unsupported(k, "text-to-video only")
        } else {
            ApiError::UnknownParameters(vec![k.clone()])
        });
    }
    let prompt = f.remove("prompt").ok_or_else(|| invalid("prompt", "`prompt` is required"))?;
    prompt_ok(&prompt)?;
    let model = model(policy, f.remove("model"))?;
    let seconds = match f.remove("seconds") {
        None => 4,
        Some(s) => match s.trim().parse::<i64>() {
            Ok(v) if v >= 1 => u32::try_from(v).unwrap_or(u32::MAX),
            _ => return Err(invalid("seconds", "`seconds` must be a whole number of seconds, at least 1")),
        },
    };
    let size = f.remove("size").unwrap_or_else(|| "720x1280".into());
    let nanos = crate::clock::wall().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let id = format!("video_{nanos:x}{:04x}", NEXT_VIDEO.fetch_add(1, Ordering::Relaxed) & 0xFFFF);
    let status = VideoStatus::queued();
    let record = Arc::new(VideoRecord {
        id,
        tenant: tenant.name.clone(),
        model,
        prompt,
        size,
        seconds,
        created_at: crate::clock::unix_s() as u64,
        state: Mutex::new(status),
    });
    let (tx, rx) = oneshot::channel();
    let msg = Msg::Video { record: Arc::clone(&record), due: due(req, policy, tier)?, reply: tx };
    app.diffusion.send(&app.policies, msg).await?;
    let predicted =
        rx.await.map_err(|_| ApiError::EngineFailed("the diffusion scheduler dropped the job".into()))??;
    let mut resp = json_response(StatusCode::OK, &record.object(policy.diffusion.result_ttl_s));
    decision(&mut resp, policy.diffusion.admission, predicted);
    Ok(resp)
}

fn content(record: &VideoRecord, variant: Option<String>) -> Result<Response<GatewayBody>, ApiError> {
    if variant.as_deref().is_some_and(|v| v != "video") {
        return Err(unsupported("variant", "only `video` (thumbnails and spritesheets are not made)"));
    }
    let s = record.status();
    let Some(bytes) = s.content else {
        return Err(ApiError::VideoNotReady { id: record.id.clone(), status: s.status });
    };
    let mut resp = Response::new(crate::body::full(bytes));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("image/apng"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_bounded_in_characters_not_bytes() {
        assert!(prompt_ok(&"é".repeat(MAX_PROMPT_CHARS)).is_ok(), "64,000 bytes, 32,000 characters");
        let Err(ApiError::InvalidField { param, .. }) = prompt_ok(&"a".repeat(MAX_PROMPT_CHARS + 1)) else {
            panic!("one character too many is refused");
        };
        assert_eq!(param, "prompt");
        assert!(matches!(prompt_ok(" \n\t"), Err(ApiError::InvalidField { .. })), "blank");
    }

    #[test]
    fn an_explicit_deadline_is_a_positive_finite_number_of_ms_up_to_a_day() {
        let parse = |s: &str| explicit_deadline(&HeaderValue::from_str(s).unwrap()).ok();
        assert_eq!(parse(" 1500 "), Some(1500.0));
        assert_eq!(parse("86400000"), Some(MAX_DEADLINE_MS));
        for bad in ["0", "-5", "86400001", "NaN", "inf", "1e400", "soon", ""] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
