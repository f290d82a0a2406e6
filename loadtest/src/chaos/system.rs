//! The system a chaos scenario runs against: a real `gateway up` (its
//! engines as child processes) and, for Redis scenarios, a real
//! `redis-server`, on loopback ports, in a scratch directory; both killed
//! when dropped. Also what is measured of them: the gateway's RSS.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::client::{Conn, Proto};

/// A running `gateway up`.
pub struct Gateway {
    child: Child,
    pub pid: u32,
    /// `https://localhost:PORT`.
    pub base: String,
    pub admin: String,
    pub ca: PathBuf,
    pub dir: PathBuf,
    /// Engine children: `(id, pid)`.
    pub engines: Vec<(String, u32)>,
}

/// How to start one.
pub struct Setup<'a> {
    pub engines: usize,
    /// Latency profile TOML of the emulated engines.
    pub profile: &'a str,
    /// Policy document text.
    pub policy: &'a str,
    /// Lines of the gateway config's `[limits]`.
    pub limits: &'a str,
    /// More `gateway up` flags (`--engine-arg=...`, `--redis URL`).
    pub extra: Vec<String>,
}

impl Gateway {
    pub async fn up(bin: &Path, scratch: &Path, setup: &Setup<'_>) -> Result<Self, String> {
        let dir = scratch.join(format!("gw-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok(p)
        };
        let profile = write("profile.toml", setup.profile)?;
        let policy = write("policies.toml", setup.policy)?;
        let mut cmd = Command::new(bin);
        cmd.arg("up");
        if !setup.limits.is_empty() {
            // Only when there are limits to set: a gateway from before
            // `[limits]` existed runs the same scenarios as a baseline.
            cmd.arg("--config").arg(write("gateway.toml", &format!("[limits]\n{}\n", setup.limits))?);
        }
        let mut child = cmd
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--engines", &setup.engines.to_string()])
            .arg("--certs")
            .arg(dir.join("certs"))
            .arg("--profile")
            .arg(&profile)
            .arg("--policies")
            .arg(&policy)
            .args(&setup.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let pid = child.id().unwrap_or(0);
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let (mut base, mut admin, mut engines) = (None, None, Vec::new());
        let read = async {
            while let Ok(Some(line)) = lines.next_line().await {
                let port = |rest: &str| {
                    rest.split_whitespace().next().and_then(|a| a.rsplit(':').next()).map(str::to_string)
                };
                if let Some(rest) = line.strip_prefix("gateway listening on https://") {
                    base = port(rest).map(|p| format!("https://localhost:{p}"));
                } else if let Some(rest) = line.strip_prefix("admin listening on https://") {
                    admin = port(rest).map(|p| format!("https://localhost:{p}"));
                } else if let Some(rest) = line.strip_prefix("engine ") {
                    let id = rest.split_whitespace().next().unwrap_or_default().to_string();
                    let pid = rest
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("pid="))
                        .and_then(|p| p.parse().ok());
                    engines.push((id, pid.unwrap_or(0)));
                } else if line.starts_with("ready:") {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout(Duration::from_secs(60), read).await {
            Ok(true) => {}
            _ => return Err("the gateway did not print its ready line within 60 s".into()),
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            pid,
            base: base.ok_or("no listening line")?,
            admin: admin.ok_or("no admin line")?,
            ca: dir.join("certs/ca.pem"),
            dir,
            engines,
        })
    }

    pub async fn conn(&self) -> Result<Conn, String> {
        Conn::connect(&self.base, Some(&self.ca), Proto::H2).await.map_err(|e| e.to_string())
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.join("certs/admin.token")).unwrap_or_default().trim().to_string()
    }

    /// The gateway process's resident set, KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid)
    }

    /// The Prometheus text of the admin listener.
    pub async fn metrics(&self) -> String {
        let Ok(c) = Conn::connect(&self.admin, Some(&self.ca), Proto::H2).await else { return String::new() };
        match c.get("/metrics", None).await {
            Ok(r) => crate::client::body_bytes(r)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `VmRSS` of a process, KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Sends `sig` (`STOP`, `CONT`, `KILL`) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status();
}

/// A `redis-server` on a free loopback port (`scripts/test-all` installs
/// it from Debian's packages), killed when dropped. The gateway's cluster
/// tests use it too.
pub struct Redis {
    pub port: u16,
    child: Option<std::process::Child>,
    dir: PathBuf,
    /// Further server arguments (a replica's `--replicaof`).
    extra: Vec<String>,
}

impl Redis {
    /// Starts one with its files under `scratch`.
    pub fn start(scratch: &Path) -> Result<Self, String> {
        Self::start_with(scratch, Vec::new())
    }

    /// Starts a replica of the primary on `primary_port`.
    pub fn start_replica(scratch: &Path, primary_port: u16) -> Result<Self, String> {
        Self::start_with(scratch, vec!["--replicaof".into(), "127.0.0.1".into(), primary_port.to_string()])
    }

    /// Starts one that also serves TLS on a port of its own, with this
    /// certificate and key (clients are not asked for one); the plain port
    /// stays, for [`Redis::command`]. Its TLS URL is [`Redis::tls_url`].
    pub fn start_tls(scratch: &Path, cert: &Path, key: &Path) -> Result<Self, String> {
        let tls_port = free_port()?;
        let mut extra =
            vec!["--tls-port".to_string(), tls_port.to_string(), "--tls-auth-clients".into(), "no".into()];
        extra.extend(["--tls-cert-file".into(), cert.display().to_string()]);
        extra.extend(["--tls-key-file".into(), key.display().to_string()]);
        Self::start_with(scratch, extra)
    }

    /// `rediss://127.0.0.1:{tls-port}` of one started by [`Redis::start_tls`].
    pub fn tls_url(&self) -> Option<String> {
        let at = self.extra.iter().position(|a| a == "--tls-port")?;
        Some(format!("rediss://127.0.0.1:{}", self.extra[at + 1]))
    }

    fn start_with(scratch: &Path, extra: Vec<String>) -> Result<Self, String> {
        let port = free_port()?;
        let dir = scratch.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut r = Self { port, child: None, dir, extra };
        r.restart()?;
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// Starts the server (again, on the same port) and waits for PONG.
    pub fn restart(&mut self) -> Result<(), String> {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server (apt-get install redis-server): {e}"))?;
        self.child = Some(child);
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.command(&["PING"]) == "+PONG"
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!("redis-server did not start on {}", self.port))
    }

    /// One command over RESP; the reply's first line (`:1`, `+OK`, …), or
    /// empty when Redis does not answer.
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port, args)
    }

    /// The whole reply to `args` as text (an `INFO` section, a `ROLE`).
    pub fn reply(&self, args: &[&str]) -> String {
        reply(self.port, args)
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port free on loopback (bound, then released).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Sends one RESP command to the server on `port`; the connection to read
/// the reply from, reads timing out after `read`.
fn send(port: u16, args: &[&str], read: Duration) -> Option<std::net::TcpStream> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(read)).ok()?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).ok()?;
    Some(s)
}

/// One RESP command to the server on `port`: the reply's first line.
fn command(port: u16, args: &[&str]) -> String {
    use std::io::BufRead;
    let Some(s) = send(port, args, Duration::from_secs(2)) else { return String::new() };
    let mut line = String::new();
    let _ = std::io::BufReader::new(s).read_line(&mut line);
    line.trim_end().to_string()
}

/// One RESP command to the server on `port`: everything it answers until
/// 200 ms of silence, as text.
fn reply(port: u16, args: &[&str]) -> String {
    use std::io::Read;
    let Some(mut s) = send(port, args, Duration::from_millis(200)) else { return String::new() };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `redis-server --sentinel` on a free loopback port watching one
/// primary as `master` (quorum 2, down after 1 s), killed when dropped.
pub struct Sentinel {
    pub port: u16,
    child: Option<std::process::Child>,
    dir: PathBuf,
}

impl Sentinel {
    pub fn start(scratch: &Path, master: &str, primary_port: u16) -> Result<Self, String> {
        let port = free_port()?;
        let dir = scratch.join(format!("sentinel-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // Sentinel rewrites its configuration file: it must be its own.
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {master} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {master} 1000\nsentinel failover-timeout {master} 5000\n\
                 sentinel parallel-syncs {master} 1\n",
                dir.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let child = std::process::Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server --sentinel (apt-get install redis-server): {e}"))?;
        let s = Self { port, child: Some(child), dir };
        for _ in 0..400 {
            if command(port, &["PING"]) == "+PONG" {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!("redis sentinel did not start on {port}"))
    }

    /// The whole reply to `args` as text.
    pub fn reply(&self, args: &[&str]) -> String {
        reply(self.port, args)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
