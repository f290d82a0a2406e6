//! The live video player page (`GET /player`, docs/api.md "Video player"):
//! three static files compiled in, served with a strict Content Security
//! Policy (scripts and styles from this origin only, frames as `data:`
//! images, requests to this origin only) and no caching surprises. The
//! page asks for the API key and keeps it in the tab's memory.

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::GatewayBody;

/// One of the player's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asset {
    Page,
    Script,
    Style,
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; \
    connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(crate) fn serve(asset: Asset) -> Response<GatewayBody> {
    let (body, kind) = match asset {
        Asset::Page => (include_str!("../assets/player.html"), "text/html; charset=utf-8"),
        Asset::Script => (include_str!("../assets/player.js"), "text/javascript; charset=utf-8"),
        Asset::Style => (include_str!("../assets/player.css"), "text/css; charset=utf-8"),
    };
    let mut resp = Response::new(crate::body::full(body));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
