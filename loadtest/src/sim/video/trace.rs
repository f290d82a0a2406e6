//! Session traces with the statistics of TurboServe's production traces
//! (Appendix B, Tables 11 and 12): per span, how many sessions arrive, how
//! many depart, and how many are active on average; between arrival and
//! departure every session alternates active and idle periods.
//!
//! Generation (seeded): each span's arrivals come in bursts (geometric
//! sizes of mean `burst`, members within 1 s of each other) at uniform
//! times; each span's departures pick uniformly among the sessions present
//! at a uniform time; a present session is active with the probability
//! that makes the span's mean active count match the table (present
//! sessions times that share), in on-periods of exponential length (mean
//! 20 s). All counts scale by `scale` (the cluster's size).

use policies::rng::SplitMix;

/// One trace of the tables.
#[derive(Debug, Clone)]
pub struct TraceSpec {
    pub name: String,
    pub span_s: f64,
    pub arrivals: Vec<u32>,
    pub departures: Vec<u32>,
    pub avg_active: Vec<f64>,
}

/// A row of the tables: (name, span seconds, arrivals, departures, mean active).
type Row = (&'static str, f64, &'static [u32], &'static [u32], &'static [f64]);

/// Table 11 (10 min, 2-min spans) and Table 12's T1-T6 (5 min, 1-min spans).
const TRACES: &[Row] = &[
    ("table11", 120.0, &[31, 47, 30, 48, 44], &[17, 24, 26, 39, 49], &[10.36, 20.91, 19.30, 29.62, 33.49]),
    ("t1", 60.0, &[122, 130, 66, 22, 18], &[44, 86, 88, 64, 38], &[28.0, 56.2, 57.4, 37.4, 23.2]),
    ("t2", 60.0, &[218, 214, 248, 192, 204], &[60, 124, 204, 196, 204], &[61.0, 118.6, 147.6, 154.2, 149.4]),
    ("t3", 60.0, &[74, 148, 156, 264, 156], &[10, 64, 126, 148, 214], &[13.2, 49.4, 112.8, 121.4, 148.4]),
    ("t4", 60.0, &[500, 428, 308, 88, 80], &[158, 266, 388, 236, 152], &[118.4, 219.2, 268.0, 162.8, 101.8]),
    (
        "t5",
        60.0,
        &[874, 862, 998, 762, 814],
        &[238, 504, 810, 784, 814],
        &[245.8, 475.2, 589.2, 616.8, 598.4],
    ),
    ("t6", 60.0, &[296, 590, 626, 1062, 618], &[36, 260, 502, 608, 846], &[54.4, 198.4, 451.4, 487.2, 592.0]),
];

/// The names `spec` knows.
pub fn names() -> Vec<&'static str> {
    TRACES.iter().map(|t| t.0).collect()
}

pub fn spec(name: &str) -> Option<TraceSpec> {
    TRACES.iter().find(|t| t.0.eq_ignore_ascii_case(name)).map(|&(name, span_s, a, d, v)| TraceSpec {
        name: name.to_string(),
        span_s,
        arrivals: a.to_vec(),
        departures: d.to_vec(),
        avg_active: v.to_vec(),
    })
}

impl TraceSpec {
    pub fn duration_s(&self) -> f64 {
        self.span_s * self.arrivals.len() as f64
    }

    /// The highest span-mean active count.
    pub fn peak_active(&self) -> f64 {
        self.avg_active.iter().copied().fold(0.0, f64::max)
    }
}

/// What happens to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Arrive,
    Idle,
    Resume,
    Depart,
}

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub at: f64,
    pub session: usize,
    pub kind: Kind,
}

/// A generated trace: events in time order.
#[derive(Debug, Clone)]
pub struct Trace {
    pub sessions: usize,
    pub events: Vec<Event>,
    pub duration_s: f64,
}

/// Mean length of an active period, seconds.
const ON_MEAN_S: f64 = 20.0;

/// Generates `spec` with every count times `scale`; `burst`: mean arrivals
/// per burst.
pub fn generate(spec: &TraceSpec, scale: f64, burst: f64, seed: u64) -> Trace {
    let mut rng = SplitMix(seed ^ 0x7ace);
    let spans = spec.arrivals.len();
    // Arrival and departure instants.
    let mut arrivals = Vec::new();
    let mut departures = Vec::new();
    for s in 0..spans {
        let t0 = s as f64 * spec.span_s;
        let mut left = (f64::from(spec.arrivals[s]) * scale).round() as u32;
        while left > 0 {
            let size = geometric(&mut rng, burst).min(left);
            let at = t0 + rng.unit_f64() * spec.span_s;
            for _ in 0..size {
                arrivals.push((at + rng.unit_f64()).min(t0 + spec.span_s - 1e-6));
            }
            left -= size;
        }
        for _ in 0..(f64::from(spec.departures[s]) * scale).round() as u32 {
            departures.push(t0 + rng.unit_f64() * spec.span_s);
        }
    }
    arrivals.sort_by(f64::total_cmp);
    departures.sort_by(f64::total_cmp);
    // Who departs: uniform among those present.
    let mut leave = vec![f64::INFINITY; arrivals.len()];
    let mut present: Vec<usize> = Vec::new();
    let (mut a, mut d) = (0, 0);
    while d < departures.len() {
        if a < arrivals.len() && arrivals[a] <= departures[d] {
            present.push(a);
            a += 1;
        } else {
            if !present.is_empty() {
                let i = (rng.next_u64() % present.len() as u64) as usize;
                leave[present.swap_remove(i)] = departures[d];
            }
            d += 1;
        }
    }
    // The active share per span: table mean active / sessions present.
    let end = spec.duration_s();
    let present_mean: Vec<f64> = (0..spans)
        .map(|s| {
            let (t0, t1) = (s as f64 * spec.span_s, (s + 1) as f64 * spec.span_s);
            let overlap: f64 = arrivals
                .iter()
                .zip(&leave)
                .map(|(&from, &to)| (to.min(end).min(t1) - from.max(t0)).max(0.0))
                .sum();
            overlap / spec.span_s
        })
        .collect();
    let share: Vec<f64> = (0..spans)
        .map(|s| (spec.avg_active[s] * scale / present_mean[s].max(1e-9)).clamp(0.05, 1.0))
        .collect();
    let mut events = Vec::new();
    for (i, (&from, &to)) in arrivals.iter().zip(&leave).enumerate() {
        let to = to.min(end);
        events.push(Event { at: from, session: i, kind: Kind::Arrive });
        // On/off periods: on ~ Exp(ON_MEAN_S), off so that on / (on + off)
        // is the span's share.
        let mut t = from;
        let mut active = true;
        loop {
            let span = ((t / spec.span_s) as usize).min(spans - 1);
            let p = share[span];
            if p >= 1.0 {
                break; // always active
            }
            let mean = if active { ON_MEAN_S } else { ON_MEAN_S * (1.0 - p) / p };
            t += rng.exponential(1.0 / mean.max(0.5));
            if t >= to {
                break;
            }
            active = !active;
            let kind = if active { Kind::Resume } else { Kind::Idle };
            events.push(Event { at: t, session: i, kind });
        }
        if to < end {
            events.push(Event { at: to, session: i, kind: Kind::Depart });
        }
    }
    events.sort_by(|a, b| a.at.total_cmp(&b.at).then(a.kind.cmp(&b.kind)).then(a.session.cmp(&b.session)));
    Trace { sessions: arrivals.len(), events, duration_s: end }
}

fn geometric(rng: &mut SplitMix, mean: f64) -> u32 {
    if mean <= 1.0 {
        return 1;
    }
    let p = 1.0 / mean;
    let u = rng.open_unit_f64();
    ((u.ln() / (1.0 - p).ln()).floor() as u32).saturating_add(1)
}

/// Per span of `spec`: arrivals, departures and mean active sessions of a
/// generated trace (to set beside the table's).
pub fn measure(trace: &Trace, span_s: f64) -> Vec<(u32, u32, f64)> {
    let spans = (trace.duration_s / span_s).round() as usize;
    let mut out = vec![(0u32, 0u32, 0.0f64); spans];
    let mut active = 0i64;
    let mut last = 0.0;
    let mut on = vec![false; trace.sessions];
    let add = |out: &mut Vec<(u32, u32, f64)>, from: f64, to: f64, n: i64| {
        for (s, o) in out.iter_mut().enumerate() {
            let (t0, t1) = (s as f64 * span_s, (s + 1) as f64 * span_s);
            o.2 += (to.min(t1) - from.max(t0)).max(0.0) * n as f64 / span_s;
        }
    };
    for e in &trace.events {
        add(&mut out, last, e.at, active);
        last = e.at;
        let span = ((e.at / span_s) as usize).min(spans - 1);
        match e.kind {
            Kind::Arrive => {
                out[span].0 += 1;
                on[e.session] = true;
                active += 1;
            }
            Kind::Resume => {
                on[e.session] = true;
                active += 1;
            }
            Kind::Idle | Kind::Depart => {
                if e.kind == Kind::Depart {
                    out[span].1 += 1;
                }
                if std::mem::take(&mut on[e.session]) {
                    active -= 1;
                }
            }
        }
    }
    add(&mut out, last, trace.duration_s, active);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_trace_has_the_tables_counts_and_about_its_active_sessions() {
        let spec = spec("t1").unwrap();
        let trace = generate(&spec, 1.0, 3.0, 1);
        let got = measure(&trace, spec.span_s);
        for (s, (arr, dep, active)) in got.iter().enumerate() {
            assert_eq!(*arr, spec.arrivals[s], "span {s}");
            assert!(dep.abs_diff(spec.departures[s]) <= 2, "span {s}: {dep}");
            let want = spec.avg_active[s];
            assert!((active - want).abs() <= 0.3 * want + 3.0, "span {s}: {active:.1} active, table {want}");
        }
        // Events are ordered and every session arrives before anything else.
        assert!(trace.events.windows(2).all(|w| w[0].at <= w[1].at));
        let mut seen = vec![false; trace.sessions];
        for e in &trace.events {
            assert_eq!(e.kind == Kind::Arrive, !seen[e.session]);
            seen[e.session] = true;
        }
    }
}
