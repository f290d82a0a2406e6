//! The gateway's calls to engines' video routes, and each engine's video
//! profile (fetched once, cached).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use engine_api::video::{ChunkOut, ChunkRequest, CreateSession, Version};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use policies::video::VideoProfile;

use crate::engines::{join, EnginePool};

/// A chunk takes at most this long before the call is abandoned.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A pull moves a whole state engine to engine (the engine's own bound is
/// 30 s).
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(35);

/// A failed engine call: the status (when one came back) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct CallError {
    pub status: Option<StatusCode>,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => write!(f, "{s}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

pub(crate) async fn call(
    pool: &EnginePool,
    idx: usize,
    method: Method,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Bytes, CallError> {
    let fail = |status: Option<StatusCode>, message: String| CallError { status, message };
    let slot = pool.slot(idx);
    let uri = join(&slot.spec.url, path).ok_or_else(|| fail(None, format!("bad engine URL for {path}")))?;
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Bytes::from(body))
        .map_err(|e| fail(None, e.to_string()))?;
    let run = async {
        let resp = pool.send(req, &slot).await.map_err(|e| fail(None, e.to_string()))?;
        let status = resp.status();
        let bytes =
            resp.into_body().collect().await.map_err(|e| fail(Some(status), e.to_string()))?.to_bytes();
        if status.is_success() {
            Ok(bytes)
        } else {
            Err(fail(Some(status), String::from_utf8_lossy(&bytes).into_owned()))
        }
    };
    tokio::time::timeout(timeout, run).await.unwrap_or_else(|_| Err(fail(None, "timed out".into())))
}

fn session_path(id: &str, op: &str) -> String {
    format!("/engine/v1/video/sessions/{id}{op}")
}

pub async fn create(pool: &EnginePool, idx: usize, c: &CreateSession) -> Result<(), CallError> {
    let body = serde_json::to_vec(c).expect("serialises");
    call(pool, idx, Method::POST, "/engine/v1/video/sessions", body, CALL_TIMEOUT).await.map(|_| ())
}

pub async fn chunk(pool: &EnginePool, idx: usize, id: &str, r: &ChunkRequest) -> Result<ChunkOut, CallError> {
    let body = serde_json::to_vec(r).expect("serialises");
    let bytes = call(pool, idx, Method::POST, &session_path(id, "/chunk"), body, CHUNK_TIMEOUT).await?;
    serde_json::from_slice(&bytes).map_err(|e| CallError { status: None, message: e.to_string() })
}

/// Switches the session's prompt; returns the engine's new epoch.
pub async fn prompt(pool: &EnginePool, idx: usize, id: &str, prompt: &str) -> Result<u32, CallError> {
    let body = serde_json::to_vec(&serde_json::json!({"prompt": prompt})).expect("serialises");
    let answer = call(pool, idx, Method::POST, &session_path(id, "/prompt"), body, CALL_TIMEOUT).await?;
    serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| u32::try_from(v["epoch"].as_u64()?).ok())
        .ok_or_else(|| CallError { status: None, message: "prompt switch answered without an epoch".into() })
}

/// Moves the session's state to the engine's host memory (it resumes by
/// itself with the next chunk).
pub async fn suspend(pool: &EnginePool, idx: usize, id: &str) -> Result<(), CallError> {
    call(pool, idx, Method::POST, &session_path(id, "/suspend"), Vec::new(), CALL_TIMEOUT).await.map(|_| ())
}

pub async fn export(pool: &EnginePool, idx: usize, id: &str) -> Result<Bytes, CallError> {
    call(pool, idx, Method::POST, &session_path(id, "/export"), Vec::new(), CALL_TIMEOUT).await
}

pub async fn import(pool: &EnginePool, idx: usize, id: &str, state: Bytes) -> Result<(), CallError> {
    call(pool, idx, Method::PUT, &session_path(id, "/import"), state.to_vec(), CALL_TIMEOUT).await.map(|_| ())
}

/// What a `pull` or `commit` on the target answered.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
pub struct Pulled {
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub ms: f64,
}

fn json_of<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, CallError> {
    serde_json::from_slice(bytes).map_err(|e| CallError { status: None, message: e.to_string() })
}

/// Source: opens a transfer of the session under `token`; answers its
/// version.
pub async fn offer(pool: &EnginePool, idx: usize, id: &str, token: &str) -> Result<Version, CallError> {
    let body = serde_json::to_vec(&serde_json::json!({"token": token})).expect("serialises");
    json_of(&call(pool, idx, Method::POST, &session_path(id, "/offer"), body, CALL_TIMEOUT).await?)
}

/// Target: pulls a full copy from engine `from` and stages it (`commit`:
/// the final delta, after which the target owns the session).
pub async fn pull(
    pool: &EnginePool,
    idx: usize,
    id: &str,
    from: usize,
    token: &str,
    commit: bool,
) -> Result<Pulled, CallError> {
    let from = pool.slot(from).spec.url.to_string();
    let body = serde_json::to_vec(&serde_json::json!({"from": from, "token": token})).expect("serialises");
    let op = if commit { "/commit" } else { "/pull" };
    json_of(&call(pool, idx, Method::POST, &session_path(id, op), body, TRANSFER_TIMEOUT).await?)
}

/// Donor: spends `ms` on another engine's SP2 chunk.
pub async fn lend(pool: &EnginePool, idx: usize, ms: f64) -> Result<(), CallError> {
    let body = serde_json::to_vec(&serde_json::json!({"ms": ms})).expect("serialises");
    call(pool, idx, Method::POST, "/engine/v1/video/lend", body, CALL_TIMEOUT).await.map(|_| ())
}

/// Target: drops a staged copy (a move given up).
pub async fn unstage(pool: &EnginePool, idx: usize, id: &str) -> Result<(), CallError> {
    call(pool, idx, Method::DELETE, &session_path(id, "/staged"), Vec::new(), CALL_TIMEOUT).await.map(|_| ())
}

/// Target: owns its staged copy as it is (the source died mid-move).
pub async fn adopt(pool: &EnginePool, idx: usize, id: &str) -> Result<Version, CallError> {
    json_of(&call(pool, idx, Method::POST, &session_path(id, "/adopt"), Vec::new(), CALL_TIMEOUT).await?)
}

pub async fn end(pool: &EnginePool, idx: usize, id: &str) -> Result<(), CallError> {
    call(pool, idx, Method::DELETE, &session_path(id, ""), Vec::new(), CALL_TIMEOUT).await.map(|_| ())
}

/// Each engine's video profile, fetched the first time it is needed.
#[derive(Debug)]
pub struct Profiles {
    pool: Arc<EnginePool>,
    cache: Mutex<HashMap<usize, Arc<VideoProfile>>>,
}

impl Profiles {
    pub fn new(pool: Arc<EnginePool>) -> Self {
        Self { pool, cache: Mutex::new(HashMap::new()) }
    }

    /// Engine `idx`'s profile, if it serves one.
    pub async fn get(&self, idx: usize) -> Option<Arc<VideoProfile>> {
        if let Some(p) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&idx) {
            return Some(Arc::clone(p));
        }
        let bytes = call(&self.pool, idx, Method::GET, "/engine/v1/video/profile", Vec::new(), CALL_TIMEOUT)
            .await
            .ok()?;
        let text = std::str::from_utf8(&bytes).ok()?;
        let id = &self.pool.slot(idx).spec.id;
        let profile = match VideoProfile::parse(&format!("engine {id} video profile"), text) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                tracing::warn!(event = "video_profile_invalid", engine = %id, error = %e);
                return None;
            }
        };
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(idx, Arc::clone(&profile));
        Some(profile)
    }

    /// A cached profile without fetching (for synchronous decisions).
    pub fn cached(&self, idx: usize) -> Option<Arc<VideoProfile>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&idx).cloned()
    }
}
