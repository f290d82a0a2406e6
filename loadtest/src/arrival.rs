//! When requests are sent: open-loop arrival schedules, fixed before the run
//! starts so a slow target cannot push them back (no coordinated omission).
//!
//! - Poisson arrivals at a rate, or evenly spaced ("constant") arrivals.
//! - Bursts on top of either: the rate multiplies by `factor` over a linear
//!   ramp, holds, and ramps back down.
//! - Replay of a CSV trace with an arrival timestamp, input tokens and output
//!   tokens, in the column layout of the public Azure LLM inference traces
//!   (`TIMESTAMP,ContextTokens,GeneratedTokens`).
//!
//! Both rate-driven kinds use time rescaling: arrival k happens when the
//! integrated rate Λ(t) reaches x_k, where x_k are the partial sums of
//! unit exponentials (Poisson) or 1, 2, 3, ... (constant). That gives an
//! exact non-homogeneous process for any rate shape.

use policies::rng::SplitMix;
use serde::Serialize;

use crate::workload::Workload;

/// Spacing of rate-driven arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Process {
    /// Exponential gaps: independent arrivals, the usual open-loop model.
    Poisson,
    /// Equal gaps: 1/rate apart (useful to measure the harness itself).
    Constant,
}

/// A burst: the rate ramps linearly from 1x to `factor`x over `ramp_s`
/// starting at `at_s`, holds for `hold_s`, and ramps back over `ramp_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Burst {
    pub factor: f64,
    pub at_s: f64,
    pub ramp_s: f64,
    pub hold_s: f64,
}

impl Burst {
    /// Rate multiplier at `t`.
    pub fn multiplier(&self, t: f64) -> f64 {
        let k = self.factor - 1.0;
        let u = t - self.at_s;
        let (r, h) = (self.ramp_s, self.hold_s);
        if u <= 0.0 || u >= 2.0 * r + h {
            1.0
        } else if u < r {
            1.0 + k * u / r
        } else if u <= r + h {
            self.factor
        } else {
            1.0 + k * (2.0 * r + h - u) / r
        }
    }

    /// ∫₀ᵗ multiplier, in closed form.
    fn integral(&self, t: f64) -> f64 {
        let k = self.factor - 1.0;
        let (r, h) = (self.ramp_s, self.hold_s);
        let u = (t - self.at_s).clamp(0.0, 2.0 * r + h);
        // Extra area above 1x within the burst, piece by piece.
        let up = u.min(r);
        let mut extra = if r > 0.0 { k * up * up / (2.0 * r) } else { 0.0 };
        extra += k * (u - r).clamp(0.0, h);
        let down = (u - r - h).max(0.0);
        if r > 0.0 {
            extra += k * (down - down * down / (2.0 * r));
        }
        t + extra
    }
}

/// A rate-driven schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RateSpec {
    /// Base rate, requests per second.
    pub rate: f64,
    pub duration_s: f64,
    pub process: Process,
    pub burst: Option<Burst>,
}

impl RateSpec {
    /// Offered rate at `t`.
    pub fn rate_at(&self, t: f64) -> f64 {
        self.rate * self.burst.map_or(1.0, |b| b.multiplier(t))
    }

    /// Λ(t): expected arrivals by `t`.
    fn cumulative(&self, t: f64) -> f64 {
        self.rate * self.burst.map_or(t, |b| b.integral(t))
    }

    /// Arrival times in seconds from the start, sorted, all `< duration_s`.
    pub fn times(&self, rng: &mut SplitMix) -> Vec<f64> {
        let mut out = Vec::new();
        if self.rate <= 0.0 {
            return out;
        }
        let end = self.cumulative(self.duration_s);
        let (mut x, mut t) = (0.0, 0.0);
        loop {
            x += match self.process {
                Process::Poisson => rng.exponential(1.0),
                Process::Constant => 1.0,
            };
            if x >= end {
                return out;
            }
            t = self.invert(x, t);
            out.push(t);
        }
    }

    /// The `t >= from` with Λ(t) = x (Λ is increasing; bisection).
    fn invert(&self, x: f64, from: f64) -> f64 {
        let (mut lo, mut hi) = (from, self.duration_s);
        for _ in 0..64 {
            let mid = 0.5 * (lo + hi);
            if self.cumulative(mid) < x {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi - lo < 1e-9 {
                break;
            }
        }
        hi
    }
}

/// One row of a replayed trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRow {
    /// Seconds since the trace's first arrival.
    pub at_s: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// Parses a trace CSV. The first column is a timestamp, either
/// `YYYY-MM-DD HH:MM:SS[.fraction]` (as in the Azure traces) or plain
/// seconds; the next two are input and output tokens. A header row is
/// skipped. Times are made relative to the earliest row and sorted.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRow>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (n == 0 && line.chars().next().is_some_and(|c| c.is_ascii_alphabetic())) {
            continue;
        }
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
        if cols.len() < 3 {
            return Err(bad("need timestamp, input tokens, output tokens"));
        }
        let at = timestamp(cols[0]).ok_or_else(|| bad("bad timestamp"))?;
        let input = cols[1].parse().map_err(|_| bad("bad input token count"))?;
        let output = cols[2].parse().map_err(|_| bad("bad output token count"))?;
        rows.push(TraceRow { at_s: at, input_tokens: input, output_tokens: output });
    }
    rows.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let first = rows.first().map_or(0.0, |r| r.at_s);
    for r in &mut rows {
        r.at_s -= first;
    }
    Ok(rows)
}

/// Seconds since 1970 of `YYYY-MM-DD HH:MM:SS[.f]`, or a plain number.
fn timestamp(s: &str) -> Option<f64> {
    if let Ok(x) = s.parse::<f64>() {
        return x.is_finite().then_some(x);
    }
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.trim_end_matches('Z').split(':');
    let (hh, mm): (f64, f64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let ss: f64 = t.next()?.parse().ok()?;
    Some(days_from_civil(y, m, day) as f64 * 86_400.0 + hh * 3600.0 + mm * 60.0 + ss)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Where arrival times (and, for traces, sizes) come from.
#[derive(Debug, Clone)]
pub enum Schedule {
    Rate(RateSpec),
    /// Trace rows, replayed `speed` times faster, cut at `duration_s`.
    Trace {
        rows: Vec<TraceRow>,
        speed: f64,
        duration_s: f64,
    },
}

/// One request of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub id: u64,
    /// Scheduled send time, seconds from the run's start.
    pub at_s: f64,
    /// Index into the workload's mix.
    pub mix: usize,
    /// The whole prompt, shared prefix included.
    pub input_tokens: u32,
    pub max_tokens: u32,
    /// The prompt's shared start: the seed of its words and its tokens
    /// (`[prefix]` group or `[conversation]` history).
    pub prefix: Option<(u64, u32)>,
    /// In a conversation whose answers are resent as received
    /// ([`crate::workload::Answers::Received`]), a turn after the first:
    /// the previous turn's id and this turn's new message, in tokens. The
    /// live runner sends the previous prompt, its answer as received, then
    /// [`Planned::message`].
    pub after: Option<(u64, u32)>,
}

impl Planned {
    /// The prompt text this request sends in a run seeded `seed` (the live
    /// runner sends it; the simulator hashes its blocks).
    pub fn prompt(&self, seed: u64) -> String {
        let own = self.input_tokens - self.prefix.map_or(0, |(_, n)| n);
        crate::workload::prompt(self.prefix, own, seed.wrapping_mul(0x9E37_79B9).wrapping_add(self.id))
    }

    /// The new message of a turn sent after a received answer (`after`).
    pub fn message(&self, seed: u64) -> String {
        let own = self.after.map_or(0, |(_, n)| n);
        crate::workload::synth_prompt(own, seed.wrapping_mul(0x9E37_79B9).wrapping_add(self.id) ^ 0x4D53_4700)
    }
}

/// The whole run's requests, in send order. Deterministic in `seed`:
/// arrivals, tenants and sizes come from separate streams, so changing the
/// rate does not change which sizes are drawn.
pub fn plan(workload: &Workload, schedule: &Schedule, seed: u64) -> Vec<Planned> {
    let mut arrivals = SplitMix(seed ^ 0xA5A5_0001);
    let mut tenants = SplitMix(seed ^ 0xA5A5_0002);
    let mut sizes = SplitMix(seed ^ 0xA5A5_0003);
    let mut shared = SplitMix(seed ^ 0xA5A5_0004);
    let mut turns = vec![Turns::default(); workload.conversation.map_or(0, |c| c.users as usize)];
    let timed: Vec<(f64, Option<TraceRow>)> = match schedule {
        Schedule::Rate(spec) => spec.times(&mut arrivals).into_iter().map(|t| (t, None)).collect(),
        Schedule::Trace { rows, speed, duration_s } => {
            rows.iter().map(|r| (r.at_s / speed, Some(*r))).take_while(|(t, _)| t < duration_s).collect()
        }
    };
    timed
        .into_iter()
        .enumerate()
        .map(|(i, (at_s, row))| {
            let mix = workload.pick(&mut tenants);
            let (input, wanted) = match row {
                Some(r) => (r.input_tokens.max(1), r.output_tokens.max(1)),
                None => (workload.input_tokens.sample(&mut sizes), workload.output_tokens.sample(&mut sizes)),
            };
            let max_tokens = workload.capped_output(&workload.mix[mix].tier, wanted);
            let id = i as u64;
            let Start { prefix, input_tokens, after } =
                shared_start(workload, &mut shared, &mut turns, seed, (id, input, max_tokens));
            Planned { id, at_s, mix, input_tokens, max_tokens, prefix, after }
        })
        .collect()
}

/// One user's place in its conversations.
#[derive(Debug, Clone, Copy, Default)]
struct Turns {
    /// Requests so far (all its conversations).
    sent: u32,
    /// Tokens of the conversation so far, the last answer included.
    history: u32,
    /// The last request's id.
    last: u64,
}

/// How a request's prompt starts: [`Planned::prefix`], the whole prompt's
/// tokens and [`Planned::after`].
struct Start {
    prefix: Option<(u64, u32)>,
    input_tokens: u32,
    after: Option<(u64, u32)>,
}

/// The shared start of the next request's prompt, if its workload has one,
/// the whole prompt's size for a message of `own` tokens, and in a
/// conversation whose answers are received the turn it follows: a
/// `[prefix]` group's prefix (seeded by the group) ahead of the message; or,
/// in a conversation, the whole prompt, which is the conversation so far
/// (every earlier prompt, each followed by its answer: `turn_tokens`
/// standing for it, or a received answer planned as `max_tokens` long) and
/// then the new message, all one stream seeded by the user and the
/// conversation's number, so each turn's prompt is a prefix of the next's.
fn shared_start(
    w: &Workload,
    rng: &mut SplitMix,
    turns: &mut [Turns],
    seed: u64,
    (id, own, max_tokens): (u64, u32, u32),
) -> Start {
    let alone = Start { prefix: None, input_tokens: own, after: None };
    if let Some(p) = w.prefix {
        if rng.unit_f64() >= p.share {
            return alone;
        }
        let group = rng.next_u64() % u64::from(p.groups);
        let key = seed ^ 0x5EED_0000_0000 ^ group.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        return Start {
            prefix: Some((key, p.tokens)),
            input_tokens: own.saturating_add(p.tokens),
            after: None,
        };
    }
    let Some(c) = w.conversation else { return alone };
    let user = (rng.next_u64() % u64::from(c.users)) as usize;
    let t = turns[user];
    let (conversation, turn) = (t.sent / c.turns, t.sent % c.turns);
    let history = if turn == 0 { 0 } else { t.history };
    let whole = history.saturating_add(own);
    let received = c.answers == crate::workload::Answers::Received;
    let answer = if received { max_tokens } else { c.turn_tokens };
    turns[user] = Turns { sent: t.sent + 1, history: whole.saturating_add(answer), last: id };
    let key = (user as u64) << 32 | u64::from(conversation);
    let after = (received && turn > 0).then_some((t.last, own));
    let prefix = Some((seed ^ 0xC0DE_0000_0000 ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15), whole));
    Start { prefix, input_tokens: whole, after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate: f64, duration_s: f64, process: Process, burst: Option<Burst>) -> RateSpec {
        RateSpec { rate, duration_s, process, burst }
    }

    fn shipped(name: &str) -> Workload {
        Workload::load(&format!("{}/workloads/{name}.toml", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    fn requests(w: &Workload, n: usize) -> Vec<Planned> {
        plan(w, &Schedule::Rate(spec(1.0, n as f64, Process::Constant, None)), 9)
    }

    #[test]
    fn shared_prefixes_are_shared_exactly_and_counted_in_the_prompt() {
        let w = shipped("shared-prefix");
        let reqs = requests(&w, 400);
        let with: Vec<&Planned> = reqs.iter().filter(|p| p.prefix.is_some()).collect();
        let share = with.len() as f64 / reqs.len() as f64;
        assert!((share - 0.9).abs() < 0.05, "{share}");
        let groups: std::collections::BTreeSet<u64> = with.iter().map(|p| p.prefix.unwrap().0).collect();
        assert_eq!(groups.len(), 4);
        for p in &reqs {
            let own = p.input_tokens - p.prefix.map_or(0, |(_, n)| n);
            let text = crate::workload::prompt(p.prefix, own, p.id);
            assert_eq!(policies::tokens::count(&text), p.input_tokens, "the whole prompt is counted");
        }
        // Two requests of one group start with the same 1,000 tokens.
        let (a, b) =
            (with[0], with.iter().find(|p| p.id != with[0].id && p.prefix == with[0].prefix).unwrap());
        let pa = crate::workload::prompt(a.prefix, 5, a.id);
        let pb = crate::workload::prompt(b.prefix, 5, b.id);
        let common = pa.chars().zip(pb.chars()).take_while(|(x, y)| x == y).count();
        assert!(common >= 1000 * 4, "{common} characters in common");
    }

    #[test]
    fn each_turn_of_a_conversation_resends_the_previous_prompt_and_its_answer() {
        let w = shipped("multi-turn");
        let reqs = requests(&w, 2000);
        assert!(reqs.iter().all(|p| p.prefix.is_some_and(|(_, n)| n == p.input_tokens)), "one stream each");
        let mut by_seed: std::collections::HashMap<u64, Vec<&Planned>> = Default::default();
        for p in &reqs {
            by_seed.entry(p.prefix.unwrap().0).or_default().push(p);
        }
        let conversations = by_seed.len();
        assert!(
            (2000 / 8..=2000 / 8 + 80).contains(&conversations),
            "a new one every 8 turns: {conversations}"
        );
        let long = by_seed.values().find(|turns| turns.len() == 8).expect("a whole conversation");
        for t in long.windows(2) {
            // The next prompt is the previous one, its 150-token answer and a new message.
            let (a, b) = (t[0].prompt(7), t[1].prompt(7));
            assert!(b.starts_with(&a), "turn prompts extend each other");
            assert!(
                t[1].input_tokens >= t[0].input_tokens + 150 + 4,
                "{} then {}",
                t[0].input_tokens,
                t[1].input_tokens
            );
            assert_eq!(policies::tokens::count(&b), t[1].input_tokens);
        }
    }

    #[test]
    fn a_conversation_with_received_answers_names_each_turns_predecessor() {
        let mut w = shipped("multi-turn");
        let mut c = w.conversation.unwrap();
        c.answers = crate::workload::Answers::Received;
        w.conversation = Some(c);
        let reqs = requests(&w, 2000);
        let mut by_seed: std::collections::HashMap<u64, Vec<&Planned>> = Default::default();
        for p in &reqs {
            by_seed.entry(p.prefix.unwrap().0).or_default().push(p);
        }
        let long = by_seed.values().find(|turns| turns.len() == 8).expect("a whole conversation");
        assert_eq!(long[0].after, None, "a first turn follows nothing");
        for t in long.windows(2) {
            let (prev, own) = t[1].after.expect("a later turn follows its predecessor");
            assert_eq!(prev, t[0].id);
            // Planned as the previous prompt, an answer of its max_tokens
            // and the new message.
            assert_eq!(t[1].input_tokens, t[0].input_tokens + t[0].max_tokens + own);
            assert_eq!(policies::tokens::count(&t[1].message(7)), own);
        }
    }

    #[test]
    fn poisson_has_the_mean_rate_and_exponential_gaps() {
        let times = spec(500.0, 100.0, Process::Poisson, None).times(&mut SplitMix(1));
        let n = times.len() as f64;
        assert!((n - 50_000.0).abs() < 3.0 * 50_000f64.sqrt(), "{n} arrivals");
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // Exponential: standard deviation equals the mean.
        assert!((var.sqrt() / mean - 1.0).abs() < 0.03, "cv {}", var.sqrt() / mean);
        assert!(times.windows(2).all(|w| w[0] <= w[1]) && times.iter().all(|&t| (0.0..100.0).contains(&t)));
    }

    #[test]
    fn constant_arrivals_are_evenly_spaced() {
        let times = spec(1000.0, 2.0, Process::Constant, None).times(&mut SplitMix(1));
        assert_eq!(times.len(), 1999);
        assert!(times.windows(2).all(|w| ((w[1] - w[0]) - 0.001).abs() < 1e-7));
    }

    #[test]
    fn bursts_follow_their_shape() {
        let b = Burst { factor: 4.0, at_s: 10.0, ramp_s: 5.0, hold_s: 10.0 };
        for (t, m) in [(5.0, 1.0), (12.5, 2.5), (15.0, 4.0), (20.0, 4.0), (27.5, 2.5), (31.0, 1.0)] {
            assert!((b.multiplier(t) - m).abs() < 1e-12, "t {t}");
        }
        // The closed-form integral agrees with a numeric one.
        let numeric: f64 =
            (0..40_000).map(|i| b.multiplier((f64::from(i) + 0.5) * 0.001)).sum::<f64>() * 0.001;
        assert!((b.integral(40.0) - numeric).abs() < 1e-6);
        // Counts per phase match the shape: base 200/s for 40 s plus the burst's extra area.
        let s = spec(200.0, 40.0, Process::Poisson, Some(b));
        let times = s.times(&mut SplitMix(9));
        let count = |a: f64, z: f64| times.iter().filter(|&&t| t >= a && t < z).count() as f64;
        let within = |got: f64, want: f64| (got - want).abs() < 4.0 * want.sqrt();
        assert!(within(count(0.0, 10.0), 2000.0), "before {}", count(0.0, 10.0));
        assert!(within(count(15.0, 25.0), 8000.0), "hold {}", count(15.0, 25.0));
        assert!(within(count(10.0, 15.0), 200.0 * 5.0 * 2.5), "ramp {}", count(10.0, 15.0));
        assert!(within(count(30.0, 40.0), 2000.0), "after {}", count(30.0, 40.0));
    }

    #[test]
    fn azure_trace_rows_replay_at_their_offsets() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                   2023-11-16 18:15:46.6805900,374,44\n\
                   2023-11-16 18:15:50.9951690,396,109\n\
                   2023-11-16 18:16:01.0000000,879,7\n";
        let rows = parse_trace(csv).unwrap();
        assert_eq!(rows.len(), 3);
        assert!((rows[1].at_s - 4.314579).abs() < 1e-6 && (rows[2].at_s - 14.31941).abs() < 1e-6);
        assert_eq!((rows[0].input_tokens, rows[0].output_tokens), (374, 44));
        // Across midnight and a month boundary, and plain seconds.
        let rows = parse_trace("2024-02-29 23:59:59.5,1,1\n2024-03-01 00:00:00.5,2,2\n").unwrap();
        assert!((rows[1].at_s - 1.0).abs() < 1e-9);
        assert_eq!(parse_trace("0.5,1,2\n0.25,3,4\n").unwrap()[0].input_tokens, 3);
        let err = parse_trace("TIMESTAMP,a,b\n2023-11-16 xx,1,2\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn plans_are_deterministic_in_the_seed_and_respect_caps() {
        let w = crate::workload::Workload::load(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/chat.toml"))
            .unwrap();
        let s = Schedule::Rate(spec(50.0, 20.0, Process::Poisson, None));
        let (a, b, c) = (plan(&w, &s, 7), plan(&w, &s, 7), plan(&w, &s, 8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|p| p.max_tokens <= w.output_cap[&w.mix[p.mix].tier]));
        let bronze = a.iter().filter(|p| w.mix[p.mix].tier == "bronze").count() as f64 / a.len() as f64;
        assert!((bronze - 0.5).abs() < 0.06, "bronze share {bronze}");
        let rows = parse_trace("0,10,2000\n1.0,20,30\n3.0,5,5\n").unwrap();
        let t = plan(&w, &Schedule::Trace { rows, speed: 2.0, duration_s: 1.4 }, 1);
        assert_eq!(t.iter().map(|p| p.at_s).collect::<Vec<_>>(), vec![0.0, 0.5]);
        assert_eq!(t[1].input_tokens, 20);
    }
}
