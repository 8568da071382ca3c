//! The dashboard (SPEC §13) over real sockets: its JSON API, the admin
//! token, the security headers, and what a real headless browser renders.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{read_response, ReadSome, Response, TestServer};
use serde_json::Value;

const DEMO_KEY: &str = "demo-secret-key-0001";
const TOKEN: &str = "admin-token-0123456789";
/// A `publicHost` that would inject markup if anything printed it unescaped
/// (refused at start).
const HOSTILE_HOST: &str = "evil\"><img/src=x/onerror=alert(1)><b>x";

fn demo_config(top_extra: &str) -> String {
    format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null{top_extra},
        "pools":{{"demo":{{"keys":["{DEMO_KEY}"],"concurrency":3,"queue":{{"size":10,"timeoutMs":5000}}}},
                 "other":{{"keys":["other-secret-key-1"],"rpm":600}}}}}}"#
    )
}

fn admin(s: &TestServer) -> SocketAddr {
    s.admin.expect("the harness enables the admin listener")
}

fn get(addr: SocketAddr, path: &str, extra_headers: &str) -> Response {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra_headers}Connection: close\r\n\r\n");
    c.write_all(req.as_bytes()).unwrap();
    read_response(&mut c).expect("an answer")
}

fn get_json(s: &TestServer, path: &str) -> Value {
    let r = get(admin(s), path, "");
    assert_eq!(r.status, 200, "{path}: {r:?}");
    r.json()
}

/// A fail-fast acquire on `demo` with `host` as the Host header.
fn acquire_demo(s: &TestServer, host: &str) -> Response {
    let mut c = s.connect();
    let req = format!(
        "POST /pools/demo/lock/acquire HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {DEMO_KEY}\r\nContent-Length: 0\r\n\r\n"
    );
    c.write_all(req.as_bytes()).unwrap();
    read_response(&mut c).expect("an answer")
}

/// Fills `demo` (three slots held) and has one more acquire denied; returns the slot ids.
fn load_demo(s: &TestServer, host: &str) -> Vec<String> {
    let slots: Vec<String> = (0..3).map(|_| acquire_demo(s, host).slot()).collect();
    let denied = acquire_demo(s, host);
    assert_eq!(denied.status, 429, "{denied:?}");
    slots
}

/// Waits until the history holds a sample taken after the load.
fn wait_for_history(s: &TestServer, held: u64) -> Value {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let v = get_json(s, "/api/pools/demo");
        if v["history"]["held"].as_array().and_then(|a| a.last()).and_then(Value::as_u64) == Some(held) {
            return v;
        }
        assert!(Instant::now() < until, "no sample with held={held}: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn sum(v: &Value) -> u64 {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum()
}

#[test]
fn pools_json_shows_live_state_and_status() {
    let s = TestServer::start(&demo_config(""));
    let v = get_json(&s, "/api/pools");
    let demo = v["pools"].as_array().unwrap().iter().find(|p| p["name"] == "demo").unwrap().clone();
    assert_eq!((demo["held"].as_u64(), demo["status"].as_str()), (Some(0), Some("ok")));
    load_demo(&s, "localhost");
    let v = get_json(&s, "/api/pools");
    let pools = v["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2);
    let demo = pools.iter().find(|p| p["name"] == "demo").unwrap();
    assert_eq!(demo["held"], 3);
    assert_eq!(demo["limit"], 3);
    assert_eq!(demo["effectiveLimit"], 3);
    assert_eq!(demo["queueDepth"], 0);
    assert_eq!(demo["queueSize"], 10);
    assert_eq!(demo["status"], "concurrency");
    assert_eq!(demo["rpmTokens"], Value::Null);
    let other = pools.iter().find(|p| p["name"] == "other").unwrap();
    assert_eq!((other["status"].as_str(), other["rpmTokens"].as_u64()), (Some("ok"), Some(10)));
    assert!(v["serverTime"].as_u64().unwrap() > 1_600_000_000_000);

    // A pool a reload adds is listed in its place by name, as at start.
    let with_alpha = demo_config("").replacen(r#""pools":{"#, r#""pools":{"alpha":{"keys":["alpha-key-0001"]},"#, 1);
    s.reload(&with_alpha);
    let names: Vec<String> =
        get_json(&s, "/api/pools")["pools"].as_array().unwrap().iter().map(|p| p["name"].to_string()).collect();
    assert_eq!(names, [r#""alpha""#, r#""demo""#, r#""other""#]);
}

#[test]
fn a_pool_a_reload_adds_charts_its_first_grants() {
    let s = TestServer::start(&demo_config(""));
    let with_alpha = demo_config("").replacen(r#""pools":{"#, r#""pools":{"alpha":{"keys":["alpha-key-0001"]},"#, 1);
    s.reload(&with_alpha);
    // Granted at once, in the second of the reload, before any sample of it.
    for _ in 0..2 {
        let r = s.request(&common::post("/pools/alpha/lock/acquire", "alpha-key-0001", "", ""));
        assert_eq!(r.status, 200, "{r:?}");
    }
    let until = Instant::now() + Duration::from_secs(20);
    let history = loop {
        let v = get_json(&s, "/api/pools/alpha");
        if v["history"]["held"].as_array().and_then(|a| a.last()).and_then(Value::as_u64) == Some(2) {
            break v["history"].clone();
        }
        assert!(Instant::now() < until, "no sample with held=2: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(sum(&history["grants"]), 2, "both grants are charted: {history}");
}

#[test]
fn pool_json_has_history_attempts_and_examples_without_secrets() {
    let s = TestServer::start(&demo_config(""));
    let slots = load_demo(&s, "localhost");
    let v = wait_for_history(&s, 3);
    let h = &v["history"];
    assert_eq!(h["resolutionMs"], 1000);
    assert_eq!(sum(&h["grants"]), 3, "{h}");
    assert_eq!(sum(&h["deniedConcurrency"]), 1, "{h}");
    let others = ["deniedRate", "deniedCooldown", "deniedQueueFull", "deniedRecovering"];
    assert_eq!(others.iter().map(|k| sum(&h[k])).sum::<u64>(), 0, "{h}");
    assert_eq!(h["limit"].as_array().unwrap().last().unwrap(), 3);
    assert!(h["grants"].as_array().unwrap().len() <= 900);

    let attempts = v["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4);
    assert_eq!((attempts[0]["status"].as_u64(), attempts[0]["denyReason"].as_str()), (Some(429), Some("concurrency")));
    assert!(attempts[1..].iter().all(|a| a["status"] == 200 && a["slotRef"].as_str().unwrap().len() == 9));

    assert_eq!(v["config"]["concurrency"], 3);
    assert_eq!(v["config"]["queueTimeoutMs"], 5000);
    let examples = v["examples"].as_array().unwrap();
    let ids: Vec<&str> = examples.iter().map(|x| x["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["acquire", "acquire-queued", "renew", "release", "release-throttled"]);
    let lock_api = format!("export LOCK_API='http://{}/pools/demo/lock'", s.addr);
    for x in examples {
        let text = x["text"].as_str().unwrap();
        assert!(text.starts_with(&lock_api), "{text}");
        assert!(text.contains("-H \"X-Nthpool-Key: $POOL_KEY\""), "{text}");
    }
    // The queued acquire waits what this pool's queue timeout allows, and says so.
    assert!(examples[1]["text"].as_str().unwrap().contains(r#"-d '{"waitMs":5000}'"#), "{}", examples[1]);
    assert_eq!(examples[1]["title"], "Acquire, wait up to 5 s in the queue");
    let other = &get_json(&s, "/api/pools/other")["examples"][1];
    assert!(other["text"].as_str().unwrap().contains(r#"-d '{"waitMs":30000}'"#), "{other}");
    assert_eq!(other["title"], "Acquire, wait up to 30 s in the queue");
    assert!(examples[2]["text"].as_str().unwrap().contains(r#""$LOCK_API/$SLOT_ID/renew""#));
    assert!(examples[4]["text"].as_str().unwrap().contains(r#""status":429,"throttled":1"#));

    let raw = get(admin(&s), "/api/pools/demo", "");
    let body = String::from_utf8_lossy(&raw.body);
    assert!(!body.contains(DEMO_KEY) && !body.contains("other-secret-key"), "a key leaked: {body}");
    for slot in &slots {
        assert!(!body.contains(slot.as_str()), "a slot id leaked: {body}");
    }
}

/// An acquire on `demo` with `body` (JSON) as its body.
fn acquire_demo_with(s: &TestServer, body: &str) -> Response {
    let mut c = s.connect();
    let req = format!(
        "POST /pools/demo/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {DEMO_KEY}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).unwrap();
    read_response(&mut c).expect("an answer")
}

/// `demo`'s queue timeout is 5 s: a wait asked beyond it is applied as 5 s
/// (the lock API clamps it), and the attempts say both.
#[test]
fn an_attempts_wait_is_the_one_the_server_applies_beside_the_one_asked() {
    let s = TestServer::start(&demo_config(""));
    for body in [r#"{"waitMs":60000}"#, r#"{"waitMs":1000}"#] {
        assert_eq!(acquire_demo_with(&s, body).status, 200, "{body}");
    }
    let v = get_json(&s, "/api/pools/demo");
    let waits: Vec<(u64, u64)> = v["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["waitMs"].as_u64().unwrap(), a["appliedWaitMs"].as_u64().unwrap()))
        .collect();
    assert_eq!(waits, [(1000, 1000), (60_000, 5000)], "newest first: {v}");
}

#[test]
fn unknown_pools_and_methods_are_refused() {
    let s = TestServer::start(&demo_config(""));
    let r = get(admin(&s), "/api/pools/nope", "");
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
    // A browser (asking for HTML) gets a page that says so; any other
    // client the JSON error body every admin refusal has.
    let page = get(admin(&s), "/pools/nope", "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n");
    assert_eq!(page.status, 404);
    assert!(page.header("content-type").unwrap().starts_with("text/html"), "a page for the browser: {page:?}");
    let r = get(admin(&s), "/pools/nope", "");
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"), "{r:?}");
    assert!(r.header("content-type").unwrap().starts_with("application/json"), "{r:?}");
    let mut c = TcpStream::connect(admin(&s)).unwrap();
    c.write_all(b"POST /api/pools HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let r = read_response(&mut c).unwrap();
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
}

/// A route with a slash after it is that route's address with a typo a
/// browser user makes, or a link adds: a `308` to the route itself, query
/// kept, for every admin route; other methods are refused as on the route.
#[test]
fn a_trailing_slash_redirects_to_the_route_itself() {
    let s = TestServer::start(&demo_config(""));
    let html = "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n";
    for (path, location) in [
        ("/pools/demo/", "/pools/demo"),
        ("/pools/demo/?tab=examples", "/pools/demo?tab=examples"),
        ("/pools/no-such-pool/", "/pools/no-such-pool"),
        ("/api/pools/", "/api/pools"),
        ("/api/pools/demo/", "/api/pools/demo"),
        ("/assets/app.js/", "/assets/app.js"),
        ("/healthz/", "/healthz"),
        ("/metrics/", "/metrics"),
    ] {
        for extra in ["", html] {
            let r = get(admin(&s), path, extra);
            assert_eq!((r.status, r.header("location")), (308, Some(location)), "{path}: {r:?}");
            assert_secured(&r, path);
        }
        let mut c = TcpStream::connect(admin(&s)).unwrap();
        let post = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        c.write_all(post.as_bytes()).unwrap();
        let r = read_response(&mut c).unwrap();
        assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")), "POST {path}: {r:?}");
    }
    // Where the route leads, a browser gets the page and a script the JSON.
    let page = get(admin(&s), "/pools/demo", html);
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").unwrap().starts_with("text/html"), "{page:?}");
    // A path that is no route with its slash taken off stays unknown.
    for path in ["/pools/", "/nope/", "/pools/demo//", "/api/pools/demo/x/"] {
        let r = get(admin(&s), path, html);
        assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"), "{path}: {r:?}");
    }
    // A pool segment whose escape can name no pool is the route's own 400,
    // not a redirect to it.
    for path in ["/pools/a%2Fb/", "/pools/%2F%2Fevil.com/", "/api/pools/%00/", "/pools/%zz/"] {
        let r = get(admin(&s), path, html);
        assert_eq!((r.status, r.error_code().as_str()), (400, "bad_request"), "{path}: {r:?}");
        assert_eq!(r.header("location"), None, "{path}: {r:?}");
    }
}

/// A pool segment spelled with percent-escapes (RFC 3986 §6.2.2.2) names
/// the pool on the dashboard's routes too; an escape that can name no pool
/// is `400 bad_request`.
#[test]
fn a_percent_encoded_pool_name_names_the_pool_on_the_dashboard() {
    let s = TestServer::start(&demo_config(""));
    let html = "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n";
    for spelling in ["d%65mo", "d%65m%6F", "%64emo"] {
        let v = get_json(&s, &format!("/api/pools/{spelling}"));
        assert_eq!(v["pool"]["name"], "demo", "{spelling}");
        let page = get(admin(&s), &format!("/pools/{spelling}"), html);
        assert_eq!(page.status, 200, "{spelling}: {page:?}");
    }
    assert_eq!(get(admin(&s), "/api/pools/d%65m", "").status, 404);
    assert_eq!(get(admin(&s), "/pools/d%65m", html).status, 404);
    for bad in ["de%2Fmo", "de%00mo", "de%zzmo", "demo%", "DE%4DO"] {
        for path in [format!("/api/pools/{bad}"), format!("/pools/{bad}")] {
            let r = get(admin(&s), &path, html);
            assert_eq!((r.status, r.error_code().as_str()), (400, "bad_request"), "{path}: {r:?}");
            assert!(r.json()["message"].as_str().unwrap().contains("pool name"), "{path}: {r:?}");
        }
    }
}

#[test]
fn every_admin_answer_carries_the_security_headers() {
    let s = TestServer::start(&demo_config(""));
    for path in [
        "/",
        "/pools/demo",
        "/assets/app.js",
        "/assets/app.css",
        "/api/pools",
        "/api/pools/demo",
        "/healthz",
        "/metrics",
        "/nope",
    ] {
        let r = get(admin(&s), path, "");
        let csp = r.header("content-security-policy").unwrap_or_else(|| panic!("{path}: no CSP"));
        assert!(csp.contains("default-src 'self'") && !csp.contains("unsafe-inline"), "{path}: {csp}");
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"), "{path}");
        assert_eq!(r.header("referrer-policy"), Some("no-referrer"), "{path}");
    }
    let page = get(admin(&s), "/", "");
    let html = String::from_utf8_lossy(&page.body);
    assert!(page.header("content-type").unwrap().starts_with("text/html"));
    assert!(!html.contains("<script>") && html.contains(r#"<script src="/assets/app.js""#), "no inline script");
}

/// The raw `request` sent to the admin listener, and its one answer.
fn admin_exchange(s: &TestServer, request: &[u8]) -> Response {
    let mut c = TcpStream::connect(admin(s)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(request).unwrap();
    read_response(&mut c).expect("an answer")
}

fn assert_secured(r: &Response, what: &str) {
    assert_eq!(r.header("x-frame-options"), Some("DENY"), "{what}: {r:?}");
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"), "{what}");
    assert!(r.header("content-security-policy").is_some_and(|v| v.contains("frame-ancestors 'none'")), "{what}");
}

#[test]
fn the_admin_listeners_refusals_carry_the_security_headers_and_are_no_lock_api_answers() {
    let s = TestServer::start(&demo_config(""));
    let long = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: {}\r\n\r\n", "a".repeat(20_000));
    let cases: [(&str, &[u8], u16); 5] = [
        ("a bare LF", b"GET /healthz HTTP/1.1\nHost: x\n\n", 400),
        ("a newer major version", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        ("a head too large", long.as_bytes(), 431),
        (
            "a body past the limit",
            b"GET /pools/demo/lock/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
            413,
        ),
        (
            "a chunk past the limit",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffff\r\n",
            413,
        ),
    ];
    for (what, request, status) in cases {
        let r = admin_exchange(&s, request);
        assert_eq!(r.status, status, "{what}: {r:?}");
        assert_secured(&r, what);
    }
    // A body announced with `Expect: 100-continue` is asked for: no lock
    // route decides an admin request.
    let mut c = TcpStream::connect(admin(&s)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n").unwrap();
    let interim = read_response(&mut c).expect("an interim answer");
    assert_eq!(interim.status, 100, "{interim:?}");
    c.write_all(b"{}").unwrap();
    let r = read_response(&mut c).expect("an answer");
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("ok")), "{r:?}");
    // The lock API's rejection counters saw none of them.
    let metrics = String::from_utf8(get(admin(&s), "/metrics", "").body).unwrap();
    let counted = metrics.lines().filter(|l| l.starts_with("nthpool_rejections_total{"));
    assert!(counted.clone().count() > 0 && counted.clone().all(|l| l.ends_with(" 0")), "{metrics}");
}

#[test]
fn the_admin_token_guards_every_route_but_health() {
    let s = TestServer::start(&demo_config(&format!(r#","adminToken":"{TOKEN}""#)));
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    for path in ["/api/pools", "/api/pools/demo", "/metrics"] {
        let r = get(admin(&s), path, "");
        assert_eq!((r.status, r.error_code().as_str()), (401, "unauthorized"), "{path}");
        assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
        let wrong = get(admin(&s), path, &format!("Authorization: Bearer {TOKEN}x\r\n"));
        assert_eq!(wrong.status, 401, "{path}");
        let basic = get(admin(&s), path, &format!("Authorization: Basic {TOKEN}\r\n"));
        assert_eq!(basic.status, 401, "{path}");
        assert_eq!(get(admin(&s), path, &bearer).status, 200, "{path}");
        // The scheme is case-insensitive, and any number of spaces may follow it (RFC 9110 §11).
        for scheme in ["bearer ", "BEARER ", "bEaReR   "] {
            let r = get(admin(&s), path, &format!("Authorization: {scheme}{TOKEN}\r\n"));
            assert_eq!(r.status, 200, "{path} with {scheme:?}");
        }
    }
    assert_eq!(get(admin(&s), "/healthz", "").status, 200);
    // The page shell holds no data; it asks for the token itself.
    let shell = get(admin(&s), "/", "");
    assert_eq!(shell.status, 200);
    assert!(String::from_utf8_lossy(&shell.body).contains(r#"id="login-form""#));
    // So is the tab's icon, which the page names: a browser then asks for no
    // `/favicon.ico`, which would be refused (an error in its console).
    assert!(String::from_utf8_lossy(&shell.body)
        .contains(r#"<link rel="icon" type="image/svg+xml" href="/assets/icon.svg">"#));
    let icon = get(admin(&s), "/assets/icon.svg", "");
    assert_eq!((icon.status, icon.header("content-type")), (200, Some("image/svg+xml")), "{icon:?}");
    assert!(icon.body.starts_with(b"<svg"));
    // A pool's page is the same shell whether the pool exists or not: without
    // the token it tells nothing; with it, an unknown pool is 404.
    let known = get(admin(&s), "/pools/demo", "");
    let unknown = get(admin(&s), "/pools/no-such-pool", "");
    assert_eq!((known.status, unknown.status), (200, 200));
    assert_eq!(known.body, unknown.body);
    assert_eq!(known.body, shell.body);
    assert_eq!(get(admin(&s), "/pools/no-such-pool", &bearer).status, 404);
}

/// `Expect: 100-continue` on the admin listener: a request its head alone
/// refuses (no token, a foreign host, a method, an unknown route) gets that
/// refusal at once, not `100 Continue`, and the connection closes without
/// the body being asked for; a request it admits gets `100 Continue`.
#[test]
fn an_admin_refusal_decided_by_the_head_comes_before_the_body_is_asked_for() {
    let guarded = TestServer::start(&demo_config(&format!(r#","adminToken":"{TOKEN}""#)));
    let open = TestServer::start(&demo_config(""));
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    let expecting = |line: &str, host: &str, extra: &str| {
        format!("{line} HTTP/1.1\r\nHost: {host}\r\n{extra}Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    };
    let cases = [
        ("no token", &guarded, expecting("GET /metrics", "127.0.0.1", ""), 401, "unauthorized"),
        ("no token, dashboard data", &guarded, expecting("GET /api/pools", "localhost", ""), 401, "unauthorized"),
        ("a foreign host", &open, expecting("GET /metrics", "evil.example", ""), 403, "forbidden_host"),
        ("a method", &guarded, expecting("POST /healthz", "localhost", ""), 405, "method_not_allowed"),
        ("an unknown route", &guarded, expecting("GET /nope", "localhost", &bearer), 404, "not_found"),
    ];
    for (what, s, request, status, code) in cases {
        let mut c = TcpStream::connect(admin(s)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let r = read_response(&mut c).expect("an answer");
        assert_eq!(r.status, status, "{what}: {r:?}");
        assert_eq!(r.error_code(), code, "{what}: {r:?}");
        assert_eq!(r.header("connection"), Some("close"), "{what}: {r:?}");
        assert_secured(&r, what);
        assert!(common::is_closed(&mut c), "{what}: the body is never read");
    }
    // Admitted: the body is asked for, then the answer comes.
    let mut c = TcpStream::connect(admin(&guarded)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(expecting("GET /metrics", "localhost", &bearer).as_bytes()).unwrap();
    let interim = read_response(&mut c).expect("an interim answer");
    assert_eq!(interim.status, 100, "{interim:?}");
    c.write_all(b"{}").unwrap();
    let r = read_response(&mut c).expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(String::from_utf8_lossy(&r.body).contains("nthpool_connections_open"), "{r:?}");
}

/// Without `adminToken` the listener is loopback-only, but a page of another
/// site can reach it from a browser on this machine once its name resolves
/// to 127.0.0.1 (DNS rebinding). Its requests name that site in `Host`: the
/// routes with data refuse them, and a pool's page does not tell whether
/// the pool exists.
#[test]
fn without_a_token_the_admin_data_answers_only_this_machines_names() {
    let s = TestServer::start(&demo_config(""));
    let host = |name: &str| format!("Host: {name}\r\n");
    let get_as = |path: &str, name: &str| {
        let mut c = TcpStream::connect(admin(&s)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!("GET {path} HTTP/1.1\r\n{}Connection: close\r\n\r\n", host(name));
        c.write_all(req.as_bytes()).unwrap();
        read_response(&mut c).expect("an answer")
    };
    for path in ["/api/pools", "/api/pools/demo", "/metrics"] {
        for name in ["evil.example", "evil.example:7071", "127.0.0.1.evil.example", "localhost.evil.example"] {
            let r = get_as(path, name);
            assert_eq!((r.status, r.error_code().as_str()), (403, "forbidden_host"), "{path} as {name}: {r:?}");
            assert!(r.json()["message"].as_str().unwrap().contains("adminToken"), "{r:?}");
        }
        for name in ["localhost", "LocalHost:7071", "dash.localhost", "127.0.0.1:7071", "[::1]:7071", "10.0.0.7"] {
            assert_eq!(get_as(path, name).status, 200, "{path} as {name}");
        }
    }
    assert_eq!(get_as("/healthz", "evil.example").status, 200);
    let (known, unknown) = (get_as("/pools/demo", "evil.example"), get_as("/pools/nope", "evil.example"));
    assert_eq!((known.status, unknown.status), (200, 200));
    assert_eq!(get_as("/pools/nope", "localhost").status, 404);
    // With a token, the token decides, whatever the name.
    let t = TestServer::start(&demo_config(&format!(r#","adminToken":"{TOKEN}""#)));
    let mut c = TcpStream::connect(admin(&t)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("GET /api/pools HTTP/1.1\r\nHost: dash.example.com\r\nAuthorization: Bearer {TOKEN}\r\n\r\n");
    c.write_all(req.as_bytes()).unwrap();
    assert_eq!(read_response(&mut c).expect("an answer").status, 200);
}

#[test]
fn a_non_loopback_admin_listener_without_token_refuses_to_start() {
    let dir = common::scratch_dir();
    let path = dir.join("config.json");
    std::fs::write(&path, demo_config("").replace("127.0.0.1:0", "0.0.0.0:0")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .arg("--config")
        .arg(&path)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("adminToken") && stderr.contains("loopback"), "{stderr}");
}

#[test]
fn the_examples_use_public_host_which_must_be_a_host_name() {
    let s = TestServer::start(&demo_config(r#","publicHost":"API.example.com""#));
    let v = get_json(&s, "/api/pools/demo");
    assert_eq!(v["config"]["publicHost"], "API.example.com");
    let text = v["examples"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("export LOCK_API='https://API.example.com/pools/demo/lock'"), "{text}");
    // Markup, a path, anything a `Host` header cannot name: refused at start,
    // so it never reaches a page (nor leaves every lock route unreachable).
    let dir = common::scratch_dir();
    let path = dir.join("config.json");
    for bad in [HOSTILE_HOST, "api.example.com/v1"] {
        let hostile = format!(r#","publicHost":{}"#, serde_json::to_string(bad).unwrap());
        std::fs::write(&path, demo_config(&hostile)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_nthpool")).arg("--config").arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("publicHost") && stderr.contains("not a host name"), "{stderr}");
    }
}

// ------------------------------------------------------------ headless browser

fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let dirs: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// The browser, or `None` (with the reason printed) when it is missing
/// outside CI; under CI a missing browser fails the test.
fn chromium_or_skip() -> Option<PathBuf> {
    let found = find_chromium();
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI is set but chromium is not installed");
        println!("skipped: chromium not found on PATH (set CHROMIUM=/path or install Debian's chromium)");
    }
    found
}

/// Runs headless chromium on `url` and returns the DOM after the page's
/// script has run for a few seconds of virtual time.
fn chromium(bin: &PathBuf, args: &[&str], url: &str) -> String {
    let profile = common::scratch_dir();
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dump_dom(bin: &PathBuf, url: &str) -> String {
    chromium(bin, &["--virtual-time-budget=5000", "--dump-dom"], url)
}

#[test]
fn a_real_browser_renders_live_numbers_charts_and_examples() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    let slots = load_demo(&s, "localhost");
    wait_for_history(&s, 3);
    let base = format!("http://{}", admin(&s));

    let index = dump_dom(&bin, &format!("{base}/"));
    let row = index.split(r#"<tr data-pool="demo">"#).nth(1).unwrap_or_else(|| panic!("no demo row: {index}"));
    let row = row.split("</tr>").next().unwrap();
    assert!(row.contains(r#"data-field="held">3<"#), "{row}");
    assert!(row.contains(r#"data-field="limit">3<"#), "{row}");
    assert!(row.contains(r#"data-status="concurrency""#), "{row}");
    assert!(index.contains(r#"<tr data-pool="other">"#));

    let page = dump_dom(&bin, &format!("{base}/pools/demo"));
    assert!(page.contains(r#"<dd data-field="held">3</dd>"#), "{page}");
    assert!(page.contains(r#"<dd data-field="effectiveLimit">3</dd>"#), "{page}");
    assert!(page.contains(r#"<dd data-field="queueDepth">0 / 10</dd>"#), "{page}");
    for id in ["acquire", "acquire-queued", "renew", "release", "release-throttled"] {
        assert!(page.contains(&format!(r#"id="example-{id}""#)), "example {id} missing");
    }
    assert_eq!(page.matches("Copy</button>").count(), 5);
    assert!(page.contains("$LOCK_API/$SLOT_ID/renew") && page.contains("X-Nthpool-Key: $POOL_KEY"));
    for chart in ["grants", "denials", "throttled", "limits", "held", "queue"] {
        let fig =
            page.split(&format!(r#"id="chart-{chart}""#)).nth(1).unwrap_or_else(|| panic!("chart {chart} missing"));
        let fig = fig.split("</figure>").next().unwrap();
        assert!(fig.contains("<svg") && fig.contains("<polyline points=\""), "chart {chart} not drawn: {fig}");
        if chart == "queue" {
            // Nobody waited: the chart's peak is 0 (its scale is 1 all the same).
            assert!(fig.contains("<li>peak 0</li>"), "chart {chart}: {fig}");
        }
        if chart == "denials" {
            for reason in ["Concurrency", "Rate", "Cooldown", "QueueFull", "Recovering"] {
                assert!(fig.contains(&format!(r#"data-series="denied{reason}""#)), "no {reason} line: {fig}");
            }
        }
    }
    assert!(page.contains(r#"<table id="attempts">"#) && page.contains("<td>429</td>"));
    for dom in [&index, &page] {
        assert!(!dom.contains(DEMO_KEY) && !dom.contains("other-secret-key"), "a key reached the page");
        assert!(slots.iter().all(|slot| !dom.contains(slot.as_str())), "a slot id reached the page");
    }
}

#[test]
fn a_real_browser_shows_the_wait_applied_and_the_one_asked_on_hover() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    for body in [r#"{"waitMs":60000}"#, r#"{"waitMs":1000}"#] {
        assert_eq!(acquire_demo_with(&s, body).status, 200, "{body}");
    }
    let page = dump_dom(&bin, &format!("http://{}/pools/demo", admin(&s)));
    let clamped =
        r#"<td data-field="wait" class="clamped" title="asked 60.0 s, clamped to the queue timeout">5.0 s</td>"#;
    assert!(page.contains(clamped), "the clamped wait: {page}");
    assert!(page.contains(r#"<td data-field="wait">1.0 s</td>"#), "a wait within the timeout: {page}");
}

#[test]
fn a_real_browser_finds_the_pool_behind_a_trailing_slash_or_a_percent_escape() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    load_demo(&s, "localhost");
    for path in ["/pools/demo/", "/pools/d%65mo"] {
        let page = dump_dom(&bin, &format!("http://{}{path}", admin(&s)));
        assert!(page.contains(r#"<dd data-field="held">3</dd>"#), "{path}: {page}");
        assert!(page.contains("<title>nthpool · demo</title>"), "{path}: {page}");
        assert!(page.contains(r#"id="example-acquire""#), "{path}: {page}");
    }
}

#[test]
fn a_real_browser_asks_for_the_admin_token() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(&format!(r#","adminToken":"{TOKEN}""#)));
    let page = dump_dom(&bin, &format!("http://{}/pools/demo", admin(&s)));
    assert!(page.contains(r#"<section id="login" aria-labelledby="login-title">"#), "login form not shown: {page}");
    assert!(!page.contains(r#"id="example-acquire""#), "data shown without the token");
}

#[test]
fn a_real_browser_reached_under_a_host_name_says_why_the_data_is_refused() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    let url = format!("http://admin.example:{}/pools/demo", admin(&s).port());
    let page = chromium(
        &bin,
        &["--host-resolver-rules=MAP admin.example 127.0.0.1", "--virtual-time-budget=5000", "--dump-dom"],
        &url,
    );
    let updated = page.split(r#"<p id="updated""#).nth(1).unwrap_or_else(|| panic!("no status line: {page}"));
    let updated = updated.split("</p>").next().unwrap();
    assert!(updated.contains("set adminToken to reach it under a host name") && updated.contains("403"), "{updated}");
    assert!(!page.contains(r#"id="example-acquire""#), "data shown to a foreign host");
}

#[test]
fn a_real_browser_shows_an_unknown_pool_as_a_404_page() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    let page = dump_dom(&bin, &format!("http://{}/pools/no-such-pool", admin(&s)));
    assert!(page.contains(r#"<h1 id="not-found">No such pool</h1>"#), "no 404 page: {page}");
    assert!(page.contains("<code>no-such-pool</code>") && page.contains(r#"<a href="/">"#), "{page}");
    assert!(page.contains("<title>nthpool · no such pool</title>"), "{page}");
}

/// The head of the request `client` sends (read with a 30 s limit) and its
/// path; `None` if the connection ends first.
fn read_request_head(client: &mut TcpStream) -> Option<(String, String)> {
    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read_some(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let path = text.split(' ').nth(1).unwrap_or("").to_owned();
    Some((text, path))
}

/// The admin listener's whole answer to the request head `text`, sent on a
/// connection of its own that closes after it.
fn forward(admin: SocketAddr, text: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let request: String = text
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    let mut upstream = TcpStream::connect(admin).ok()?;
    let _ = upstream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = upstream.write_all(format!("{request}Connection: close\r\n\r\n").as_bytes());
    let mut answer = Vec::new();
    let _ = upstream.read_to_end(&mut answer);
    Some(answer)
}

/// Writes an answer of `head` (its `Content-Length` replaced) and `body`.
fn write_with_body(client: &mut TcpStream, head: &str, body: &str) {
    let head: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("content-length:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    let _ = client.write_all(format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
}

/// A proxy in front of the admin listener that leaves the first
/// `/api/` request unanswered on an open connection (a network that went
/// silent) and forwards everything else, one request per connection. It
/// adds a slow image to the page so that the browser's DOM is dumped
/// after `load_ms` of real time, not of virtual time (which stands still
/// while a fetch is pending).
fn silent_once_proxy(admin: SocketAddr, load_ms: u64) -> SocketAddr {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stalled = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let stalled = stalled.clone();
            std::thread::spawn(move || {
                let Some((text, path)) = read_request_head(&mut client) else { return };
                if path.starts_with("/api/") && !stalled.swap(true, Ordering::SeqCst) {
                    // Held open, never answered, for longer than the page lives.
                    std::thread::sleep(Duration::from_millis(load_ms + 10_000));
                    return;
                }
                if path == "/slow-load" {
                    std::thread::sleep(Duration::from_millis(load_ms));
                    let _ =
                        client.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    return;
                }
                let Some(answer) = forward(admin, &text) else { return };
                let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else { return };
                let (head, body) = (String::from_utf8_lossy(&answer[..split]).into_owned(), &answer[split + 4..]);
                let body = String::from_utf8_lossy(body).replace("</body>", r#"<img src="/slow-load" alt=""></body>"#);
                write_with_body(&mut client, &head, &body);
            });
        }
    });
    addr
}

#[test]
fn a_real_browser_recovers_when_the_connection_goes_silent() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    load_demo(&s, "localhost");
    let proxy = silent_once_proxy(admin(&s), 10_000);
    // Real time: the DOM is dumped when the slow image ends the page's load.
    let page = chromium(&bin, &["--dump-dom"], &format!("http://{proxy}/pools/demo"));
    assert!(page.contains(r#"<dd data-field="held">3</dd>"#), "the page never got past the silent request: {page}");
}

/// The page's script tag, ahead of which `operator_proxy` puts the test's own.
const APP_JS_TAG: &str = r#"<script src="/assets/app.js" defer>"#;

/// A proxy in front of the admin listener that forwards every request, one
/// per connection, with two additions of its own. The page gets
/// `/test/helper.js` (`helper_js`, served from the same origin so the
/// page's CSP lets it run) as a plain script ahead of the deferred app.js,
/// so it runs first. And `GET /test/operate` is the helper's way to ask the
/// test to act as an operator would (rotate the token, reload the
/// configuration): the proxy says so on the returned receiver,
/// and answers only once the test says it is done on the returned sender
/// (or after a minute). The browser's virtual time stands still while that
/// fetch is pending, so the page polls nothing in between.
fn operator_proxy(admin: SocketAddr, helper_js: String) -> (SocketAddr, mpsc::Receiver<()>, mpsc::Sender<()>) {
    use std::sync::{Arc, Mutex};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (asked_tx, asked_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_rx = Arc::new(Mutex::new(done_rx));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let (helper_js, asked_tx, done_rx) = (helper_js.clone(), asked_tx.clone(), done_rx.clone());
            std::thread::spawn(move || {
                let Some((text, path)) = read_request_head(&mut client) else { return };
                let own = |content_type: &str, body: &str| {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nCache-Control: no-store\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                if path == "/test/helper.js" {
                    let _ = client.write_all(own("text/javascript", &helper_js).as_bytes());
                    return;
                }
                if path == "/test/operate" {
                    let _ = asked_tx.send(());
                    let _ = done_rx.lock().unwrap().recv_timeout(Duration::from_secs(60));
                    let _ = client.write_all(own("text/plain", "done").as_bytes());
                    return;
                }
                let Some(answer) = forward(admin, &text) else { return };
                // Only the page is rewritten; everything else passes as it came.
                let page = std::str::from_utf8(&answer).ok().filter(|t| t.contains(APP_JS_TAG));
                let Some((head, body)) = page.and_then(|t| t.split_once("\r\n\r\n")) else {
                    let _ = client.write_all(&answer);
                    return;
                };
                let body =
                    body.replace(APP_JS_TAG, &format!("<script src=\"/test/helper.js\"></script>\n{APP_JS_TAG}"));
                write_with_body(&mut client, head, &body);
            });
        }
    });
    (addr, asked_rx, done_tx)
}

#[test]
fn a_real_browser_signs_in_again_after_the_token_rotates_and_sees_the_examples() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    const ROTATED: &str = "admin-token-rotated-9876543210";
    let with_token = |token: &str| demo_config(&format!(r#","adminToken":"{token}""#));
    let s = TestServer::start(&with_token(TOKEN));
    // The helper plays the operator: the tab already holds the first token
    // (set before app.js runs); once the Examples are drawn it asks for the
    // rotation; once the login form shows again it types the new token and
    // submits the form the way its button does. It leaves what it saw on
    // <html> for the dumped DOM: the form's message, and that it signed in.
    let helper_js = format!(
        r#""use strict";
sessionStorage.setItem("nthpool-admin-token", {first});
let phase = "signed-in";
const step = setInterval(async () => {{
  if (phase === "signed-in" && document.getElementById("example-acquire")) {{
    phase = "rotating";
    await fetch("/test/operate", {{ cache: "no-store" }});
    phase = "rotated";
  }} else if (phase === "rotated" && !document.getElementById("login").hidden) {{
    phase = "done";
    clearInterval(step);
    const html = document.documentElement;
    html.dataset.loginError = document.getElementById("login-error").textContent;
    document.getElementById("token").value = {rotated};
    document.getElementById("login-form").requestSubmit();
    html.dataset.signedInAgain = "yes";
  }}
}}, 50);
"#,
        first = serde_json::to_string(TOKEN).unwrap(),
        rotated = serde_json::to_string(ROTATED).unwrap(),
    );
    let (proxy, asked, rotated) = operator_proxy(admin(&s), helper_js);
    // The virtual time covers the refresh that meets the 401 (one second
    // after the rotation) and the sign-in after it, with room to spare.
    let url = format!("http://{proxy}/pools/demo");
    let browser = std::thread::spawn(move || dump_dom(&bin, &url));

    // The SIGHUP reload rotates the adminToken, as an operator would; the
    // Examples do not change with it (they are the same JSON before and
    // after), which is what kept the page from drawing them again.
    asked.recv_timeout(Duration::from_secs(60)).expect("the page never drew the Examples with the first token");
    std::fs::write(&s.config_path, with_token(ROTATED)).unwrap();
    s.signal("HUP");
    let until = Instant::now() + Duration::from_secs(20);
    while get(admin(&s), "/api/pools", &format!("Authorization: Bearer {TOKEN}\r\n")).status != 401 {
        assert!(Instant::now() < until, "the reload never rotated the token");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(admin(&s), "/api/pools", &format!("Authorization: Bearer {ROTATED}\r\n")).status, 200);
    rotated.send(()).unwrap();

    let page = browser.join().expect("the browser's thread");
    // The page did meet the 401 and was signed in again through its form...
    assert!(page.contains(r#"data-login-error="That token was not accepted.""#), "no 401 was shown: {page}");
    assert!(page.contains(r#"data-signed-in-again="yes""#), "the login form never came back: {page}");
    // ...which is hidden again, over a page drawn in full: Examples included.
    let login = page.split(r#"<section id="login""#).nth(1).unwrap_or_else(|| panic!("no login section: {page}"));
    assert!(login.split('>').next().unwrap().contains("hidden"), "the login form is still shown: {page}");
    assert!(page.contains(r#"<dd data-field="held">0</dd>"#), "the live state is not drawn: {page}");
    for id in ["acquire", "acquire-queued", "renew", "release", "release-throttled"] {
        assert!(page.contains(&format!(r#"id="example-{id}""#)), "example {id} not drawn again: {page}");
    }
    assert_eq!(page.matches("Copy</button>").count(), 5, "{page}");
}

#[test]
fn a_real_browser_keeps_every_pool_listed_and_live_after_a_reload_adds_one() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let s = TestServer::start(&demo_config(""));
    // The helper waits for the list, then asks the test to add a pool (a
    // reload) and lets the page refresh for the rest of its virtual time.
    let helper_js = r#""use strict";
let phase = "listing";
const step = setInterval(async () => {
  if (phase === "listing" && document.querySelector('tr[data-pool="other"]')) {
    phase = "reloading";
    clearInterval(step);
    await fetch("/test/operate", { cache: "no-store" });
  }
}, 50);
"#;
    let (proxy, asked, reloaded) = operator_proxy(admin(&s), helper_js.to_string());
    let url = format!("http://{proxy}/");
    let browser = std::thread::spawn(move || dump_dom(&bin, &url));
    asked.recv_timeout(Duration::from_secs(60)).expect("the page never listed the pools");
    let added = r#""middle":{"keys":["middle-secret-key-1"],"concurrency":2},"other":"#;
    std::fs::write(&s.config_path, demo_config("").replace(r#""other":"#, added)).unwrap();
    s.signal("HUP");
    let until = Instant::now() + Duration::from_secs(20);
    while get_json(&s, "/api/pools")["pools"].as_array().unwrap().len() != 3 {
        assert!(Instant::now() < until, "the reload never added the pool");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = s.connect();
    let req = "POST /pools/middle/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: middle-secret-key-1\r\nContent-Length: 0\r\n\r\n";
    c.write_all(req.as_bytes()).unwrap();
    let slot = read_response(&mut c).expect("an answer").slot();
    reloaded.send(()).unwrap();

    // Several refreshes later, every pool is still listed, the new one with its live numbers.
    let page = browser.join().expect("the browser's thread");
    let listed: Vec<&str> =
        page.split(r#"<tr data-pool=""#).skip(1).map(|row| row.split('"').next().unwrap()).collect();
    let mut expected: Vec<String> = get_json(&s, "/api/pools")["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    expected.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, expected, "the pools listed: {listed:?}");
    let row = page.split(r#"<tr data-pool="middle">"#).nth(1).unwrap().split("</tr>").next().unwrap();
    assert!(row.contains(r#"data-field="held">1<"#), "{row}");
    assert!(!page.contains(&slot), "a slot id reached the page");
}

/// Runs `text` (an Example as the page shows it) in bash with `env`, and
/// returns curl's answer body.
fn paste(text: &str, env: &[(&str, &str)]) -> Value {
    let out = Command::new("bash").arg("-c").arg(text).envs(env.iter().copied()).output().expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{text}\nanswered {stdout}: {e}"))
}

/// A tool the pasted Examples need, or `None` (with the reason printed).
fn tool_or_skip(name: &str) -> Option<()> {
    let found = Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success())
        || Command::new(name).arg("version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "CI is set but {name} is not installed");
        println!("skipped: {name} not found");
    }
    found.then_some(())
}

#[test]
fn every_example_works_when_pasted_with_the_pools_credentials() {
    use hmac::{Hmac, Mac};
    if tool_or_skip("curl").is_none() || tool_or_skip("openssl").is_none() {
        return;
    }
    const HMAC_SECRET: &str = "hmac-secret-0123456789";
    const JWT_SECRET: &str = "jwt-secret-0123456789";
    let s = TestServer::start(&format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,
        "pools":{{"demo":{{"keys":["{DEMO_KEY}"],"concurrency":3}},
                 "guarded":{{"keys":["guarded-secret-key-1"],"concurrency":3,
                   "access":{{"hmac":{{"secret":"{HMAC_SECRET}"}},"jwt":{{"hs256Secret":"{JWT_SECRET}"}}}}}}}}}}"#
    ));
    let b64 = |b: &[u8]| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    };
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let input = format!("{}.{}", b64(br#"{"alg":"HS256","typ":"JWT"}"#), b64(format!(r#"{{"exp":{exp}}}"#).as_bytes()));
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(JWT_SECRET.as_bytes()).unwrap();
    mac.update(input.as_bytes());
    let jwt = format!("{input}.{}", b64(&mac.finalize().into_bytes()));

    for (pool, key) in [("demo", DEMO_KEY), ("guarded", "guarded-secret-key-1")] {
        let v = get_json(&s, &format!("/api/pools/{pool}"));
        let text = |id: &str| {
            let x = v["examples"].as_array().unwrap().iter().find(|x| x["id"] == id).unwrap();
            x["text"].as_str().unwrap().to_owned()
        };
        let mut env = vec![("POOL_KEY", key), ("POOL_JWT", jwt.as_str()), ("POOL_HMAC_SECRET", HMAC_SECRET)];
        // Pasted one after another into one shell, an acquire leaves its
        // slot id in SLOT_ID for the renew and release after it.
        let chained =
            format!("{{\n{}\n}} >/dev/null\n{} >/dev/null\n{}", text("acquire"), text("renew"), text("release"));
        assert_eq!(paste(&chained, &env)["released"], true, "{pool}: acquire, renew, release in one shell");
        let granted = paste(&text("acquire"), &env);
        let slot = granted["slotId"].as_str().unwrap_or_else(|| panic!("{pool}: acquire: {granted}")).to_owned();
        env.push(("SLOT_ID", slot.as_str()));
        let renewed = paste(&text("renew"), &env);
        assert!(renewed["leaseDeadline"].is_u64(), "{pool}: renew: {renewed}");
        assert_eq!(paste(&text("release"), &env)["released"], true, "{pool}: release");
        let queued = paste(&text("acquire-queued"), &env);
        let slot = queued["slotId"].as_str().unwrap_or_else(|| panic!("{pool}: queued acquire: {queued}")).to_owned();
        env.pop();
        env.push(("SLOT_ID", slot.as_str()));
        assert_eq!(paste(&text("release-throttled"), &env)["released"], true, "{pool}: release-throttled");
    }
}
