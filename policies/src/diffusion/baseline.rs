//! The ablation's first two steps: FCFS, and FCFS + intelligent video
//! preemption.

use super::dp::{materialize, video_outlook};
use super::{Batch, DiffusionProfile, Place, Plan, SchedConfig, Snapshot, VideoReq};

/// Strict arrival order over images and videos: each image a batch of one
/// on one GPU, each video at the default SP degree to completion (round
/// after round, never paused); the head waits for enough free GPUs and
/// everything behind it waits with it.
pub(super) fn plan_fcfs(snap: &Snapshot, profile: &DiffusionProfile, cfg: &SchedConfig) -> Plan {
    let mut free = snap.avail.len();
    let mut chosen: Vec<(&VideoReq, u32)> = Vec::new();
    for v in snap.videos {
        if let Place::Boundary { gpus } = &v.place {
            chosen.push((v, gpus.len() as u32));
            free -= gpus.len().min(free);
        }
    }
    enum Item<'a> {
        Image(usize),
        Video(&'a VideoReq),
    }
    let mut items: Vec<(f64, Item)> =
        snap.images.iter().enumerate().map(|(i, r)| (r.arrival_ms, Item::Image(i))).collect();
    items.extend(
        snap.videos
            .iter()
            .filter(|v| !matches!(v.place, Place::Boundary { .. }))
            .map(|v| (v.arrival_ms, Item::Video(v))),
    );
    items.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut batches = Vec::new();
    for (_, item) in items {
        let need = match item {
            Item::Image(_) => 1,
            Item::Video(_) => cfg.default_sp as usize,
        };
        if need > free {
            break;
        }
        free -= need;
        match item {
            Item::Image(i) => batches.push(one(snap, i)),
            Item::Video(v) => chosen.push((v, cfg.default_sp)),
        }
    }
    let _ = profile;
    materialize(snap, &chosen, batches, cfg)
}

fn one(snap: &Snapshot, i: usize) -> Batch {
    let r = &snap.images[i];
    Batch { gpu: 0, size: r.size, ids: vec![r.id] }
}

/// FCFS plus preemption: images go first (one per GPU, arrival order); a
/// video at a round boundary pauses, highest slack first, while images
/// wait without a GPU and it stays able to meet its deadline after a
/// round's wait; a paused video resumes first when its budget gets tight,
/// otherwise when no image waits. Videos run in rounds at the default SP.
pub(super) fn plan_preempt(snap: &Snapshot, profile: &DiffusionProfile, cfg: &SchedConfig) -> Plan {
    let mut free = snap.avail.len();
    let mut boundary: Vec<&VideoReq> =
        snap.videos.iter().filter(|v| matches!(v.place, Place::Boundary { .. })).collect();
    let slack = |v: &VideoReq| v.deadline_ms - video_outlook(v, None, snap, profile, cfg).finish_ms;
    boundary.sort_by(|a, b| slack(b).total_cmp(&slack(a)));
    let held: usize = boundary.iter().map(|v| held_gpus(v)).sum();
    let mut short = snap.images.len().saturating_sub(free - held.min(free));
    let mut chosen: Vec<(&VideoReq, u32)> = Vec::new();
    for v in boundary {
        let p = held_gpus(v);
        if short > 0 && video_outlook(v, None, snap, profile, cfg).recoverable {
            short = short.saturating_sub(p);
            continue; // paused: its GPUs go to the images
        }
        chosen.push((v, p as u32));
        free -= p.min(free);
    }
    let mut waiting: Vec<&VideoReq> =
        snap.videos.iter().filter(|v| !matches!(v.place, Place::Boundary { .. })).collect();
    waiting.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    let p = cfg.default_sp as usize;
    // Tight paused videos first: waiting another round would cost them their deadline.
    let tight = |v: &VideoReq| {
        matches!(v.place, Place::Paused { .. }) && !video_outlook(v, None, snap, profile, cfg).recoverable
    };
    let mut started = vec![false; waiting.len()];
    for (k, v) in waiting.iter().enumerate() {
        if tight(v) && p <= free {
            chosen.push((v, p as u32));
            started[k] = true;
            free -= p;
        }
    }
    let mut images: Vec<usize> = (0..snap.images.len()).collect();
    images.sort_by(|&a, &b| snap.images[a].arrival_ms.total_cmp(&snap.images[b].arrival_ms));
    let batches: Vec<Batch> = images.iter().take(free).map(|&i| one(snap, i)).collect();
    free -= batches.len();
    if batches.len() == snap.images.len() {
        // Idle GPUs: paused videos resume, then queued ones start (FIFO).
        let (paused, queued): (Vec<_>, Vec<_>) = (0..waiting.len())
            .filter(|&k| !started[k])
            .partition(|&k| matches!(waiting[k].place, Place::Paused { .. }));
        for k in paused.into_iter().chain(queued) {
            if p > free {
                break;
            }
            chosen.push((waiting[k], p as u32));
            free -= p;
        }
    }
    materialize(snap, &chosen, batches, cfg)
}

fn held_gpus(v: &VideoReq) -> usize {
    match &v.place {
        Place::Boundary { gpus } => gpus.len(),
        _ => 0,
    }
}
