//! An HTTPS listener: TCP accept, TLS handshake, HTTP/1.1 or HTTP/2 by
//! ALPN, bounded connections, idle and header timeouts, graceful shutdown.
//! Without TLS (the opt-in plaintext listener, for a gateway behind a
//! TLS-terminating load balancer) the same listener speaks HTTP/1.1 and
//! h2c (HTTP/2 with prior knowledge), told apart by the connection preface.
//! The public listener serves [`service::handle`](crate::service::handle),
//! the admin listener [`admin::handle`](crate::admin::handle).
//!
//! Bounds (from `[limits]`): at most `max_connections` open connections
//! (past it a new connection is closed at once); the TLS handshake and an
//! HTTP/1.1 request head within `header_read_timeout_ms`; a connection with
//! no request or response stream open for `idle_timeout_ms` is shut down;
//! at most `max_streams_per_connection` HTTP/2 streams per connection, and
//! as many streams reset by the client before we accepted them (a burst of
//! cancellations is normal client behaviour, not an attack, up to that
//! count) before the connection is refused with GOAWAY. A connection whose
//! streams are mostly reset before their answer, or that opens streams
//! faster than `max_new_streams_per_s`, is closed ([`abuse`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::body::GatewayBody;
use crate::limits::Limits;
use crate::metrics;
use crate::outbox::StreamReset;

/// The per-connection abuse watch (the `connguard` crate, shared with the
/// engine's listener).
pub use connguard as abuse;

/// Open connections get this long to finish after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Accept errors (EMFILE: out of file descriptors) back off this long.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The bounds of one listener.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// `public` or `admin`: the metrics label.
    pub name: &'static str,
    pub max_connections: usize,
    pub max_streams: u32,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// New streams per second one connection may open (a burst of
    /// `max_streams`).
    pub max_new_streams_per_s: u32,
}

impl ListenerLimits {
    pub fn public(l: &Limits) -> Self {
        Self {
            name: "public",
            max_connections: l.max_connections,
            max_streams: l.max_streams_per_connection,
            header_read_timeout: l.header_read_timeout(),
            idle_timeout: l.idle_timeout(),
            max_new_streams_per_s: l.max_new_streams_per_s,
        }
    }

    pub fn admin(l: &Limits) -> Self {
        Self { name: "admin", max_connections: l.max_admin_connections, ..Self::public(l) }
    }

    /// The plaintext public listener: the public bounds, its own count.
    pub fn plaintext(l: &Limits) -> Self {
        Self { name: "plaintext", ..Self::public(l) }
    }
}

/// Serves `handler` on `listener` until `shutdown` resolves, then lets open
/// connections finish (bounded by [`DRAIN_TIMEOUT`]). `tls: None` serves
/// plaintext HTTP/1.1 and h2c.
/// With `workers`, each connection runs on the next connection worker
/// (`workers.rs`); without, on this runtime.
pub async fn serve<H, F>(
    handler: H,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ListenerLimits,
    workers: Option<&crate::workers::Workers>,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<GatewayBody>, Infallible>> + Send + 'static,
{
    let acceptor = tls.map(TlsAcceptor::from);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_pending_accept_reset_streams(limits.max_streams as usize)
        .keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(20));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let limits = Arc::new(limits);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(event = "accept_failed", error = %e);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            ::metrics::counter!(metrics::CONNECTIONS_REFUSED, "listener" => limits.name).increment(1);
            tracing::debug!(event = "connection_refused", %peer, why = "max_connections");
            continue; // dropping the socket closes it
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, builder, handler, stop, limits) =
            (acceptor.clone(), builder.clone(), handler.clone(), stop_rx.clone(), Arc::clone(&limits));
        // The socket moves to the worker's reactor.
        let Ok(tcp) = tcp.into_std() else { continue };
        let serve_one = async move {
            let _permit = permit;
            let Ok(tcp) = tokio::net::TcpStream::from_std(tcp) else { return };
            let _open = OpenGauge::new(limits.name);
            let activity = Activity::new();
            let watch =
                abuse::Watch::new(f64::from(limits.max_new_streams_per_s), f64::from(limits.max_streams));
            let reads = connguard::Reads::new();
            let svc = tracked(handler, Arc::clone(&activity), Arc::clone(&watch), Arc::clone(&reads));
            let Some(acceptor) = acceptor else {
                let conn = builder
                    .serve_connection(
                        TokioIo::new(connguard::Fair::new(tcp, reads, connguard::fair::SLICE)),
                        svc,
                    )
                    .into_owned();
                return connection(conn, |c| c.graceful_shutdown(), (activity, watch), stop, &limits, peer)
                    .await;
            };
            let tls = match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(event = "tls_handshake_failed", %peer, error = %e),
                Err(_) => {
                    ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "listener" => limits.name, "why" => "header_timeout")
                        .increment(1);
                    return tracing::debug!(event = "tls_handshake_timeout", %peer);
                }
            };
            // Read a slice a turn (connguard::Fair): a peer flooding frames
            // (rapid reset) does not hold the worker other connections share.
            let conn = builder
                .serve_connection(TokioIo::new(connguard::Fair::new(tls, reads, connguard::fair::SLICE)), svc)
                .into_owned();
            connection(conn, |c| c.graceful_shutdown(), (activity, watch), stop, &limits, peer).await;
        };
        match workers {
            Some(w) => w.spawn(serve_one),
            None => {
                tokio::spawn(serve_one);
            }
        }
    }
    tracing::info!(event = "draining_connections", open = limits.max_connections - slots.available_permits());
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN_TIMEOUT, slots.acquire_many(all)).await.is_err() {
        tracing::warn!(event = "drain_timeout", "connections still open after {DRAIN_TIMEOUT:?}");
    }
}

/// Drives one connection until it ends, shutting it down gracefully when
/// the listener stops or the connection has been idle too long, and
/// closing it at once when its peer turns abusive.
async fn connection<C, E>(
    conn: C,
    shutdown: impl Fn(Pin<&mut C>),
    (activity, watch): (Arc<Activity>, Arc<abuse::Watch>),
    mut stop: watch::Receiver<bool>,
    limits: &ListenerLimits,
    peer: std::net::SocketAddr,
) where
    C: Future<Output = Result<(), E>>,
    E: AsRef<dyn std::error::Error + Send + Sync + 'static> + std::fmt::Display,
{
    tokio::pin!(conn);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    if abuse::h2_calm(e.as_ref()) {
                        let why = abuse::Abuse::H2Calm.label();
                        ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "listener" => limits.name, "why" => why)
                            .increment(1);
                        tracing::warn!(event = "connection_abusive", %peer, why);
                    } else {
                        tracing::debug!(event = "connection_error", %peer, error = %e);
                    }
                }
                return;
            }
            why = watch.tripped() => {
                ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "listener" => limits.name, "why" => why.label())
                    .increment(1);
                tracing::warn!(event = "connection_abusive", %peer, why = why.label());
                return; // dropping the connection closes it
            }
            _ = stop.wait_for(|s| *s), if !shutting_down => {
                shutting_down = true;
                shutdown(conn.as_mut());
            }
            () = activity.idle_for(limits.idle_timeout), if !shutting_down => {
                shutting_down = true;
                ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "listener" => limits.name, "why" => "idle").increment(1);
                tracing::debug!(event = "connection_idle", %peer);
                shutdown(conn.as_mut());
            }
        }
    }
}

/// The open-connections gauge, up while this lives.
struct OpenGauge(&'static str);

impl OpenGauge {
    fn new(name: &'static str) -> Self {
        ::metrics::gauge!(metrics::CONNECTIONS_OPEN, "listener" => name).increment(1.0);
        Self(name)
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        ::metrics::gauge!(metrics::CONNECTIONS_OPEN, "listener" => self.0).decrement(1.0);
    }
}

/// Requests and response streams open on one connection, and since when
/// there have been none.
#[derive(Debug)]
struct Activity {
    open: AtomicUsize,
    idle_since: Mutex<Instant>,
    changed: Notify,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        })
    }

    fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        ActiveGuard(Arc::clone(self))
    }

    fn since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once nothing has been open for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            if self.open.load(Ordering::Acquire) == 0 {
                let since = self.since();
                tokio::select! {
                    () = tokio::time::sleep_until(since + idle) => {
                        if self.open.load(Ordering::Acquire) == 0 && self.since() == since {
                            return;
                        }
                    }
                    () = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// One open request or response stream.
#[derive(Debug)]
struct ActiveGuard(Arc<Activity>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

/// A response body that counts as activity on its connection until it
/// ends, and tells the connection's abuse watch when it ended whole.
#[derive(Debug)]
pub struct TrackedBody {
    inner: GatewayBody,
    _active: ActiveGuard,
    stream: abuse::Stream,
}

impl TrackedBody {
    fn new(inner: GatewayBody, active: ActiveGuard, mut stream: abuse::Stream) -> Self {
        if inner.is_end_stream() {
            stream.finished();
        }
        Self { inner, _active: active, stream }
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = StreamReset;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamReset>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.stream.finished();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `handler` as a hyper service whose requests and responses count as the
/// connection's activity.
fn tracked<H, F>(
    handler: H,
    activity: Arc<Activity>,
    watch: Arc<abuse::Watch>,
    reads: Arc<connguard::Reads>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<TrackedBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<TrackedBody>, Infallible>> + Send + 'static,
> + Clone
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<GatewayBody>, Infallible>> + Send + 'static,
{
    hyper::service::service_fn(move |req| {
        let guard = activity.enter();
        let stream = watch.open();
        // HTTP/2 only: HTTP/1.1 has no resets, and its next read waits for
        // the handler to read the body.
        let mark = (req.version() == http::Version::HTTP_2).then(|| reads.mark());
        let (reads, watch, handler) = (Arc::clone(&reads), Arc::clone(&watch), handler.clone());
        async move {
            // Before any work, wait until the bytes that could carry this
            // stream's reset are read, then yield once: hyper looks for a
            // RST_STREAM each time the handler is pending, so a stream its
            // client reset right after its request (rapid reset) is dropped
            // here, before authentication, admission or an engine sees it.
            if !watch.is_tripped() {
                connguard::settle(&watch, mark.map(|m| (&*reads, m)), std::time::Duration::ZERO).await;
            }
            // A connection already marked abusive gets no more work done.
            if watch.is_tripped() {
                let refused = Response::builder()
                    .status(http::StatusCode::TOO_MANY_REQUESTS)
                    .body(crate::body::full(Bytes::new()))
                    .unwrap_or_default();
                return Ok(refused.map(|inner| TrackedBody::new(inner, guard, stream)));
            }
            let resp = handler(req).await?;
            Ok(resp.map(|inner| TrackedBody::new(inner, guard, stream)))
        }
    })
}
