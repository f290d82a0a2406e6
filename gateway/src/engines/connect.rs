//! How the engine clients reach an engine: TCP, or (with the `test-util`
//! feature, and in this crate's tests) an in-process scripted engine over
//! an in-memory pipe (`testkit.rs`), so that the request path can be tested
//! in tokio's paused time. Production builds have the TCP arm only.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An in-process way to an engine: a pipe for `uri`, or `None` to use TCP
/// (the testkit's scripted engines).
#[cfg(any(test, feature = "test-util"))]
pub type Dial = std::sync::Arc<dyn Fn(&Uri) -> Option<tokio::io::DuplexStream> + Send + Sync>;

/// The connector of every engine client.
#[derive(Clone)]
pub struct EngineConnector {
    tcp: HttpConnector,
    /// For `https://` engines (third-party upstreams): rustls, ALPN
    /// `http/1.1`, the roots of [`upstream_roots`].
    tls: Option<tokio_rustls::TlsConnector>,
    #[cfg(any(test, feature = "test-util"))]
    dial: Option<Dial>,
}

impl EngineConnector {
    /// TCP with `TCP_NODELAY` and a connect timeout.
    pub fn tcp(connect_timeout: Duration) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.enforce_http(false); // https:// upstreams: TLS on top, below
        Self {
            tcp,
            tls: None,
            #[cfg(any(test, feature = "test-util"))]
            dial: None,
        }
    }

    /// `https://` engines are reached over TLS trusting `roots`.
    pub fn with_tls(mut self, roots: rustls::RootCertStore) -> Self {
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut config = config;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        self.tls = Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)));
        self
    }

    /// Connections that `dial` answers go through its pipe; the rest over
    /// TCP.
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_dial(mut self, dial: Dial) -> Self {
        self.dial = Some(dial);
        self
    }
}

impl std::fmt::Debug for EngineConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineConnector")
    }
}

impl tower::Service<Uri> for EngineConnector {
    type Response = EngineIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<EngineIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        tower::Service::<Uri>::poll_ready(&mut self.tcp, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        #[cfg(any(test, feature = "test-util"))]
        if let Some(pipe) = self.dial.as_ref().and_then(|dial| dial(&uri)) {
            return Box::pin(std::future::ready(Ok(EngineIo::Pipe(TokioIo::new(pipe)))));
        }
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
        let tls = self.tls.clone();
        let connecting = self.tcp.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?;
            if !https {
                return Ok(EngineIo::Tcp(tcp));
            }
            let tls = tls.ok_or("an https engine without TLS roots (engines.upstream.ca)")?;
            let name = rustls_pki_types::ServerName::try_from(host)?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(EngineIo::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// Roots for `https://` upstreams: the system's bundle (Debian's
/// `/etc/ssl/certs/ca-certificates.crt`, when present) and every PEM file
/// in `extra` (an upstream's `ca`). Unreadable files are reported.
pub fn upstream_roots<'a>(
    extra: impl Iterator<Item = &'a std::path::Path>,
) -> Result<rustls::RootCertStore, String> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let system = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
    let mut add = |path: &std::path::Path, required: bool| -> Result<(), String> {
        let certs = match rustls_pki_types::CertificateDer::pem_file_iter(path) {
            Ok(it) => it.collect::<Result<Vec<_>, _>>().map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if required => return Err(format!("{}: {e}", path.display())),
            Err(_) => return Ok(()),
        };
        let (_, bad) = roots.add_parsable_certificates(certs);
        if required && bad > 0 {
            return Err(format!("{}: {bad} certificates are not valid roots", path.display()));
        }
        Ok(())
    };
    add(system, false)?;
    for path in extra {
        add(path, true)?;
    }
    Ok(roots)
}

/// One connection to an engine.
#[derive(Debug)]
pub enum EngineIo {
    Tcp(TokioIo<TcpStream>),
    /// Boxed: a TLS session is a kilobyte, a TCP stream a few words.
    Tls(Box<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>),
    #[cfg(any(test, feature = "test-util"))]
    Pipe(TokioIo<tokio::io::DuplexStream>),
}

/// Forwards a call to whichever stream the connection is.
macro_rules! each {
    ($self:ident, $io:ident => $call:expr) => {
        match $self.get_mut() {
            EngineIo::Tcp($io) => $call,
            EngineIo::Tls($io) => $call,
            #[cfg(any(test, feature = "test-util"))]
            EngineIo::Pipe($io) => $call,
        }
    };
}

impl Connection for EngineIo {
    fn connected(&self) -> Connected {
        match self {
            EngineIo::Tcp(io) => io.connected(),
            EngineIo::Tls(io) => io.inner().get_ref().0.connected(),
            #[cfg(any(test, feature = "test-util"))]
            EngineIo::Pipe(_) => Connected::new(),
        }
    }
}

impl Read for EngineIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        each!(self, io => Pin::new(io).poll_read(cx, buf))
    }
}

impl Write for EngineIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, io => Pin::new(io).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, io => Pin::new(io).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            EngineIo::Tcp(io) => io.is_write_vectored(),
            EngineIo::Tls(io) => io.is_write_vectored(),
            #[cfg(any(test, feature = "test-util"))]
            EngineIo::Pipe(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, io => Pin::new(io).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, io => Pin::new(io).poll_shutdown(cx))
    }
}
