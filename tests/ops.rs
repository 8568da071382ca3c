//! Operating the server (SPEC §2, §9): the admin listener's health and
//! metrics, SIGHUP reloads, graceful SIGTERM, and start-up errors as an
//! operator sees them — one line on stderr and a non-zero exit.

mod common;
mod tls_support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitStatus;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Long enough for anything "eventually" on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(15);

fn get(addr: SocketAddr, path: &str) -> Response {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    read_response(&mut c).expect("an answer")
}

fn admin(s: &TestServer) -> SocketAddr {
    s.admin.expect("the harness enables the admin listener")
}

// ---------------------------------------------------------------- metrics text

/// One sample: metric name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed Prometheus text exposition (format 0.0.4), checked as it is read.
#[derive(Debug, Default)]
struct Exposition {
    help: BTreeSet<String>,
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut e = Exposition::default();
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or_else(|| panic!("HELP without text: {line}"));
                assert!(!help.trim().is_empty(), "empty HELP: {line}");
                assert!(e.help.insert(name.to_string()), "HELP twice for {name}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("TYPE without kind: {line}"));
                assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line}");
                assert!(e.types.insert(name.to_string(), kind.to_string()).is_none(), "TYPE twice for {name}");
                continue;
            }
            assert!(!line.starts_with('#'), "unknown comment line: {line}");
            e.samples.push(parse_sample(line));
        }
        e
    }

    /// The family a sample belongs to: histograms expose `_bucket`, `_sum`, `_count`.
    fn family_of(&self, name: &str) -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if self.types.get(base).is_some_and(|k| k == "histogram" || k == "summary") {
                    return base.to_string();
                }
            }
        }
        name.to_string()
    }

    /// The value of the sample with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let found: Vec<&Sample> = self.samples.iter().filter(|s| s.name == name && s.labels == want).collect();
        assert_eq!(found.len(), 1, "expected one sample {name}{want:?}, found {found:?}");
        found[0].value
    }

    fn pool(&self, name: &str, pool: &str) -> f64 {
        self.value(name, &[("pool", pool)])
    }
}

fn parse_sample(line: &str) -> Sample {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value: {line}"));
    let name = &line[..name_end];
    assert!(
        !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
            && !name.as_bytes()[0].is_ascii_digit(),
        "bad metric name in {line}"
    );
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let mut key = String::new();
        loop {
            let (i, c) = chars.next().unwrap_or_else(|| panic!("unterminated labels: {line}"));
            match c {
                '}' => {
                    rest = &inner[i + 1..];
                    break;
                }
                ',' if key.is_empty() => {}
                '=' => {
                    assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "unquoted label value: {line}");
                    let mut value = String::new();
                    loop {
                        match chars.next().unwrap_or_else(|| panic!("unterminated label value: {line}")).1 {
                            '"' => break,
                            '\\' => match chars.next().unwrap().1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    assert!(labels.insert(std::mem::take(&mut key), value).is_none(), "repeated label: {line}");
                }
                c => key.push(c),
            }
        }
    }
    let value = rest.trim();
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
    };
    Sample { name: name.to_string(), labels, value }
}

fn metrics(s: &TestServer) -> Exposition {
    let r = get(admin(s), "/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap_or_default().starts_with("text/plain"), "{r:?}");
    Exposition::parse(std::str::from_utf8(&r.body).unwrap())
}

/// Scrapes until `done` holds, so nothing depends on how fast the server is.
fn eventually(s: &TestServer, what: &str, done: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let m = metrics(s);
        if done(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "never saw {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

fn reloads(m: &Exposition) -> (f64, f64) {
    (m.value("nthpool_config_reloads_total", &[]), m.value("nthpool_config_reload_failures_total", &[]))
}

/// Rewrites the configuration, sends SIGHUP and waits until the server has
/// handled it (applied or refused); returns (applied, refused) totals.
fn reload_with(s: &TestServer, config_json: &str) -> (f64, f64) {
    let (ok, failed) = reloads(&metrics(s));
    std::fs::write(&s.config_path, config_json).unwrap();
    s.signal("HUP");
    let m = eventually(s, "the reload handled", |m| {
        let (o, f) = reloads(m);
        o + f > ok + failed
    });
    reloads(&m)
}

// ---------------------------------------------------------------- admin routes

#[test]
fn health_and_metrics_live_only_on_the_admin_port() {
    let s = TestServer::start(&config("", ""));
    let r = get(admin(&s), "/healthz");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"status": "ok"}));
    assert_eq!(get(admin(&s), "/metrics").status, 200);

    let mut c = TcpStream::connect(admin(&s)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    let r = read_response(&mut c).unwrap();
    assert_eq!(r.status, 404, "no lock routes on the admin port: {r:?}");
    assert_eq!(r.error_code(), "not_found");
    assert_eq!(get(admin(&s), "/pools/p/lock/acquire").status, 404);

    for path in ["/metrics", "/healthz"] {
        let r = get(s.addr, path);
        assert_eq!(r.status, 404, "{path} on the public port: {r:?}");
        assert_eq!(r.error_code(), "not_found");
    }
    // The lock API is unaffected by all this.
    assert_eq!(s.acquire("", "").status, 200);
}

#[test]
fn every_metric_family_has_help_and_type() {
    let s = TestServer::start(&config(r#""rpm":600"#, ""));
    s.acquire("", "").slot();
    let m = metrics(&s);
    assert!(!m.samples.is_empty());
    for sample in &m.samples {
        let family = m.family_of(&sample.name);
        assert!(m.types.contains_key(&family), "no # TYPE for {}", sample.name);
        assert!(m.help.contains(&family), "no # HELP for {}", sample.name);
    }
    for name in m.types.keys() {
        assert!(m.help.contains(name), "# TYPE without # HELP: {name}");
    }
    for name in &m.help {
        assert!(m.types.contains_key(name), "# HELP without # TYPE: {name}");
    }
    for (name, kind) in &m.types {
        if kind == "counter" {
            assert!(name.ends_with("_total"), "counter {name} should end in _total");
        }
    }
}

#[test]
fn metrics_count_grants_denials_reclaims_renewals_and_releases() {
    // A term long enough that the renewed slot cannot lapse between requests
    // on a slow machine, short enough that the unrenewed one is reclaimed soon.
    let s = TestServer::start(&config(r#""concurrency":2,"termMs":3000,"renewIntervalMs":1000,"adaptive":false"#, ""));
    let a = s.acquire("", "").slot();
    assert_eq!(s.renew(&a).status, 200);
    let _b = s.acquire("", "").slot();
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("concurrency"));
    assert_eq!(s.renew("not-a-slot").status, 404);
    assert_eq!(s.release(&a, r#"{"status":200}"#).json()["released"], true);
    assert_eq!(s.release(&a, "").json()["released"], false);

    let m = eventually(&s, "the unrenewed slot reclaimed", |m| {
        m.value("nthpool_reclaims_total", &[("pool", "p"), ("cause", "term")]) >= 1.0
    });
    assert_eq!(m.pool("nthpool_grants_total", "p"), 2.0);
    assert_eq!(m.value("nthpool_denials_total", &[("pool", "p"), ("reason", "concurrency")]), 1.0);
    for reason in ["rate", "cooldown", "queue_full"] {
        assert_eq!(m.value("nthpool_denials_total", &[("pool", "p"), ("reason", reason)]), 0.0, "{reason}");
    }
    assert_eq!(m.value("nthpool_reclaims_total", &[("pool", "p"), ("cause", "term")]), 1.0);
    assert_eq!(m.value("nthpool_reclaims_total", &[("pool", "p"), ("cause", "cap")]), 0.0);
    assert_eq!(m.pool("nthpool_slots_held", "p"), 0.0);
    assert_eq!(m.pool("nthpool_waiters", "p"), 0.0);
    assert_eq!(m.pool("nthpool_limit", "p"), 2.0);
    assert_eq!(m.pool("nthpool_effective_limit", "p"), 2.0);
    assert_eq!(m.pool("nthpool_acquire_server_time_us_count", "p"), 3.0, "two grants and one 429");
    assert_eq!(m.value("nthpool_acquire_server_time_us_bucket", &[("pool", "p"), ("le", "+Inf")]), 3.0);
    let mut previous = 0.0;
    for sample in m.samples.iter().filter(|x| x.name == "nthpool_acquire_server_time_us_bucket") {
        if sample.labels["pool"] == "p" {
            assert!(sample.value >= previous, "buckets are cumulative");
            previous = sample.value;
        }
    }
    assert_eq!(m.value("nthpool_renewals_total", &[("pool", "p"), ("outcome", "renewed")]), 1.0);
    assert_eq!(m.value("nthpool_renewals_total", &[("pool", "p"), ("outcome", "not_found")]), 1.0);
    assert_eq!(m.value("nthpool_renewals_total", &[("pool", "p"), ("outcome", "capped")]), 0.0);
    assert_eq!(m.value("nthpool_releases_total", &[("pool", "p"), ("outcome", "released")]), 1.0);
    assert_eq!(m.value("nthpool_releases_total", &[("pool", "p"), ("outcome", "already_gone")]), 1.0);
    // The other pool saw nothing.
    assert_eq!(m.pool("nthpool_grants_total", "other"), 0.0);
    assert_eq!(m.pool("nthpool_acquire_server_time_us_count", "other"), 0.0);
}

#[test]
fn metrics_count_queue_deadlines_departures_and_the_request_cap() {
    // A term as long as the request cap: the lease stands at its request
    // deadline from the grant, so a renew is `409 capped` and the reclaim is the cap's.
    let s = TestServer::start(&config(
        r#""concurrency":1,"queue":{"size":1,"timeoutMs":5000},"termMs":3000,"renewIntervalMs":1000,
        "requestTimeoutMs":3000,"adaptive":false"#,
        "",
    ));
    let holder = s.acquire("", "").slot();
    assert_eq!(s.renew(&holder).status, 409);
    // A wait that runs out.
    assert_eq!(s.acquire("", r#"{"waitMs":200}"#).status, 504);
    // A full queue; its waiter half-closes and is answered 504 for it.
    let mut half = queue_waiter(&s, 1.0);
    let r = s.acquire("", r#"{"waitMs":100}"#);
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("queue_full")));
    half.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_response(&mut half).unwrap().status, 504);
    // A waiter that closes altogether.
    drop(queue_waiter(&s, 1.0));
    let m = eventually(&s, "the capped lease reclaimed", |m| {
        m.value("nthpool_reclaims_total", &[("pool", "p"), ("cause", "cap")]) == 1.0
    });
    assert_eq!(m.pool("nthpool_grants_total", "p"), 1.0);
    assert_eq!(m.pool("nthpool_queue_timeouts_total", "p"), 1.0, "only the wait that ran out");
    assert_eq!(m.pool("nthpool_waiters_gone_total", "p"), 2.0, "the half-closed and the closed waiter");
    assert_eq!(m.value("nthpool_denials_total", &[("pool", "p"), ("reason", "queue_full")]), 1.0);
    assert_eq!(m.value("nthpool_denials_total", &[("pool", "p"), ("reason", "concurrency")]), 0.0, "no 429 for it");
    assert_eq!(m.value("nthpool_renewals_total", &[("pool", "p"), ("outcome", "capped")]), 1.0);
    assert_eq!(m.value("nthpool_renewals_total", &[("pool", "p"), ("outcome", "renewed")]), 0.0);
    assert_eq!(m.value("nthpool_reclaims_total", &[("pool", "p"), ("cause", "term")]), 0.0);
    assert_eq!(m.value("nthpool_rejections_total", &[("pool", "p"), ("code", "409")]), 1.0);
    assert_eq!(m.value("nthpool_rejections_total", &[("pool", "p"), ("code", "429")]), 1.0);
    assert_eq!(m.value("nthpool_rejections_total", &[("pool", "p"), ("code", "504")]), 3.0);
    assert_eq!(m.pool("nthpool_slots_held", "p"), 0.0);
    assert_eq!(m.pool("nthpool_waiters", "p"), 0.0);
    // Every answered attempt is timed: the grant, the 429 and three 504s (a
    // closed client's FIN reads as a half-close, so it is answered too).
    assert_eq!(m.pool("nthpool_acquire_server_time_us_count", "p"), 5.0);
}

#[test]
fn metrics_count_open_connections() {
    let s = TestServer::start(&config("", ""));
    let idle: Vec<TcpStream> = (0..2).map(|_| s.connect()).collect();
    // Two idle public connections plus the scrape's own.
    eventually(&s, "3 open connections", |m| m.value("nthpool_connections_open", &[]) == 3.0);
    drop(idle);
    eventually(&s, "only the scrape's connection", |m| m.value("nthpool_connections_open", &[]) == 1.0);
}

// ---------------------------------------------------------------- SIGHUP

#[test]
fn sighup_raises_a_limit_and_keeps_held_slots() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let first = s.acquire("", "").slot();
    assert_eq!(s.acquire("", "").status, 429);
    assert_eq!(reload_with(&s, &config(r#""concurrency":3"#, "")), (1.0, 0.0));
    let r = s.acquire("", "");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-limit"), 3);
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 1, "the slot held before the reload still counts");
    assert_eq!(s.acquire("", "").status, 200);
    assert_eq!(s.acquire("", "").status, 429, "three held under a limit of three");
    assert_eq!(s.renew(&first).status, 200, "the slot held across the reload renews");
    assert_eq!(s.release(&first, "").json()["released"], true);
}

#[test]
fn sighup_raise_grants_a_queued_waiter_at_once() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":60000}"#, ""));
    s.acquire("", "").slot();
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":60000}"#)).unwrap();
    eventually(&s, "the waiter queued", |m| m.pool("nthpool_waiters", "p") == 1.0);
    reload_with(&s, &config(r#""concurrency":2,"queue":{"size":10,"timeoutMs":60000}"#, ""));
    // Long before the 60 s wait ends (the harness read timeout is 10 s).
    let r = read_response(&mut waiter).expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn sighup_that_shortens_the_term_leaves_held_leases_their_own() {
    // A holder renews on the interval its grant named; a shorter term from a
    // reload applies to new grants only, or its lease would lapse between renewals.
    let s = TestServer::start(&config(r#""termMs":10000,"renewIntervalMs":1000"#, ""));
    let held = s.acquire("", "");
    let granted_until = held.json()["leaseDeadline"].as_u64().unwrap();
    let slot = held.slot();
    assert_eq!(reload_with(&s, &config(r#""termMs":100,"renewIntervalMs":50"#, "")), (1.0, 0.0));
    let r = s.renew(&slot);
    assert_eq!(r.status, 200, "{r:?}");
    let renewed_until = r.json()["leaseDeadline"].as_u64().unwrap();
    assert!(renewed_until >= granted_until, "a renewal shortened the lease: {renewed_until} < {granted_until}");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(s.renew(&slot).status, 200, "three new terms later the lease still stands");
    let fresh = s.acquire("", "").json();
    assert_eq!((fresh["termMs"].as_u64(), fresh["renewIntervalMs"].as_u64()), (Some(100), Some(50)));
    assert_eq!(s.release(&slot, "").json()["released"], true);
}

#[test]
fn sighup_adds_a_pool_and_retires_a_removed_one() {
    let s = TestServer::start(&config("", ""));
    let kept = s.request(&post("/pools/other/lock/acquire", "other-key", "", "")).slot();
    let fresh = || s.request(&post("/pools/fresh/lock/acquire", "fresh-key", "", ""));
    assert_eq!(fresh().status, 401, "unknown before the reload");
    let without_other = format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,
        "pools":{{"p":{{"keys":["{KEY}"]}},"fresh":{{"keys":["fresh-key"]}}}}}}"#
    );
    assert_eq!(reload_with(&s, &without_other), (1.0, 0.0));
    assert_eq!(fresh().status, 200, "the new pool grants");
    let r = s.request(&post("/pools/other/lock/acquire", "other-key", "", ""));
    assert_eq!(r.status, 401, "a removed pool grants nothing: {r:?}");
    assert_eq!(r.error_code(), "unauthorized");
    let m = metrics(&s);
    assert_eq!((m.pool("nthpool_retired", "other"), m.pool("nthpool_slots_held", "other")), (1.0, 1.0), "draining");
    assert_eq!(m.pool("nthpool_retired", "fresh"), 0.0);
    let r = s.request(&post(&format!("/pools/other/lock/{kept}/release"), "other-key", "", ""));
    assert_eq!(r.status, 200, "its held slot can still be released: {r:?}");
    assert_eq!(r.json()["released"], true);
    // Drained, it is shown no more: no series in the metrics, not on the dashboard.
    let m = metrics(&s);
    assert!(!m.samples.iter().any(|sample| sample.labels.get("pool").is_some_and(|p| p == "other")), "{m:?}");
    let list = s.get_admin("/api/pools").json();
    assert!(list["pools"].as_array().unwrap().iter().all(|p| p["name"] != "other"), "{list}");
    assert_eq!(s.get_admin("/api/pools/other").status, 404);
    assert_eq!(s.acquire("", "").status, 200, "the untouched pool carries on");
}

#[test]
fn answers_about_a_removed_pool_that_drained_are_counted_where_metrics_show_them() {
    let s = TestServer::start(&config("", ""));
    let unauthorized = |m: &Exposition| m.value("nthpool_rejections_total", &[("code", "401")]);
    let before = unauthorized(&metrics(&s));
    let without_other =
        format!(r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"p":{{"keys":["{KEY}"]}}}}}}"#);
    assert_eq!(reload_with(&s, &without_other), (1.0, 0.0));
    for _ in 0..3 {
        let r = s.request(&post("/pools/other/lock/acquire", "other-key", "", ""));
        assert_eq!(r.status, 401, "a removed pool grants nothing: {r:?}");
    }
    let m = metrics(&s);
    assert!(!m.samples.iter().any(|sample| sample.labels.get("pool").is_some_and(|p| p == "other")), "{m:?}");
    assert_eq!(unauthorized(&m), before + 3.0, "the refusals are counted where they can be seen");
}

/// Queues an acquire of pool `p` on a fresh connection and waits until the
/// server counts `depth` waiters, so waiters queue in the order they are made.
fn queue_waiter(s: &TestServer, depth: f64) -> TcpStream {
    let mut c = s.connect();
    c.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":60000}"#)).unwrap();
    eventually(s, "the waiter queued", |m| m.pool("nthpool_waiters", "p") == depth);
    c
}

/// Whether an answer is waiting to be read on `c`, looking for `wait`.
fn has_answer(c: &TcpStream, wait: Duration) -> bool {
    c.set_read_timeout(Some(wait)).unwrap();
    let ready = loop {
        match c.peek(&mut [0u8; 1]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            peeked => break peeked.is_ok(),
        }
    };
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ready
}

#[test]
fn sighup_that_lowers_the_limit_below_held_revokes_nothing() {
    let pool = |n: u32| config(&format!(r#""concurrency":{n},"adaptive":false"#), "");
    let s = TestServer::start(&pool(3));
    let held: Vec<String> = (0..3).map(|_| s.acquire("", "").slot()).collect();
    reload_with(&s, &pool(1));
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("concurrency")), "{r:?}");
    assert_eq!((r.header_u64("x-nthpool-effective-limit"), r.header_u64("x-nthpool-remaining-slots")), (1, 0));
    for slot in &held {
        assert_eq!(s.renew(slot).status, 200, "a held slot is not revoked");
    }
    assert_eq!(s.release(&held[0], "").json()["released"], true);
    assert_eq!(s.release(&held[1], "").json()["released"], true);
    assert_eq!(s.acquire("", "").status, 429, "one held under a limit of one: still full");
    assert_eq!(s.release(&held[2], "").json()["released"], true);
    assert_eq!(s.acquire("", "").status, 200, "granted once held is under the new limit");
    let m = metrics(&s);
    assert_eq!((m.pool("nthpool_slots_held", "p"), m.pool("nthpool_effective_limit", "p")), (1.0, 1.0));
}

#[test]
fn sighup_that_raises_the_limit_grants_waiters_in_their_order() {
    let pool =
        |n: u32| config(&format!(r#""concurrency":{n},"adaptive":false,"queue":{{"size":10,"timeoutMs":60000}}"#), "");
    let s = TestServer::start(&pool(1));
    let held = s.acquire("", "").slot();
    let mut waiters: Vec<TcpStream> = (1..=3).map(|depth| queue_waiter(&s, depth as f64)).collect();
    reload_with(&s, &pool(3));
    for (i, w) in waiters.iter_mut().take(2).enumerate() {
        let r = read_response(w).expect("an answer");
        assert_eq!(r.status, 200, "waiter {i} is granted by the reload: {r:?}");
    }
    assert!(!has_answer(&waiters[2], Duration::from_millis(200)), "the third waits: three held under three");
    assert_eq!(s.release(&held, "").json()["released"], true);
    assert_eq!(read_response(&mut waiters[2]).expect("an answer").status, 200);
}

#[test]
fn sighup_that_shrinks_the_queue_keeps_every_waiter() {
    // Waiters beyond a new, smaller queue.size stay queued with their own
    // deadlines; newcomers are refused until the queue is under the new size.
    let pool = |size: u32| {
        config(&format!(r#""concurrency":1,"adaptive":false,"queue":{{"size":{size},"timeoutMs":60000}}"#), "")
    };
    let s = TestServer::start(&pool(10));
    let mut held = s.acquire("", "").slot();
    let mut waiters: Vec<TcpStream> = (1..=3).map(|depth| queue_waiter(&s, depth as f64)).collect();
    reload_with(&s, &pool(1));
    assert_eq!(metrics(&s).pool("nthpool_waiters", "p"), 3.0, "no waiter is dropped");
    let r = s.acquire("", r#"{"waitMs":60000}"#);
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("queue_full")), "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-queue-depth"), 3);
    for (i, w) in waiters.iter_mut().enumerate() {
        assert_eq!(s.release(&held, "").json()["released"], true);
        let r = read_response(w).expect("an answer");
        assert_eq!(r.status, 200, "waiter {i} is granted in its turn: {r:?}");
        held = r.slot();
    }
    assert_eq!(metrics(&s).pool("nthpool_waiters", "p"), 0.0);
    assert_eq!(s.release(&held, "").json()["released"], true);
    assert_eq!(s.acquire("", r#"{"waitMs":60000}"#).status, 200, "a slot is free");
}

#[test]
fn sighup_that_removes_a_pool_answers_its_waiters_and_lets_its_holders_finish() {
    let both = format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"p":{{"keys":["{KEY}"]}},
        "gone":{{"keys":["gone-key"],"concurrency":1,"queue":{{"size":10,"timeoutMs":60000}}}}}}}}"#
    );
    let s = TestServer::start(&both);
    let gone = |what: &str| post(&format!("/pools/gone/lock/{what}"), "gone-key", "", "");
    let held = s.request(&gone("acquire")).slot();
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/gone/lock/acquire", "gone-key", "", r#"{"waitMs":60000}"#)).unwrap();
    eventually(&s, "the waiter queued", |m| m.pool("nthpool_waiters", "gone") == 1.0);
    let started = Instant::now();
    reload_with(&s, &config("", ""));
    let r = read_response(&mut waiter).expect("the waiter is answered");
    assert!(started.elapsed() < Duration::from_secs(10), "answered at once, not at its deadline");
    assert_eq!((r.status, r.error_code()), (504, "queue_timeout".to_string()), "{r:?}");
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert!(message.contains("removed from the configuration"), "{message}");
    assert_eq!(s.request(&gone(&format!("{held}/renew"))).status, 200, "its holder renews");
    assert_eq!(s.request(&gone(&format!("{held}/release"))).json()["released"], true);
    assert_eq!(s.request(&gone("acquire")).status, 401, "and nobody acquires");
}

#[test]
fn sighup_applies_key_and_access_changes_to_held_slots_at_once() {
    let s = TestServer::start(&config("", ""));
    let slot = s.acquire("", "").slot();
    let with_key = |key: &str, extra: &str| config(extra, "").replace(KEY, key);
    let renew = |key: &str| s.request(&post(&format!("/pools/p/lock/{slot}/renew"), key, "", ""));
    // A key a reload removes is refused at once, for the slots it took too;
    // they are renewed and released with a key the pool has now.
    reload_with(&s, &with_key("rotated-key-01", ""));
    assert_eq!(renew(KEY).status, 401);
    assert_eq!(renew("rotated-key-01").status, 200);
    // A new policy applies to held slots as to new callers.
    reload_with(&s, &with_key("rotated-key-01", r#""access":{"ipAllow":["10.0.0.0/8"]}"#));
    assert_eq!(renew("rotated-key-01").status, 403);
    reload_with(&s, &with_key("rotated-key-01", ""));
    let r = s.request(&post(&format!("/pools/p/lock/{slot}/release"), "rotated-key-01", "", ""));
    assert_eq!(r.json()["released"], true, "{r:?}");
}

#[test]
fn sighup_in_quick_succession_loses_nothing_and_ends_on_the_last_file() {
    let pool = |n: u32, timeout: u32| {
        config(&format!(r#""concurrency":{n},"adaptive":false,"queue":{{"size":10,"timeoutMs":{timeout}}}"#), "")
    };
    let s = TestServer::start(&pool(1, 60000));
    let held = s.acquire("", "").slot();
    let mut waiter = queue_waiter(&s, 1.0);
    // Each file is complete when its signal is sent (written aside, then renamed).
    let staged = s.dir.join("config.json.new");
    for i in 0..20 {
        let last = i == 19;
        std::fs::write(&staged, pool(if last { 2 } else { 1 }, 30000 + i)).unwrap();
        std::fs::rename(&staged, &s.config_path).unwrap();
        s.signal("HUP");
    }
    let r = read_response(&mut waiter).expect("the waiter is granted by the last file's limit");
    assert_eq!((r.status, r.header_u64("x-nthpool-limit")), (200, 2), "{r:?}");
    let m = metrics(&s);
    let (applied, refused) = reloads(&m);
    assert!(applied >= 1.0 && refused == 0.0, "signals may merge, never fail: {applied} applied, {refused} refused");
    assert_eq!(m.pool("nthpool_slots_held", "p"), 2.0);
    assert_eq!(s.renew(&held).status, 200);
}

#[test]
fn sighup_that_gives_a_pool_its_own_listener_logs_that_it_needs_a_restart() {
    // Listeners are bound at start only: a reload that adds one says so
    // instead of leaving the operator to find the port closed.
    let s = TestServer::start_logged(&config("", ""), "warn");
    let port = free_port();
    let with_listener =
        config(&format!(r#""upstream":{{"url":"http://127.0.0.1:9","listen":"127.0.0.1:{port}"}}"#), "");
    assert_eq!(reload_with(&s, &with_listener), (1.0, 0.0), "the rest of the configuration applies");
    assert!(
        s.log().contains("`upstream.listen` addresses take effect at the next restart"),
        "the reload says the listener waits for a restart: {}",
        s.log()
    );
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing listens there before a restart");
}

#[test]
fn sighup_with_a_broken_file_keeps_the_old_configuration() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    assert_eq!(reload_with(&s, "{ this is not json"), (0.0, 1.0));
    let held = s.acquire("", "");
    assert_eq!(held.status, 200);
    assert_eq!(held.header_u64("x-nthpool-limit"), 1, "the old limit stays");
    assert_eq!(s.acquire("", "").status, 429);

    let impossible = config(r#""concurrency":3,"termMs":5000,"renewIntervalMs":5000"#, "");
    assert_eq!(reload_with(&s, &impossible), (0.0, 2.0));
    let r = s.acquire("", "");
    assert_eq!(r.status, 429, "renewIntervalMs >= termMs is refused whole: {r:?}");
    assert_eq!(r.header_u64("x-nthpool-limit"), 1);
    assert_eq!(s.renew(&held.slot()).status, 200, "still serving");
}

#[test]
fn sighup_with_an_unopenable_access_log_changes_nothing() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let held = s.acquire("", "").slot();
    // Valid JSON, but the access log cannot be opened: the reload must be refused whole.
    let unopenable = format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":"no-such-dir/access.log",
        "pools":{{"p":{{"keys":["{KEY}"],"concurrency":3}},"fresh":{{"keys":["fresh-key"]}}}}}}"#
    );
    assert_eq!(reload_with(&s, &unopenable), (0.0, 1.0));
    let mut c = s.connect();
    c.write_all(&post("/pools/fresh/lock/acquire", "fresh-key", "", "")).unwrap();
    let r = read_response(&mut c).expect("an answer for a pool of the refused configuration (the server is gone)");
    assert_eq!(r.status, 401, "a pool of the refused configuration does not exist: {r:?}");
    let r = s.acquire("", "");
    assert_eq!(r.status, 429, "the refused reload must not raise the limit: {r:?}");
    assert_eq!(r.header_u64("x-nthpool-limit"), 1);
    assert_eq!(s.renew(&held).status, 200, "still serving");
}

/// Sends SIGHUP and returns the log line that says what became of the reload.
fn reload_outcome(s: &TestServer) -> String {
    s.signal("HUP");
    let deadline = Instant::now() + PATIENCE;
    let handled = |l: &str| l.contains("reload refused") || l.contains("configuration reloaded");
    loop {
        if let Some(line) = s.log().lines().find(|l| handled(l)) {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "the reload was never handled: {}", s.log());
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_cannot_drop_the_admin_token_of_a_listener_bound_beyond_loopback() {
    const TOKEN: &str = "admin-token-0123456789";
    let with = |listen: &str, token: &str| {
        format!(
            r#"{{"adminListen":"{listen}","adminToken":{token},"accessLog":null,"pools":{{"p":{{"keys":["{KEY}"]}}}}}}"#
        )
    };
    // Bound on every interface; the test only ever connects over loopback.
    let s = TestServer::start_logged(&with("0.0.0.0:0", &format!("\"{TOKEN}\"")), "info");
    let admin = SocketAddr::from(([127, 0, 0, 1], admin(&s).port()));
    let fetch = |path: &str, token: Option<&str>| {
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let mut c = TcpStream::connect(admin).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n").as_bytes())
            .unwrap();
        read_response(&mut c).expect("an answer")
    };
    assert_eq!(fetch("/metrics", None).status, 401);
    // The new address waits for a restart; the token must not go meanwhile.
    std::fs::write(&s.config_path, with(&format!("127.0.0.1:{}", admin.port()), "null")).unwrap();
    let refused = reload_outcome(&s);
    assert!(refused.contains("adminToken") && refused.contains("0.0.0.0:"), "{refused}");
    for path in ["/metrics", "/api/pools"] {
        assert_eq!(fetch(path, None).status, 401, "{path} without the token after the refused reload");
    }
    let m = fetch("/metrics", Some(TOKEN));
    assert_eq!(m.status, 200);
    let m = Exposition::parse(std::str::from_utf8(&m.body).unwrap());
    assert_eq!(reloads(&m), (0.0, 1.0));
}

#[test]
fn sighup_shortened_connection_timeouts_reach_the_connections_already_open() {
    // Both open under a minute's timeouts: one idle after its answer, one
    // whose head never ends. A reload to 300 ms closes both about then, as
    // it does new ones (they once kept their old deadlines: 60 s and 10 s).
    let s = TestServer::start(&config("", r#""headTimeoutMs":60000,"idleTimeoutMs":60000"#));
    let mut idle = s.connect();
    let acquire = format!("POST /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    idle.write_all(acquire.as_bytes()).unwrap();
    assert_eq!(read_response(&mut idle).expect("an answer").status, 200);
    let mut partial = s.connect();
    partial.write_all(b"POST /pools/p/lock/acq").unwrap();
    s.reload(&config("", r#""headTimeoutMs":300,"idleTimeoutMs":300"#));
    for (what, c) in [("idle", &mut idle), ("a head never finished", &mut partial)] {
        // Within the 10 s read timeout; whatever it is told first, it ends.
        let mut rest = Vec::new();
        let read = std::io::Read::read_to_end(c, &mut rest);
        assert!(read.is_ok(), "{what}: still open ({read:?})");
    }
}

#[test]
fn sighup_cannot_send_snapshots_over_the_slot_secret_or_where_none_can_be_written() {
    let with = |state: &str| config("", &format!(r#""stateFile":"{state}""#));
    let mut s = TestServer::start_logged(&with("x.state"), "info");
    let secret_file = s.dir.join("nthpool.secret");
    let secret = std::fs::read(&secret_file).unwrap();
    assert_eq!(secret.len(), 32);
    std::fs::write(&s.config_path, with("./nthpool.secret")).unwrap();
    let line = reload_outcome(&s);
    assert!(line.contains("reload refused") && line.contains("stateFile"), "{line}");
    let refusal = |s: &TestServer, config: String, refused_before: usize| {
        std::fs::write(&s.config_path, config).unwrap();
        s.signal("HUP");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(line) = s.log().lines().filter(|l| l.contains("reload refused")).nth(refused_before) {
                break line.to_string();
            }
            assert!(Instant::now() < deadline, "the reload was never refused: {}", s.log());
            thread::sleep(Duration::from_millis(20));
        }
    };
    // Nor to where no snapshot can be written, which start-up refuses too.
    for (refused_before, nowhere) in [(1, "no-such-directory/x.state"), (2, ".")] {
        let line = refusal(&s, with(nowhere), refused_before);
        assert!(line.contains("cannot write a snapshot"), "{nowhere}: {line}");
    }
    // Nor to a slot secret the next start could not create.
    let secret_nowhere = config("", r#""stateFile":"x.state","slotSecretFile":"no-such-directory/s.secret""#);
    let line = refusal(&s, secret_nowhere, 3);
    assert!(line.contains("slotSecretFile: cannot create the slot secret"), "{line}");
    // The stop snapshot goes where it went before; the secret is untouched.
    let slot = s.acquire("", "").slot();
    s.signal("TERM");
    let deadline = Instant::now() + PATIENCE;
    while s.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not stop");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read(&secret_file).unwrap(), secret, "the secret was overwritten");
    assert!(s.dir.join("x.state").exists(), "no snapshot at the running stateFile");
    let _ = slot;
}

// ---------------------------------------------------------------- SIGTERM

fn wait_for_exit(s: &mut TestServer, within: Duration) -> ExitStatus {
    exit_within(&mut s.child, within).unwrap_or_else(|| panic!("still running {within:?} after SIGTERM"))
}

#[test]
fn sigterm_exits_promptly_with_idle_keep_alive_connections_open() {
    let mut s = TestServer::start_logged(&config("", ""), "info");
    let mut kept_alive = s.connect();
    kept_alive.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    assert_eq!(read_response(&mut kept_alive).unwrap().status, 200);
    let mut idle: Vec<TcpStream> = (0..3).map(|_| s.connect()).collect();
    let mut admin_idle = TcpStream::connect(admin(&s)).unwrap();
    admin_idle.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // 1 kept alive + 3 idle + 1 idle admin + the scrape.
    eventually(&s, "every connection accepted", |m| m.value("nthpool_connections_open", &[]) == 6.0);

    s.signal("TERM");
    // The contract is one second; three leave room for a loaded machine.
    let status = wait_for_exit(&mut s, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
    assert!(is_closed(&mut kept_alive));
    for c in idle.iter_mut() {
        assert!(is_closed(c));
    }
    assert!(is_closed(&mut admin_idle));
    // Idle connections do not hold the stop for its grace: each had every
    // answer once its FIN was sent, so none was left to cut at the deadline.
    let log = s.log();
    assert!(log.contains("shut down (0 connections cut at the deadline"), "{log}");
}

#[test]
fn sigterm_answers_a_queued_waiter_with_503_before_exiting() {
    let mut s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":60000}"#, ""));
    s.acquire("", "").slot();
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":60000}"#)).unwrap();
    eventually(&s, "the waiter queued", |m| m.pool("nthpool_waiters", "p") == 1.0);

    s.signal("TERM");
    let r = read_response(&mut waiter).expect("the waiter is answered, not dropped");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.error_code(), "unavailable");
    assert!(r.header_u64("Retry-After") >= 1);
    assert!(is_closed(&mut waiter), "and its connection closed");
    let status = wait_for_exit(&mut s, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
}

/// An HTTP/1.0 keep-alive waiter cut short by the stop, with a request
/// pipelined behind it: its `503` keeps the connection for that answer and
/// says so, as any answer to HTTP/1.0 that keeps the connection does.
#[test]
fn sigterm_answers_an_http_1_0_keep_alive_waiter_kept_alive_when_more_follows() {
    let mut s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":60000}"#, ""));
    let held = s.acquire("", "").slot();
    let http10 = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.0\r\nConnection: keep-alive\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut waiter = s.connect();
    let mut raw = http10("/pools/p/lock/acquire", r#"{"waitMs":60000}"#);
    raw.push_str(&http10(&format!("/pools/p/lock/{held}/release"), ""));
    waiter.write_all(raw.as_bytes()).unwrap();
    eventually(&s, "the waiter queued", |m| m.pool("nthpool_waiters", "p") == 1.0);

    s.signal("TERM");
    let r = read_response(&mut waiter).expect("the waiter is answered");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("connection"), Some("keep-alive"), "the release's answer follows: {r:?}");
    let r = read_response(&mut waiter).expect("the release pipelined behind it is answered");
    assert_eq!(r.json()["released"], true, "{r:?}");
    assert!(is_closed(&mut waiter), "and its connection closed");
    let status = wait_for_exit(&mut s, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
}

/// A waiter cut short by the stop with requests pipelined behind it: they
/// are answered in order, and the last answer before the close says
/// `Connection: close` (RFC 9112 §9.6), the ones before it do not.
#[test]
fn sigterm_says_close_in_the_last_answer_pipelined_behind_a_waiter() {
    let mut s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":60000}"#, ""));
    s.acquire("", "").slot();
    let mut waiter = s.connect();
    let mut raw = post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":60000}"#);
    raw.extend_from_slice(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\nGET /y HTTP/1.1\r\nHost: localhost\r\n\r\n");
    waiter.write_all(&raw).unwrap();
    eventually(&s, "the waiter queued", |m| m.pool("nthpool_waiters", "p") == 1.0);

    s.signal("TERM");
    let r = read_response(&mut waiter).expect("the waiter is answered");
    assert_eq!((r.status, r.header("connection")), (503, None), "more follows: {r:?}");
    let r = read_response(&mut waiter).expect("the first request behind it is answered");
    assert_eq!((r.status, r.header("connection")), (404, None), "more follows: {r:?}");
    let r = read_response(&mut waiter).expect("the last request behind it is answered");
    assert_eq!((r.status, r.header("connection")), (404, Some("close")), "the last answer: {r:?}");
    assert!(is_closed(&mut waiter), "and its connection closed");
    let status = wait_for_exit(&mut s, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
}

/// Sends `request` but its last 5 bytes, stops the server (TERM) once the
/// head is read, and sends the rest when the stop has begun: a request
/// still arriving at the signal that completes within the grace.
fn finish_during_the_stop(s: &mut TestServer, request: &[u8]) -> TcpStream {
    let (first, rest) = request.split_at(request.len() - 5);
    let mut c = s.connect();
    c.write_all(first).unwrap();
    eventually(s, "the head read", |m| m.value("nthpool_connections_open", &[]) == 2.0);
    thread::sleep(Duration::from_millis(50));
    s.signal("TERM");
    let deadline = Instant::now() + PATIENCE;
    while !s.log().contains("shutting down") {
        assert!(Instant::now() < deadline, "the stop never began: {}", s.log());
        thread::sleep(Duration::from_millis(10));
    }
    c.write_all(rest).unwrap();
    c
}

/// The server exited cleanly, with no connection cut at the grace's end.
fn assert_stopped_with_none_cut(s: &mut TestServer) {
    let status = wait_for_exit(s, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
    let log = s.log();
    assert!(log.contains("shut down (0 connections cut at the deadline"), "{log}");
}

/// A request whose head came before the stop and whose body comes during
/// its grace is answered (then the connection closes), not dropped: a
/// release the caller sent is done, and counted as answered, not cut.
#[test]
fn sigterm_answers_a_request_still_arriving_when_it_completes_within_the_grace() {
    let mut s = TestServer::start_logged(&config(r#""concurrency":1"#, ""), "info");
    let held = s.acquire("", "").slot();
    let body = r#"{"status":200}"#;
    let request = post(&format!("/pools/p/lock/{held}/release"), KEY, "", body);
    let mut c = finish_during_the_stop(&mut s, &request);
    let r = read_response(&mut c).expect("the release is answered");
    assert_eq!(r.json()["released"], true, "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(is_closed(&mut c));
    assert_stopped_with_none_cut(&mut s);
}

/// An acquire still arriving at the stop that completes within the grace
/// and finds no free slot does not wait: it gets the `503` the waiters got,
/// at once, rather than no answer at all when the grace ends.
#[test]
fn sigterm_answers_an_acquire_completed_in_the_grace_that_would_wait_with_503() {
    let mut s =
        TestServer::start_logged(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":60000}"#, ""), "info");
    s.acquire("", "").slot();
    let request = post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":60000}"#);
    let mut c = finish_during_the_stop(&mut s, &request);
    let asked = Instant::now();
    let r = read_response(&mut c).expect("the acquire is answered, not cut at the grace's end");
    assert!(asked.elapsed() < Duration::from_millis(500), "answered at once, not at the deadline");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.error_code(), "unavailable");
    assert!(r.header_u64("Retry-After") >= 1);
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(is_closed(&mut c));
    assert_stopped_with_none_cut(&mut s);
}

/// Every pool's learned state goes into the stop's snapshot, whether it
/// holds slots or not: the stop leaves the snapshot room for its pools
/// (10 µs each) as for its held slots, so a server of many pools still
/// exits within the second.
#[test]
fn sigterm_leaves_the_snapshot_room_for_every_pool() {
    let pools: Vec<String> = (0..2000).map(|i| format!(r#""p{i}":{{"keys":["key-of-pool-{i}"]}}"#)).collect();
    let json = format!(r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{{}}}}}"#, pools.join(","));
    let mut s = TestServer::start_logged(&json, "info");
    s.signal("TERM");
    let status = wait_for_exit(&mut s, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
    let log = s.log();
    assert!(log.contains("clients have 780 ms, the snapshot 20 ms"), "{log}");
}

// ---------------------------------------------------------------- start-up

/// A start-up failure: non-zero exit and exactly one stderr line containing every `needle`.
fn assert_fails_with(r: &Run, needles: &[&str]) {
    assert!(!r.status.success(), "expected a failure, got {}; stderr: {}", r.status, r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one stderr line, got: {:?}", r.stderr);
    for needle in needles {
        assert!(lines[0].contains(needle), "{:?} does not name {needle:?}", lines[0]);
    }
}

fn write_config(dir: &Path, json: &str) -> String {
    let path = dir.join("config.json");
    std::fs::write(&path, json).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn start_up_fails_in_one_line_when_the_port_is_taken() {
    let dir = scratch_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let path = write_config(&dir, &config("", ""));
    let r = run(&dir, &["--config", &path, "--listen", &addr]);
    assert_fails_with(&r, &[&addr]);

    let admin_taken =
        config("", "").replacen(r#""adminListen":"127.0.0.1:0""#, &format!(r#""adminListen":"{addr}""#), 1);
    let path = write_config(&dir, &admin_taken);
    let r = run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]);
    assert_fails_with(&r, &[&addr, "adminListen"]);
}

#[test]
fn start_up_fails_in_one_line_when_the_state_file_cannot_be_written() {
    // Found at start, not at the stop whose snapshot it would lose.
    let dir = scratch_dir();
    let nowhere = config("", r#""stateFile":"no-such-directory/nthpool.state""#);
    let path = write_config(&dir, &nowhere);
    let r = run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]);
    assert_fails_with(&r, &["stateFile", "no-such-directory/nthpool.state"]);
}

#[test]
fn check_config_and_start_up_refuse_the_same_state_and_secret_files_before_writing_anything() {
    // The state file, the slot secret and the configuration are three files
    // however they are spelled: a stop snapshot written over the secret would
    // lose every slot id it signed. `--check-config` finds what start-up would.
    let dir = scratch_dir();
    let secret = dir.join("nthpool.secret");
    std::fs::write(&secret, [7u8; 32]).unwrap();
    std::fs::write(dir.join("short.secret"), [7u8; 31]).unwrap();
    let absolute = format!(r#""stateFile":"{}""#, secret.to_str().unwrap());
    // A state file that is a directory (here, the secret's own) can never be
    // replaced by a snapshot: the stop would lose it.
    std::fs::create_dir(dir.join("state")).unwrap();
    let cases: [(&str, &[&str]); 9] = [
        (r#""stateFile":"state""#, &["stateFile", "state", "directory"]),
        (r#""stateFile":".""#, &["stateFile", "directory"]),
        (r#""stateFile":"./nthpool.secret""#, &["stateFile", "slot secret"]),
        (&absolute, &["stateFile", "slot secret"]),
        (r#""stateFile":"config.json""#, &["stateFile", "configuration file"]),
        (r#""slotSecretFile":"./config.json","stateFile":null"#, &["slotSecretFile", "configuration file"]),
        (r#""slotSecretFile":"short.secret""#, &["slotSecretFile", "short.secret", "31 bytes"]),
        (r#""stateFile":"no-such-directory/x.state""#, &["stateFile", "no-such-directory/x.state"]),
        (r#""slotSecretFile":"no-such-directory/s.secret""#, &["slotSecretFile", "cannot create", "s.secret"]),
    ];
    for (top, needles) in cases {
        let path = write_config(&dir, &config("", top));
        assert_fails_with(&run(&dir, &["--check-config", &path]), needles);
        assert_fails_with(&run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]), needles);
        assert_eq!(std::fs::read(&secret).unwrap(), [7u8; 32], "{top}: the secret was written");
    }
    let path = write_config(&dir, &config("", r#""stateFile":"x.state""#));
    let r = run(&dir, &["--check-config", &path]);
    assert!(r.status.success(), "{}", r.stderr);
}

/// Started with `--listen`, a reload is checked as the next start with the
/// same command line would check it: a pool's own listener on that address
/// is refused, not accepted now and refused at the restart.
#[test]
fn a_reload_is_checked_against_the_listen_address_of_the_command_line() {
    let listen = format!("127.0.0.1:{}", free_port());
    let dir = scratch_dir();
    let path = write_config(&dir, &config("", ""));
    let s = TestServer::start_with(dir, path.into(), &["--listen", &listen]);
    let upstream = |at: &str| config(&format!(r#""upstream":{{"url":"http://127.0.0.1:9","listen":"{at}"}}"#), "");
    let refused = || s.metric("nthpool_config_reload_failures_total").expect("the reload failures counter");
    std::fs::write(&s.config_path, upstream(&listen)).unwrap();
    s.signal("HUP");
    common::eventually("the reload refused", || refused() == 1.0);
    let r = run(&s.dir, &["--check-config", s.config_path.to_str().unwrap()]);
    assert!(r.status.success(), "the file alone is valid: {}", r.stderr);
    // Another address is accepted (and bound at the next start).
    s.reload(&upstream(&format!("127.0.0.1:{}", free_port())));
    assert_eq!(refused(), 1.0);
    // Started on the file's `listen`, a reload that moves it frees the old
    // address for a pool's own listener, as the next start would.
    let dir = scratch_dir();
    let on_file = |listen: &str, upstream_at: &str| {
        let pool = format!(r#""upstream":{{"url":"http://127.0.0.1:9","listen":"{upstream_at}"}}"#);
        config(&pool, &format!(r#""listen":"{listen}""#))
    };
    let (first, second, third) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let path = write_config(&dir, &on_file(&first, &third));
    let s = TestServer::start_with(dir, path.into(), &[FILE_LISTEN]);
    assert_eq!(s.addr.to_string(), first);
    s.reload(&on_file(&second, &first));
}

/// Started with `--listen`, the file's `listen` is not the address in use:
/// a reload that changes it changes nothing and says nothing; one that moves
/// `adminListen` still says it waits for a restart.
#[test]
fn a_reload_moving_the_files_listen_under_a_listen_override_says_nothing() {
    let s = TestServer::start_logged(&config("", ""), "warn");
    let waits = |log: &str| log.matches("take effect at the next restart").count();
    s.reload(&config("", r#""listen":"127.0.0.1:1""#));
    assert_eq!(waits(&s.log()), 0, "{}", s.log());
    let admin = format!(r#""listen":"127.0.0.1:1","adminListen":"127.0.0.1:{}""#, free_port());
    s.reload(&config("", "").replacen(r#""adminListen":"127.0.0.1:0","#, &format!("{admin},"), 1));
    assert_eq!(waits(&s.log()), 1, "{}", s.log());
}

/// The warning that new listener addresses wait for a restart compares
/// with what is bound: a reload that goes back to the bound addresses
/// (after one that moved them) says nothing, one that still names another
/// address says it again.
#[test]
fn a_reload_back_to_the_bound_addresses_says_nothing_of_a_restart() {
    let waits = |s: &TestServer| s.log().matches("take effect at the next restart").count();
    // Started on the file's `listen`: the lock listener, the admin listener
    // and a pool's own listener (none at start).
    let (listen, elsewhere) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let on = |listen: &str, admin: &str, pool: &str| {
        config(pool, &format!(r#""listen":"{listen}""#)).replacen(
            r#""adminListen":"127.0.0.1:0""#,
            &format!(r#""adminListen":"{admin}""#),
            1,
        )
    };
    let upstream = format!(r#""upstream":{{"url":"http://127.0.0.1:9","listen":"127.0.0.1:{}"}}"#, free_port());
    let bound = on(&listen, "127.0.0.1:0", "");
    let dir = scratch_dir();
    let path = write_config(&dir, &bound);
    let s = TestServer::start_with_args_logged(dir, path.into(), &[FILE_LISTEN], "warn");
    let moved = [
        on(&elsewhere, "127.0.0.1:0", ""),
        on(&listen, &format!("127.0.0.1:{}", free_port()), ""),
        on(&listen, "127.0.0.1:0", &upstream),
    ];
    for (i, other) in moved.iter().enumerate() {
        s.reload(other);
        assert_eq!(waits(&s), 2 * i + 1, "moved: {}", s.log());
        s.reload(other);
        assert_eq!(waits(&s), 2 * i + 2, "still not what is bound: {}", s.log());
        s.reload(&bound);
        assert_eq!(waits(&s), 2 * i + 2, "back to what is bound: {}", s.log());
    }
}

/// A SIGHUP while the configuration is still being read (a large one takes
/// a while; here the file is a pipe written late) does not end the process,
/// which systemd would count as a clean exit: the reload it asks for is done
/// once the server is up.
#[test]
fn a_reload_asked_for_while_starting_is_done_once_started() {
    use std::io::{BufRead, BufReader};
    let dir = scratch_dir();
    let fifo = dir.join("config.json");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    /// Killed however the test ends (blocked on the pipe, it would outlive it).
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
            .args(["--config", "config.json", "--listen", "127.0.0.1:0"])
            .current_dir(&dir)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    // Reading the pipe blocks until it is written: SIGHUP is caught by then.
    let caught = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap_or("0").trim().to_string();
        u64::from_str_radix(&mask, 16).unwrap_or(0) & 1 != 0
    };
    common::eventually("SIGHUP caught while the configuration is read", caught);
    assert!(std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = |stream: Box<dyn std::io::Read + Send>, tx: std::sync::mpsc::Sender<String>| {
        thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        })
    };
    lines(Box::new(child.0.stdout.take().unwrap()), tx.clone());
    lines(Box::new(child.0.stderr.take().unwrap()), tx);
    let next = |what: &str| loop {
        let line = rx.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("{what}: {e}"));
        if line.contains(what) {
            break line;
        }
    };
    let text = config("", "");
    let write = {
        let (fifo, text) = (fifo.clone(), text.clone());
        thread::spawn(move || std::fs::write(&fifo, &text).unwrap())
    };
    // Once read, the start reloads it: the pipe is written again for that.
    next("SIGHUP during start-up: reloading the configuration");
    write.join().unwrap();
    thread::spawn(move || std::fs::write(&fifo, &text).unwrap());
    // The log and the banner, on two streams, come in either order.
    let (mut reloaded, mut admin) = (false, None);
    while !reloaded || admin.is_none() {
        let line = rx.recv_timeout(PATIENCE).expect("the reload and the banner");
        reloaded |= line.contains("configuration reloaded from");
        let banner = line.trim().strip_prefix("nthpool admin on http://");
        admin = admin.or_else(|| banner.map(|a| a.parse::<SocketAddr>().unwrap()));
    }
    let admin = admin.unwrap();
    let text = admin_get(admin, "/metrics");
    assert!(text.lines().any(|l| l == "nthpool_config_reloads_total 1"), "{text}");
}

/// A stop asked for while the configuration is still being read (here the
/// file is a pipe written late) does not end the process as the signal's
/// default action would: the server stops as soon as it is up, without
/// serving, and exits 0.
#[test]
fn a_stop_asked_for_while_starting_ends_the_start_with_exit_0() {
    for (sig, number) in [("TERM", 15), ("INT", 2), ("QUIT", 3)] {
        let (dir, fifo, mut child) = start_reading_a_pipe(std::process::Stdio::piped());
        let pid = child.id();
        assert!(std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap()
            .success());
        // Written once the signal has had its chance to end the process.
        thread::sleep(Duration::from_millis(50));
        let text = config("", "");
        let writer = thread::spawn(move || {
            let _ = std::fs::write(&fifo, &text);
        });
        let Some(status) = exit_within(&mut child, PATIENCE) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("SIG{sig} while starting: still running after {PATIENCE:?}");
        };
        let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
        assert_eq!(status.code(), Some(0), "SIG{sig} ({number}) while starting: {status}; log: {log}");
        writer.join().unwrap();
        assert!(log.contains("during start-up: stopping as soon as the server is up"), "{log}");
        let mut banner = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut banner).unwrap();
        assert!(!banner.contains("listening on"), "served after a stop was asked for: {banner}");
    }
}

/// `--check-config` serves nothing, so SIGTERM or Ctrl-C ends it as it ends
/// any command, also while its file is slow to read (here a pipe nobody
/// writes, whose `open` waits for good): only a server holds a stop signal
/// for the end of its start, which writes its snapshot.
#[test]
fn check_config_ends_on_a_stop_signal_while_its_file_is_read() {
    use std::os::unix::process::ExitStatusExt;
    for (sig, number) in [("TERM", 15), ("INT", 2)] {
        let dir = scratch_dir();
        assert!(std::process::Command::new("mkfifo").arg(dir.join("config.json")).status().unwrap().success());
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
            .args(["--check-config", "config.json"])
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Asleep opening the pipe: past where a server catches its signals.
        common::eventually("--check-config waiting for the pipe", || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status.lines().any(|l| l.starts_with("State:") && l.contains("S (sleeping)"))
        });
        thread::sleep(Duration::from_millis(50));
        assert!(std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap()
            .success());
        let Some(status) = exit_within(&mut child, PATIENCE) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("--check-config: still running {PATIENCE:?} after SIG{sig}");
        };
        assert_eq!(status.signal(), Some(number), "--check-config ended by SIG{sig}: {status}");
    }
}

/// A server whose configuration file, `config.json` in its scratch
/// directory (returned with the pipe's path), is a pipe nobody has written
/// yet: it is returned blocked reading it, its signal handlers in place
/// (SIGHUP caught), its standard error in `stderr.log`.
fn start_reading_a_pipe(stdout: std::process::Stdio) -> (Scratch, std::path::PathBuf, std::process::Child) {
    let dir = scratch_dir();
    let fifo = dir.join("config.json");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .args(["--config", "config.json", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env("RUST_LOG", "info")
        .stdout(stdout)
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    // Reading the pipe blocks until it is written: the signals are caught by then.
    let caught = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap_or("0").trim().to_string();
        u64::from_str_radix(&mask, 16).unwrap_or(0) & 1 != 0
    };
    common::eventually("SIGHUP caught while the configuration is read", caught);
    (dir, fifo, child)
}

/// A reload and a stop both asked for while the configuration is still
/// being read (a restart while a reload is pending): the reload is done
/// before the stop, so the stop's snapshot is of the configuration the file
/// holds, and the next start restores it with no re-adoption window.
#[test]
fn a_reload_and_a_stop_asked_for_while_starting_leave_a_snapshot_of_the_reloaded_configuration() {
    let (dir, fifo, mut child) = start_reading_a_pipe(std::process::Stdio::null());
    let pid = child.id();
    for sig in ["-HUP", "-TERM"] {
        assert!(std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
    }
    thread::sleep(Duration::from_millis(50));
    // The start reads the first text; the reload, once it says so, the second.
    let (started, reloaded) = (config("", ""), config(r#""concurrency":3"#, ""));
    {
        let (fifo, reloaded, log) = (fifo.clone(), reloaded.clone(), dir.join("stderr.log"));
        thread::spawn(move || {
            let _ = std::fs::write(&fifo, &started);
            let asked = Instant::now() + PATIENCE;
            while Instant::now() < asked {
                if std::fs::read_to_string(&log).unwrap_or_default().contains("SIGHUP during start-up") {
                    let _ = std::fs::write(&fifo, &reloaded);
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
        });
    }
    let Some(status) = exit_within(&mut child, PATIENCE) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("still running after {PATIENCE:?}");
    };
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("configuration reloaded from"), "{log}");
    std::fs::remove_file(&fifo).unwrap();
    std::fs::write(&fifo, &reloaded).unwrap();
    let server = TestServer::start_with_logged(dir, fifo, "info");
    let log = server.log();
    assert!(log.contains("restored the stop snapshot"), "{log}");
    assert!(!log.contains("re-adoption window"), "{log}");
    assert_eq!(server.get_admin("/healthz").json()["status"], "ok");
}

/// A configuration start-up refuses is named as `--check-config` names it,
/// `nthpool: FILE: …`, with the same exit code: whichever step of the
/// start finds it.
#[test]
fn start_up_names_the_file_of_a_configuration_it_refuses_as_check_config_does() {
    let dir = scratch_dir();
    let jwks = r#""access":{"cloudflareAccess":{"jwksFile":"absent.json","audience":"a","issuer":"https://t.cloudflareaccess.com"}}"#;
    let unset = r#""upstream":{"url":"http://127.0.0.1:9","setHeaders":{"Authorization":"Bearer ${env:NTHPOOL_TEST_NEVER_SET}"}}"#;
    let cases: [(String, &str); 4] = [
        (config(r#""access":{"ipAllow":["10.0.0.0/33"]}"#, ""), "pools.p.access.ipAllow"),
        (config("", "").replacen(r#""accessLog":null"#, r#""accessLog":"config.json""#, 1), "accessLog"),
        (config(jwks, ""), "absent.json"),
        (config(unset, ""), "NTHPOOL_TEST_NEVER_SET"),
    ];
    for (json, needle) in cases {
        let path = write_config(&dir, &json);
        let checked = run(&dir, &["--check-config", &path]);
        let started = run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]);
        assert_fails_with(&checked, &[&format!("nthpool: {path}: "), needle]);
        assert_eq!(started.stderr, checked.stderr, "{needle}: start-up and --check-config differ");
        assert_eq!(started.status.code(), Some(2), "{needle}: {}", started.stderr);
        assert_eq!(checked.status.code(), Some(2), "{needle}: {}", checked.stderr);
    }
}

/// The access log is appended to: named as the slot secret, the state file,
/// its lock or the configuration, it would corrupt that file (a secret that
/// no longer reads costs every later start its slots); named as the file a
/// snapshot is written to before it is renamed, or the one a refused
/// snapshot is moved to, it would be lost. Another name of one of them (a
/// hard link) is the same file. Refused by `--check-config`, at start
/// before any file is opened, and by a reload.
#[test]
fn an_access_log_that_is_a_file_the_server_keeps_is_refused() {
    let dir = scratch_dir();
    let secret = dir.join("nthpool.secret");
    std::fs::write(&secret, [7u8; 32]).unwrap();
    let logged = |log: &str| config("", "").replacen(r#""accessLog":null"#, &format!(r#""accessLog":"{log}""#), 1);
    write_config(&dir, &logged("access.log"));
    std::fs::hard_link(dir.join("config.json"), dir.join("config-link.json")).unwrap();
    std::fs::hard_link(&secret, dir.join("secret-link")).unwrap();
    let cases: [(&str, &[&str]); 8] = [
        ("nthpool.secret", &["accessLog", "slot secret"]),
        ("./config.json", &["accessLog", "configuration file"]),
        ("nthpool.state", &["accessLog", "the state file"]),
        ("nthpool.state.lock", &["accessLog", "the state file's lock"]),
        ("nthpool.state.tmp", &["accessLog", "nthpool.state.tmp", "temporary file"]),
        ("nthpool.state.refused", &["accessLog", "nthpool.state.refused", "refused snapshot"]),
        ("config-link.json", &["accessLog", "configuration file"]),
        ("secret-link", &["accessLog", "slot secret"]),
    ];
    for (log, needles) in cases {
        let path = write_config(&dir, &logged(log));
        assert_fails_with(&run(&dir, &["--check-config", &path]), needles);
        assert_fails_with(&run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]), needles);
        assert_eq!(std::fs::read(&secret).unwrap(), [7u8; 32], "{log}: the secret was written");
        assert!(!dir.join("nthpool.state").exists(), "{log}: a state file was created");
    }
    // A reload naming the secret, or the snapshot's temporary file, is refused.
    let path = write_config(&dir, &logged("access.log"));
    let s = TestServer::start_with(dir, path.into(), &[]);
    let refused = || s.metric("nthpool_config_reload_failures_total").expect("the reload failures counter");
    for log in ["nthpool.secret", "nthpool.state.tmp"] {
        let before = refused();
        std::fs::write(&s.config_path, logged(log)).unwrap();
        s.signal("HUP");
        common::eventually("the reload refused", || refused() > before);
    }
    assert_eq!(std::fs::read(s.dir.join("nthpool.secret")).unwrap(), [7u8; 32], "the secret was written");
    assert!(s.dir.join("access.log").exists());
}

#[test]
fn a_file_path_holding_a_nul_is_a_configuration_error() {
    let dir = scratch_dir();
    for (top, field) in [
        (r#""accessLog":"access\u0000.log""#, "accessLog"),
        (r#""slotSecretFile":"nthpool\u0000.secret""#, "slotSecretFile"),
        (r#""stateFile":"nthpool\u0000.state""#, "stateFile"),
    ] {
        let json = config("", "").replacen(r#""accessLog":null"#, top, 1);
        let path = write_config(&dir, &json);
        for args in [&["--check-config", &path][..], &["--config", &path, "--listen", "127.0.0.1:0"]] {
            let r = run(&dir, args);
            assert_fails_with(&r, &[field, "NUL character"]);
            assert_eq!(r.status.code(), Some(2), "{args:?}: a configuration that is wrong");
        }
    }
}

#[test]
fn a_state_file_or_access_log_that_is_a_file_the_configuration_reads_is_refused() {
    let dir = scratch_dir();
    let jwks = format!(r#"{{"keys":[{{"kty":"RSA","alg":"RS256","kid":"k1","n":"{}","e":"AQAB"}}]}}"#, "_".repeat(344));
    std::fs::write(dir.join("certs.json"), &jwks).unwrap();
    std::fs::write(dir.join("token.txt"), "upstream-token\n").unwrap();
    let cloudflare =
        r#""access":{"cloudflareAccess":{"jwksFile":"certs.json","audience":"a","issuer":"https://t.example"}}"#;
    let upstream =
        r#""upstream":{"url":"http://127.0.0.1:9","setHeaders":{"Authorization":"Bearer ${file:token.txt}"}}"#;
    let with = |pool: &str, top: &str| config(pool, "").replacen(r#""accessLog":null"#, top, 1);
    let cases = [
        (with(cloudflare, r#""accessLog":null,"stateFile":"certs.json""#), &["stateFile", "jwksFile"][..]),
        (with(cloudflare, r#""accessLog":"./certs.json""#), &["accessLog", "jwksFile"][..]),
        (with(upstream, r#""accessLog":null,"stateFile":"token.txt""#), &["stateFile", "setHeaders.Authorization"][..]),
        (with(upstream, r#""accessLog":"token.txt""#), &["accessLog", "setHeaders.Authorization"][..]),
    ];
    for (json, needles) in &cases {
        let path = write_config(&dir, json);
        for args in [&["--check-config", &path][..], &["--config", &path, "--listen", "127.0.0.1:0"]] {
            let r = run(&dir, args);
            assert_fails_with(&r, needles);
            assert_eq!(r.status.code(), Some(2), "{args:?}");
        }
        assert_eq!(std::fs::read_to_string(dir.join("certs.json")).unwrap(), jwks, "the JWKS was written");
        assert_eq!(std::fs::read_to_string(dir.join("token.txt")).unwrap(), "upstream-token\n");
        assert!(!dir.join("certs.json.refused").exists() && !dir.join("token.txt.refused").exists());
    }
    // Nor can a reload send the snapshots there.
    let path = write_config(&dir, &with(cloudflare, r#""accessLog":null"#));
    let mut s = TestServer::start_with(dir, path.into(), &[]);
    let (ok, failed) = reload_with(&s, &cases[0].0);
    assert_eq!((ok, failed), (0.0, 1.0), "the reload is refused");
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(3)).success());
    assert_eq!(std::fs::read_to_string(s.dir.join("certs.json")).unwrap(), jwks, "the stop wrote over the JWKS");
}

#[test]
fn check_config_and_start_up_say_in_words_what_is_wrong_with_a_ca_file() {
    let dir = scratch_dir();
    let ca = tls_support::Ca::new("ops test ca");
    let pem = ca.pem();
    let lines: Vec<&str> = pem.lines().collect();
    let mut damaged = lines.clone();
    let garbled = format!("{}!!{}", &lines[2][..10], &lines[2][12..]);
    damaged[2] = &garbled;
    let junk = "AAECAwQFBgcICQ==";
    let cases: [(&str, Vec<u8>, &[&str]); 7] = [
        ("cut.pem", lines[..lines.len() - 3].join("\n").into_bytes(), &["ends inside", "line 1", "cut short"]),
        ("garbled.pem", damaged.join("\n").into_bytes(), &["CERTIFICATE block at line 1", "base64"]),
        (
            "begin.pem",
            pem.replacen("-----BEGIN CERTIFICATE-----", "-----BEGIN CERTIFICATE----", 1).into_bytes(),
            &["line 1", "BEGIN line"],
        ),
        (
            "junk.pem",
            format!("-----BEGIN CERTIFICATE-----\n{junk}\n-----END CERTIFICATE-----\n").into_bytes(),
            &["line 1", "not a valid X.509 certificate"],
        ),
        (
            "key.pem",
            format!("-----BEGIN PRIVATE KEY-----\n{junk}\n-----END PRIVATE KEY-----\n").into_bytes(),
            &["no PEM certificate", "PRIVATE KEY"],
        ),
        ("ca.der", ca.der(), &["no PEM certificate", "DER", "PEM first"]),
        ("notes.txt", b"our CA, see the wiki\n".to_vec(), &["no PEM certificate", "BEGIN CERTIFICATE"]),
    ];
    for (name, bytes, needles) in cases {
        let file = dir.join(name);
        std::fs::write(&file, bytes).unwrap();
        let pool = format!(
            r#""upstream":{{"url":"https://api.example","hosts":["p.proxy.test"],"caFile":"{}"}}"#,
            file.display()
        );
        let path = write_config(&dir, &config(&pool, ""));
        for r in [run(&dir, &["--check-config", &path]), run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"])] {
            assert_fails_with(&r, &[&format!("upstream.caFile {}: ", file.display())]);
            assert_fails_with(&r, needles);
            // A sentence: no byte list, no debug name of an error.
            let line = r.stderr.trim_end();
            assert!(!line.contains('[') && !line.contains("Invalid") && !line.contains("BadEncoding"), "{line}");
        }
    }
    // A reload that finds the file damaged is refused in the same words.
    let file = dir.join("roots.pem");
    std::fs::write(&file, &pem).unwrap();
    let pool =
        format!(r#""upstream":{{"url":"https://api.example","hosts":["p.proxy.test"],"caFile":"{}"}}"#, file.display());
    let s = TestServer::start_logged(&config(&pool, ""), "info");
    std::fs::write(&file, lines[..lines.len() - 3].join("\n")).unwrap();
    s.signal("HUP");
    let start = Instant::now();
    while !s.log().contains("reload refused") {
        assert!(start.elapsed() < Duration::from_secs(10), "no refused reload in 10 s: {}", s.log());
        thread::sleep(Duration::from_millis(20));
    }
    let log = s.log();
    let line = log.lines().find(|l| l.contains("reload refused")).unwrap_or_default();
    let refused = line.split_once("stays: ").map_or(line, |(_, why)| why);
    let named = format!("upstream.caFile {}: ends inside the CERTIFICATE block at line 1", file.display());
    assert!(refused.contains(&named) && !refused.contains('['), "{refused}");
}

#[test]
fn files_the_configuration_names_are_read_only_when_regular_and_bounded() {
    let dir = scratch_dir();
    let pipe = dir.join("pipe");
    if !std::process::Command::new("mkfifo").arg(&pipe).status().is_ok_and(|s| s.success()) {
        println!("skipped: mkfifo failed");
        return;
    }
    let big = dir.join("big.pem");
    std::fs::write(&big, vec![b'x'; (4 << 20) + 1]).unwrap();
    let ca = |file: &Path| {
        format!(r#""upstream":{{"url":"https://api.example","hosts":["p.proxy.test"],"caFile":"{}"}}"#, file.display())
    };
    let file_value = |file: &Path| {
        format!(
            r#""upstream":{{"url":"http://127.0.0.1:9","hosts":["p.proxy.test"],"setHeaders":{{"X-A":"${{file:{}}}"}}}}"#,
            file.display()
        )
    };
    let jwks = |file: &Path| {
        format!(
            r#""access":{{"cloudflareAccess":{{"jwksFile":"{}","audience":"aud","issuer":"https://team.cloudflareaccess.com"}}}}"#,
            file.display()
        )
    };
    let zero = Path::new("/dev/zero");
    // A named pipe would wait for a writer, a device would be read forever:
    // each is refused at once, in words.
    for (pool, why) in [
        (ca(&pipe), "not a regular file"),
        (ca(zero), "not a regular file"),
        (ca(&big), "larger than 4 MiB"),
        (file_value(&pipe), "not a regular file"),
        (file_value(zero), "not a regular file"),
        (jwks(&pipe), "not a regular file"),
        (jwks(zero), "not a regular file"),
    ] {
        let path = write_config(&dir, &config(&pool, ""));
        let r = run(&dir, &["--check-config", &path]);
        assert_fails_with(&r, &[why]);
    }
    // A reload onto a pipe is refused the same way, and serving goes on.
    let s = TestServer::start_logged(&config("", ""), "info");
    std::fs::write(&s.config_path, config(&file_value(&pipe), "")).unwrap();
    let outcome = reload_outcome(&s);
    assert!(outcome.contains("reload refused") && outcome.contains("not a regular file"), "{outcome}");
    s.acquire("", "").slot();
}

/// A reload reads the configuration file in the event loop: a named pipe
/// put in its place (no writer) is refused at once, in words, and serving
/// goes on, rather than every client waiting on its `open` for a writer.
#[test]
fn a_reload_onto_a_named_pipe_is_refused_and_serving_goes_on() {
    let s = TestServer::start_logged(&config("", ""), "info");
    std::fs::remove_file(&s.config_path).unwrap();
    if !std::process::Command::new("mkfifo").arg(&s.config_path).status().is_ok_and(|st| st.success()) {
        println!("skipped: mkfifo failed");
        return;
    }
    s.signal("HUP");
    let start = Instant::now();
    while !s.log().contains("reload refused") {
        assert!(start.elapsed() < Duration::from_secs(5), "the reload never ended: {}", s.log());
        thread::sleep(Duration::from_millis(20));
    }
    let log = s.log();
    let line = log.lines().find(|l| l.contains("reload refused")).unwrap_or_default();
    assert!(line.ends_with("it is not a regular file"), "{line}");
    s.acquire("", "").slot();
    assert_eq!(get(admin(&s), "/healthz").status, 200);
}

#[test]
fn start_up_fails_in_one_line_when_the_config_cannot_be_read() {
    let dir = scratch_dir();
    let missing = dir.join("missing.json");
    let missing = missing.to_str().unwrap();
    let r = run(&dir, &["--config", missing, "--listen", "127.0.0.1:0"]);
    assert_fails_with(&r, &["cannot read", missing]);
    let directory = dir.to_str().unwrap();
    let r = run(&dir, &["--config", directory, "--listen", "127.0.0.1:0"]);
    assert_fails_with(&r, &[directory]);
}

#[test]
fn start_up_fails_in_one_line_naming_an_invalid_or_unknown_field() {
    let dir = scratch_dir();
    for (pool_extra, needles) in [
        (r#""concurrency":0"#, &["pools.p.concurrency"][..]),
        (r#""bogus":1"#, &["bogus"][..]),
        (r#""termMs":5000,"renewIntervalMs":5000"#, &["pools.p.renewIntervalMs"][..]),
    ] {
        let path = write_config(&dir, &config(pool_extra, ""));
        let r = run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]);
        assert_fails_with(&r, needles);
    }
    let path = write_config(&dir, &config("", r#""listenn":"127.0.0.1:1""#));
    assert_fails_with(&run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]), &["listenn"]);
    let path = write_config(&dir, "{ not json");
    assert_fails_with(&run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]), &["invalid configuration"]);
}

#[test]
fn start_up_names_the_field_of_a_wrongly_typed_value() {
    let dir = scratch_dir();
    for (pool_extra, field) in [
        (r#""queue":{"size":10,"timeoutMs":"soon"}"#, "timeoutMs"),
        (r#""concurrency":"3""#, "concurrency"),
        (r#""termMs":-1"#, "termMs"),
    ] {
        let path = write_config(&dir, &config(pool_extra, ""));
        let r = run(&dir, &["--config", &path, "--listen", "127.0.0.1:0"]);
        assert_fails_with(&r, &[field]);
    }
}

#[test]
fn check_config_validates_without_serving() {
    let dir = scratch_dir();
    let path = write_config(&dir, &config(r#""concurrency":4"#, ""));
    let r = run(&dir, &["--check-config", &path]);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(r.stdout.contains("valid"), "{}", r.stdout);
    assert!(!r.stdout.contains("listening"), "it does not serve");

    let bad = dir.join("bad.json");
    std::fs::write(&bad, config(r#""concurrency":0"#, "")).unwrap();
    let bad = bad.to_str().unwrap();
    let r = run(&dir, &["--check-config", bad]);
    assert_fails_with(&r, &["pools.p.concurrency"]);

    // One file a run: a second one (say from `conf/*.json`) is refused, not
    // left unchecked behind a "valid" for the first.
    let r = run(&dir, &["--check-config", &path, bad]);
    assert_fails_with(&r, &["unknown argument", "bad.json"]);
    assert_eq!(r.status.code(), Some(2));
    let r = run(&dir, &["--check-config", &path, "--check-config", bad]);
    assert_fails_with(&r, &["--check-config is given twice"]);
    let r = run(&dir, &["--check-config", &path, "--listen", "127.0.0.1:0"]);
    assert_fails_with(&r, &["--check-config checks one file"]);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

#[test]
fn help_explains_the_flags() {
    let dir = scratch_dir();
    for flag in ["--help", "-h"] {
        let r = run(&dir, &[flag]);
        assert!(r.status.success(), "{flag}: {}", r.status);
        for needle in ["--config", "--listen", "--check-config", "RUST_LOG"] {
            assert!(r.stdout.contains(needle), "{flag} output lacks {needle}:\n{}", r.stdout);
        }
    }
}

/// `RUST_LOG` set but empty (`Environment=RUST_LOG=` in a unit) is the
/// default filter, `info`, not env_logger's errors only: the start-up's
/// lines and every warning are written.
#[test]
fn an_empty_rust_log_logs_at_the_default_level() {
    for empty in ["", " "] {
        let s = TestServer::start_logged(&config("", ""), empty);
        common::eventually("the start-up's info line", || s.log().contains("INFO  nthpool::server] listening on"));
    }
}

/// Flags that would silently override each other, or a `--listen` the file
/// already gives its admin listener, stop the start with a clear message.
#[test]
fn a_flag_given_twice_or_a_clashing_listen_is_refused() {
    let dir = scratch_dir();
    let path = write_config(&dir, &config("", "").replace("127.0.0.1:0", "127.0.0.1:7999"));
    let r = run(&dir, &["--config", &path, "--config", &path]);
    assert_fails_with(&r, &["--config is given twice"]);
    let r = run(&dir, &["--listen", "127.0.0.1:0", "--config", &path, "--listen", "127.0.0.1:1"]);
    assert_fails_with(&r, &["--listen is given twice"]);
    let r = run(&dir, &["--config", &path, "--listen", "127.0.0.1:7999"]);
    assert_fails_with(&r, &["--listen 127.0.0.1:7999", "adminListen", "`listen` address too"]);
}

/// A slot secret others can read (whoever reads it can forge ids that a
/// successor re-adopts) is used, with a warning naming the fix.
#[test]
fn a_slot_secret_readable_by_others_is_warned_about() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch_dir();
    let secret = dir.join("nthpool.secret");
    std::fs::write(&secret, [7u8; 32]).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(dir.join("config.json"), config("", "")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .args(["--config", "config.json", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stderr).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(PATIENCE).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("can be read by others (mode 644)") && line.contains("chmod 600"), "{line}");
}

/// With fewer descriptors than `maxConnections` needs, the cap is lowered to
/// what they allow, and said so: a client over it gets the `503` of the cap,
/// and health checks are still answered, instead of the server running out
/// of descriptors.
#[test]
fn a_descriptor_limit_under_max_connections_lowers_the_cap_instead_of_running_out() {
    let s = TestServer::start_with_fd_limit(&config("", ""), 300);
    let log = s.log();
    assert!(log.contains("maxConnections is 10000, but 300 open descriptors allow about 156"), "{log}");
    let mut held: Vec<TcpStream> = (0..156).map(|_| s.connect()).collect();
    eventually(&s, "every allowed connection accepted", |m| m.value("nthpool_connections_open", &[]) >= 157.0);
    let mut over = s.connect();
    over.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    let r = read_response(&mut over).expect("the connection over the cap is answered");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(s.get_admin("/healthz").status, 200);
    // The connections within the cap are served as ever.
    let c = held.last_mut().unwrap();
    c.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    assert_eq!(read_response(c).expect("an answer").status, 200);
    // Said once: a reload that leaves the cap as it was says nothing more,
    // one that changes it says the new one.
    let said = |log: &str| log.matches("open descriptors allow").count();
    s.reload(&config("", ""));
    assert_eq!(said(&s.log()), 1, "{}", s.log());
    s.reload(&config("", r#""maxConnections":5000"#));
    let log = s.log();
    assert_eq!(said(&log), 2, "{log}");
    assert!(log.contains("maxConnections is 5000, but 300 open descriptors allow about 156"), "{log}");
}

#[test]
fn out_of_descriptors_a_health_check_is_accepted_first_once_some_are_free() {
    let mut s = TestServer::start_logged(&config("", ""), "warn");
    // Few descriptors for the running server (util-linux's prlimit).
    let limited = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", s.pid()))
        .arg("--nofile=48:48")
        .status()
        .is_ok_and(|status| status.success());
    assert!(limited, "prlimit could not lower the server's descriptor limit");
    // More public connections than it can take: the rest wait in the backlog,
    // and accepting pauses (EMFILE) instead of spinning.
    let mut public: Vec<TcpStream> = (0..80).map(|_| s.connect()).collect();
    thread::sleep(Duration::from_millis(300));
    let mut health = TcpStream::connect(admin(&s)).unwrap();
    health.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    health.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    thread::sleep(Duration::from_millis(300));
    // Ten descriptors come free; the public backlog holds many more than ten
    // connections, but the health check is taken before them.
    public.drain(..10);
    let r = read_response(&mut health).expect("the health check was never accepted");
    assert_eq!(r.status, 200, "{r:?}");
    // Accepting failed after every 100-ms pause, but says so once in 10 s.
    let log = s.log();
    assert_eq!(log.matches("accept failed").count(), 1, "{log}");
    // The failures left out since are counted, here by the stop.
    drop(public);
    s.signal("TERM");
    let status = exit_within(&mut s.child, Duration::from_secs(10)).expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    let log = s.log();
    let counted = log.split("failed accepts have stopped (").nth(1).and_then(|rest| rest.split(' ').next());
    assert!(counted.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n >= 1), "{log}");
}
