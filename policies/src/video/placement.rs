//! Where streams live: the home engine of a new stream, whether the fleet
//! can take it at all, which resident to evict when an engine's state arena
//! is full, and the re-homing plan of each control tick.

use std::collections::HashMap;

use super::fidelity::VideoProfile;
use super::playout::Urgency;

/// A new stream's home: the engine with the fewest streams (ties: the
/// lowest index). `streams[i]` is engine i's count; `None` for no engine.
pub fn home(streams: &[(usize, u32)]) -> Option<usize> {
    streams.iter().min_by_key(|(idx, n)| (*n, *idx)).map(|(idx, _)| *idx)
}

/// Whether one more stream with chunk duration `chunk_s` can keep up on an
/// engine already coalescing `resident` streams: even the fastest
/// configuration's batch of `resident + 1` chunks must fit one chunk
/// duration. Returns the batch time when it does not (for `Retry-After`).
pub fn can_keep_up(profile: &VideoProfile, resident: u32, chunk_s: f64) -> Result<(), f64> {
    let batch_ms = profile.batch_ms(profile.fastest().chunk_ms, resident as usize + 1);
    if batch_ms <= chunk_s * 1e3 {
        Ok(())
    } else {
        Err(batch_ms)
    }
}

/// The resident stream to suspend when an engine's state arena is full:
/// the one with the most credit (it can wait longest). `(id, credit)`.
pub fn evict(residents: &[(u64, f64)]) -> Option<u64> {
    residents.iter().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0))).map(|(id, _)| *id)
}

/// What the planner knows of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamView {
    pub id: u64,
    pub engine: usize,
    pub credit_s: f64,
    pub urgency: Urgency,
    /// When it last moved (seconds, same clock as `now`).
    pub last_moved: Option<f64>,
}

/// One planned move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub stream: u64,
    pub from: usize,
    pub to: usize,
}

/// Limits of one tick's plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RehomeLimits {
    pub max_out: u32,
    pub max_in: u32,
    pub cooldown_s: f64,
}

/// The re-homing plan of one control tick. Senders are URGENT-heavy
/// engines (at least two streams, at least half of them URGENT: a lone
/// stream gains nothing from a move); each sends its
/// lowest-credit URGENT streams, at most `max_out`, skipping streams that
/// moved within `cooldown_s`. Receivers are engines with no URGENT or
/// NORMAL stream (idle or only RELAXED ones), fewest streams first, each
/// taking at most `max_in`. The most urgent stream overall moves first.
/// `engines`: the engines that may take part (ready ones).
pub fn plan_rehoming(engines: &[usize], streams: &[StreamView], now: f64, limits: RehomeLimits) -> Vec<Move> {
    let mut per_engine: HashMap<usize, Vec<&StreamView>> = HashMap::new();
    for s in streams {
        per_engine.entry(s.engine).or_default().push(s);
    }
    let count = |e: usize, pred: &dyn Fn(&StreamView) -> bool| {
        per_engine.get(&e).map_or(0, |v| v.iter().filter(|s| pred(s)).count())
    };
    let mut receivers: Vec<(usize, usize)> = engines
        .iter()
        .copied()
        .filter(|&e| count(e, &|s| s.urgency != Urgency::Relaxed) == 0)
        .map(|e| (count(e, &|_| true), e))
        .collect();
    receivers.sort();
    let mut received: HashMap<usize, u32> = HashMap::new();
    // Candidates: URGENT streams of URGENT-heavy engines, not cooling down.
    let mut candidates: Vec<&StreamView> = Vec::new();
    for &e in engines {
        let total = count(e, &|_| true);
        let urgent = count(e, &|s| s.urgency == Urgency::Urgent);
        if urgent == 0 || total < 2 || 2 * urgent < total {
            continue;
        }
        let mut mine: Vec<&StreamView> = per_engine[&e]
            .iter()
            .copied()
            .filter(|s| s.urgency == Urgency::Urgent)
            .filter(|s| s.last_moved.is_none_or(|t| now - t >= limits.cooldown_s))
            .collect();
        mine.sort_by(|a, b| a.credit_s.total_cmp(&b.credit_s).then(a.id.cmp(&b.id)));
        candidates.extend(mine.into_iter().take(limits.max_out as usize));
    }
    candidates.sort_by(|a, b| a.credit_s.total_cmp(&b.credit_s).then(a.id.cmp(&b.id)));
    let mut moves = Vec::new();
    for s in candidates {
        let to = receivers
            .iter()
            .map(|&(_, e)| e)
            .find(|&e| e != s.engine && received.get(&e).copied().unwrap_or(0) < limits.max_in);
        if let Some(to) = to {
            *received.entry(to).or_default() += 1;
            moves.push(Move { stream: s.id, from: s.engine, to });
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::video::fidelity::{ConfigPoint, Fidelity, Precision};

    fn s(id: u64, engine: usize, credit_s: f64, urgency: Urgency, last_moved: Option<f64>) -> StreamView {
        StreamView { id, engine, credit_s, urgency, last_moved }
    }

    const LIMITS: RehomeLimits = RehomeLimits { max_out: 2, max_in: 1, cooldown_s: 60.0 };

    #[test]
    fn home_is_the_engine_with_fewest_streams() {
        assert_eq!(home(&[(0, 3), (1, 1), (2, 1)]), Some(1));
        assert_eq!(home(&[]), None);
    }

    #[test]
    fn urgent_heavy_engines_send_their_lowest_credit_urgent_streams() {
        use Urgency::*;
        let streams = vec![
            s(1, 0, -0.5, Urgent, None),
            s(2, 0, -0.9, Urgent, None),
            s(3, 0, 0.1, Urgent, None),
            s(4, 0, 2.0, Relaxed, None),
            s(5, 1, 3.0, Relaxed, None),
            // Engine 2 is empty; engine 3 has a NORMAL stream: not a receiver.
            s(6, 3, 0.9, Normal, None),
        ];
        let moves = plan_rehoming(&(0..4).collect::<Vec<_>>(), &streams, 100.0, LIMITS);
        // At most 2 out of engine 0 (its two lowest-credit URGENT streams),
        // at most 1 into each receiver: empty engine 2 first, then engine 1.
        assert_eq!(moves, vec![Move { stream: 2, from: 0, to: 2 }, Move { stream: 1, from: 0, to: 1 }]);
    }

    #[test]
    fn caps_and_cooldown_hold() {
        use Urgency::*;
        // Two URGENT-heavy senders, one receiver: only one move in.
        let streams = vec![
            s(1, 0, -1.0, Urgent, None),
            s(4, 0, -0.5, Urgent, None),
            s(2, 1, -2.0, Urgent, None),
            s(3, 1, -0.1, Urgent, Some(90.0)),
        ];
        let moves = plan_rehoming(&(0..3).collect::<Vec<_>>(), &streams, 100.0, LIMITS);
        assert_eq!(moves, vec![Move { stream: 2, from: 1, to: 2 }]);
        // Stream 3 moved 10 s ago: cooling down even with a free receiver.
        let moves = plan_rehoming(&(0..5).collect::<Vec<_>>(), &streams, 100.0, LIMITS);
        assert!(moves.iter().all(|m| m.stream != 3), "{moves:?}");
        assert_eq!(moves.len(), 3);
        // A lone URGENT stream is not moved: nothing to gain.
        assert!(plan_rehoming(&[0, 1], &[s(1, 0, -1.0, Urgent, None)], 0.0, LIMITS).is_empty());
        // A mostly healthy engine with one URGENT stream is not a sender.
        let streams =
            vec![s(1, 0, -1.0, Urgent, None), s(2, 0, 1.0, Normal, None), s(3, 0, 5.0, Relaxed, None)];
        assert!(plan_rehoming(&(0..2).collect::<Vec<_>>(), &streams, 0.0, LIMITS).is_empty());
    }

    #[test]
    fn eviction_takes_the_highest_credit_resident() {
        assert_eq!(evict(&[(1, 0.5), (2, 3.0), (3, -1.0)]), Some(2));
        assert_eq!(evict(&[]), None);
    }

    #[test]
    fn a_stream_is_refused_when_even_the_fastest_batch_misses_playout() {
        let point = |ms: f64, q: f64| ConfigPoint {
            fidelity: Fidelity { steps: 2, sparsity_pct: 90, window: 1, precision: Precision::Fp8 },
            chunk_ms: ms,
            quality: q,
        };
        let profile = VideoProfile {
            model: "m".into(),
            engine_class: "c".into(),
            latent_frames: 3,
            batch_cost: 0.5,
            sp2_factor: 0.6,
            configs: vec![point(250.0, 0.9), point(600.0, 1.0)],
        };
        // D = 0.75 s: 250 × (1 + 0.5 × k) ≤ 750 while k ≤ 4 residents.
        assert_eq!(can_keep_up(&profile, 4, 0.75), Ok(()));
        assert_eq!(can_keep_up(&profile, 5, 0.75), Err(875.0));
    }
}
