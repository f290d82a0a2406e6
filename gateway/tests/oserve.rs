//! OServe live (issue 25): the control plane's planning loop on a real
//! `gateway up` with real engine processes replaying the cost model's
//! configuration profiles. Traffic of a long-context type makes the plan
//! switch four TP2 replicas into two TP4 ones — drains and starts through
//! the supervisor, one step at a time, on the 8 GPUs the deployment had,
//! never below the forecast's need — while every request is answered; the
//! routes then give the type its whole share on the TP4 class.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Proto};

fn profile_path(config: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../policies/profiles/oserve-70b-h200-{config}.toml"));
    p.canonicalize().unwrap().display().to_string()
}

/// The shipped policy with `[oserve]` planning every second over TP2 and
/// TP4 replicas, and one long-in-long-out type (every request is of it);
/// routes at any load (`route_above_utilization = 0`: the test's load is far
/// below these engines' capacity, where the shipped bar pools instead).
fn policy() -> String {
    let text = default_policy();
    let start = text.find("[[oserve.types]]").expect("the shipped policy has types");
    let end = text.find("# Tenants").expect("tenants follow");
    let section = format!(
        "[oserve]\nplan_interval_s = 1\nforecast_intervals = 2\nswitch = true\nroute_above_utilization = 0\n\n\
         [[oserve.configurations]]\nclass = \"oserve-70b-h200-tp2pp1\"\ntp = 2\npp = 1\nprofile = \"{}\"\n\n\
         [[oserve.configurations]]\nclass = \"oserve-70b-h200-tp4pp1\"\ntp = 4\npp = 1\nprofile = \"{}\"\n\
         engine_args = [\"--kv-pages=30000\"]\n\n\
         [[oserve.types]]\nname = \"long-in-long-out\"\ninput = 6000\noutput = 1500\n\n",
        profile_path("tp2pp1"),
        profile_path("tp4pp1"),
    );
    format!("{}{section}{}", &text[..start], &text[end..])
}

async fn fleet(sys: &System) -> serde_json::Value {
    let conn = sys.admin_conn().await;
    let resp = conn.get("/admin/fleet", Some(&sys.admin_token())).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    json(&body_bytes(resp).await.unwrap())
}

#[tokio::test]
async fn a_long_context_mix_switches_tp2_replicas_to_tp4_without_failing_a_request() {
    let tp2 = std::fs::read_to_string(profile_path("tp2pp1")).unwrap();
    let sys = System::start_with_policy(&tp2, 4, &[], Some(&policy())).await;
    let conn = sys.conn(Proto::H2).await;
    let (mut ok, mut sent) = (0, 0);
    let t = Instant::now();
    let done = loop {
        let body = chat_body("hello there", 4, false);
        let resp = conn.send(request("/v1/chat/completions", "sk-demo-gold", body, &[])).await.unwrap();
        sent += 1;
        ok += usize::from(resp.status() == StatusCode::OK);
        let _ = body_bytes(resp).await;
        let f = fleet(&sys).await;
        let o = &f["oserve"];
        let switched =
            o["switches"].as_u64() >= Some(1) && o["pending_steps"].as_array().is_some_and(Vec::is_empty);
        let classes = f["gpu_seconds"].as_object().map(|m| m.keys().cloned().collect::<Vec<_>>());
        if switched
            && f["supervisor"]["engines"]["serving"] == 2
            && f["supervisor"]["engines"]["starting"] == 0
        {
            break (f, classes);
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no switch within 60 s: {f:#}");
        // ~0.6 requests per second: the forecast leaves the switch planner
        // room to drain (the four TP2 replicas sustain ~2 of this type).
        tokio::time::sleep(Duration::from_millis(1500)).await;
    };
    let (f, _) = done;
    let o = &f["oserve"];
    assert_eq!(ok, sent, "every request answered during the switch");
    assert_eq!(o["gpus"], 8, "the deployment's GPUs: four TP2 replicas");
    assert_eq!(o["target"], "[TP4PP1, TP4PP1]", "{o:#}");
    assert_eq!(o["steps_done"], 6, "four drains and two starts: {o:#}");
    assert!(o["forecast_rps"][0].as_f64().unwrap() > 0.0, "{o:#}");
    assert!(o["search_ms"].as_f64().is_some_and(|ms| ms > 0.0 && ms < 5_000.0), "planner time: {o:#}");
    // The engines now serving are TP4 replicas, and the type's whole share
    // is on their class once the routes follow.
    let t = Instant::now();
    loop {
        let f = fleet(&sys).await;
        let routes = &f["oserve"]["routes"];
        if routes["shares"][0] == serde_json::json!([0.0, 1.0]) {
            assert_eq!(routes["classes"][1], "oserve-70b-h200-tp4pp1");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "routes did not follow: {f:#}");
        let body = chat_body("hello again", 4, false);
        let resp = conn.send(request("/v1/chat/completions", "sk-demo-gold", body, &[])).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "x-engine-class"), "oserve-70b-h200-tp4pp1");
        let _ = body_bytes(resp).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The TP4 engines run with their configuration's own flags.
    let t = Instant::now();
    loop {
        let r = sys.readyz().await;
        let tp4: Vec<&serde_json::Value> = r["detail"]["engines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["engine_class"] == "oserve-70b-h200-tp4pp1")
            .collect();
        if tp4.len() == 2 && tp4.iter().all(|e| e["load"]["kv_pages_total"] == 30000) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "TP4 engines without their flags: {r:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let resp = conn
        .send(request("/v1/chat/completions", "sk-demo-gold", chat_body("and now", 4, false), &[]))
        .await
        .unwrap();
    assert_eq!(header(&resp, "x-engine-class"), "oserve-70b-h200-tp4pp1");
    let m = sys.metrics().await;
    assert!(
        metric(&m, "gateway_workload_type_total{type=\"long-in-long-out\"}").unwrap_or(0.0) >= sent as f64
    );
}
