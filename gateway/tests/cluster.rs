//! Several gateways on one real `redis-server`: a tenant's limits hold
//! across gateways; engines registered through one are used by the other;
//! a reload on one is active on both; the leader lease moves when the
//! leader dies; Redis killed during load fails no request, and state comes
//! back when Redis does; gateways whose clocks disagree count one window.
//! The same fleet on hosts of its own: `fleet_hosts.rs`.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Full;
use loadtest::client::{body_bytes, Proto};
use serde_json::{json, Value};

fn ready_engines(r: &Value) -> usize {
    r["detail"]["engines"].as_array().map_or(0, |e| e.iter().filter(|e| e["ready"] == true).count())
}

#[tokio::test]
async fn two_gateways_share_engines_limits_and_the_policy() {
    let redis = start_redis();
    let url = redis.url();
    let policy = default_policy().replacen("max_concurrency = 256", "max_concurrency = 2", 3);
    let a = System::start_with_policy(&paced(0, 40), 1, &["--redis", &url], Some(&policy)).await;
    let b = System::serve_beside(&a, &policy, &["--redis", &url]).await;
    // B has no engines of its own: it finds A's in the registry.
    let r = wait_ready(&b, "B discovers the engine", |r| ready_engines(r) == 1).await;
    assert_eq!(r["detail"]["engines"][0]["id"], a.engines[0].id.as_str());
    assert_eq!(r["detail"]["cluster"]["mode"], "redis");
    let (ca, cb) = (a.conn(Proto::H2).await, b.conn(Proto::H2).await);
    let resp = cb.send(request("/v1/chat/completions", GOLD, chat_body("hi", 4, false), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "B serves on the discovered engine");
    // Bronze may have 2 requests open fleet-wide: one held on each gateway.
    let prompt = long_prompt(80);
    let held_a = ca.post_json("/v1/completions", Some(BRONZE), completion(&prompt, 60, true)).await.unwrap();
    let held_b = cb.post_json("/v1/completions", Some(BRONZE), completion(&prompt, 60, true)).await.unwrap();
    assert_eq!((held_a.status(), held_b.status()), (StatusCode::OK, StatusCode::OK));
    for conn in [&ca, &cb] {
        let resp = conn.post_json("/v1/completions", Some(BRONZE), completion("x", 2, false)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        // The same answer as on a single gateway: an admission decision.
        assert_eq!(header(&resp, "x-admission"), "rejected");
        assert_eq!(header(&resp, "x-admission-reason"), "tenant_concurrency");
        assert_eq!(json(&body_bytes(resp).await.unwrap())["error"]["code"], "tenant_concurrency");
    }
    drop(sse_events(held_a).await);
    let resp = cb.post_json("/v1/completions", Some(BRONZE), completion("x", 2, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "a lease released on A frees capacity on B");
    drop(sse_events(held_b).await);
    // A reload applied on A becomes active on B.
    let text = default_policy().replacen("max_concurrency = 256", "max_concurrency = 3", 3);
    let version = PolicyVersion::of(&text);
    let admin = a.admin_conn().await;
    let req = http::Request::put("/admin/policies")
        .header("authorization", format!("Bearer {}", a.admin_token()))
        .body(http_body_util::Full::new(bytes::Bytes::from(text)))
        .unwrap();
    assert_eq!(admin.send(req).await.unwrap().status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp =
            cb.send(request("/v1/chat/completions", GOLD, chat_body("hi", 2, false), &[])).await.unwrap();
        if resp.headers()["x-policy-version"] == version.as_str() {
            break;
        }
        assert!(Instant::now() < deadline, "B never took A's reload");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let audit = b.admin_conn().await;
    let body =
        body_bytes(audit.get("/admin/policies/audit", Some(ADMIN_TOKEN)).await.unwrap()).await.unwrap();
    assert_eq!(json(&body)["entries"][0]["source"], "cluster");
}

#[tokio::test]
async fn a_policy_written_into_redis_without_the_fleet_key_is_refused() {
    let redis = start_redis();
    let url = redis.url();
    let sys = System::start_with_policy(&paced(0, 1), 1, &["--redis", &url], Some(&default_policy())).await;
    wait_ready(&sys, "Redis up", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    // The gateway's first round publishes its own signed policy: wait for
    // it, or it could land just after the forgery below and overwrite it
    // unread.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let published = |raw: String| raw.starts_with('$') && !raw.starts_with("$-1"); // a bulk string, not nil
    while !published(redis.command(&["GET", "slo:policy"])) {
        assert!(std::time::Instant::now() < deadline, "the gateway never published its policy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Someone with write access to Redis publishes a policy with their own
    // key, unsigned and then with a made-up signature.
    let forged = default_policy().replacen(
        "keys = [\"sk-demo-gold\"]",
        "keys = [\"sk-demo-gold\", \"sk-attacker\"]",
        1,
    );
    assert_ne!(forged, default_policy(), "the forged policy adds a key");
    let version = PolicyVersion::of(&forged);
    for mac in [None, Some("00".repeat(32))] {
        let mut doc = serde_json::json!({"version": version, "text": forged});
        if let Some(m) = &mac {
            doc["mac"] = m.clone().into();
        }
        assert_eq!(redis.command(&["SET", "slo:policy", &doc.to_string()]), "+OK");
        // A sync round (every 500 ms) sees it and refuses it: wait for that
        // (bounded; slower when the machine is loaded), then check.
        let why = if mac.is_none() { "unsigned" } else { "bad_signature" };
        let counter = format!("gateway_cluster_policy_rejected_total{{why=\"{why}\"}}");
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while metric(&sys.metrics().await, &counter).unwrap_or(0.0) < 1.0 {
            assert!(std::time::Instant::now() < deadline, "{counter} never counted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let conn = sys.conn(Proto::H2).await;
        let resp =
            conn.post_json("/v1/chat/completions", Some("sk-attacker"), chat_body("hi", 2, false)).await;
        assert_eq!(resp.unwrap().status(), StatusCode::UNAUTHORIZED, "forged policy applied ({mac:?})");
    }
    // And the gateway put its own signed version back.
    let raw = redis.command(&["GET", "slo:policy"]);
    assert!(raw.starts_with('$'), "{raw}");
}

/// The version id of a policy text.
struct PolicyVersion;

impl PolicyVersion {
    fn of(text: &str) -> String {
        policies::PolicyDocument::parse("t", text).unwrap().version
    }
}

#[tokio::test]
async fn requests_per_minute_hold_across_gateways() {
    let redis = start_redis();
    let url = redis.url();
    let policy = default_policy().replacen(
        "priority_weight = 2\n",
        "priority_weight = 2\nrequests_per_minute = 3\n",
        1,
    );
    assert_ne!(policy, default_policy());
    let a = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&policy)).await;
    let b = System::serve_beside(&a, &policy, &["--redis", &url]).await;
    wait_ready(&b, "B discovers the engine", |r| ready_engines(r) == 1).await;
    let (ca, cb) = (a.conn(Proto::H2).await, b.conn(Proto::H2).await);
    // Windows are wall-clock minutes: a run that straddles one starts over.
    for _attempt in 0..2 {
        let minute =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 60;
        let mut statuses = Vec::new();
        for conn in [&ca, &cb, &ca, &cb] {
            let resp = conn
                .send(request("/v1/chat/completions", SILVER, chat_body("hi", 2, false), &[]))
                .await
                .unwrap();
            let remaining =
                resp.headers().get("x-ratelimit-remaining-requests").map(|v| v.to_str().unwrap().to_string());
            statuses.push((resp.status(), resp.headers().get("retry-after").is_some(), remaining));
            let _ = body_bytes(resp).await;
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 60;
        if now != minute {
            continue;
        }
        assert_eq!(statuses[..3].iter().filter(|s| s.0 == StatusCode::OK).count(), 3, "{statuses:?}");
        assert_eq!(
            (statuses[3].0, statuses[3].1),
            (StatusCode::TOO_MANY_REQUESTS, true),
            "the 4th in a minute, fleet-wide"
        );
        // OpenAI's header counts the fleet's window down, whichever gateway answers.
        let remaining: Vec<_> = statuses.iter().map(|s| s.2.as_deref().unwrap_or("-")).collect();
        assert_eq!(remaining, ["2", "1", "0", "0"], "{statuses:?}");
        return;
    }
    panic!("two attempts straddled minute boundaries");
}

#[tokio::test]
async fn the_leader_lease_moves_when_the_leader_dies() {
    let redis = start_redis();
    let url = redis.url();
    let mut a = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&default_policy())).await;
    wait_ready(&a, "A leads", |r| r["detail"]["cluster"]["leader"] == true).await;
    let b = System::serve_beside(&a, &default_policy(), &["--redis", &url]).await;
    let r = wait_ready(&b, "B has joined", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    assert_eq!(r["detail"]["cluster"]["leader"], false, "one leader at a time");
    a.child.start_kill().unwrap();
    let _ = a.child.wait().await;
    let started = Instant::now();
    wait_ready(&b, "B takes over", |r| r["detail"]["cluster"]["leader"] == true).await;
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn redis_dying_under_load_fails_no_request_and_state_comes_back() {
    let mut redis = start_redis();
    let url = redis.url();
    let sys = System::start_with_policy(&paced(1, 2), 2, &["--redis", &url], Some(&default_policy())).await;
    wait_ready(&sys, "Redis up", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    let load = ChatLoad::start(&sys, 2000).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.kill();
    let r = wait_ready(&sys, "Redis down is reported", |r| r["detail"]["cluster"]["redis_up"] == false).await;
    assert_eq!(r["ready"], true, "still ready without Redis");
    assert!(sys.metrics().await.contains("gateway_cluster_redis_up 0"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.restart().unwrap();
    wait_ready(&sys, "Redis back", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    // The fresh Redis is filled again: the policy republished, both engines
    // registered again, the leader lease retaken.
    let deadline = Instant::now() + Duration::from_secs(8);
    let load_key = format!("slo:load:{}", sys.engines[0].id);
    while redis.command(&["EXISTS", "slo:policy"]) != ":1"
        || redis.command(&["EXISTS", &load_key]) != ":1"
        || redis.command(&["SCARD", "slo:engines"]) != ":2"
        || redis.command(&["EXISTS", "slo:leader"]) != ":1"
    {
        assert!(Instant::now() < deadline, "state did not resync into the restarted Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    load.stop_expecting_no_failure().await;
}

/// Four connections of streamed gold chats, back to back, until stopped
/// (at most `limit` each): the load of the Redis fault tests.
struct ChatLoad {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<(usize, Vec<String>)>>,
}

impl ChatLoad {
    async fn start(sys: &System, limit: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (conn, stop) = (sys.conn(Proto::H2).await, Arc::clone(&stop));
            workers.push(tokio::spawn(async move {
                let (mut sent, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) && sent < limit {
                    sent += 1;
                    match conn
                        .send(request("/v1/chat/completions", GOLD, chat_body("hi", 4, true), &[]))
                        .await
                    {
                        Ok(r) if r.status() == StatusCode::OK => {
                            if sse_events(r).await.last().map(|e| e.data.as_str()) != Some("[DONE]") {
                                failed.push("unfinished stream".to_string());
                            }
                        }
                        Ok(r) => failed.push(r.status().to_string()),
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (sent, failed)
            }));
        }
        Self { stop, workers }
    }

    /// Stops the load; asserts it sent a fair number and none failed.
    async fn stop_expecting_no_failure(self) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut sent, mut failed) = (0, Vec::new());
        for w in self.workers {
            let (n, f) = w.await.unwrap();
            sent += n;
            failed.extend(f);
        }
        assert!(sent > 50, "only {sent} requests");
        assert!(failed.is_empty(), "{} of {sent} failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
    }
}

/// Keys and usage across a fleet: a key made on one gateway works on the
/// other within 2 s, its revocation is refused there within 2 s, usage
/// counted on both gateways adds up in Redis, and counts made while Redis
/// is down reach it when it is back (nothing lost, nothing counted twice).
#[tokio::test]
async fn keys_and_usage_are_fleet_wide_and_survive_a_redis_outage() {
    let mut redis = start_redis();
    let url = redis.url();
    let a = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&default_policy())).await;
    let b = System::serve_beside(&a, &default_policy(), &["--redis", &url]).await;
    wait_ready(&b, "B discovers the engine", |r| ready_engines(r) == 1).await;
    let (status, made) = admin_json(&a, "POST", "/admin/keys", Some(json!({"tenant": "demo-gold"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (id, secret) = (made["id"].as_str().unwrap().to_string(), made["key"].as_str().unwrap().to_string());
    let (ca, cb) = (a.conn(Proto::H2).await, b.conn(Proto::H2).await);
    let chat = || request("/v1/chat/completions", &secret, chat_body("hi", 3, false), &[]);
    within(Duration::from_secs(2), "B knows the new key", async || {
        let r = cb.send(chat()).await.unwrap();
        let ok = r.status() == StatusCode::OK;
        let _ = body_bytes(r).await;
        ok
    })
    .await;
    let r = ca.send(chat()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let _ = body_bytes(r).await;
    // Both gateways' counts add up in Redis (A reads them back).
    let requests = async |sys: &System| {
        let (_, v) = admin_json(sys, "GET", "/admin/usage?group_by=key", None).await;
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == id.as_str())
            .map_or(0, |r| r["requests"].as_u64().unwrap())
    };
    within(Duration::from_secs(3), "A sees both gateways' usage", async || requests(&a).await == 2).await;

    // Redis down: both keep serving the key; the counts wait, then land.
    redis.kill();
    wait_ready(&a, "A sees Redis down", |r| r["detail"]["cluster"]["redis_up"] == false).await;
    for _ in 0..3 {
        let r = ca.send(chat()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "served without Redis");
        let _ = body_bytes(r).await;
    }
    redis.restart().unwrap();
    wait_ready(&a, "Redis back", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    // This Redis came back empty: what reaches it is what A held pending.
    let day = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_secs() / 86_400;
    let field = format!("demo-gold\u{1f}{id}\u{1f}{MODEL}\u{1f}requests");
    within(Duration::from_secs(5), "the outage's counts reach Redis, once", async || {
        redis.command(&["HINCRBY", &format!("slo:usage:{day}"), &field, "0"]) == ":3"
    })
    .await;
    within(Duration::from_secs(3), "the keys are written back to the empty Redis", async || {
        redis.command(&["HEXISTS", "slo:keys", &id]) == ":1"
    })
    .await;

    // Revoked on A, refused by B within 2 s.
    let (status, _) = admin_json(&a, "DELETE", &format!("/admin/keys/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    let took = within(Duration::from_secs(2), "B refuses the revoked key", async || {
        let r = cb.send(chat()).await.unwrap();
        let refused = r.status() == StatusCode::UNAUTHORIZED;
        let _ = body_bytes(r).await;
        refused
    })
    .await;
    eprintln!("revocation reached B in {took:?}");
}

/// The Responses API across a fleet: a response stored through one gateway
/// is read, continued and deleted through another (Redis holds it), and
/// stays the tenant's own.
#[tokio::test]
async fn a_stored_response_continues_on_another_gateway() {
    let redis = start_redis();
    let url = redis.url();
    let a = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&default_policy())).await;
    let b = System::serve_beside(&a, &default_policy(), &["--redis", &url]).await;
    wait_ready(&b, "B discovers the engine", |r| ready_engines(r) == 1).await;
    let (ca, cb) = (a.conn(Proto::H2).await, b.conn(Proto::H2).await);
    let body = json!({"model": MODEL, "input": "Tell me a story", "instructions": "be brief"});
    let resp = ca.send(request("/v1/responses", GOLD, body.to_string(), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let first = json(&body_bytes(resp).await.unwrap());
    let id = first["id"].as_str().unwrap().to_string();
    let get = |key: &str| {
        http::Request::get(format!("/v1/responses/{id}"))
            .header("authorization", format!("Bearer {key}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    within(Duration::from_secs(2), "B reads A's stored response", async || {
        cb.send(get(GOLD)).await.unwrap().status() == StatusCode::OK
    })
    .await;
    assert_eq!(cb.send(get(SILVER)).await.unwrap().status(), StatusCode::NOT_FOUND, "another tenant's");
    let next =
        json!({"model": MODEL, "input": "And then?", "previous_response_id": id, "instructions": "be brief"});
    let resp = cb.send(request("/v1/responses", GOLD, next.to_string(), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let second = json(&body_bytes(resp).await.unwrap());
    let before =
        first["usage"]["input_tokens"].as_u64().unwrap() + first["usage"]["output_tokens"].as_u64().unwrap();
    assert!(
        second["usage"]["input_tokens"].as_u64().unwrap() > before,
        "the conversation is the prefix: {second}"
    );
    let delete = http::Request::delete(format!("/v1/responses/{id}"))
        .header("authorization", format!("Bearer {GOLD}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(cb.send(delete).await.unwrap().status(), StatusCode::OK);
    assert_eq!(redis.command(&["EXISTS", &format!("slo:resp:demo-gold:{id}")]), ":0");
    assert_eq!(ca.send(get(GOLD)).await.unwrap().status(), StatusCode::NOT_FOUND, "deleted fleet-wide");
}

/// Redis behind Sentinel (a primary, a replica, three sentinels): the
/// primary is SIGKILLed under load; Sentinel promotes the replica, and the
/// gateway and its engines follow it: within 5 s of the promotion both
/// write to the new primary again (keys deleted there come back), and no
/// request failed meanwhile (the gateway served on local limits while no
/// primary answered).
#[tokio::test]
async fn the_fleet_follows_a_sentinel_failover_under_load_and_fails_no_request() {
    let dir = scratch_dir();
    let mut primary = start_redis();
    let replica = Redis::start_replica(&dir, primary.port).unwrap();
    let sentinels: Vec<Sentinel> =
        (0..3).map(|_| Sentinel::start(&dir, "fleet", primary.port).unwrap()).collect();
    within(Duration::from_secs(20), "the replica syncs and the sentinels find each other", async || {
        let master = sentinels[0].reply(&["SENTINEL", "MASTER", "fleet"]);
        replica.reply(&["INFO", "replication"]).contains("master_link_status:up")
            && master.contains("num-other-sentinels\r\n$1\r\n2\r\n")
            && master.contains("num-slaves\r\n$1\r\n1\r\n")
    })
    .await;
    let hosts: Vec<String> = sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
    let url = format!("redis+sentinel://{}/fleet", hosts.join(","));
    let sys = System::start_with_policy(&paced(1, 2), 2, &["--redis", &url], Some(&default_policy())).await;
    wait_ready(&sys, "Redis up through Sentinel", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    let engine_key = format!("slo:engine:{}", sys.engines[0].id);
    let deadline = Instant::now() + Duration::from_secs(8);
    while primary.command(&["EXISTS", "slo:leader"]) != ":1"
        || primary.command(&["EXISTS", &engine_key]) != ":1"
    {
        assert!(
            Instant::now() < deadline,
            "state not written to the primary: {}",
            primary.reply(&["KEYS", "*"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let load = ChatLoad::start(&sys, 4000).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    primary.kill();
    let promoted = format!("\r\n{}\r\n", replica.port);
    within(Duration::from_secs(30), "Sentinel promotes the replica", async || {
        sentinels[0].reply(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "fleet"]).contains(&promoted)
    })
    .await;
    // The gateway renews its leader lease every 0.5 s and engines their
    // registration every 3 s: deleted on the new primary, both come back.
    replica.command(&["DEL", "slo:leader", &engine_key]);
    let took = within(Duration::from_secs(5), "the fleet writes to the promoted replica", async || {
        replica.command(&["EXISTS", "slo:leader"]) == ":1"
            && replica.command(&["EXISTS", &engine_key]) == ":1"
    })
    .await;
    eprintln!("the fleet wrote to the new primary {took:?} after the promotion was visible");
    wait_ready(&sys, "Redis up again", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    load.stop_expecting_no_failure().await;
}

/// Sentinel sets that give no usable primary: one naming a primary that
/// is down, one asked for a name it does not know, one that does not
/// answer at all. Each gateway serves on local limits, counts the reason
/// (`gateway_cluster_redis_sentinel_errors_total{reason}`) and never hangs.
#[tokio::test]
async fn sentinels_without_a_usable_primary_are_refused_with_a_reason_and_serving_goes_on() {
    let dir = scratch_dir();
    let primary = start_redis();
    let sentinel = Sentinel::start(&dir, "fleet", primary.port).unwrap();
    within(Duration::from_secs(5), "the sentinel watches the primary", async || {
        sentinel.reply(&["SENTINEL", "MASTER", "fleet"]).contains("\r\nmaster\r\n")
    })
    .await;
    drop(primary);
    within(Duration::from_secs(10), "the sentinel sees the primary down", async || {
        sentinel.reply(&["SENTINEL", "MASTER", "fleet"]).contains("s_down")
    })
    .await;
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cases = [
        (format!("redis+sentinel://127.0.0.1:{}/fleet", sentinel.port), "no_primary"),
        (format!("redis+sentinel://127.0.0.1:{}/nobody", sentinel.port), "no_primary"),
        (format!("redis+sentinel://127.0.0.1:{},127.0.0.1:{}/fleet", free(), free()), "unreachable"),
    ];
    for (url, reason) in cases {
        let sys =
            System::start_with_policy(&paced(0, 1), 1, &["--redis", &url], Some(&default_policy())).await;
        let conn = sys.conn(Proto::H2).await;
        let r =
            conn.send(request("/v1/chat/completions", GOLD, chat_body("hi", 2, false), &[])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{url}: served on local limits");
        let counted = format!("gateway_cluster_redis_sentinel_errors_total{{reason=\"{reason}\"}}");
        within(Duration::from_secs(5), &counted, async || sys.metrics().await.contains(&counted)).await;
        assert_eq!(sys.readyz().await["detail"]["cluster"]["redis_up"], false, "{url}");
    }
}

/// Two gateways whose clocks are 2 s behind and 2 s ahead, either side of
/// a minute's end: the requests they let through count in one window and
/// their leases expire alike, because the limit scripts read Redis's clock
/// (on the gateways' clocks the window would split and let 4 of a limit of
/// 3 through, and a lease written 2 s behind would look 4 s older to the
/// other gateway).
#[tokio::test]
async fn gateways_with_skewed_clocks_count_one_window_and_one_lease_clock() {
    use gateway::cluster_testing::{wall_ms, ClusterConfig, Denied, Limits, RedisState};
    let redis = start_redis();
    let state = || {
        let target = fleet_redis::Target::parse(&redis.url()).unwrap();
        RedisState::new(target, &ClusterConfig { timeout_ms: 500, ..ClusterConfig::default() })
    };
    let (a, b) = (state(), state());
    let edge = (wall_ms() / 60_000 + 1) * 60_000;
    let (behind, ahead) = (edge - 1_000, edge + 1_000);
    let rpm = Limits { max_concurrency: None, requests_per_minute: Some(3), tokens_per_minute: None };
    let mut granted = 0;
    for (gw, now) in [(&a, behind), (&b, ahead), (&a, behind), (&b, ahead)] {
        if gw.acquire("skew", rpm, 1, now).await.unwrap().is_ok() {
            granted += 1;
        }
    }
    assert_eq!(granted, 3, "one window for both clocks: 3 of 4 within a limit of 3");
    // A lease taken by a gateway whose clock is a minute behind is live for
    // one a minute ahead: its expiry is Redis's now + the TTL.
    let conc = Limits { max_concurrency: Some(1), requests_per_minute: None, tokens_per_minute: None };
    assert!(a.acquire("lease", conc, 1, behind - 60_000).await.unwrap().is_ok());
    let denied = b.acquire("lease", conc, 1, ahead + 60_000).await.unwrap();
    assert_eq!(denied.unwrap_err(), Denied::Concurrency { limit: 1 });
    a.heartbeat().await.unwrap();
    let still = b.acquire("lease", conc, 1, ahead + 60_000).await.unwrap();
    assert_eq!(still.unwrap_err(), Denied::Concurrency { limit: 1 }, "renewed on Redis's clock");
}

/// Keys the gateways own, overwritten with another type by someone with
/// Redis access: the gateway keeps serving (that tenant on local limits),
/// does not take Redis for down, and counts and logs each bad key.
#[tokio::test]
async fn keys_of_the_wrong_type_in_redis_are_refused_and_serving_goes_on() {
    let redis = start_redis();
    let url = redis.url();
    let sys = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&default_policy())).await;
    wait_ready(&sys, "on Redis", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    // Its policy published first: a publish after the replacement below
    // would overwrite it (SET takes any key) and no bad key would be read.
    within(Duration::from_secs(5), "the policy is published", async || {
        redis.command(&["EXISTS", "slo:policy"]) == ":1"
    })
    .await;
    for args in [
        &["SET", "slo:lease:demo-gold", "not a sorted set"][..],
        // The gateway published its policy there already: replace it.
        &[
            "EVAL",
            "redis.call('DEL', KEYS[1]) return redis.call('HSET', KEYS[1], 'version', 'x')",
            "1",
            "slo:policy",
        ],
        &["SET", "slo:engines", "not a set"],
    ] {
        redis.command(args);
    }
    let conn = sys.conn(Proto::H2).await;
    for _ in 0..3 {
        let resp =
            conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("hi", 2, false)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "gold is served on local limits");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = sys.metrics().await;
        let bad = |family: &str| {
            metric(&m, &format!("gateway_cluster_redis_bad_keys_total{{family=\"{family}\"}}")).unwrap_or(0.0)
        };
        if bad("window_or_lease") >= 3.0 && bad("policy") >= 1.0 && bad("engines") >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "every bad key counted: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = sys.readyz().await;
    assert_eq!(r["detail"]["cluster"]["redis_up"], true, "a bad key is not Redis being down: {r}");
    assert!(sys.log().contains("redis_key_wrong_type"));
}
