//! Proxy mode to `https://` upstreams over real sockets: a rustls upstream
//! on loopback with a certificate authority made for each test, names
//! resolved by the resolver thread, managed credentials, and what never
//! leaks them.

mod common;
#[path = "common/dns.rs"]
mod dns;
mod sdk_support;
mod tls_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tls_support::{Ca, Leaf, TlsServer, TlsServerStream};

const HOST: &str = "p.proxy.test";
const MANAGED_KEY: &str = "sk-managed-7d1f0c9a";

/// A TLS upstream speaking the mock LLM wire shapes; returns it and the
/// requests it saw.
fn llm_upstream(leaf: &Leaf) -> (TlsServer, Arc<Mutex<Vec<sdk_support::Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let server = TlsServer::start(
        leaf,
        Arc::new(move |stream: &mut TlsServerStream| {
            let _ = sdk_support::serve(stream, &seen2);
        }),
    );
    (server, seen)
}

/// Pool `p` proxying `Host: p.proxy.test` to `url`, with `extra` members in
/// its `upstream` section; the managed key is read from `key.txt` in `dir`.
fn pool(url: &str, dir: &Path, extra: &str) -> String {
    let key_file = dir.join("key.txt");
    if !key_file.exists() {
        std::fs::write(&key_file, format!("{MANAGED_KEY}\n")).unwrap();
    }
    format!(
        r#""concurrency":4,"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
        "upstream":{{"url":"{url}","hosts":["{HOST}"],
        "setHeaders":{{"Authorization":"Bearer ${{file:{}}}"}}{extra}}}"#,
        key_file.display()
    )
}

fn with_ca(ca: &Ca, dir: &Path) -> String {
    format!(r#","caFile":"{}""#, ca.write_pem(dir).display())
}

/// Starts the server (log captured) with pool `pool_json`.
fn server(pool_json: &str) -> TestServer {
    TestServer::start_logged(&config(pool_json, ""), "debug")
}

fn chat_request(stream: bool) -> Vec<u8> {
    let body = format!(r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}],"stream":{stream}}}"#);
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn completion_text(r: &Response) -> String {
    assert_eq!(r.status, 200, "{:?} {}", r.headers, String::from_utf8_lossy(&r.body));
    r.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn forwards_over_tls_with_sni_keep_alive_and_the_managed_key() {
    let ca = Ca::new("test ca");
    let (up, seen) = llm_upstream(&ca.leaf(&["localhost"]));
    let dir = scratch_dir();
    let s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &with_ca(&ca, &dir)));
    let mut c = s.connect();
    for _ in 0..3 {
        c.write_all(&chat_request(false)).unwrap();
        let r = read_response(&mut c).expect("a response");
        assert_eq!(completion_text(&r), "Hello from the mock upstream.");
    }
    // One TLS connection carried all three (the keep-alive pool), its
    // name given as SNI, ALPN http/1.1.
    let conns = up.seen(1);
    assert_eq!(conns.len(), 1, "{conns:?}");
    assert_eq!(conns[0].sni.as_deref(), Some("localhost"));
    assert_eq!(conns[0].alpn.as_deref(), Some(&b"http/1.1"[..]));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for request in &seen {
        assert_eq!(request.header("authorization"), Some(format!("Bearer {MANAGED_KEY}").as_str()));
        assert!(request.header("x-nthpool-key").is_none(), "{:?}", request.headers);
        assert_eq!(request.header("host"), Some(format!("localhost:{}", up.addr.port()).as_str()));
    }
}

#[test]
fn new_connections_resume_the_tls_session() {
    let ca = Ca::new("test ca");
    let (up, _) = llm_upstream(&ca.leaf(&["localhost"]));
    let dir = scratch_dir();
    // No idle connections kept: each exchange needs a new TLS connection.
    let extra = format!(r#"{},"idleConnections":0"#, with_ca(&ca, &dir));
    let s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &extra));
    for _ in 0..3 {
        assert_eq!(completion_text(&s.request(&chat_request(false))), "Hello from the mock upstream.");
    }
    let conns = up.seen(3);
    assert!(!conns[0].resumed, "{conns:?}");
    assert!(conns[1].resumed && conns[2].resumed, "later connections made full handshakes: {conns:?}");
    let metrics = admin_get(s.admin.expect("admin listener"), "/metrics");
    assert!(metrics.contains("\nnthpool_proxy_tls_resumed_total 2\n"), "{metrics}");
}

#[test]
fn each_refused_certificate_is_a_502_naming_its_cause_and_a_log_line() {
    let ca = Ca::new("test ca");
    let stranger = Ca::new("stranger ca");
    let cases: [(&str, Leaf, &Ca, &str, &str); 3] = [
        (
            "unknown CA",
            stranger.leaf(&["localhost"]),
            &ca,
            "The upstream's TLS certificate is not signed by a trusted certificate authority.",
            "not signed by a trusted certificate authority",
        ),
        (
            "wrong host name",
            ca.leaf(&["other.test"]),
            &ca,
            "The upstream's TLS certificate is not valid for its host name.",
            "not valid for the host name localhost (it names other.test)",
        ),
        (
            "expired",
            ca.expired_leaf(&["localhost"]),
            &ca,
            "The upstream's TLS certificate has expired.",
            "the upstream's certificate has expired",
        ),
    ];
    for (what, leaf, trusted, sentence, logged) in cases {
        let (up, seen) = llm_upstream(&leaf);
        let dir = scratch_dir();
        let s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &with_ca(trusted, &dir)));
        let r = s.request(&chat_request(false));
        assert_eq!(r.status, 502, "{what}: {:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.error_code(), "bad_gateway", "{what}");
        assert_eq!(r.json()["message"], sentence, "{what}");
        assert!(seen.lock().unwrap().is_empty(), "{what}: a request reached an unverified upstream");
        // The slot came back: the pool grants again.
        assert_eq!(s.acquire("", "").status, 200, "{what}");
        let log = wait_for_log(&s, logged);
        assert!(log.contains("TLS with the upstream localhost:"), "{what}: {log}");
        let metrics = admin_get(s.admin.expect("admin listener"), "/metrics");
        assert!(metrics.contains("\nnthpool_proxy_tls_failures_total 1\n"), "{what}: {metrics}");
    }
}

/// A reload that changes `caFile` applies to the next exchange, also on a
/// connection kept alive: one verified under the old roots is not reused
/// (a CA taken out of `caFile` is not trusted on, for as long as traffic
/// keeps that connection busy). A reload that leaves the roots as they
/// were keeps the connection.
#[test]
fn a_reload_that_changes_the_trusted_roots_reuses_no_connection_verified_under_the_old_ones() {
    let ca = Ca::new("test ca");
    let stranger = Ca::new("stranger ca");
    let (up, _) = llm_upstream(&ca.leaf(&["localhost"]));
    let dir = scratch_dir();
    let url = format!("https://localhost:{}", up.addr.port());
    let s = server(&pool(&url, &dir, &with_ca(&ca, &dir)));
    assert_eq!(completion_text(&s.request(&chat_request(false))), "Hello from the mock upstream.");
    s.reload(&config(&pool(&url, &dir, &with_ca(&ca, &dir)), ""));
    assert_eq!(completion_text(&s.request(&chat_request(false))), "Hello from the mock upstream.");
    let metrics = admin_get(s.admin.expect("admin listener"), "/metrics");
    assert!(metrics.contains("\nnthpool_proxy_upstream_reuses_total 1\n"), "the same roots: kept alive: {metrics}");
    let other_dir = scratch_dir();
    s.reload(&config(&pool(&url, &dir, &with_ca(&stranger, &other_dir)), ""));
    let r = s.request(&chat_request(false));
    assert_eq!(r.status, 502, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["message"], "The upstream's TLS certificate is not signed by a trusted certificate authority.");
    // And back: the roots that sign it are trusted again, on a new connection.
    s.reload(&config(&pool(&url, &dir, &with_ca(&ca, &dir)), ""));
    assert_eq!(completion_text(&s.request(&chat_request(false))), "Hello from the mock upstream.");
    // The first, the one refused after the first reload, a new one after the second.
    assert_eq!(up.seen(3).len(), 3, "a new connection after each reload");
}

#[test]
fn an_answer_a_tls_upstream_sends_before_closing_on_an_upload_is_relayed() {
    // The upstream reads the head, answers 413 a moment later and closes
    // with the body unread (a reset), while the server still writes the
    // body: the answer, already decrypted, is relayed (the session's failed
    // push of the rest once hid it behind a 502).
    let ca = Ca::new("test ca");
    let up = TlsServer::start(
        &ca.leaf(&["localhost"]),
        Arc::new(|stream: &mut TlsServerStream| {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read_some(&mut buf) {
                    Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                    _ => return,
                }
            }
            std::thread::sleep(Duration::from_millis(50));
            let _ = stream.write_all(b"HTTP/1.1 413 Too Big\r\nConnection: close\r\nContent-Length: 4\r\n\r\nnope");
        }),
    );
    let dir = scratch_dir();
    let url = format!("https://localhost:{}", up.addr.port());
    let s = server(&pool(&url, &dir, &format!(r#"{},"maxRequestBytes":100000000"#, with_ca(&ca, &dir))));
    for round in 0..3 {
        let mut c = s.connect();
        let upload = upload_in_background(&c, HOST, 4 << 20);
        let r = read_response(&mut c).expect("the upstream's answer");
        assert_eq!((r.status, r.body.as_slice()), (413, &b"nope"[..]), "round {round}: {r:?}");
        let _ = upload.join();
    }
}

#[test]
fn an_exchange_waiting_for_its_upstreams_name_keeps_the_trust_it_started_with() {
    // The name resolves slowly; meanwhile a reload gives the pool roots that
    // do not sign the upstream. The exchange, granted before, connects with
    // the roots it started with (it once took the new ones and got a 502),
    // and the next exchange is judged under the new ones.
    let ca = Ca::new("test ca");
    let stranger = Ca::new("stranger ca");
    let (up, _) = llm_upstream(&ca.leaf(&["up.test"]));
    let dns = dns::MockDns::start();
    let delay = Duration::from_millis(800);
    dns.set("up.test", dns::Zone { a: vec![std::net::Ipv4Addr::LOCALHOST], ttl_s: 0, delay, nxdomain: false });
    let dir = scratch_dir();
    let url = format!("https://up.test:{}", up.addr.port());
    let with = |ca: &Ca, ca_dir: &Path| config(&pool(&url, &dir, &with_ca(ca, ca_dir)), &dns.resolver_config(""));
    let s = TestServer::start_logged(&with(&ca, &dir), "info");
    let mut c = s.connect();
    c.write_all(&chat_request(false)).unwrap();
    eventually("the name is asked for", || !dns.a_queries("up.test").is_empty());
    let other_dir = scratch_dir();
    s.reload(&with(&stranger, &other_dir));
    let r = read_response(&mut c).expect("the answer");
    assert_eq!(completion_text(&r), "Hello from the mock upstream.");
    let r = s.request(&chat_request(false));
    assert_eq!(r.status, 502, "{:?}", String::from_utf8_lossy(&r.body));
}

#[test]
fn a_ca_certificate_served_as_the_upstream_s_own_is_refused_saying_what_to_serve() {
    // A self-signed certificate marked CA:TRUE, given as `caFile` and served
    // by the upstream itself: webpki refuses a CA's certificate as a
    // server's, and the operator is told to serve one issued by it instead.
    let (leaf, pem) = tls_support::self_signed_ca_as_server(&["localhost"]);
    let (up, seen) = llm_upstream(&leaf);
    let dir = scratch_dir();
    let ca_file = dir.join("self-signed.pem");
    std::fs::write(&ca_file, pem).unwrap();
    let extra = format!(r#","caFile":"{}""#, ca_file.display());
    let s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &extra));
    let r = s.request(&chat_request(false));
    assert_eq!(r.status, 502, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.error_code(), "bad_gateway");
    assert_eq!(
        r.json()["message"],
        "The upstream's TLS certificate is a certificate authority's, not one issued for the server."
    );
    assert!(seen.lock().unwrap().is_empty(), "a request reached an unverified upstream");
    let log = wait_for_log(&s, "TLS with the upstream localhost:");
    assert!(
        log.contains("serve a certificate issued by that CA for the host name instead of the CA certificate itself"),
        "{log}"
    );
    assert!(!log.contains("Other(OtherError"), "no debug text in the log: {log}");
    assert_eq!(s.acquire("", "").status, 200, "the slot came back");
}

fn wait_for_log(s: &TestServer, needle: &str) -> String {
    for _ in 0..100 {
        let log = s.log();
        if log.contains(needle) {
            return log;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no {needle:?} in the log:\n{}", s.log());
}

#[test]
fn a_plain_peer_behind_an_https_url_is_refused_not_spoken_to_in_plain() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut first = [0u8; 1];
        c.read_exact(&mut first).unwrap();
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        first[0]
    });
    let dir = scratch_dir();
    let s = server(&pool(&format!("https://127.0.0.1:{port}"), &dir, ""));
    let r = s.request(&chat_request(false));
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["message"], "TLS with the upstream failed.");
    // What the proxy sent first was a TLS handshake record, not HTTP.
    assert_eq!(peer.join().unwrap(), 0x16);
}

#[test]
fn server_sent_events_over_tls_arrive_event_by_event() {
    let ca = Ca::new("test ca");
    let (go_on, wait) = mpsc::channel::<()>();
    let wait = Mutex::new(wait);
    let up = TlsServer::start(
        &ca.leaf(&["localhost"]),
        Arc::new(move |stream: &mut TlsServerStream| {
            let mut buf = [0u8; 4096];
            let _ = stream.read_some(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
                  d\r\ndata: first\n\n\r\n",
            );
            let _ = stream.flush();
            // The rest only once the client has seen the first event.
            let _ = wait.lock().unwrap().recv_timeout(Duration::from_secs(10));
            let _ = stream.write_all(b"e\r\ndata: second\n\n\r\n0\r\n\r\n");
            let _ = stream.flush();
        }),
    );
    let dir = scratch_dir();
    let s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &with_ca(&ca, &dir)));
    let mut c = s.connect();
    c.write_all(&chat_request(true)).unwrap();
    let mut got = Vec::new();
    read_until(&mut c, &mut got, b"data: first\n\n");
    assert!(!contains(&got, b"second"), "the second event came before it was sent");
    go_on.send(()).unwrap();
    read_until(&mut c, &mut got, b"data: second\n\n");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.to_ascii_lowercase().contains("content-type: text/event-stream"), "{text}");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn read_until(c: &mut TcpStream, got: &mut Vec<u8>, needle: &[u8]) {
    let mut buf = [0u8; 4096];
    while !contains(got, needle) {
        let n = c.read_some(&mut buf).expect("the proxy kept the stream open");
        assert!(
            n > 0,
            "the stream ended before {:?}: {}",
            String::from_utf8_lossy(needle),
            String::from_utf8_lossy(got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn localhost_is_resolved_by_the_resolver_for_plain_upstreams_too() {
    let mock = sdk_support::MockLlm::start();
    let dir = scratch_dir();
    let s = server(&pool(&format!("http://localhost:{}", mock.addr.port()), &dir, ""));
    assert_eq!(completion_text(&s.request(&chat_request(false))), "Hello from the mock upstream.");
    // The loop answers the lock API all along.
    assert_eq!(s.acquire("", "").status, 200);
    assert_eq!(mock.seen().len(), 1);
}

#[test]
fn sighup_rereads_the_managed_key_and_a_failed_read_keeps_the_old_one() {
    let mock = sdk_support::MockLlm::start();
    let dir = scratch_dir();
    let s = server(&pool(&format!("http://127.0.0.1:{}", mock.addr.port()), &dir, ""));
    let key_seen = |n: usize| {
        let seen = mock.seen();
        assert_eq!(seen.len(), n);
        seen[n - 1].header("authorization").unwrap_or_default().to_owned()
    };
    assert_eq!(completion_text(&s.request(&chat_request(false))), "Hello from the mock upstream.");
    assert_eq!(key_seen(1), format!("Bearer {MANAGED_KEY}"));

    std::fs::write(dir.join("key.txt"), "sk-rotated-0002\n").unwrap();
    s.signal("HUP");
    let mut rotated = false;
    for n in 2..60 {
        completion_text(&s.request(&chat_request(false)));
        if key_seen(n) == "Bearer sk-rotated-0002" {
            rotated = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(rotated, "the reload never took the new key");

    // The file goes away: the reload fails, the old (rotated) key stays.
    std::fs::remove_file(dir.join("key.txt")).unwrap();
    s.signal("HUP");
    wait_for_log(&s, "key.txt");
    let n = mock.seen().len() + 1;
    completion_text(&s.request(&chat_request(false)));
    assert_eq!(key_seen(n), "Bearer sk-rotated-0002");
}

#[test]
fn the_managed_key_appears_in_no_output() {
    let ca = Ca::new("test ca");
    let (up, seen) = llm_upstream(&ca.leaf(&["localhost"]));
    let (bad_up, _) = llm_upstream(&ca.leaf(&["other.test"]));
    let dir = scratch_dir();
    let key_file = dir.join("key.txt");
    std::fs::write(&key_file, format!("{MANAGED_KEY}\n")).unwrap();
    let access_log = dir.join("access.log");
    let upstream = |url: String| {
        format!(
            r#""concurrency":2,"adaptive":false,"upstream":{{"url":"{url}","hosts":["{{HOST}}"],"caFile":"{}",
            "setHeaders":{{"Authorization":"Bearer ${{file:{}}}","X-Org":"org-{MANAGED_KEY}"}}}}"#,
            ca.write_pem(&dir).display(),
            key_file.display()
        )
    };
    let good = upstream(format!("https://localhost:{}", up.addr.port())).replace("{HOST}", HOST);
    let bad = upstream(format!("https://localhost:{}", bad_up.addr.port())).replace("{HOST}", "bad.proxy.test");
    let config = format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":"{}",
        "pools":{{"p":{{"keys":["{KEY}"],{good}}},"q":{{"keys":["{KEY}"],{bad}}}}}}}"#,
        access_log.display()
    );
    // Debug logging: the most the log can say.
    let s = TestServer::start_logged(&config, "debug");
    let mut outputs = Vec::new();
    let ok = s.request(&chat_request(false));
    assert_eq!(completion_text(&ok), "Hello from the mock upstream.");
    outputs.push(format!("{:?} {}", ok.headers, String::from_utf8_lossy(&ok.body)));
    let refused =
        s.request(&String::from_utf8(chat_request(false)).unwrap().replace(HOST, "bad.proxy.test").into_bytes());
    assert_eq!(refused.status, 502);
    outputs.push(format!("{:?} {}", refused.headers, String::from_utf8_lossy(&refused.body)));
    // A request without the pool key is refused before the upstream.
    let no_key = s.request(
        &String::from_utf8(chat_request(false)).unwrap().replace(&format!("X-Nthpool-Key: {KEY}\r\n"), "").into_bytes(),
    );
    assert_eq!(no_key.status, 401);
    outputs.push(format!("{:?} {}", no_key.headers, String::from_utf8_lossy(&no_key.body)));
    // The upstream got it: the secret is real and was in play.
    assert_eq!(seen.lock().unwrap()[0].header("authorization"), Some(format!("Bearer {MANAGED_KEY}").as_str()));

    let admin = s.admin.expect("admin listener");
    for path in ["/metrics", "/api/pools", "/api/pools/p", "/api/pools/q", "/pools/p", "/healthz"] {
        outputs.push(admin_get(admin, path));
    }
    // A reload re-reads the key and flushes the access log.
    s.signal("HUP");
    wait_for_log(&s, "configuration reloaded");
    outputs.push(std::fs::read_to_string(&access_log).unwrap_or_default());
    outputs.push(s.log());
    assert!(outputs.last().unwrap().contains("DEBUG"), "debug logging was on");
    let access = &outputs[outputs.len() - 2];
    assert!(access.contains(r#""pool":"p""#) && access.contains(r#""pool":"q""#), "the access log has both:\n{access}");
    for (i, out) in outputs.iter().enumerate() {
        assert!(!out.contains(MANAGED_KEY), "output {i} carries the managed key:\n{out}");
    }
}

#[test]
fn a_handshake_that_never_finishes_is_a_502_at_its_deadline() {
    // A peer that takes the connection and never says a word.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let holder = std::thread::spawn(move || {
        let held = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(20));
        drop(held);
    });
    let dir = scratch_dir();
    let extra = r#","timeoutMs":60000,"tlsHandshakeTimeoutMs":500"#;
    let s = server(&pool(&format!("https://127.0.0.1:{port}"), &dir, extra));
    let mut c = s.connect();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let sent = std::time::Instant::now();
    c.write_all(&chat_request(false)).unwrap();
    let r = read_response(&mut c).expect("an answer before the read timeout");
    assert_eq!(r.status, 502);
    // At the configured 0.5 s, not the default 10 s (with slack for a loaded machine).
    assert!(sent.elapsed() < Duration::from_secs(5), "the 502 took {:?}", sent.elapsed());
    // The limit that ran out is named with its number.
    assert_eq!(
        r.json()["message"],
        "The TLS handshake with the upstream did not finish within its tlsHandshakeTimeoutMs, 500 ms."
    );
    wait_for_log(&s, "did not finish in time");
    assert_eq!(s.acquire("", "").status, 200, "the slot came back");
    drop(holder);
}

/// A literal credential in `setHeaders` does not show in a `Debug` print of
/// the whole configuration, nor does a resolved one in the built upstream.
#[test]
fn debug_prints_of_the_configuration_carry_no_credential() {
    let dir = scratch_dir();
    let key_file = dir.join("key.txt");
    std::fs::write(&key_file, format!("{MANAGED_KEY}\n")).unwrap();
    let text = config(
        &format!(
            r#""upstream":{{"url":"https://api.example","hosts":["{HOST}"],
            "setHeaders":{{"Authorization":"Bearer ${{file:{}}}","X-Org":"org-literal-{MANAGED_KEY}"}}}}"#,
            key_file.display()
        ),
        "",
    );
    let config = nthpool::config::Config::parse(text.as_bytes()).unwrap();
    let shown = format!("{config:?} {config:#?}");
    assert!(shown.contains("api.example"), "the print is of this configuration: {shown}");
    assert!(!shown.contains(MANAGED_KEY), "{shown}");
    let section = config.pools["p"].upstream.as_ref().expect("an upstream");
    let built = nthpool::config::upstream::Upstream::build(section).unwrap();
    assert!(built.set_headers.iter().any(|(_, v)| v.expose() == format!("Bearer {MANAGED_KEY}")));
    let shown = format!("{built:?} {built:#?}");
    assert!(!shown.contains(MANAGED_KEY), "{shown}");
}

/// A TLS upstream answering every `GET` with a `200`; when the session ends
/// it sends whether it ended with `close_notify` (rustls: a clean EOF) or
/// how it ended otherwise.
fn upstream_reporting_its_close(leaf: &Leaf) -> (TlsServer, mpsc::Receiver<Result<(), String>>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let server = TlsServer::start(
        leaf,
        Arc::new(move |stream: &mut TlsServerStream| {
            let mut input = Vec::new();
            let mut buf = [0u8; 4096];
            let end = loop {
                match stream.read_some(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(n) => input.extend_from_slice(&buf[..n]),
                    Err(e) => break Err(format!("{:?}: {e}", e.kind())),
                }
                while let Some(at) = input.windows(4).position(|w| w == b"\r\n\r\n") {
                    input.drain(..at + 4);
                    if stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err() {
                        return;
                    }
                }
            };
            let _ = tx.lock().unwrap().send(end);
        }),
    );
    (server, rx)
}

fn get_through(s: &TestServer) -> Response {
    s.request(format!("GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n\r\n").as_bytes())
}

#[test]
fn an_idle_connection_closed_by_nthpool_ends_with_close_notify() {
    let ca = Ca::new("test ca");
    let (up, closes) = upstream_reporting_its_close(&ca.leaf(&["localhost"]));
    let dir = scratch_dir();
    let extra = format!(r#"{},"idleTimeoutMs":300"#, with_ca(&ca, &dir));
    let s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &extra));
    let r = get_through(&s);
    assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]), "{r:?}");
    // Kept idle, then closed by nthpool at its idle timeout.
    let end = closes.recv_timeout(Duration::from_secs(10)).expect("the idle connection was closed");
    assert_eq!(end, Ok(()), "the session ended without close_notify");
    assert_eq!(up.seen(1).len(), 1);
}

#[test]
fn shutdown_ends_idle_tls_connections_with_close_notify() {
    let ca = Ca::new("test ca");
    let (up, closes) = upstream_reporting_its_close(&ca.leaf(&["localhost"]));
    let dir = scratch_dir();
    let extra = format!(r#"{},"idleTimeoutMs":60000"#, with_ca(&ca, &dir));
    let mut s = server(&pool(&format!("https://localhost:{}", up.addr.port()), &dir, &extra));
    assert_eq!(get_through(&s).status, 200);
    assert!(closes.recv_timeout(Duration::from_millis(300)).is_err(), "the connection is kept idle");
    s.signal("TERM");
    let end = closes.recv_timeout(Duration::from_secs(15)).expect("shutdown closed the idle connection");
    assert_eq!(end, Ok(()), "the session ended without close_notify");
    assert!(s.child.wait().unwrap().success());
}
