//! The control tick (every `video.control_tick_s`): refreshes each live
//! stream's credit and urgency, plans re-homing with
//! `policies::video::placement::plan_rehoming` (URGENT-heavy engines send
//! their lowest-credit URGENT streams to engines with no URGENT or NORMAL
//! stream; caps per engine per tick; a cooldown per stream) and hands each
//! move to its stream's driver, which performs it at its next chunk
//! boundary.

use std::sync::Arc;
use std::time::Duration;

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
        cfg.rehoming &= cluster.is_leader();
        let moves = tick(&streams, &cfg);
        if !moves.is_empty() {
            tracing::info!(event = "video_rehoming_plan", moves = moves.len());
        }
    }
}

/// One tick: refreshes credits, plans moves (when re-homing is on) and
/// hands them to the drivers. Returns the plan.
pub fn tick(streams: &Streams, cfg: &VideoConfig) -> Vec<Move> {
    let now = streams.now();
    let live = streams.all();
    let mut views = Vec::new();
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
        views.push(StreamView {
            id: i as u64,
            engine: st.home,
            credit_s: credit,
            urgency: st.urgency,
            last_moved: st.last_moved,
        });
    }
    if !cfg.rehoming {
        return Vec::new();
    }
    let engines: Vec<usize> = (0..streams.pool.len()).filter(|&i| streams.pool.slot(i).routable()).collect();
    let limits = RehomeLimits {
        max_out: cfg.max_out_per_tick,
        max_in: cfg.max_in_per_tick,
        cooldown_s: cfg.rehome_cooldown_s,
    };
    let moves = plan_rehoming(&engines, &views, now, limits);
    for m in &moves {
        let s = &live[m.stream as usize];
        s.lock().move_to = Some(m.to);
        s.wake.notify_one();
    }
    moves
}
