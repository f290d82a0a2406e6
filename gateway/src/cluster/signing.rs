//! Signed policy documents in Redis: whoever can write to Redis must not
//! be able to push a policy (with their own API keys) that every gateway
//! applies. A policy published to Redis carries an HMAC-SHA256 over its
//! version and text, keyed by a secret the gateways share and Redis never
//! holds (`[cluster] policy_key_file`, or the `GATEWAY_POLICY_KEY`
//! environment variable). Gateways refuse an unsigned or mismatching
//! document (`gateway_cluster_policy_rejected_total{why}`, an error log)
//! and publish their own over it. Without a key, policy convergence is off.

use ring::hmac;

/// Environment variable holding the policy signing key.
pub const KEY_ENV: &str = "GATEWAY_POLICY_KEY";
/// Shortest key accepted.
pub const MIN_KEY_LEN: usize = 16;

/// The shared signing key.
pub struct PolicyKey(hmac::Key);

impl std::fmt::Debug for PolicyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyKey(<redacted>)")
    }
}

impl PolicyKey {
    /// A key from its secret (at least [`MIN_KEY_LEN`] bytes).
    pub fn new(secret: &str) -> Result<Self, String> {
        let secret = secret.trim();
        if secret.len() < MIN_KEY_LEN {
            return Err(format!("the policy signing key must be at least {MIN_KEY_LEN} characters"));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes())))
    }

    /// The hex MAC of one published document.
    pub fn sign(&self, version: &str, text: &str) -> String {
        let tag = hmac::sign(&self.0, &message(version, text));
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `mac` (hex) signs this version and text (constant time).
    pub fn verify(&self, version: &str, text: &str, mac: &str) -> bool {
        let Some(tag) = unhex(mac) else { return false };
        hmac::verify(&self.0, &message(version, text), &tag).is_ok()
    }
}

/// Version and text, unambiguously joined (the version's length first).
fn message(version: &str, text: &str) -> Vec<u8> {
    let mut m = (version.len() as u64).to_le_bytes().to_vec();
    m.extend_from_slice(version.as_bytes());
    m.extend_from_slice(text.as_bytes());
    m
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_holds_only_for_its_key_version_and_text() {
        let k = PolicyKey::new("a-shared-secret-0123").unwrap();
        let mac = k.sign("v1", "text");
        assert!(k.verify("v1", "text", &mac));
        assert!(!k.verify("v1", "text2", &mac));
        assert!(!k.verify("v2", "text", &mac));
        assert!(!k.verify("v1t", "ext", &mac), "the boundary between version and text is part of it");
        assert!(!PolicyKey::new("another-secret-4567").unwrap().verify("v1", "text", &mac));
        assert!(!k.verify("v1", "text", "zz") && !k.verify("v1", "text", ""));
        assert!(PolicyKey::new("short").is_err());
    }
}
