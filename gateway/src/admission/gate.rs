//! The gate loop: hands free engine slots to requests waiting at the gate
//! (late binding, in deficit round-robin order per class; the decisions are
//! [`policies::admission::Controller::pump`]'s) and steps brownout, under
//! the active policy version.

use std::sync::Arc;
use std::time::Duration;

use policies::PolicyDocument;
use tokio::sync::watch;

use super::Admission;
use crate::metrics as m;

impl Admission {
    /// Hands free engine slots to waiters; re-checks each waiter's TTFT
    /// prediction when its turn comes.
    pub fn pump(&self, policy: &PolicyDocument) {
        let now = self.now();
        let mut st = self.lock();
        if st.ctl.waiting() == 0 {
            self.pool.gate_waiting.store(false, std::sync::atomic::Ordering::Release);
            return;
        }
        let st = &mut *st;
        // Every engine: a waiter granted one that does not serve its model
        // is moved by dispatch before anything is sent.
        self.candidates(&mut st.ctl, policy, &mut st.candidates, None, None);
        let waiters = &mut st.waiters;
        let alive = |id| match waiters.get(&id) {
            Some((tx, _, _)) if !tx.is_closed() => true,
            _ => {
                waiters.remove(&id); // its caller went away
                false
            }
        };
        let grants = st.ctl.pump(now, policy, &st.candidates, alive);
        self.deliver(st, grants);
    }

    /// Runs the gate and brownout under the active policy version: wakes
    /// on freed slots, every tick, and when a reload swaps the version.
    pub async fn run(self: Arc<Self>, mut versions: watch::Receiver<Arc<PolicyDocument>>) {
        const TICK: Duration = Duration::from_millis(250);
        let mut next_tick = tokio::time::Instant::now() + TICK;
        let mut policy = versions.borrow_and_update().clone();
        loop {
            tokio::select! {
                () = self.pool.slot_freed.notified() => {}
                () = tokio::time::sleep_until(next_tick) => {
                    next_tick += TICK;
                    self.tick(&policy);
                }
                changed = versions.changed() => {
                    if changed.is_err() {
                        return; // the store is gone: the gateway is stopping
                    }
                    policy = versions.borrow_and_update().clone();
                    self.lock().ctl.reconfigure(&policy);
                }
            }
            self.pump(&policy);
        }
    }

    /// One brownout step, expired waiters refused, and the gauges.
    pub fn tick(&self, policy: &PolicyDocument) {
        let now = self.now();
        let mut st = self.lock();
        let st = &mut *st;
        st.waiters.retain(|_, (tx, _, _)| !tx.is_closed());
        let waiters = &st.waiters;
        st.ctl.purge(|id| waiters.contains_key(&id));
        let (report, expired) = st.ctl.tick(now, policy);
        self.deliver(st, expired);
        if report.changed {
            tracing::warn!(
                event = "brownout_level",
                level = report.level,
                signal = report.signal.unwrap_or(0.0)
            );
        }
        ::metrics::gauge!(m::BROWNOUT_LEVEL).set(report.level as f64);
        ::metrics::gauge!(m::BROWNOUT_SIGNAL).set(report.signal.unwrap_or(0.0));
        ::metrics::gauge!(m::QUEUE_WAITING).set(report.waiting as f64);
    }
}
