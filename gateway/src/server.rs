//! An HTTPS listener: TCP accept, TLS handshake, HTTP/1.1 or HTTP/2 by
//! ALPN, graceful shutdown. The public listener serves
//! [`service::handle`](crate::service::handle), the admin listener
//! [`admin::handle`](crate::admin::handle).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::body::GatewayBody;

/// A client that does not finish its TLS handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections get this long to finish after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `handler` on `listener` until `shutdown` resolves, then lets open
/// connections finish (bounded by [`DRAIN_TIMEOUT`]).
pub async fn serve<H, F>(
    handler: H,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<GatewayBody>, Infallible>> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .keep_alive_interval(Duration::from_secs(20));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(event = "accept_failed", error = %e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, builder, watcher, handler) =
            (acceptor.clone(), builder.clone(), graceful.watcher(), handler.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(event = "tls_handshake_failed", %peer, error = %e),
                Err(_) => return tracing::debug!(event = "tls_handshake_timeout", %peer),
            };
            let svc = hyper::service::service_fn(handler);
            let conn = builder.serve_connection(TokioIo::new(tls), svc).into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(event = "connection_error", %peer, error = %e);
            }
        });
    }
    tracing::info!(event = "draining_connections", open = graceful.count());
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!(event = "drain_timeout", "connections still open after {DRAIN_TIMEOUT:?}");
    }
}
