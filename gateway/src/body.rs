//! The gateway's response body type and small constructors.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// Body of every gateway response: a whole buffer or a relayed stream.
pub type GatewayBody = UnsyncBoxBody<Bytes, Infallible>;

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into()).boxed_unsync()
}
