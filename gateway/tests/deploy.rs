//! The configuration embedded in the Kubernetes manifests (docs/deploy)
//! is what the gateway accepts: the ConfigMap's gateway.toml parses as a
//! gateway config and the policy Secret's document passes the same checks
//! as a reload. (The manifests themselves are checked against the
//! Kubernetes and KEDA schemas by scripts/validate-manifests.)

use std::path::Path;

/// The literal block `key: |` of a manifest, dedented.
fn block(manifest: &str, key: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy/kubernetes").join(manifest);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().unwrap_or_else(|| panic!("{manifest} has no `{key}: |` block"));
    let indent = head.len() - head.trim_start().len() + 2;
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| if l.len() >= indent { &l[indent..] } else { "" })
        .collect();
    body.join("\n")
}

#[test]
fn the_configmaps_gateway_config_parses() {
    let text = block("30-gateway-config.yaml", "gateway.toml");
    let cfg: gateway::config::GatewayConfig = toml::from_str(&text).expect("gateway.toml parses");
    assert_eq!(cfg.listen.port(), 8443);
    assert!(cfg.cluster.redis.is_some() && cfg.cluster.policy_key_file.is_some());
    assert!(!cfg.admin.write_through, "the mounted Secret is read-only");
    cfg.limits.validate().unwrap();
}

#[test]
fn the_policy_secret_is_a_valid_policy_document_with_autoscaling_on() {
    let text = block("40-policies.yaml", "policies.toml");
    let doc =
        policies::PolicyDocument::parse("40-policies.yaml", &text).expect("the policy document is valid");
    assert!(doc.autoscale.enabled);
    assert!(doc.cost.gpu_hour.contains_key("a100-80gb"));
    // The ScaledObject's bounds agree with the policy's.
    let keda = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy/kubernetes/60-keda-a100.yaml"),
    )
    .unwrap();
    assert!(keda.contains(&format!("minReplicaCount: {}", doc.autoscale.min_engines)));
    assert!(keda.contains(&format!("maxReplicaCount: {}", doc.autoscale.max_engines)));
    assert!(keda.contains(r#"gateway_autoscale_desired_engines{class="a100-80gb"}"#));
}
