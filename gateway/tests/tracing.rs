//! Distributed tracing end to end: a real `gateway up` and its engine
//! export OTLP/HTTP (protobuf) to a receiver written here from the OTLP
//! protobuf definitions (`opentelemetry-proto`); one streamed chat
//! completion sent with a client `traceparent` yields one trace: the
//! gateway's server span under the client's span, with auth, admission
//! (decision and reason), queue, engine attempt and relay below it and the
//! first token as an event, and under the attempt the engine's own
//! `engine.generate` with its queue, prefill and decode spans.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use loadtest::client::Proto;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;

/// One received span, with its process's `service.name`.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, String>,
    events: Vec<String>,
    status_code: i32,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// A minimal OTLP/HTTP collector: `POST /v1/traces`, protobuf in and out.
async fn receiver() -> (String, Arc<Mutex<Vec<Got>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let spans = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&spans);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let sink = Arc::clone(&sink);
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let sink = Arc::clone(&sink);
                async move {
                    assert_eq!(req.uri().path(), "/v1/traces");
                    assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let export = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                    let mut got = sink.lock().unwrap();
                    for rs in export.resource_spans {
                        let resource = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
                        let service = resource.get("service.name").cloned().unwrap_or_default();
                        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                            got.push(Got {
                                service: service.clone(),
                                name: span.name,
                                kind: span.kind,
                                trace_id: hex(&span.trace_id),
                                span_id: hex(&span.span_id),
                                parent: hex(&span.parent_span_id),
                                attrs: text(&span.attributes),
                                events: span.events.into_iter().map(|e| e.name).collect(),
                                status_code: span.status.map_or(0, |s| s.code),
                            });
                        }
                    }
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    let resp = http::Response::builder()
                        .header("content-type", "application/x-protobuf")
                        .body(Full::new(Bytes::from(answer)))
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    (url, spans)
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// OTLP span kinds.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

#[tokio::test]
async fn one_request_is_one_trace_across_gateway_and_engine() {
    let (url, spans) = receiver().await;
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let sys = System::start_with_env(&paced(5, 2), 1, &[], None, &env).await;
    let conn = sys.conn(Proto::H2).await;
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let req = request(
        "/v1/chat/completions",
        GOLD,
        chat_body("hello there", 6, true),
        &[("traceparent", &traceparent)],
    );
    let resp = conn.send(req).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
    let events = sse_events(resp).await;
    assert_eq!(events.last().unwrap().data, "[DONE]");

    // Both processes export within their batch delay (100 ms): wait for
    // the engine's root span and the gateway's server span.
    let started = Instant::now();
    let trace = loop {
        let got: Vec<Got> =
            spans.lock().unwrap().iter().filter(|s| s.trace_id == TRACE_ID).cloned().collect();
        let has = |name: &str| got.iter().any(|s| s.name == name);
        if has("engine.generate") && has("POST chat_completions") && has("relay") {
            break got;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "spans so far: {got:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let one = |name: &str| -> &Got {
        let found: Vec<&Got> = trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {trace:#?}");
        found[0]
    };
    let children = |of: &Got| -> Vec<&str> {
        let mut v: Vec<&str> =
            trace.iter().filter(|s| s.parent == of.span_id).map(|s| s.name.as_str()).collect();
        v.sort_unstable();
        v
    };

    // The gateway's server span continues the client's trace.
    let root = one("POST chat_completions");
    assert_eq!(
        (root.service.as_str(), root.kind, root.parent.as_str()),
        ("slo-gateway", SERVER, CLIENT_SPAN)
    );
    assert_eq!(root.attrs["gen_ai.operation.name"], "chat");
    assert_eq!(root.attrs["gen_ai.request.model"], MODEL);
    assert_eq!(root.attrs["http.response.status_code"], "200");
    assert_eq!(root.attrs["slo.tier"], "gold");
    assert_eq!(root.attrs["gen_ai.usage.output_tokens"], "6");
    assert!(root.events.contains(&"gen_ai.first_token".to_string()), "{root:?}");
    assert_eq!(children(root), vec!["admission", "auth", "engine", "queue", "relay"]);
    let admission = one("admission");
    assert_eq!(admission.attrs["slo.admission.decision"], "admitted");
    assert_eq!(admission.attrs["slo.admission.reason"], "slo_feasible");
    assert!(admission.attrs["slo.predicted_ttft_ms"].parse::<f64>().unwrap() > 0.0);

    // The attempt is a client span; the engine's spans hang below it.
    let attempt = one("engine");
    assert_eq!((attempt.kind, attempt.attrs["slo.engine"].as_str()), (CLIENT, "e0"));
    let engine = one("engine.generate");
    assert_eq!((engine.service.as_str(), engine.kind), ("slo-engine", SERVER));
    assert_eq!(engine.parent, attempt.span_id);
    assert_eq!(engine.attrs["gen_ai.usage.output_tokens"], "6");
    assert_eq!(engine.status_code, 1, "ok");
    assert_eq!(children(engine), vec!["decode", "prefill", "queue"]);
    let decode = trace.iter().find(|s| s.name == "decode" && s.parent == engine.span_id).unwrap();
    assert!(decode.attrs["slo.engine.decode_steps"].parse::<u32>().unwrap() >= 5, "{decode:?}");
    assert_eq!(decode.attrs["slo.engine.batch_size.max"], "1");
    eprintln!("{} spans in the trace", trace.len());
}

/// A collector that accepts connections and never answers (a stalled
/// peer): export waits at most its timeout on the exporter's own thread,
/// spans past the processor's queue (2,048) are dropped, requests never
/// wait on any of it, and a stop waits at most 2 s per process for the
/// last spans.
#[tokio::test]
async fn a_stalled_collector_costs_requests_nothing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            sockets.push(s); // never read, never answered
        }
    });
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "20")];
    let sys = System::start_with_env(&paced(0, 1), 1, &[], None, &env).await;
    let conn = sys.conn(Proto::H2).await;
    let mut slowest = Duration::ZERO;
    for i in 0..40 {
        let started = Instant::now();
        let resp =
            conn.post_json("/v1/chat/completions", Some(GOLD), chat_body(&format!("hi {i}"), 4, false)).await;
        assert_eq!(resp.unwrap().status(), http::StatusCode::OK);
        slowest = slowest.max(started.elapsed());
    }
    assert!(slowest < Duration::from_millis(500), "a request waited {slowest:?} with the collector stalled");
    // Ctrl-C: the gateway drains, stops its engine (each flushing for at
    // most 2 s) and exits.
    let mut sys = sys;
    let pid = sys.child.id().unwrap();
    let started = Instant::now();
    signal(pid, "INT");
    tokio::time::timeout(Duration::from_secs(15), sys.child.wait())
        .await
        .expect("the gateway exits")
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(9), "stopping took {took:?} with the collector stalled");
    held.abort();
}
