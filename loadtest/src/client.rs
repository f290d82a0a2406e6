//! A small HTTP client for the gateway (TLS, HTTP/2 or HTTP/1.1 by ALPN) and
//! for engines (HTTP/2 cleartext with prior knowledge).
//!
//! One [`Conn`] is one connection. Over HTTP/2 it multiplexes: clone it and
//! send from many tasks. Over HTTP/1.1, requests on one `Conn` queue.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Which HTTP version to ask the gateway for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    /// HTTP/2 (ALPN `h2`; prior knowledge for `http://`).
    H2,
    /// HTTP/1.1 (ALPN `http/1.1`).
    Http1,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad URL {0}: {1}")]
    Url(String, String),
    #[error("reading CA {0}: {1}")]
    Ca(String, String),
    #[error("connecting to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS handshake with {0}: {1}")]
    Tls(String, std::io::Error),
    #[error("server chose ALPN {0:?}, expected {1:?}")]
    Alpn(Option<String>, Proto),
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

#[derive(Debug, Clone)]
enum Sender {
    H2(http2::SendRequest<Full<Bytes>>),
    H1(Arc<tokio::sync::Mutex<http1::SendRequest<Full<Bytes>>>>),
}

/// One open connection.
#[derive(Debug, Clone)]
pub struct Conn {
    sender: Sender,
    base: Uri,
}

impl Conn {
    /// Connects to `base` (`https://host:port` or `http://host:port`).
    /// `ca` is the PEM file of the CA to trust for `https`.
    pub async fn connect(base: &str, ca: Option<&Path>, proto: Proto) -> Result<Self, ClientError> {
        let uri: Uri =
            base.parse().map_err(|e: http::uri::InvalidUri| ClientError::Url(base.into(), e.to_string()))?;
        let host = uri.host().ok_or_else(|| ClientError::Url(base.into(), "no host".into()))?.to_string();
        let tls = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let addr = format!("{}:{port}", host.trim_start_matches('[').trim_end_matches(']'));
        let addr: SocketAddr = match addr.parse() {
            Ok(a) => a,
            Err(_) => tokio::net::lookup_host(&addr)
                .await
                .map_err(|e| ClientError::Connect(addr.clone(), e))?
                .next()
                .ok_or_else(|| ClientError::Url(base.into(), "host did not resolve".into()))?,
        };
        let tcp = TcpStream::connect(addr).await.map_err(|e| ClientError::Connect(addr.to_string(), e))?;
        let _ = tcp.set_nodelay(true);
        let sender = if tls {
            let connector = tls_connector(ca, proto)?;
            let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
                .map_err(|e| ClientError::Url(base.into(), e.to_string()))?;
            let stream =
                connector.connect(name, tcp).await.map_err(|e| ClientError::Tls(addr.to_string(), e))?;
            let alpn = stream.get_ref().1.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned());
            let want = if proto == Proto::H2 { "h2" } else { "http/1.1" };
            if alpn.as_deref() != Some(want) {
                return Err(ClientError::Alpn(alpn, proto));
            }
            handshake(TokioIo::new(stream), proto).await?
        } else {
            handshake(TokioIo::new(tcp), proto).await?
        };
        Ok(Self { sender, base: uri })
    }

    /// Whether the connection can take no more requests (closed, or the
    /// server sent GOAWAY).
    pub fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H2(s) => s.is_closed(),
            Sender::H1(s) => s.try_lock().is_ok_and(|s| s.is_closed()),
        }
    }

    /// Sends a request for `path` on this connection.
    pub async fn send(&self, mut req: Request<Full<Bytes>>) -> Result<Response<Incoming>, ClientError> {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        match &self.sender {
            Sender::H2(s) => {
                let mut parts = self.base.clone().into_parts();
                parts.path_and_query = Some(path.parse().expect("a path taken from a valid URI"));
                *req.uri_mut() = Uri::from_parts(parts).expect("base URI has scheme and authority");
                Ok(s.clone().send_request(req).await?)
            }
            Sender::H1(s) => {
                *req.uri_mut() = path.parse().expect("a path taken from a valid URI");
                if let Some(a) = self.base.authority() {
                    req.headers_mut().insert(header::HOST, HeaderValue::from_str(a.as_str()).expect("valid"));
                }
                let mut s = s.lock().await;
                s.ready().await?;
                Ok(s.send_request(req).await?)
            }
        }
    }

    /// POSTs a JSON body with optional bearer key.
    pub async fn post_json(
        &self,
        path: &str,
        key: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        self.send(req.body(Full::new(body.into())).expect("valid request parts")).await
    }

    /// GETs `path` with optional bearer key.
    pub async fn get(&self, path: &str, key: Option<&str>) -> Result<Response<Incoming>, ClientError> {
        let mut req = Request::get(path);
        if let Some(k) = key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        self.send(req.body(Full::new(Bytes::new())).expect("valid request parts")).await
    }
}

/// Reads a whole body.
pub async fn body_bytes(resp: Response<Incoming>) -> Result<Bytes, ClientError> {
    Ok(resp.into_body().collect().await?.to_bytes())
}

pub(crate) fn tls_connector(ca: Option<&Path>, proto: Proto) -> Result<TlsConnector, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        let shown = ca.display().to_string();
        for cert in
            CertificateDer::pem_file_iter(ca).map_err(|e| ClientError::Ca(shown.clone(), e.to_string()))?
        {
            let cert = cert.map_err(|e| ClientError::Ca(shown.clone(), e.to_string()))?;
            roots.add(cert).map_err(|e| ClientError::Ca(shown.clone(), e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Ca("-".into(), e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![if proto == Proto::H2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    Ok(TlsConnector::from(Arc::new(config)))
}

async fn handshake<T>(io: TokioIo<T>, proto: Proto) -> Result<Sender, ClientError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    match proto {
        Proto::H2 => {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H2(sender))
        }
        Proto::Http1 => {
            let (sender, conn) = http1::handshake(io).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H1(Arc::new(tokio::sync::Mutex::new(sender))))
        }
    }
}
