//! The gateway's own response and engine-request headers: their names as
//! constants (parsed once, at compile time, not on every request), and how
//! a value unique to one request is sent.
//!
//! HPACK (HTTP/2's header compression) keeps a per-connection table of
//! headers it has sent. A value that never repeats (a request id, a
//! prediction) gains nothing from it: indexing one walks the entries that
//! share its name and evicts older ones, the costliest part of encoding a
//! response head (h2's `Table::index`: about 11k instructions per header
//! block under callgrind before this), and it pushes out the headers that
//! do repeat (`x-policy-version`, `x-admission`, `x-engine`), which then go
//! out as literals again. [`unique`] sends such a value as a never-indexed
//! literal (RFC 7541 §6.2.3), which costs no table work on either side.

use http::{HeaderName, HeaderValue};

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub(crate) const X_POLICY_VERSION: HeaderName = HeaderName::from_static("x-policy-version");
pub(crate) const X_ADMISSION: HeaderName = HeaderName::from_static("x-admission");
pub(crate) const X_ADMISSION_REASON: HeaderName = HeaderName::from_static("x-admission-reason");
pub(crate) const X_PREDICTED_TTFT_MS: HeaderName = HeaderName::from_static("x-predicted-ttft-ms");
pub(crate) const X_PREDICTED_E2E_MS: HeaderName = HeaderName::from_static("x-predicted-e2e-ms");
pub(crate) const X_BROWNOUT_LEVEL: HeaderName = HeaderName::from_static("x-brownout-level");
pub(crate) const X_ENGINE: HeaderName = HeaderName::from_static("x-engine");
pub(crate) const X_ENGINE_CLASS: HeaderName = HeaderName::from_static("x-engine-class");

/// `value` marked to be sent as an HPACK never-indexed literal: for values
/// that belong to one request only.
pub(crate) fn unique(mut value: HeaderValue) -> HeaderValue {
    value.set_sensitive(true);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flag h2's encoder reads to skip the table (`Header::is_sensitive`).
    #[test]
    fn a_unique_value_is_marked_never_indexed_and_keeps_its_bytes() {
        let v = unique(HeaderValue::from_static("req_0001"));
        assert!(v.is_sensitive());
        assert_eq!(v.as_bytes(), b"req_0001");
    }
}
