//! Engine-to-engine state transfer, the target's side: it pulls a session's
//! wire form straight from the source engine (`GET …/snapshot`, with the
//! one-time token the source was offered), not through the gateway.
//!
//! The protocol (docs/architecture.md, "Video fleet control"): the gateway
//! offers the session on the source under a fresh token; the target pulls a
//! full copy and stages it while the source keeps generating; at the
//! stream's next chunk boundary the target pulls only what changed since
//! (the pages the chunks in between rewrote) and commits; only then does
//! the gateway switch the stream's home and end the source's copy. The
//! source owns the session until the target has confirmed; a staged copy
//! never runs a chunk.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::state::Version;
use super::VideoError;

/// One pull takes at most this long.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(30);
/// Header carrying the transfer token on a snapshot request.
pub const TOKEN_HEADER: &str = "x-transfer-token";

/// The snapshot path of session `id`, with the version a delta is
/// against.
pub fn snapshot_path(id: &str, since: Option<Version>) -> String {
    let mut p = format!("/engine/v1/video/sessions/{id}/snapshot");
    if let Some(v) = since {
        p.push_str(&format!("?since={}.{}", v.epoch, v.chunks));
    }
    p
}

/// Parses `since=EPOCH.CHUNKS` from a query string.
pub fn since_of(query: Option<&str>) -> Option<Version> {
    let v = query?.split('&').find_map(|kv| kv.strip_prefix("since="))?;
    let (e, c) = v.split_once('.')?;
    Some(Version { epoch: e.parse().ok()?, chunks: c.parse().ok()? })
}

/// Pulls session `id` from the engine at `from` (`http://host:port`):
/// all of it, or what changed since `since`; at most `limit` bytes.
pub async fn pull(
    from: &str,
    id: &str,
    token: &str,
    since: Option<Version>,
    limit: usize,
) -> Result<Vec<u8>, VideoError> {
    let fail = |m: String| VideoError::Transfer(m);
    if !from.starts_with("http://") || from.len() > 512 {
        return Err(fail("`from` must be an http:// engine URL".into()));
    }
    let uri: http::Uri = format!("{}{}", from.trim_end_matches('/'), snapshot_path(id, since))
        .parse()
        .map_err(|e| fail(format!("bad source URL: {e}")))?;
    let req = http::Request::get(uri)
        .header(TOKEN_HEADER, token)
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(e.to_string()))?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let run = async {
        let resp = client.request(req).await.map_err(|e| fail(format!("source unreachable: {e}")))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| fail(format!("reading the state: {e}")))?
            .to_bytes();
        if status.is_success() {
            Ok(body.to_vec())
        } else {
            Err(fail(format!("source answered {status}: {}", String::from_utf8_lossy(&body))))
        }
    };
    tokio::time::timeout(PULL_TIMEOUT, run).await.unwrap_or_else(|_| Err(fail("timed out".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip_through_the_query() {
        let v = Version { epoch: 3, chunks: 41 };
        let path = snapshot_path("vs_1", Some(v));
        assert_eq!(since_of(path.split_once('?').map(|p| p.1)), Some(v));
        assert_eq!(since_of(None), None);
        assert_eq!(since_of(Some("since=x.1")), None);
    }
}
