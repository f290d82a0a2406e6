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
