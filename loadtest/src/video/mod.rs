//! Video load: workloads planned from a seed ([`plan`]), the client's
//! real-time player ([`player`]), and the runner of `loadtest video`
//! ([`run`]).

pub mod plan;
pub mod player;
pub mod run;
