//! A request's trace (OpenTelemetry; docs/operations.md "Tracing"): the
//! server span the stack's trace layer opens (a child of the client's
//! `traceparent` when it sends one) and the spans below it: auth,
//! admission (decision and reason), the wait at the gate, each engine
//! attempt (its context goes to the engine as `traceparent`, so the
//! engine's queue, prefill and decode spans hang below it), and the relay
//! from the first token to the last. GenAI semantic-convention attributes
//! where they exist (`gen_ai.*`), this project's under `slo.*`.
//!
//! Off unless `telemetry::enabled()`: then no span is made and the
//! attribute closures never run.

use std::borrow::Cow;

use telemetry::{Context, KeyValue, SpanKind, Status, TraceContextExt as _};

/// The request's server span, as a request extension (absent when tracing
/// is off). The span ends when the last clone is dropped: for a stream,
/// when its relay ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestTrace(Option<Context>);

impl RequestTrace {
    /// Opens the server span `name` under the client's `traceparent`.
    pub(crate) fn start(
        headers: &http::HeaderMap,
        name: impl FnOnce() -> String,
        attrs: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        if !telemetry::enabled() {
            return Self(None);
        }
        let name = name();
        let parent = telemetry::extract(headers);
        Self(Some(telemetry::span(&parent, name, SpanKind::Server, None, attrs())))
    }

    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Sets attributes on the server span.
    pub(crate) fn set(&self, attrs: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attributes(attrs());
        }
    }

    /// An event on the server span (the first token, say).
    pub(crate) fn event(&self, name: &'static str, attrs: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            cx.span().add_event(name, attrs());
        }
    }

    /// Marks the request failed (a 5xx, an engine failure mid-stream).
    pub(crate) fn fail(&self, why: impl Into<Cow<'static, str>>) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(why));
        }
    }

    /// A child span, started now and ended when the result is dropped.
    pub(crate) fn child(
        &self,
        name: &'static str,
        kind: SpanKind,
        attrs: impl FnOnce() -> Vec<KeyValue>,
    ) -> Child {
        Child(self.0.as_ref().map(|cx| telemetry::span(cx, name, kind, None, attrs())))
    }
}

/// A child span of a request; ends when dropped.
#[derive(Debug, Default)]
pub(crate) struct Child(Option<Context>);

impl Child {
    pub(crate) fn set(&self, attrs: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attributes(attrs());
        }
    }

    pub(crate) fn fail(&self, why: impl Into<Cow<'static, str>>) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(why));
        }
    }

    /// Its `traceparent` header value, for the engine request it covers.
    pub(crate) fn inject(&self, headers: &mut http::HeaderMap) {
        if let Some(cx) = &self.0 {
            telemetry::inject(cx, headers);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }
}
