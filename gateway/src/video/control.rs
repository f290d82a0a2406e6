//! The control tick (every `video.control_tick_s`): refreshes each live
//! stream's credit and urgency, then plans moves in one placement layer:
//!
//! 1. **Min-max rebalancing** (TurboServe §5.2.1, `[video.fleet] placement
//!    = "min_max"`): credit-blind, over the active streams' per-engine
//!    counts; moves off the bottleneck engine while
//!    Γ = L − L′ − η·κ > 0.
//! 2. **URGENT re-homing** (SlackServe §4.2, `rehoming`): on the placement
//!    after step 1, URGENT-heavy engines send their lowest-credit URGENT
//!    streams to engines with no URGENT or NORMAL stream; a move is kept
//!    only if it does not raise the bottleneck ℓ̂ that step 1 left (so the
//!    two never undo each other), and never for a stream step 1 moved.
//!
//! Both share each stream's cooldown and skip streams already moving. Each
//! move goes to its stream's driver, which performs it from its next chunk
//! boundary on (`driver::migrate_if_planned`).

use std::sync::Arc;
use std::time::Duration;

use policies::video::fleet::{self, PlacementMode};
use policies::video::placement::{plan_rehoming, Move, RehomeLimits, StreamView};
use policies::video::{self as pv, VideoConfig};

use super::Streams;
use crate::reload::PolicyStore;

/// Runs the tick under the active policy version; spawn it.
/// Only the fleet's leader (the cluster's leader lease; a lone gateway
/// always) plans moves.
pub async fn run(streams: Arc<Streams>, policies: Arc<PolicyStore>, cluster: Arc<crate::cluster::Cluster>) {
    loop {
        let mut cfg = policies.current().video.clone();
        tokio::time::sleep(Duration::try_from_secs_f64(cfg.control_tick_s).unwrap_or(Duration::from_secs(3)))
            .await;
        if !cluster.is_leader() {
            cfg.rehoming = false;
            cfg.fleet.placement = PlacementMode::Fewest;
        }
        know_profiles(&streams).await;
        let moves = tick(&streams, &cfg);
        if !moves.is_empty() {
            tracing::info!(event = "video_move_plan", moves = moves.len());
        }
    }
}

/// Fetches the video profile of every engine that takes streams and has
/// none cached yet (a new or restarted engine), so that the placement and
/// the autoscaler see the whole fleet. At most half a second per engine.
async fn know_profiles(streams: &Streams) {
    for i in 0..streams.pool.len() {
        if streams.pool.slot(i).routable_for_video() && streams.profiles.cached(i).is_none() {
            let _ = tokio::time::timeout(Duration::from_millis(500), streams.profiles.get(i)).await;
        }
    }
}

/// One tick: refreshes credits, plans moves and hands them to the drivers.
/// Returns the plan.
pub fn tick(streams: &Streams, cfg: &VideoConfig) -> Vec<Move> {
    let now = streams.now();
    let live = streams.all();
    let mut views = Vec::new();
    let mut active = Vec::new();
    for (i, s) in live.iter().enumerate() {
        let mut st = s.lock();
        if st.ended.is_some() {
            continue;
        }
        let next_s = st.next.map_or(s.chunk_s(), |(_, t)| t);
        let remaining = st.in_flight.map_or(0.0, |(at, expected)| (expected - (now - at)).max(0.0));
        let credit = pv::credit(st.playout.slack(now), remaining, next_s);
        st.credit_s = credit;
        st.urgency = pv::urgency(credit, next_s, cfg.alpha);
        // Free: no move planned or under way; settled: free and out of
        // its last move's cooldown (an evacuation waits for free only).
        let free = st.not_moving();
        let settled = free && st.last_moved.is_none_or(|t| now - t >= cfg.rehome_cooldown_s);
        // Paused streams take part only to leave a draining engine. A
        // stream being moved counts where it is going: planning again on
        // its old home would send a second stream after it.
        let at = st.destination();
        active.push((i, at, settled, st.playout.paused(), free));
        if settled {
            views.push(StreamView {
                id: i as u64,
                engine: st.home,
                credit_s: credit,
                urgency: st.urgency,
                last_moved: st.last_moved,
            });
        }
    }
    let mut moves = Vec::new();
    let mut minmax = None;
    // Min-max rebalancing, or (placement "fewest") only the evacuation of
    // engines being drained for scale-in: their streams must leave before
    // the engine stops (TurboServe's order: rebalance, then scale in).
    if let Some((engines, gpus)) = streams.fleet_view(cfg) {
        let closed = |e: usize| engines.iter().position(|&x| x == e).is_some_and(|j| !gpus[j].open);
        let sessions: Vec<fleet::Active> = active
            .iter()
            .filter(|&&(_, home, _, paused, _)| !paused || closed(home))
            .filter_map(|&(i, home, settled, _, _)| {
                Some(fleet::Active {
                    id: i as u64,
                    gpu: engines.iter().position(|&e| e == home)?,
                    state_bytes: streams.state_bytes(),
                    movable: settled,
                })
            })
            .collect();
        let mut params = cfg.fleet.params();
        if cfg.fleet.placement != PlacementMode::MinMax {
            params.max_moves = 0; // evacuation only
        }
        let plan = fleet::rebalance(&gpus, &sessions, &params);
        // A stream already moving finishes that move first.
        let free = |id: u64| active.iter().any(|&(i, _, _, _, f)| i as u64 == id && f);
        moves.extend(plan.moves.iter().filter(|m| free(m.session)).map(|m| Move {
            stream: m.session,
            from: engines[m.from],
            to: engines[m.to],
        }));
        if cfg.fleet.placement == PlacementMode::MinMax {
            minmax = Some((engines, gpus, plan));
        }
    }
    if cfg.rehoming {
        let moved: Vec<u64> = moves.iter().map(|m| m.stream).collect();
        views.retain(|v| !moved.contains(&v.id));
        for v in &mut views {
            if let Some(m) = moves.iter().find(|m| m.stream == v.id) {
                v.engine = m.to;
            }
        }
        let engines: Vec<usize> =
            (0..streams.pool.len()).filter(|&i| streams.pool.slot(i).routable_for_video()).collect();
        let limits = RehomeLimits {
            max_out: cfg.max_out_per_tick,
            max_in: cfg.max_in_per_tick,
            cooldown_s: cfg.rehome_cooldown_s,
        };
        let planned = plan_rehoming(&engines, &views, now, limits);
        let kept = match &minmax {
            // Never onto an engine the move would make the bottleneck.
            Some((engines, gpus, plan)) => {
                let index = |e: usize| engines.iter().position(|&x| x == e).unwrap_or(usize::MAX);
                let pairs: Vec<(usize, usize)> =
                    planned.iter().map(|m| (index(m.from), index(m.to))).collect();
                fleet::admit_rehoming(gpus, plan, &pairs)
            }
            None => vec![true; planned.len()],
        };
        moves.extend(planned.into_iter().zip(kept).filter_map(|(m, k)| k.then_some(m)));
    }
    for m in &moves {
        let s = &live[m.stream as usize];
        s.lock().move_to = Some(m.to);
        s.wake.notify_one();
    }
    moves
}
