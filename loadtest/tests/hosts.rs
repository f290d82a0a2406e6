//! The multi-host test bed (`loadtest::chaos::hosts`) on this machine's
//! kernel: hosts reach each other, a cut is silent and between two hosts
//! only, isolation reaches this process too, and nothing is left behind.
//! Needs root and iproute2 (scripts/test-all installs iproute2).
// Real time: the kernel's network.
#![allow(clippy::disallowed_methods)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loadtest::chaos::hosts::Hosts;
/// A TCP listener inside host `i` (a `python3` one-liner that accepts
/// and holds connections), and whether this process reaches it.
fn connects(to: Ipv4Addr, port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from((to, port)), Duration::from_millis(700)).is_ok()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn listen(h: &mut Hosts, i: usize, port: u16) {
    let script = format!(
        "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('{}',{port}))\ns.listen(64)\nc=[]\nwhile True:\n  c.append(s.accept())\n",
        h.addr(i)
    );
    let mut cmd = h.command(i, "python3");
    cmd.args(["-c", &script]).stdout(Stdio::null()).stderr(Stdio::null());
    h.spawn(cmd).unwrap();
    let start = Instant::now();
    while !connects(h.addr(i), port) {
        assert!(start.elapsed() < Duration::from_secs(10), "listener on host {i} came up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether host `from` connects to `to:port` within 700 ms (bash's
/// /dev/tcp inside the namespace), and how long it took to find out.
fn host_connects(h: &Hosts, from: usize, to: Ipv4Addr, port: u16) -> (bool, Duration) {
    let start = Instant::now();
    let ok = h
        .command(from, "timeout")
        .args(["0.7", "bash", "-c", &format!("exec 3<>/dev/tcp/{to}/{port}")])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    (ok, start.elapsed())
}

#[test]
fn hosts_reach_each_other_until_cut_and_a_cut_is_silent() {
    let Some(mut h) = Hosts::create_or_skip(3, "hosts_reach_each_other_until_cut_and_a_cut_is_silent") else {
        return;
    };
    let port = free_port();
    listen(&mut h, 1, port);
    listen(&mut h, 2, port);
    assert!(host_connects(&h, 0, h.addr(1), port).0, "host 0 reaches host 1");
    h.cut(0, 1).unwrap();
    let (ok, took) = host_connects(&h, 0, h.addr(1), port);
    assert!(!ok, "cut: host 0 no longer reaches host 1");
    assert!(
        took >= Duration::from_millis(600),
        "silently: the attempt timed out ({took:?}), no error came back"
    );
    assert!(host_connects(&h, 0, h.addr(2), port).0, "the cut is between 0 and 1 only");
    assert!(host_connects(&h, 1, h.addr(2), port).0);
    h.heal(0, 1);
    assert!(host_connects(&h, 0, h.addr(1), port).0, "healed");
    // Isolated: not even this process reaches it.
    h.isolate(2).unwrap();
    assert!(!connects(h.addr(2), port));
    assert!(!host_connects(&h, 1, h.addr(2), port).0);
    h.rejoin(2);
    assert!(connects(h.addr(2), port));
    let ns = h.ns(0);
    drop(h);
    let left =
        String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
    assert!(!left.contains(&ns), "torn down: {left}");
}
