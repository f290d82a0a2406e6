//! The SLO-aware DP scheduler (GenServe Algorithm 1).
//!
//! Stage 1 builds scored candidates: EDF same-size image batches for every
//! GPU count `g` (a batch grows while the profiled latency of the larger
//! batch still meets the earliest deadline in it), and per video its options
//! (wait, or one round at each allowed SP degree) with GPU cost `w(c)`,
//! whether the video stays recoverable (can still meet its deadline), and a
//! score `f(c)`: its projected laxity over its SLO budget. Stage 2 is a
//! knapsack over the videos within the assignable GPUs, maximising
//! (recoverable videos, Σ f). Stage 3 combines each terminal GPU count with
//! the image candidates for the GPUs left and keeps the best plan:
//! (deadlines kept, then value). A running video that would meet its
//! deadline if it kept running is never offered a pause that makes it miss.

use super::{
    on_time, Batch, DiffusionProfile, Gpu, ImageReq, Place, Plan, Run, SchedConfig, Snapshot, VideoReq,
};

/// Lexicographic score: deadlines that stay reachable, then value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct Score {
    pub(super) meets: u32,
    pub(super) value: f64,
}

impl Score {
    fn add(self, o: Score) -> Score {
        Score { meets: self.meets + o.meets, value: self.value + o.value }
    }

    pub(super) fn beats(self, o: Score) -> bool {
        self.meets > o.meets || (self.meets == o.meets && self.value > o.value + 1e-9)
    }
}

/// What one option means for a video: when it would finish and whether
/// that meets its deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outlook {
    pub finish_ms: f64,
    pub recoverable: bool,
    /// `(deadline − finish) / (deadline − arrival)` when the deadline is
    /// met; a late finish scores −1 less a thousandth of its lateness, so
    /// hopeless work yields to everything else yet still runs on GPUs no
    /// one else wants, earliest finish first.
    pub laxity: f64,
}

/// The degree a video runs at without elastic SP: its current one at a
/// boundary, else the default.
fn ref_degree(v: &VideoReq, cfg: &SchedConfig) -> u32 {
    match &v.place {
        Place::Boundary { gpus } => gpus.len() as u32,
        _ => cfg.default_sp,
    }
}

/// The degree a waiting video is assumed to resume at: no wider than the
/// default (a pause does not promise the GPUs back), so waiting never
/// looks better than running now.
fn resume_degree(v: &VideoReq, cfg: &SchedConfig) -> u32 {
    ref_degree(v, cfg).min(cfg.default_sp)
}

/// The video's outlook if it runs from now at degree `p` (`Some`), or
/// waits one round first (`None`).
pub fn video_outlook(
    v: &VideoReq,
    p: Option<u32>,
    snap: &Snapshot,
    profile: &DiffusionProfile,
    cfg: &SchedConfig,
) -> Outlook {
    let steps = f64::from(v.steps_left);
    let vae = profile.video_vae_ms(v.size, v.frames);
    let finish = match p {
        Some(p) => {
            let moved = matches!(v.place, Place::Paused { home } if !snap.avail.contains(&home));
            let mig = if moved { profile.migrate_ms } else { 0.0 };
            snap.now_ms + mig + steps * profile.video_step_ms(v.size, v.frames, p) + vae
        }
        None => {
            let p = resume_degree(v, cfg);
            let t = profile.video_step_ms(v.size, v.frames, p);
            let round = f64::from(cfg.round_steps.min(v.steps_left));
            snap.now_ms + (round + steps) * t + vae
        }
    };
    let budget = (v.deadline_ms - v.arrival_ms).max(1.0);
    let lax = (v.deadline_ms - finish) / budget;
    let recoverable = on_time(finish, v.deadline_ms);
    Outlook { finish_ms: finish, recoverable, laxity: if recoverable { lax } else { -1.0 + 1e-3 * lax } }
}

/// One option of one video: `p = 0` waits.
#[derive(Debug, Clone, Copy)]
struct Cand {
    p: u32,
    score: Score,
}

fn candidates(v: &VideoReq, snap: &Snapshot, profile: &DiffusionProfile, cfg: &SchedConfig) -> Vec<Cand> {
    let n = snap.avail.len() as u32;
    let elastic = cfg.mode == super::Mode::GenServe;
    let degrees: Vec<u32> = if elastic { cfg.sp_degrees.clone() } else { vec![ref_degree(v, cfg)] };
    // GPUs past the image reserve are spare: wider SP than the video's
    // base degree, and hopeless videos, only use those.
    let spare = n.saturating_sub(snap.image_reserve as u32);
    let base = if elastic { ref_degree(v, cfg).min(cfg.default_sp) } else { ref_degree(v, cfg) };
    // A video narrows below its base degree only for images that wait (the
    // paper's trigger): narrower SP to start more videos at once spreads the
    // pool thin and costs deadlines later (2-4 points of SAR at 30-36
    // requests a minute in the simulator).
    let narrowest = if snap.images.is_empty() { base } else { 1 };
    let score = |o: Outlook| Score { meets: u32::from(o.recoverable), value: o.laxity };
    let mut out: Vec<Cand> = degrees
        .into_iter()
        .filter(|&p| p <= n && p >= narrowest)
        .filter_map(|p| {
            let o = video_outlook(v, Some(p), snap, profile, cfg);
            (p <= spare || ((o.recoverable || snap.idle) && p <= base)).then_some(Cand { p, score: score(o) })
        })
        .collect();
    let wait = video_outlook(v, None, snap, profile, cfg);
    // Preemption never costs a running video a deadline it would meet.
    let keeps = match &v.place {
        Place::Boundary { gpus } => video_outlook(v, Some(gpus.len() as u32), snap, profile, cfg).recoverable,
        _ => false,
    };
    if wait.recoverable || !keeps || out.is_empty() {
        out.push(Cand { p: 0, score: score(wait) });
    }
    out
}

/// EDF image batches for up to `max` GPUs, most urgent first, each with
/// its score (images that meet their deadline; value 1 per image served,
/// so late images still beat idling). Hopeless images go after the rest.
pub(super) fn image_batches(
    snap: &Snapshot,
    profile: &DiffusionProfile,
    max: usize,
    batch_cap: u32,
) -> Vec<(Batch, Score)> {
    let now = snap.now_ms;
    let mut order: Vec<&ImageReq> = snap.images.iter().collect();
    let hopeless = |i: &ImageReq| !on_time(now + profile.image_ms(i.size, 1), i.deadline_ms);
    order.sort_by(|a, b| hopeless(a).cmp(&hopeless(b)).then(a.deadline_ms.total_cmp(&b.deadline_ms)));
    let mut taken = vec![false; order.len()];
    let mut out = Vec::new();
    for seed in 0..order.len() {
        if out.len() >= max {
            break;
        }
        if taken[seed] {
            continue;
        }
        taken[seed] = true;
        let head = order[seed];
        let mut members = vec![seed];
        for j in seed + 1..order.len() {
            let b = members.len() as u32 + 1;
            if b > batch_cap {
                break;
            }
            let fits = on_time(now + profile.image_ms(head.size, b), head.deadline_ms) || hopeless(head);
            if !taken[j] && order[j].size == head.size && fits {
                taken[j] = true;
                members.push(j);
            }
        }
        let end = now + profile.image_ms(head.size, members.len() as u32);
        let meets = members.iter().filter(|&&m| on_time(end, order[m].deadline_ms)).count() as u32;
        let ids = members.iter().map(|&m| order[m].id).collect();
        out.push((Batch { gpu: 0, size: head.size, ids }, Score { meets, value: members.len() as f64 }));
    }
    out
}

/// The DP decision (modes `dp` and `genserve`).
pub fn plan_dp(snap: &Snapshot, profile: &DiffusionProfile, cfg: &SchedConfig) -> Plan {
    let n = snap.avail.len();
    // The earliest deadlines are weighed; the rest wait (bounded solve).
    let mut videos: Vec<&VideoReq> = snap.videos.iter().collect();
    videos.sort_by(|a, b| {
        let held = |v: &VideoReq| !matches!(v.place, Place::Boundary { .. });
        held(a).cmp(&held(b)).then(a.deadline_ms.total_cmp(&b.deadline_ms))
    });
    videos.truncate(cfg.max_groups);
    let cands: Vec<Vec<Cand>> = videos.iter().map(|v| candidates(v, snap, profile, cfg)).collect();
    // Stage 2: dp[j][b] = best score of the first j videos using exactly b GPUs.
    let mut dp = vec![vec![None::<(Score, usize)>; n + 1]; videos.len() + 1];
    dp[0][0] = Some((Score::default(), 0));
    for (j, cs) in cands.iter().enumerate() {
        for b in 0..=n {
            for (k, c) in cs.iter().enumerate() {
                let w = c.p as usize;
                let Some((prev, _)) = (w <= b).then(|| dp[j][b - w]).flatten() else { continue };
                let s = prev.add(c.score);
                if dp[j + 1][b].is_none_or(|(cur, _)| s.beats(cur)) {
                    dp[j + 1][b] = Some((s, k));
                }
            }
        }
    }
    // Stage 3: each terminal GPU count with the image candidates for the rest.
    let batch_cap = profile.max_batch;
    let imgs = image_batches(snap, profile, n, batch_cap);
    let mut prefix = vec![Score::default()];
    for (_, s) in &imgs {
        prefix.push(prefix.last().copied().unwrap_or_default().add(*s));
    }
    let mut best: Option<(Score, usize)> = None;
    for (b, cell) in dp[videos.len()].iter().enumerate() {
        let Some((vs, _)) = cell else { continue };
        let total = vs.add(prefix[(n - b).min(imgs.len())]);
        if best.is_none_or(|(s, _)| total.beats(s)) {
            best = Some((total, b));
        }
    }
    let Some((_, mut b)) = best else { return Plan::default() };
    let mut degree = vec![0u32; videos.len()];
    for j in (0..videos.len()).rev() {
        let (_, k) = dp[j + 1][b].expect("backtracked cell is reachable");
        degree[j] = cands[j][k].p;
        b -= degree[j] as usize;
    }
    let chosen: Vec<(&VideoReq, u32)> = videos.iter().copied().zip(degree).filter(|(_, p)| *p > 0).collect();
    let used: usize = chosen.iter().map(|(_, p)| *p as usize).sum();
    let batches = imgs.into_iter().take(n - used).map(|(b, _)| b).collect();
    materialize(snap, &chosen, batches, cfg)
}

/// Turns degrees into GPUs: a video keeps the GPUs it holds (lead first),
/// a paused one resumes on its home when free, the rest take free GPUs in
/// order; image batches take what is left.
pub(super) fn materialize(
    snap: &Snapshot,
    chosen: &[(&VideoReq, u32)],
    batches: Vec<Batch>,
    cfg: &SchedConfig,
) -> Plan {
    let mut pool: Vec<Gpu> = snap.avail.to_vec();
    let take =
        |g: Gpu, pool: &mut Vec<Gpu>| pool.iter().position(|&x| x == g).map(|i| pool.remove(i)).is_some();
    let mut runs: Vec<(u64, Vec<Gpu>, u32, u32)> = Vec::new();
    for (v, p) in chosen {
        let mut gpus = Vec::new();
        let prefer: Vec<Gpu> = match &v.place {
            Place::Boundary { gpus } => gpus.clone(),
            Place::Paused { home } => vec![*home],
            Place::Queued => vec![],
        };
        for g in prefer {
            if gpus.len() < *p as usize && take(g, &mut pool) {
                gpus.push(g);
            }
        }
        runs.push((v.id, gpus, *p, cfg.round_steps.min(v.steps_left)));
    }
    let mut out = Plan::default();
    for (id, mut gpus, p, steps) in runs {
        while gpus.len() < p as usize && !pool.is_empty() {
            gpus.push(pool.remove(0));
        }
        out.runs.push(Run { id, gpus, steps });
    }
    for mut b in batches {
        if pool.is_empty() {
            break;
        }
        b.gpu = pool.remove(0);
        out.batches.push(b);
    }
    out
}
