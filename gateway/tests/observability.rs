//! The operator's kit in docs/deploy checks out against what the gateway
//! and the engines really export: the Prometheus alerting rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`: each
//! alert fires on a bad series and stays silent on a healthy one), the
//! Grafana dashboard is a well-formed dashboard whose queries all parse as
//! PromQL, and every metric either names is a family one of the two
//! processes serves (so a renamed metric breaks this test, not a dashboard
//! in production). promtool comes with Debian's `prometheus`, which
//! scripts/test-all installs.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy").join(rel)
}

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool is installed (scripts/test-all installs Debian's prometheus)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

/// Every family the gateway and an engine serve (their `# HELP` tables,
/// which their own tests hold equal to what they record).
fn served_families() -> HashSet<&'static str> {
    gateway::metrics::HELP.iter().chain(engine::metrics::HELP).map(|&(name, _)| name).collect()
}

/// The metric names (`gateway_*`, `engine_*`) a text mentions, with a
/// histogram's `_bucket`, `_sum` and `_count` series taken to their family.
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    text.split(|c: char| !word(c))
        .filter(|w| w.starts_with("gateway_") || w.starts_with("engine_"))
        .map(|w| {
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| w.strip_suffix(s));
            base.unwrap_or(w).to_string()
        })
        .collect()
}

fn unknown(names: &BTreeSet<String>) -> Vec<String> {
    let served = served_families();
    names.iter().filter(|n| !served.contains(n.as_str())).cloned().collect()
}

#[test]
fn alerting_rules_pass_promtool_and_their_unit_tests() {
    let dir = deploy("prometheus");
    let (ok, said) = promtool(&["check", "rules", "alerts.yaml"], &dir);
    assert!(ok, "promtool check rules:\n{said}");
    let (ok, said) = promtool(&["test", "rules", "alerts.test.yaml"], &dir);
    assert!(ok, "promtool test rules:\n{said}");
    let rules = std::fs::read_to_string(dir.join("alerts.yaml")).unwrap();
    // The alerts the issue names, each unit-tested firing.
    let tests = std::fs::read_to_string(dir.join("alerts.test.yaml")).unwrap();
    for alert in
        ["GatewaySLOBurnFast", "GatewayBrownoutStuckHigh", "GatewayNoEngineReady", "GatewayRedisDown"]
    {
        assert!(rules.contains(&format!("alert: {alert}")), "no {alert} rule");
        assert!(tests.contains(&format!("alertname: {alert}")), "{alert} is not unit-tested");
    }
    let names = metric_names(&rules);
    assert!(names.contains("gateway_slo_requests_total"), "{names:?}");
    assert_eq!(unknown(&names), Vec::<String>::new(), "the rules name metrics nobody exports");
}

#[test]
fn alerting_rule_unit_tests_can_fail() {
    // The same tests against rules whose fast-burn threshold is raised past
    // the test's 20% miss ratio: promtool must report the missing page.
    let tmp = std::env::temp_dir().join(format!("slo-gw-rules-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let dir = deploy("prometheus");
    let rules = std::fs::read_to_string(dir.join("alerts.yaml")).unwrap();
    let raised = rules.replace("(14.4 * 0.01)", "(30 * 0.01)");
    assert_ne!(raised, rules);
    std::fs::write(tmp.join("alerts.yaml"), raised).unwrap();
    std::fs::copy(dir.join("alerts.test.yaml"), tmp.join("alerts.test.yaml")).unwrap();
    let (ok, said) = promtool(&["test", "rules", "alerts.test.yaml"], &tmp);
    std::fs::remove_dir_all(&tmp).ok();
    assert!(!ok && said.contains("GatewaySLOBurnFast"), "{said}");
}

/// Every panel of the dashboard (rows' nested panels included).
fn panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels is an array") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

#[test]
fn the_grafana_dashboard_is_well_formed() {
    let text = std::fs::read_to_string(deploy("grafana/slo-gateway.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "slo-gateway");
    assert!(dash["title"].is_string());
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "{}", dash["schemaVersion"]);
    let vars = dash["templating"]["list"].as_array().unwrap();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    assert_eq!(var("datasource").expect("a datasource variable")["type"], "datasource");
    assert!(var("tier").is_some());

    let mut ids = HashSet::new();
    let mut boxes: Vec<(u64, u64, u64, u64, String)> = Vec::new();
    for p in panels(&dash) {
        let title = p["title"].as_str().expect("every panel has a title").to_string();
        assert!(ids.insert(p["id"].as_u64().expect("numeric id")), "duplicate id at {title}");
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().expect("gridPos is complete"));
        assert!(w > 0 && h > 0 && x + w <= 24, "{title}: {g}");
        for (bx, by, bw, bh, other) in &boxes {
            let overlap = x < bx + bw && *bx < x + w && y < by + bh && *by < y + h;
            assert!(!overlap, "{title} overlaps {other}");
        }
        boxes.push((x, y, w, h, title.clone()));
        if p["type"] == "row" {
            continue;
        }
        let kind = p["type"].as_str().unwrap();
        assert!(["timeseries", "stat", "bargauge", "gauge", "table"].contains(&kind), "{title}: {kind}");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title} is bound to the datasource variable");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("{title}"));
        let refs: HashSet<_> = targets.iter().map(|t| t["refId"].as_str().unwrap()).collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds are unique");
    }
}

/// Every PromQL expression of the dashboard (targets, the tier variable,
/// annotations) with Grafana's variables given values.
fn dashboard_queries(dash: &Value) -> Vec<String> {
    let mut exprs: Vec<String> = panels(dash)
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("every target has an expr").to_string())
        .collect();
    for a in dash["annotations"]["list"].as_array().into_iter().flatten() {
        exprs.extend(a["expr"].as_str().map(String::from));
    }
    exprs.iter().map(|e| e.replace("$__rate_interval", "5m").replace("$tier", ".*")).collect()
}

#[test]
fn every_dashboard_query_parses_and_names_served_metrics() {
    let text = std::fs::read_to_string(deploy("grafana/slo-gateway.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let exprs = dashboard_queries(&dash);
    assert!(exprs.len() >= 30, "{}", exprs.len());
    // promtool parses each query as the expression of a recording rule.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::json!(e)
        ));
    }
    let tmp = std::env::temp_dir().join(format!("slo-gw-dashboard-{}.yaml", std::process::id()));
    std::fs::write(&tmp, rules).unwrap();
    let (ok, said) = promtool(&["check", "rules", tmp.to_str().unwrap()], Path::new("."));
    std::fs::remove_file(&tmp).ok();
    assert!(ok, "a dashboard query is not valid PromQL:\n{said}");

    let names = metric_names(&exprs.join("\n"));
    assert_eq!(unknown(&names), Vec::<String>::new(), "the dashboard queries metrics nobody exports");
    // What the dashboard must show (issue 26): SLO attainment per tier,
    // TTFT and TBT percentiles, admission decisions by reason, brownout,
    // engine load and KV, cold starts, video CPR and stalls.
    for family in [
        "gateway_slo_requests_total",
        "gateway_ttft_seconds",
        "gateway_tbt_seconds",
        "gateway_admission_decisions_total",
        "gateway_brownout_level",
        "engine_running_sequences",
        "engine_kv_pages_free",
        "gateway_engine_cold_starts_total",
        "gateway_video_chunks_total",
        "gateway_video_stalls_total",
    ] {
        assert!(names.contains(family), "the dashboard does not show {family}");
    }
}

#[test]
fn the_name_check_catches_an_unknown_metric() {
    let names = metric_names("rate(gateway_ttft_seconds_bucket[5m]) / gateway_made_up_total");
    assert_eq!(unknown(&names), vec!["gateway_made_up_total".to_string()]);
}
