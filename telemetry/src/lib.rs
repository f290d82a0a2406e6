//! Distributed tracing for the gateway and the engines (OpenTelemetry).
//!
//! Off by default and free when off: [`init`] installs a tracer provider
//! only when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and callers check
//! [`enabled`] before building any span or attribute. Everything else is
//! the standard `OTEL_*` configuration read by the SDK and the exporter:
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`
//! (`parentbased_always_on` by default: a client's sampled `traceparent`
//! is honoured), `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, and the batch
//! processor's `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE` (2,048
//! spans: past it spans are dropped, never queued without bound) and
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`. `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` keep it off.
//!
//! Export is OTLP over HTTP with protobuf bodies (`http/protobuf`, the
//! collector's port 4318), sent by a hyper client on the process's tokio
//! runtime; `http://` endpoints only (run a collector beside the process
//! for TLS to a backend). Context travels as W3C `traceparent` /
//! `tracestate` headers: accepted from clients by the gateway, sent by the
//! gateway to engines.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{SpanExporter, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer};
pub use opentelemetry::{Context, KeyValue};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are recorded and exported (an endpoint is configured).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The tracer every span of this process comes from.
pub fn tracer() -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer("slo-gateway")
}

/// Longest a process's exit waits for its last spans to be exported (a
/// stalled collector costs an exit no more).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// Flushes and shuts the exporter down when dropped (keep it for the life
/// of the process).
#[must_use = "dropping the guard stops the exporter"]
pub struct Guard(SdkTracerProvider);

impl Drop for Guard {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(e) = self.0.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(event = "tracing_shutdown_failed", error = %e);
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// Whether the environment asks for trace export.
pub fn configured() -> bool {
    let off = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    !off && (var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some())
}

/// Starts exporting spans when the environment asks for it (see the
/// module doc); `service` names the process unless `OTEL_SERVICE_NAME`
/// does, `instance` is its `service.instance.id`. Call it inside the
/// process's tokio runtime; `Ok(None)` when tracing stays off.
pub fn init(service: &str, instance: &str) -> Result<Option<Guard>, String> {
    if !configured() {
        return Ok(None);
    }
    let client = RuntimeClient::new(tokio::runtime::Handle::try_current().map_err(|e| e.to_string())?);
    let exporter = SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let mut resource =
        Resource::builder().with_attribute(KeyValue::new("service.instance.id", instance.to_string()));
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some(Guard(provider)))
}

/// The context a request's `traceparent` / `tracestate` carry (an empty
/// one when absent or malformed: the span starts a new trace).
pub fn extract(headers: &http::HeaderMap) -> Context {
    // The propagator accepts short ids ("4bf9" is read as a number); W3C
    // Trace Context fixes their lengths: check them first.
    let well_formed = headers.get("traceparent").and_then(|v| v.to_str().ok()).is_some_and(well_formed);
    if !well_formed {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// `version-traceid-parentid-flags`: 2, 32, 16 and 2 lowercase hex digits
/// (a later version may append fields after the flags).
fn well_formed(value: &str) -> bool {
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = value.trim().split('-');
    let (Some(v), Some(trace), Some(parent), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    hex(v, 2)
        && v != "ff"
        && hex(trace, 32)
        && hex(parent, 16)
        && hex(flags, 2)
        && (v != "00" || parts.next().is_none())
}

/// Writes `cx`'s span as `traceparent` (and `tracestate`) into `headers`.
pub fn inject(cx: &Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// A span below `parent`, started at `start` (now when `None`), as the
/// context its own children and `traceparent` come from. Ends when the
/// last clone of the context is dropped, or explicitly.
pub fn span(
    parent: &Context,
    name: impl Into<Cow<'static, str>>,
    kind: SpanKind,
    start: Option<SystemTime>,
    attrs: Vec<KeyValue>,
) -> Context {
    let tracer = tracer();
    let mut builder = tracer.span_builder(name).with_kind(kind).with_attributes(attrs);
    if let Some(t) = start {
        builder = builder.with_start_time(t);
    }
    parent.with_span(builder.start_with_context(&tracer, parent))
}

/// Longest a collector may take to answer one export.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes read of a collector's answer.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// OTLP's HTTP client: hyper on the process's tokio runtime. The batch
/// processor exports from a thread of its own; each export runs as a task
/// on the runtime, bounded by [`EXPORT_TIMEOUT`].
#[derive(Debug, Clone)]
struct RuntimeClient {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl RuntimeClient {
    fn new(runtime: tokio::runtime::Handle) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        Self { runtime, client: Client::builder(TokioExecutor::new()).build(connector) }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let call = client.request(http::Request::from_parts(parts, Full::new(body)));
            let resp =
                tokio::time::timeout(EXPORT_TIMEOUT, call).await.map_err(|_| "the collector timed out")??;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?.to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
        });
        task.await?
    }
}

/// Milliseconds as an attribute value.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_bad_ones_start_a_new_trace() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap(),
        );
        let cx = extract(&headers);
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let mut out = http::HeaderMap::new();
        inject(&cx, &mut out);
        assert_eq!(out["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf9-00f0-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            let mut h = http::HeaderMap::new();
            h.insert("traceparent", bad.parse().unwrap());
            assert!(!extract(&h).span().span_context().is_valid(), "{bad}");
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_set() {
        // The test environment sets none (CI does not export traces).
        if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        {
            assert!(!configured());
            assert!(!enabled());
        }
    }
}
