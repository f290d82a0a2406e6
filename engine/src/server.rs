//! The engine's internal HTTP/2 API (see [`crate::api`] for the routes),
//! and its OpenAI-compatible surface beside it ([`crate::openai`]).
//!
//! Served with hyper's auto builder on plain TCP: the gateway speaks HTTP/2
//! with prior knowledge, and HTTP/1.1 works for curl and debugging.
//!
//! Bounds: `--max-connections` open connections ([`MAX_CONNECTIONS`] by
//! default; past it new ones are closed at once), [`MAX_STREAMS`]
//! concurrent streams per connection (a gateway multiplexes thousands of
//! generations over a few connections), as many streams reset by the
//! gateway before we accepted them (a burst of client cancellations
//! arrives as a burst of resets and must not close the connection that
//! carries everyone else's streams), HTTP/2 keepalive PINGs, and a
//! back-off after accept errors.
//!
//! Abusive peers (`connguard`: the rapid-reset shape of CVE-2023-44487, as
//! the gateway's listeners): a connection more than half of whose last 100
//! streams were reset before their response head was ready, or that opens
//! streams faster than `--max-new-streams-per-s` (a burst of
//! [`MAX_STREAMS`]), is closed at once. A gateway's own cancellations do
//! not count: it cancels answers under way, after their head.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use openai_wire::Kind;

use crate::api::{self, GenerateRequest};
use crate::body::ChannelBody;
use crate::http::{error, json, read_json, EngineBody};
use crate::routes::Endpoint;
use crate::Engine;

/// Open connections at most by default (gateways hold a few each).
pub const MAX_CONNECTIONS: usize = 1024;
/// Concurrent HTTP/2 streams per connection.
pub const MAX_STREAMS: u32 = 16_384;
/// New streams per second one connection may open, by default: far above
/// what a gateway's connection carries (each stream is a generation).
pub const MAX_NEW_STREAMS_PER_S: u32 = 50_000;
/// Accept errors (EMFILE: out of file descriptors) back off this long.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections at most; past it new ones are closed at once.
    pub max_connections: usize,
    /// New streams per second per connection (0: unbounded).
    pub max_new_streams_per_s: u32,
}

/// Serves `engine` on `listener` within `limits` until `shutdown` resolves.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_pending_accept_reset_streams(MAX_STREAMS as usize)
        .keep_alive_interval(std::time::Duration::from_secs(10))
        .keep_alive_timeout(std::time::Duration::from_secs(10));
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(event = "accept_failed", error = %e);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(event = "connection_refused", why = "max_connections");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let engine = Arc::clone(&engine);
        let watch = connguard::Watch::with_premature(
            f64::from(limits.max_new_streams_per_s),
            f64::from(MAX_STREAMS),
            std::time::Duration::MAX,
        );
        let streams = Arc::clone(&watch);
        // Not read a slice a turn (connguard::Fair, as the gateway's public
        // listener is): the engine's peers are the fleet's gateways, a few
        // connections each, and the smaller its reads the more often a
        // rapid-reset peer's reset comes a read after its request was let
        // through to the scheduler (up to 625 of ~2,000 attack streams with
        // 4 KiB slices, 353 with 16 KiB, 0-112 reading whole, 0 in 15 of 20
        // runs: docs/reliability.md).
        let svc = hyper::service::service_fn(move |req| {
            // Finished once the response head is ready; dropped before
            // (the peer reset the stream), it counts as a premature reset.
            let mut stream = streams.open();
            let engine = Arc::clone(&engine);
            let watch = Arc::clone(&streams);
            async move {
                // Yield once first (holding a suspect connection's stream a
                // moment): hyper drops a stream its peer reset right after
                // its request before the scheduler sees it.
                connguard::settle(&watch, None, connguard::SUSPECT_HOLD).await;
                // A connection found abusive gets no further work while it
                // is being closed (streams whose reset came in a later read
                // than their request would otherwise reach the scheduler).
                if watch.is_tripped() {
                    return Ok(error(
                        StatusCode::TOO_MANY_REQUESTS,
                        "connection_abusive",
                        "this connection is being closed",
                    ));
                }
                let response = handle(engine, req).await;
                stream.finished();
                response
            }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                result = conn => if let Err(e) = result {
                    if connguard::h2_calm(e.as_ref()) {
                        let why = connguard::Abuse::H2Calm.label();
                        ::metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "why" => why).increment(1);
                        tracing::warn!(event = "connection_closed", why);
                    } else {
                        tracing::debug!(event = "connection_error", error = %e);
                    }
                },
                why = watch.tripped() => {
                    // Dropping the connection closes its socket: its streams end.
                    ::metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "why" => why.label()).increment(1);
                    tracing::warn!(event = "connection_closed", why = why.label());
                }
            }
        });
    }
    graceful.shutdown().await;
}

/// Whether `req` may reach `target`: with an API token set, it must carry
/// it, but for the probes and a snapshot pulled with the one-time transfer
/// token the gateway offered (the pulling engine holds only that).
fn authorized(engine: &Engine, req: &Request<Incoming>, target: crate::routes::Target<'_>) -> bool {
    let Some(token) = &engine.api_token else { return true };
    let snapshot = req.method() == Method::GET
        && (target.endpoint, target.action) == (Endpoint::Video, "snapshot")
        && req.headers().contains_key(crate::video::transfer::TOKEN_HEADER);
    let open = matches!(target.endpoint, Endpoint::Healthz | Endpoint::Readyz | Endpoint::Health) || snapshot;
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    open || api::bearer_matches(token, given)
}

async fn handle(engine: Arc<Engine>, req: Request<Incoming>) -> Result<Response<EngineBody>, Infallible> {
    let path = req.uri().path().to_string();
    let Some(target) = crate::routes::find(&path) else {
        return Ok(error(StatusCode::NOT_FOUND, "not_found", "no such engine route"));
    };
    if !authorized(&engine, &req, target) {
        ::metrics::counter!(crate::metrics::REFUSALS, "reason" => "unauthorized").increment(1);
        return Ok(error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong engine API token"));
    }
    let resp = match (target.endpoint, req.method()) {
        (Endpoint::Generate, &Method::POST) => generate_route(engine, req).await,
        (Endpoint::Load, &Method::GET) => json(StatusCode::OK, &engine.load_report().await),
        (Endpoint::KvEvents, &Method::GET) => {
            let after = req
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("after=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            json(StatusCode::OK, &engine.kv_events(after))
        }
        (Endpoint::Profile, &Method::GET) => Response::builder()
            .header(header::CONTENT_TYPE, "application/toml")
            .body(Either::Left(Full::new(Bytes::from(engine.profile_toml.clone()))))
            .expect("static response parts are valid"),
        (Endpoint::Drain, &Method::POST) => {
            engine.start_drain();
            tracing::info!(event = "drain_started", engine = %engine.id, why = "api");
            json(StatusCode::OK, &engine.load_report().await)
        }
        (Endpoint::Batching, &Method::GET) => match engine.scheduler.set_hints(None).await {
            Some(limits) => json(StatusCode::OK, &limits),
            None => error(StatusCode::SERVICE_UNAVAILABLE, "stopped", "the scheduler has stopped"),
        },
        (Endpoint::Batching, &Method::PUT) => batching_route(engine, req).await,
        (Endpoint::Metrics, &Method::GET) => {
            let kv = engine.kv.snapshot();
            ::metrics::gauge!(crate::metrics::KV_FREE).set(f64::from(kv.free));
            ::metrics::gauge!(crate::metrics::PREFIX_CACHED_PAGES).set(f64::from(kv.cached_pages));
            let mut text = crate::metrics::handle().render();
            // Not `load_report()`: that also feeds the KV slope sampler,
            // which a scrape must not do.
            let sched = engine.scheduler.snapshot().await;
            let load = crate::openai::VllmLoad {
                running: sched.inflight_sequences,
                waiting: sched.queued_sequences,
                kv_pages_free: kv.free,
                kv_pages_total: kv.total,
                prefix_lookup_tokens: sched.prompt_tokens,
                prefix_hit_tokens: sched.cached_tokens,
            };
            text.push_str(&crate::openai::vllm_metrics(&load, &engine.served_model));
            Response::builder()
                .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
                .body(Either::Left(Full::new(Bytes::from(text))))
                .expect("static response parts are valid")
        }
        (Endpoint::Healthz, &Method::GET) => json(StatusCode::OK, &serde_json::json!({"status": "alive"})),
        (Endpoint::Readyz, &Method::GET) => {
            let report = engine.load_report().await;
            let status = if engine.accepting() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            json(status, &report)
        }
        (Endpoint::ChatCompletions, &Method::POST) => {
            crate::openai::completions(engine, req, Kind::Chat).await
        }
        (Endpoint::Completions, &Method::POST) => {
            crate::openai::completions(engine, req, Kind::Completion).await
        }
        (Endpoint::Models, &Method::GET) => crate::openai::models(&engine),
        (Endpoint::Health, &Method::GET) => crate::openai::health(&engine),
        (Endpoint::Video, _) => crate::routes::video::handle(&engine, req, target).await,
        (Endpoint::Diffusion, _) => crate::routes::diffusion::handle(&engine, req, target).await,
        (_, method) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &format!("method {method} is not allowed on {path}"),
        ),
    };
    Ok(resp)
}

async fn batching_route(engine: Arc<Engine>, req: Request<Incoming>) -> Response<EngineBody> {
    let hints: policies::batching::BatchHints = match read_json(req).await {
        Ok(h) => h,
        Err(resp) => return resp,
    };
    if let Err((key, message)) = hints.validate() {
        return error(StatusCode::BAD_REQUEST, "invalid_request", &format!("{key}: {message}"));
    }
    match engine.scheduler.set_hints(Some(hints)).await {
        Some(limits) => json(StatusCode::OK, &limits),
        None => error(StatusCode::SERVICE_UNAVAILABLE, "stopped", "the scheduler has stopped"),
    }
}

async fn generate_route(engine: Arc<Engine>, req: Request<Incoming>) -> Response<EngineBody> {
    if !engine.accepting() {
        let code = if engine.is_draining() { "engine_draining" } else { "engine_not_ready" };
        ::metrics::counter!(crate::metrics::REFUSALS, "reason" => code).increment(1);
        return error(StatusCode::SERVICE_UNAVAILABLE, code, "engine is not taking new work");
    }
    // The gateway's attempt span, when it traces the request.
    let trace = telemetry::enabled().then(|| telemetry::extract(req.headers()));
    let gen: GenerateRequest = match read_json(req).await {
        Ok(g) => g,
        Err(resp) => return resp,
    };
    if let Err(message) = gen.validate() {
        return error(StatusCode::BAD_REQUEST, "invalid_request", &message);
    }
    let prompt_tokens = policies::tokens::count(&gen.prompt);
    let request_id = gen.request_id.clone();
    // Unbounded: the scheduler must never wait on one slow client; a
    // sequence's backlog is bounded by its max_tokens.
    let (tx, rx) = mpsc::unbounded_channel();
    ::metrics::counter!(crate::metrics::GENERATE_REQUESTS).increment(1);
    if let Err(e) = engine.scheduler.enqueue_traced(gen, prompt_tokens, tx, trace).await {
        ::metrics::counter!(crate::metrics::REFUSALS, "reason" => e.code()).increment(1);
        return error(StatusCode::SERVICE_UNAVAILABLE, e.code(), &e.to_string());
    }
    tracing::debug!(event = "sequence_admitted", request_id = %request_id, prompt_tokens);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, api::NDJSON)
        .body(Either::Right(ChannelBody::new(rx, api::is_terminal_line)))
        .expect("static response parts are valid")
}
