//! `--experiment oracles` (TurboServe §7.4): how far ours' autoscaling is
//! from two offline oracles, on the 120-s windows `levels` profiles (t1-t6,
//! every seed, starting at 60, 120 and 180 s, the run before each window
//! its unmeasured warm-up):
//!
//! - **ρ* oracle**: the window replayed at every ρ̂ of the grid, the
//!   cheapest run within L_SLO: the best single target utilisation in
//!   hindsight (the paper's gap: 0.73%).
//! - **Budget oracle**: the cheapest engine budget over time that gives
//!   every active session a place within K (need(t) = ⌈active / K⌉),
//!   engines asked for a cold start ahead and billed from the ask, an
//!   engine kept through an idle gap shorter than a cold start (a restart
//!   would cost more). Engines are identical, so the DP over budgets
//!   separates per engine slot and the per-slot choice (keep or restart)
//!   is exact; placement is taken as perfect and migration as free, so it
//!   is a lower bound no controller reaches (the paper's gap: 6.1%).

use policies::video::fleet::FleetConfig;
use serde::Serialize;

use super::super::trace::{Kind, Trace};
use super::super::with_rho;
use super::levels::{each_window, GRID, TRACES, WINDOW_S};
use super::{median, SimVideoArgs};

#[derive(Debug, Clone, Serialize)]
struct Priced {
    trace: String,
    seed: u64,
    from_s: f64,
    ours_cost: f64,
    ours_worst_ms: f64,
    /// The cheapest grid run within L_SLO: (ρ̂, cost); None: none was.
    rho_star: Option<(f64, f64)>,
    budget_cost: f64,
}

/// GPU-seconds of the budget oracle over `[from_s, to_s)` (module docs).
pub(super) fn budget_oracle_gpu_s(t: &Trace, k: u32, cold_s: f64, from_s: f64, to_s: f64) -> f64 {
    // need(t) as pieces (start, need) from the active count, events in order.
    let mut active = vec![false; t.sessions];
    let mut count = 0u32;
    let mut pieces: Vec<(f64, u32)> = vec![(from_s, 0)];
    for e in &t.events {
        let was = active[e.session];
        active[e.session] = matches!(e.kind, Kind::Arrive | Kind::Resume);
        match (was, active[e.session]) {
            (false, true) => count += 1,
            (true, false) => count -= 1,
            _ => continue,
        }
        let need = count.div_ceil(k.max(1));
        if e.at <= from_s {
            pieces[0].1 = need;
        } else if e.at < to_s {
            pieces.push((e.at, need));
        }
    }
    let most = pieces.iter().map(|p| p.1).max().unwrap_or(0);
    let mut gpu_s = 0.0;
    for slot in 1..=most {
        // Busy intervals of this slot, merged where adjacent.
        let mut busy: Vec<(f64, f64)> = Vec::new();
        for (i, &(start, need)) in pieces.iter().enumerate() {
            let end = pieces.get(i + 1).map_or(to_s, |p| p.0);
            if need < slot || end <= start {
                continue;
            }
            match busy.last_mut() {
                Some(last) if last.1 >= start => last.1 = end,
                _ => busy.push((start, end)),
            }
        }
        for (i, &(start, end)) in busy.iter().enumerate() {
            gpu_s += end - start;
            // Before it: nothing (up at the window's start), a cold start
            // (asked for ahead, billed in the window only), or the gap
            // since the previous interval when keeping is cheaper.
            gpu_s += match i.checked_sub(1).map(|p| busy[p].1) {
                None if start <= from_s => 0.0,
                None => cold_s.min(start - from_s),
                Some(prev_end) => cold_s.min(start - prev_end),
            };
        }
    }
    gpu_s
}

pub(super) fn oracles(args: &SimVideoArgs, fleet_cfg: &FleetConfig) -> (String, serde_json::Value) {
    let engines = args.engines.first().copied().unwrap_or(64);
    let mut cfg = fleet_cfg.clone();
    cfg.max_engines = engines;
    cfg.autoscale = true;
    let k = args.setup(cfg.clone()).capacity();
    let mut windows = Vec::new();
    each_window(args, engines, k, |w| {
        let ours = w.replay(&cfg);
        let rho_star = GRID
            .iter()
            .filter_map(|&rho| {
                let o = w.replay(&with_rho(&cfg, rho));
                (o.worst_ms <= args.slo_ms).then_some((rho, o.cost))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let budget_s = budget_oracle_gpu_s(&w.trace, k, args.cold_start_s, w.from_s, w.to_s);
        windows.push(Priced {
            trace: w.name.into(),
            seed: w.seed,
            from_s: w.from_s,
            ours_cost: ours.cost,
            ours_worst_ms: ours.worst_ms,
            rho_star,
            budget_cost: budget_s * args.gpu_hour / 3600.0,
        });
    });
    let mut md = format!(
        "Ours' cost against the oracles at {engines} engines (K = {k}), L_SLO = {} ms, cold start {} s, {} windows of {WINDOW_S} s:\n\n| trace | windows | ours within L_SLO | above the ρ* oracle (median / mean / total) | above the budget oracle (median / mean / total) |\n| --- | ---: | ---: | ---: | ---: |\n",
        args.slo_ms,
        args.cold_start_s,
        windows.len(),
    );
    for name in TRACES {
        let ws: Vec<&Priced> = windows.iter().filter(|w| w.trace == name).collect();
        md.push_str(&gap_row(name, &ws, args.slo_ms));
    }
    md.push_str(&gap_row("all", &windows.iter().collect::<Vec<_>>(), args.slo_ms));
    (md, serde_json::json!({"experiment": "oracles", "engines": engines, "windows": windows}))
}

/// One table row: how many windows, how many ours kept within L_SLO, and
/// ours' cost above each oracle (median, mean, and of the totals).
fn gap_row(label: &str, ws: &[&Priced], slo_ms: f64) -> String {
    let gap = |ours: f64, oracle: f64| (ours / oracle - 1.0) * 100.0;
    let within = ws.iter().filter(|w| w.ours_worst_ms <= slo_ms).count();
    let star: Vec<f64> = ws.iter().filter_map(|w| w.rho_star.map(|(_, c)| gap(w.ours_cost, c))).collect();
    let budget: Vec<f64> = ws.iter().map(|w| gap(w.ours_cost, w.budget_cost)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let total = |f: &dyn Fn(&Priced) -> f64| ws.iter().map(|w| f(w)).sum::<f64>();
    let star_total = gap(
        total(&|w| if w.rho_star.is_some() { w.ours_cost } else { 0.0 }),
        total(&|w| w.rho_star.map_or(0.0, |(_, c)| c)),
    );
    format!(
        "| {label} | {} | {within} | {:+.1}% / {:+.1}% / {star_total:+.1}% | {:+.1}% / {:+.1}% / {:+.1}% |\n",
        ws.len(),
        median(star.clone()),
        mean(&star),
        median(budget.clone()),
        mean(&budget),
        gap(total(&|w| w.ours_cost), total(&|w| w.budget_cost)),
    )
}

#[cfg(test)]
mod tests {
    use super::super::super::trace::Event;
    use super::*;

    fn ev(at: f64, session: usize, kind: Kind) -> Event {
        Event { at, session, kind }
    }

    /// Hand-made need(t): the slot's busy time, a cold start before an
    /// interval that starts inside the window, and a short gap kept.
    #[test]
    fn the_budget_oracle_keeps_short_gaps_and_pays_cold_starts_once() {
        // K = 2. Sessions 0, 1 active from 0; session 2 from 10 to 20
        // (a second engine), then again from 22 to 30 (gap 2 s < 5 s: kept);
        // session 0 idle from 40 on. Window [0, 50).
        let t = Trace {
            sessions: 3,
            events: vec![
                ev(0.0, 0, Kind::Arrive),
                ev(0.0, 1, Kind::Arrive),
                ev(10.0, 2, Kind::Arrive),
                ev(20.0, 2, Kind::Idle),
                ev(22.0, 2, Kind::Resume),
                ev(30.0, 2, Kind::Depart),
                ev(40.0, 0, Kind::Idle),
            ],
            duration_s: 50.0,
        };
        // Slot 1: busy 0-50 (one session still active), up at the start: 50.
        // Slot 2: 10-20 and 22-30 plus the 2 s gap and a 5 s cold start: 25.
        let g = budget_oracle_gpu_s(&t, 2, 5.0, 0.0, 50.0);
        assert!((g - 75.0).abs() < 1e-9, "{g}");
        // A 1 s cold start: the gap (2 s) costs more than a restart (1 s).
        let g = budget_oracle_gpu_s(&t, 2, 1.0, 0.0, 50.0);
        assert!((g - (50.0 + 18.0 + 1.0 + 1.0)).abs() < 1e-9, "{g}");
        // A window from 15: slot 2 is up at its start (15-20), then 22-30.
        let g = budget_oracle_gpu_s(&t, 2, 5.0, 15.0, 50.0);
        assert!((g - (35.0 + 5.0 + 2.0 + 8.0)).abs() < 1e-9, "{g}");
    }
}
