//! Command-line options of an engine process, shared by the `engine` binary
//! and the gateway's embedded supervisor (which runs engines as children).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::backend::BackendKind;

/// Options of one engine process.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is
    /// printed on the ready line).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// Engine id reported in load reports and the gateway's `x-engine`.
    #[arg(long, default_value = "engine-0")]
    pub id: String,
    /// Execution backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Emulated)]
    pub backend: BackendKind,
    /// Latency profile (TOML) for the emulated backend; the bundled
    /// `emulated-a100-8b` profile when omitted.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// KV cache pages.
    #[arg(long, default_value_t = 16384)]
    pub kv_pages: u32,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_tokens: u32,
    /// Exit when standard input closes. A supervising parent holds the other
    /// end of the pipe, so the engine never outlives it, even on SIGKILL.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
}
