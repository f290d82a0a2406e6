//! `POST /v1/embeddings`, served by third-party engines (`kind = "openai"`)
//! whose `models` include the requested one: this project's engines compute
//! none. The request goes through the same tenant limits, admission (its
//! input is the prompt, one token of output), gate and retry rule as a
//! completion; the engine's answer is relayed as it wrote it, with the
//! public model name stamped in.

use std::sync::Arc;

use engine_api::GenerateRequest;
use http::{header, HeaderValue, Response};
use policies::{PolicyDocument, Tenant, Tier};
use serde_json::{Map, Value};

use super::{self as service, Failed, Ident};
use crate::admission::AdmitRequest;
use crate::body::GatewayBody;
use crate::dispatch::Outbound;
use crate::error::ApiError;
use crate::metrics::RequestObserver;
use crate::permit::Permit;
use crate::request::Req;
use crate::trace::RequestTrace;
use crate::upstream::{Stamp, UpstreamRoute};

/// Inputs in one request (OpenAI's own limit).
const MAX_INPUTS: usize = 2048;
const KNOWN: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// What the gateway needs of an embeddings request.
#[derive(Debug, PartialEq)]
pub(crate) struct EmbeddingsRequest {
    pub model: String,
    /// The inputs' size in the gateway's token count (admission's work).
    pub tokens: u32,
}

/// Validates an embeddings body: its keys, `model`, and `input` (a string,
/// strings, or token-id arrays).
pub(crate) fn parse(body: &[u8]) -> Result<EmbeddingsRequest, ApiError> {
    let field =
        |param: &str, message: &str| ApiError::InvalidField { param: param.into(), message: message.into() };
    let doc: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(ApiError::InvalidJson("the body must be a JSON object".into())),
        Err(e) => return Err(ApiError::InvalidJson(e.to_string())),
    };
    let mut unknown: Vec<String> = doc.keys().filter(|k| !KNOWN.contains(&k.as_str())).cloned().collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ApiError::UnknownParameters(unknown));
    }
    let model = match doc.get("model") {
        Some(Value::String(m)) if m.len() <= engine_api::bounds::MAX_ID_BYTES => m.clone(),
        Some(Value::String(_)) => return Err(field("model", "is too long")),
        _ => return Err(field("model", "you must provide a model parameter")),
    };
    let tokens = match doc.get("input") {
        Some(Value::String(s)) if !s.is_empty() => policies::tokens::count(s),
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= MAX_INPUTS => {
            let mut total = 0u32;
            for item in items {
                total = total.saturating_add(match item {
                    Value::String(s) if !s.is_empty() => policies::tokens::count(s),
                    Value::Number(_) => 1,
                    Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                        u32::try_from(ids.len()).unwrap_or(u32::MAX)
                    }
                    _ => return Err(field("input", "items must be non-empty strings or token-id arrays")),
                });
            }
            total
        }
        Some(Value::Array(items)) if items.len() > MAX_INPUTS => {
            return Err(field("input", &format!("at most {MAX_INPUTS} inputs are allowed")))
        }
        _ => return Err(field("input", "must be a non-empty string or array")),
    };
    Ok(EmbeddingsRequest { model, tokens })
}

/// Serves one embeddings request for `tenant`.
pub(crate) async fn serve(
    app: &crate::App,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    req: &mut Req,
    (ctx, key): (&Ident, Option<&crate::keys::KeyRecord>),
) -> Result<Response<GatewayBody>, Failed> {
    let body = req.take_read(); // read by the body layer: bounded memory and time
    let e = parse(&body)?;
    service::may_use(app, policy, (tenant, key), &e.model, req)?;
    if !app.engines.has_upstream_for(&e.model) {
        let message = "no engine serving this model computes embeddings".into();
        return Err(ApiError::UnsupportedParameter { param: "model".into(), message }.into());
    }
    let hold = service::tenant_limits(app, (tenant, tier), u64::from(e.tokens), req).await?;
    let ask = AdmitRequest {
        prefix: &[],
        tenant,
        tier,
        model: &e.model,
        prompt_tokens: e.tokens,
        max_tokens: 1,
        sampling: false,
        ttft_hint: None,
        e2e_hint: None,
        upstream_only: true,
    };
    let trace = req.parts.extensions.get::<RequestTrace>().cloned().unwrap_or_default();
    let admitted = super::traced::admit(app, policy, &ask, &trace)
        .map_err(|r| Failed { error: r.error, verdict: Some(r.verdict) })?;
    let verdict = admitted.verdict.clone();
    let failed = |error: ApiError| Failed { error, verdict: Some(verdict.clone()) };
    let observer =
        RequestObserver::new(ctx.arrived, &tier.name, Some((admitted.ttft_budget, admitted.e2e_budget)));
    let mut permit =
        Permit::new(observer, hold, admitted.ticket, Arc::clone(policy), verdict.predicted_ttft_ms).metered(
            crate::usage::Meter::new(
                Arc::clone(&app.usage),
                (&tenant.name, key.map_or(crate::usage::POLICY_KEY, |k| k.id.as_str()), &e.model),
                e.tokens,
                false,
            ),
        );
    let slot = service::engine_slot(admitted.start, admitted.ttft_budget, (policy, &tier.name), &verdict);
    let first = super::traced::gate(&trace, slot).await?;
    let gen = GenerateRequest {
        request_id: ctx.request_id.clone(),
        model: e.model.clone(),
        prompt: String::new(),
        max_tokens: 1,
        temperature: None,
        seed: None,
        stop: Vec::new(),
        priority_key: Some(admitted.key),
        ttft_budget_ms: u32::try_from(admitted.ttft_budget.as_millis()).ok(),
        priority: None,
    };
    let stamp = Stamp { id: String::new(), model: e.model.clone(), stream: false, include_usage: true };
    let out = Outbound::new(gen, (UpstreamRoute::Embeddings, body), true, Some(stamp));
    let event_timeout = app.config.limits.event_timeout(None);
    let done =
        crate::relay::collect(&app.engines, &out, first, admitted.work, tier.e2e, event_timeout, &mut permit)
            .await
            .map_err(failed)?;
    let mut resp = Response::new(crate::body::full(done.verbatim.unwrap_or_default()));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    service::insert_engine(resp.headers_mut(), &app.engines, done.engine_idx, &done.engine_id);
    resp.extensions_mut().insert(verdict);
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_counted_and_bad_ones_named() {
        let ok = |b: &str| parse(b.as_bytes()).unwrap();
        assert_eq!(ok(r#"{"model":"e","input":"hello world"}"#).model, "e");
        assert!(ok(r#"{"model":"e","input":["a b c","d"]}"#).tokens >= 2);
        assert_eq!(ok(r#"{"model":"e","input":[[1,2,3],[4]],"encoding_format":"float"}"#).tokens, 4);
        for (body, param) in [
            (r#"{"model":"e"}"#, "input"),
            (r#"{"model":"e","input":""}"#, "input"),
            (r#"{"model":"e","input":[]}"#, "input"),
            (r#"{"model":"e","input":[{"x":1}]}"#, "input"),
            (r#"{"input":"x"}"#, "model"),
        ] {
            assert_eq!(parse(body.as_bytes()).unwrap_err().param(), Some(param), "{body}");
        }
        let many = format!(r#"{{"model":"e","input":[{}]}}"#, vec!["\"x\""; MAX_INPUTS + 1].join(","));
        assert_eq!(parse(many.as_bytes()).unwrap_err().param(), Some("input"));
        assert_eq!(
            parse(br#"{"model":"e","input":"x","zeta":1}"#).unwrap_err(),
            ApiError::UnknownParameters(vec!["zeta".into()])
        );
    }
}
