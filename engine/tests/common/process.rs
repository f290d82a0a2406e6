//! An engine binary run as a real process for a test: started on a
//! loopback port with a latency profile and flags, killed when dropped.

use std::process::Stdio;

use loadtest::client::{Conn, Proto};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running engine process, with an HTTP/2 connection to it.
pub struct Engine {
    pub child: Child,
    pub conn: Conn,
    /// `http://host:port`
    pub url: String,
    _dir: std::path::PathBuf,
}

/// A profile whose decode step takes 200 ms (sequences stay resident).
pub const SLOW: &str =
    "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0]]\n[decode]\nbatch_points = [[1, 200.0]]\n";
/// A profile whose decode step takes 2 ms.
pub const FAST: &str =
    "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0]]\n[decode]\nbatch_points = [[1, 2.0]]\n";

/// Starts `engine` with the latency `profile` (TOML text) and `args`.
pub async fn start_with(profile_text: &str, args: &[&str]) -> Engine {
    let dir = std::env::temp_dir().join(format!("engine-test-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("p.toml");
    std::fs::write(&profile, profile_text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", "127.0.0.1:0", "--id", "t0", "--exit-on-stdin-eof", "--profile"])
        .arg(&profile)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap()).lines().next_line().await.unwrap().unwrap();
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("listen=")).unwrap().to_string();
    let url = format!("http://{addr}");
    let conn = Conn::connect(&url, None, Proto::H2).await.unwrap();
    Engine { child, conn, url, _dir: dir }
}

/// A suffix for this test's temporary paths.
#[allow(clippy::disallowed_methods)] // a unique name, not a measured time
pub fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// A request of `prompt_words` tokens whose prompt shares no prefix with
/// any other this process sends (the prefix cache stays out of the counts).
pub fn generate(prompt_words: usize, max_tokens: u32) -> String {
    static CALLS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let tag = (b'a' + CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 26) as char;
    let prompt: String = (0..prompt_words).map(|i| format!("{tag}{i:03x} ")).collect();
    serde_json::json!({"request_id": "r", "model": "m", "prompt": prompt, "max_tokens": max_tokens})
        .to_string()
}
