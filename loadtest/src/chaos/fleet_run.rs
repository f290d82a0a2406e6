//! `loadtest chaos --fleet`: the fleet's faults under load, each on a fresh
//! fleet of its own hosts ([`super::fleet`]): a Redis primary, a replica
//! and three sentinels, three gateways and four emulated engines, each on
//! a host (13 hosts; the last is spare, for an engine that moves). The load
//! is open-loop streamed chat at `rate` requests a second, three tenants
//! (gold, silver, bronze) in turn, sent to the gateways in turn by a load
//! balancer that probes `/readyz` every 100 ms and tries the next gateway
//! when one does not accept the connection; beside it, `video` live video
//! streams whose clients resume their feed through another gateway
//! (`Last-Event-ID`) whenever theirs breaks.
//!
//! What counts: a request is **failed** when it was accepted and did not
//! end with `[DONE]` (an error, a status other than 429 / 503-with-a-
//! Retry-After, a cut-off stream, 30 s without its end), or when no
//! gateway accepted it; **refused** answers carry a reason and a
//! Retry-After and are admission decisions, not failures. A video chunk
//! index skipped (a gap) or received twice is counted per stream.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::fleet::{stream_chat_timed, Bins, Fleet, Layout, Streamed};
use crate::client::{Conn, Proto};

mod video;
use video::video_client;

/// The fleet scenarios, in the order `all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FleetScenario {
    All,
    /// Redis's primary SIGKILLed: Sentinel promotes the replica.
    RedisFailover,
    /// One gateway cut from every Redis host (not from clients or engines)
    /// for `--cut-s`, then healed.
    RedisCut,
    /// One gateway cut from one engine for `--cut-s`, then healed.
    EngineCut,
    /// Every gateway stopped (SIGTERM: drain) and started again in turn.
    RollingRestart,
    /// A gateway SIGKILLed with live video streams; started again later.
    GatewayKill,
    /// An engine SIGKILLed and started on another host under its name.
    EngineMove,
}

/// Knobs of a fleet run.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Streamed chats a second, all tenants together.
    pub rate: f64,
    /// Output tokens per chat.
    pub max_tokens: u32,
    /// Live video streams (gold), each with a client.
    pub video: u32,
    /// How long a cut lasts, seconds.
    pub cut_s: u64,
    /// Load before the fault and after it ends, seconds.
    pub settle_s: u64,
    /// Runs of each scenario (each on a fresh fleet).
    pub runs: u32,
}

const REDIS_HOSTS: [usize; 5] = [0, 8, 9, 10, 11];
const GATEWAYS: [usize; 3] = [1, 2, 3];
const ENGINES: [usize; 4] = [4, 5, 6, 7];
const SPARE: usize = 12;
const KEYS: [(&str, &str); 3] =
    [("gold", "sk-demo-gold"), ("silver", "sk-demo-silver"), ("bronze", "sk-demo-bronze")];

/// The engines' profile: prefill free, 2 ms per output token per step.
const PROFILE: &str = "model = \"synthetic-small\"\nengine_class = \"fleet-paced\"\n\
    [prefill]\npoints = [[0, 0.0]]\n[decode]\nbatch_points = [[1, 2.0], [64, 4.0]]\n";

/// What one scenario run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetOutcome {
    pub scenario: String,
    pub run: u32,
    pub seconds: f64,
    pub sent: u64,
    pub ok: u64,
    pub limited: u64,
    pub refused: u64,
    pub failed: u64,
    /// Connections a gateway did not accept, each retried on the next one.
    pub retried: u64,
    /// The first few failures, for the report.
    pub failures: Vec<String>,
    /// Time to the first token's event of the ok chats: p50 and p99, ms.
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub video: VideoFigures,
    /// What the fault itself measured (seconds unless the name says).
    pub fault: BTreeMap<String, f64>,
    /// Whether the targets (docs/reliability.md) held.
    pub met: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct VideoFigures {
    pub streams: u64,
    pub chunks: u64,
    /// Chunk indices skipped, over all streams.
    pub gaps: u64,
    /// Chunk indices received twice.
    pub duplicates: u64,
    /// Feeds resumed through another gateway.
    pub resumes: u64,
    /// Longest time from a feed breaking to its next chunk, seconds.
    pub longest_resume_s: f64,
    /// Streams that ended before the run did (an `end` event).
    pub ended_early: u64,
}

#[derive(Default)]
pub(super) struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    limited: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    failures: Mutex<Vec<String>>,
    /// Failed chats by the gateway they were on.
    failed_on: Mutex<BTreeMap<String, u64>>,
    ttfts_ms: Mutex<Vec<f64>>,
    video: Mutex<VideoFigures>,
}

impl Tally {
    fn fail_on(&self, url: &str, why: String) {
        *self.failed_on.lock().unwrap_or_else(|p| p.into_inner()).entry(url.to_string()).or_default() += 1;
        self.fail(why);
    }

    pub(super) fn fail(&self, why: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() < 20 {
            f.push(why);
        }
    }
}

/// The load balancer: the gateways, and which answered `/readyz` 200 last.
pub(super) struct Balancer {
    urls: Vec<String>,
    ready: Vec<AtomicBool>,
    next: AtomicUsize,
}

impl Balancer {
    /// The next ready gateway in turn (any, when none is ready).
    pub(super) fn pick(&self) -> usize {
        self.pick_other(&[])
    }

    /// [`Balancer::pick`] among the gateways not in `tried` (a retry goes
    /// to another backend, as a balancer's does), any when all were.
    fn pick_other(&self, tried: &[usize]) -> usize {
        let n = self.urls.len();
        for _ in 0..n {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if self.ready[i].load(Ordering::Relaxed) && !tried.contains(&i) {
                return i;
            }
        }
        (0..n).find(|i| !tried.contains(i)).unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed) % n)
    }

    async fn probe(self: Arc<Self>, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            for (i, url) in self.urls.iter().enumerate() {
                let ok = match tokio::time::timeout(
                    Duration::from_millis(500),
                    Conn::connect(url, None, Proto::Http1),
                )
                .await
                {
                    Ok(Ok(conn)) => {
                        tokio::time::timeout(Duration::from_millis(500), conn.get("/readyz", None))
                            .await
                            .is_ok_and(|r| r.is_ok_and(|r| r.status() == http::StatusCode::OK))
                    }
                    _ => false,
                };
                self.ready[i].store(ok, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Most chats in flight at once; past it the client sheds (counted failed:
/// the fleet fell that far behind).
const MAX_IN_FLIGHT: usize = 4096;

async fn chat_load(lb: Arc<Balancer>, tally: Arc<Tally>, opts: FleetOptions, stop: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.rate.max(0.1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut k = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        k += 1;
        tally.sent.fetch_add(1, Ordering::Relaxed);
        if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            tally.fail("shed by the client: too many in flight".into());
            continue;
        }
        let (lb, tally, in_flight, max_tokens) =
            (Arc::clone(&lb), Arc::clone(&tally), Arc::clone(&in_flight), opts.max_tokens);
        let (tenant, key) = KEYS[k % KEYS.len()];
        in_flight.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            one_chat(&lb, &tally, tenant, key, max_tokens).await;
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

async fn one_chat(lb: &Balancer, tally: &Tally, tenant: &str, key: &str, max_tokens: u32) {
    let mut tried = Vec::new();
    for _attempt in 0..3 {
        let i = lb.pick_other(&tried);
        tried.push(i);
        let chat = stream_chat_timed(&lb.urls[i], key, max_tokens, || (), || ());
        let (outcome, ttft) = tokio::time::timeout(Duration::from_secs(30), chat)
            .await
            .unwrap_or((Streamed::Failed(format!("{}: no end within 30 s", lb.urls[i])), None));
        match outcome {
            Streamed::NotAccepted => {
                tally.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Streamed::Done => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                if let Some(t) = ttft {
                    tally.ttfts_ms.lock().unwrap().push(t.as_secs_f64() * 1e3);
                }
            }
            Streamed::Limited => {
                tally.limited.fetch_add(1, Ordering::Relaxed);
            }
            Streamed::Refused => {
                tally.refused.fetch_add(1, Ordering::Relaxed);
            }
            Streamed::Failed(e) => {
                if let Some(engine) = e.rsplit_once(" on engine ").map(|(_, id)| id) {
                    *tally.failed_on.lock().unwrap().entry(format!("engine {engine}")).or_default() += 1;
                }
                tally.fail_on(&lb.urls[i], format!("{tenant}: {e}"))
            }
        }
        return;
    }
    tally.fail(format!("{tenant}: no gateway accepted the connection (3 tries)"));
}

/// Whether the gateway on `host` reaches Redis (its `/readyz`).
async fn redis_up(fleet: &Fleet, host: usize) -> bool {
    fleet.readyz(host).await["detail"]["cluster"]["redis_up"] == true
}

/// Polls `ok` every 50 ms until it holds; seconds it took (`None` after
/// `within`).
async fn until(within: Duration, mut ok: impl AsyncFnMut() -> bool) -> Option<f64> {
    let t = crate::clock::now();
    while crate::clock::since(t) < within {
        if ok().await {
            return Some(crate::clock::since(t).as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The sum of counter `name`'s series that carry `label` (`key="value"`).
fn counted(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn resumes(metrics: &str) -> f64 {
    counted(metrics, "gateway_stream_resumes_total", "outcome=\"resumed\"")
}

fn adoptions(metrics: &str) -> f64 {
    counted(metrics, "gateway_video_adoptions_total", "result=\"adopted\"")
}

/// Runs one scenario once on a fresh fleet under load; `Ok(None)` where
/// namespaces cannot be made.
pub async fn run_one(
    bins: &Bins,
    policy: &str,
    scenario: FleetScenario,
    run: u32,
    opts: &FleetOptions,
    dir: &std::path::Path,
) -> Result<Option<FleetOutcome>, String> {
    let layout = Layout {
        hosts: 13,
        gateways: &GATEWAYS,
        engines: &ENGINES,
        profile: PROFILE,
        policy,
        sentinel: Some((8, &[9, 10, 11])),
    };
    let Some(mut fleet) = tokio::task::block_in_place(|| Fleet::start(bins, &layout, dir))? else {
        return Ok(None);
    };
    let ids: Vec<String> = ENGINES.iter().map(|h| format!("e{h}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    for g in GATEWAYS {
        fleet.until_served_on(g, &ids).await?;
    }
    let lb = Arc::new(Balancer {
        urls: GATEWAYS.iter().map(|&g| fleet.url(g)).collect(),
        ready: GATEWAYS.iter().map(|_| AtomicBool::new(true)).collect(),
        next: AtomicUsize::new(0),
    });
    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let started = crate::clock::now();
    let prober = tokio::spawn(Arc::clone(&lb).probe(Arc::clone(&stop)));
    let load = tokio::spawn(chat_load(Arc::clone(&lb), Arc::clone(&tally), opts.clone(), Arc::clone(&stop)));
    let videos: Vec<_> = (0..opts.video)
        .map(|n| tokio::spawn(video_client(Arc::clone(&lb), Arc::clone(&tally), n, Arc::clone(&stop))))
        .collect();
    let settle = Duration::from_secs(opts.settle_s);
    let cut = Duration::from_secs(opts.cut_s);
    tokio::time::sleep(settle).await;
    let mut fault = BTreeMap::new();
    let mut bound_met = true;
    let mut killed_url = None;
    let mut killed_engine = None;
    match scenario {
        FleetScenario::RedisFailover => {
            let primary = fleet.redis_pids[0].1;
            fleet.hosts.stop(primary);
            let old = fleet.hosts.addr(0).to_string();
            let promoted = until(Duration::from_secs(30), async || {
                !fleet.cli(9, 26379, &["SENTINEL", "get-master-addr-by-name", "fleet"]).contains(&old)
            })
            .await;
            fault.insert("promoted_s".into(), promoted.unwrap_or(f64::NAN));
            let back = until(Duration::from_secs(30), async || {
                let mut all = true;
                for g in GATEWAYS {
                    all &= redis_up(&fleet, g).await;
                }
                all
            })
            .await;
            fault.insert("all_gateways_on_the_new_primary_s".into(), back.unwrap_or(f64::NAN));
            bound_met = promoted.is_some() && back.is_some_and(|b| b < 5.0);
        }
        FleetScenario::RedisCut => {
            for r in REDIS_HOSTS {
                fleet.hosts.cut(1, r)?;
            }
            tokio::time::sleep(cut).await;
            for r in REDIS_HOSTS {
                fleet.hosts.heal(1, r);
            }
            let back = until(Duration::from_secs(30), async || redis_up(&fleet, 1).await).await;
            fault.insert("back_on_redis_after_heal_s".into(), back.unwrap_or(f64::NAN));
            bound_met = back.is_some_and(|b| b < 2.0);
        }
        FleetScenario::EngineCut => {
            fleet.hosts.cut(1, 4)?;
            tokio::time::sleep(cut).await;
            fleet.hosts.heal(1, 4);
        }
        FleetScenario::RollingRestart => {
            for g in GATEWAYS {
                let (took, by_itself) = tokio::task::block_in_place(|| fleet.restart_gateway(g))?;
                fault.insert(format!("gateway_{g}_stop_s"), took.as_secs_f64());
                bound_met &= by_itself;
                fleet.until_served_on(g, &ids).await?;
            }
        }
        FleetScenario::GatewayKill => {
            let before: f64 = {
                let mut s = 0.0;
                for g in [2, 3] {
                    s += adoptions(&fleet.metrics(g).await);
                }
                s
            };
            fleet.kill_gateway(1);
            let adopted = until(Duration::from_secs(15), async || {
                let mut s = 0.0;
                for g in [2, 3] {
                    s += adoptions(&fleet.metrics(g).await);
                }
                s > before
            })
            .await;
            // By the sweep (its owner's mark expired) or by its client
            // resuming elsewhere first, whichever came first. Stream 0 was
            // created on (and is owned by) the killed gateway.
            fault.insert("first_stream_taken_over_s".into(), adopted.unwrap_or(f64::NAN));
            bound_met = adopted.is_some_and(|a| a < 5.0) || opts.video == 0;
            // Chats open on the killed gateway die with it (their client's
            // connection was to it): counted apart; none elsewhere may fail.
            killed_url = Some(fleet.url(1));
            tokio::time::sleep(cut.saturating_sub(Duration::from_secs(5)).max(Duration::from_secs(5))).await;
            tokio::task::block_in_place(|| fleet.start_gateway(1))?;
            fleet.until_served_on(1, &ids).await?;
        }
        FleetScenario::EngineMove => {
            // Chats streaming from the killed engine go on on another (the
            // gateway resumes them); any that cannot are counted apart.
            killed_engine = Some("e7");
            fleet.kill_engine(7);
            let killed = crate::clock::now();
            tokio::task::block_in_place(|| fleet.engine_as(SPARE, "e7"))?;
            fleet.until_served_on(1, &["e7"]).await?;
            fault.insert("served_from_the_new_host_s".into(), crate::clock::since(killed).as_secs_f64());
        }
        FleetScenario::All => unreachable!("expanded by the caller"),
    }
    tokio::time::sleep(settle).await;
    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    // Chats whose engine failed after their first tokens and that went on
    // on another (counted by the gateways up at the end).
    let mut resumed = 0.0;
    for g in GATEWAYS {
        resumed += resumes(&fleet.metrics(g).await);
    }
    fault.insert("chats_resumed_elsewhere".into(), resumed);
    for v in videos {
        let _ = v.await;
    }
    let _ = prober.await;
    let t = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let heads = tally.ttfts_ms.lock().unwrap().clone();
    let video = tally.video.lock().unwrap().clone();
    let failed = t(&tally.failed);
    let cut_by_kill = match (killed_url, killed_engine) {
        (Some(u), _) => tally.failed_on.lock().unwrap().get(&u).copied().unwrap_or(0),
        (_, Some(e)) => tally.failed_on.lock().unwrap().get(&format!("engine {e}")).copied().unwrap_or(0),
        _ => 0,
    };
    if matches!(scenario, FleetScenario::GatewayKill | FleetScenario::EngineMove) {
        fault.insert("chats_cut_by_the_kill".into(), cut_by_kill as f64);
    }
    let outcome = FleetOutcome {
        scenario: format!("{scenario:?}"),
        run,
        seconds: crate::clock::since(started).as_secs_f64(),
        sent: t(&tally.sent),
        ok: t(&tally.ok),
        limited: t(&tally.limited),
        refused: t(&tally.refused),
        failed,
        retried: t(&tally.retried),
        failures: tally.failures.lock().unwrap().clone(),
        ttft_p50_ms: crate::stats::percentile(&heads, 0.5),
        ttft_p99_ms: crate::stats::percentile(&heads, 0.99),
        met: bound_met && failed == cut_by_kill && video.gaps == 0 && video.duplicates == 0,
        video,
        fault,
    };
    Ok(Some(outcome))
}

/// Runs the chosen scenarios `opts.runs` times each.
pub async fn run(
    bins: &Bins,
    policy: &str,
    scenario: FleetScenario,
    opts: &FleetOptions,
    out: &std::path::Path,
) -> Result<Vec<FleetOutcome>, String> {
    use FleetScenario::*;
    let chosen = match scenario {
        All => vec![RedisFailover, RedisCut, EngineCut, RollingRestart, GatewayKill, EngineMove],
        one => vec![one],
    };
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let total = chosen.len() as u32 * opts.runs;
    let mut outcomes = Vec::new();
    for s in &chosen {
        for run in 1..=opts.runs {
            let k = outcomes.len() as u32 + 1;
            eprintln!("chaos --fleet: [{k}/{total}] {s:?} run {run} ...");
            let dir = std::env::temp_dir().join(format!("loadtest-fleet-{}-{k}", std::process::id()));
            let Some(o) = run_one(bins, policy, *s, run, opts, &dir).await? else {
                return Err(
                    "network namespaces cannot be made here (root and iproute2's `ip netns` are needed)"
                        .into(),
                );
            };
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!(
                "chaos --fleet: [{k}/{total}] {s:?} run {run}: {} sent, {} ok, {} refused, {} failed; video {} chunks, {} gaps, {} resumes; {:?}; target {}",
                o.sent,
                o.ok,
                o.limited + o.refused,
                o.failed,
                o.video.chunks,
                o.video.gaps,
                o.video.resumes,
                o.fault,
                if o.met { "met" } else { "NOT met" }
            );
            outcomes.push(o);
        }
    }
    let json = serde_json::to_string_pretty(&outcomes).expect("outcomes serialise");
    std::fs::write(out.join("fleet.json"), json).map_err(|e| e.to_string())?;
    std::fs::write(out.join("fleet.md"), table(&outcomes)).map_err(|e| e.to_string())?;
    Ok(outcomes)
}

/// One row per run.
pub fn table(outcomes: &[FleetOutcome]) -> String {
    let mut s = String::from(
        "| scenario | run | chats sent / ok / refused (429, 503) / failed | TTFT p50 / p99 ms | video chunks / gaps / dups / resumes (longest s) | fault | target met |\n\
         |---|---:|---|---:|---|---|---|\n",
    );
    for o in outcomes {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let fault: Vec<String> = o.fault.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        s.push_str(&format!(
            "| {} | {} | {} / {} / {} ({}, {}) / {} | {} / {} | {} / {} / {} / {} ({:.1}) | {} | {} |\n",
            o.scenario,
            o.run,
            o.sent,
            o.ok,
            o.limited + o.refused,
            o.limited,
            o.refused,
            o.failed,
            ms(o.ttft_p50_ms),
            ms(o.ttft_p99_ms),
            o.video.chunks,
            o.video.gaps,
            o.video.duplicates,
            o.video.resumes,
            o.video.longest_resume_s,
            fault.join(", "),
            if o.met { "yes" } else { "**no**" },
        ));
    }
    s
}
