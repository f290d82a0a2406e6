//! Every error the public API can return, mapped to HTTP in exactly one place.
//!
//! Each variant has a stable machine label (the `code` in the OpenAI-style
//! body and the `reason` label in metrics), an HTTP status, whether retrying
//! the same request may succeed, and whose fault it was.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::body::{full, GatewayBody};

/// Which API's shapes an answer takes (its body and its errors); the wire
/// formats themselves are `wire`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Dialect {
    /// OpenAI's (every route but the Messages API's).
    #[default]
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

/// Whose fault an error was: drives alerting (only `Gateway` and `Upstream`
/// page anyone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Client,
    Upstream,
    Gateway,
}

/// What is wrong with a policy document: the key path, its line, and the
/// whole message (which names the file, line and key path too).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyProblem {
    pub key: String,
    pub line: Option<usize>,
    pub message: String,
}

/// What a per-minute rate limit counts: a closed set, each with its
/// error code and the words of its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metered {
    Requests,
    Tokens,
    VideoStreams,
}

impl Metered {
    pub fn code(self) -> &'static str {
        match self {
            Metered::Requests => "rate_limit_requests",
            Metered::Tokens => "rate_limit_tokens",
            Metered::VideoStreams => "rate_limit_video_streams",
        }
    }
}

impl std::fmt::Display for Metered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Metered::Requests => "requests",
            Metered::Tokens => "tokens",
            Metered::VideoStreams => "video streams",
        })
    }
}

/// Why a request was refused for capacity: a closed set from the policies
/// to the wire (the error code and `x-admission-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overload {
    /// Text admission and the gate.
    Admission(policies::admission::outcome::Reason),
    /// The image and video pool.
    Diffusion(policies::diffusion::RefuseReason),
}

impl Overload {
    pub fn code(self) -> &'static str {
        match self {
            Overload::Admission(r) => r.label(),
            Overload::Diffusion(r) => r.label(),
        }
    }
}

/// A public API error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)")]
    MissingKey,
    #[error("invalid API key")]
    InvalidKey,
    #[error("this API key expired")]
    ExpiredKey,
    /// The caller's key is limited to other models.
    #[error("your API key may not use the model `{0}`")]
    ModelNotAllowed(String),
    /// A tenant's or key's budget is spent until it resets.
    #[error("the {budget} budget ({limit}) is spent; it resets on {resets} (UTC)")]
    BudgetExceeded { budget: String, limit: String, resets: String, retry_after_s: u32 },
    #[error("we could not parse the JSON body of your request: {0}")]
    InvalidJson(String),
    #[error("{message}")]
    InvalidField { param: String, message: String },
    #[error("unrecognized request argument supplied: {}", .0.join(", "))]
    UnknownParameters(Vec<String>),
    #[error("unsupported parameter `{param}`: {message}")]
    UnsupportedParameter { param: String, message: String },
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    #[error("this request has {prompt_tokens} prompt tokens; your tier allows at most {limit}")]
    ContextLengthExceeded { prompt_tokens: u32, limit: u32 },
    #[error("request body is larger than the {limit}-byte limit")]
    BodyTooLarge { limit: usize },
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    #[error("the request body did not arrive within {within:?}")]
    BodyTimeout { within: std::time::Duration },
    #[error("unknown URL {0}")]
    UnknownUrl(String),
    /// The method, and the methods the URL takes (the `Allow` header).
    #[error("method {0} is not allowed on this URL (it takes {1})")]
    MethodNotAllowed(String, &'static str),
    #[error("no engine is ready to serve this request")]
    NoReadyEngine,
    #[error("every engine tried failed: {0}")]
    EngineFailed(String),
    #[error("every engine tried is at capacity: {0}")]
    EnginesAtCapacity(String),
    #[error("invalid header `{header}`: {message}")]
    InvalidHeader { header: &'static str, message: String },
    #[error("your organization already has {limit} requests in flight, the most its tier allows; retry when one finishes")]
    TenantConcurrency { limit: u32 },
    #[error(
        "your organization already has {limit} live video streams, the most its tier allows; end one first"
    )]
    VideoStreamLimit { limit: u32 },
    /// The tenant used its tier's requests, tokens or video stream
    /// creations for this minute.
    #[error("your organization has used its {limit} {what} per minute; retry in {retry_after_s} s")]
    RateLimited { what: Metered, limit: u32, retry_after_s: u32 },
    /// No engine, even idle, can meet the request's targets: not an
    /// overload (no Retry-After).
    #[error("{message}")]
    SloUnattainable { message: String },
    /// Refused for capacity; `reason`'s code is the stable label
    /// (`ttft_infeasible`, `e2e_infeasible`, `kv_headroom`,
    /// `deadline_unreachable`, `queue_timeout`, `brownout_context`,
    /// `queue_full`, `deadline_infeasible`, `deadline_unmeetable`).
    #[error("{message}")]
    Overloaded { reason: Overload, message: String, retry_after_s: u32 },
    // Images and video jobs.
    #[error("no video `{0}`")]
    VideoNotFound(String),
    /// A Responses API id this tenant has not stored (or that expired).
    #[error("no response `{0}` is stored for your organization")]
    ResponseNotFound(String),
    #[error("video `{id}` is {status}: its content is there once it is completed")]
    VideoNotReady { id: String, status: &'static str },
    // Video streams.
    #[error("no video stream `{0}`")]
    StreamNotFound(String),
    #[error("the video stream has ended")]
    StreamEnded,
    #[error("the video stream's events are already being read by another connection")]
    StreamAlreadyWatched,
    /// Even the fastest fidelity cannot keep up with playout at this load.
    #[error("{message}")]
    VideoCapacity { message: String, retry_after_s: u32 },
    /// A broken invariant of the gateway itself (a bug, never the
    /// client's doing); `what` names it in the log, not in the answer.
    #[error("the gateway failed to handle the request")]
    Internal { what: &'static str },
    // The admin API's own errors.
    #[error("missing admin token: send `Authorization: Bearer <admin token>`")]
    MissingAdminToken,
    #[error("invalid admin token")]
    InvalidAdminToken,
    #[error("the admin API is off: no [admin] tokens are configured")]
    AdminApiOff,
    /// A policy document that did not validate. The active version is
    /// unchanged.
    #[error("{}", .0.message)]
    InvalidPolicy(Box<PolicyProblem>),
    #[error("no API key `{0}`")]
    KeyNotFound(String),
    #[error("policy version `{0}` is not in the recent history (GET /admin/policies/history)")]
    UnknownPolicyVersion(String),
    #[error("{0}")]
    PolicyFileUnavailable(String),
}

impl ApiError {
    /// Stable machine label used in the body's `code` and in metrics.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MissingKey => "missing_api_key",
            ApiError::InvalidKey => "invalid_api_key",
            ApiError::ExpiredKey => "expired_api_key",
            ApiError::ModelNotAllowed(_) => "model_not_allowed",
            ApiError::BudgetExceeded { .. } => "budget_exceeded",
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidField { .. } => "invalid_value",
            ApiError::UnknownParameters(_) => "unknown_parameter",
            ApiError::UnsupportedParameter { .. } => "unsupported_parameter",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::ContextLengthExceeded { .. } => "context_length_exceeded",
            ApiError::BodyTooLarge { .. } => "request_too_large",
            ApiError::BodyRead(_) => "body_read_failed",
            ApiError::BodyTimeout { .. } => "request_timeout",
            ApiError::UnknownUrl(_) => "unknown_url",
            ApiError::MethodNotAllowed(..) => "method_not_allowed",
            ApiError::NoReadyEngine => "no_ready_engine",
            ApiError::EngineFailed(_) => "engine_failed",
            ApiError::EnginesAtCapacity(_) => "engines_at_capacity",
            ApiError::InvalidHeader { .. } => "invalid_header",
            ApiError::TenantConcurrency { .. } => "tenant_concurrency",
            ApiError::RateLimited { what, .. } => what.code(),
            ApiError::VideoStreamLimit { .. } => "video_stream_limit",
            ApiError::Overloaded { reason, .. } => reason.code(),
            ApiError::SloUnattainable { .. } => "slo_unattainable",
            ApiError::StreamNotFound(_) => "stream_not_found",
            ApiError::VideoNotFound(_) => "video_not_found",
            ApiError::ResponseNotFound(_) => "response_not_found",
            ApiError::VideoNotReady { .. } => "video_not_ready",
            ApiError::StreamEnded => "stream_ended",
            ApiError::StreamAlreadyWatched => "stream_already_watched",
            ApiError::VideoCapacity { .. } => "video_capacity",
            ApiError::MissingAdminToken => "missing_admin_token",
            ApiError::InvalidAdminToken => "invalid_admin_token",
            ApiError::AdminApiOff => "admin_api_off",
            ApiError::InvalidPolicy(_) => "invalid_policy",
            ApiError::UnknownPolicyVersion(_) => "unknown_policy_version",
            ApiError::KeyNotFound(_) => "key_not_found",
            ApiError::PolicyFileUnavailable(_) => "policy_file_unavailable",
            ApiError::Internal { .. } => "internal_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingKey
            | ApiError::InvalidKey
            | ApiError::ExpiredKey
            | ApiError::MissingAdminToken
            | ApiError::InvalidAdminToken => StatusCode::UNAUTHORIZED,
            ApiError::InvalidPolicy(_) | ApiError::SloUnattainable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::AdminApiOff | ApiError::ModelNotAllowed(_) => StatusCode::FORBIDDEN,
            ApiError::UnknownPolicyVersion(_)
            | ApiError::StreamNotFound(_)
            | ApiError::VideoNotFound(_)
            | ApiError::ResponseNotFound(_)
            | ApiError::KeyNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::VideoNotReady { .. } => StatusCode::CONFLICT,
            ApiError::StreamEnded | ApiError::StreamAlreadyWatched => StatusCode::CONFLICT,
            ApiError::VideoCapacity { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::PolicyFileUnavailable(_) => StatusCode::CONFLICT,
            ApiError::InvalidJson(_)
            | ApiError::InvalidField { .. }
            | ApiError::UnknownParameters(_)
            | ApiError::UnsupportedParameter { .. }
            | ApiError::ContextLengthExceeded { .. }
            | ApiError::BodyRead(_)
            | ApiError::InvalidHeader { .. } => StatusCode::BAD_REQUEST,
            ApiError::TenantConcurrency { .. }
            | ApiError::RateLimited { .. }
            | ApiError::BudgetExceeded { .. }
            | ApiError::VideoStreamLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::ModelNotFound(_) | ApiError::UnknownUrl(_) => StatusCode::NOT_FOUND,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::MethodNotAllowed(..) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::NoReadyEngine | ApiError::EnginesAtCapacity(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::EngineFailed(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's error `type`.
    pub fn kind(&self) -> &'static str {
        match self.fault() {
            Fault::Client if self.status() == StatusCode::UNAUTHORIZED => "authentication_error",
            Fault::Client if self.status() == StatusCode::NOT_FOUND => "not_found_error",
            Fault::Client if self.status() == StatusCode::FORBIDDEN => "permission_error",
            Fault::Client if self.status() == StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            Fault::Client => "invalid_request_error",
            Fault::Upstream | Fault::Gateway => "server_error",
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            ApiError::NoReadyEngine | ApiError::EngineFailed(_) | ApiError::EnginesAtCapacity(_) => {
                Fault::Upstream
            }
            // Capacity refusals: nobody failed, the fleet is full; they are
            // the gateway's decision, so counted as its own.
            ApiError::Overloaded { .. } | ApiError::VideoCapacity { .. } | ApiError::Internal { .. } => {
                Fault::Gateway
            }
            _ => Fault::Client,
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn retryable(&self) -> bool {
        self.retry_after_s().is_some()
    }

    /// Seconds a client should wait before retrying (`Retry-After`), for
    /// errors a retry may fix.
    pub fn retry_after_s(&self) -> Option<u32> {
        match self {
            ApiError::NoReadyEngine
            | ApiError::EngineFailed(_)
            | ApiError::EnginesAtCapacity(_)
            | ApiError::TenantConcurrency { .. } => Some(1),
            ApiError::Overloaded { retry_after_s, .. }
            | ApiError::VideoCapacity { retry_after_s, .. }
            | ApiError::RateLimited { retry_after_s, .. }
            | ApiError::BudgetExceeded { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// The request field the error is about, if any.
    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidField { param, .. } | ApiError::UnsupportedParameter { param, .. } => {
                Some(param)
            }
            ApiError::UnknownParameters(p) => p.first().map(String::as_str),
            ApiError::ModelNotFound(_) | ApiError::ModelNotAllowed(_) => Some("model"),
            ApiError::ResponseNotFound(_) => Some("previous_response_id"),
            ApiError::ContextLengthExceeded { .. } => Some("messages"),
            ApiError::InvalidHeader { header, .. } => Some(header),
            ApiError::InvalidPolicy(p) if !p.key.is_empty() => Some(&p.key),
            _ => None,
        }
    }

    /// The OpenAI-style JSON error object (`{"error": {...}}`).
    pub fn body(&self) -> serde_json::Value {
        let mut body = json!({"error": {
            "message": self.to_string(),
            "type": self.kind(),
            "param": self.param(),
            "code": self.code(),
        }});
        if let ApiError::InvalidPolicy(p) = self {
            body["error"]["line"] = json!(p.line);
        }
        body
    }

    /// The status in `dialect`: Anthropic answers a capacity refusal with
    /// its own 529 (`overloaded_error`), which its SDKs retry.
    pub(crate) fn status_as(&self, dialect: Dialect) -> StatusCode {
        match (dialect, self.status()) {
            (Dialect::Anthropic, StatusCode::SERVICE_UNAVAILABLE) => {
                StatusCode::from_u16(529).expect("529 is a valid status")
            }
            (_, status) => status,
        }
    }

    /// Anthropic's error `type` for this error.
    fn anthropic_kind(&self) -> &'static str {
        match self.status_as(Dialect::Anthropic).as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            500.. => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The error body in `dialect`'s shape: OpenAI's `{"error": {...}}`,
    /// or Anthropic's `{"type": "error", "error": {"type", "message"}}`.
    pub(crate) fn body_as(&self, dialect: Dialect) -> serde_json::Value {
        match dialect {
            Dialect::OpenAi => self.body(),
            // Anthropic's messages name the field they are about.
            Dialect::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_kind(),
                "message": match (self, self.param()) {
                    (ApiError::InvalidField { .. }, Some(p)) => format!("{p}: {self}"),
                    _ => self.to_string(),
                },
            }}),
        }
    }

    pub fn into_response(self) -> Response<GatewayBody> {
        self.into_response_as(Dialect::OpenAi)
    }

    /// The error's answer in `dialect`'s shape (status, body, headers).
    pub(crate) fn into_response_as(self, dialect: Dialect) -> Response<GatewayBody> {
        let mut resp = Response::new(full(Bytes::from(self.body_as(dialect).to_string())));
        *resp.status_mut() = self.status_as(dialect);
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(s) = self.retry_after_s() {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status() == StatusCode::UNAUTHORIZED {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let ApiError::MethodNotAllowed(_, allow) = &self {
            h.insert(header::ALLOW, HeaderValue::from_static(allow)); // RFC 9110: a 405 names what is allowed
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_and_names_the_field() {
        let e = ApiError::InvalidField { param: "temperature".into(), message: "must be <= 2".into() };
        let b = e.body();
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "invalid_value");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn upstream_errors_are_retryable_with_retry_after() {
        let r = ApiError::NoReadyEngine.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(ApiError::InvalidKey.into_response().status(), StatusCode::UNAUTHORIZED);
        assert_eq!(ApiError::InvalidKey.kind(), "authentication_error");
    }
}
