//! The simulated supervisor: the autoscaler's tick, moving the fleet toward
//! its decision (warm engines promoted first, cold starts, drains that end
//! in the warm pool or a stop), and billing every engine's life.

use super::*;

impl Sim<'_> {
    /// The end of billing: the run's schedule, or later if work ran on.
    pub(super) fn fleet_end(&self) -> f64 {
        let last = self
            .records
            .iter()
            .filter_map(|r| r.done_ms.map(|d| (r.scheduled_at_ms + d) / 1e3))
            .fold(0.0, f64::max);
        last.max(self.end_s)
    }

    /// Every engine-second from start to stop, up to `end`.
    pub(super) fn bill(&mut self, end: f64) {
        for s in &mut self.slots {
            if s.state != State::Stopped {
                self.lives.push((s.started_at, end));
                s.state = State::Stopped;
            }
        }
        self.fleet.gpu_seconds = self.lives.iter().map(|&(a, b)| (b.min(end) - a.min(end)).max(0.0)).sum();
    }

    /// Engine `i` stops now.
    pub(super) fn stop(&mut self, i: usize, now: f64) {
        self.slots[i].state = State::Stopped;
        self.lives.push((self.slots[i].started_at, now));
    }

    /// A draining engine with nothing left stops (or joins the warm pool).
    pub(super) fn settle(&mut self, engine: usize, now: f64) {
        let s = &mut self.slots[engine];
        if let State::Draining { to_warm } = s.state {
            if s.active == 0 && s.engine.is_empty() {
                if to_warm {
                    s.state = State::Warm;
                    s.engine.draining = false;
                } else {
                    self.stop(engine, now);
                }
            }
        }
    }

    pub(super) fn count(&self, f: impl Fn(&State) -> bool) -> u32 {
        self.slots.iter().filter(|s| f(&s.state)).count() as u32
    }

    /// One autoscaler tick and the supervisor's reconciliation; samples
    /// the fleet for the report.
    pub(super) fn scale(&mut self, now: f64) {
        let serving = self.count(|s| *s == State::Serving);
        if self.plan.autoscale {
            let demand =
                self.slots.iter().map(|s| f64::from(s.active)).sum::<f64>() + self.ctl.waiting() as f64;
            let tokens: u64 =
                self.slots.iter().filter(|s| s.state == State::Serving).map(|s| s.engine.kv_used()).sum();
            let signals = Signals {
                tokens_in_flight: tokens as f64,
                kv_tokens_per_engine: self.cfg.kv_tokens as f64,
                serving,
                slots_per_engine: self.cfg.limits.max_batch,
                demand,
                queue_ratio_p95: self.ctl.queue_ratio_p95(now, self.policy),
                brownout_level: self.ctl.brownout_level(),
                arrivals: self.arrivals,
                cold_start_s: Some(self.plan.cold_start_s),
            };
            let d = self.scaler.tick(now, &signals, &self.policy.autoscale);
            if d.why != policies::autoscale::Why::Hold {
                self.fleet.decisions.push(ScaleEvent {
                    at_s: now,
                    serving: d.serving,
                    warm: d.warm,
                    why: d.why.label().into(),
                });
            }
            self.reconcile(now, d.serving, d.warm);
            self.fleet.desired.push(f64::from(d.serving));
            self.fleet.volatility.push(d.volatility);
        } else {
            self.fleet.desired.push(f64::from(self.plan.engines));
        }
        self.fleet.brownout.push(self.ctl.brownout_level() as f64);
        let starting = self.count(|s| matches!(s, State::Starting { .. }));
        self.fleet.serving.push(f64::from(self.count(|s| *s == State::Serving)));
        self.fleet.warm.push(f64::from(self.count(|s| *s == State::Warm)));
        self.fleet.starting.push(f64::from(starting));
        self.fleet.draining.push(f64::from(self.count(|s| matches!(s, State::Draining { .. }))));
    }

    /// Moves the fleet toward `serving` + `warm` engines.
    pub(super) fn reconcile(&mut self, now: f64, serving: u32, warm: u32) {
        let max = self.policy.autoscale.max_engines;
        let mut have = self.count(|s| *s == State::Serving)
            + self.count(|s| matches!(s, State::Starting { to_warm: false, .. }));
        // Scale out: warm engines first (instant), then cold starts.
        while have < serving {
            if let Some(i) = self.slots.iter().position(|s| s.state == State::Warm) {
                self.slots[i].state = State::Serving;
            } else if let Some(i) =
                self.slots.iter().position(|s| matches!(s.state, State::Starting { to_warm: true, .. }))
            {
                if let State::Starting { ready_at, .. } = self.slots[i].state {
                    self.slots[i].state = State::Starting { ready_at, to_warm: false };
                }
            } else if let Some(i) = self.slots.iter().position(|s| matches!(s.state, State::Draining { .. }))
            {
                // Take back an engine that was leaving.
                self.slots[i].state = State::Serving;
                self.slots[i].engine.draining = false;
            } else if self.alive() < max {
                self.start(now, false);
            } else {
                break;
            }
            have += 1;
        }
        // Scale in: drain the least loaded serving engines.
        while have > serving {
            let Some(i) = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state == State::Serving)
                .min_by_key(|(_, s)| s.active)
                .map(|(i, _)| i)
            else {
                break;
            };
            let pool =
                self.count(|s| *s == State::Warm || matches!(s, State::Starting { to_warm: true, .. }));
            self.slots[i].state = State::Draining { to_warm: pool < warm };
            self.slots[i].engine.draining = true;
            self.settle(i, now);
            have -= 1;
        }
        // The warm pool.
        let mut pool = self.count(|s| {
            *s == State::Warm
                || matches!(s, State::Starting { to_warm: true, .. } | State::Draining { to_warm: true })
        });
        while pool < warm && self.alive() < max {
            self.start(now, true);
            pool += 1;
        }
        while pool > warm {
            match self.slots.iter().position(|s| s.state == State::Warm) {
                Some(i) => self.stop(i, now),
                None => break,
            }
            pool -= 1;
        }
    }

    pub(super) fn alive(&self) -> u32 {
        self.count(|s| *s != State::Stopped)
    }

    pub(super) fn start(&mut self, now: f64, to_warm: bool) {
        let ready_at = now + self.plan.cold_start_s;
        let slot = Slot::new(self.cfg, State::Starting { ready_at, to_warm }, now);
        let i = match self.slots.iter().position(|s| s.state == State::Stopped) {
            Some(i) => {
                // A new engine in a stopped one's place: its cache is empty.
                let old = std::mem::replace(&mut self.slots[i], slot);
                self.fleet.prefix_lookup_tokens += old.engine.lookup_tokens();
                self.fleet.prefix_hit_tokens += old.engine.hit_tokens();
                if let Ok(e) = u16::try_from(i) {
                    self.index.forget_engine(e);
                }
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.fleet.cold_starts += 1;
        self.push(ready_at, Ev::Ready(i));
    }

    pub(super) fn ready(&mut self, _now: f64, e: usize) {
        if let State::Starting { to_warm, .. } = self.slots[e].state {
            self.slots[e].state = if to_warm { State::Warm } else { State::Serving };
            self.pump(_now);
        }
    }
}
