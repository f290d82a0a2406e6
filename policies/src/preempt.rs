//! Priority preemption at token boundaries (004: a higher tier's TTFT is
//! protected by pausing a lower tier's decode, not by queueing behind it).
//!
//! A pure function of the engine's waiting and running sequences, its
//! decode-slot limit, its latency profile and `now`; the engine's scheduler
//! calls it at every token boundary, the tests call it with made-up times.
//!
//! The rule, for the highest-class sequence waiting for a slot (`w`):
//! 1. **Only when every slot is taken.** A free slot means `w` starts at
//!    the next prefill without anyone paused.
//! 2. **Only when waiting would miss its budget.** The soonest natural slot
//!    release is the running sequence closest to its `max_tokens`
//!    (an upper bound: it may stop earlier); if `w` can wait that long, be
//!    prefilled and still meet its TTFT deadline, nothing is paused.
//! 3. **Only a strictly lower class.** A sequence is never paused for an
//!    equal or lower class; among the lower ones the lowest class goes
//!    first (bronze, then silver), then the one with the most end-to-end
//!    slack.
//! 4. **Bounded.** A sequence is paused at most its own `max_pauses` times,
//!    and never when the pause (until the next natural slot release, when
//!    a paused sequence resumes before any new one of its class or below)
//!    plus its remaining decode would miss its own end-to-end deadline.
//!
//! A paused sequence keeps its KV pages: resuming costs no recompute.
//! [`resumes`] says which paused sequence takes a free slot back.

use std::time::Duration;

use crate::profile::LatencyProfile;

/// A sequence waiting for a decode slot (its prefill not run yet).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waiting {
    pub id: u64,
    /// Higher is more important; `None`: takes no part in preemption.
    pub class: Option<u32>,
    /// Prompt tokens its prefill computes.
    pub prefill_tokens: u32,
    /// When its first token is due (on the caller's clock).
    pub ttft_deadline: Duration,
}

/// A sequence holding a decode slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Running {
    pub id: u64,
    /// `None`: never paused.
    pub class: Option<u32>,
    /// Output tokens it may still produce (`max_tokens - generated`).
    pub remaining_tokens: u32,
    /// Times it has been paused, and the most it may be.
    pub pauses: u32,
    pub max_pauses: u32,
    /// When its last token is due; `None`: no end-to-end deadline.
    pub e2e_deadline: Option<Duration>,
}

/// The sequence to pause now so that the most important waiting one can
/// start, if the rule above allows one.
pub fn victim(
    waiting: &[Waiting],
    running: &[Running],
    max_batch: u32,
    profile: &LatencyProfile,
    now: Duration,
) -> Option<u64> {
    if (running.len() as u32) < max_batch || running.is_empty() {
        return None;
    }
    let w = waiting
        .iter()
        .filter_map(|w| w.class.map(|c| (c, w)))
        .max_by(|(a, x), (b, y)| a.cmp(b).then(y.ttft_deadline.cmp(&x.ttft_deadline)))?;
    let (class, w) = w;
    let step = ms(profile.decode_step_ms(running.len() as u32, 0));
    let natural = running.iter().map(|r| step * r.remaining_tokens).min().unwrap_or_default();
    let prefill = ms(profile.prefill_ms(w.prefill_tokens));
    if now + natural + prefill <= w.ttft_deadline {
        return None;
    }
    running
        .iter()
        .filter(|r| r.class.is_some_and(|c| c < class) && r.pauses < r.max_pauses)
        .filter_map(|r| {
            // Paused until the next natural release, then its own decode.
            let done = now + natural + prefill + step * r.remaining_tokens;
            let slack = match r.e2e_deadline {
                Some(d) if done > d => return None,
                Some(d) => d - done,
                None => Duration::MAX,
            };
            Some((r.class, slack, r.id))
        })
        .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)))
        .map(|(_, _, id)| id)
}

/// Which paused sequence takes a free slot back: the most important one,
/// unless a waiting sequence of a strictly higher class would take that
/// slot first. `paused` and `waiting` give (id, class).
pub fn resumes(paused: &[(u64, Option<u32>)], waiting: &[(u64, Option<u32>)]) -> Option<u64> {
    let rank = |c: Option<u32>| c.map_or(0, |c| u64::from(c) + 1);
    let (id, class) = paused.iter().max_by(|a, b| rank(a.1).cmp(&rank(b.1)).then(b.0.cmp(&a.0)))?;
    let higher_waits = waiting.iter().any(|(_, c)| rank(*c) > rank(*class));
    (!higher_waits).then_some(*id)
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64((v / 1e3).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 ms a prefill of any length, 20 ms a decode step.
    fn profile() -> LatencyProfile {
        LatencyProfile::parse(
            "t.toml",
            "model = \"m\"\nengine_class = \"c\"\nsource = \"synthetic\"\n[prefill]\npoints = [[1, 100.0], [100000, 100.0]]\n[decode]\nbatch_points = [[1, 20.0], [64, 20.0]]\n",
        )
        .unwrap()
    }

    fn run(id: u64, class: u32, remaining: u32) -> Running {
        Running {
            id,
            class: Some(class),
            remaining_tokens: remaining,
            pauses: 0,
            max_pauses: 2,
            e2e_deadline: Some(Duration::from_secs(60)),
        }
    }

    fn gold(budget_ms: u64) -> Waiting {
        Waiting {
            id: 100,
            class: Some(3),
            prefill_tokens: 50,
            ttft_deadline: Duration::from_millis(budget_ms),
        }
    }

    #[test]
    fn a_full_batch_of_lower_classes_gives_up_its_lowest_class() {
        let running = [run(1, 2, 200), run(2, 1, 300), run(3, 2, 250)];
        // 200 tokens x 20 ms = 4 s to the first release: gold's 500 ms is missed.
        assert_eq!(victim(&[gold(500)], &running, 3, &profile(), Duration::ZERO), Some(2));
    }

    #[test]
    fn nobody_is_paused_while_a_slot_is_free_or_waiting_meets_the_budget() {
        let running = [run(1, 1, 200), run(2, 1, 300)];
        assert_eq!(victim(&[gold(500)], &running, 3, &profile(), Duration::ZERO), None, "a free slot");
        let ending = [run(1, 1, 10), run(2, 1, 300)];
        // 10 x 20 ms + 100 ms prefill = 300 ms <= 500 ms: wait.
        assert_eq!(
            victim(&[gold(500)], &ending, 2, &profile(), Duration::ZERO),
            None,
            "a slot frees in time"
        );
        assert_eq!(victim(&[gold(250)], &ending, 2, &profile(), Duration::ZERO), Some(1), "not in time");
    }

    #[test]
    fn never_for_an_equal_or_lower_class() {
        let running = [run(1, 3, 200), run(2, 4, 300)];
        assert_eq!(victim(&[gold(500)], &running, 2, &profile(), Duration::ZERO), None);
        let unclassed = Waiting { class: None, ..gold(500) };
        let lower = [run(1, 1, 200), run(2, 1, 300)];
        assert_eq!(
            victim(&[unclassed], &lower, 2, &profile(), Duration::ZERO),
            None,
            "no class, no preemption"
        );
        let mut never = run(1, 1, 200);
        never.class = None;
        assert_eq!(victim(&[gold(500)], &[never, run(2, 3, 300)], 2, &profile(), Duration::ZERO), None);
    }

    #[test]
    fn the_pause_cap_and_the_victims_own_deadline_hold() {
        let mut capped = run(1, 1, 200);
        capped.pauses = 2;
        assert_eq!(victim(&[gold(500)], &[capped, run(2, 3, 300)], 2, &profile(), Duration::ZERO), None);
        // 4 s to the next release + 100 ms + 200 x 20 ms = 8.1 s: a 5 s deadline would be missed.
        let mut tight = run(1, 1, 200);
        tight.e2e_deadline = Some(Duration::from_secs(5));
        let loose = run(3, 1, 250);
        assert_eq!(
            victim(&[gold(500)], &[tight, run(2, 3, 300), loose], 3, &profile(), Duration::ZERO),
            Some(3),
            "the one that can afford it"
        );
        assert_eq!(victim(&[gold(500)], &[tight, run(2, 3, 300)], 2, &profile(), Duration::ZERO), None);
    }

    #[test]
    fn paused_sequences_resume_unless_a_higher_class_waits() {
        let paused = [(1, Some(1)), (2, Some(2))];
        assert_eq!(resumes(&paused, &[]), Some(2), "the most important first");
        assert_eq!(resumes(&paused, &[(9, Some(2))]), Some(2), "an equal class waiting does not jump it");
        assert_eq!(resumes(&paused, &[(9, Some(3))]), None, "a higher class takes the slot first");
        assert_eq!(resumes(&[], &[(9, Some(3))]), None);
    }
}
