//! Name resolution over the wire: nthpool's resolver thread asks a mock DNS
//! server on loopback (`resolver.nameservers`), and proxied requests to
//! upstreams named in it show what the event loop makes of the answers: a
//! name that does not exist, a slow lookup, several addresses, a changed
//! answer once its TTL is over.

mod common;
#[path = "common/dns.rs"]
mod dns;
mod tls_support;
#[path = "common/upstream.rs"]
mod upstream;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dns::{MockDns, Zone};
use tls_support::{Ca, TlsServer, TlsServerStream};
use upstream::{exchange, ok, proxied, MockUpstream, HOST};

/// A server whose pool `p` proxies `Host: p.proxy.test` to `url`, with its
/// names looked up by `dns`; `upstream_extra` and `resolver_extra` are added
/// to those sections. Logged at `info`.
fn server(dns: &MockDns, url: &str, upstream_extra: &str, resolver_extra: &str) -> TestServer {
    let pool = format!(
        r#""concurrency":4,"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
        "upstream":{{"url":"{url}","hosts":["{HOST}"]{upstream_extra}}}"#
    );
    TestServer::start_logged(&config(&pool, &dns.resolver_config(resolver_extra)), "info")
}

fn zone(a: &[Ipv4Addr], ttl_s: u32) -> Zone {
    Zone { a: a.to_vec(), ttl_s, ..Zone::default() }
}

fn get(s: &TestServer) -> Response {
    exchange(s, &proxied("GET", "/v1/models", "", ""))
}

/// Waits (up to 10 s) until `dns` has been asked for `name` `n` times.
fn wait_for_queries(dns: &MockDns, name: &str, n: usize) {
    let start = Instant::now();
    while dns.a_queries(name).len() < n {
        assert!(start.elapsed() < Duration::from_secs(10), "{name} was asked for fewer than {n} times in 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_name_that_does_not_exist_is_a_502_saying_so() {
    let dns = MockDns::start();
    let s = server(&dns, "http://nowhere.resolve.test:9", "", "");
    let r = get(&s);
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(r.error_code(), "bad_gateway");
    let message = r.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("does not resolve"), "{message}");
    assert_eq!(dns.a_queries("nowhere.resolve.test").len(), 1, "the name was asked for once");
    // The log names the host and the server's answer.
    let log = s.log();
    assert!(log.contains("nowhere.resolve.test does not resolve") && log.contains("NXDOMAIN"), "{log}");
    // The slot came back: the pool is not left short by the failure.
    let slot = s.acquire("", "").slot();
    assert_eq!(s.release(&slot, "").status, 200);
    // A connection that could not be begun was attempted and failed to
    // open: it counts in both, once (never more errors than attempts).
    let metrics = admin_get(s.admin.expect("admin listener"), "/metrics");
    assert!(metrics.contains("\nnthpool_proxy_upstream_connects_total 1\n"), "{metrics}");
    assert!(metrics.contains("\nnthpool_proxy_upstream_connection_errors_total 1\n"), "{metrics}");
}

#[test]
fn the_loop_keeps_answering_while_a_lookup_is_slow() {
    let dns = MockDns::start();
    let up = MockUpstream::start(|_| ok("slow but there", ""));
    dns.set("slow.resolve.test", Zone { delay: Duration::from_secs(2), ..zone(&[Ipv4Addr::LOCALHOST], 60) });
    let s = server(&dns, &format!("http://slow.resolve.test:{}", up.addr.port()), "", r#","timeoutMs":8000"#);
    let admin = s.admin.expect("admin listener");
    let started = Instant::now();
    let client = {
        let mut c = s.connect();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(&proxied("GET", "/v1/models", "", "")).unwrap();
        std::thread::spawn(move || (upstream::read_any(&mut c), started.elapsed()))
    };
    // The lookup is under way from here on: the name server holds its answer for 2 s.
    wait_for_queries(&dns, "slow.resolve.test", 1);
    let asked = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut rounds = 0;
    while asked.elapsed() < Duration::from_millis(1_500) {
        let t = Instant::now();
        assert!(admin_get(admin, "/healthz").starts_with("HTTP/1.1 200 "));
        let slot = s.acquire("", "").slot();
        assert_eq!(s.release(&slot, "").status, 200);
        slowest = slowest.max(t.elapsed());
        rounds += 1;
    }
    // A loop blocked by the lookup would have held the first round for
    // nearly 2 s; on a loaded machine a round still takes milliseconds.
    println!("{rounds} rounds of /healthz + acquire + release during the lookup, the slowest {slowest:?}");
    assert!(slowest < Duration::from_millis(1_000), "a round took {slowest:?} while the lookup was slow");
    assert!(rounds >= 3, "only {rounds} rounds in 1.5 s");
    let (r, took) = client.join().unwrap();
    let r = r.expect("the proxied request is answered");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"slow but there");
    assert!(took >= Duration::from_millis(1_900), "the proxied request waited for the lookup: {took:?}");
}

#[test]
fn a_connect_goes_on_to_the_next_address_of_the_name() {
    let dns = MockDns::start();
    let up = MockUpstream::start(|_| ok("second address", ""));
    // 127.0.0.2 on the upstream's port: nothing listens there.
    dns.set("two.resolve.test", zone(&[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::LOCALHOST], 60));
    let s = server(&dns, &format!("http://two.resolve.test:{}", up.addr.port()), "", "");
    let r = get(&s);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"second address");
    assert_eq!(up.seen().len(), 1);
    // The first address was tried and refused the connection.
    let metrics = admin_get(s.admin.expect("admin listener"), "/metrics");
    assert!(metrics.contains("\nnthpool_proxy_upstream_connection_errors_total 1\n"), "{metrics}");
    assert_eq!(up.seen()[0].header("host").as_deref(), Some(format!("two.resolve.test:{}", up.addr.port()).as_str()));
}

/// A TLS upstream for `tls.resolve.test` that answers every request
/// `200 second address`.
fn second_address(ca: &Ca) -> TlsServer {
    TlsServer::start(
        &ca.leaf(&["tls.resolve.test"]),
        Arc::new(|stream: &mut TlsServerStream| {
            let (mut head, mut byte) = (Vec::new(), [0u8; 1]);
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\nsecond address");
        }),
    )
}

/// A peer on `ip:port` that takes one connection and never says a word,
/// holding it until told to stop (or for 30 s); the handle says whether a
/// connection came before then.
fn silent_peer(ip: Ipv4Addr, port: u16) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let listener = std::net::TcpListener::bind((ip, port)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let held = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(30);
        let mut conn = None;
        while Instant::now() < until {
            if conn.is_none() {
                conn = listener.accept().ok();
            }
            match stopped.recv_timeout(Duration::from_millis(10)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => break,
            }
        }
        conn.is_some()
    });
    (stop, held)
}

#[test]
fn a_tls_handshake_cut_off_goes_on_to_the_next_address_of_the_name() {
    let ca = Ca::new("resolve test ca");
    let good = second_address(&ca);
    let port = good.addr.port();
    // 127.0.0.2 on the same port takes the connection and closes it at
    // once: the handshake is cut off before anything of the request went out.
    let cutter = std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2), port)).unwrap();
    let cut = std::thread::spawn(move || cutter.accept().map(drop).is_ok());
    let dns = MockDns::start();
    dns.set("tls.resolve.test", zone(&[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::LOCALHOST], 60));
    let dir = scratch_dir();
    let ca_file = format!(r#","caFile":"{}""#, ca.write_pem(&dir).display());
    let s = server(&dns, &format!("https://tls.resolve.test:{port}"), &ca_file, "");
    let r = get(&s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"second address"[..]), "{r:?}");
    assert!(cut.join().unwrap(), "the first address was tried");
}

#[test]
fn a_tls_handshake_that_stalls_goes_on_to_the_next_address_of_the_name() {
    let ca = Ca::new("resolve test ca");
    let good = second_address(&ca);
    let port = good.addr.port();
    // 127.0.0.2 on the same port takes the connection and stays silent:
    // the handshake stalls until its `tlsHandshakeTimeoutMs`.
    let (done, held) = silent_peer(Ipv4Addr::new(127, 0, 0, 2), port);
    let dns = MockDns::start();
    dns.set("tls.resolve.test", zone(&[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::LOCALHOST], 60));
    let dir = scratch_dir();
    // `timeoutMs` far beyond the handshake's, so a loaded machine cannot
    // make the request's own deadline the one that ends the wait.
    let extra =
        format!(r#","caFile":"{}","tlsHandshakeTimeoutMs":250,"timeoutMs":20000"#, ca.write_pem(&dir).display());
    let s = server(&dns, &format!("https://tls.resolve.test:{port}"), &extra, "");
    let started = Instant::now();
    let r = get(&s);
    let took = started.elapsed();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"second address"[..]), "{r:?}");
    assert!(took >= Duration::from_millis(240), "the first address's handshake had its 250 ms: {took:?}");
    let _ = done.send(());
    assert!(held.join().unwrap(), "the first address was tried");
    assert!(s.log().contains("did not finish its TLS handshake in time; trying its next address"), "{}", s.log());
}

#[test]
fn a_tls_handshake_that_stalls_on_every_address_is_a_502_or_at_timeout_ms_a_504() {
    let ca = Ca::new("resolve test ca");
    let first = std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2), 0)).unwrap();
    let port = first.local_addr().unwrap().port();
    drop(first);
    let dns = MockDns::start();
    dns.set("tls.resolve.test", zone(&[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)], 60));
    let dir = scratch_dir();
    let ca_file = ca.write_pem(&dir);
    let url = format!("https://tls.resolve.test:{port}");
    // Each address has its own 250 ms; the last one's end is the 502 that
    // names the handshake.
    let peers = [silent_peer(Ipv4Addr::new(127, 0, 0, 2), port), silent_peer(Ipv4Addr::new(127, 0, 0, 3), port)];
    let extra = format!(r#","caFile":"{}","tlsHandshakeTimeoutMs":250,"timeoutMs":20000"#, ca_file.display());
    let s = server(&dns, &url, &extra, "");
    let started = Instant::now();
    let r = get(&s);
    let took = started.elapsed();
    assert_eq!((r.status, r.error_code().as_str()), (502, "bad_gateway"), "{r:?}");
    assert_eq!(
        r.json()["message"],
        "The TLS handshake with the upstream did not finish within its tlsHandshakeTimeoutMs, 250 ms."
    );
    assert!(took >= Duration::from_millis(490), "each address had its 250 ms: {took:?}");
    for (done, held) in peers {
        let _ = done.send(());
        assert!(held.join().unwrap(), "every address was tried");
    }
    upstream::slot_comes_back(&s);
    drop(s);
    // The request's own deadline comes before the second handshake's: that
    // wait ends at `timeoutMs`, a 504 as for any request out of time. The
    // first handshake ends 300 ms before it, slack for a loaded machine.
    let peers = [silent_peer(Ipv4Addr::new(127, 0, 0, 2), port), silent_peer(Ipv4Addr::new(127, 0, 0, 3), port)];
    let extra = format!(r#","caFile":"{}","tlsHandshakeTimeoutMs":400,"timeoutMs":700"#, ca_file.display());
    let s = server(&dns, &url, &extra, "");
    let r = get(&s);
    assert_eq!((r.status, r.error_code().as_str()), (504, "upstream_timeout"), "{r:?}");
    for (done, held) in peers {
        let _ = done.send(());
        assert!(held.join().unwrap(), "every address was tried");
    }
    upstream::slot_comes_back(&s);
}

#[test]
fn a_changed_answer_is_picked_up_after_its_ttl() {
    let dns = MockDns::start();
    let first = MockUpstream::start(|_| ok("first", ""));
    let port = first.addr.port();
    let second = MockUpstream::start_on(SocketAddr::from(([127, 0, 0, 3], port)), |_| ok("second", ""));
    dns.set("moving.resolve.test", zone(&[Ipv4Addr::LOCALHOST], 2));
    // No idle connections: each request connects to what the name is now.
    let s = server(&dns, &format!("http://moving.resolve.test:{port}"), r#","idleConnections":0"#, "");
    assert_eq!(get(&s).body, b"first");
    dns.set("moving.resolve.test", zone(&[Ipv4Addr::new(127, 0, 0, 3)], 2));
    // Within the 2-s TTL the cached answer is used: no new lookup.
    assert_eq!(get(&s).body, b"first");
    assert_eq!(dns.a_queries("moving.resolve.test").len(), 1);
    // After it, requests go on with the old address while a refresh runs
    // in the background, then reach the new one.
    std::thread::sleep(Duration::from_millis(2_200));
    let start = Instant::now();
    loop {
        let r = get(&s);
        assert_eq!(r.status, 200, "every request is served across the refresh: {r:?}");
        if r.body == b"second" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the new address was never used");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(dns.a_queries("moving.resolve.test").len() >= 2);
    assert!(!second.seen().is_empty());
}

#[test]
fn a_reload_switches_to_the_new_name_servers() {
    let old = MockDns::start();
    let new = MockDns::start();
    let up = MockUpstream::start(|_| ok("through the new server", ""));
    new.set("switch.resolve.test", zone(&[Ipv4Addr::LOCALHOST], 60));
    let url = format!("http://switch.resolve.test:{}", up.addr.port());
    // The old server knows no such name; a short negative TTL.
    let s = server(&old, &url, "", r#","negativeTtlMs":100"#);
    assert_eq!(get(&s).status, 502);
    let text = std::fs::read_to_string(&s.config_path).unwrap();
    let switched = text.replace(&old.addr.to_string(), &new.addr.to_string());
    assert_ne!(text, switched);
    std::fs::write(&s.config_path, switched).unwrap();
    s.signal("HUP");
    let start = Instant::now();
    while !s.log().contains("configuration reloaded") {
        assert!(start.elapsed() < Duration::from_secs(10), "no reload in 10 s: {}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let r = get(&s);
    assert_eq!((r.status, &r.body[..]), (200, &b"through the new server"[..]), "{r:?}");
    assert_eq!(old.a_queries("switch.resolve.test").len(), 1);
    assert_eq!(new.a_queries("switch.resolve.test").len(), 1);
}

/// A request granted while its upstream's name is looked up has written
/// nothing yet: a reload that removes its pool, takes the pool's `upstream`
/// away or changes its `setHeaders` meanwhile answers it `503` when the
/// name comes, and the upstream never sees it (the managed key of a pool
/// removed, as of one changed, is not sent). Its slot is given back.
#[test]
fn a_request_waiting_for_its_upstreams_name_is_not_sent_after_a_reload_ends_or_changes_it() {
    let up = MockUpstream::start(|_| ok("up", ""));
    let dns = MockDns::start();
    dns.set("slow.reload.test", Zone { delay: Duration::from_millis(1_500), ..zone(&[Ipv4Addr::LOCALHOST], 0) });
    let url = format!("http://slow.reload.test:{}", up.addr.port());
    let pool = |secret: &str| {
        format!(
            r#""concurrency":4,"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
            "upstream":{{"url":"{url}","hosts":["{HOST}"],"setHeaders":{{"Authorization":"Bearer {secret}"}}}}"#
        )
    };
    let resolver = dns.resolver_config(r#","timeoutMs":5000"#);
    let removed = format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,{resolver},"pools":{{"other":{{"keys":["other-key"]}}}}}}"#
    );
    for (after, json, message) in [
        ("the pool removed", removed, "ended this pool's proxying"),
        ("no upstream", config("", &resolver), "ended this pool's proxying"),
        ("new setHeaders", config(&pool("two"), &resolver), "changed this pool's upstream"),
    ] {
        let s = TestServer::start(&config(&pool("one"), &resolver));
        let mut c = s.connect();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(&proxied("GET", "/v1/models", "", "")).unwrap();
        eventually("the request holds its slot", || s.metric(r#"nthpool_slots_held{pool="p"}"#) == Some(1.0));
        s.reload(&json);
        let r = upstream::read_any(&mut c).expect("an answer when the name comes");
        assert_eq!((r.status, r.error_code().as_str()), (503, "unavailable"), "{after}: {r:?}");
        assert!(r.json()["message"].as_str().unwrap().contains(message), "{after}: {r:?}");
        assert!(up.seen().is_empty(), "{after}: the upstream got {:?}", up.seen());
        eventually("the slot is given back", || {
            s.metric(r#"nthpool_slots_held{pool="p"}"#).is_none_or(|held| held == 0.0)
        });
    }
}

#[test]
fn a_lookup_that_outlasts_the_upstream_timeout_is_answered_504() {
    // The name server holds its answer past `timeoutMs`: the client is told
    // the upstream timed out, not left with a closed connection.
    let dns = MockDns::start();
    dns.set("late.resolve.test", Zone { delay: Duration::from_millis(1_500), ..zone(&[Ipv4Addr::LOCALHOST], 60) });
    let s = server(&dns, "http://late.resolve.test:9", r#","timeoutMs":300"#, r#","timeoutMs":8000"#);
    let mut c = s.connect();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&proxied("GET", "/v1/models", "", "")).unwrap();
    let r = upstream::read_any(&mut c).expect("an answer before the connection closes");
    assert_eq!((r.status, r.error_code().as_str()), (504, "upstream_timeout"), "{r:?}");
    upstream::slot_comes_back(&s);
    // The same when the request waited in the queue first and its grant starts the lookup.
    let s = TestServer::start_logged(
        &config(
            r#""concurrency":1,"adaptive":false,"queue":{"size":4,"timeoutMs":5000},
            "upstream":{"url":"http://late2.resolve.test:9","hosts":["p.proxy.test"],"timeoutMs":300}"#,
            &dns.resolver_config(r#","timeoutMs":8000"#),
        ),
        "info",
    );
    dns.set("late2.resolve.test", Zone { delay: Duration::from_millis(1_500), ..zone(&[Ipv4Addr::LOCALHOST], 60) });
    let held = s.acquire("", "");
    assert_eq!(held.status, 200, "{held:?}");
    let mut c = s.connect();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&proxied("GET", "/v1/models", "", "")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.release(&held.slot(), "").status, 200);
    let started = Instant::now();
    let r = upstream::read_any(&mut c).expect("an answer before the connection closes");
    assert_eq!((r.status, r.error_code().as_str()), (504, "upstream_timeout"), "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(1_400), "answered at the lookup's end, not at timeoutMs");
    upstream::slot_comes_back(&s);
}

/// One upstream failing the same way for every request is not one warning
/// per request: the same warning is written at most about once a second,
/// the next one counting those left out.
#[test]
fn an_upstream_failing_every_request_is_warned_of_about_once_a_second() {
    let dns = MockDns::start();
    let s = server(&dns, "http://nowhere.resolve.test:9", "", "");
    let warned = |log: &str| log.lines().filter(|l| l.contains("upstream nowhere.resolve.test")).count();
    let started = Instant::now();
    for _ in 0..40 {
        assert_eq!(get(&s).status, 502);
    }
    let seconds = started.elapsed().as_secs() as usize;
    let log = s.log();
    assert!(warned(&log) >= 1, "{log}");
    assert!(warned(&log) <= seconds + 2, "{} warnings in {seconds} s: {log}", warned(&log));
    // A second later the next one is written, with how many were not (the
    // one at a second's turn among the 40 may have said it already).
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(get(&s).status, 502);
    let log = s.log();
    let mut later = log.lines().filter(|l| l.contains("upstream nowhere.resolve.test")).skip(1);
    assert!(later.any(|l| l.contains("more since the last such warning")), "{log}");
}

/// The warnings of one `upstream …` kind in `log`: how many were written,
/// and how many more they say were left out.
fn warned_and_left_out(log: &str, upstream: &str) -> (u64, u64) {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&format!("upstream {upstream}:"))).collect();
    let left_out = lines
        .iter()
        .filter_map(|l| l.split(" (").last()?.strip_suffix(" more since the last such warning)")?.parse::<u64>().ok())
        .sum();
    let counted_only = lines.iter().filter(|l| l.contains("have stopped")).count() as u64;
    (lines.len() as u64 - counted_only, left_out)
}

/// A burst of failures that ends is counted whole in the log: the
/// warnings left out after the last one written are counted in a line of
/// their own a second after the last of them, with no request after it,
/// and at a stop that comes first.
#[test]
fn the_warnings_left_out_at_the_end_of_a_burst_are_counted() {
    let dns = MockDns::start();
    for stop in [false, true] {
        let mut s = server(&dns, "http://gone.resolve.test:9", "", "");
        for _ in 0..20 {
            assert_eq!(get(&s).status, 502);
        }
        if stop {
            s.signal("TERM");
            let status = exit_within(&mut s.child, Duration::from_secs(10)).expect("the server exits after SIGTERM");
            assert!(status.success(), "{status:?}");
        }
        eventually("every failure written or counted", || {
            let (written, left_out) = warned_and_left_out(&s.log(), "gone.resolve.test");
            written + left_out == 20
        });
        let log = s.log();
        assert!(log.contains("`lookup` warnings"), "{log}");
        let (written, _) = warned_and_left_out(&log, "gone.resolve.test");
        assert!(written <= 3, "{log}");
    }
}
