//! Hosts of our own on this machine, for the fleet's multi-host tests and
//! `loadtest chaos --fleet`: each host a network namespace with its own
//! address on one virtual switch (a bridge in a namespace of its own),
//! reached from this process through one more port of that switch.
//!
//! - `Hosts::create(n)`: namespaces `slo<pid>-<k>-h<i>` with `eth0` at
//!   `10.<x>.<y>.<i+1>/24` on the switch `slo<pid>-<k>-sw`; this process
//!   reaches them from `10.<x>.<y>.254` through a veth of the root
//!   namespace (the one thing it adds there, on a /24 no route of this
//!   machine uses, removed on drop).
//! - `spawn(i, program)`: a process inside host `i` (`ip netns exec`), kept
//!   and ended by its process id ([`Hosts::stop`], and on drop).
//! - `cut(a, b)` / `heal(a, b)`: a silent partition between two hosts (each
//!   routes the other's address into a port whose peer is down, with a
//!   permanent neighbour entry: packets vanish, no error reaches a sender,
//!   connections time out as across a real network cut); `isolate(i)` cuts
//!   a host from every other and from this process.
//!
//! Delay and loss need the kernel's `sch_netem`, which this VM's kernel
//! lacks; `delay` says so rather than pretending. Needs root and iproute2.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static BEDS: AtomicU32 = AtomicU32::new(0);

/// Most hosts one bed builds (addresses .1 to .250).
pub const MAX_HOSTS: usize = 64;

/// The hosts of one test bed; torn down (processes, namespaces, the root
/// port) when dropped.
#[derive(Debug)]
pub struct Hosts {
    tag: String,
    subnet: [u8; 3],
    n: usize,
    cuts: BTreeSet<(usize, usize)>,
    isolated: BTreeSet<usize>,
    children: Vec<Child>,
}

/// Runs `ip ARGS`; its error output on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out =
        Command::new("ip").args(args).output().map_err(|e| format!("ip (apt-get install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A /24 of 10.200.0.0-10.249.255.0 that no route of the root namespace
/// touches (tried from `seed` on).
fn free_subnet(seed: u32) -> Result<[u8; 3], String> {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .map_err(|e| e.to_string())?;
    let routes = String::from_utf8_lossy(&out.stdout).to_string();
    (0..12_500u32)
        .map(|k| (seed.wrapping_add(k)) % 12_500)
        .map(|v| [10, 200 + (v / 250) as u8, (v % 250) as u8])
        .find(|s| !routes.contains(&format!("{}.{}.{}.", s[0], s[1], s[2])))
        .ok_or_else(|| "no free 10.x.y.0/24 for the test bed".into())
}

impl Hosts {
    /// Whether `create`'s error `e` says this machine cannot make network
    /// namespaces at all (not root, no iproute2): tests then skip, loudly.
    pub fn cannot_make(e: &str) -> bool {
        ["Operation not permitted", "Permission denied", "apt-get install iproute2"]
            .iter()
            .any(|m| e.contains(m))
    }

    /// [`Hosts::create`], or `None` after saying on standard error why this
    /// machine cannot make hosts (a test skips then); other errors panic.
    pub fn create_or_skip(n: usize, test: &str) -> Option<Self> {
        match Self::create(n) {
            Ok(h) => Some(h),
            Err(e) if Self::cannot_make(&e) => {
                eprintln!("SKIPPED {test}: this machine cannot make network namespaces ({e})");
                None
            }
            Err(e) => panic!("{test}: building the hosts: {e}"),
        }
    }

    /// Builds `n` hosts on one switch, reachable from this process.
    pub fn create(n: usize) -> Result<Self, String> {
        if n == 0 || n > MAX_HOSTS {
            return Err(format!("1 to {MAX_HOSTS} hosts"));
        }
        let k = BEDS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("slo{}-{k}", std::process::id());
        let subnet = free_subnet(std::process::id().wrapping_mul(7).wrapping_add(k))?;
        let mut hosts = Hosts {
            tag,
            subnet,
            n: 0,
            cuts: BTreeSet::new(),
            isolated: BTreeSet::new(),
            children: Vec::new(),
        };
        hosts.build(n).map(|()| hosts)
    }

    fn build(&mut self, n: usize) -> Result<(), String> {
        let sw = self.switch();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let ns = self.ns(i);
            ip(&["netns", "add", &ns])?;
            self.n = i + 1; // torn down from here on
            let port = format!("p{i}");
            ip(&["link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port, "netns", &sw])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", self.addr(i)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            // The void: a port whose peer stays down swallows what is routed in.
            ip(&["-n", &ns, "link", "add", "vo", "type", "veth", "peer", "name", "vi"])?;
            ip(&["-n", &ns, "link", "set", "vo", "up"])?;
        }
        // This process's port on the switch.
        let root = self.root_port();
        ip(&["link", "add", &root, "type", "veth", "peer", "name", "up0", "netns", &sw])?;
        ip(&["-n", &sw, "link", "set", "up0", "master", "br0"])?;
        ip(&["-n", &sw, "link", "set", "up0", "up"])?;
        ip(&["addr", "add", &format!("{}/24", self.client_addr()), "dev", &root])?;
        ip(&["link", "set", &root, "up"])?;
        Ok(())
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.tag)
    }

    /// The root namespace's port (at most 15 bytes).
    fn root_port(&self) -> String {
        let name = format!("s{}", self.tag.replace('-', "x"));
        name.chars().take(15).collect()
    }

    /// Host `i`'s namespace.
    pub fn ns(&self, i: usize) -> String {
        format!("{}-h{i}", self.tag)
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, i as u8 + 1)
    }

    /// The address this process reaches the hosts from.
    pub fn client_addr(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 254)
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// `program` to run inside host `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(i)]).arg(program);
        cmd
    }

    /// Starts `cmd` (from [`Hosts::command`]); its process id. Its output
    /// goes where `cmd` says (null by default).
    pub fn spawn(&mut self, mut cmd: Command) -> Result<u32, String> {
        let child = cmd.stdin(Stdio::null()).spawn().map_err(|e| e.to_string())?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Kills the process `pid` this bed started (SIGKILL) and reaps it.
    pub fn stop(&mut self, pid: u32) {
        if let Some(at) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.remove(at);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Asks the process `pid` this bed started to stop (SIGTERM, by its
    /// id) and waits for it up to `grace`, then kills it; how long it took
    /// and whether it exited by itself.
    pub fn terminate(&mut self, pid: u32, grace: std::time::Duration) -> (std::time::Duration, bool) {
        let start = clock::now();
        let Some(at) = self.children.iter().position(|c| c.id() == pid) else {
            return (std::time::Duration::ZERO, false);
        };
        let mut c = self.children.remove(at);
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        while clock::since(start) < grace {
            if let Ok(Some(_)) = c.try_wait() {
                return (clock::since(start), true);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        (clock::since(start), false)
    }

    fn route_into_void(&self, from: usize, to: Ipv4Addr) -> Result<(), String> {
        let ns = self.ns(from);
        let to = to.to_string();
        ip(&["-n", &ns, "route", "replace", &format!("{to}/32"), "dev", "vo"])?;
        ip(&[
            "-n",
            &ns,
            "neigh",
            "replace",
            &to,
            "lladdr",
            "02:00:00:00:00:01",
            "dev",
            "vo",
            "nud",
            "permanent",
        ])
    }

    fn route_back(&self, from: usize, to: Ipv4Addr) {
        let ns = self.ns(from);
        let to = to.to_string();
        let _ = ip(&["-n", &ns, "route", "del", &format!("{to}/32"), "dev", "vo"]);
        let _ = ip(&["-n", &ns, "neigh", "del", &to, "dev", "vo"]);
    }

    /// Cuts hosts `a` and `b` apart: from then on nothing either sends the
    /// other arrives, and neither is told.
    pub fn cut(&mut self, a: usize, b: usize) -> Result<(), String> {
        self.check(a)?;
        self.check(b)?;
        self.route_into_void(a, self.addr(b))?;
        self.route_into_void(b, self.addr(a))?;
        self.cuts.insert((a.min(b), a.max(b)));
        Ok(())
    }

    /// Undoes [`Hosts::cut`].
    pub fn heal(&mut self, a: usize, b: usize) {
        self.route_back(a, self.addr(b));
        self.route_back(b, self.addr(a));
        self.cuts.remove(&(a.min(b), a.max(b)));
    }

    /// Cuts host `i` from every other host and from this process.
    pub fn isolate(&mut self, i: usize) -> Result<(), String> {
        for j in (0..self.n).filter(|&j| j != i) {
            self.cut(i, j)?;
        }
        self.route_into_void(i, self.client_addr())?;
        self.isolated.insert(i);
        Ok(())
    }

    /// Undoes [`Hosts::isolate`].
    pub fn rejoin(&mut self, i: usize) {
        for j in (0..self.n).filter(|&j| j != i) {
            self.heal(i, j);
        }
        self.route_back(i, self.client_addr());
        self.isolated.remove(&i);
    }

    /// Added latency between two hosts: needs the kernel's `sch_netem`.
    pub fn delay(&mut self, a: usize, _b: usize, ms: u32) -> Result<(), String> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(a),
                "tc",
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "netem",
                "delay",
            ])
            .arg(format!("{ms}ms"))
            .output()
            .map_err(|e| format!("tc (apt-get install iproute2): {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "delay needs the kernel's sch_netem (tc: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    fn check(&self, i: usize) -> Result<(), String> {
        if i < self.n {
            Ok(())
        } else {
            Err(format!("no host {i} (of {})", self.n))
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = ip(&["link", "del", &self.root_port()]);
        for i in 0..self.n {
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["netns", "del", &self.switch()]);
    }
}
