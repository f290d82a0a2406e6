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
            let name = path.display().to_string();
            let file = path.file_name().unwrap().to_string_lossy().to_string();
            if file.starts_with("genserve-") {
                let p = policies::diffusion::DiffusionProfile::parse(&name, &text).unwrap();
                assert!(!p.images.is_empty() && !p.videos.is_empty(), "{name}");
            } else if file.starts_with("video-") {
                let p = policies::video::VideoProfile::parse(&name, &text).unwrap();
                // The DiT's profile has the fp16 half of the sweep: no fp8
                // attention kernel yet (docs/benchmarks/gpu.md, "The DiT on the GPU").
                let fp16_only = p.model.starts_with("dit-");
                let want = if fp16_only { 45 } else { 90 };
                assert_eq!(p.configs.len(), want, "{name}: the whole sweep");
                if fp16_only {
                    assert!(p
                        .configs
                        .iter()
                        .all(|c| c.fidelity.precision == policies::video::Precision::Fp16));
                }
                assert_eq!(p.best().fidelity, policies::video::Fidelity::HIGHEST, "{name}");
                assert!(p.quality_floor() < 1.0 && p.frontier().len() >= 3, "{name}");
            } else {
                LatencyProfile::parse(&name, &text).unwrap();
            }
            n += 1;
        }
    }
    assert!(n >= 5, "expected two GPU classes, the benchmark profile and two video profiles");
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
    assert_eq!(doc.batching, policies::batching::BatchHints::default(), "engines keep their flags");
    assert_eq!(doc.video, policies::video::VideoConfig::default());
}

/// Every knob the code accepts is documented in docs/policies.md, found from
/// the code itself: a probe key put into each table of the shipped document
/// makes the parser list the fields that table accepts ("expected one of").
#[test]
fn every_knob_in_the_code_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("default.toml")).unwrap();
    let docs = std::fs::read_to_string(root.join("../docs/policies.md")).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let mut paths = Vec::new();
    table_paths(&toml::Value::Table(doc.clone()), &mut Vec::new(), &mut paths);
    let mut knobs = std::collections::BTreeMap::new();
    for path in &paths {
        let mut probed = toml::Value::Table(doc.clone());
        let mut t = &mut probed;
        for seg in path {
            t = match seg {
                Seg::Key(k) => t.get_mut(k.as_str()).unwrap(),
                Seg::Index(i) => t.get_mut(*i).unwrap(),
            };
        }
        t.as_table_mut().unwrap().insert("zz_probe".into(), toml::Value::Integer(1));
        let probed = toml::to_string(&probed).unwrap();
        let Err(e) = PolicyDocument::parse("probe.toml", &probed) else { continue };
        let msg = e.to_string();
        let Some(list) = msg.split("expected one of ").nth(1).or(msg.split("expected ").nth(1)) else {
            continue;
        };
        if !msg.contains("unknown field `zz_probe`") {
            continue; // a map of names (tiers), not a struct
        }
        for field in list.replace(" or ", ", ").split(", ") {
            knobs.insert(field.trim().trim_matches('`').to_string(), format!("{path:?}"));
        }
    }
    for expected in ["ttft_ms", "mode", "levels", "output_scale", "long_lane_engines", "owned_by", "keys"] {
        assert!(knobs.contains_key(expected), "probing found {knobs:?}");
    }
    // Written as a key (`k`, `x.k`), a section (`[k]`, `[[k]]`) or part of a
    // path (`k[i].…`, `….k.NAME`).
    let documented = |k: &str| {
        [format!("`{k}`"), format!(".{k}`"), format!("[{k}]"), format!("`{k}["), format!(".{k}.")]
            .iter()
            .any(|form| docs.contains(form.as_str()))
    };
    let missing: Vec<_> = knobs.iter().filter(|(k, _)| !documented(k)).collect();
    assert!(missing.is_empty(), "knobs the code accepts but docs/policies.md does not list: {missing:?}");
}

#[derive(Debug, Clone)]
enum Seg {
    Key(String),
    Index(usize),
}

fn table_paths(v: &toml::Value, at: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    match v {
        toml::Value::Table(t) => {
            out.push(at.clone());
            for (k, v) in t {
                at.push(Seg::Key(k.clone()));
                table_paths(v, at, out);
                at.pop();
            }
        }
        toml::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(Seg::Index(i));
                table_paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

/// The commented examples under `policies/examples/` are valid documents
/// (an SRE copies one and starts from it).
#[test]
fn every_example_policy_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = PolicyDocument::parse(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.starts_with("# Example:"), "{} says what it is an example of", path.display());
        versions.push(doc.version);
    }
    assert!(versions.len() >= 3);
    let default =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("default.toml")).unwrap();
    let default = PolicyDocument::parse("default.toml", &default).unwrap().version;
    assert!(!versions.contains(&default));
}

/// The default forecaster is the LSTM of the shipped model file: it must
/// be at the default path, for the default policy's types, and forecast a
/// series at its own level (the windows are scaled by their mean).
#[test]
fn the_shipped_lstm_models_fit_the_default_types() {
    use policies::oserve::forecast::LstmModels;
    use policies::oserve::{Forecaster, DEFAULT_LSTM_MODELS};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc =
        PolicyDocument::parse("default.toml", &std::fs::read_to_string(root.join("default.toml")).unwrap())
            .unwrap();
    assert_eq!(doc.oserve.forecast, Forecaster::Lstm);
    assert_eq!(doc.oserve.lstm_models, DEFAULT_LSTM_MODELS);
    let file = root.join("..").join(DEFAULT_LSTM_MODELS);
    let models: LstmModels = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let names: Vec<&str> = doc.oserve.types.iter().map(|t| t.name.as_str()).collect();
    models.check(&names).unwrap();
    for level in [10.0, 1000.0] {
        let flat = vec![level; 60];
        let f = models.models[0].forecast(&flat);
        assert!((f / level - 1.0).abs() < 0.25, "a flat series at {level} forecasts {f}");
    }
}
