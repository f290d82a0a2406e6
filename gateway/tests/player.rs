//! The live video player page end to end in a real browser: headless
//! Chromium (Debian's `chromium`, installed by scripts/test-all) loads
//! `GET /player` from a real `gateway up`, and gateway/tests/player_check.py
//! drives it over the DevTools protocol: frames drawn and changing, pause
//! stopping playback, a prompt switch showing the new epoch, attaching to
//! a stream created elsewhere, the key kept in the tab's memory only, no
//! page error (CSP included). The screenshot
//! it takes is docs/img/player.png when `PLAYER_SCREENSHOT` names that path.
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
    let python = std::env::var("OPENAI_PYTHON").unwrap_or_else(|_| {
        panic!("OPENAI_PYTHON is not set: run the suite with scripts/test-all (it installs the Python client, websockets and Chromium)")
    });
    let sys = System::start(INSTANT, 1).await;
    let dir = std::env::temp_dir().join(format!("player-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
    let shot =
        std::env::var("PLAYER_SCREENSHOT").unwrap_or_else(|_| dir.join("player.png").display().to_string());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/player_check.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .env("DEVTOOLS_PORT_FILE", profile.join("DevToolsActivePort"))
        .env("API_KEY", GOLD)
        .env("SCREENSHOT", &shot)
        .env("GATEWAY", &sys.base)
        .env("CA_FILE", &sys.ca)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("the browser check ends")
        .unwrap();
    chromium.kill().await.ok();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("OK"), "player_check.py:\n{stdout}\n{stderr}");
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of the page");
    std::fs::remove_dir_all(&dir).ok();
}
