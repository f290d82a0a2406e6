//! Readiness and load of `openai` engines (vLLM, SGLang, TGI, llama.cpp
//! server, any OpenAI-compatible server), as the load report admission
//! reads: `/health` (a `generic` server: `/v1/models`) for readiness, the
//! flavour's `/metrics` gauges ([`telemetry`]) for its load, combined with
//! the gateway's own count of what it sent there.
//!
//! What the gateway cannot know about a third-party engine it does not
//! invent: without `upstream.kv_tokens` there is no KV headroom check;
//! without a metrics endpoint (`generic`, or a scrape that fails) the
//! engine's own queue is unknown and the gateway's counts stand alone;
//! without `upstream.profile` the estimator starts from
//! `policies/profiles/external-default.toml` and learns online.

use bytes::Bytes;
use engine_api::LoadReport;
use http_body_util::{BodyExt, Full, Limited};
use policies::LatencyProfile;

use super::telemetry::{self, Flavour, Telemetry};
use super::{join, EnginePool, EngineSlot, EngineSpec};

/// Idle keep-alive connections kept per upstream.
pub(super) const MAX_IDLE_PER_UPSTREAM: usize = 64;
/// Longest `/health` or `/v1/models` answer read.
const MAX_LISTING_BYTES: usize = 1 << 20;
/// Models kept from one listing.
const MAX_MODELS: usize = 1024;

/// The ids of an OpenAI model listing (`{"data": [{"id": …}, …]}`).
fn model_ids(body: &[u8]) -> Option<Vec<String>> {
    let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    let data = doc.get("data")?.as_array()?;
    Some(data.iter().filter_map(|m| m.get("id")?.as_str().map(str::to_string)).take(MAX_MODELS).collect())
}

/// Requests an upstream runs at once when its config does not say.
pub const DEFAULT_MAX_BATCH: u32 = 8;
/// Tokens per page of the KV accounting derived from `kv_tokens`.
const PAGE_TOKENS: u32 = 16;
const DEFAULT_PROFILE: &str = include_str!("../../../policies/profiles/external-default.toml");

impl EnginePool {
    /// The upstream's state as a load report; `None` if it does not answer.
    pub(super) async fn external_report(&self, slot: &EngineSlot) -> Option<LoadReport> {
        let flavour = slot.spec.upstream.flavour;
        let health = if flavour == Flavour::Generic { "/v1/models" } else { "/health" };
        let (status, listing) = self.upstream_get(slot, health, MAX_LISTING_BYTES).await?;
        let mut ready = status.is_success();
        if slot.spec.upstream.discover_models && slot.spec.upstream.models.is_empty() {
            let listing = match flavour {
                Flavour::Generic => Some((status, listing)),
                _ => self.upstream_get(slot, "/v1/models", MAX_LISTING_BYTES).await,
            };
            match listing.filter(|(s, _)| s.is_success()).and_then(|(_, body)| model_ids(&body)) {
                Some(ids) => slot.discovered_models.store(Some(std::sync::Arc::new(ids))),
                None => ready = false, // cannot tell what it serves
            }
        }
        let seen = match flavour.has_metrics() {
            true => match self.upstream_get(slot, "/metrics", telemetry::MAX_EXPOSITION_BYTES).await {
                Some((s, text)) if s.is_success() => flavour.read(&String::from_utf8_lossy(&text)),
                _ => Telemetry::default(),
            },
            false => Telemetry::default(),
        };
        Some(report(&slot.spec, ready, seen, slot.active()))
    }

    async fn upstream_get(
        &self,
        slot: &EngineSlot,
        path: &str,
        limit: usize,
    ) -> Option<(http::StatusCode, Bytes)> {
        let uri = join(&slot.spec.url, path)?;
        let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        let resp = self.upstream_send(req, slot).await.ok()?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), limit).collect().await.ok()?.to_bytes();
        Some((status, body))
    }

    /// Sends `req` to an `openai` engine with its own key (never the
    /// engines' API token).
    pub(super) fn upstream_send(
        &self,
        mut req: http::Request<Full<Bytes>>,
        slot: &EngineSlot,
    ) -> hyper_util::client::legacy::ResponseFuture {
        if let Some(key) = slot.upstream_key() {
            req.headers_mut().insert(http::header::AUTHORIZATION, key.clone());
        }
        self.upstream_client.request(req)
    }
}

/// The load report of an upstream that is `ready`, whose metrics said
/// `seen`, to which this gateway has `ours` requests open. Requests the
/// upstream runs or queues beyond ours (other clients, other gateways)
/// take its batch slots first.
pub(super) fn report(spec: &EngineSpec, ready: bool, seen: Telemetry, ours: u32) -> LoadReport {
    let up = &spec.upstream;
    let max_batch = up.max_batch.unwrap_or(DEFAULT_MAX_BATCH).max(1);
    let running = seen.running.unwrap_or(0.0);
    let waiting = seen.waiting.unwrap_or(0.0);
    let foreign = ((running + waiting) - f64::from(ours)).max(0.0).min(f64::from(u32::MAX)) as u32;
    let (page_tokens, total, free) = match (up.kv_tokens, seen.kv_usage) {
        (Some(tokens), Some(used)) => {
            let total = u32::try_from(tokens / u64::from(PAGE_TOKENS)).unwrap_or(u32::MAX);
            (PAGE_TOKENS, total, (f64::from(total) * (1.0 - used)) as u32)
        }
        _ => (0, 0, 0), // unknown capacity: no KV check
    };
    LoadReport {
        engine_id: spec.id.clone(),
        backend: "external".into(),
        engine_class: format!("{:?}", up.flavour).to_lowercase(),
        ready,
        queued_sequences: waiting as u32,
        inflight_sequences: running as u32,
        kv_pages_free: free,
        kv_pages_total: total,
        kv_admitting: true,
        kv_page_tokens: page_tokens,
        batch_target: max_batch.saturating_sub(foreign).max(1),
        batch_achieved: running.max(1.0),
        ..Default::default()
    }
}

/// The profile an upstream starts from: its configured file, else the
/// bundled default.
pub(super) fn profile(spec: &EngineSpec) -> Option<LatencyProfile> {
    let (name, text) = match &spec.upstream.profile {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => (path.display().to_string(), t),
            Err(e) => {
                tracing::warn!(event = "engine_profile_unreadable", engine = %spec.id, path = %path.display(), error = %e);
                ("external-default".to_string(), DEFAULT_PROFILE.to_string())
            }
        },
        None => ("external-default".to_string(), DEFAULT_PROFILE.to_string()),
    };
    match LatencyProfile::parse(&name, &text) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(event = "engine_profile_invalid", engine = %spec.id, error = %e);
            LatencyProfile::parse("external-default", DEFAULT_PROFILE).ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{EngineKind, Upstream};

    fn spec(up: Upstream) -> EngineSpec {
        EngineSpec {
            kind: EngineKind::Openai,
            upstream: up,
            ..EngineSpec::native("u0", "http://u0:8080".parse().unwrap())
        }
    }

    #[test]
    fn foreign_load_takes_batch_slots_first() {
        let s = spec(Upstream { flavour: Flavour::Llamacpp, max_batch: Some(4), ..Default::default() });
        let seen = Telemetry { running: Some(3.0), waiting: Some(1.0), kv_usage: None };
        let ours_all = report(&s, true, seen, 4);
        assert_eq!(ours_all.batch_target, 4, "all four are ours: the slots are ours to count");
        let ours_one = report(&s, true, seen, 1);
        assert_eq!(ours_one.batch_target, 1, "three foreign requests leave one slot");
        assert_eq!(report(&s, true, Telemetry { running: Some(9.0), ..seen }, 0).batch_target, 1, "never 0");
        assert_eq!((ours_one.inflight_sequences, ours_one.queued_sequences), (3, 1));
        assert_eq!(ours_one.kv_page_tokens, 0, "no kv_tokens: no KV check");
    }

    #[test]
    fn kv_usage_with_a_known_capacity_is_headroom() {
        let s = spec(Upstream { flavour: Flavour::Vllm, kv_tokens: Some(16_000), ..Default::default() });
        let r = report(&s, true, Telemetry { kv_usage: Some(0.75), ..Default::default() }, 0);
        assert_eq!((r.kv_page_tokens, r.kv_pages_total, r.kv_pages_free), (16, 1000, 250));
        assert_eq!(r.batch_target, DEFAULT_MAX_BATCH);
    }

    #[test]
    fn engine_entries_parse_and_what_cannot_work_is_refused() {
        #[derive(serde::Deserialize)]
        struct Doc {
            engines: Vec<EngineSpec>,
        }
        let doc: Doc = toml::from_str(
            r#"
            [[engines]]
            id = "llama"
            url = "http://10.0.0.7:8080"
            kind = "openai"
            upstream = { flavour = "llamacpp", max_batch = 4, served_model = "qwen", api_key_env = "LLAMA_KEY" }
            [[engines]]
            id = "e0"
            url = "http://127.0.0.1:9000"
            "#,
        )
        .unwrap();
        let (llama, native) = (&doc.engines[0], &doc.engines[1]);
        assert_eq!(llama.kind, EngineKind::Openai);
        assert_eq!(llama.upstream.flavour, Flavour::Llamacpp);
        assert_eq!(
            (llama.upstream.max_batch, llama.upstream.served_model.as_deref()),
            (Some(4), Some("qwen"))
        );
        assert_eq!((native.kind, native.validate()), (EngineKind::Native, Ok(())));
        assert_eq!(llama.validate(), Ok(()));
        let tls = EngineSpec { url: "https://10.0.0.7".parse().unwrap(), ..llama.clone() };
        assert_eq!(tls.validate(), Ok(()), "TLS to an upstream");
        let ftp = EngineSpec { url: "ftp://10.0.0.7".parse().unwrap(), ..llama.clone() };
        assert!(ftp.validate().unwrap_err().contains("http:// or https://"));
        let native_tls = EngineSpec { url: "https://10.0.0.7".parse().unwrap(), ..native.clone() };
        assert!(native_tls.validate().unwrap_err().contains("over http://"));
        let confused = EngineSpec { kind: EngineKind::Native, ..llama.clone() };
        assert!(confused.validate().unwrap_err().contains("kind = \"openai\""));
        let typo =
            toml::from_str::<Doc>("[[engines]]\nid='x'\nurl='http://x'\nupstream = { flavor = 'vllm' }");
        assert!(typo.is_err(), "an unknown upstream key is refused");
    }

    /// An OpenAI-compatible server over TLS on loopback (rustls, the dev
    /// PKI's certificate for localhost): `/health`, `/metrics`, and a chat
    /// stream of one token.
    async fn tls_upstream(dir: &std::path::Path) -> (u16, std::path::PathBuf) {
        let pki = crate::certs::generate(dir).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(
            crate::tls::server_config(&pki.server_cert, &pki.server_key).unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(tls) = acceptor.accept(tcp).await else { continue };
                let service =
                    hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                        let body = match req.uri().path() {
                            "/health" => "{\"status\":\"ok\"}".to_string(),
                            "/metrics" => {
                                "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n".to_string()
                            }
                            _ => "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
                                .to_string(),
                        };
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(body))))
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service),
                );
            }
        });
        (port, pki.ca_cert)
    }

    #[tokio::test]
    async fn an_https_upstream_is_reached_trusting_its_ca_and_refused_without_it() {
        let dir = std::env::temp_dir().join(format!("upstream-tls-{}", std::process::id()));
        let (port, ca) = tls_upstream(&dir).await;
        let https = |ca: Option<std::path::PathBuf>| {
            let up = Upstream { flavour: Flavour::Llamacpp, ca, ..Default::default() };
            EngineSpec { url: format!("https://localhost:{port}").parse().unwrap(), ..spec(up) }
        };
        assert_eq!(https(None).validate(), Ok(()));
        let pool = EnginePool::new(vec![https(Some(ca))], &crate::limits::Limits::default(), None);
        pool.poll_once().await;
        let slot = pool.slot(0);
        assert!(slot.is_ready(), "probed over TLS");
        assert_eq!(slot.report().unwrap().inflight_sequences, 1, "its metrics read over TLS");
        let req = http::Request::post(format!("https://localhost:{port}/v1/chat/completions"))
            .body(Bytes::from_static(b"{}"))
            .unwrap();
        let resp = pool.send(req, &slot).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"data: "), "{body:?}");
        // Without the CA (the system's roots do not know the dev CA), the
        // handshake fails and the upstream never becomes ready.
        let untrusted = EnginePool::new(vec![https(None)], &crate::limits::Limits::default(), None);
        untrusted.poll_once().await;
        assert!(!untrusted.slot(0).is_ready());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn model_listings_are_read_bounded() {
        let ids = model_ids(br#"{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"},{"x":1}]}"#);
        assert_eq!(ids, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(model_ids(b"not json"), None);
        assert_eq!(model_ids(br#"{"data":{}}"#), None);
        let many = format!(r#"{{"data":[{}]}}"#, vec![r#"{"id":"m"}"#; MAX_MODELS + 5].join(","));
        assert_eq!(model_ids(many.as_bytes()).unwrap().len(), MAX_MODELS);
    }

    #[test]
    fn a_missing_or_broken_profile_falls_back_to_the_default() {
        let s = spec(Upstream { profile: Some("/nonexistent/profile.toml".into()), ..Default::default() });
        assert_eq!(profile(&s).unwrap().engine_class, "external");
    }
}
