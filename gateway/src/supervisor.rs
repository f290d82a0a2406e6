//! Engine child processes of the embedded single-node mode (`gateway up`):
//! started, kept warm, drained, stopped and restarted on the control
//! plane's decisions.
//!
//! Each engine is the workspace's `engine` executable ([`crate::engine_bin`]),
//! on a free loopback port that it reports on its ready line (with its own
//! measured warm-up). Each child's stdin is a pipe we hold: if the gateway
//! dies, even by SIGKILL, the pipe closes and the engine exits, so there
//! are no orphans. On a normal stop we close the pipe (graceful: in-flight
//! work finishes) and kill after a deadline.
//!
//! Life of a child: `Starting` (spawned, no ready line yet: a cold start,
//! timed from spawn to ready line) -> `Running` (in the engine pool;
//! serving, or in the warm pool as a standby the gateway does not route
//! to) -> `Draining` (scale-in: no new work, its sequences finish at token
//! boundaries; then it stops, or joins the warm pool) -> stopped. A child
//! that exits on its own is restarted after `restart_backoff_s`, doubling
//! per consecutive failure up to `restart_backoff_max_s`; it comes back at
//! a new port under the same id, and the pool follows it there.
//!
//! [`Supervisor::apply`] moves the primary class toward an autoscaling
//! decision (serving and warm counts); overflow engines (`o0`, …) are kept
//! as started.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use policies::autoscale::{restart_delay_s, AutoscaleConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::engines::{EnginePool, EngineSpec};
use crate::metrics as m;

mod scale;
mod switch;
use switch::merge_args;

/// How long a child may take to print its ready line.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to exit after its stdin closes.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start the engines.
#[derive(Debug, Clone)]
pub struct EngineLaunch {
    pub count: usize,
    /// `--backend` of every child (one of [`engine_api::BACKENDS`]).
    pub backend: String,
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
    #[error("{0}")]
    Exe(String),
    #[error("starting engine {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("engine {0} did not become ready: {1}")]
    NotReady(String, String),
}

/// Where a child is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildState {
    /// Spawned; no ready line yet. `warm`: it joins the warm pool.
    Starting { warm: bool },
    /// In the engine pool (serving, or warm standby: the pool's flag).
    Running,
    /// No new work; stops (or turns warm) once its sequences finish.
    Draining { to_warm: bool },
    /// Exited on its own; restarts at `Supervisor::restart_at`.
    Restarting,
}

#[derive(Debug)]
struct ChildEngine {
    id: String,
    profile: Option<PathBuf>,
    /// Its own engine flags (a deployment configuration's), over the launch's.
    args: Vec<String>,
    state: ChildState,
    spec: Option<EngineSpec>,
    pid: u32,
    /// Closing it stops the child gracefully.
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// Exits in a row without a successful start in between.
    failures: u32,
    /// Bumped at every spawn: exit reports of an older process are stale.
    generation: u64,
    restart_at: Option<Instant>,
}

/// An exit the monitor saw: child id and the generation that exited.
type Exit = (String, u64);

/// Counts of the supervised fleet, for `/readyz`, the admin API and the
/// autoscaler.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FleetCounts {
    pub serving: u32,
    pub warm: u32,
    pub starting: u32,
    pub draining: u32,
    pub restarting: u32,
}

/// The running children.
#[derive(Debug)]
pub struct Supervisor {
    launch: EngineLaunch,
    exe: PathBuf,
    children: Mutex<BTreeMap<String, ChildEngine>>,
    pool: OnceLock<Arc<EnginePool>>,
    exits: mpsc::UnboundedSender<Exit>,
    exits_rx: Mutex<Option<mpsc::UnboundedReceiver<Exit>>>,
    next_index: AtomicU64,
    pub cold_starts: AtomicU64,
    pub restarts: AtomicU64,
    /// Measured cold starts, seconds: (count, mean).
    cold: Mutex<(u64, f64)>,
    /// The `[autoscale]` knobs of the last decision applied (restart backoff).
    autoscale: Mutex<Option<AutoscaleConfig>>,
    /// Live video streams per pool index ([`Supervisor::watch_holds`]).
    holds: OnceLock<Holds>,
}

/// Live video streams homed on each engine, by pool index: a draining
/// engine that still holds one is not stopped (its streams are moved off
/// first), and scale-in drains the engines holding the fewest.
#[derive(Clone)]
pub struct Holds(pub Arc<dyn Fn() -> Vec<u32> + Send + Sync>);

impl std::fmt::Debug for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Holds")
    }
}

impl Supervisor {
    /// Starts `launch.count` engines (and the overflow engines) and waits
    /// for each one's ready line.
    pub async fn start(launch: &EngineLaunch) -> Result<Arc<Self>, SupervisorError> {
        let exe = crate::engine_bin::locate().map_err(SupervisorError::Exe)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let sup = Arc::new(Supervisor {
            launch: launch.clone(),
            exe,
            children: Mutex::new(BTreeMap::new()),
            pool: OnceLock::new(),
            exits: tx,
            exits_rx: Mutex::new(Some(rx)),
            next_index: AtomicU64::new(launch.count as u64),
            cold_starts: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            cold: Mutex::new((0, 0.0)),
            autoscale: Mutex::new(None),
            holds: OnceLock::new(),
        });
        let primary = (0..launch.count).map(|i| (format!("e{i}"), launch.profile.clone()));
        let overflow = launch
            .overflow
            .iter()
            .flat_map(|(n, p)| (0..*n).map(move |i| (format!("o{i}"), Some(p.clone()))));
        for (id, profile) in primary.chain(overflow) {
            sup.lock()
                .insert(id.clone(), ChildEngine::new(&id, profile, ChildState::Starting { warm: false }));
            sup.spawn(&id).await?;
        }
        Ok(sup)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, ChildEngine>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The specs of the running children, in id order.
    pub fn specs(&self) -> Vec<EngineSpec> {
        self.lock().values().filter_map(|c| c.spec.clone()).collect()
    }

    /// (id, pid, url) of every running child.
    pub fn running(&self) -> Vec<(String, u32, String)> {
        self.lock()
            .values()
            .filter_map(|c| c.spec.as_ref().map(|s| (c.id.clone(), c.pid, s.url.to_string())))
            .collect()
    }

    /// The engine pool the children are routed through; restarts and new
    /// engines are added to it from now on.
    /// Where live video streams are (the gateway's stream registry); set
    /// once at start.
    pub fn watch_holds(&self, holds: Holds) {
        let _ = self.holds.set(holds);
    }

    /// Live video streams on each pool index (none known: all zero).
    fn holds(&self, pool: &EnginePool) -> Vec<u32> {
        let mut h = self.holds.get().map(|h| (h.0)()).unwrap_or_default();
        h.resize(pool.len(), 0);
        h
    }

    pub fn attach(self: &Arc<Self>, pool: Arc<EnginePool>) {
        let _ = self.pool.set(pool);
        let rx = self.exits_rx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut rx) = rx {
            let sup = Arc::clone(self);
            tokio::spawn(async move {
                while let Some((id, generation)) = rx.recv().await {
                    sup.exited(&id, generation);
                }
            });
        }
    }

    /// Mean measured cold start (spawn to ready line), seconds.
    pub fn cold_start_s(&self) -> Option<f64> {
        let (n, mean) = *self.cold.lock().unwrap_or_else(|p| p.into_inner());
        (n > 0).then_some(mean)
    }

    /// Spawns child `id` (already in the map) and waits for its ready line.
    async fn spawn(self: &Arc<Self>, id: &str) -> Result<(), SupervisorError> {
        let (profile, own_args, generation) = {
            let mut children = self.lock();
            let Some(c) = children.get_mut(id) else { return Ok(()) };
            c.generation += 1;
            (c.profile.clone(), c.args.clone(), c.generation)
        };
        let started = crate::clock::now();
        let mut cmd = Command::new(&self.exe);
        cmd.args(["--listen", "127.0.0.1:0", "--id", id, "--exit-on-stdin-eof"])
            .args(["--backend", &self.launch.backend])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(p) = &profile {
            cmd.arg("--profile").arg(p);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn"); // the gateway's own default
        }
        if let Some(t) = &self.launch.secrets.api_token {
            cmd.env(engine_api::TOKEN_ENV, t);
        }
        if let Some(u) = &self.launch.secrets.redis_url {
            cmd.env(engine_api::REDIS_ENV, u);
        }
        cmd.args(merge_args(&self.launch.extra_args, &own_args));
        let child = cmd.spawn().map_err(|e| SupervisorError::Spawn(id.to_string(), e))?;
        let ready = match tokio::time::timeout(START_TIMEOUT, ready_url(child, id)).await {
            Ok(r) => r,
            Err(_) => {
                Err(SupervisorError::NotReady(id.to_string(), format!("no ready line in {START_TIMEOUT:?}")))
            }
        };
        let (spec, pid, child, lines) = match ready {
            Ok(r) => r,
            Err(e) => {
                let _ = self.exits.send((id.to_string(), generation));
                return Err(e);
            }
        };
        let cold = crate::clock::since(started).as_secs_f64();
        self.cold_starts.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(m::ENGINE_COLD_STARTS).increment(1);
        ::metrics::histogram!(m::ENGINE_COLD_START).record(cold);
        {
            let mut c = self.cold.lock().unwrap_or_else(|p| p.into_inner());
            c.0 += 1;
            c.1 += (cold - c.1) / c.0 as f64;
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        let exits = self.exits.clone();
        let task = tokio::spawn(monitor(child, id.to_string(), generation, stop_rx, lines, exits));
        let mut children = self.lock();
        let Some(c) = children.get_mut(id) else { return Ok(()) };
        let warm = matches!(c.state, ChildState::Starting { warm: true });
        c.spec = Some(spec.clone());
        c.pid = pid;
        c.stop = Some(stop_tx);
        c.task = Some(task);
        c.state = ChildState::Running;
        c.failures = 0;
        c.restart_at = None;
        drop(children);
        if let Some(pool) = self.pool.get() {
            let idx = pool.add_owned(spec);
            pool.slot(idx).set_standby(warm);
        }
        tracing::info!(event = "engine_started", engine = %id, pid, cold_start_s = cold, warm);
        Ok(())
    }

    /// A child exited. Unless it was being stopped, it restarts after the
    /// backoff.
    fn exited(self: &Arc<Self>, id: &str, generation: u64) {
        let mut children = self.lock();
        let Some(c) = children.get_mut(id) else { return }; // stopped on purpose
        if c.generation != generation {
            return;
        }
        let delay = restart_delay_s(c.failures, &self.policy_autoscale());
        c.failures += 1;
        c.state = ChildState::Restarting;
        c.stop = None;
        let spec = c.spec.take();
        c.restart_at = Some(crate::clock::now() + Duration::from_secs_f64(delay));
        drop(children);
        if let (Some(pool), Some(spec)) = (self.pool.get(), spec) {
            if let Some(idx) = pool.index_of(&spec.id) {
                pool.mark_unreachable(idx);
            }
        }
        tracing::error!(event = "engine_exited", engine = %id, restart_in_s = delay, "engine exited; restarting");
        self.restarts.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(m::ENGINE_RESTARTS).increment(1);
        let sup = Arc::clone(self);
        let id = id.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(delay)).await;
            let due = sup.lock().get(&id).is_some_and(|c| c.state == ChildState::Restarting);
            if due {
                if let Some(c) = sup.lock().get_mut(&id) {
                    c.state = ChildState::Starting { warm: false };
                }
                if let Err(e) = sup.spawn(&id).await {
                    tracing::error!(event = "engine_restart_failed", engine = %id, error = %e);
                }
            }
        });
    }

    /// The backoff knobs in force (the policy's, else defaults).
    fn policy_autoscale(&self) -> AutoscaleConfig {
        self.autoscale.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default()
    }

    /// Serving, warm, starting, draining and restarting children of the
    /// primary class.
    pub fn counts(&self) -> FleetCounts {
        let pool = self.pool.get();
        let mut n = FleetCounts::default();
        for c in self.lock().values().filter(|c| is_primary(&c.id)) {
            match c.state {
                ChildState::Starting { .. } => n.starting += 1,
                ChildState::Draining { .. } => n.draining += 1,
                ChildState::Restarting => n.restarting += 1,
                ChildState::Running => {
                    let standby =
                        pool.is_some_and(|p| p.index_of(&c.id).is_some_and(|i| p.slot(i).is_standby()));
                    if standby {
                        n.warm += 1
                    } else {
                        n.serving += 1
                    }
                }
            }
        }
        n
    }

    /// Children not stopped (any state).
    pub fn alive(&self) -> usize {
        self.lock().len()
    }

    /// The `[autoscale]` knobs in force (restart backoff).
    pub fn configure(&self, cfg: &AutoscaleConfig) {
        *self.autoscale.lock().unwrap_or_else(|p| p.into_inner()) = Some(cfg.clone());
    }

    fn overflow_count(&self) -> usize {
        self.launch.overflow.as_ref().map_or(0, |(n, _)| *n)
    }

    /// The id of the next child engine.
    fn next_id(&self) -> String {
        format!("e{}", self.next_index.fetch_add(1, Ordering::Relaxed))
    }

    /// Starts child `id` in the background (a failure is logged; the
    /// child's state says what became of it).
    fn spawn_detached(self: &Arc<Self>, id: String) {
        let sup = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = sup.spawn(&id).await {
                tracing::error!(event = "engine_start_failed", engine = %id, error = %e);
            }
        });
    }

    /// Draining engines with no sequence left stop, or join the warm pool.
    fn finish_drains(self: &Arc<Self>, pool: &Arc<EnginePool>) {
        let holds = self.holds(pool);
        let done: Vec<(String, bool)> = self
            .lock()
            .values()
            .filter_map(|c| match c.state {
                ChildState::Draining { to_warm } => {
                    // No sequence running and no video stream left on it.
                    let idle =
                        pool.index_of(&c.id).is_none_or(|i| pool.slot(i).active() == 0 && holds[i] == 0);
                    idle.then(|| (c.id.clone(), to_warm))
                }
                _ => None,
            })
            .collect();
        for (id, to_warm) in done {
            if to_warm {
                if let Some(c) = self.lock().get_mut(&id) {
                    c.state = ChildState::Running;
                }
                if let Some(i) = pool.index_of(&id) {
                    pool.slot(i).set_draining(false);
                    pool.slot(i).set_standby(true);
                }
                tracing::info!(event = "engine_drained", engine = %id, to = "warm pool");
            } else {
                tracing::info!(event = "engine_drained", engine = %id, to = "stopped");
                self.stop_child(&id, pool);
            }
        }
    }

    /// Stops child `id` gracefully and takes it out of the pool.
    fn stop_child(&self, id: &str, pool: &EnginePool) {
        let Some(mut c) = self.lock().remove(id) else { return };
        if let Some(i) = pool.index_of(id) {
            pool.retire(i);
        }
        if let Some(stop) = c.stop.take() {
            let _ = stop.send(());
        }
        tracing::info!(event = "engine_stopped", engine = %id);
    }

    /// Stops every child: closes its stdin, waits, kills after a deadline.
    pub async fn shutdown(&self) {
        let children: Vec<ChildEngine> = std::mem::take(&mut *self.lock()).into_values().collect();
        let mut tasks = Vec::new();
        for mut c in children {
            if let Some(stop) = c.stop.take() {
                let _ = stop.send(());
            }
            tasks.extend(c.task.take());
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

fn is_primary(id: &str) -> bool {
    id.starts_with('e')
}

impl ChildEngine {
    fn new(id: &str, profile: Option<PathBuf>, state: ChildState) -> Self {
        Self {
            id: id.to_string(),
            profile,
            args: Vec::new(),
            state,
            spec: None,
            pid: 0,
            stop: None,
            task: None,
            failures: 0,
            generation: 0,
            restart_at: None,
        }
    }
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// Reads the child's ready line.
async fn ready_url(mut child: Child, id: &str) -> Result<(EngineSpec, u32, Child, Lines), SupervisorError> {
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
    Ok((EngineSpec::native(id, url), pid, child, lines))
}

async fn monitor(
    mut child: Child,
    id: String,
    generation: u64,
    stop: oneshot::Receiver<()>,
    mut stdout: Lines,
    exits: mpsc::UnboundedSender<Exit>,
) {
    let stdin = child.stdin.take();
    // Keep draining stdout so a chatty child never blocks on a full pipe.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    tokio::select! {
        status = child.wait() => {
            tracing::error!(event = "engine_exited", engine = %id, status = ?status.ok(), "engine exited unexpectedly");
            let _ = exits.send((id, generation));
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
