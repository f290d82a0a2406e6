//! Execution backends behind one interface.
//!
//! Only `emulated` exists so far: it produces deterministic text and waits
//! according to a latency profile. `cpu` (real math) and `cuda` come with
//! later issues and plug in here.

pub mod emulated;

/// Which backend an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Profile-timed, no heavy math; results are labelled "emulated".
    Emulated,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Emulated => "emulated",
        }
    }
}
