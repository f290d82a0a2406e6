//! The permit of an admitted request: its hold on the tenant's
//! concurrency (released on drop, when the response stream ends) and its
//! hooks into learning (TTFT for brownout, output length and timings for
//! the estimator), forwarded to the controller as events.

use std::sync::Arc;
use std::time::Duration;

use policies::admission::controller::Nominal;
use policies::PolicyDocument;

use super::{ms, Admission};

/// An admitted request's hold on its tenant's concurrency and its hooks
/// into learning; released on drop (the response stream ended).
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    tenant: String,
    tier: String,
    model: String,
    prompt_tokens: u32,
    ttft_budget_ms: f64,
    nominal: Option<Nominal>,
    first_at: Option<f64>,
}

impl Ticket {
    pub(super) fn new(
        a: &Arc<Admission>,
        tenant: &str,
        tier: &str,
        model: &str,
        prompt_tokens: u32,
        ttft_budget_ms: f64,
        nominal: Option<Nominal>,
    ) -> Self {
        Self {
            admission: Arc::clone(a),
            tenant: tenant.to_string(),
            tier: tier.to_string(),
            model: model.to_string(),
            prompt_tokens,
            ttft_budget_ms,
            nominal,
            first_at: None,
        }
    }

    /// The first token reached the gateway `ttft` after arrival: brownout's
    /// evidence, and the TTFT calibration's when admission predicted it.
    pub fn first_token(&mut self, policy: &PolicyDocument, ttft: Duration) {
        let now = self.admission.now();
        self.first_at = Some(now);
        self.admission.lock().ctl.first_token(
            now,
            policy,
            &self.tier,
            ms(ttft),
            self.ttft_budget_ms,
            self.nominal,
        );
    }

    /// The request finished on engine `engine`: learn its output length and
    /// its prefill and decode times.
    pub fn finished(
        &mut self,
        policy: &PolicyDocument,
        engine: usize,
        (completion_tokens, cached_tokens): (u32, u32),
        prefill_ms: f64,
    ) {
        let now = self.admission.now();
        let slot = self.admission.pool.slot(engine);
        let batch = slot.report().map_or(1.0, |r| r.batch_achieved.max(1.0));
        let profile = slot.profile();
        let mut st = self.admission.lock();
        let class = profile.map(|p| st.ctl.class_of(&p));
        let decode_ms = self.first_at.map(|first| (now - first) * 1e3);
        st.ctl.finished(
            policy,
            &self.tenant,
            &self.model,
            class,
            (self.prompt_tokens, cached_tokens),
            completion_tokens,
            prefill_ms,
            decode_ms,
            batch,
        );
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().ctl.release(&self.tenant);
    }
}
