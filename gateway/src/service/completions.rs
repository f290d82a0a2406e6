//! The generation path (`completions`): SLO hints -> schema -> model ->
//! plan (context ceiling, output cap) -> tenant limits -> admission
//! (brownout caps, estimate, admit / degrade / reject, the gate) -> dispatch
//! (retries before the first byte) -> SSE relay or collected JSON.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use engine_api::GenerateRequest;
use http::{header, HeaderMap, HeaderValue, Response};
use http_body_util::BodyExt;
use policies::{PolicyDocument, Tenant, Tier};

use crate::admission::{AdmitRequest, Start, Verdict};

use crate::body::GatewayBody;
use crate::dispatch::{self, Attempts};
use crate::error::{ApiError, Metered, Overload};
use crate::headers as hdr;
use crate::metrics::RequestObserver;
use crate::openai::{self, Kind};
use crate::permit::Permit;
use crate::relay::{self, Encoder, StreamBounds};
use crate::request::Req;
use crate::trace::RequestTrace;
use crate::wire::{anthropic, responses, Wire};
use crate::App;

use super::fronts::{inbound, Form, Inbound};
use super::{fresh_id, traced, Failed, Front, Ident};

/// The generation path, in three steps: [`prepare`] (the request in
/// OpenAI's form, checked against the tier, the key and the budgets, its
/// answer's encoder), admission and the gate (here), [`respond`] (dispatch
/// and the relay).
pub(super) async fn completions(
    app: &App,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    req: &mut Req,
    (front, key): (Front, Option<&crate::keys::KeyRecord>),
    ctx: &Ident,
) -> Result<Response<GatewayBody>, Failed> {
    let p = prepare(app, policy, (tenant, tier), req, (front, key), ctx).await?;
    let Prepared { mut gen, wire, kind, body, prompt_tokens, upstream_only, prefix, trace, hints } = p;
    // This gateway's or fleet-wide tenant limits.
    let hold =
        tenant_limits(app, (tenant, tier), u64::from(prompt_tokens) + u64::from(gen.max_tokens), req).await?;
    // Admission: admit, degrade or refuse against the tier's SLO, fast.
    let ask = AdmitRequest {
        tenant,
        tier,
        model: &gen.model,
        prompt_tokens,
        max_tokens: gen.max_tokens,
        sampling: gen.temperature.is_some_and(|t| t > 0.0),
        ttft_hint: hints.0,
        e2e_hint: hints.1,
        upstream_only,
        prefix: &prefix,
    };
    let admitted = traced::admit(app, policy, &ask, &trace)
        .map_err(|r| Failed { error: r.error, verdict: Some(r.verdict) })?;
    let verdict = admitted.verdict.clone();
    gen.max_tokens = admitted.max_tokens;
    if !admitted.sampling {
        gen.temperature = None;
    }
    gen.priority_key = Some(admitted.key);
    gen.ttft_budget_ms = u32::try_from(admitted.ttft_budget.as_millis()).ok();
    if policy.admission.preempt_lower_tiers {
        // Its standing for priority preemption on a native engine: it may
        // pause lower tiers' sequences, and be paused for higher ones.
        gen.priority = Some(engine_api::Priority {
            class: tier.priority_weight.get(),
            max_pauses: policy.admission.max_pauses,
            e2e_budget_ms: u32::try_from(admitted.e2e_budget.as_millis()).unwrap_or(u32::MAX),
        });
    }
    let stamp = wire.stamp();
    let mut out = dispatch::Outbound::new(gen, (kind.into(), body), upstream_only, stamp); // as each kind of engine is sent it
    out.prefix = prefix;
    out.trace = trace.clone();
    tracing::debug!(event = "request_admitted", request_id = %ctx.request_id, tenant = %tenant.name, tier = %tier.name,
        decision = admitted.verdict.decision.as_str(), reason = %admitted.verdict.reason);
    let observer =
        RequestObserver::new(ctx.arrived, &tier.name, Some((admitted.ttft_budget, admitted.e2e_budget)))
            .traced(trace.clone());
    let meter = crate::usage::Meter::new(
        Arc::clone(&app.usage),
        (&tenant.name, key.map_or(crate::usage::POLICY_KEY, |k| k.id.as_str()), &out.gen.model),
        prompt_tokens,
        wire.stream(),
    );
    let predicted = admitted.verdict.predicted_ttft_ms;
    let permit = Permit::new(observer, hold, admitted.ticket, Arc::clone(policy), predicted).metered(meter);
    let slot = engine_slot(admitted.start, admitted.ttft_budget, (policy, &tier.name), &verdict);
    let first = traced::gate(&trace, slot).await?;
    let timeout = admitted.e2e_budget.max(tier.e2e);
    // From here every answer, error or not, carries the verdict.
    let run = Admitted { out, first, work: admitted.work, timeout, permit };
    respond(app, wire, run)
        .await
        .map(|mut resp| {
            resp.extensions_mut().insert(verdict.clone());
            resp
        })
        .map_err(|error| Failed { error, verdict: Some(verdict) })
}

/// Whether the caller may use `model`: the policy serves it, the key (if
/// made at run time) allows it, and no budget of the tenant's or the key's
/// is spent (refused before any work; the tightest token budget left is the
/// rate-limit headers' tokens).
pub(crate) fn may_use(
    app: &App,
    policy: &PolicyDocument,
    (tenant, key): (&Tenant, Option<&crate::keys::KeyRecord>),
    model: &str,
    req: &Req,
) -> Result<(), ApiError> {
    if policy.model(model).is_none() {
        return Err(ApiError::ModelNotFound(model.to_string()));
    }
    if key.and_then(|k| k.models.as_ref()).is_some_and(|allowed| !allowed.iter().any(|m| m == model)) {
        return Err(ApiError::ModelNotAllowed(model.to_string()));
    }
    let budget = app.usage.check(tenant, key, crate::clock::unix_s() as u64)?;
    if let (Some(w), Some(slot)) = (budget, req.parts.extensions.get::<crate::ratelimit::RateSlot>()) {
        slot.budget(w);
    }
    Ok(())
}

/// A generation request ready for admission.
struct Prepared {
    gen: GenerateRequest,
    wire: Wire,
    kind: Kind,
    /// The body an OpenAI-speaking upstream is sent.
    body: bytes::Bytes,
    prompt_tokens: u32,
    upstream_only: bool,
    /// The prompt's block hashes (prefix-aware routing).
    prefix: Vec<u64>,
    trace: RequestTrace,
    /// `x-slo-ttft-ms`, `x-slo-e2e-ms`.
    hints: (Option<std::time::Duration>, Option<std::time::Duration>),
}

/// Reads the request of any API as OpenAI's (typed and validated, unknown
/// parameters named), checks the model, the key's models, the budgets and
/// the passthrough parameters, applies the tier (context ceiling, output
/// cap), and makes the answer's encoder.
async fn prepare(
    app: &App,
    policy: &Arc<PolicyDocument>,
    (tenant, tier): (&Tenant, &Tier),
    req: &mut Req,
    (front, key): (Front, Option<&crate::keys::KeyRecord>),
    ctx: &Ident,
) -> Result<Prepared, Failed> {
    let request_id = ctx.request_id.as_str();
    let min_hint = policy.admission.min_hint_ms;
    let ttft_hint = slo_hint(req.headers(), "x-slo-ttft-ms", tier.ttft, min_hint)?; // per-request SLO, clamped to the tier
    let e2e_hint = slo_hint(req.headers(), "x-slo-e2e-ms", tier.e2e, min_hint)?;
    let body = req.take_read(); // read by the body layer: bounded memory and time
    let Inbound { parsed, body, form } = inbound(app, policy, tenant, front, req.headers(), body).await?;
    let kind = parsed.kind;
    may_use(app, policy, (tenant, key), &parsed.model, req)?;
    let upstream_only = match parsed.upstream_param.clone() {
        // A passthrough parameter: only a third-party engine can honour it.
        Some(param) if !app.engines.has_upstream_for(&parsed.model) => {
            let message = "is not supported by the engines serving this model".into();
            return Err(ApiError::UnsupportedParameter { param, message }.into());
        }
        Some(_) => true,
        None => false,
    };
    let (mut encoder, gen, prompt_tokens) = plan(parsed, tier, request_id)?; // tier ceiling and cap
    let wire = match form {
        Form::OpenAi => Wire::OpenAi(encoder),
        Form::Anthropic => Wire::Anthropic(anthropic::Encoder::new(
            format!("msg_{request_id}"),
            std::mem::take(&mut encoder.model),
            encoder.stream,
            prompt_tokens,
            encoder.verbatim,
        )),
        Form::Responses(t) => {
            let id = format!("resp_{}", fresh_id(app)); // store keys: never a client-chosen request id
            let saver = t.echo.store.then(|| responses::Saver {
                store: Arc::clone(&app.responses),
                tenant: tenant.name.clone(),
                conversation: t.conversation,
            });
            Wire::Responses(Box::new(responses::Encoder::new(id, encoder.stream, t.echo, saver)))
        }
    };
    let affinity = &policy.routing.prefix;
    let prefix = match affinity.enabled {
        true => policies::prefix::block_hashes(&gen.prompt, affinity.block_tokens), // where it may be cached
        false => Vec::new(),
    };
    let trace = req.parts.extensions.get::<RequestTrace>().cloned().unwrap_or_default();
    traced::describe(&trace, kind, &gen.model, (gen.max_tokens, wire.stream()), (tenant, tier));
    Ok(Prepared {
        gen,
        wire,
        kind,
        body,
        prompt_tokens,
        upstream_only,
        prefix,
        trace,
        hints: (ttft_hint, e2e_hint),
    })
}

/// An admitted generation, through the gate.
struct Admitted {
    out: dispatch::Outbound,
    first: Option<crate::engines::EngineLease>,
    work: crate::engines::Work,
    timeout: std::time::Duration,
    permit: Permit,
}

/// Dispatches an admitted generation and answers: the SSE relay (the
/// first token already in the body) or the collected answer.
async fn respond(app: &App, mut wire: Wire, run: Admitted) -> Result<Response<GatewayBody>, ApiError> {
    let Admitted { out, first, work, timeout, mut permit } = run;
    let limits = &app.config.limits;
    if wire.stream() {
        let started =
            dispatch::start(&app.engines, &out, first, work, timeout, &mut Attempts::default()).await?;
        let engine_id = started.inflight.engine_id().to_string();
        let engine_idx = started.inflight.engine_idx();
        let step_ms = app.engines.slot(engine_idx).decode_step_ms();
        let bounds = StreamBounds {
            buffer_bytes: limits.stream_buffer_bytes,
            stall: limits.stall(),
            event_timeout: limits.event_timeout(step_ms),
        };
        // Kept with the stream, so that it can go on elsewhere if its
        // engine fails after the first tokens: the rendered prompt.
        let resume = out.resumable().then(|| relay::Resume {
            out: out.for_resume(),
            work,
            first_event_timeout: timeout,
        });
        let body = relay::spawn_sse(wire, started, permit, Arc::clone(&app.engines), bounds, resume);
        let mut resp = Response::new(body.boxed_unsync());
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        insert_engine(h, &app.engines, engine_idx, &engine_id);
        Ok(resp)
    } else {
        let event_timeout = limits.event_timeout(None);
        let done =
            relay::collect(&app.engines, &out, first, work, timeout, event_timeout, &mut permit).await?;
        let body = match done.verbatim {
            Some(answer) => crate::body::full(wire.complete_upstream(answer)),
            None => crate::body::full(wire.complete(&done.text, done.finish_reason, done.usage)),
        };
        let mut resp = Response::new(body);
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        insert_engine(resp.headers_mut(), &app.engines, done.engine_idx, &done.engine_id);
        Ok(resp)
    }
}

/// The gate: waits (with a deadline, the TTFT budget) for an engine slot
/// when all are busy; `Some` lease to start on, `None` to start anywhere.
pub(crate) async fn engine_slot(
    start: Start,
    ttft_budget: std::time::Duration,
    (policy, tier): (&PolicyDocument, &str),
    verdict: &Verdict,
) -> Result<Option<crate::engines::EngineLease>, Failed> {
    let waited = |since: Option<std::time::Instant>| {
        let s = since.map_or(0.0, |t| crate::clock::since(t).as_secs_f64());
        crate::metrics::TierMetrics::of(tier).queue_wait().record(s);
    };
    let (rx, deadline, v) = match start {
        Start::Now(lease) => {
            waited(None);
            return Ok(Some(lease));
        }
        Start::Anywhere => {
            waited(None);
            return Ok(None);
        }
        Start::Wait(rx, deadline, v) => (rx, deadline, v),
    };
    let since = crate::clock::now();
    let outcome = tokio::time::timeout_at(deadline, rx).await;
    waited(Some(since));
    match outcome {
        Ok(Ok(Ok(lease))) => Ok(Some(lease)),
        Ok(Ok(Err(refused))) => Err(Failed { error: refused.error, verdict: Some(refused.verdict) }),
        Ok(Err(_)) => Err(Failed { error: ApiError::NoReadyEngine, verdict: Some(verdict.clone()) }),
        Err(_) => {
            let error = ApiError::Overloaded {
                reason: Overload::Admission(policies::admission::outcome::Reason::QueueTimeout),
                message: format!(
                    "no engine slot freed within the {} ms TTFT budget; retry shortly",
                    ttft_budget.as_millis()
                ),
                retry_after_s: policy.admission.retry_after_min_s,
            };
            Err(Failed { error, verdict: Some(v.rejected("queue_timeout")) })
        }
    }
}

/// The tenant's limits (concurrency, requests and tokens per minute),
/// held until the response ends. Their one owner is the cluster layer: this
/// process's counters on a single gateway, Redis's across a fleet; a
/// concurrency refusal is an admission decision in both (headers, metric).
pub(crate) async fn tenant_limits(
    app: &App,
    (tenant, tier): (&Tenant, &Tier),
    tokens: u64,
    req: &Req,
) -> Result<crate::cluster::Hold, Failed> {
    let limits = crate::cluster::Limits {
        max_concurrency: tier.max_concurrency.map(|v| v.get()),
        requests_per_minute: tier.requests_per_minute.map(|v| v.get()),
        tokens_per_minute: tier.tokens_per_minute.map(|v| v.get()),
    };
    let now_ms = crate::cluster::wall_ms();
    let result = app.cluster.acquire(&tenant.name, limits, tokens, now_ms).await;
    // The caller's standing, for the rate-limit headers (ratelimit.rs).
    if let Some(slot) = req.parts.extensions.get::<crate::ratelimit::RateSlot>() {
        let reset_s = u64::from(crate::cluster::retry_after_window(now_ms));
        let window = |limit: Option<u32>, used: u64| {
            limit.map(|limit| crate::ratelimit::Window { limit: u64::from(limit), used, reset_s })
        };
        let used = match &result {
            Ok(grant) => Some(grant.used),
            Err(crate::cluster::Denied::Requests { limit, .. }) => {
                Some(crate::cluster::Used { requests: u64::from(*limit), tokens: 0 })
            }
            Err(crate::cluster::Denied::Tokens { limit, .. }) => {
                Some(crate::cluster::Used { requests: 0, tokens: u64::from(*limit) })
            }
            // A concurrency refusal says nothing of the windows.
            Err(crate::cluster::Denied::Concurrency { .. }) => None,
        };
        if let Some(used) = used {
            slot.minute(
                window(limits.requests_per_minute, used.requests),
                window(limits.tokens_per_minute, used.tokens),
            );
        }
    }
    match result {
        Ok(grant) => Ok(crate::cluster::Hold::new(Arc::clone(&app.cluster), grant)),
        Err(crate::cluster::Denied::Concurrency { limit }) => {
            let verdict = app.admission.tenant_concurrency(tier);
            Err(Failed { error: ApiError::TenantConcurrency { limit }, verdict: Some(verdict) })
        }
        Err(crate::cluster::Denied::Requests { limit, retry_after_s }) => {
            Err(ApiError::RateLimited { what: Metered::Requests, limit, retry_after_s }.into())
        }
        Err(crate::cluster::Denied::Tokens { limit, retry_after_s }) => {
            Err(ApiError::RateLimited { what: Metered::Tokens, limit, retry_after_s }.into())
        }
    }
}

/// `x-slo-ttft-ms` / `x-slo-e2e-ms`: a tighter target than the tier's for
/// this request (milliseconds), clamped to [min_hint_ms, the tier's budget].
fn slo_hint(
    headers: &HeaderMap,
    name: &'static str,
    tier_budget: std::time::Duration,
    min_ms: u32,
) -> Result<Option<std::time::Duration>, ApiError> {
    let Some(v) = headers.get(name) else { return Ok(None) };
    let ms: u64 =
        v.to_str().ok().and_then(|s| s.trim().parse().ok()).filter(|ms| *ms > 0).ok_or_else(|| {
            ApiError::InvalidHeader {
                header: name,
                message: "must be a positive whole number of milliseconds".into(),
            }
        })?;
    let ms = std::time::Duration::from_millis(ms.max(u64::from(min_ms)));
    Ok(Some(ms.min(tier_budget)))
}

/// Applies the tier to a parsed request: the prompt must fit the context
/// ceiling (else 400); `max_tokens` is clamped to the output cap. Returns
/// the response encoder, the engine request, and its prompt tokens.
fn plan(
    parsed: openai::CompletionRequest,
    tier: &Tier,
    request_id: &str,
) -> Result<(Encoder, GenerateRequest, u32), ApiError> {
    let prompt_tokens = policies::tokens::count(&parsed.prompt);
    let limit = tier.max_context_tokens.get();
    if prompt_tokens > limit {
        return Err(ApiError::ContextLengthExceeded { prompt_tokens, limit });
    }
    let cap = tier.max_output_tokens.get();
    let max_tokens = parsed.max_tokens.map_or(cap, |m| m.min(cap));
    let prefix = if parsed.kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let encoder = Encoder {
        kind: parsed.kind,
        id: format!("{prefix}-{request_id}"),
        created: crate::clock::wall().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: parsed.model.clone(),
        stream: parsed.stream,
        include_usage: parsed.include_usage,
        verbatim: parsed.verbatim,
        tail: Default::default(),
    };
    // Admission sets the ordering key, the TTFT budget and the priority.
    let gen = parsed.into_generate(request_id.to_string(), max_tokens);
    Ok((encoder, gen, prompt_tokens))
}

/// `x-engine` (which engine served) and `x-engine-class` (its class, what
/// the load tester groups the predictor's calibration by).
pub(crate) fn insert_engine(
    h: &mut HeaderMap,
    engines: &crate::engines::EnginePool,
    idx: usize,
    engine_id: &str,
) {
    if let Ok(v) = HeaderValue::from_str(engine_id) {
        h.insert(hdr::X_ENGINE, v);
    }
    if let Some(v) = engines.slot(idx).profile().and_then(|p| HeaderValue::from_str(&p.engine_class).ok()) {
        h.insert(hdr::X_ENGINE_CLASS, v);
    }
}
