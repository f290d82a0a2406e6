//! A live video stream's client for `chaos --fleet`: it creates its stream,
//! reads the feed, and resumes it through another gateway when it breaks,
//! counting gaps, duplicates and resumes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;

use super::{Balancer, Tally};
use crate::client::{body_bytes, Conn, Proto};
use crate::sse::SseParser;

/// One live video stream's client: creates it through a gateway (stream
/// `n` through the `n`th in turn, so that every gateway owns some and a
/// killed one surely had one), reads its feed there, and resumes it
/// through the next gateway whenever the feed breaks; deletes it when the
/// run ends.
pub(super) async fn video_client(lb: Arc<Balancer>, tally: Arc<Tally>, n: u32, stop: Arc<AtomicBool>) {
    let key = "sk-demo-gold";
    let home = n as usize % lb.urls.len();
    let mut id = None;
    let mut created_on = home;
    for attempt in 0..20 {
        let i = if attempt == 0 { home } else { lb.pick() };
        created_on = i;
        let Ok(conn) = Conn::connect(&lb.urls[i], None, Proto::Http1).await else { continue };
        let body = serde_json::json!({"prompt": format!("fleet stream {n}")}).to_string();
        if let Ok(resp) = conn.post_json("/v1/video/streams", Some(key), body).await {
            if resp.status() == http::StatusCode::CREATED {
                let v: serde_json::Value =
                    serde_json::from_slice(&body_bytes(resp).await.unwrap_or_default()).unwrap_or_default();
                id = v["id"].as_str().map(str::to_string);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(id) = id else {
        tally.fail(format!("video stream {n}: could not be created"));
        return;
    };
    tally.video.lock().unwrap().streams += 1;
    let mut last: Option<u64> = None;
    let mut broke_at = None;
    let mut resumed = false;
    let mut first = Some(created_on);
    'feeds: while !stop.load(Ordering::Relaxed) {
        let i = first.take().unwrap_or_else(|| lb.pick());
        let Ok(conn) = Conn::connect(&lb.urls[i], None, Proto::Http1).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut req = http::Request::get(format!("/v1/video/streams/{id}/events"))
            .header("authorization", format!("Bearer {key}"));
        if let Some(l) = last {
            req = req.header("last-event-id", l.to_string());
        }
        let Ok(req) = req.body(http_body_util::Full::new(bytes::Bytes::new())) else { return };
        let resp = match conn.send(req).await {
            Ok(r) if r.status() == http::StatusCode::OK => r,
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if resumed {
            tally.video.lock().unwrap().resumes += 1;
        }
        resumed = true;
        let mut body = resp.into_body();
        let mut parser = SseParser::new();
        loop {
            if stop.load(Ordering::Relaxed) {
                break 'feeds;
            }
            let frame = match tokio::time::timeout(Duration::from_secs(10), body.frame()).await {
                Ok(Some(Ok(f))) => f,
                _ => break, // broken, ended or silent for 10 s: resume elsewhere
            };
            for e in parser.push(&frame.into_data().unwrap_or_default()) {
                match e.event.as_deref() {
                    Some("chunk") => {
                        let v: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
                        let Some(index) = v["index"].as_u64() else { continue };
                        let mut f = tally.video.lock().unwrap();
                        f.chunks += 1;
                        match last {
                            Some(l) if index <= l => f.duplicates += 1,
                            Some(l) if index > l + 1 => f.gaps += index - l - 1,
                            None if index > 0 => f.gaps += index,
                            _ => {}
                        }
                        if let Some(at) = broke_at.take() {
                            f.longest_resume_s =
                                f.longest_resume_s.max(crate::clock::since(at).as_secs_f64());
                        }
                        last = Some(last.map_or(index, |l| l.max(index)));
                    }
                    Some("end") => {
                        if !stop.load(Ordering::Relaxed) {
                            tally.video.lock().unwrap().ended_early += 1;
                            tally.fail(format!("video stream {n}: ended early: {}", e.data));
                        }
                        return;
                    }
                    _ => {}
                }
            }
        }
        broke_at.get_or_insert_with(crate::clock::now);
    }
    // The run is over: delete it through any gateway.
    for _ in 0..3 {
        let i = lb.pick();
        let Ok(conn) = Conn::connect(&lb.urls[i], None, Proto::Http1).await else { continue };
        let Ok(req) = http::Request::delete(format!("/v1/video/streams/{id}"))
            .header("authorization", format!("Bearer {key}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
        else {
            return;
        };
        if conn.send(req).await.is_ok_and(|r| r.status() == http::StatusCode::OK) {
            return;
        }
    }
}
