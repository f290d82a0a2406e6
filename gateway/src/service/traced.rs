//! The request path's steps that are also spans of the request's trace
//! (`crate::trace`): admission's decision and the wait at the gate, for
//! completions and embeddings alike, and the request's GenAI attributes.
//! With tracing off they are the plain steps.

use std::future::Future;

use policies::{PolicyDocument, Tenant, Tier};
use telemetry::{KeyValue, SpanKind};

use super::Failed;
use crate::admission::{AdmitRequest, Admitted, Refused, Verdict};
use crate::openai::Kind;
use crate::trace::RequestTrace;
use crate::App;

/// Admission's decision, as the `admission` span.
pub(super) fn admit(
    app: &App,
    policy: &PolicyDocument,
    ask: &AdmitRequest<'_>,
    trace: &RequestTrace,
) -> Result<Admitted, Box<Refused>> {
    let span = trace.child("admission", SpanKind::Internal, Vec::new);
    let admitted = app.admission.admit(policy, ask);
    span.set(|| verdict_attributes(admitted.as_ref().map_or_else(|r| &r.verdict, |a| &a.verdict)));
    admitted
}

/// The wait at the gate for an engine slot (`super::engine_slot`), as the
/// `queue` span.
pub(super) async fn gate<T>(
    trace: &RequestTrace,
    wait: impl Future<Output = Result<T, Failed>>,
) -> Result<T, Failed> {
    let span = trace.child("queue", SpanKind::Internal, Vec::new);
    let slot = wait.await;
    if let Err(e) = &slot {
        span.fail(e.error.code());
    }
    slot
}

/// The request's GenAI attributes, on its server span.
pub(super) fn describe(
    trace: &RequestTrace,
    kind: Kind,
    model: &str,
    (max_tokens, stream): (u32, bool),
    (tenant, tier): (&Tenant, &Tier),
) {
    trace.set(|| {
        let operation = if kind == Kind::Chat { "chat" } else { "text_completion" };
        vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.request.model", model.to_string()),
            KeyValue::new("gen_ai.request.max_tokens", i64::from(max_tokens)),
            KeyValue::new("gen_ai.request.stream", stream),
            KeyValue::new("slo.tenant", tenant.name.clone()),
            KeyValue::new("slo.tier", tier.name.clone()),
        ]
    });
}

/// The admission decision as span attributes.
fn verdict_attributes(v: &Verdict) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new("slo.admission.decision", v.decision.as_str()),
        KeyValue::new("slo.admission.reason", v.reason.clone()),
        KeyValue::new("slo.brownout_level", v.brownout_level as i64),
    ];
    if let Some(ms) = v.predicted_ttft_ms {
        attrs.push(KeyValue::new("slo.predicted_ttft_ms", ms));
    }
    if let Some(ms) = v.predicted_e2e_ms {
        attrs.push(KeyValue::new("slo.predicted_e2e_ms", ms));
    }
    attrs
}
