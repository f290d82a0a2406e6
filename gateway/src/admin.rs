//! The admin listener (its own port, loopback by default): the operations
//! port. `GET /metrics` (Prometheus) needs no token; the admin API needs a
//! bearer admin token (none configured: it answers 403 `admin_api_off`):
//!
//! - `GET  /admin/policies`: the active document (tenant keys redacted),
//!   its version, when and from where it was applied
//! - `PUT  /admin/policies[?dry_run=true]`: validate a document (the body,
//!   TOML) and apply it, or with `dry_run` only report whether it is valid
//!   and what would change
//! - `POST /admin/policies/reload`: re-read the policy file (as SIGHUP)
//! - `POST /admin/policies/rollback?version=V[&dry_run=true]`: apply a
//!   recent version again
//! - `GET  /admin/policies/history`: recent versions, newest first
//! - `GET  /admin/policies/audit`: recent applied and rejected changes
//! - `POST /admin/keys`, `GET /admin/keys[/{id}]`, `DELETE /admin/keys/{id}`,
//!   `POST /admin/keys/{id}/rotate`: API keys made at run time (the secret
//!   is in the answer to POST and rotate only)
//! - `GET  /admin/usage?from=&to=&group_by=&format=`: usage and spend
//! - `GET  /admin/video/streams`: every live video stream's status
//! - `POST /admin/video/streams/{id}/move?engine=ID`: move a stream to
//!   another engine at its next chunk boundary (drain an engine by hand)
//!
//! Errors use the public API's taxonomy (`error.rs`).

use std::convert::Infallible;
use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::audit::Source;
use crate::body::{full, GatewayBody};
use crate::error::{ApiError, PolicyProblem};
use crate::reload::{Accepted, Mode, ReloadError};
use crate::request::{bearer, json_response, read_request_body};
use crate::App;

/// One admin token: its id (recorded in the audit log) and its secret.
#[derive(Clone)]
pub struct Token {
    pub id: String,
    secret: String,
}

impl Token {
    pub fn new(id: String, secret: String) -> Self {
        Self { id, secret }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}, redacted)", self.id)
    }
}

/// What the admin listener serves.
#[derive(Debug)]
pub struct Admin {
    pub app: Arc<App>,
    pub tokens: Vec<Token>,
}

/// Serves one admin request. Never fails: every error becomes a response.
pub async fn handle(admin: Arc<Admin>, req: Request<Incoming>) -> Result<Response<GatewayBody>, Infallible> {
    // Metrics need no token (scrapers reach the admin listener only).
    let metrics = endpoints().at(req.uri().path()).is_ok_and(|m| *m.value == Endpoint::Metrics);
    if metrics && req.method() == Method::GET {
        return Ok(prometheus());
    }
    let result = match authorize(&admin.tokens, req.headers()) {
        Ok(token_id) => route(&admin.app, req, token_id).await,
        Err(e) => Err(e),
    };
    Ok(result.unwrap_or_else(|e| {
        tracing::info!(event = "admin_request_error", code = e.code(), error = %e);
        e.into_response()
    }))
}

async fn route(
    app: &App,
    req: Request<Incoming>,
    token_id: String,
) -> Result<Response<GatewayBody>, ApiError> {
    let store = &app.policies;
    let dry_run = query(&req, "dry_run").is_some_and(|v| v == "true" || v == "1");
    let mode = if dry_run { Mode::DryRun } else { Mode::Apply };
    let path = req.uri().path().to_string();
    let Ok(found) = endpoints().at(&path) else { return Err(ApiError::UnknownUrl(path)) };
    match (*found.value, req.method().clone()) {
        (Endpoint::Policies, Method::GET) => {
            let (record, document) = store.active_record();
            let file = store.path().map(|p| p.display().to_string());
            Ok(json_response(StatusCode::OK, &json!({"active": record, "file": file, "document": document})))
        }
        (Endpoint::Policies, Method::PUT) => {
            let body = read_request_body(req, &app.config).await?;
            let text = std::str::from_utf8(&body)
                .map_err(|_| ApiError::BodyRead("the policy document must be UTF-8 TOML text".into()))?;
            let source = Source::Api { token_id };
            accepted(store.apply("PUT /admin/policies", text, source, mode), dry_run, store)
        }
        (Endpoint::Reload, Method::POST) => {
            accepted(store.reload_file(Source::Api { token_id }), false, store)
        }
        (Endpoint::Rollback, Method::POST) => {
            let version = query(&req, "version").ok_or_else(|| ApiError::InvalidField {
                param: "version".into(),
                message: "name the version to roll back to: ?version=<id> (see /admin/policies/history)"
                    .into(),
            })?;
            accepted(store.rollback(&version, Source::Rollback { token_id }, mode), dry_run, store)
        }
        (Endpoint::History, Method::GET) => {
            let active = store.current().version.clone();
            Ok(json_response(StatusCode::OK, &json!({"active": active, "versions": store.history()})))
        }
        (Endpoint::Audit, Method::GET) => {
            Ok(json_response(StatusCode::OK, &json!({"entries": store.audit()})))
        }
        (Endpoint::Fleet, Method::GET) => Ok(json_response(StatusCode::OK, &app.fleet.detail())),
        (Endpoint::Keys, Method::GET) => {
            let data: Vec<_> = app.keys.list().iter().map(|k| k.public()).collect();
            Ok(json_response(StatusCode::OK, &json!({"object": "list", "data": data})))
        }
        (Endpoint::Keys, Method::POST) => {
            let body = read_request_body(req, &app.config).await?;
            create_key(app, &body, &token_id).await
        }
        (Endpoint::Key, Method::GET) => {
            let id = found.params.get("id").unwrap_or_default();
            let k = app.keys.get(id).ok_or_else(|| ApiError::KeyNotFound(id.to_string()))?;
            Ok(json_response(StatusCode::OK, &k.public()))
        }
        (Endpoint::Key, Method::DELETE) => {
            let id = found.params.get("id").unwrap_or_default().to_string();
            let now = crate::clock::unix_s() as u64;
            let r = app.keys.revoke(&id, now).map_err(key_error)?;
            audit_key(app, &token_id, &r.id, format!("API key {} of tenant {} revoked", r.id, r.tenant));
            crate::usage::sync_keys(app).await;
            Ok(json_response(
                StatusCode::OK,
                &json!({"id": r.id, "object": "api_key", "deleted": true, "revoked_at": r.revoked_at}),
            ))
        }
        (Endpoint::Rotate, Method::POST) => {
            let id = found.params.get("id").unwrap_or_default().to_string();
            let (r, secret) = app.keys.rotate(&id).map_err(key_error)?;
            audit_key(app, &token_id, &r.id, format!("API key {} of tenant {} rotated", r.id, r.tenant));
            crate::usage::sync_keys(app).await;
            let mut v = r.public();
            v["key"] = json!(secret);
            Ok(json_response(StatusCode::OK, &v))
        }
        (Endpoint::Usage, Method::GET) => usage_report(app, &req).await,
        (Endpoint::Streams, Method::GET) => {
            let now = app.video.now();
            let all: Vec<_> = app.video.all().iter().map(|s| s.status(now)).collect();
            Ok(json_response(StatusCode::OK, &json!({"streams": all})))
        }
        (Endpoint::StreamMove, Method::POST) => {
            let id = found.params.get("id").unwrap_or_default();
            move_stream(app, id, query(&req, "engine"), &token_id)
        }
        (endpoint, method) => Err(ApiError::MethodNotAllowed(method.to_string(), endpoint.methods())),
    }
}

/// What an admin path names, before its method is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Metrics,
    Policies,
    Reload,
    Rollback,
    History,
    Audit,
    Fleet,
    Streams,
    StreamMove,
    Keys,
    Key,
    Rotate,
    Usage,
}

impl Endpoint {
    /// The methods the path takes (a 405's `Allow` header).
    fn methods(self) -> &'static str {
        match self {
            Endpoint::Policies => "GET, PUT",
            Endpoint::Reload | Endpoint::Rollback | Endpoint::StreamMove | Endpoint::Rotate => "POST",
            Endpoint::Keys => "GET, POST",
            Endpoint::Key => "GET, DELETE",
            Endpoint::Metrics
            | Endpoint::History
            | Endpoint::Audit
            | Endpoint::Fleet
            | Endpoint::Streams
            | Endpoint::Usage => "GET",
        }
    }
}

/// The admin listener's paths (matchit).
fn endpoints() -> &'static matchit::Router<Endpoint> {
    static ROUTER: std::sync::OnceLock<matchit::Router<Endpoint>> = std::sync::OnceLock::new();
    ROUTER.get_or_init(|| {
        crate::request::route_table([
            ("/metrics", Endpoint::Metrics),
            ("/admin/policies", Endpoint::Policies),
            ("/admin/policies/reload", Endpoint::Reload),
            ("/admin/policies/rollback", Endpoint::Rollback),
            ("/admin/policies/history", Endpoint::History),
            ("/admin/policies/audit", Endpoint::Audit),
            ("/admin/fleet", Endpoint::Fleet),
            ("/admin/video/streams", Endpoint::Streams),
            ("/admin/video/streams/{id}/move", Endpoint::StreamMove),
            ("/admin/keys", Endpoint::Keys),
            ("/admin/keys/{id}", Endpoint::Key),
            ("/admin/keys/{id}/rotate", Endpoint::Rotate),
            ("/admin/usage", Endpoint::Usage),
        ])
    })
}

/// `POST /admin/keys`: a key for a tenant of the policy in force; the
/// secret is in this answer only.
async fn create_key(app: &App, body: &[u8], token_id: &str) -> Result<Response<GatewayBody>, ApiError> {
    let req: crate::keys::NewKey =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let policy = app.policies.current();
    let now = crate::clock::unix_s() as u64;
    let (record, secret) = app.keys.create(req, &policy, now).map_err(key_error)?;
    let summary = format!(
        "API key {} made for tenant {} (tier {}, expires {}, models {}, budget {})",
        record.id,
        record.tenant,
        record.tier.as_deref().unwrap_or("the tenant's"),
        record.expires_at.map_or("never".to_string(), |e| crate::audit::rfc3339(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(e)
        )),
        record.models.as_ref().map_or("all".to_string(), |m| m.join(",")),
        serde_json::to_string(&record.budget).unwrap_or_default(),
    );
    audit_key(app, token_id, &record.id, summary);
    crate::usage::sync_keys(app).await;
    let mut v = record.public();
    v["key"] = json!(secret); // shown once
    Ok(json_response(StatusCode::CREATED, &v))
}

fn key_error(e: crate::keys::KeyError) -> ApiError {
    match e {
        crate::keys::KeyError::Invalid(param, message) => ApiError::InvalidField { param, message },
        crate::keys::KeyError::NotFound(id) => ApiError::KeyNotFound(id),
        crate::keys::KeyError::Full => ApiError::InvalidField {
            param: "tenant".into(),
            message: format!("the gateway holds {} keys, its most", crate::keys::MAX_KEYS),
        },
    }
}

/// A key change in the policy audit trail (its version is the key id).
fn audit_key(app: &App, token_id: &str, id: &str, summary: String) {
    let source = Source::Api { token_id: token_id.to_string() };
    let entry = crate::audit::AuditEntry::new(crate::audit::Outcome::Applied, &source, id, "-", summary);
    app.policies.record_audit(entry);
}

/// `GET /admin/usage?from=YYYY-MM-DD&to=YYYY-MM-DD&group_by=key,model&format=csv`:
/// usage and spend of days `from..=to` (default: this month to today),
/// summed by the dimensions asked (`key`, `tenant`, `model`, `day`;
/// default `tenant`), as JSON or CSV.
async fn usage_report(app: &App, req: &Request<Incoming>) -> Result<Response<GatewayBody>, ApiError> {
    use crate::usage::{day_of, day_string, parse_day, Dimension};
    let today = day_of(crate::clock::unix_s() as u64);
    let day = |name: &str, default: u32| -> Result<u32, ApiError> {
        match query(req, name) {
            None => Ok(default),
            Some(v) => parse_day(&v).ok_or_else(|| ApiError::InvalidField {
                param: name.into(),
                message: "a date, YYYY-MM-DD".into(),
            }),
        }
    };
    let first = crate::usage::UsageStore::refresh_days(crate::clock::unix_s() as u64)[0];
    let (from, to) = (day("from", first)?, day("to", today)?);
    if from > to || to - from >= crate::usage::KEEP_DAYS {
        return Err(ApiError::InvalidField {
            param: "from".into(),
            message: format!("from must be before to, at most {} days apart", crate::usage::KEEP_DAYS),
        });
    }
    let group_by = query(req, "group_by").unwrap_or_else(|| "tenant".into());
    let dims = group_by
        .split(',')
        .map(|d| {
            Dimension::parse(d).ok_or_else(|| ApiError::InvalidField {
                param: "group_by".into(),
                message: format!("`{d}`: group by key, tenant, model or day (comma-separated)"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    crate::usage::refresh_range(app, from, to).await;
    let rows = app.usage.report(from, to, &dims);
    if query(req, "format").as_deref() == Some("csv") {
        let mut csv = dims.iter().map(|d| d.name()).collect::<Vec<_>>().join(",");
        csv.push_str(",requests,prompt_tokens,completion_tokens,cached_tokens,cost_usd\n");
        for (group, c) in &rows {
            let cells: Vec<String> = group.iter().map(|g| csv_cell(g)).collect();
            csv.push_str(&format!(
                "{},{},{},{},{},{:.6}\n",
                cells.join(","),
                c.requests,
                c.prompt_tokens,
                c.completion_tokens,
                c.cached_tokens,
                c.cost_micro_usd as f64 / 1e6
            ));
        }
        let mut resp = Response::new(full(csv));
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
        return Ok(resp);
    }
    let data: Vec<_> = rows
        .iter()
        .map(|(group, c)| {
            let mut row = serde_json::Map::new();
            for (d, g) in dims.iter().zip(group) {
                row.insert(d.name().into(), json!(g));
            }
            row.insert("requests".into(), json!(c.requests));
            row.insert("prompt_tokens".into(), json!(c.prompt_tokens));
            row.insert("completion_tokens".into(), json!(c.completion_tokens));
            row.insert("cached_tokens".into(), json!(c.cached_tokens));
            row.insert("cost_usd".into(), json!(c.cost_micro_usd as f64 / 1e6));
            serde_json::Value::Object(row)
        })
        .collect();
    let body = json!({"object": "usage", "from": day_string(from), "to": day_string(to),
                      "group_by": dims.iter().map(|d| d.name()).collect::<Vec<_>>(), "data": data});
    Ok(json_response(StatusCode::OK, &body))
}

/// A CSV cell: quoted when it holds a comma, quote or line break.
fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Plans a move of stream `id` to engine `engine` (by engine id); the
/// stream's driver performs it at its next chunk boundary.
fn move_stream(
    app: &App,
    id: &str,
    engine: Option<String>,
    token_id: &str,
) -> Result<Response<GatewayBody>, ApiError> {
    let stream = app.video.get_any(id).ok_or_else(|| ApiError::StreamNotFound(id.to_string()))?;
    let engine = engine.ok_or_else(|| ApiError::InvalidField {
        param: "engine".into(),
        message: "name the target engine: ?engine=<engine id>".into(),
    })?;
    let pool = &app.engines;
    let to = (0..pool.len())
        .find(|&i| pool.slot(i).spec.id == engine && pool.slot(i).is_ready())
        .ok_or_else(|| ApiError::InvalidField {
            param: "engine".into(),
            message: format!("no ready engine `{engine}`"),
        })?;
    let from = {
        let mut st = stream.lock();
        if st.ended.is_some() {
            return Err(ApiError::StreamEnded);
        }
        st.move_to = Some(to);
        st.home
    };
    stream.wake.notify_one();
    tracing::info!(event = "video_move_requested", stream = id, from, to, admin = token_id);
    let from = pool.slot(from).spec.id.clone();
    Ok(json_response(StatusCode::ACCEPTED, &json!({"stream": id, "from": from, "to": engine})))
}

/// The response to a validated (and maybe applied) document.
fn accepted(
    result: Result<Accepted, ReloadError>,
    dry_run: bool,
    store: &crate::reload::PolicyStore,
) -> Result<Response<GatewayBody>, ApiError> {
    let a = result.map_err(|e| match e {
        ReloadError::Invalid(p) => {
            let (key, line) = match &p {
                policies::PolicyError::Parse { key, line, .. } => (key.clone(), Some(*line)),
                policies::PolicyError::Invalid { key, line, .. } => (key.clone(), *line),
            };
            ApiError::InvalidPolicy(Box::new(PolicyProblem { key, line, message: p.to_string() }))
        }
        ReloadError::UnknownVersion(v) => ApiError::UnknownPolicyVersion(v),
        e @ (ReloadError::Read(..) | ReloadError::NoFile) => ApiError::PolicyFileUnavailable(e.to_string()),
    })?;
    let changes: Vec<_> =
        a.changes.iter().map(|c| json!({"key": c.key, "old": c.old, "new": c.new})).collect();
    let (persisted, persist_error) = match &a.persisted {
        None => (None, None),
        Some(Ok(())) => (Some(true), None),
        Some(Err(e)) => (Some(false), Some(e.clone())),
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "valid": true,
            "dry_run": dry_run,
            "applied": a.applied,
            "version": a.version,
            "previous": a.previous,
            "active": store.current().version,
            "changes": changes,
            "summary": policies::text::summary(&a.changes),
            "persisted": persisted,
            "persist_error": persist_error,
        }),
    ))
}

fn prometheus() -> Response<GatewayBody> {
    let mut resp = Response::new(full(crate::metrics::handle().render()));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    resp
}

/// The id of the admin token the request carries.
fn authorize(tokens: &[Token], headers: &HeaderMap) -> Result<String, ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::AdminApiOff);
    }
    let given = bearer(headers).ok_or(ApiError::MissingAdminToken)?;
    // Every token is compared, each in constant time: the response time
    // says nothing about how much of a guess matched.
    let mut found = None;
    for t in tokens {
        if engine_api::constant_time_eq(t.secret.as_bytes(), given.as_bytes()) {
            found = Some(t.id.clone());
        }
    }
    found.ok_or(ApiError::InvalidAdminToken)
}

/// The value of query parameter `name`.
fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, "true"));
        (k == name).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_exactly() {
        let tokens = vec![
            Token::new("ops".into(), "0123456789abcdef".into()),
            Token::new("ci".into(), "fedcba9876543210".into()),
        ];
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            authorize(&tokens, &h)
        };
        assert_eq!(with("Bearer fedcba9876543210"), Ok("ci".to_string()));
        assert_eq!(with("Bearer fedcba987654321"), Err(ApiError::InvalidAdminToken));
        assert_eq!(with("Bearer fedcba98765432100"), Err(ApiError::InvalidAdminToken));
        assert_eq!(with("Basic abc"), Err(ApiError::MissingAdminToken));
        assert_eq!(authorize(&tokens, &HeaderMap::new()), Err(ApiError::MissingAdminToken));
        assert!(!format!("{:?}", tokens[0]).contains("0123"));
    }
}
