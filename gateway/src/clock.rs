//! This crate's clock: the workspace's one clock (the `clock` crate), so
//! that a test pausing tokio's time pauses every reading of it.

pub use ::clock::{now, since, unix_s, wall};
