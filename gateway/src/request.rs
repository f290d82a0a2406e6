//! The request as routes see it: its parts and a body a route may take
//! once (read bounded in size and time; an unread one drained, bounded,
//! before an early answer), the bearer credential, and JSON answers.
//! Shared by the public routes (`service.rs`, `video/routes.rs`) and the
//! admin listener.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::{full, GatewayBody};
use crate::error::ApiError;

/// A request whose body a route may take (to read it) once; a body nobody
/// took is drained, bounded, before an early answer (`drain_unread`), so a
/// client still uploading is not cut short by a reset (libcurl reports
/// such a reset over HTTP/2 as a transport error instead of our answer).
#[derive(Debug)]
pub struct Req {
    pub parts: http::request::Parts,
    body: Option<Incoming>,
    /// The body, once the stack's body layer has read it.
    read: Option<Bytes>,
}

impl Req {
    pub fn new(req: Request<Incoming>) -> Self {
        let (parts, body) = req.into_parts();
        Self { parts, body: Some(body), read: None }
    }

    /// Reads the whole body, bounded (`read_body`), for [`Self::take_read`].
    pub(crate) async fn read(&mut self, config: &crate::config::GatewayConfig) -> Result<(), ApiError> {
        let bytes = read_body(self, config).await?;
        self.read = Some(bytes);
        Ok(())
    }

    /// The body the stack's body layer read (empty for a route whose
    /// requests carry none).
    pub(crate) fn take_read(&mut self) -> Bytes {
        self.read.take().unwrap_or_default()
    }

    pub(crate) fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.parts.extensions
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.parts.headers
    }

    pub fn uri(&self) -> &http::Uri {
        &self.parts.uri
    }

    pub fn method(&self) -> &Method {
        &self.parts.method
    }

    fn http1(&self) -> bool {
        self.parts.version < http::Version::HTTP_2
    }

    /// The body, if no route took it yet.
    fn take_body(&mut self) -> Option<Incoming> {
        self.body.take()
    }

    /// Reads and discards a body nobody read, up to `limits.drain_body_bytes`
    /// and `limits.drain_body_timeout_ms` (HTTP/1.1: 64 MiB and 5 s, as
    /// before): then the answer goes out after the client's upload ended.
    /// A body declared larger than the bound is not read (the stream is
    /// reset after the answer, as before).
    pub async fn drain_unread(&mut self, limits: &crate::limits::Limits) {
        let Some(body) = self.body.take() else { return };
        if http_body::Body::is_end_stream(&body) {
            return;
        }
        let (bytes, within) = if self.http1() {
            (HTTP1_DRAIN_BYTES, HTTP1_DRAIN_TIME)
        } else {
            (limits.drain_body_bytes, limits.drain_body_timeout())
        };
        if declared_length(self.headers()).is_some_and(|n| n > bytes as u64) {
            return;
        }
        drain(body, bytes, within).await;
    }
}

fn declared_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// HTTP/1.1 has no way to refuse a body in flight: an over-limit or
/// unwanted body is read and discarded up to these bounds, else the
/// connection is closed.
const HTTP1_DRAIN_BYTES: usize = 64 << 20;
const HTTP1_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// The credential of `Authorization: Bearer <credential>`, if well-formed.
/// A tenant's API key: `Authorization: Bearer <key>`, else Anthropic's
/// `x-api-key: <key>` (what its SDKs send; accepted on every route).
pub(crate) fn api_key(headers: &HeaderMap) -> Option<&str> {
    bearer(headers).or_else(|| headers.get("x-api-key")?.to_str().ok().map(str::trim))
}

pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")).map(str::trim)
}

/// The request body, at most `max_body_bytes` (413) and within
/// `limits.body_read_timeout_ms` (408). An over-limit body is drained
/// (bounded, see [`Req::drain_unread`]) before the 413 goes out.
pub(crate) async fn read_body(
    req: &mut Req,
    config: &crate::config::GatewayConfig,
) -> Result<Bytes, ApiError> {
    let within = config.limits.body_read_timeout();
    let result = tokio::time::timeout(within, read_body_bounded(req, config.max_body_bytes))
        .await
        .unwrap_or(Err(ApiError::BodyTimeout { within }));
    if let Err(ApiError::BodyTooLarge { .. }) = &result {
        req.drain_unread(&config.limits).await;
    }
    result
}

/// [`read_body`] of a whole request (the admin listener).
pub(crate) async fn read_request_body(
    req: Request<Incoming>,
    config: &crate::config::GatewayConfig,
) -> Result<Bytes, ApiError> {
    read_body(&mut Req::new(req), config).await
}

async fn read_body_bounded(req: &mut Req, limit: usize) -> Result<Bytes, ApiError> {
    if declared_length(req.headers()).is_some_and(|n| n > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit }); // the body stays for the drain
    }
    let Some(mut body) = req.take_body() else { return Ok(Bytes::new()) };
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BodyRead(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                req.body = Some(body); // the rest is drained before the 413
                return Err(ApiError::BodyTooLarge { limit });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// Reads and discards the rest of a body, at most `bytes` within `within`.
async fn drain(mut body: Incoming, bytes: usize, within: std::time::Duration) {
    let _ = tokio::time::timeout(within, async {
        let mut seen = 0;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > bytes {
                break;
            }
        }
    })
    .await;
}

pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<GatewayBody> {
    let mut resp = Response::new(full(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A path table (matchit) from `(pattern, value)` pairs; the patterns are
/// this crate's constants, so a bad one is a bug caught by any test.
pub(crate) fn route_table<T>(routes: impl IntoIterator<Item = (&'static str, T)>) -> matchit::Router<T> {
    let mut router = matchit::Router::new();
    for (path, value) in routes {
        router.insert(path, value).expect("the route table is valid");
    }
    router
}
