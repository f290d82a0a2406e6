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

/// `ms` with one decimal (`{ms:.1}`, without `core::fmt`'s float path: two
/// of these per answer); `None` when negative or not finite.
pub(crate) fn tenths(ms: f64) -> Option<HeaderValue> {
    if !(0.0..1e15).contains(&ms) {
        return None;
    }
    let t = (ms * 10.0).round() as u64;
    let mut buf = [0u8; 24];
    let mut i = buf.len();
    buf[i - 1] = b'0' + (t % 10) as u8;
    buf[i - 2] = b'.';
    i -= 2;
    let mut whole = t / 10;
    loop {
        i -= 1;
        buf[i] = b'0' + (whole % 10) as u8;
        whole /= 10;
        if whole == 0 {
            break;
        }
    }
    HeaderValue::from_bytes(&buf[i..]).ok()
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

    #[test]
    fn tenths_format_as_one_decimal() {
        for (ms, want) in [
            (0.0, "0.0"),
            (0.04, "0.0"),
            (0.05, "0.1"),
            (12.34, "12.3"),
            (499.96, "500.0"),
            (123456.7, "123456.7"),
        ] {
            assert_eq!(tenths(ms).unwrap(), want, "{ms}");
            assert_eq!(format!("{ms:.1}"), want, "as format! writes it");
        }
        assert!(tenths(-1.0).is_none() && tenths(f64::NAN).is_none() && tenths(f64::INFINITY).is_none());
    }
}
