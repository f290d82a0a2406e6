//! The OpenAI text API as bytes at the edge: what a chat or text
//! completion request may say ([`request`], with every bound and a typed
//! 400 for each way it can be wrong, [`error`]) and the bytes of the
//! answer, streamed or whole ([`encode`]). Both the gateway's public
//! routes and the engine's own OpenAI surface use it, so a client sees
//! one schema whichever it talks to. No I/O, no async runtime.
#![forbid(unsafe_code)]

pub mod encode;
pub mod error;
pub mod request;

pub use error::ParseError;
pub use request::{parse, parse_engine, parse_for, CompletionRequest, Kind};
