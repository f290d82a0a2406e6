//! What one admitted request holds, in one value released on drop: the
//! tenant's hold (its concurrency, in this process or in Redis), the
//! admission ticket (the controller's open count and what learning needs),
//! and the request's metrics observer (the in-flight gauge). The relay
//! keeps it beside the engine stream and drops both when the engine ends,
//! not when the client has read (issue 18). The engine lease stays with
//! the engine stream it counts (`dispatch::Started`): a retry moves it to
//! another engine.

use std::sync::Arc;

use engine_api::Usage;
use policies::PolicyDocument;

use crate::admission::Ticket;
use crate::cluster::Hold;
use crate::metrics::RequestObserver;

/// One admitted request's permit.
#[derive(Debug)]
pub struct Permit {
    // Fields drop in order: the ticket (admission's count), the tenant
    // hold, then the observer (the in-flight gauge last).
    ticket: Ticket,
    policy: Arc<PolicyDocument>,
    predicted_ttft_ms: Option<f64>,
    _hold: Hold,
    observer: RequestObserver,
    /// The usage it counts when it ends (generations).
    meter: Option<crate::usage::Meter>,
}

impl Permit {
    pub fn new(
        observer: RequestObserver,
        hold: Hold,
        ticket: Ticket,
        policy: Arc<PolicyDocument>,
        predicted_ttft_ms: Option<f64>,
    ) -> Self {
        Self { ticket, policy, predicted_ttft_ms, _hold: hold, observer, meter: None }
    }

    /// Counts the request's usage when it ends (what the client saw).
    pub fn metered(mut self, meter: crate::usage::Meter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// The first token reached the client's stream: TTFT, its prediction
    /// ratio, and the ticket's learning (once).
    pub fn first_token(&mut self) {
        let Some(ttft) = self.observer.first_token() else { return };
        self.ticket.first_token(&self.policy, ttft);
        if let Some(p) = self.predicted_ttft_ms.filter(|p| *p > 0.0) {
            self.observer.tier().ttft_prediction().record(ttft.as_secs_f64() * 1e3 / p);
        }
    }

    /// Another token was relayed (time between tokens).
    pub fn token(&mut self) {
        self.observer.token();
        if let Some(m) = &mut self.meter {
            m.token();
        }
    }

    /// The generation ended normally on engine `engine`.
    pub fn finished(&mut self, engine: usize, usage: Usage, prefill_ms: f64) {
        self.observer.finished(usage);
        if let Some(m) = &mut self.meter {
            m.finished(&self.policy, usage);
        }
        let tokens = (usage.completion_tokens, usage.cached_tokens);
        self.ticket.finished(&self.policy, engine, tokens, prefill_ms);
    }
}

impl Drop for Permit {
    /// A response that ends without finishing counts what its client saw.
    fn drop(&mut self) {
        if let Some(m) = &mut self.meter {
            m.ended(&self.policy);
        }
    }
}
