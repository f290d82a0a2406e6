//! The real `curl` (libcurl, HTTP/2 by default over TLS) gets our typed
//! answers, never a transport error, when the gateway answers without
//! needing the request body: the body is drained (bounded) before the
//! answer, so libcurl's upload is not cut short by a stream reset. Each
//! case is repeated to catch the race the reset used to lose.

mod common;

use std::process::Command;

use common::*;

const REPEAT: usize = 30;

/// Runs curl; returns (exit code, HTTP status).
fn curl(sys: &System, http2: bool, path: &str, key: &str, body: &std::path::Path) -> (i32, String) {
    let url = format!("{}{path}", sys.base);
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20"])
        .arg(if http2 { "--http2" } else { "--http1.1" })
        .arg("--cacert")
        .arg(&sys.ca)
        .args(["-H", &format!("Authorization: Bearer {key}"), "-H", "Content-Type: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(&url)
        .output()
        .expect("curl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string())
}

#[tokio::test]
async fn curl_gets_401_404_and_413_not_stream_errors_over_http2_and_http1() {
    if Command::new("curl").arg("--version").output().is_err() {
        panic!("curl is needed for this test (Debian: apt-get install curl)");
    }
    let sys = System::start(INSTANT, 1).await;
    let small = sys.dir.join("small.json");
    std::fs::write(&small, chat_body("hi", 2, false)).unwrap();
    let unknown_model = sys.dir.join("model.json");
    std::fs::write(&unknown_model, r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    let big = sys.dir.join("big.json");
    std::fs::write(&big, format!("{{\"pad\":\"{}\"}}", "x".repeat(2 << 20))).unwrap();
    let cases: [(&str, &str, &std::path::Path, &str); 5] = [
        ("/v1/chat/completions", "sk-wrong-key-0000", &small, "401"),
        ("/v1/chat/completions", GOLD, &unknown_model, "404"),
        ("/v1/no/such/route", GOLD, &small, "404"),
        ("/v1/video/streams/nope/pause", GOLD, &small, "404"),
        ("/v1/chat/completions", GOLD, &big, "413"),
    ];
    for http2 in [true, false] {
        for (path, key, body, want) in cases {
            for i in 0..REPEAT {
                let (code, status) = curl(&sys, http2, path, key, body);
                assert_eq!(
                    (code, status.as_str()),
                    (0, want),
                    "{} {path} attempt {i}: curl exit {code} (92 = HTTP/2 stream error)",
                    if http2 { "h2" } else { "http/1.1" }
                );
            }
        }
    }
}
