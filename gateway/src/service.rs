//! The public routes, under the layers of `stack.rs` (request id, metrics,
//! policy snapshot, errors, auth, body limit).
//!
//! The generation path (`completions`: hints, plan, limits, admission,
//! dispatch, relay) is in `service/completions.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderValue, Response, StatusCode};
use policies::{PolicyDocument, Tenant, Tier};
use serde_json::json;

use crate::admission::Verdict;

use crate::body::GatewayBody;
use crate::error::ApiError;
use crate::headers as hdr;
use crate::openai::Kind;
use crate::request::{json_response, Req};
use crate::App;

mod completions;
mod embeddings;
mod fronts;
mod route;
mod traced;

use completions::completions;
pub(crate) use completions::{engine_slot, insert_engine, may_use, tenant_limits};

use fronts::{count_tokens, stored_response};
pub(crate) use route::{ResponsesRoute, Route};

/// The API a generation request came in on: one request path, several
/// wire formats (`wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Front {
    OpenAi(Kind),
    Anthropic,
    Responses,
}

/// A request answered with an error, with admission's verdict when it got
/// that far (for the decision headers). The stack's error layer turns it
/// into the response (`stack.rs`).
#[derive(Debug)]
pub(crate) struct Failed {
    pub error: ApiError,
    pub verdict: Option<Verdict>,
}

impl From<ApiError> for Failed {
    fn from(error: ApiError) -> Self {
        Self { error, verdict: None }
    }
}

/// A request's id and arrival (a request extension, set by the stack's id
/// layer).
#[derive(Debug, Clone)]
pub(crate) struct Ident {
    pub request_id: String,
    pub arrived: Instant,
}

/// Who the request's key belongs to (a request extension, set by the auth
/// layer): a tenant of the request's policy snapshot (an index), the tier
/// the key names if not the tenant's, and the key's record when it was
/// made at run time (`/admin/keys`).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub tenant: usize,
    pub tier: Option<usize>,
    pub key: Option<Arc<crate::keys::KeyRecord>>,
}

/// The caller's tenant and tier.
pub(crate) fn caller<'a>(
    policy: &'a PolicyDocument,
    found: Option<&Caller>,
) -> Result<(&'a Tenant, &'a Tier), ApiError> {
    let c = found.ok_or(ApiError::MissingKey)?;
    let (tenant, tier) = policy.tenant_at(c.tenant);
    Ok((tenant, c.tier.map_or(tier, |t| &policy.tiers[t])))
}

/// The owner of a key: a policy document key (as written, or by its
/// SHA-256 in `key_hashes`), else a live key made at run time whose tenant
/// (and tier) the document still has.
pub(crate) fn identify(app: &App, policy: &PolicyDocument, secret: &str) -> Result<Caller, ApiError> {
    if let Some(tenant) = policy.key_owner(secret) {
        return Ok(Caller { tenant, tier: None, key: None });
    }
    let hash = crate::keys::hash(secret);
    if let Some(tenant) = policy.hashed_key_owner(&hash) {
        return Ok(Caller { tenant, tier: None, key: None });
    }
    let record = app.keys.by_hash(&hash).ok_or(ApiError::InvalidKey)?;
    if record.revoked_at.is_some() {
        return Err(ApiError::InvalidKey);
    }
    if !record.live(crate::clock::unix_s() as u64) {
        return Err(ApiError::ExpiredKey);
    }
    let tenant = policy.tenant_index(&record.tenant).ok_or(ApiError::InvalidKey)?;
    let tier = match record.tier.as_deref() {
        Some(name) => Some(policy.tiers.iter().position(|t| t.name == name).ok_or(ApiError::InvalidKey)?),
        None => None,
    };
    Ok(Caller { tenant, tier, key: Some(record) })
}

/// The router, innermost in the stack (`stack.rs`): the route's work, under
/// the policy version, request id, caller and body the layers above set.
/// An error answers after the client's upload ends (`drain_unread`).
pub(crate) async fn route(
    app: Arc<App>,
    mut req: Req,
    (ctx, route): (Ident, Route),
    policy: Arc<PolicyDocument>,
    found: Option<Caller>,
) -> Result<Response<GatewayBody>, Failed> {
    let policy = &policy;
    // The auth layer identified the caller of every route that needs a key.
    let key = found.as_ref().and_then(|c| c.key.clone());
    let result = match route {
        Route::Completions(kind) => match caller(policy, found.as_ref()) {
            Ok(who) => {
                completions(&app, policy, who, &mut req, (Front::OpenAi(kind), key.as_deref()), &ctx).await
            }
            Err(e) => Err(e.into()),
        },
        Route::Messages => match caller(policy, found.as_ref()) {
            Ok(who) => {
                completions(&app, policy, who, &mut req, (Front::Anthropic, key.as_deref()), &ctx).await
            }
            Err(e) => Err(e.into()),
        },
        Route::CountTokens => {
            caller(policy, found.as_ref()).and_then(|_| count_tokens(policy, &mut req)).map_err(Failed::from)
        }
        Route::Responses(ResponsesRoute::Create) => match caller(policy, found.as_ref()) {
            Ok(who) => {
                completions(&app, policy, who, &mut req, (Front::Responses, key.as_deref()), &ctx).await
            }
            Err(e) => Err(e.into()),
        },
        Route::Responses(ResponsesRoute::Get(id) | ResponsesRoute::Delete(id)) => {
            let delete = req.method() == http::Method::DELETE;
            match caller(policy, found.as_ref()) {
                Ok((t, _)) => stored_response(&app, t, &id, delete).await.map_err(Failed::from),
                Err(e) => Err(e.into()),
            }
        }
        Route::Embeddings => match caller(policy, found.as_ref()) {
            Ok(who) => embeddings::serve(&app, policy, who, &mut req, (&ctx, key.as_deref())).await,
            Err(e) => Err(e.into()),
        },
        Route::Models | Route::Model(_) => caller(policy, found.as_ref())
            .map(|_| models(policy, if let Route::Model(id) = &route { Some(id) } else { None }))
            .map_err(Failed::from),
        Route::Healthz => Ok(json_response(StatusCode::OK, &json!({"status": "alive"}))),
        Route::Readyz => Ok(readyz(&app, policy)),
        Route::Player(asset) => Ok(crate::player::serve(asset)),
        Route::Video(v) => match caller(policy, found.as_ref()) {
            Ok(who) => video(&app, policy, who, v, &mut req).await,
            Err(e) => Err(e.into()),
        },
        Route::Diffusion(d) => match caller(policy, found.as_ref()) {
            Ok(who) => diffusion(&app, policy, who, d, &mut req).await,
            Err(e) => Err(e.into()),
        },
        Route::WrongMethod(allow) => Err(ApiError::MethodNotAllowed(req.method().to_string(), allow).into()),
        Route::Unknown => Err(ApiError::UnknownUrl(req.uri().path().to_string()).into()),
    };
    if result.is_err() {
        req.drain_unread(&app.config.limits).await; // answer after the upload, not into it
    }
    result
}

/// `x-admission`, `x-admission-reason`, `x-predicted-ttft-ms`,
/// `x-predicted-e2e-ms` and `x-brownout-level` once admission has decided;
/// `x-policy-version` always.
pub(crate) fn decision_headers(h: &mut HeaderMap, version: &str, verdict: Option<&Verdict>) {
    if let Ok(v) = HeaderValue::from_str(version) {
        h.insert(hdr::X_POLICY_VERSION, v);
    }
    let Some(v) = verdict else { return };
    h.insert(hdr::X_ADMISSION, HeaderValue::from_static(v.decision.as_str()));
    if let Ok(r) = HeaderValue::from_str(&v.reason) {
        h.insert(hdr::X_ADMISSION_REASON, r);
    }
    // Predictions vary per request: never indexed (headers.rs).
    let predicted =
        [(hdr::X_PREDICTED_TTFT_MS, v.predicted_ttft_ms), (hdr::X_PREDICTED_E2E_MS, v.predicted_e2e_ms)];
    for (name, p) in predicted {
        if let Some(p) = p.and_then(hdr::tenths) {
            h.insert(name, hdr::unique(p));
        }
    }
    h.insert(hdr::X_BROWNOUT_LEVEL, HeaderValue::from(v.brownout_level));
}

/// A video route. Creating a stream goes through the tenant's limits like
/// a completion: it counts against `requests_per_minute`, and the live
/// stream holds one of the tenant's `max_concurrency` until it ends (its
/// hold is released with the stream). The other video routes act on a
/// stream the tenant already holds and are not counted again.
async fn video(
    app: &Arc<App>,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    route: crate::video::routes::VideoRoute,
    req: &mut Req,
) -> Result<Response<GatewayBody>, Failed> {
    let hold = match route {
        crate::video::routes::VideoRoute::Create => Some(tenant_limits(app, (tenant, tier), 0, req).await?),
        _ => None,
    };
    crate::video::routes::handle(app, policy, (tenant, tier), route, req, hold).await.map_err(Failed::from)
}

/// An images or videos route. A request that makes work (an images
/// request, a new video) goes through the tenant's limits: it counts
/// against `requests_per_minute`, and holds one of `max_concurrency` while
/// the gateway answers it (an images request until its PNGs are sent; a
/// video job only while it is created: jobs are bounded by
/// `[diffusion] max_jobs`).
async fn diffusion(
    app: &Arc<App>,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    route: crate::diffusion::routes::DiffusionRoute,
    req: &mut Req,
) -> Result<Response<GatewayBody>, Failed> {
    let _hold =
        if route.takes_body() { Some(tenant_limits(app, (tenant, tier), 0, req).await?) } else { None };
    crate::diffusion::routes::handle(app, policy, (tenant, tier), route, req).await.map_err(Failed::from)
}

/// `GET /v1/models`: every model the gateway serves: the text models
/// (chat, completions, embeddings, Messages, Responses) and the images and
/// videos APIs' models (`[diffusion] models`).
fn models(policy: &PolicyDocument, only: Option<&str>) -> Response<GatewayBody> {
    let object =
        |id: &str, owned_by: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": owned_by});
    let text = policy.models.iter().map(|m| (m.id.as_str(), m.owned_by.as_str()));
    let media = policy.diffusion.models.iter().map(|id| (id.as_str(), "slo-gateway"));
    let mut all: Vec<(&str, &str)> = Vec::new();
    for (id, owner) in text.chain(media) {
        if !all.iter().any(|(seen, _)| *seen == id) {
            all.push((id, owner));
        }
    }
    match only {
        None => {
            let data: Vec<_> = all.iter().map(|(id, owner)| object(id, owner)).collect();
            json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
        }
        Some(id) => match all.iter().find(|(m, _)| *m == id) {
            Some((id, owner)) => json_response(StatusCode::OK, &object(id, owner)),
            None => ApiError::ModelNotFound(id.to_string()).into_response(),
        },
    }
}

fn readyz(app: &App, policy: &PolicyDocument) -> Response<GatewayBody> {
    let mut detail = app.engines.detail();
    detail["cluster"] = app.cluster.detail();
    detail["fleet"] = app.fleet.detail();
    detail["diffusion"] = app.diffusion.detail();
    detail["admission"] = json!({
        "mode": format!("{:?}", policy.admission.mode).to_lowercase(),
        "brownout_level": app.admission.brownout_level(),
        "waiting_at_gate": app.admission.waiting(),
        "policy_version": policy.version,
    });
    let draining = app.draining.load(std::sync::atomic::Ordering::Relaxed);
    let ready = app.engines.routable_count() > 0 && !draining;
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    json_response(status, &json!({"ready": ready, "draining": draining, "detail": detail}))
}

/// The client's `x-request-id` when it is a sane token, else a new one.
pub(crate) fn request_id(app: &App, headers: &HeaderMap) -> String {
    let given = headers.get(hdr::X_REQUEST_ID).and_then(|v| v.to_str().ok()).filter(|s| {
        (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    });
    match given {
        Some(s) => s.to_string(),
        None => format!("req_{}", fresh_id(app)),
    }
}

/// An id unique to this process start (no coordination).
pub(super) fn fresh_id(app: &App) -> String {
    format!("{:08x}{:08x}", app.id_prefix, app.next_id.fetch_add(1, Ordering::Relaxed))
}
