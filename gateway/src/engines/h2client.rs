//! The request connections to this project's engines: HTTP/2 with prior
//! knowledge, driven with the `h2` crate directly.
//!
//! Why not hyper's client here (it still serves probes and `openai`
//! upstreams): h2 gives a stream no send capacity until the connection
//! task has opened it, so hyper's client flushes a request's HEADERS on
//! its own and sends the body from a task spawned per request, in a second
//! write; the engine woke twice and could not start before the second
//! arrived (17 µs apart at the median on the bench machine), and every
//! request cost two extra tasks (body pipe, response forwarding) and a
//! channel hop. Here the body is queued on the stream before the
//! connection task runs, so HEADERS and DATA leave in one write, and the
//! caller's task polls the response itself.
//!
//! Bounds: one connection per engine address per client (a map entry per
//! address; when a new address is first used, entries whose connection has
//! closed and that no request holds are dropped, so the map follows the
//! engines alive, not every engine an autoscaled fleet ever had), opened
//! once at a time
//! (concurrent callers wait for the same connect, whose time the connector
//! bounds); in-flight streams per connection as the engine's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` allows (callers wait for a free one);
//! `max_reset_streams` cancelled streams remembered per connection; a
//! keepalive PING every `keepalive.interval`, and a connection whose PING
//! is not answered within `keepalive.timeout` is dropped, failing its
//! streams (a hung, stopped or partitioned engine). A request whose
//! connection turned out closed before it was sent (engine restarted,
//! GOAWAY) is sent once more on a new connection.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper_util::rt::TokioIo;
use tower::ServiceExt;

use super::connect::EngineConnector;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A stream's receive window: an engine's response (a video chunk's frames
/// included) flows without waiting for WINDOW_UPDATEs (hyper's default).
const STREAM_WINDOW: u32 = 2 << 20;
/// The connection's receive window (hyper's default).
const CONN_WINDOW: u32 = 5 << 20;

/// Connection settings.
#[derive(Debug, Clone, Copy)]
pub struct H2Settings {
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Recently cancelled streams remembered (frames for them in flight
    /// are not connection errors).
    pub max_reset_streams: usize,
}

/// One live connection: its request handle, and whether its task ended.
#[derive(Clone)]
struct Conn {
    send: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

/// The connection to one engine address.
#[derive(Default)]
struct Entry {
    live: Mutex<Option<Conn>>,
    /// Held while connecting: one connect at a time per address.
    connecting: tokio::sync::Mutex<()>,
}

impl Entry {
    fn live(&self) -> Option<SendRequest<Bytes>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().filter(|c| !c.closed.load(Ordering::Acquire)).map(|c| c.send.clone())
    }

    fn forget(&self) {
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether its connection is gone (closed, or never opened / forgotten).
    fn dead(&self) -> bool {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().is_none_or(|c| c.closed.load(Ordering::Acquire))
    }
}

/// An HTTP/2 client for engine requests (see the module docs).
pub struct H2Client {
    connector: EngineConnector,
    settings: H2Settings,
    /// By engine address.
    entries: Mutex<HashMap<(Scheme, Authority), Arc<Entry>>>,
}

impl std::fmt::Debug for H2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Client").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl H2Client {
    pub fn new(connector: EngineConnector, settings: H2Settings) -> Self {
        Self { connector, settings, entries: Mutex::new(HashMap::new()) }
    }

    /// Sends `req` (an absolute URI) and waits for the response head.
    pub async fn request(&self, req: Request<Bytes>) -> Result<Response<H2Body>, BoxError> {
        let (parts, body) = req.into_parts();
        let entry = self.entry(&parts.uri)?;
        let mut retried = false;
        loop {
            let head = {
                let mut r = Request::new(());
                *r.method_mut() = parts.method.clone();
                *r.uri_mut() = parts.uri.clone();
                *r.headers_mut() = parts.headers.clone();
                r
            };
            let send = self.connection(&entry, &parts.uri).await?;
            match send_on(send, head, body.clone()).await {
                Ok(resp) => return Ok(resp),
                // Not sent (the connection had closed or is going away):
                // once more, on a new connection.
                Err(Attempt::NotSent(e)) if !retried => {
                    tracing::debug!(event = "engine_connection_closed", error = %e, "retrying on a new connection");
                    entry.forget();
                    retried = true;
                }
                Err(Attempt::NotSent(e) | Attempt::Failed(e)) => return Err(e.into()),
            }
        }
    }

    fn entry(&self, uri: &Uri) -> Result<Arc<Entry>, BoxError> {
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return Err(format!("not an absolute URI: {uri}").into());
        };
        let key = (scheme.clone(), authority.clone()); // reference counts, no copy
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get(&key) {
            return Ok(Arc::clone(e));
        }
        // A new address (an engine started): drop the entries of engines
        // that are gone, with their closed connection's state.
        entries.retain(|_, e| Arc::strong_count(e) > 1 || !e.dead());
        Ok(Arc::clone(entries.entry(key).or_default()))
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The address's live connection, or a new one.
    async fn connection(&self, entry: &Entry, uri: &Uri) -> Result<SendRequest<Bytes>, BoxError> {
        if let Some(send) = entry.live() {
            return Ok(send);
        }
        let _one = entry.connecting.lock().await;
        if let Some(send) = entry.live() {
            return Ok(send); // another caller connected meanwhile
        }
        let conn = self.connect(uri).await?;
        let send = conn.send.clone();
        *entry.live.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        Ok(send)
    }

    async fn connect(&self, uri: &Uri) -> Result<Conn, BoxError> {
        let io = self.connector.clone().oneshot(uri.clone()).await?;
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONN_WINDOW)
            .max_concurrent_reset_streams(self.settings.max_reset_streams)
            .handshake::<_, Bytes>(TokioIo::new(io))
            .await?;
        let closed = Arc::new(AtomicBool::new(false));
        let ping = connection.ping_pong().expect("a new connection's ping_pong is there to take");
        tokio::spawn(drive(connection, ping, self.settings, Arc::clone(&closed)));
        Ok(Conn { send, closed })
    }
}

/// Why one attempt failed.
enum Attempt {
    /// Before the engine could have seen the request: safe to send again.
    NotSent(h2::Error),
    Failed(h2::Error),
}

async fn send_on(
    send: SendRequest<Bytes>,
    head: Request<()>,
    body: Bytes,
) -> Result<Response<H2Body>, Attempt> {
    // Waits while the engine's stream limit is reached.
    let mut send = send.ready().await.map_err(Attempt::NotSent)?;
    let (response, mut stream) = send.send_request(head, body.is_empty()).map_err(Attempt::NotSent)?;
    if !body.is_empty() {
        // Queued before the connection task opens the stream: HEADERS and
        // DATA leave in the same write.
        stream.send_data(body, true).map_err(Attempt::Failed)?;
    }
    let response = response.await.map_err(|e| match e.reason() {
        Some(h2::Reason::REFUSED_STREAM) => Attempt::NotSent(e), // the engine did not process it
        _ if e.is_go_away() && e.is_remote() => Attempt::NotSent(e),
        _ => Attempt::Failed(e),
    })?;
    Ok(response.map(|recv| H2Body { recv }))
}

/// Drives one connection and its keepalive until either ends; dropping the
/// connection fails every stream still on it.
async fn drive(
    connection: h2::client::Connection<TokioIo<super::connect::EngineIo>, Bytes>,
    mut ping: h2::PingPong,
    settings: H2Settings,
    closed: Arc<AtomicBool>,
) {
    let keepalive = async {
        loop {
            tokio::time::sleep(settings.keepalive_interval).await;
            match tokio::time::timeout(settings.keepalive_timeout, ping.ping(h2::Ping::opaque())).await {
                Ok(Ok(_pong)) => {}
                Ok(Err(e)) => return e.to_string(),
                Err(_) => return format!("no PING answer within {:?}", settings.keepalive_timeout),
            }
        }
    };
    tokio::select! {
        ended = connection => {
            if let Err(e) = ended {
                tracing::debug!(event = "engine_connection_error", error = %e);
            }
        }
        why = keepalive => tracing::warn!(event = "engine_connection_dropped", why = %why),
    }
    closed.store(true, Ordering::Release);
}

/// An engine response's body; the window it used is handed back as each
/// frame is taken (so a reader that stops reading stops the engine's flow).
#[derive(Debug)]
pub struct H2Body {
    recv: h2::RecvStream,
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let recv = &mut self.get_mut().recv;
        match std::task::ready!(recv.poll_data(cx)) {
            Some(Ok(data)) => {
                let _ = recv.flow_control().release_capacity(data.len());
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => Poll::Ready(
                std::task::ready!(recv.poll_trailers(cx)).transpose().map(|t| t.map(Frame::trailers)),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)] // wall-clock bounds on real sockets
    use super::*;
    use http_body_util::BodyExt;
    use tokio::net::TcpListener;

    fn client(interval_ms: u64, timeout_ms: u64) -> H2Client {
        let settings = H2Settings {
            keepalive_interval: Duration::from_millis(interval_ms),
            keepalive_timeout: Duration::from_millis(timeout_ms),
            max_reset_streams: 16,
        };
        H2Client::new(EngineConnector::tcp(Duration::from_secs(1)), settings)
    }

    fn post(addr: std::net::SocketAddr, body: &'static [u8]) -> Request<Bytes> {
        Request::post(format!("http://{addr}/engine/v1/generate")).body(Bytes::from_static(body)).unwrap()
    }

    /// Answers one request on `conn` with `text`, echoing the body it got
    /// after it.
    async fn answer(conn: &mut h2::server::Connection<tokio::net::TcpStream, Bytes>, text: &str) {
        let (req, mut respond) = conn.accept().await.unwrap().unwrap();
        let mut body = req.into_body();
        let mut got = Vec::new();
        while let Some(data) = body.data().await {
            got.extend_from_slice(&data.unwrap());
        }
        let mut send = respond.send_response(Response::new(()), false).unwrap();
        send.send_data(Bytes::from(format!("{text} {}", String::from_utf8_lossy(&got))), true).unwrap();
    }

    #[tokio::test]
    async fn requests_share_one_connection_and_a_closed_one_is_replaced() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let engine = tokio::spawn(async move {
            // The first connection answers two requests, then goes away
            // (an engine restarting: GOAWAY, then the socket closes).
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            answer(&mut conn, "one").await;
            answer(&mut conn, "two").await;
            conn.graceful_shutdown();
            while conn.accept().await.is_some() {}
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            answer(&mut conn, "three").await;
            while conn.accept().await.is_some() {}
        });
        let c = client(10_000, 10_000);
        for (want, body) in [("one", &b"a"[..]), ("two", b"b")] {
            let resp = c.request(post(addr, body)).await.unwrap();
            let got = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(got, format!("{want} {}", String::from_utf8_lossy(body)).as_bytes());
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // the GOAWAY arrives
        let resp = c.request(post(addr, b"c")).await.unwrap();
        assert_eq!(resp.into_body().collect().await.unwrap().to_bytes().as_ref(), b"three c");
        drop(c);
        tokio::time::timeout(Duration::from_secs(5), engine).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_entries_of_engines_that_are_gone_are_dropped_when_a_new_one_is_used() {
        // Engines on three addresses in turn, each answering one request
        // and then going away (an autoscaled fleet replacing engines).
        let c = client(10_000, 10_000);
        for round in 0..3 {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let engine = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut conn = h2::server::handshake(tcp).await.unwrap();
                answer(&mut conn, "ok").await;
                // Gone: GOAWAY once the answer is out, then the socket closes.
                conn.graceful_shutdown();
                while conn.accept().await.is_some() {}
            });
            let resp = c.request(post(addr, b"x")).await.unwrap();
            assert_eq!(resp.into_body().collect().await.unwrap().to_bytes().as_ref(), b"ok x");
            assert_eq!(c.addresses(), 1, "round {round}: only the live engine's entry");
            tokio::time::timeout(Duration::from_secs(5), engine).await.unwrap().unwrap();
            // The connection task sees the close.
            let t0 = std::time::Instant::now();
            while !c.entries.lock().unwrap().values().all(|e| e.dead()) {
                assert!(t0.elapsed() < Duration::from_secs(5), "the closed connection is noticed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    #[tokio::test]
    async fn an_engine_that_stops_answering_pings_fails_its_streams_within_the_keepalive_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            // Takes the request, then stops: no answer, no PONG (a hung
            // or SIGSTOPped engine whose socket stays open).
            let request = conn.accept().await.unwrap().unwrap();
            let _ = held_tx.send((conn, request));
        });
        let c = client(100, 200);
        let t0 = std::time::Instant::now();
        let failed = tokio::time::timeout(Duration::from_secs(5), c.request(post(addr, b"{}"))).await;
        let took = t0.elapsed();
        assert!(failed.expect("the request fails instead of hanging").is_err());
        assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(2), "{took:?}");
        let _held = held_rx.await.unwrap();
    }
}
