//! The engine side of a request in the simulated fleet: its dispatch to a
//! simulated engine, the engine's wake-ups, first tokens and finishes, the
//! first-token timeout (the gateway's first-event timeout), and the gate's
//! pump that hands freed slots to waiting requests.

use super::*;

impl Sim<'_> {
    /// The request of tag `t` if `t` is its current attempt.
    pub(super) fn current(&self, t: usize) -> Option<usize> {
        let (r, attempt) = untag(t);
        (!self.live[r].done && self.live[r].tried.len() == attempt).then_some(r)
    }

    pub(super) fn dispatch(&mut self, now: f64, t: usize) {
        let Some(r) = self.current(t) else { return };
        let Some(engine) = self.live[r].engine else { return };
        let admit = self.live[r].admit.as_ref().expect("admitted");
        let out = admit.max_tokens.min(self.reqs[r].natural_len).max(1);
        // Its standing for priority preemption, as the gateway sends it.
        let priority = match self.policy.tier(&self.reqs[r].tier) {
            Some(tier) if self.policy.admission.preempt_lower_tiers => Some(policies::turn::Priority {
                class: tier.priority_weight.get(),
                max_pauses: self.policy.admission.max_pauses,
                e2e_budget_ms: admit.e2e_budget_ms.min(f64::from(u32::MAX)) as u32,
            }),
            _ => None,
        };
        let seq = SimSeq {
            req: t,
            prompt: self.reqs[r].prompt,
            out,
            max_tokens: admit.max_tokens,
            key: admit.key,
            enqueued_at: now,
            ttft_budget_ms: admit.ttft_budget_ms,
            priority,
            blocks: std::sync::Arc::clone(&self.reqs[r].blocks),
            answer: std::sync::Arc::clone(&self.reqs[r].answer),
        };
        let enqueued = self.slots[engine].engine.enqueue(now, seq);
        self.kv_events(engine);
        match enqueued {
            Ok(Some(at)) => {
                let gen = self.slots[engine].engine.gen;
                self.push(at, Ev::Wake { engine, gen });
            }
            Ok(None) => {}
            Err(_) => {
                self.unlease(r);
                self.fail(now, r, "engine_refused");
                self.pump(now);
            }
        }
    }

    pub(super) fn wake(&mut self, now: f64, engine: usize, gen: u64) {
        if self.slots[engine].engine.gen != gen {
            return;
        }
        let mut outs = std::mem::take(&mut self.outs);
        outs.clear();
        let next = self.slots[engine].engine.wake(now, &mut outs);
        self.kv_events(engine);
        if let Some(at) = next {
            self.slots[engine].engine.gen += 1;
            let gen = self.slots[engine].engine.gen;
            self.push(at, Ev::Wake { engine, gen });
        }
        let back = now + self.hops.engine_s;
        for &o in &outs {
            self.push(back, Ev::Engine(o));
        }
        self.outs = outs;
        self.settle(engine, now);
    }

    pub(super) fn first_token(&mut self, now: f64, t: usize) {
        let Some(r) = self.current(t) else { return };
        if self.live[r].first_at.is_some() {
            return;
        }
        self.live[r].first_at = Some(now);
        if let Some(e) = self.live[r].engine {
            let prompt = self.live[r].admit.as_ref().map_or(0, |a| a.work.prompt_tokens);
            self.slots[e].backlog -= prompt;
        }
        let rec = &mut self.records[r];
        rec.ttft_ms = Some((now + self.hops.client_s) * 1e3 - rec.scheduled_at_ms);
        let ttft_ms = (now - self.live[r].arrived) * 1e3;
        let budget = self.live[r].admit.as_ref().map_or(1.0, |a| a.ttft_budget_ms);
        let nominal = self.live[r].admit.as_ref().and_then(|a| a.nominal);
        let tier = &self.records[r].tier;
        self.ctl.first_token(now, self.policy, tier, ttft_ms, budget, nominal);
    }

    pub(super) fn finished(
        &mut self,
        now: f64,
        t: usize,
        tokens: u32,
        (prefill_ms, cached): (f64, u32),
        decode_ms: f64,
        batch: f64,
    ) {
        let Some(r) = self.current(t) else { return };
        let engine = self.live[r].engine;
        self.learn_answer(r, engine, tokens);
        self.unlease(r);
        let rec = &mut self.records[r];
        let end = (now + self.hops.client_s) * 1e3 - rec.scheduled_at_ms;
        rec.outcome = Done::Ok;
        rec.status = 200;
        rec.tlet_ms = Some(end);
        rec.done_ms = Some(end);
        rec.tokens_out = tokens;
        if let (Some(ttft), true) = (rec.ttft_ms, tokens > 1) {
            rec.tbt_ms = vec![(end - ttft) / f64::from(tokens - 1)];
        }
        self.output_tokens += u64::from(tokens);
        self.close(r);
        let tenant = std::mem::take(&mut self.live[r].tenant);
        let prompt = self.reqs[r].prompt;
        self.ctl.finished(
            self.policy,
            &tenant,
            "m",
            Some(self.class),
            (prompt, cached),
            tokens,
            prefill_ms,
            Some(decode_ms),
            batch,
        );
        self.ctl.release(&tenant);
        if let Some(e) = engine {
            self.settle(e, now);
        }
        self.pump(now);
    }

    /// The engine ended the attempt with an error event (`kv_exhausted`):
    /// the stream ends with it, as the gateway's relay ends it.
    pub(super) fn engine_error(&mut self, now: f64, t: usize, code: &str) {
        let Some(r) = self.current(t) else { return };
        let engine = self.live[r].engine;
        self.unlease(r);
        self.fail(now, r, code);
        if let Some(e) = engine {
            self.settle(e, now);
        }
        self.pump(now);
    }

    /// No first token within the budget: the attempt is cancelled at its
    /// engine and, while attempts remain, the request goes to the engine
    /// with the fewest in-flight tokens not tried yet (the gateway's
    /// dispatcher); else it fails.
    pub(super) fn first_timeout(&mut self, now: f64, t: usize) {
        let Some(r) = self.current(t) else { return };
        if self.live[r].first_at.is_some() {
            return;
        }
        let engine = self.live[r].engine;
        if let Some(e) = engine {
            if let Some(at) = self.slots[e].engine.cancel(now, t) {
                let gen = self.slots[e].engine.gen;
                self.push(at, Ev::Wake { engine: e, gen });
            }
        }
        self.unlease(r);
        if let Some(e) = engine {
            self.live[r].tried.push(e);
            self.settle(e, now);
        }
        let serving = self.count(|s| *s == State::Serving) as usize;
        let next = if self.live[r].tried.len() < MAX_ATTEMPTS.min(serving) {
            policies::routing::least_inflight_tokens(&self.views(), &self.live[r].tried)
        } else {
            None
        };
        match next {
            Some(e) => self.lease(now, r, e),
            None => {
                // Out of attempts: the gateway answers 502 `engine_failed`
                // (nothing was streamed yet).
                self.refuse_plain(now, r, 502, "engine_failed");
                let tenant = std::mem::take(&mut self.live[r].tenant);
                self.ctl.release(&tenant);
            }
        }
        self.pump(now);
    }

    pub(super) fn pump(&mut self, now: f64) {
        if self.ctl.waiting() == 0 {
            return;
        }
        let engines = self.candidates();
        let grants = self.ctl.pump(now, self.policy, &engines, |_| true);
        self.deliver(now, grants);
    }

    pub(super) fn deliver(&mut self, now: f64, grants: Vec<Grant>) {
        for g in grants {
            let Some(r) = self.waiters.remove(&g.id) else { continue };
            match g.result {
                Ok(engine) => self.lease(now, r, engine),
                Err(refusal) => {
                    self.refuse(now, r, &refusal);
                    let tenant = std::mem::take(&mut self.live[r].tenant);
                    self.ctl.release(&tenant);
                }
            }
        }
    }
}
