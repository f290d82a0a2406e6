//! `loadtest sink`: a trivial streaming endpoint that answers at once, for
//! measuring the harness itself (how fast it can send and read streams when
//! the target costs nothing). Speaks both wire formats the harness does:
//! `POST /v1/completions` → SSE with N one-token chunks, a usage chunk and
//! `[DONE]`; `POST /engine/v1/generate` → N NDJSON token lines and `done`.
//! TLS (ALPN h2, http/1.1) when given a certificate, else HTTP/2 cleartext
//! or HTTP/1.1 by prior knowledge.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

/// Options of `loadtest sink`.
#[derive(Debug, Clone, clap::Args)]
pub struct SinkArgs {
    /// Address to listen on (loopback).
    #[arg(long, default_value = "127.0.0.1:9443")]
    pub listen: SocketAddr,
    /// Certificate chain (PEM); with --cert-key, serve TLS.
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) for --cert.
    #[arg(long)]
    pub cert_key: Option<PathBuf>,
    /// Tokens per response.
    #[arg(long, default_value_t = 4)]
    pub tokens: u32,
}

/// Serves until the process ends. Prints `listening on ADDR` once bound.
pub async fn serve(args: SinkArgs) -> Result<(), String> {
    let tls = match (&args.cert, &args.cert_key) {
        (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
        (None, None) => None,
        _ => return Err("--cert and --cert-key go together".into()),
    };
    let listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("binding {}: {e}", args.listen))?;
    println!("listening on {}", listener.local_addr().map_err(|e| e.to_string())?);
    let bodies = Arc::new(Bodies::new(args.tokens));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(4096);
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let _ = tcp.set_nodelay(true);
        let (tls, builder, bodies) = (tls.clone(), builder.clone(), bodies.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| answer(bodies.clone(), req));
            let _ = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(s) => builder.serve_connection(TokioIo::new(s), svc).await,
                    Err(_) => return,
                },
                None => builder.serve_connection(TokioIo::new(tcp), svc).await,
            };
        });
    }
}

/// Response bodies, built once.
struct Bodies {
    sse: Bytes,
    ndjson: Bytes,
}

impl Bodies {
    fn new(tokens: u32) -> Self {
        let mut sse = String::new();
        let mut ndjson = String::new();
        for _ in 0..tokens {
            sse.push_str("data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" tok\",\"finish_reason\":null}]}\n\n");
            ndjson.push_str("{\"event\":\"token\",\"text\":\" tok\"}\n");
        }
        sse.push_str(&format!(
            "data: {{\"object\":\"text_completion\",\"choices\":[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
        ));
        ndjson.push_str(&format!(
            "{{\"event\":\"done\",\"finish_reason\":\"length\",\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{tokens}}},\"queue_ms\":0,\"prefill_ms\":0}}\n"
        ));
        Self { sse: sse.into(), ndjson: ndjson.into() }
    }
}

async fn answer(bodies: Arc<Bodies>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    // Read the request like a real server would before answering.
    let _ = req.into_body().collect().await;
    let (ctype, body) = match path.as_str() {
        "/v1/completions" => ("text/event-stream", bodies.sse.clone()),
        "/engine/v1/generate" => ("application/x-ndjson", bodies.ndjson.clone()),
        _ => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"{\"error\":{\"code\":\"not_found\"}}")));
            *r.status_mut() = StatusCode::NOT_FOUND;
            return Ok(r);
        }
    };
    let mut r = Response::new(Full::new(body));
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ctype));
    Ok(r)
}

fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
