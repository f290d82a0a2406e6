//! The files shipped under `policies/` parse and say what the docs say.

use std::path::Path;

use policies::{LatencyProfile, PolicyDocument};

#[test]
fn default_policy_ships_one_demo_key_per_tier() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("default.toml");
    let doc = PolicyDocument::parse("default.toml", &std::fs::read_to_string(path).unwrap()).unwrap();
    for (key, tier) in [("sk-demo-gold", "gold"), ("sk-demo-silver", "silver"), ("sk-demo-bronze", "bronze")]
    {
        let (_, t) = doc.authenticate(key).unwrap_or_else(|| panic!("{key} is shipped"));
        assert_eq!(t.name, tier);
    }
    assert!(doc.model("synthetic-small").is_some());
}

#[test]
fn every_shipped_profile_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            LatencyProfile::parse(&path.display().to_string(), &text).unwrap();
            n += 1;
        }
    }
    assert!(n >= 3, "expected two GPU classes and the benchmark profile");
}

fn leaf_keys(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                match v {
                    toml::Value::Table(_) | toml::Value::Array(_) if !is_leaf_array(v) => leaf_keys(v, out),
                    _ => out.push(k.clone()),
                }
            }
        }
        toml::Value::Array(a) => a.iter().for_each(|x| leaf_keys(x, out)),
        _ => {}
    }
}

fn is_leaf_array(v: &toml::Value) -> bool {
    matches!(v, toml::Value::Array(a) if a.iter().all(|x| !x.is_table()))
}

/// Every key of the shipped document is documented in docs/policies.md.
#[test]
fn every_shipped_knob_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("default.toml")).unwrap();
    let docs = std::fs::read_to_string(root.join("../docs/policies.md")).unwrap();
    let mut keys = Vec::new();
    leaf_keys(&toml::Value::Table(toml::from_str::<toml::Table>(&text).unwrap()), &mut keys);
    keys.sort();
    keys.dedup();
    assert!(keys.len() > 30, "{keys:?}");
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !docs.contains(&format!("`{k}`")) && !docs.contains(&format!(".{k}`")))
        .collect();
    assert!(missing.is_empty(), "knobs missing from docs/policies.md: {missing:?}");
}

/// The shipped document spells out the code's defaults, so reading it tells
/// an SRE what a section left out would mean.
#[test]
fn shipped_sections_equal_the_code_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("default.toml");
    let doc = PolicyDocument::parse("default.toml", &std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(doc.admission, policies::admission::AdmissionConfig::default());
    assert_eq!(doc.estimator, policies::estimate::EstimatorConfig::default());
    assert_eq!(doc.routing, policies::routing::RoutingConfig::default());
    assert_eq!(doc.brownout, policies::brownout::BrownoutConfig::default());
}
