//! The live video player page end to end in a real browser: headless
//! Chromium (Debian's `chromium`, installed by scripts/test-all) loads
//! `GET /player` from a real `gateway up`, and gateway/tests/player_check.py
//! drives it over the DevTools protocol: frames drawn and changing, pause
//! stopping playback, a prompt switch showing the new epoch, attaching to
//! a stream created elsewhere, the key kept in the tab's memory only, no
//! page error (CSP included); and, with a feed minutes ahead of playback,
//! the page's own bounds (2,048 queued frames, 200 log lines). The
//! screenshot it takes is docs/img/player.png when `PLAYER_SCREENSHOT`
//! names that path.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Stdio;

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Proto};

#[tokio::test]
async fn the_page_is_served_with_its_files_under_a_strict_policy() {
    let sys = System::start(INSTANT, 1).await;
    let conn = sys.conn(Proto::H2).await;
    for (path, kind) in [
        ("/player", "text/html; charset=utf-8"),
        ("/player/player.js", "text/javascript; charset=utf-8"),
        ("/player/player.css", "text/css; charset=utf-8"),
    ] {
        let resp = conn.get(path, None).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert_eq!(header(&resp, "content-type"), kind);
        let csp = header(&resp, "content-security-policy");
        assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"), "{csp}");
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff");
        assert!(!body_bytes(resp).await.unwrap().is_empty());
    }
    let resp = conn.post_json("/player", None, "{}").await.unwrap();
    assert_eq!((resp.status(), header(&resp, "allow")), (StatusCode::METHOD_NOT_ALLOWED, "GET"));
}

#[tokio::test]
async fn headless_chromium_plays_pauses_and_switches_prompt() {
    let sys = System::start(INSTANT, 1).await;
    let dir = std::env::temp_dir().join(format!("player-test-{}", std::process::id()));
    let shot =
        std::env::var("PLAYER_SCREENSHOT").unwrap_or_else(|_| dir.join("player.png").display().to_string());
    let stdout = browser_check(&sys, &dir, &[("SCREENSHOT", shot.as_str())]).await;
    assert!(stdout.contains("OK"), "{stdout}");
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of the page");
    std::fs::remove_dir_all(&dir).ok();
}

/// A feed that runs minutes ahead of playback (the policy lets generation
/// buffer 10 minutes; the engine makes a 0.75 s chunk in 20 ms): the page's
/// frame queue stays at 2,048 frames and its log at 200 lines.
#[tokio::test]
async fn a_player_far_behind_its_feed_keeps_its_queue_and_log_bounded() {
    let policy = default_policy().replace("max_buffer_s = 6.0 ", "max_buffer_s = 600.0 ");
    assert!(policy.contains("max_buffer_s = 600.0"), "the shipped policy's buffer line moved");
    let fast = "model = \"synthetic-video\"\nengine_class = \"fast\"\nlatent_frames = 3\nbatch_cost = 0.3\n\
        [[configs]]\nsteps = 4\nsparsity = 0.0\nwindow = 7\nprecision = \"fp16\"\nchunk_ms = 20.0\nquality = 1.0\n";
    let dir = std::env::temp_dir().join(format!("player-bounds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("fast.toml"), fast).unwrap();
    let arg = format!("--engine-arg=--video-profile={}", dir.join("fast.toml").display());
    let sys = System::start_with_policy(INSTANT, 1, &[&arg], Some(&policy)).await;
    let stdout = browser_check(&sys, &dir, &[("CHECK", "bounds")]).await;
    assert!(stdout.contains("OK queued="), "{stdout}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Starts headless Chromium on `sys`'s player page and runs
/// player_check.py against it with `env`; returns its output once it passed.
async fn browser_check(sys: &System, dir: &Path, env: &[(&str, &str)]) -> String {
    let python = std::env::var("OPENAI_PYTHON").unwrap_or_else(|_| {
        panic!("OPENAI_PYTHON is not set: run the suite with scripts/test-all (it installs the Python client, websockets and Chromium)")
    });
    std::fs::create_dir_all(dir).unwrap();
    let profile = dir.join("chromium");
    let mut chromium = tokio::process::Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--mute-audio",
            // The test's own development CA is not in the browser's store.
            "--ignore-certificate-errors",
            "--remote-debugging-port=0",
            "--window-size=1100,860",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("{}/player", sys.base))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromium is installed (scripts/test-all installs Debian's chromium)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/player_check.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .env("DEVTOOLS_PORT_FILE", profile.join("DevToolsActivePort"))
        .env("API_KEY", GOLD)
        .env("GATEWAY", &sys.base)
        .env("CA_FILE", &sys.ca)
        .envs(env.iter().copied())
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(180), run)
        .await
        .expect("the browser check ends")
        .unwrap();
    chromium.kill().await.ok();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "player_check.py:\n{stdout}\n{stderr}");
    stdout
}
