//! Proxy mode over real sockets (SPEC §12): a scripted mock upstream behind
//! the real server, and raw HTTP/1.1 from the client side.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use upstream::*;

#[test]
fn forwarding_strips_credentials_and_hop_by_hop_headers_and_keeps_path_and_query() {
    std::env::set_var("NTHPOOL_PROXY_TEST_UPSTREAM_KEY", "sk-managed-123");
    let up = MockUpstream::start(|_| {
        ok("{\"id\":1}", "Content-Type: application/json\r\nConnection: keep-alive\r\nX-Up: 1\r\n")
    });
    let server = proxy_server(
        &up,
        4,
        r#""setHeaders":{"Authorization":"Bearer ${env:NTHPOOL_PROXY_TEST_UPSTREAM_KEY}","X-Team":"core"}"#,
    );
    let extra = "Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
        X-Nthpool-Queue-Timeout-Ms: 100\r\nX-Team: client\r\nAuthorization: Bearer client-own\r\nAccept: */*\r\n\
        Content_Length: 99\r\nTransfer_Encoding: chunked\r\nX_Team: client\r\nx_nthpool_key: k\r\nX_Trace_Id: t1\r\n\
        Proxy-Client-IP: 10.0.0.1\r\nProxy-Authorization: Basic eA==\r\nProxy_Foo: y\r\n";
    let r = exchange(&server, &proxied("POST", "/v1/chat/completions?model=gpt&q=a%20b", extra, "{\"x\":1}"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"{\"id\":1}");
    assert_eq!(r.header("x-up"), Some("1"));
    assert_eq!(r.header("x-nthpool-limit"), Some("4"));
    assert!(r.header("x-nthpool-effective-limit").is_some() && r.header("x-nthpool-remaining-slots").is_some());
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.request_line(), "POST /v1/chat/completions?model=gpt&q=a%20b HTTP/1.1");
    assert_eq!(s.header("host"), Some(up.addr.to_string()));
    assert_eq!(s.headers("authorization"), vec!["Bearer sk-managed-123".to_string()]);
    assert_eq!(s.headers("x-team"), vec!["core".to_string()]);
    assert_eq!(s.header("accept").as_deref(), Some("*/*"));
    assert_eq!(s.body, b"{\"x\":1}");
    for gone in ["x-nthpool-key", "x-nthpool-queue-timeout-ms", "x-hop", "keep-alive", "te", "connection"] {
        assert!(s.header(gone).is_none(), "{gone} reached the upstream: {}", s.head);
    }
    // A dropped field spelled with `_` is dropped too (an upstream that maps
    // names to CGI-style variables would take it for the real one); other
    // names with `_` go up as sent.
    for gone in ["content_length", "transfer_encoding", "x_team", "x_nthpool_key"] {
        assert!(s.header(gone).is_none(), "{gone} reached the upstream: {}", s.head);
    }
    // Every `Proxy-*` field is hop-by-hop, in either spelling.
    for gone in ["proxy-client-ip", "proxy-authorization", "proxy_foo"] {
        assert!(s.header(gone).is_none(), "{gone} reached the upstream: {}", s.head);
    }
    assert_eq!(s.header("x_trace_id").as_deref(), Some("t1"), "{}", s.head);
}

/// A gateway names itself in `Via` on every request it forwards (RFC 9110
/// §7.6.3): after the client's own entries, with the protocol version the
/// client spoke; a `setHeaders` entry for `Via` is sent instead.
#[test]
fn a_forwarded_request_carries_via_after_the_clients_own() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = proxy_server(&up, 4, "");
    assert_eq!(exchange(&server, &proxied("GET", "/plain", "", "")).status, 200);
    assert_eq!(exchange(&server, &proxied("GET", "/relayed", "Via: 1.1 edge\r\n", "")).status, 200);
    let old = format!("GET /old HTTP/1.0\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    assert_eq!(exchange(&server, old.as_bytes()).status, 200);
    let seen = up.seen();
    assert_eq!(seen[0].headers("via"), ["1.1 nthpool"], "{}", seen[0].head);
    assert_eq!(seen[1].headers("via"), ["1.1 edge", "1.1 nthpool"], "{}", seen[1].head);
    assert_eq!(seen[2].headers("via"), ["1.0 nthpool"], "{}", seen[2].head);

    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = proxy_server(&up, 4, r#""setHeaders":{"Via":"1.1 gateway"}"#);
    assert_eq!(exchange(&server, &proxied("GET", "/set", "Via: 1.1 edge\r\n", "")).status, 200);
    let seen = up.seen();
    assert_eq!(seen[0].headers("via"), ["1.1 gateway"], "{}", seen[0].head);
}

#[test]
fn an_empty_body_goes_up_framed_as_the_client_framed_it() {
    // `Content-Length: 0` goes up as sent (an upstream may answer a POST
    // without it 411); no framing header stays none.
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = proxy_server(&up, 4, "");
    assert_eq!(exchange(&server, &proxied("POST", "/empty", "", "")).status, 200);
    assert_eq!(exchange(&server, &proxied("GET", "/none", "", "")).status, 200);
    let seen = up.seen();
    assert_eq!(seen[0].headers("content-length"), ["0"], "{}", seen[0].head);
    assert!(seen[1].header("content-length").is_none() && seen[1].header("transfer-encoding").is_none());
}

/// A proxied pool whose key may also come as an SDK sends it
/// (`Authorization: Bearer`, `x-api-key`).
fn sdk_key_server(up: &MockUpstream) -> TestServer {
    TestServer::start(&config(
        &format!(r#""allowAuthorizationHeader":true,"upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url()),
        "",
    ))
}

#[test]
fn the_sdk_key_headers_authenticate_and_are_not_forwarded() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = sdk_key_server(&up);
    // An `Authorization` of another scheme is passed over for `x-api-key`,
    // and is not forwarded either.
    for header in [
        format!("Authorization: Bearer {KEY}"),
        format!("x-api-key: {KEY}"),
        format!("Authorization: Basic dXNlcjpwdw==\r\nx-api-key: {KEY}"),
    ] {
        let raw = format!("GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\n{header}\r\n\r\n");
        let r = exchange(&server, raw.as_bytes());
        assert_eq!(r.status, 200, "{header}: {r:?}");
    }
    for s in up.seen() {
        assert!(s.header("authorization").is_none() && s.header("x-api-key").is_none(), "{}", s.head);
    }
    // No key, or a wrong one: refused here, never forwarded.
    let before = up.seen().len();
    for raw in [
        format!("GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\n\r\n"),
        format!("GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\nx-api-key: wrong\r\n\r\n"),
        // The first of the two present is read: a wrong Bearer key is not
        // made good by a right `x-api-key`.
        format!("GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer wrong\r\nx-api-key: {KEY}\r\n\r\n"),
    ] {
        let r = exchange(&server, raw.as_bytes());
        assert_eq!((r.status, r.error_code().as_str()), (401, "unauthorized"), "{r:?}");
        assert_eq!(r.header("www-authenticate"), Some(r#"Bearer realm="nthpool""#), "{r:?}");
        // The refusal names where an SDK's key goes, not only X-Nthpool-Key.
        let message = r.json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("Authorization: Bearer") && message.contains("x-api-key"), "{message}");
    }
    assert_eq!(up.seen().len(), before);
}

/// `x-api-key` carrying the pool key is a one-value credential header, as
/// `X-Nthpool-Key` and `Authorization` are: sent twice it is `400` naming
/// it, and the connection closes, whichever copy holds the key.
#[test]
fn an_sdk_key_header_sent_twice_is_refused_and_never_forwarded() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = sdk_key_server(&up);
    for pair in [[KEY, "other"], ["other", KEY], [KEY, KEY]] {
        let raw = format!(
            "GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\nx-api-key: {}\r\nX-API-Key: {}\r\n\r\n",
            pair[0], pair[1]
        );
        let mut c = server.connect();
        c.write_all(raw.as_bytes()).unwrap();
        let r = read_response(&mut c).expect("an answer");
        assert_eq!((r.status, r.error_code().as_str()), (400, "bad_request"), "{pair:?}: {r:?}");
        assert!(r.json()["message"].as_str().unwrap().contains("x-api-key"), "{r:?}");
        assert!(is_closed(&mut c), "{pair:?}: the connection stays open");
    }
    assert!(up.seen().is_empty(), "a refused request reached the upstream");
    // Once, it passes; and when the key came in X-Nthpool-Key the field is not read.
    let once = format!("GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\nx-api-key: {KEY}\r\n\r\n");
    assert_eq!(exchange(&server, once.as_bytes()).status, 200);
    let r = exchange(&server, &proxied("GET", "/v1/models", "x-api-key: a\r\nx-api-key: b\r\n", ""));
    assert_eq!(r.status, 200, "{r:?}");
    assert!(up.seen().iter().all(|s| s.header("x-api-key").is_none()), "an x-api-key reached the upstream");
}

#[test]
fn lock_routes_are_not_served_on_a_proxy_host_and_still_are_on_the_api_host() {
    let up = MockUpstream::start(|_| ok("from upstream", ""));
    let server = proxy_server(&up, 4, "");
    let r = exchange(&server, &proxied("POST", "/pools/p/lock/acquire", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"from upstream"[..]), "{r:?}");
    assert_eq!(up.seen()[0].request_line(), "POST /pools/p/lock/acquire HTTP/1.1");
    // The absolute form of the name (a final dot) is the same host.
    let dotted = String::from_utf8(proxied("GET", "/v1", "", "")).unwrap().replace(HOST, &format!("{HOST}."));
    let r = exchange(&server, dotted.as_bytes());
    assert_eq!((r.status, r.body.as_slice()), (200, &b"from upstream"[..]), "{r:?}");
    let lock = server.acquire("", "");
    assert_eq!(lock.status, 200, "{lock:?}");
    assert_eq!(up.seen().len(), 2);
}

/// A proxy host may be an IPv6 literal, written as a `Host` carries it (in
/// brackets); a request naming it, with any port, is proxy traffic.
#[test]
fn an_ipv6_literal_proxy_host_routes_in_brackets() {
    let up = MockUpstream::start(|_| ok("from upstream", ""));
    let server = TestServer::start(&config(
        &format!(r#""adaptive":false,"upstream":{{"url":"{}","hosts":["[::1]"]}}"#, up.url()),
        "",
    ));
    let raw = format!("GET /v1 HTTP/1.1\r\nHost: [::1]:{}\r\nX-Nthpool-Key: {KEY}\r\n\r\n", server.addr.port());
    let r = exchange(&server, raw.as_bytes());
    assert_eq!((r.status, r.body.as_slice()), (200, &b"from upstream"[..]), "{r:?}");
    assert_eq!(server.acquire("", "").status, 200, "the lock API is still served on other hosts");
    assert_eq!(up.seen().len(), 1);
}

/// "The lock API never emits managed upstream credentials": on a pool whose
/// upstream has them, no lock answer (grant, renew, release, refusal)
/// carries them, in its head or its body.
#[test]
fn the_lock_api_never_emits_the_managed_credentials() {
    const MANAGED: &str = "sk-managed-lock-api-5e1b";
    let up = MockUpstream::start(|_| ok("served", ""));
    let server = proxy_server(
        &up,
        1,
        &format!(r#""setHeaders":{{"Authorization":"Bearer {MANAGED}","X-Org":"org-{MANAGED}"}}"#),
    );
    let grant = server.acquire("", "");
    let slot = grant.slot();
    let answers = [
        grant,
        server.acquire("", ""),
        server.request(&post("/pools/p/lock/acquire", "wrong-key", "", "")),
        server.renew(&slot),
        server.release(&slot, r#"{"status":200}"#),
        server.release(&slot, ""),
        server.renew(&slot),
    ];
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 429, 401, 200, 200, 200, 404]);
    for r in &answers {
        let text = format!("{:?} {}", r.headers, String::from_utf8_lossy(&r.body));
        assert!(!text.contains(MANAGED), "a lock answer carries the managed credential: {text}");
    }
    assert!(up.seen().is_empty(), "the lock API called the upstream");
}

/// "Acquire shares the pool's concurrency limit, queue, and RPM gate with
/// proxy traffic": the one token of a pool's RPM gate goes to a lock grant
/// or to a proxied request, not to both.
#[test]
fn lock_grants_and_proxied_requests_draw_on_one_rpm_gate() {
    let up = MockUpstream::start(|_| ok("served", ""));
    let start = || {
        TestServer::start(&config(
            &format!(
                r#""concurrency":4,"adaptive":false,"rpm":1,"rpmBurst":1,
                "upstream":{{"url":"{}","hosts":["{HOST}"],"waitMs":0}}"#,
                up.url()
            ),
            "",
        ))
    };
    // A lock grant takes the token: the proxied request is refused, never sent.
    let server = start();
    server.acquire("", "").slot();
    let r = exchange(&server, &proxied("GET", "/v1/models", "", ""));
    assert_eq!((r.status, r.error_code().as_str()), (429, "too_many_requests"), "{r:?}");
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"), "{r:?}");
    assert!(up.seen().is_empty(), "the proxied request went out without a token");
    // A proxied request takes the token: the lock acquire is refused.
    let server = start();
    let r = exchange(&server, &proxied("GET", "/v1/models", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"served"[..]), "{r:?}");
    let r = server.acquire("", "");
    assert_eq!((r.status, r.error_code().as_str()), (429, "too_many_requests"), "{r:?}");
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"), "{r:?}");
}

#[test]
fn a_pools_own_listener_proxies_every_request() {
    let up = MockUpstream::start(|_| ok("via listener", ""));
    let port = free_port();
    let server =
        TestServer::start(&config(&format!(r#""upstream":{{"url":"{}","listen":"127.0.0.1:{port}"}}"#, up.url()), ""));
    // Start-up says where the pool's proxy listens, beside the other listeners.
    let announced = format!("nthpool proxy for pool `p` on http://127.0.0.1:{port}\n");
    assert!(server.banner.contains(&announced), "{}", server.banner);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET /anything?x=1 HTTP/1.1\r\nHost: whatever\r\nX-Nthpool-Key: {KEY}\r\n\r\n").as_bytes())
        .unwrap();
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"via listener"[..]), "{r:?}");
    assert_eq!(up.seen()[0].request_line(), "GET /anything?x=1 HTTP/1.1");
    drop(server);
}

/// An upstream that answers `200 body` once the flag it returns is set (or
/// after `PATIENCE`).
fn answering_when_told(body: &'static str) -> (MockUpstream, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let answer = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let go = answer.clone();
    let up = MockUpstream::start(move |_| {
        let until = Instant::now() + PATIENCE;
        while !go.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        ok(body, "")
    });
    (up, answer)
}

#[test]
fn a_reload_that_ends_proxying_answers_the_queued_request_503_and_frees_its_slot() {
    // One proxied request holds the pool's only slot (the upstream answers
    // when the test says so), a second waits in the queue; a reload then
    // takes the pool's `upstream` away. The waiter has no upstream left to
    // go to: it gets a 503, and no slot is held for it.
    let (up, answer) = answering_when_told("first");
    let pool = r#""concurrency":1,"adaptive":false,"queue":{"size":10,"timeoutMs":30000}"#;
    let server =
        TestServer::start(&config(&format!(r#"{pool},"upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url()), ""));
    let mut first = server.connect();
    first.write_all(&proxied("GET", "/one", "", "")).unwrap();
    eventually("the first request holds the slot", || up.seen().len() == 1);
    let mut second = server.connect();
    second.write_all(&proxied("GET", "/two", "", "")).unwrap();
    eventually("the second request waits", || server.metric(r#"nthpool_waiters{pool="p"}"#) == Some(1.0));

    server.reload(&config(pool, ""));
    answer.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = read_any(&mut first).expect("the first answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"first"[..]), "{r:?}");
    let r = read_any(&mut second).expect("the waiter is answered");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.error_code(), "unavailable", "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    assert_eq!(up.seen().len(), 1, "the waiter never reached the old upstream");
    eventually("the slot is free again", || server.metric(r#"nthpool_slots_held{pool="p"}"#) == Some(0.0));
    assert_eq!(server.acquire("", "").status, 200, "the server goes on serving");
}

/// A reload that removes the key a queued proxied request presented (in
/// `X-Nthpool-Key`, or in `x-api-key` as an SDK sends it), or stops
/// admitting its address, refuses it at once with the answer a new request
/// would get: granted, it would reach the upstream with the pool's managed
/// credentials. One whose key stays waits on and is relayed.
#[test]
fn a_reload_that_revokes_a_queued_proxied_requests_key_or_address_refuses_it() {
    const KEPT: &str = "kept-key-0123456";
    const SDK: &str = "sdk-key-0123456";
    let up = MockUpstream::start(|_| ok("up", ""));
    let json = |keys: &str, extra: &str| {
        format!(
            r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"p":{{"keys":[{keys}],
            "concurrency":1,"adaptive":false,"allowAuthorizationHeader":true,"queue":{{"size":10,"timeoutMs":20000}},
            "upstream":{{"url":"{}","hosts":["{HOST}"]}}{extra}}}}}}}"#,
            up.url()
        )
    };
    let s = TestServer::start(&json(&format!(r#""{KEY}","{KEPT}","{SDK}""#), ""));
    // The slot is held through the lock API; the proxied requests queue behind it.
    let holder = s.request(&post("/pools/p/lock/acquire", KEPT, "", "")).slot();
    let waiting = |n: f64| eventually("the waiters queued", || s.metric(r#"nthpool_waiters{pool="p"}"#) == Some(n));
    let queue = |key_header: &str, n: f64| {
        let mut c = s.connect();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(format!("GET /v1/x HTTP/1.1\r\nHost: {HOST}\r\n{key_header}\r\n\r\n").as_bytes()).unwrap();
        waiting(n);
        c
    };
    let mut revoked = queue(&format!("X-Nthpool-Key: {KEY}"), 1.0);
    let mut revoked_sdk = queue(&format!("x-api-key: {SDK}"), 2.0);
    let mut kept = queue(&format!("x-api-key: {KEPT}"), 3.0);
    s.reload(&json(&format!(r#""{KEPT}""#), ""));
    for (c, how) in [(&mut revoked, "X-Nthpool-Key"), (&mut revoked_sdk, "x-api-key")] {
        let r = read_any(c).unwrap_or_else(|| panic!("{how}: an answer at the reload"));
        assert_eq!((r.status, r.error_code().as_str()), (401, "unauthorized"), "{how}: {r:?}");
        assert!(r.json()["message"].as_str().unwrap().contains("removed while it waited"), "{how}: {r:?}");
    }
    waiting(1.0);
    let released = s.request(&post(&format!("/pools/p/lock/{holder}/release"), KEPT, "", ""));
    assert_eq!(released.status, 200, "{released:?}");
    let r = read_any(&mut kept).expect("the kept key's answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"up"[..]), "{r:?}");
    assert_eq!(up.seen().len(), 1, "only the kept key's request reached the upstream");

    // The pool now admits only 10.0.0.0/8: a waiter from 127.0.0.1 is refused.
    let _holder = s.request(&post("/pools/p/lock/acquire", KEPT, "", "")).slot();
    let mut outside = queue(&format!("X-Nthpool-Key: {KEPT}"), 1.0);
    s.reload(&json(&format!(r#""{KEPT}""#), r#","access":{"ipAllow":["10.0.0.0/8"]}"#));
    let r = read_any(&mut outside).expect("an answer at the reload");
    assert_eq!((r.status, r.error_code().as_str()), (403, "unauthorized"), "{r:?}");
    waiting(0.0);
    assert_eq!(up.seen().len(), 1, "nothing more reached the upstream");
}

#[test]
fn a_reload_leaves_an_exchange_in_flight_the_upstream_settings_it_started_with() {
    // An exchange sends its head and half its body; a reload then lowers
    // the pool's `timeoutMs` below the upstream's answer time, or takes the
    // `upstream` away. Both apply to the exchanges that start after it: the
    // one in flight sends the rest and gets the upstream's answer (it once
    // read the new timeout, and 0 for a removed upstream, and got a 504).
    let with = |timeout_ms: u64, up: &MockUpstream| {
        config(&format!(r#""upstream":{{"url":"{}","hosts":["{HOST}"],"timeoutMs":{timeout_ms}}}"#, up.url()), "")
    };
    for after in ["no upstream", "timeoutMs 100"] {
        let (up, answer) = answering_when_told("up");
        let server = TestServer::start(&with(30_000, &up));
        let mut c = server.connect();
        let head =
            format!("POST /v1/slow HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 10\r\n\r\n");
        c.write_all(format!("{head}01234").as_bytes()).unwrap();
        eventually("the exchange holds the slot", || server.metric(r#"nthpool_slots_held{pool="p"}"#) == Some(1.0));
        server.reload(&match after {
            "no upstream" => config("", ""),
            _ => with(100, &up),
        });
        c.write_all(b"56789").unwrap();
        eventually("the upstream has the whole request", || up.seen().len() == 1);
        // Well past the lowered timeout.
        std::thread::sleep(Duration::from_millis(300));
        answer.store(true, std::sync::atomic::Ordering::SeqCst);
        let r = read_any(&mut c).expect("the proxied answer");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"up"[..]), "{after}: {r:?}");
        assert_eq!(up.seen()[0].body, b"0123456789", "{after}");
    }
}

#[test]
fn a_queued_request_never_carries_the_old_upstreams_credentials_to_a_new_one() {
    // A proxied request queues behind one that holds the only slot; a
    // reload then points the pool at another upstream with another managed
    // key. The queued request's head was written for the first upstream,
    // its key included: sent to the second it would hand that key over.
    // It is answered 503 (retry) instead, and the second upstream sees nothing.
    let up_a = MockUpstream::start(|seen| {
        if seen.request_line().contains("/hold") {
            // Said to close: the queued request is sent on a fresh connection.
            Reply::Paced(vec![(800, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\na".to_vec())])
        } else {
            ok("from-a", "")
        }
    });
    let up_b = MockUpstream::start(|_| ok("from-b", ""));
    let pool = |url: &str, secret: &str| {
        config(
            &format!(
                r#""concurrency":1,"adaptive":false,"queue":{{"size":10,"timeoutMs":10000}},
                "upstream":{{"url":"{url}","hosts":["{HOST}"],"setHeaders":{{"Authorization":"Bearer {secret}"}}}}"#
            ),
            "",
        )
    };
    let server = TestServer::start(&pool(&up_a.url(), "secret-for-a"));
    // A reload that leaves the upstream as it was lets a queued request go on.
    let mut hold = server.connect();
    hold.write_all(&proxied("GET", "/hold", "", "")).unwrap();
    eventually("the first request holds the slot", || up_a.seen().len() == 1);
    let mut queued = server.connect();
    queued.write_all(&proxied("GET", "/queued", "", "")).unwrap();
    eventually("the second request waits", || server.metric(r#"nthpool_waiters{pool="p"}"#) == Some(1.0));
    server.reload(
        &pool(&up_a.url(), "secret-for-a").replace(r#""adaptive":false"#, r#""adaptive":false,"termMs":20000"#),
    );
    assert_eq!(read_any(&mut hold).expect("the first answer").status, 200);
    let r = read_any(&mut queued).expect("the queued request's answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"from-a"[..]), "{r:?}");
    let seen = up_a.seen().len();

    let mut hold = server.connect();
    hold.write_all(&proxied("GET", "/hold", "", "")).unwrap();
    eventually("the first request holds the slot", || up_a.seen().len() == seen + 1);
    let mut queued = server.connect();
    queued.write_all(&proxied("GET", "/queued", "", "")).unwrap();
    eventually("the second request waits", || server.metric(r#"nthpool_waiters{pool="p"}"#) == Some(1.0));
    server.reload(&pool(&up_b.url(), "secret-for-b"));
    let r = read_any(&mut queued).expect("the queued request's answer");
    assert_eq!((r.status, r.error_code().as_str()), (503, "unavailable"), "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    assert_eq!(read_any(&mut hold).expect("the first answer").status, 200);
    assert!(up_b.seen().is_empty(), "nothing reached the new upstream: {:?}", up_b.seen());
    assert_eq!(up_a.seen().len(), seen + 1, "nor the old one");
    // Sent afresh, a request goes to the new upstream with its own key.
    let r = exchange(&server, &proxied("GET", "/again", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"from-b"[..]), "{r:?}");
    assert_eq!(up_b.seen()[0].header("authorization"), Some("Bearer secret-for-b".to_string()));
    eventually("the slots are free", || server.metric(r#"nthpool_slots_held{pool="p"}"#) == Some(0.0));
}

/// A request queued under an upstream that a reload changes can never be
/// sent (its head carries the old settings): it is answered `503` at the
/// reload, while the slot is still held, and takes no grant and no rate
/// token, so the requests after it, sent afresh, find both.
#[test]
fn a_queued_request_whose_upstream_a_reload_changed_is_answered_at_once_and_takes_no_slot() {
    a_reload_answers_the_queued_request_whose_upstream_it_changed(1);
}

/// The same when the reload that changes the upstream also raises the
/// pool's limit: the stale waiter is answered before the room the reload
/// makes is granted, so it takes no slot, no rate token and no grant on
/// its way out, and the next request, sent afresh, finds them.
#[test]
fn a_queued_request_whose_upstream_a_raising_reload_changed_takes_no_slot_it_frees() {
    a_reload_answers_the_queued_request_whose_upstream_it_changed(2);
}

/// A pool of one slot whose upstream one request holds while a second
/// waits; the reload gives it `concurrency` and a new key for the upstream.
fn a_reload_answers_the_queued_request_whose_upstream_it_changed(concurrency: u32) {
    let (up, answer) = answering_when_told("first");
    let pool = |concurrency: u32, secret: &str| {
        config(
            &format!(
                r#""concurrency":{concurrency},"adaptive":false,"rpm":1,"rpmBurst":2,"queue":{{"size":10,"timeoutMs":30000}},
                "upstream":{{"url":"{}","hosts":["{HOST}"],"setHeaders":{{"Authorization":"Bearer {secret}"}}}}"#,
                up.url()
            ),
            "",
        )
    };
    let server = TestServer::start(&pool(1, "one"));
    let mut first = server.connect();
    first.write_all(&proxied("GET", "/one", "", "")).unwrap();
    eventually("the first request holds the slot", || up.seen().len() == 1);
    let mut second = server.connect();
    second.write_all(&proxied("GET", "/two", "", "")).unwrap();
    eventually("the second request waits", || server.metric(r#"nthpool_waiters{pool="p"}"#) == Some(1.0));

    server.reload(&pool(concurrency, "two"));
    eventually("the waiter leaves the queue at the reload", || {
        server.metric(r#"nthpool_waiters{pool="p"}"#) == Some(0.0)
    });
    let r = read_any(&mut second).expect("the waiter is answered");
    assert_eq!((r.status, r.error_code().as_str()), (503, "unavailable"), "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    assert_eq!(server.metric(r#"nthpool_slots_held{pool="p"}"#), Some(1.0), "the first still holds the slot");
    assert_eq!(server.metric(r#"nthpool_grants_total{pool="p"}"#), Some(1.0), "the waiter took no grant");
    assert_eq!(server.metric(r#"nthpool_rpm_tokens{pool="p"}"#), Some(1.0), "nor a rate token");

    answer.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(read_any(&mut first).expect("the first answer").status, 200);
    let r = exchange(&server, &proxied("GET", "/three", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"first"[..]), "{r:?}");
    assert_eq!(up.seen()[1].header("authorization"), Some("Bearer two".to_string()));
    assert_eq!(up.seen().len(), 2, "the waiter never reached the upstream");
}

#[test]
fn an_exchange_cut_at_the_request_cap_releases_its_slot_with_its_outcome() {
    // The upstream sends a head and part of the body, then stalls past the
    // pool's requestTimeoutMs: the exchange is cut there and releases its
    // slot itself, so its report reaches the pool; the governor does not
    // take the lease back first.
    let up = MockUpstream::start(|_| {
        Reply::Paced(vec![(0, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab".to_vec()), (3000, b"x".to_vec())])
    });
    let server = TestServer::start(&config(
        &format!(
            r#""concurrency":1,"adaptive":false,"termMs":200,"renewIntervalMs":50,"requestTimeoutMs":500,
            "upstream":{{"url":"{}","hosts":["{HOST}"]}}"#,
            up.url()
        ),
        "",
    ));
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/capped", "", "")).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    assert!(all.starts_with(b"HTTP/1.1 200 OK"), "{}", String::from_utf8_lossy(&all));
    let m = |k: &str| server.metric(k);
    let counts = (
        m(r#"nthpool_releases_total{pool="p",outcome="released"}"#),
        m(r#"nthpool_releases_total{pool="p",outcome="already_gone"}"#),
        m(r#"nthpool_reclaims_total{pool="p",cause="cap"}"#),
    );
    assert_eq!(counts, (Some(1.0), Some(0.0), Some(0.0)));
}

#[test]
fn a_host_moved_from_a_removed_pool_to_another_goes_to_that_pool() {
    let up_a = MockUpstream::start(|_| ok("from-a", ""));
    let up_b = MockUpstream::start(|_| ok("from-b", ""));
    let pools = |a_hosts: &str, b: &str| {
        format!(
            r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{
            "a":{{"keys":["key-a"],"upstream":{{"url":"{}","hosts":[{a_hosts}]}}}}{b}}}}}"#,
            up_a.url()
        )
    };
    let b = format!(r#","b":{{"keys":["key-b"],"upstream":{{"url":"{}","hosts":["b.test"]}}}}"#, up_b.url());
    let server = TestServer::start(&pools(r#""a.test""#, &b));
    let to = |host: &str, key: &str| {
        let raw = format!("GET /x HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {key}\r\nConnection: close\r\n\r\n");
        exchange(&server, raw.as_bytes())
    };
    assert_eq!(to("b.test", "key-b").body, b"from-b");
    // `b` is removed and `a` takes its host: the host is `a`'s now.
    server.reload(&pools(r#""a.test","b.test""#, ""));
    let r = to("b.test", "key-a");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"from-a"[..]), "{r:?}");
}

#[test]
fn a_request_whose_body_a_reload_sends_up_leaves_no_body_state_behind() {
    // A request's head arrives for the lock API with half its body; a
    // reload then makes its Host a proxy host, so the rest goes up with
    // the exchange. What the lock API had started to read of the body must
    // not outlive it: the next request on the connection, chunked, for the
    // lock API, is read as its own (it once hit a stale body state and the
    // server aborted).
    let up = MockUpstream::start(|_| ok("up", ""));
    let server = TestServer::start(&config("", ""));
    let mut c = server.connect();
    let head = format!("POST /v1/chat HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 10\r\n\r\n");
    c.write_all(format!("{head}{{\"a\"").as_bytes()).unwrap();
    // Time for the server to read the head and wait for the body.
    std::thread::sleep(Duration::from_millis(200));
    server.reload(&config(&format!(r#""upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url()), ""));
    c.write_all(b":\"bc\"}").unwrap();
    let r = read_any(&mut c).expect("the proxied answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"up"[..]), "{r:?}");
    assert_eq!(up.seen()[0].body, b"{\"a\":\"bc\"}", "the whole body went up");
    let chunked = format!(
        "POST /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n\
         Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    );
    c.write_all(chunked.as_bytes()).unwrap();
    let r = read_any(&mut c).expect("the lock API's answer on the same connection");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(server.acquire("", "").status, 200, "the server goes on serving");
}

#[test]
fn a_pools_own_listener_stays_bound_to_it_across_reloads() {
    // A bound listener is not moved by a reload (that waits for a restart):
    // it goes on serving its pool, with a 404 while the pool does not proxy.
    let up = MockUpstream::start(|_| ok("via listener", ""));
    let port = free_port();
    let section = format!(r#""upstream":{{"url":"{}","listen":"127.0.0.1:{port}"}}"#, up.url());
    let server = TestServer::start(&config(&section, ""));
    let get = || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("GET /x HTTP/1.1\r\nHost: h\r\nX-Nthpool-Key: {KEY}\r\n\r\n").as_bytes()).unwrap();
        read_any(&mut s).unwrap()
    };
    let reload_until = |config_json: &str, status: u16| {
        std::fs::write(&server.config_path, config_json).unwrap();
        server.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = get();
            if r.status == status {
                return r;
            }
            assert!(Instant::now() < deadline, "never answered {status} after the reload: {r:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(get().status, 200);
    let r = reload_until(&config("", ""), 404);
    assert_eq!(r.error_code(), "not_found", "{r:?}");
    let r = reload_until(&config(&section, ""), 200);
    assert_eq!(r.body, b"via listener");
}

#[test]
fn chunked_bodies_are_relayed_both_ways() {
    let up = MockUpstream::start(|seen| {
        assert!(seen.chunked);
        let mut reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for piece in [&b"got "[..], &seen.body] {
            reply.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            reply.extend_from_slice(piece);
            reply.extend_from_slice(b"\r\n");
        }
        reply.extend_from_slice(b"0\r\n\r\n");
        Reply::Raw(reply)
    });
    let server = proxy_server(&up, 4, "");
    let raw = format!(
        "POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n\
         5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    );
    let mut s = server.connect();
    s.write_all(raw.as_bytes()).unwrap();
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"got hello world"[..]), "{r:?}");
    assert_eq!(up.seen()[0].body, b"hello world");
    // The connection stays usable for the next request.
    s.write_all(format!("POST /again HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n").as_bytes()).unwrap();
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"got abc"[..]), "{r:?}");
}

#[test]
fn refusals_are_answered_like_the_lock_api() {
    let up = MockUpstream::start(|_| ok("served", ""));
    let server = proxy_server(&up, 1, r#""waitMs":0"#);
    let held = server.acquire("", "");
    let slot = held.slot();
    let r = exchange(&server, &proxied("GET", "/v1/models", "", ""));
    assert_eq!((r.status, r.error_code().as_str()), (429, "too_many_requests"), "{r:?}");
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("concurrency"));
    assert!(r.header_u64("retry-after") >= 1);
    assert_eq!(r.header("x-nthpool-remaining-slots"), Some("0"));
    let r = exchange(&server, &proxied("GET", "/v1/models", "X-Nthpool-Queue-Timeout-Ms: 150\r\n", ""));
    assert_eq!((r.status, r.error_code().as_str()), (504, "queue_timeout"), "{r:?}");
    assert!(up.seen().is_empty(), "a refused request reached the upstream");
    // Queued behind the lock holder, granted when it releases.
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/v1/models", "X-Nthpool-Queue-Timeout-Ms: 5000\r\n", "")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(server.release(&slot, "").json()["released"].as_bool().unwrap());
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"served"[..]), "{r:?}");
    assert!(r.header_u64("x-nthpool-queued-ms") > 0, "{r:?}");
}

/// One answer's head, up to and with its empty line, left unparsed.
fn head_only(s: &mut TcpStream) -> String {
    String::from_utf8(read_through(s, b"\r\n\r\n", "a head")).unwrap()
}

/// The proxy's own answers (a refusal, a 502) to a `HEAD` have no body, as
/// the lock API's do: the next answer on the connection is read whole.
#[test]
fn the_proxys_own_answers_to_head_have_no_body() {
    let up = MockUpstream::start(|seen| {
        if seen.request_line().contains("/broken") {
            Reply::RawThenClose(b"HTTP/1.1 200 OK\r\nContent-Le".to_vec())
        } else {
            ok("fine", "")
        }
    });
    let server = proxy_server(&up, 1, r#""waitMs":0"#);
    let no_key = format!("HEAD /v1/models HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    let cases: [(&str, Vec<u8>, &str); 2] =
        [("401", no_key.into_bytes(), "HTTP/1.1 401 "), ("502", proxied("HEAD", "/broken", "", ""), "HTTP/1.1 502 ")];
    for (what, head_request, status_line) in cases {
        let mut s = server.connect();
        s.write_all(&[head_request, proxied("GET", "/v1/models", "", "")].concat()).unwrap();
        let head = head_only(&mut s);
        assert!(head.starts_with(status_line), "{what}: {head}");
        let next = read_any(&mut s).expect("the answer pipelined behind");
        assert_eq!((next.status, next.body.as_slice()), (200, &b"fine"[..]), "{what}: {next:?}");
    }
    // Refused for want of a slot: the same.
    let held = server.acquire("", "");
    let mut s = server.connect();
    s.write_all(&[proxied("HEAD", "/v1/models", "", ""), proxied("GET", "/v1/models", "", "")].concat()).unwrap();
    assert!(head_only(&mut s).starts_with("HTTP/1.1 429 "));
    let next = read_any(&mut s).expect("the answer pipelined behind");
    assert_eq!((next.status, next.error_code().as_str()), (429, "too_many_requests"), "{next:?}");
    server.release(&held.slot(), "");
}

#[test]
fn proxied_429s_with_openai_headers_teach_the_pool() {
    let up = MockUpstream::start(|_| {
        Reply::Raw(
            b"HTTP/1.1 429 Too Many Requests\r\nx-ratelimit-limit-requests: 60\r\nx-ratelimit-remaining-requests: 0\r\n\
              x-ratelimit-reset-requests: 20s\r\nretry-after: 20\r\nContent-Length: 2\r\n\r\n{}"
                .to_vec(),
        )
    });
    let server = TestServer::start(&config(
        &format!(r#""concurrency":4,"upstream":{{"url":"{}","hosts":["{HOST}"],"waitMs":0}}"#, up.url()),
        "",
    ));
    let r = exchange(&server, &proxied("POST", "/v1/chat/completions", "", "{}"));
    assert_eq!(r.status, 429, "the upstream's answer is relayed: {r:?}");
    assert!(r.header("x-nthpool-limit").is_some());
    // The exhausted budget now holds both kinds of traffic back.
    let lock = server.acquire("", "");
    assert_eq!(lock.status, 429, "{lock:?}");
    assert!(matches!(lock.header("x-nthpool-deny-reason"), Some("rate" | "cooldown")), "{lock:?}");
    let again = exchange(&server, &proxied("POST", "/v1/chat/completions", "", "{}"));
    assert_eq!((again.status, again.error_code().as_str()), (429, "too_many_requests"), "{again:?}");
    assert_eq!(up.seen().len(), 1, "the second request was held back, not sent");
}

#[test]
fn an_unreachable_upstream_is_a_502_that_frees_the_slot_and_is_warned_of() {
    let closed = refused_addr();
    let server = TestServer::start_logged(
        &config(&format!(r#""concurrency":1,"upstream":{{"url":"http://{closed}","hosts":["{HOST}"]}}"#), ""),
        "warn",
    );
    let r = exchange(&server, &proxied("GET", "/", "", ""));
    assert_eq!((r.status, r.error_code().as_str()), (502, "bad_gateway"), "{r:?}");
    // Granted, then failed: the answer carries its grant's governor headers,
    // as a relayed one would.
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 0, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-effective-limit"), 1, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-limit"), 1, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-queued-ms"), 0, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-queue-depth"), 0, "{r:?}");
    slot_comes_back(&server);
    // The operator is told too, not only the client: the log names the
    // upstream, its address and why.
    let deadline = Instant::now() + Duration::from_secs(5);
    let wanted = format!("the upstream {closed} at {closed}: connecting failed");
    while !server.log().contains(&wanted) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.log();
    assert!(log.contains(&wanted) && log.contains("no address left: answered 502"), "{log}");
}

#[test]
fn a_queued_request_whose_upstream_cannot_be_connected_at_its_grant_is_answered_502() {
    // A TCP connect to the broadcast address fails at once (ENETUNREACH), so
    // the grant that ends the wait finds no connection to attach.
    let server = TestServer::start(&config(
        &format!(
            r#""concurrency":1,"queue":{{"size":4,"timeoutMs":5000}},
            "upstream":{{"url":"http://255.255.255.255:9","hosts":["{HOST}"]}}"#
        ),
        "",
    ));
    let held = server.acquire("", "");
    assert_eq!(held.status, 200, "{held:?}");
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&proxied("GET", "/queued", "", "")).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(server.release(&held.slot(), "").status, 200);
    let r = read_any(&mut s).expect("an answer once the slot is granted");
    assert_eq!((r.status, r.error_code().as_str()), (502, "bad_gateway"), "{r:?}");
    slot_comes_back(&server);
}

#[test]
fn a_long_queue_whose_upstream_refuses_every_connection_is_answered_502_and_the_server_lives() {
    // Each grant fails at once, its release grants the next waiter, and so
    // on down the queue: that chain once recursed once per waiter, and a
    // queue of a few thousand overflowed the server's stack (its 8 MiB
    // held about 9 000). With a 256 KiB stack, 200 waiters were enough.
    const WAITERS: usize = 200;
    let closed = refused_addr();
    let server = TestServer::start_with_stack_limit(
        &config(
            &format!(
                r#""concurrency":1,"adaptive":false,"queue":{{"size":{WAITERS},"timeoutMs":30000}},
                "upstream":{{"url":"http://{closed}","hosts":["{HOST}"],"waitMs":30000}}"#
            ),
            "",
        ),
        256,
    );
    let held = server.acquire("", "");
    assert_eq!(held.status, 200, "{held:?}");
    let mut waiting: Vec<TcpStream> = (0..WAITERS)
        .map(|i| {
            let mut s = server.connect();
            s.write_all(&proxied("GET", &format!("/queued/{i}"), "", "")).unwrap();
            s
        })
        .collect();
    eventually("every request waits in the queue", || {
        server.metric(r#"nthpool_waiters{pool="p"}"#) == Some(WAITERS as f64)
    });
    assert_eq!(server.release(&held.slot(), "").status, 200);
    for (i, s) in waiting.iter_mut().enumerate() {
        let r = read_any(s).unwrap_or_else(|| panic!("waiter {i} got no answer: the server is gone"));
        assert_eq!((r.status, r.error_code().as_str()), (502, "bad_gateway"), "waiter {i}: {r:?}");
    }
    slot_comes_back(&server);
}

/// A server whose pool's upstream reads a request's head, answers `413`
/// and closes without reading the body.
fn refusing_at_the_head() -> TestServer {
    let addr = answer_at_head(b"HTTP/1.1 413 Too Big\r\nConnection: close\r\nContent-Length: 4\r\n\r\nnope", false);
    TestServer::start(&config(
        &format!(
            r#""concurrency":1,"upstream":{{"url":"http://{addr}","hosts":["{HOST}"],"maxRequestBytes":100000000}}"#
        ),
        "",
    ))
}

#[test]
fn an_answer_before_the_whole_upload_reaches_a_client_still_sending_it() {
    // The upstream refuses at the head and closes without reading the body:
    // the client, still writing it, must be able to finish and read the
    // answer (the lingering close drains what it sends) rather than be reset.
    let server = refusing_at_the_head();
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let total = 4 << 20;
    let head =
        format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: {total}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // Let the answer come before the body, so it is certain to come first.
    std::thread::sleep(Duration::from_millis(150));
    let piece = vec![b'z'; 64 * 1024];
    for _ in 0..total / piece.len() {
        if let Err(e) = s.write_all(&piece) {
            panic!("the upload was cut while the server was to drain it: {e}");
        }
    }
    let r = read_any(&mut s).expect("the upstream's answer");
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(r.body, b"nope");
    assert_eq!(r.header("connection"), Some("close"), "the answer closes the connection and says so: {r:?}");
    slot_comes_back(&server);
}

#[test]
fn an_answer_the_upstream_sends_before_closing_on_an_upload_is_relayed_not_a_502() {
    // As an SDK sends it: the head and a large body in one go. The upstream
    // answers at the head and closes (a reset, with the body unread) while
    // the server is still writing the body to it: the write fails, and the
    // answer already in the socket is what the client gets (it was once a
    // 502, retried by the SDKs, and the pool never saw the upstream's status).
    let server = refusing_at_the_head();
    for round in 0..5 {
        let mut s = server.connect();
        let upload = upload_in_background(&s, HOST, 4 << 20);
        let r = read_any(&mut s).expect("the upstream's answer");
        assert_eq!((r.status, r.body.as_slice()), (413, &b"nope"[..]), "round {round}: {r:?}");
        assert_eq!(r.header("connection"), Some("close"), "round {round}: {r:?}");
        let _ = upload.join();
        slot_comes_back(&server);
    }
}

#[test]
fn no_head_within_timeout_is_a_504_and_frees_the_slot() {
    let up = MockUpstream::start(|_| Reply::Silent(Duration::from_secs(5)));
    let server = proxy_server(&up, 1, r#""timeoutMs":300"#);
    let start = Instant::now();
    let r = exchange(&server, &proxied("GET", "/slow", "", ""));
    assert_eq!((r.status, r.error_code().as_str()), (504, "upstream_timeout"), "{r:?}");
    assert!(start.elapsed() >= Duration::from_millis(250), "answered before the timeout");
    slot_comes_back(&server);
}

#[test]
fn an_upstream_that_closes_mid_body_cuts_the_client_and_frees_the_slot() {
    let up = MockUpstream::start(|_| {
        Reply::RawThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part".to_vec())
    });
    let server = proxy_server(&up, 1, "");
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/", "", "")).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n") && text.ends_with("only part"), "{text}");
    slot_comes_back(&server);
}

/// A response head the proxy cannot relay is a `502` whose sentence says
/// why, the limit it broke named with its number; the slot comes back and
/// the pool serves the next request.
#[test]
fn an_unrelayable_response_head_is_a_502_that_says_why() {
    let many_fields: String = (0..200).map(|i| format!("X-F{i}: v\r\n")).collect();
    let cases = [
        (format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\nok", "a".repeat(40_000)), "32 KiB"),
        (format!("HTTP/1.1 200 OK\r\n{many_fields}Content-Length: 2\r\n\r\nok"), "128 fields"),
        ("HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok".to_string(), "malformed"),
        ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok".to_string(), "two different"),
        ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_string(), "switched protocols"),
    ];
    for (answer, said) in cases {
        let bad = answer.clone().into_bytes();
        let up = MockUpstream::start(move |seen| match seen.request_line().contains("/bad") {
            true => Reply::RawThenClose(bad.clone()),
            false => ok("fine", ""),
        });
        let server = proxy_server(&up, 1, "");
        let r = exchange(&server, &proxied("GET", "/bad", "", ""));
        assert_eq!((r.status, r.error_code().as_str()), (502, "bad_gateway"), "{said}: {r:?}");
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains(said), "{said}: {message}");
        slot_comes_back(&server);
        let r = exchange(&server, &proxied("GET", "/next", "", ""));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"fine"[..]), "{said}: {r:?}");
    }
}

#[test]
fn keep_alive_connections_to_the_upstream_are_reused() {
    let up = MockUpstream::start(|seen| ok(&format!("n{}", seen.conn), ""));
    let server = proxy_server(&up, 4, "");
    for _ in 0..5 {
        let r = exchange(&server, &proxied("GET", "/", "", ""));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"n0"[..]), "{r:?}");
    }
    assert_eq!(up.connections(), 1);
    assert_eq!(up.seen().len(), 5);
}

/// After a `HEAD`, or a `204` or `304` that announces a body, the upstream
/// connection is not reused: that body, sent late by a broken upstream,
/// would be read as the next request's answer (a 502 for a request that
/// had nothing to do with it).
#[test]
fn an_upstream_connection_is_not_reused_after_an_answer_that_announced_a_body_it_has_not() {
    for (method, answer) in [("HEAD", "200 OK"), ("GET", "304 Not Modified"), ("GET", "204 No Content")] {
        let head = format!("HTTP/1.1 {answer}\r\nContent-Length: 5\r\n\r\n").into_bytes();
        let up = MockUpstream::start(move |seen| match seen.request_line().contains("/first") {
            // The announced body comes after all, late.
            true => Reply::Paced(vec![(0, head.clone()), (300, b"stray".to_vec())]),
            false => ok(&format!("n{}", seen.conn), ""),
        });
        let server = proxy_server(&up, 4, "");
        let mut s = server.connect();
        s.write_all(&proxied(method, "/first", "", "")).unwrap();
        let status = format!("HTTP/1.1 {}", &answer[..3]);
        assert!(read_through(&mut s, b"\r\n\r\n", "a head").starts_with(status.as_bytes()), "{method} {answer}");
        let r = exchange(&server, &proxied("GET", "/", "", ""));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"n1"[..]), "{method} {answer}: a fresh connection: {r:?}");
        assert_eq!(up.connections(), 2, "{method} {answer}");
    }
}

/// HTTP/1.0 has no transfer codings: an answer of that version framed by
/// one is relayed, but its connection is closed after it (RFC 9112 §6.1),
/// even when it asks to be kept alive.
#[test]
fn an_http_1_0_answer_with_a_transfer_coding_does_not_keep_its_connection() {
    let up = MockUpstream::start(|seen| match seen.request_line().contains("/first") {
        true => Reply::Raw(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                .to_vec(),
        ),
        false => ok(&format!("n{}", seen.conn), ""),
    });
    let server = proxy_server(&up, 4, "");
    let r = exchange(&server, &proxied("GET", "/first", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]), "{r:?}");
    let r = exchange(&server, &proxied("GET", "/", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"n1"[..]), "a fresh connection: {r:?}");
    assert_eq!(up.connections(), 2);
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_slot_at_once() {
    let events: Vec<(u64, Vec<u8>)> =
        std::iter::once((0, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec()))
            .chain((0..100).map(|i| (100, format!("data: {i}\n\n").into_bytes())))
            .collect();
    let up = MockUpstream::start(move |_| Reply::Paced(events.clone()));
    let server = proxy_server(&up, 1, "");
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/v1/stream", "", "")).unwrap();
    let mut first = [0u8; 64];
    assert!(s.read_some(&mut first).unwrap() > 0);
    let held = server.acquire("", "");
    assert_eq!(held.status, 429, "the stream holds the only slot: {held:?}");
    drop(s);
    // The stream would run for ten more seconds; the slot is back long before.
    assert!(slot_comes_back(&server) < Duration::from_secs(5));
}

/// Reads until the server closes the connection; how long that took, or
/// `None` if it did not within `limit` (it would at the 60 s idle timeout).
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) if start.elapsed() < limit => {}
            Ok(_) => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(start.elapsed()),
            Err(_) => return None,
        }
    }
}

/// A client that closes its side while its request is queued, sent, or
/// mid-stream is gone: its slot comes back and its connection is closed at
/// once, not left open until the idle timeout.
#[test]
fn a_client_that_leaves_mid_exchange_has_its_connection_closed_at_once() {
    let stream: Vec<(u64, Vec<u8>)> =
        std::iter::once((0, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec()))
            .chain((0..100).map(|i| (100, format!("data: {i}\n\n").into_bytes())))
            .collect();
    let up = MockUpstream::start(move |seen| match seen.request_line().contains("/stream") {
        true => Reply::Paced(stream.clone()),
        false => Reply::Silent(Duration::from_secs(20)),
    });
    let server = proxy_server(&up, 1, r#""timeoutMs":20000"#);
    // Sent, no answer yet.
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/silent", "", "")).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while up.seen().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let took = closed_within(&mut s, Duration::from_secs(5));
    assert!(took.is_some(), "a client gone before the answer: its connection was left open");
    slot_comes_back(&server);
    // Mid-stream.
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/stream", "", "")).unwrap();
    let mut first = [0u8; 64];
    assert!(s.read_some(&mut first).unwrap() > 0);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let took = closed_within(&mut s, Duration::from_secs(5));
    assert!(took.is_some(), "a client gone mid-stream: its connection was left open");
    slot_comes_back(&server);
    // Queued behind a lock holder.
    let held = server.acquire("", "");
    assert_eq!(held.status, 200, "{held:?}");
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/silent", "X-Nthpool-Queue-Timeout-Ms: 5000\r\n", "")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let took = closed_within(&mut s, Duration::from_secs(4));
    assert!(took.is_some(), "a client gone from the queue: its connection was left open");
    server.release(&held.slot(), "");
    slot_comes_back(&server);
}

// ---------------------------------------------------------------- stopping

/// `proxy_server` with the access log written to `access.log` in its directory.
fn logged_proxy_server(up: &MockUpstream, concurrency: u32, extra: &str) -> TestServer {
    let sep = if extra.is_empty() { "" } else { "," };
    let c = config(
        &format!(
            r#""concurrency":{concurrency},"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
            "upstream":{{"url":"{}","hosts":["{HOST}"]{sep}{extra}}}"#,
            up.url()
        ),
        "",
    );
    TestServer::start(&c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1))
}

/// The access log's lines, once the server has exited.
fn final_access_log(s: &mut TestServer) -> Vec<serde_json::Value> {
    let status = exit_within(&mut s.child, Duration::from_secs(10)).expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `http://host?q` has an empty path, which is `/` (RFC 9110 §4.2.3): it is
/// served, goes up as `/?q`, and is logged as `/` (the log leaves queries out).
#[test]
fn an_absolute_form_target_with_an_empty_path_goes_up_as_the_root() {
    let up = MockUpstream::start(|_| ok("root", ""));
    let mut server = logged_proxy_server(&up, 2, "");
    let mut s = server.connect();
    for _ in 0..2 {
        s.write_all(&proxied("GET", &format!("http://{HOST}?x=1"), "", "")).unwrap();
        let r = read_any(&mut s).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"root"[..]), "{r:?}");
    }
    let seen: Vec<String> = up.seen().iter().map(|s| s.request_line().to_string()).collect();
    assert_eq!(seen, ["GET /?x=1 HTTP/1.1", "GET /?x=1 HTTP/1.1"]);
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    let paths: Vec<_> = lines.iter().map(|l| l["path"].as_str()).collect();
    assert_eq!(paths, [Some("/"), Some("/")], "the path, without its query: {lines:?}");
}

/// `OPTIONS http://host` (no path, no query) asks about the server, and the
/// last proxy sends it on as `OPTIONS *` (RFC 9112 §3.2.4); with a path or a
/// query it names a resource and goes up as that.
#[test]
fn an_absolute_form_options_without_a_path_goes_up_as_the_asterisk() {
    let up = MockUpstream::start(|_| ok("opts", ""));
    let server = proxy_server(&up, 2, "");
    let mut s = server.connect();
    // The same line twice: the second is read as the connection's remembered one.
    let server_wide = format!("http://{HOST}");
    for target in [
        &server_wide,
        &server_wide,
        &format!("HTTP://{HOST}:80"),
        &format!("http://{HOST}/"),
        &format!("http://{HOST}?q"),
    ] {
        s.write_all(&proxied("OPTIONS", target, "", "")).unwrap();
        let r = read_any(&mut s).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"opts"[..]), "{target}: {r:?}");
    }
    let seen: Vec<String> = up.seen().iter().map(|s| s.request_line().to_string()).collect();
    let asterisk = "OPTIONS * HTTP/1.1";
    assert_eq!(seen, [asterisk, asterisk, asterisk, "OPTIONS / HTTP/1.1", "OPTIONS /?q HTTP/1.1"]);
}

/// A proxied request the pool's access policy refuses is logged with the
/// client that policy saw (behind a trusted proxy, the forwarded address;
/// an unknown one as `0.0.0.0`), as a lock route's refusal is, not with the
/// proxy's own address.
#[test]
fn a_refused_proxied_request_logs_the_client_the_policy_saw() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let c = config(
        &format!(
            r#""access":{{"ipAllow":["10.0.0.0/8"],"trustedProxies":["127.0.0.1"]}},
            "upstream":{{"url":"{}","hosts":["{HOST}"]}}"#,
            up.url()
        ),
        "",
    );
    let mut server = TestServer::start(&c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1));
    let mut s = server.connect();
    for (from, status) in [("8.8.8.8", 403), ("unknown", 403), ("10.2.2.2", 200)] {
        s.write_all(&proxied("GET", "/v1/x", &format!("X-Forwarded-For: {from}\r\n"), "")).unwrap();
        let r = read_any(&mut s).unwrap();
        assert_eq!(r.status, status, "{from}: {r:?}");
    }
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    let clients: Vec<_> = lines.iter().map(|l| l["client"].as_str()).collect();
    assert_eq!(clients, [Some("8.8.8.8"), Some("0.0.0.0"), Some("10.2.2.2")], "{lines:?}");
}

/// Every request on a pool's own proxy listener is that pool's proxy
/// traffic: one whose head is refused for its framing, or whose client
/// closes before it is complete, gets its access-log line and counts as the
/// pool's rejection too, with the method and path its request line gives (the
/// query left out), as a lock API acquire would.
#[test]
fn a_request_on_a_pools_listener_refused_at_its_head_or_cut_short_is_logged() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let c = config(&format!(r#""upstream":{{"url":"{}","listen":"127.0.0.1:0"}}"#, up.url()), "");
    let mut server = TestServer::start(&c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1));
    let announced = server.banner.split("nthpool proxy for pool `p` on http://").nth(1).expect("the proxy listener");
    let listener = announced.lines().next().unwrap().to_string();
    let mut refused = TcpStream::connect(&listener).unwrap();
    refused.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    refused
        .write_all(
            b"POST /v1/refused?key=secret HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        )
        .unwrap();
    let r = read_any(&mut refused).unwrap();
    assert_eq!((r.status, r.error_code().as_str()), (400, "bad_request"), "{r:?}");
    // A stray line end is no request: its close is not logged.
    let mut stray = TcpStream::connect(&listener).unwrap();
    stray.write_all(b"\r\n").unwrap();
    drop(stray);
    let mut cut = TcpStream::connect(&listener).unwrap();
    cut.write_all(b"\r\nGET /v1/cut HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(cut);
    let log = server.dir.join("access.log");
    eventually("both lines are written", || std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 2));
    assert_eq!(server.metric(r#"nthpool_rejections_total{pool="p",code="400"}"#), Some(1.0));
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    let got: Vec<_> = lines
        .iter()
        .map(|l| {
            (l["pool"].as_str(), l["status"].as_u64(), l["error"].as_str(), l["method"].as_str(), l["path"].as_str())
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some("p"), Some(400), Some("bad_request"), Some("POST"), Some("/v1/refused")),
            (Some("p"), Some(499), Some("client_gone"), Some("GET"), Some("/v1/cut")),
        ],
        "{lines:?}"
    );
    assert!(up.seen().is_empty(), "nothing reached the upstream");
}

/// A request of garbage on a pool's listener (a method or a path of many
/// kilobytes, within the 16 KiB head) is refused as any other, and its
/// access-log line holds at most 32 bytes of the method and 1 024 of the
/// path, each marked `…` where it was cut: no line of 16 KiB.
#[test]
fn a_long_method_or_path_is_cut_in_the_access_log() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let c = config(&format!(r#""upstream":{{"url":"{}","listen":"127.0.0.1:0"}}"#, up.url()), "");
    let mut server = TestServer::start(&c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1));
    let announced = server.banner.split("nthpool proxy for pool `p` on http://").nth(1).expect("the proxy listener");
    let listener = announced.lines().next().unwrap().to_string();
    let (method, path) = ("X".repeat(15_000), format!("/{}", "p".repeat(15_000)));
    for line in [format!("{method} /v1/x"), format!("GET {path}")] {
        let mut s = TcpStream::connect(&listener).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("{line} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
        let r = read_any(&mut s).unwrap();
        assert_eq!((r.status, r.error_code().as_str()), (401, "unauthorized"), "{r:?}");
    }
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    let text = std::fs::read_to_string(server.dir.join("access.log")).unwrap();
    assert!(text.lines().all(|l| l.len() < 1_400), "a line of {} bytes", text.len());
    let got: Vec<_> = lines.iter().map(|l| (l["method"].as_str().unwrap(), l["path"].as_str().unwrap())).collect();
    let (cut_method, cut_path) = (format!("{}…", &method[..32]), format!("{}…", &path[..1024]));
    assert_eq!(got, [(cut_method.as_str(), "/v1/x"), ("GET", cut_path.as_str())]);
}

#[test]
fn sigterm_lets_a_proxied_request_in_flight_finish() {
    let up = MockUpstream::start(|_| {
        Reply::Paced(vec![(400, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone".to_vec())])
    });
    let mut server = logged_proxy_server(&up, 2, "");
    let mut s = server.connect();
    s.write_all(&proxied("POST", "/v1/slow", "", "{}")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    server.signal("TERM");
    let r = read_any(&mut s).expect("the upstream's answer, not an EOF");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"done"[..]), "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(is_closed(&mut s));
    let lines = final_access_log(&mut server);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!((lines[0]["status"].as_u64(), lines[0]["error"].as_str()), (Some(200), None), "{lines:?}");
}

/// A proxied request still arriving at the stop that completes within the
/// grace and finds its pool full does not wait for the grace's end: it is
/// answered the waiters' `503` at once and never reaches the upstream, while
/// the exchange in flight finishes.
#[test]
fn sigterm_answers_a_proxied_request_completed_in_the_grace_that_would_wait_with_503() {
    let up = MockUpstream::start(|_| {
        Reply::Paced(vec![(500, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone".to_vec())])
    });
    let c = config(
        &format!(
            r#""concurrency":1,"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
            "upstream":{{"url":"{}","hosts":["{HOST}"]}}"#,
            up.url()
        ),
        "",
    );
    let server = TestServer::start_logged(&c, "info");
    let mut first = server.connect();
    first.write_all(&proxied("GET", "/v1/slow", "", "")).unwrap();
    eventually("the first request reached the upstream", || up.seen().len() == 1);
    let request = proxied("GET", "/v1/late", "", "");
    let (head, rest) = request.split_at(10);
    let mut late = server.connect();
    late.write_all(head).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    server.signal("TERM");
    eventually("the stop began", || server.log().contains("shutting down"));
    late.write_all(rest).unwrap();
    let asked = Instant::now();
    let r = read_any(&mut late).expect("the late request is answered, not cut");
    assert!(asked.elapsed() < Duration::from_millis(400), "answered at once, not at the grace's end: {r:?}");
    assert_eq!((r.status, r.error_code().as_str()), (503, "unavailable"), "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(is_closed(&mut late));
    let r = read_any(&mut first).expect("the exchange in flight finishes");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"done"[..]), "{r:?}");
    assert_eq!(up.seen().len(), 1, "the late request never reached the upstream");
}

#[test]
fn sigterm_lets_a_proxied_stream_finish_and_cuts_what_outlasts_the_grace() {
    let events: Vec<(u64, Vec<u8>)> =
        std::iter::once((0, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec()))
            .chain((0..4).map(|i| (80, format!("data: {i}\n\n").into_bytes())))
            .collect();
    let up = MockUpstream::start(move |seen| match seen.request_line().split(' ').nth(1).unwrap() {
        "/stream" => Reply::Paced(events.clone()),
        _ => Reply::Silent(Duration::from_secs(5)),
    });
    let mut server = logged_proxy_server(&up, 4, "");
    let mut stream = server.connect();
    stream.write_all(&proxied("GET", "/stream", "", "")).unwrap();
    let mut stuck = server.connect();
    stuck.write_all(&proxied("GET", "/stuck", "", "")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let stopped = Instant::now();
    server.signal("TERM");
    let r = read_any(&mut stream).expect("the stream, not an EOF");
    assert_eq!(r.body, b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n", "{r:?}");
    // The upstream never answers: at the end of the grace the client is told.
    let cut = read_any(&mut stuck).expect("an answer at the end of the grace");
    assert_eq!((cut.status, cut.error_code().as_str()), (503, "unavailable"), "{cut:?}");
    assert!(stopped.elapsed() < Duration::from_secs(2), "{:?}", stopped.elapsed());
    let lines = final_access_log(&mut server);
    let by_path = |p: &str| lines.iter().find(|l| l["path"] == p).unwrap_or_else(|| panic!("{p}: {lines:?}")).clone();
    assert_eq!((by_path("/stream")["status"].as_u64(), by_path("/stream")["error"].as_str()), (Some(200), None));
    assert_eq!(
        (by_path("/stuck")["status"].as_u64(), by_path("/stuck")["error"].as_str()),
        (Some(503), Some("unavailable"))
    );
}

#[test]
fn a_response_still_streaming_when_the_grace_ends_is_cut_and_logged_shutdown_cut() {
    // The upstream streams for about three seconds; the stop's grace is shorter.
    let events: Vec<(u64, Vec<u8>)> =
        std::iter::once((0, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec()))
            .chain((0..15).map(|i| (200, format!("data: {i}\n\n").into_bytes())))
            .collect();
    let up = MockUpstream::start(move |_| Reply::Paced(events.clone()));
    let mut server = logged_proxy_server(&up, 2, "");
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&proxied("GET", "/long", "", "")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let stopped = Instant::now();
    server.signal("TERM");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read_some(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    assert!(stopped.elapsed() < Duration::from_secs(2), "cut after {:?}", stopped.elapsed());
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("data: 0"), "{text}");
    assert!(!text.contains("data: 14"), "the stream was not cut: {text}");
    let lines = final_access_log(&mut server);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (lines[0]["status"].as_u64(), lines[0]["error"].as_str()),
        (Some(200), Some("shutdown_cut")),
        "{lines:?}"
    );
}

// ---------------------------------------------------------------- connection handling

#[test]
fn a_queued_proxied_request_that_asked_to_close_gets_its_refusal_with_connection_close() {
    let up = MockUpstream::start(|_| Reply::Silent(Duration::from_secs(3)));
    let server = proxy_server(&up, 1, "");
    let mut holder = server.connect();
    holder.write_all(&proxied("GET", "/hold", "", "")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/wait", "Connection: close\r\nX-Nthpool-Queue-Timeout-Ms: 200\r\n", "")).unwrap();
    let r = read_any(&mut s).expect("a refusal");
    assert_eq!((r.status, r.error_code().as_str()), (504, "queue_timeout"), "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(is_closed(&mut s), "the connection stayed open");
}

#[test]
fn http10_keep_alive_proxied_answers_say_the_connection_is_kept() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = proxy_server(&up, 1, "");
    let mut s = server.connect();
    let raw = format!("GET /a HTTP/1.0\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nConnection: keep-alive\r\n\r\n");
    for _ in 0..2 {
        s.write_all(raw.as_bytes()).unwrap();
        let r = read_any(&mut s).expect("an answer on the kept connection");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"fine"[..]), "{r:?}");
        assert_eq!(r.header("connection"), Some("keep-alive"), "{r:?}");
    }
    // A refusal on it says so too.
    let wrong = format!("GET /a HTTP/1.0\r\nHost: {HOST}\r\nX-Nthpool-Key: wrong\r\nConnection: keep-alive\r\n\r\n");
    s.write_all(wrong.as_bytes()).unwrap();
    let r = read_any(&mut s).expect("a refusal");
    assert_eq!((r.status, r.header("connection")), (401, Some("keep-alive")), "{r:?}");
}

#[test]
fn relayed_answers_carry_a_date_when_the_upstream_sent_none() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = proxy_server(&up, 1, "");
    let r = exchange(&server, &proxied("GET", "/", "", ""));
    assert_eq!(r.status, 200, "{r:?}");
    let date = r.header("date").unwrap_or_else(|| panic!("no Date: {r:?}"));
    assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
}

/// A `Date` the upstream's `Connection` names is hop-by-hop, so it is
/// dropped (RFC 9110 §7.6.1), and the answer gets one of the proxy's own.
#[test]
fn a_date_the_upstreams_connection_names_is_replaced_not_left_out() {
    let up = MockUpstream::start(|_| ok("fine", "Connection: Date\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\n"));
    let server = proxy_server(&up, 1, "");
    let r = exchange(&server, &proxied("GET", "/", "", ""));
    assert_eq!(r.status, 200, "{r:?}");
    let dates: Vec<_> = r.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case("date")).map(|(_, v)| v).collect();
    assert_eq!(dates.len(), 1, "{r:?}");
    assert!(!dates[0].contains("2024") && dates[0].ends_with(" GMT"), "{r:?}");
}

#[test]
fn an_upstreams_own_governor_headers_are_not_relayed() {
    let up = MockUpstream::start(|_| ok("fine", "x-nthpool-effective-limit: 999\r\nX-Nthpool-Anything: up\r\n"));
    let server = proxy_server(&up, 3, "");
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/", "", "")).unwrap();
    let r = read_any(&mut s).expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
    let named = |n: &str| r.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(n)).count();
    assert_eq!(named("x-nthpool-effective-limit"), 1, "{r:?}");
    assert_eq!(r.header("x-nthpool-effective-limit"), Some("3"), "{r:?}");
    assert_eq!(named("x-nthpool-anything"), 0, "{r:?}");
}

// ---------------------------------------------------------------- slow clients

#[test]
fn a_client_slow_to_send_its_body_does_not_eat_the_upstreams_timeout() {
    let up = MockUpstream::start(|seen| ok(&String::from_utf8_lossy(&seen.body), ""));
    let server = proxy_server(&up, 1, r#""timeoutMs":600"#);
    let mut s = server.connect();
    let head = format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 6\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // Six bytes over 1.2 s: past the 600 ms timeout, but never stalled for it.
    for b in b"abcdef" {
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(&[*b]).unwrap();
    }
    let r = read_any(&mut s).expect("an answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"abcdef"[..]), "{r:?}");
}

#[test]
fn a_client_that_stalls_its_body_gets_a_408_and_the_upstream_is_not_blamed() {
    let up = MockUpstream::start(|_| ok("never", ""));
    let mut server = logged_proxy_server(&up, 1, r#""timeoutMs":400"#);
    let mut s = server.connect();
    let head = format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 6\r\n\r\na");
    s.write_all(head.as_bytes()).unwrap();
    let r = read_any(&mut s).expect("an answer");
    assert_eq!((r.status, r.error_code().as_str()), (408, "body_timeout"), "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    slot_comes_back(&server);
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    let line = lines.iter().find(|l| l["path"] == "/upload").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!((line["status"].as_u64(), line["error"].as_str()), (Some(408), Some("body_timeout")), "{line}");
    assert!(line["upstreamStatus"].is_null(), "{line}");
}

/// The upstream's `timeoutMs` that ran out, before its response head or
/// while the client's body stalled, is named with its number.
#[test]
fn a_504_or_408_at_the_upstreams_timeout_names_it_with_its_number() {
    let up = MockUpstream::start(|seen| match seen.request_line().contains("/silent") {
        true => Reply::Silent(Duration::from_secs(10)),
        false => ok("never", ""),
    });
    let server = proxy_server(&up, 1, r#""timeoutMs":400"#);
    let r = exchange(&server, &proxied("GET", "/silent", "", ""));
    assert_eq!((r.status, r.error_code().as_str()), (504, "upstream_timeout"), "{r:?}");
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("timeoutMs, 400 ms"), "{message}");
    slot_comes_back(&server);
    let mut s = server.connect();
    let head = format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 6\r\n\r\na");
    s.write_all(head.as_bytes()).unwrap();
    let r = read_any(&mut s).expect("an answer");
    assert_eq!((r.status, r.error_code().as_str()), (408, "body_timeout"), "{r:?}");
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("timeoutMs, 400 ms"), "{message}");
    slot_comes_back(&server);
}

#[test]
fn a_refused_connect_logs_no_upstream_time() {
    let closed = refused_addr();
    let c = config(&format!(r#""concurrency":1,"upstream":{{"url":"http://{closed}","hosts":["{HOST}"]}}"#), "");
    let mut server = TestServer::start(&c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1));
    let r = exchange(&server, &proxied("GET", "/refused", "", ""));
    assert_eq!(r.status, 502, "{r:?}");
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    let line = lines.iter().find(|l| l["path"] == "/refused").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(line["status"], 502, "{line}");
    assert!(line["upstreamMs"].is_null(), "nothing was sent: {line}");
}

#[test]
fn a_gzip_then_chunked_response_is_relayed() {
    let up = MockUpstream::start(|_| {
        Reply::Raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\n\x1f\x8b\x08\x00\x00\r\n0\r\n\r\n"
                .to_vec(),
        )
    });
    let server = proxy_server(&up, 1, "");
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/gz", "", "")).unwrap();
    let r = read_response(&mut s).expect("an answer");
    assert_eq!((r.status, r.header("transfer-encoding")), (200, Some("gzip, chunked")), "{r:?}");
    let mut rest = Vec::new();
    let mut buf = [0u8; 64];
    while !rest.ends_with(b"0\r\n\r\n") {
        let n = s.read_some(&mut buf).unwrap();
        assert!(n > 0, "the body ended early: {rest:?}");
        rest.extend_from_slice(&buf[..n]);
    }
    // Re-chunked as it was decoded: the coded bytes come through untouched.
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + rest[at..].windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&rest[at..line_end]).unwrap(), 16).unwrap();
        if size == 0 {
            break;
        }
        body.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
        at = line_end + 2 + size + 2;
    }
    assert_eq!(body, b"\x1f\x8b\x08\x00\x00");
}

#[test]
fn the_request_cap_before_any_response_head_is_answered_with_its_number_and_logged_as_such() {
    let up = MockUpstream::start(|_| Reply::Silent(Duration::from_secs(4)));
    let c = config(
        &format!(
            r#""concurrency":1,"termMs":200,"renewIntervalMs":50,"requestTimeoutMs":500,
            "upstream":{{"url":"{}","hosts":["{HOST}"]}}"#,
            up.url()
        ),
        "",
    );
    let mut server = TestServer::start(&c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1));
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/capped", "", "")).unwrap();
    let r = read_any(&mut s).expect("an answer, not an EOF");
    assert_eq!((r.status, r.error_code().as_str()), (504, "request_capped"), "{r:?}");
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("requestTimeoutMs, 500 ms,"), "{message}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(is_closed(&mut s));
    // The cap comes while the client is still sending its body, a byte
    // every 100 ms (never idle for the upstream's timeoutMs): the cap is
    // what ran out, not the client's body.
    let mut s = server.connect();
    let head =
        format!("POST /uploading HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 20\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut writer = s.try_clone().unwrap();
    std::thread::spawn(move || {
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(100));
            if writer.write_all(b"x").is_err() {
                return;
            }
        }
    });
    let r = read_any(&mut s).expect("an answer, not an EOF");
    assert_eq!((r.status, r.error_code().as_str()), (504, "request_capped"), "{r:?}");
    server.signal("TERM");
    let lines = final_access_log(&mut server);
    for path in ["/capped", "/uploading"] {
        let line = lines.iter().find(|l| l["path"] == path).unwrap_or_else(|| panic!("{lines:?}"));
        assert_eq!((line["status"].as_u64(), line["error"].as_str()), (Some(504), Some("request_capped")), "{line}");
    }
}

#[test]
fn a_chunked_body_past_max_request_bytes_is_413_and_its_upstream_connection_is_closed() {
    let up = MockUpstream::start(|seen| ok(&format!("n{}", seen.conn), ""));
    let server = proxy_server(&up, 1, r#""maxRequestBytes":1024,"idleTimeoutMs":30000"#);
    // A connection to the upstream kept idle from an earlier exchange.
    assert_eq!(exchange(&server, &proxied("GET", "/warm", "", "")).status, 200);
    let mut s = server.connect();
    let head =
        format!("POST /big HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let chunk = format!("200\r\n{}\r\n", "x".repeat(0x200));
    for _ in 0..3 {
        let _ = s.write_all(chunk.as_bytes());
    }
    let r = read_any(&mut s).expect("a refusal");
    assert_eq!((r.status, r.error_code().as_str()), (413, "payload_too_large"), "{r:?}");
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains(" 1024 bytes "), "maxRequestBytes is not named: {message:?}");
    // Its head and first chunks went up (the body streams): that connection
    // is closed mid-body, so the upstream never takes it for a whole request.
    // (Well before its idle timeout would close a connection kept for reuse.)
    assert!(up.wait_ended(0, Duration::from_secs(2)), "the upstream connection was not closed");
    assert!(up.seen().iter().all(|s| s.request_line() != "POST /big HTTP/1.1"), "{:?}", up.seen());
    let next = exchange(&server, &proxied("GET", "/next", "", ""));
    assert_eq!((next.status, next.body.as_slice()), (200, &b"n1"[..]), "a fresh connection: {next:?}");
}

#[test]
fn upstream_connections_kept_idle_give_way_when_descriptors_run_out() {
    // 300 descriptors allow about 78 client connections with proxying. Four
    // pools each take a wave of 70 requests at once, and each wave leaves
    // its upstream connections idle for reuse (`idleConnections` 100): the
    // fourth needs more descriptors than the idle ones of the other three
    // leave. Those are closed for it, as for its clients' accepts (it once
    // got 502s, reported to its pool as the upstream's failures).
    const WAVE: usize = 70;
    let up = MockUpstream::start(|_| {
        std::thread::sleep(Duration::from_millis(200));
        ok("up", "")
    });
    let pools: Vec<String> = (0..4)
        .map(|i| {
            format!(
                r#""p{i}":{{"keys":["{KEY}"],"concurrency":100,"upstream":{{"url":"{}","hosts":["h{i}.test"],"idleConnections":100,"idleTimeoutMs":60000}}}}"#,
                up.url()
            )
        })
        .collect();
    let config = format!(r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{{}}}}}"#, pools.join(","));
    let s = TestServer::start_with_fd_limit(&config, 300);
    for i in 0..4 {
        let calls: Vec<_> = (0..WAVE)
            .map(|_| {
                let mut c = s.connect();
                std::thread::spawn(move || {
                    let head = format!("GET /v1/x HTTP/1.1\r\nHost: h{i}.test\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
                    c.write_all(head.as_bytes()).unwrap();
                    read_any(&mut c).map(|r| r.status)
                })
            })
            .collect();
        let statuses: Vec<Option<u16>> = calls.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(statuses.iter().all(|&s| s == Some(200)), "wave {i}: {statuses:?}\n{}", s.log());
    }
    assert!(up.connections() > 3 * WAVE, "the waves opened connections of their own");
}

#[test]
fn a_request_cap_below_the_upstreams_timeout_is_warned_of_not_refused() {
    // `requestTimeoutMs` (60 s by default) cuts an exchange, a stream
    // included, before `upstream.timeoutMs` (600 s) could: valid, but said.
    let pool = r#""upstream":{"url":"http://127.0.0.1:9","hosts":["a.test"]}"#;
    let said = "pools.p: requestTimeoutMs (60000) cuts every proxied exchange";
    let dir = scratch_dir();
    let path = dir.join("config.json");
    std::fs::write(&path, config(pool, "")).unwrap();
    let r = run(&dir, &["--check-config", path.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(r.stderr.contains(&format!("warning: {said}")), "{}", r.stderr);
    let s = TestServer::start_logged(&config(pool, ""), "warn");
    assert!(s.log().contains(said), "{}", s.log());
    s.reload(&config(&format!(r#"{pool},"requestTimeoutMs":600000"#), ""));
    assert_eq!(s.log().matches(said).count(), 1, "not said of a cap that allows it: {}", s.log());
}
