//! Engine child processes of the embedded single-node mode (`gateway up`).
//!
//! Each engine is this same executable run as `gateway engine ...`, on a
//! free loopback port that it reports on its ready line. Each child's stdin
//! is a pipe we hold: if the gateway dies, even by SIGKILL, the pipe closes
//! and the engine exits, so there are no orphans. On a normal stop we close
//! the pipe (graceful: in-flight work finishes) and kill after a deadline.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::engines::EngineSpec;

/// How long a child may take to print its ready line.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to exit after its stdin closes.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start the engines.
#[derive(Debug, Clone)]
pub struct EngineLaunch {
    pub count: usize,
    pub backend: engine::backend::BackendKind,
    pub profile: Option<PathBuf>,
    /// Extra engine flags, passed to every child as they are
    /// (`engine --help` lists them: KV cache, batch limits, preemption).
    pub extra_args: Vec<String>,
    /// Engines of a second class (`o0`, `o1`, …) with their own profile:
    /// the overflow class a tier's `faster_class` degradation moves to.
    pub overflow: Option<(usize, PathBuf)>,
    /// Secrets for every child, passed in its environment (never on its
    /// command line, which any local user can read): the engine API token
    /// and the fleet's Redis URL.
    pub secrets: Secrets,
}

/// What engine children must know and nobody else should see.
#[derive(Clone, Default)]
pub struct Secrets {
    pub api_token: Option<String>,
    pub redis_url: Option<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("api_token", &self.api_token.as_ref().map(|_| "<redacted>"))
            .field("redis_url", &self.redis_url.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("finding the gateway executable: {0}")]
    Exe(std::io::Error),
    #[error("starting engine {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("engine {0} did not become ready: {1}")]
    NotReady(String, String),
}

/// One running child.
#[derive(Debug)]
pub struct ChildEngine {
    pub spec: EngineSpec,
    pub pid: u32,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// The running children.
#[derive(Debug, Default)]
pub struct Supervisor {
    pub children: Vec<ChildEngine>,
}

impl Supervisor {
    /// Starts `launch.count` engines (and the overflow engines) and waits
    /// for each one's ready line.
    pub async fn start(launch: &EngineLaunch) -> Result<Self, SupervisorError> {
        let exe = std::env::current_exe().map_err(SupervisorError::Exe)?;
        let mut sup = Supervisor::default();
        let primary = (0..launch.count).map(|i| (format!("e{i}"), launch.profile.as_ref()));
        let overflow =
            launch.overflow.iter().flat_map(|(n, p)| (0..*n).map(move |i| (format!("o{i}"), Some(p))));
        for (id, profile) in primary.chain(overflow) {
            let mut cmd = Command::new(&exe);
            cmd.args(["engine", "--listen", "127.0.0.1:0", "--id", &id, "--exit-on-stdin-eof"])
                .args(["--backend", launch.backend.as_str()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            if let Some(p) = profile {
                cmd.arg("--profile").arg(p);
            }
            if let Some(t) = &launch.secrets.api_token {
                cmd.env(engine::api::TOKEN_ENV, t);
            }
            if let Some(u) = &launch.secrets.redis_url {
                cmd.env(engine::api::REDIS_ENV, u);
            }
            cmd.args(&launch.extra_args);
            let child = cmd.spawn().map_err(|e| SupervisorError::Spawn(id.clone(), e))?;
            match tokio::time::timeout(START_TIMEOUT, ready_url(child, &id)).await {
                Ok(Ok(c)) => sup.children.push(c),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(SupervisorError::NotReady(id, format!("no ready line in {START_TIMEOUT:?}")))
                }
            }
        }
        Ok(sup)
    }

    pub fn specs(&self) -> Vec<EngineSpec> {
        self.children.iter().map(|c| c.spec.clone()).collect()
    }

    /// Stops every child: closes its stdin, waits, kills after a deadline.
    pub async fn shutdown(self) {
        let mut tasks = Vec::new();
        for mut c in self.children {
            if let Some(stop) = c.stop.take() {
                let _ = stop.send(());
            }
            tasks.push(c.task);
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Reads the child's ready line, then hands the child to a monitor task.
async fn ready_url(mut child: Child, id: &str) -> Result<ChildEngine, SupervisorError> {
    let not_ready = |why: &str| SupervisorError::NotReady(id.to_string(), why.to_string());
    let stdout = child.stdout.take().ok_or_else(|| not_ready("no stdout pipe"))?;
    let mut lines = BufReader::new(stdout).lines();
    let line =
        lines.next_line().await.ok().flatten().ok_or_else(|| not_ready("exited before its ready line"))?;
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))
        .ok_or_else(|| not_ready(&format!("unexpected first line {line:?}")))?;
    let url = format!("http://{addr}").parse().map_err(|_| not_ready(&format!("bad address {addr:?}")))?;
    let pid = child.id().unwrap_or(0);
    let (stop_tx, stop_rx) = oneshot::channel();
    let spec = EngineSpec { id: id.to_string(), url };
    let task = tokio::spawn(monitor(child, spec.id.clone(), stop_rx, lines));
    Ok(ChildEngine { spec, pid, stop: Some(stop_tx), task })
}

async fn monitor(
    mut child: Child,
    id: String,
    stop: oneshot::Receiver<()>,
    mut stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    let stdin = child.stdin.take();
    // Keep draining stdout so a chatty child never blocks on a full pipe.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    tokio::select! {
        status = child.wait() => {
            tracing::error!(event = "engine_exited", engine = %id, status = ?status.ok(), "engine exited unexpectedly");
        }
        _ = stop => {
            drop(stdin);
            match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
                Ok(status) => tracing::info!(event = "engine_stopped", engine = %id, status = ?status.ok()),
                Err(_) => {
                    tracing::warn!(event = "engine_killed", engine = %id, "did not exit in {STOP_TIMEOUT:?}");
                    let _ = child.kill().await;
                }
            }
        }
    }
    drain.abort();
}
