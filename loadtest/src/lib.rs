//! Load generation and measurement against the gateway.
//!
//! - [`client`]: HTTP/2 (or HTTP/1.1) over TLS to the gateway, and HTTP/2
//!   cleartext to engines; one multiplexed connection serves many requests.
//! - [`sse`]: a Server-Sent Events parser.
//! - [`stats`]: percentiles over recorded samples.
//! - [`overhead`]: the gateway-overhead benchmark (gateway vs engine direct).
//!
//! The open-loop load generator, workloads and reports come with the
//! load-test issue; the pieces here are what it will build on.

pub mod client;
pub mod overhead;
pub mod sse;
pub mod stats;
