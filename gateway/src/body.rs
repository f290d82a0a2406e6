//! The gateway's response body type and small constructors.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

use crate::outbox::StreamReset;

/// Body of every gateway response: a whole buffer or a relayed stream
/// (which ends with [`StreamReset`] when its client stalled).
pub type GatewayBody = UnsyncBoxBody<Bytes, StreamReset>;

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}
