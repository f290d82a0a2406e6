//! The public listener's request path as a `tower` stack, outermost first:
//!
//! ```text
//! RequestId   the request id (the client's x-request-id if sane), a
//!             `request{id=…}` span around everything below, x-request-id
//!             on the answer
//! Metrics     gateway_requests_total{route,status} once the answer is known;
//!             the OpenTelemetry server span (under the client's
//!             traceparent) and its status (trace.rs)
//! Policy      one policy version for the whole request (and its stream);
//!             x-policy-version, admission's decision headers and the
//!             rate-limit headers (ratelimit.rs) on the answer
//! Errors      the one place an error becomes an HTTP answer (OpenAI's body,
//!             or Anthropic's on its routes; gateway_errors_total, the
//!             verdict kept for the headers)
//! Auth        the key (bearer or x-api-key) of a route that needs one -> the tenant
//!             (`Caller`), else 401 after the upload is drained
//! BodyLimit   the body of a route that takes one, read whole within
//!             max_body_bytes and body_read_timeout_ms (413 / 408)
//! router      service::route: parse, tenant limits, admission, dispatch,
//!             relay
//! ```
//!
//! Why this order: the id and span first so that every log line below
//! carries the id; metrics see the final status, errors included; the
//! policy layer writes the decision headers on every answer, so it sits
//! above the error layer that produces error answers; auth before the body
//! so that an unknown caller costs no body read (its upload is drained, not
//! buffered). The route is found once, by the metrics layer, and travels
//! down as a request extension; below the error layer the request is a
//! [`Req`] (its body may already be read) and errors are typed ([`Failed`]). Each layer is always
//! ready (`poll_ready` is `Ready`): back-pressure is the listener's
//! (connections, streams) and admission's, not the stack's. Time limits
//! are where their time runs: the body read in the router, the engine's
//! first event in dispatch, the gate's wait at the gate.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use policies::PolicyDocument;
use tower::{Layer, Service, ServiceBuilder};

use crate::admission::Verdict;
use crate::body::GatewayBody;
use crate::metrics;
use crate::ratelimit::RateSlot;
use crate::reload::PolicyStore;
use crate::request::Req;
use crate::service::{self, Caller, Failed, Ident, Route};
use crate::trace::RequestTrace;
use crate::App;
use telemetry::KeyValue;

type Answer = Response<GatewayBody>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The policy version the request runs under (a request extension, set by
/// the policy layer).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot(pub Arc<PolicyDocument>);

/// The public service: the stack over the router.
pub(crate) fn public(
    app: Arc<App>,
) -> impl Service<
    Request<Incoming>,
    Response = Answer,
    Error = Infallible,
    Future = BoxFuture<Result<Answer, Infallible>>,
> + Clone
       + Send
       + Sync
       + 'static {
    let router = Router { app: Arc::clone(&app) };
    ServiceBuilder::new()
        .layer(Wrap::layer(RequestId { app: Arc::clone(&app) }))
        .layer(Wrap::layer(Metrics))
        .layer(Wrap::layer(Policy { store: Arc::clone(&app.policies) }))
        .layer(ErrorLayer)
        .layer(Step::layer(Auth, Arc::clone(&app)))
        .layer(Step::layer(BodyLimit, Arc::clone(&app)))
        .service(router)
}

/// The router as a service (`service::route`).
#[derive(Clone)]
struct Router {
    app: Arc<App>,
}

impl Service<Req> for Router {
    type Response = Answer;
    type Error = Failed;
    type Future = BoxFuture<Result<Answer, Failed>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        // The layers above set these on every request (`public`).
        let ext = req.extensions_mut();
        let (ident, snapshot, route) =
            (ext.remove::<Ident>(), ext.remove::<Snapshot>(), ext.remove::<Route>());
        let caller = ext.remove::<Caller>();
        let (Some(ident), Some(Snapshot(policy)), Some(route)) = (ident, snapshot, route) else {
            tracing::error!(event = "stack_miswired", why = "the router ran without its layers");
            return Box::pin(async {
                Err(crate::error::ApiError::Internal { what: "router without layers" }.into())
            });
        };
        Box::pin(service::route(Arc::clone(&self.app), req, (ident, route), policy, caller))
    }
}

/// One of the inner layers: a check on the request that either passes it
/// down (having added to it) or answers with an error, after draining
/// what the client was still uploading (bounded, `Req::drain_unread`).
trait Check: Clone + Send + Sync + 'static {
    fn check<'a>(
        &'a self,
        app: &'a App,
        req: &'a mut Req,
    ) -> impl Future<Output = Result<(), crate::error::ApiError>> + Send + 'a;
}

/// A [`Check`] as a `tower` layer and service.
#[derive(Clone)]
struct Step<C, S> {
    check: C,
    app: Arc<App>,
    inner: S,
}

impl<C: Check> Step<C, ()> {
    fn layer<S>(check: C, app: Arc<App>) -> impl Layer<S, Service = Step<C, S>> + Clone {
        tower::layer::layer_fn(move |inner| Step { check: check.clone(), app: Arc::clone(&app), inner })
    }
}

impl<C, S> Service<Req> for Step<C, S>
where
    C: Check,
    S: Service<Req, Response = Answer, Error = Failed> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Answer;
    type Error = Failed;
    type Future = BoxFuture<Result<Answer, Failed>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        // The service that was polled ready serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (check, app) = (self.check.clone(), Arc::clone(&self.app));
        Box::pin(async move {
            if let Err(error) = check.check(&app, &mut req).await {
                req.drain_unread(&app.config.limits).await; // answer after the upload, not into it
                return Err(error.into());
            }
            inner.call(req).await
        })
    }
}

/// The tenant owning the bearer key, for a route that needs one.
#[derive(Clone)]
struct Auth;

impl Check for Auth {
    async fn check(&self, app: &App, req: &mut Req) -> Result<(), crate::error::ApiError> {
        let ext = &req.parts.extensions;
        let (Some(route), Some(Snapshot(policy))) = (ext.get::<Route>(), ext.get::<Snapshot>()) else {
            return Err(crate::error::ApiError::Internal {
                what: "auth without the route and policy layers",
            });
        };
        if !route.needs_key() {
            return Ok(());
        }
        let trace = ext.get::<RequestTrace>().cloned().unwrap_or_default();
        let span = trace.child("auth", telemetry::SpanKind::Internal, Vec::new);
        let key = crate::request::api_key(req.headers()).ok_or(crate::error::ApiError::MissingKey);
        let caller = key.and_then(|k| service::identify(app, policy, k));
        match caller {
            Ok(caller) => {
                span.set(|| {
                    vec![KeyValue::new("slo.tenant", policy.tenant_at(caller.tenant).0.name.clone())]
                });
                req.extensions_mut().insert(caller);
                Ok(())
            }
            Err(e) => {
                span.fail(e.code());
                Err(e)
            }
        }
    }
}

/// The whole body of a route that takes one, bounded in size and time.
#[derive(Clone)]
struct BodyLimit;

impl Check for BodyLimit {
    async fn check(&self, app: &App, req: &mut Req) -> Result<(), crate::error::ApiError> {
        match req.parts.extensions.get::<Route>() {
            Some(route) if route.takes_body() => req.read(&app.config).await,
            _ => Ok(()),
        }
    }
}

/// One of the outer layers: it prepares the request, runs what is below
/// (inside its span, if it has one), and finishes the answer.
trait Around: Clone + Send + Sync + 'static {
    type State: Send + 'static;
    fn before(&self, req: &mut Request<Incoming>) -> Self::State;
    fn after(state: Self::State, resp: &mut Answer);
    /// The span the rest of the request runs in.
    fn span(_: &Self::State) -> tracing::Span {
        tracing::Span::none()
    }
}

/// An [`Around`] as a `tower` layer and service.
#[derive(Clone)]
struct Wrap<H, S> {
    hook: H,
    inner: S,
}

impl<H: Around> Wrap<H, ()> {
    fn layer<S>(hook: H) -> impl Layer<S, Service = Wrap<H, S>> + Clone {
        tower::layer::layer_fn(move |inner| Wrap { hook: hook.clone(), inner })
    }
}

impl<H, S> Service<Request<Incoming>> for Wrap<H, S>
where
    H: Around,
    S: Service<Request<Incoming>, Response = Answer, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = BoxFuture<Result<Answer, Infallible>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        let state = self.hook.before(&mut req);
        let span = H::span(&state);
        let answer = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        let finish = async move {
            let Ok(mut resp) = answer.await;
            H::after(state, &mut resp);
            Ok(resp)
        };
        Box::pin(tracing::Instrument::instrument(finish, span))
    }
}

/// The request id (the client's `x-request-id` if sane), a `request{id}`
/// span (error level, so that no log filter that shows a line hides it),
/// `x-request-id` on the answer.
#[derive(Clone)]
struct RequestId {
    app: Arc<App>,
}

impl Around for RequestId {
    type State = (tracing::Span, Option<HeaderValue>);

    fn before(&self, req: &mut Request<Incoming>) -> Self::State {
        let arrived = crate::clock::now();
        let id = service::request_id(&self.app, req.headers()); // correlates client reports, logs, engines
        let span = tracing::error_span!("request", id = %id);
        let stamp = HeaderValue::from_str(&id).ok();
        req.extensions_mut().insert(Ident { request_id: id, arrived });
        (span, stamp)
    }

    fn after((_, stamp): Self::State, resp: &mut Answer) {
        if let Some(v) = stamp {
            resp.headers_mut().insert(crate::headers::X_REQUEST_ID, crate::headers::unique(v));
        }
    }

    fn span((span, _): &Self::State) -> tracing::Span {
        span.clone()
    }
}

/// `gateway_requests_total{route,status}` once the answer is known; finds
/// the route (a request extension for the layers below). Opens the
/// request's server span (`trace.rs`, a request extension for the spans
/// below; nothing when tracing is off) and sets its status.
#[derive(Clone)]
struct Metrics;

impl Around for Metrics {
    type State = (&'static str, RequestTrace);

    fn before(&self, req: &mut Request<Incoming>) -> Self::State {
        let route = Route::of(req.method(), req.uri().path());
        let label = route.label();
        req.extensions_mut().insert(route);
        let trace = server_span(req, label);
        if trace.is_on() {
            req.extensions_mut().insert(trace.clone());
        }
        (label, trace)
    }

    fn after((route, trace): Self::State, resp: &mut Answer) {
        let status = resp.status();
        metrics::requests(route, status.as_u16()).increment(1);
        trace.set(|| vec![KeyValue::new("http.response.status_code", i64::from(status.as_u16()))]);
        if status.is_server_error() {
            trace.fail(status.to_string());
        }
    }
}

/// The request's server span, named after its route.
fn server_span(req: &Request<Incoming>, label: &'static str) -> RequestTrace {
    let method = req.method();
    RequestTrace::start(
        req.headers(),
        || format!("{method} {label}"),
        || {
            let id = req.extensions().get::<Ident>().map(|i| i.request_id.clone()).unwrap_or_default();
            vec![
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("url.path", req.uri().path().to_string()),
                KeyValue::new("http.route", label),
                KeyValue::new("slo.request_id", id),
            ]
        },
    )
}

/// One policy version from here to the end of the response stream;
/// `x-policy-version` and admission's decision headers on every answer.
#[derive(Clone)]
struct Policy {
    store: Arc<PolicyStore>,
}

impl Around for Policy {
    type State = (Arc<PolicyDocument>, RateSlot, crate::wire::Dialect);

    fn before(&self, req: &mut Request<Incoming>) -> Self::State {
        let policy = self.store.current();
        req.extensions_mut().insert(Snapshot(Arc::clone(&policy)));
        let slot = RateSlot::default(); // the router fills it (tenant limits)
        req.extensions_mut().insert(slot.clone());
        let dialect =
            req.extensions().get::<Route>().map(|r| r.dialect(req.uri().path())).unwrap_or_default();
        (policy, slot, dialect)
    }

    fn after((policy, slot, dialect): Self::State, resp: &mut Answer) {
        let verdict = resp.extensions_mut().remove::<Verdict>();
        service::decision_headers(resp.headers_mut(), &policy.version, verdict.as_ref());
        slot.write(resp.headers_mut(), dialect);
    }
}

#[derive(Clone)]
struct ErrorLayer;

impl<S> Layer<S> for ErrorLayer {
    type Service = Errors<S>;
    fn layer(&self, inner: S) -> Errors<S> {
        Errors { inner }
    }
}

#[derive(Clone)]
struct Errors<S> {
    inner: S,
}

impl<S> Service<Request<Incoming>> for Errors<S>
where
    S: Service<Req, Response = Answer, Error = Failed>,
    S::Future: Send + 'static,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = BoxFuture<Result<Answer, Infallible>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready; an error there would be a bug.
        match self.inner.poll_ready(cx) {
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let dialect =
            req.extensions().get::<Route>().map(|r| r.dialect(req.uri().path())).unwrap_or_default();
        let answer = self.inner.call(Req::new(req));
        Box::pin(async move {
            Ok(answer.await.unwrap_or_else(|Failed { error, verdict }| {
                tracing::info!(event = "request_error", code = error.code(), error = %error);
                ::metrics::counter!(metrics::ERRORS, "code" => error.code()).increment(1);
                let mut resp = error.into_response_as(dialect);
                if let Some(v) = verdict {
                    resp.extensions_mut().insert(v);
                }
                resp
            }))
        })
    }
}
