//! Crashes and failover lose no slot (SPEC §11), over real sockets: a server
//! killed with `kill -9` and started again, or a standby sharing its slot
//! secret, re-adopts the slots their holders still renew, refuses new grants
//! for one term, and never takes a tampered, forged or foreign id.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{config, eventually, post, read_response, Response, Scratch, TestServer, KEY};
use upstream::{exchange, ok, proxied, MockUpstream, HOST};

const POOL: &str = r#""concurrency":3,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000"#;

/// The value of one sample (`name{labels}` exactly as exposed) in `/metrics`.
fn metric(s: &TestServer, series: &str) -> u64 {
    s.metric(series).unwrap_or_else(|| panic!("no {series}")) as u64
}

/// Stops `s` with `signal`, waits for it to exit, and keeps its directory
/// (config, slot secret, snapshot) and its configuration file.
fn stop(mut s: TestServer, signal: &str) -> (Scratch, PathBuf) {
    s.signal(signal);
    let status = s.child.wait().unwrap();
    if signal != "KILL" {
        assert!(status.success(), "a graceful stop exits 0: {status}");
    }
    let config_path = s.config_path.clone();
    (s.into_dir(), config_path)
}

fn kill_9(s: TestServer) -> (Scratch, PathBuf) {
    stop(s, "KILL")
}

/// A server started again in the directory `stop` kept, which it now owns.
fn restart((dir, config_path): (Scratch, PathBuf)) -> TestServer {
    TestServer::start_with(dir, config_path, &[])
}

#[test]
fn kill_9_readopts_renewing_holders_and_never_over_admits() {
    let first = TestServer::start(&config(POOL, ""));
    assert_eq!(first.get_admin("/healthz").json()["status"], "ok", "a first start opens no window");
    let slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
    let kept = kill_9(first);
    let s = restart(kept);
    let started = Instant::now();

    // In the window: fail-fast acquires wait for the old holders.
    let denied = s.acquire("", "");
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-nthpool-deny-reason"), Some("recovering"));
    assert!((1..=2).contains(&denied.header_u64("Retry-After")), "{denied:?}");
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 1);

    // Two holders come back: one renews, one releases; the third vanished.
    assert_eq!(s.renew(&slots[0]).status, 200);
    assert_eq!(s.release(&slots[1], "").json()["released"], true);
    assert_eq!(s.release(&slots[1], "").json()["released"], false, "a released slot is not adopted again");
    assert_eq!(s.renew(&slots[1]).status, 404);
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 2);

    // A waiter queued in the window is granted when it ends.
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":10000}"#)).unwrap();
    // The holder keeps renewing at its interval meanwhile.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(s.renew(&slots[0]).status, 200);
    let granted = read_response(&mut waiter).expect("the waiter's answer");
    assert_eq!(granted.status, 200, "{granted:?}");
    assert!(started.elapsed() >= Duration::from_millis(1000), "granted only after the window");
    // Pool `other` (default 30 s term) is still in its window; `p` is not.
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 0);

    // Held now: the renewed old slot and the waiter's; the vanished one is not
    // counted but can no longer come back, so one grant is left, then none.
    assert_eq!(s.renew(&slots[0]).status, 200);
    assert_eq!(s.renew(&slots[2]).status, 404, "outside the window an unknown slot is gone");
    assert_eq!(s.acquire("", "").status, 200);
    let full = s.acquire("", "");
    assert_eq!((full.status, full.header("x-nthpool-deny-reason")), (429, Some("concurrency")));
    assert_eq!(s.release(&slots[0], "").json()["released"], true);
    assert_eq!(s.acquire("", "").status, 200);
}

#[test]
fn a_readopted_holder_that_stops_renewing_is_reclaimed_at_its_term() {
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let s = restart(kill_9(first));
    assert_eq!(s.renew(&slot).status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&s, "nthpool_reclaims_total{pool=\"p\",cause=\"term\"}") == 0 {
        assert!(Instant::now() < deadline, "the re-adopted lease was never reclaimed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.renew(&slot).status, 404);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 0);
}

#[test]
fn a_standby_sharing_the_secret_takes_over_on_another_port() {
    let primary = TestServer::start(&config(POOL, ""));
    let slot = primary.acquire("", "").slot();
    let standby_dir = common::scratch_dir();
    std::fs::copy(primary.dir.join("nthpool.secret"), standby_dir.join("nthpool.secret")).unwrap();
    let standby_config = standby_dir.join("config.json");
    std::fs::write(&standby_config, config(POOL, "")).unwrap();
    let standby = TestServer::start_with(standby_dir, standby_config, &[]);
    assert_ne!(standby.addr, primary.addr);
    drop(kill_9(primary));

    assert_eq!(standby.renew(&slot).status, 200, "the standby re-adopts the primary's slot");
    assert_eq!(standby.release(&slot, "").json()["released"], true);
    assert_eq!(metric(&standby, "nthpool_readopted_total{pool=\"p\"}"), 1);
}

const MOVED: &str = "X-Nthpool-Moved: n1\r\n";

/// A pool `p` (limit 2) that also proxies `HOST` to `upstream`, with `access` members.
fn moved_pool(upstream: &MockUpstream, access: &str) -> String {
    let pool = format!(
        r#""concurrency":2,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000,
        "upstream":{{"url":"{}","hosts":["{HOST}"]}},"access":{{{access}}}"#,
        upstream.url()
    );
    config(&pool, "")
}

fn recovering(r: &Response) -> bool {
    r.status == 429 && r.header("x-nthpool-deny-reason") == Some("recovering")
}

#[test]
fn only_a_trusted_proxy_can_say_a_pool_moved() {
    let upstream = MockUpstream::start(|_| ok("{}", ""));
    let proxied_moved = proxied("GET", "/v1/x", &format!("{MOVED}X-Nthpool-No-Queue: 1\r\n"), "");
    // From a peer that is not a trusted proxy the field changes nothing.
    let s = TestServer::start(&moved_pool(&upstream, r#""trustedProxies":["10.0.0.1/32"]"#));
    for _ in 0..3 {
        let r = s.acquire(MOVED, "");
        assert_eq!(r.status, 200, "a caller's X-Nthpool-Moved held up a fail-fast acquire: {r:?}");
        assert_eq!(s.release(&r.slot(), "").status, 200);
        let r = exchange(&s, &proxied_moved);
        assert_eq!(r.status, 200, "a caller's X-Nthpool-Moved held up a proxied request: {r:?}");
    }
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 0);
    // From a trusted proxy it opens the pool's window, on either route.
    let s = TestServer::start(&moved_pool(&upstream, r#""trustedProxies":["127.0.0.1/32"]"#));
    let r = exchange(&s, &proxied_moved);
    assert!(recovering(&r), "{r:?}");
    let r = s.acquire("", "");
    assert!(recovering(&r), "{r:?}");
    let s = TestServer::start(&moved_pool(&upstream, r#""trustedProxies":["127.0.0.1/32"]"#));
    let r = s.acquire(MOVED, "");
    assert!(recovering(&r), "{r:?}");
}

/// A head whose target a fresh parse refuses moves no pool, also on a
/// connection that has sent the same header block before (whose request
/// line is then read by comparison, its target checked late).
#[test]
fn a_malformed_target_marked_moved_moves_nothing_on_a_warm_connection() {
    let s = TestServer::start(&format!(
        r#"{{"accessLog":null,"adminListen":"127.0.0.1:0","pools":{{
        "pa":{{"keys":["{KEY}"],"access":{{"trustedProxies":["127.0.0.1/32"]}}}},
        "pb":{{"keys":["{KEY}"],"access":{{"trustedProxies":["127.0.0.1/32"]}}}}}}}}"#
    ));
    let block = format!("Host: h\r\nX-Nthpool-Key: {KEY}\r\n{MOVED}Content-Length: 0\r\n\r\n");
    let mut c = s.connect();
    for _ in 0..3 {
        c.write_all(format!("POST /pools/pa/lock/acquire HTTP/1.1\r\n{block}").as_bytes()).unwrap();
        read_response(&mut c).expect("an answer");
    }
    // The same length as the line before, a quote where a fresh parse refuses one.
    c.write_all(format!("POST /pools/pb/lock/acquir\" HTTP/1.1\r\n{block}").as_bytes()).unwrap();
    let r = read_response(&mut c).expect("an answer");
    assert_eq!((r.status, r.error_code().as_str()), (400, "bad_request"), "{r:?}");
    let r = s.request(&post("/pools/pb/lock/acquire", KEY, "", ""));
    assert_eq!(r.status, 200, "pool pb was taken for moved: {r:?}");
}

/// HAProxy records where a pool lives when the instance it chose answers:
/// a request it moved here is answered at once, a waiting acquire or a
/// proxied request refused as a fail-fast one in the window, so the record
/// names this instance from then on. The first moved request opens the
/// window; those after it extend nothing.
#[test]
fn a_request_moved_here_is_answered_at_once_even_when_it_would_wait() {
    let upstream = MockUpstream::start(|_| ok("{}", ""));
    let s = TestServer::start(&moved_pool(&upstream, r#""trustedProxies":["127.0.0.1/32"]"#));
    let started = Instant::now();
    let r = s.acquire(MOVED, r#"{"waitMs":5000}"#);
    assert!(recovering(&r), "{r:?}");
    let window_s = r.header_u64("retry-after");
    assert!(window_s <= 2, "one term (1.5 s) from the move: {r:?}");
    let r = exchange(&s, &proxied("GET", "/v1/x", &format!("{MOVED}X-Nthpool-Queue-Timeout-Ms: 5000\r\n"), ""));
    assert!(recovering(&r), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "the moved requests waited");
    // A later moved request does not push the window's end back.
    std::thread::sleep(Duration::from_millis(700));
    let r = s.acquire(MOVED, r#"{"waitMs":5000}"#);
    assert!(recovering(&r), "{r:?}");
    assert!(r.header_u64("retry-after") <= 1, "the window was extended: {r:?}");
    // A request not marked moved waits in the window as before.
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":5000}"#)).unwrap();
    let r = read_response(&mut waiter).expect("granted at the window's end");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(1400), "granted before the window ended");
}

/// `X-Nthpool-Pool` from a trusted proxy names the pool it placed the
/// request by. Another pool than the one the request reaches here (a host
/// map older than the configuration) is refused with `421`, the connection
/// closed, before anything is granted, proxied or moved; the right pool, or
/// the field from anyone else, changes nothing.
#[test]
fn a_request_a_trusted_proxy_placed_by_another_pool_is_refused() {
    let upstream = MockUpstream::start(|_| ok("{}", ""));
    let s = TestServer::start(&moved_pool(&upstream, r#""trustedProxies":["127.0.0.1/32"]"#));
    for placed_as in ["X-Nthpool-Pool: other\r\n", "X-Nthpool-Pool:\r\n"] {
        for raw in [post("/pools/p/lock/acquire", KEY, placed_as, ""), proxied("POST", "/v1/x", placed_as, "{}")] {
            let mut c = s.connect();
            c.write_all(&raw).unwrap();
            let r = read_response(&mut c).expect("an answer");
            assert_eq!((r.status, r.json()["error"].as_str()), (421, Some("misdirected_request")), "{r:?}");
            assert_eq!(r.header("connection"), Some("close"), "{r:?}");
            assert!(read_response(&mut c).is_none(), "the connection closes after a 421");
        }
    }
    let moved_elsewhere = proxied("GET", "/v1/x", &format!("X-Nthpool-Pool: other\r\n{MOVED}"), "");
    assert_eq!(exchange(&s, &moved_elsewhere).status, 421);
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 0, "a request placed elsewhere moved nothing here");
    assert_eq!(metric(&s, "nthpool_grants_total{pool=\"p\"}"), 0);
    assert_eq!(metric(&s, "nthpool_rejections_total{pool=\"p\",code=\"421\"}"), 5);
    assert!(upstream.seen().is_empty(), "no misdirected request reached the upstream");
    // The pool it reaches here: served, on both routes.
    let r = s.acquire("X-Nthpool-Pool: p\r\n", "");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(s.release(&r.slot(), "").status, 200);
    assert_eq!(exchange(&s, &proxied("GET", "/v1/x", "X-Nthpool-Pool: p\r\n", "")).status, 200);
    // Sent twice, which copy counts would be a guess.
    let twice = s.acquire("X-Nthpool-Pool: p\r\nX-Nthpool-Pool: p\r\n", "");
    assert_eq!(twice.status, 400, "{twice:?}");
    // From a peer that is not a trusted proxy the field changes nothing.
    let s = TestServer::start(&moved_pool(&upstream, r#""trustedProxies":["10.0.0.1/32"]"#));
    let r = s.acquire("X-Nthpool-Pool: other\r\n", "");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(exchange(&s, &proxied("GET", "/v1/x", "X-Nthpool-Pool: other\r\n", "")).status, 200);
}

#[test]
fn tampered_forged_and_other_pool_ids_are_refused_and_never_adopted() {
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let stranger = TestServer::start(&config(POOL, ""));
    let forged = stranger.acquire("", "").slot();
    let s = restart(kill_9(first));

    let mut tampered = slot.clone().into_bytes();
    tampered[20] = if tampered[20] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_eq!(s.renew(&tampered).status, 404, "tampered");
    assert_eq!(s.renew(&forged).status, 404, "signed under another secret");
    assert_eq!(s.renew(&"A".repeat(56)).status, 404, "made up");
    let other = s.request(&post(&format!("/pools/other/lock/{slot}/renew"), "other-key", "", ""));
    assert_eq!(other.status, 404, "another pool's route");
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 0);
    // The genuine id is still adoptable afterwards.
    assert_eq!(s.renew(&slot).status, 200);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 1);
}

/// A concurrency refusal reported while two calls were in flight: the pool
/// learns a limit of 2 (of 3).
const REFUSED: &str = r#"{"status":429}"#;

#[test]
fn a_graceful_restart_keeps_held_slots_and_what_was_learned_with_no_window() {
    let first = TestServer::start(&config(POOL, ""));
    let slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
    assert_eq!(first.release(&slots[2], REFUSED).json()["released"], true);
    let learned = first.acquire("", "");
    assert_eq!((learned.status, learned.header("x-nthpool-effective-limit")), (429, Some("2")), "{learned:?}");
    let kept = stop(first, "TERM");
    let state = kept.0.join("nthpool.state");
    assert!(state.exists(), "the stop left a snapshot");

    let s = restart(kept);
    assert!(!state.exists(), "a snapshot is used once");
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok", "no window after a graceful stop");
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 0);
    // The two held slots are known at once (not re-adopted) and still count.
    let full = s.acquire("", "");
    assert_eq!((full.status, full.header("x-nthpool-deny-reason")), (429, Some("concurrency")), "{full:?}");
    assert_eq!(full.header("x-nthpool-effective-limit"), Some("2"), "the learned limit is kept");
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 2);
    assert_eq!(s.renew(&slots[0]).status, 200);
    assert_eq!(s.release(&slots[1], "").json()["released"], true);
    assert_eq!(s.release(&slots[2], "").json()["released"], false, "a slot released before the stop stays released");
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0);
    assert_eq!(s.acquire("", "").status, 200);
    // The counters go on from where the stop left them.
    assert_eq!(metric(&s, "nthpool_grants_total{pool=\"p\"}"), 4);
    assert_eq!(metric(&s, "nthpool_denials_total{pool=\"p\",reason=\"concurrency\"}"), 2);
    // A crash now finds no snapshot: the window opens.
    let s = restart(kill_9(s));
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
}

#[test]
fn the_dashboard_charts_none_of_the_counts_a_snapshot_brings_back() {
    // The default 30-s term: the slots are still held at the first sample.
    let first = TestServer::start(&config(r#""concurrency":3"#, ""));
    let _slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
    assert_eq!(first.acquire("", "").status, 429);
    let s = restart(stop(first, "TERM"));
    assert_eq!(metric(&s, "nthpool_grants_total{pool=\"p\"}"), 3, "the counters go on");
    let mut history = serde_json::Value::Null;
    eventually("a second sampled after the restart", || {
        history = s.get_admin("/api/pools/p").json()["history"].clone();
        history["held"].as_array().is_some_and(|held| !held.is_empty())
    });
    let sum = |series: &str| history[series].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("grants"), sum("deniedConcurrency")), (0, 0), "nothing happened since the start: {history}");
    assert_eq!(history["held"][0], 3, "the held slots are charted: {history}");
}

#[test]
fn an_idempotency_key_names_its_held_slot_across_a_graceful_restart() {
    let first = TestServer::start(&config(POOL, ""));
    let granted = first.acquire("Idempotency-Key: order-42\r\n", "");
    let released = first.acquire("Idempotency-Key: order-43\r\n", "").slot();
    assert_eq!(first.release(&released, "").json()["released"], true);
    let s = restart(stop(first, "TERM"));

    let retry = s.acquire("Idempotency-Key: order-42\r\n", "");
    assert_eq!(retry.slot(), granted.slot(), "the retry after the restart gets the same slot: {retry:?}");
    assert_eq!(retry.json()["requestDeadline"], granted.json()["requestDeadline"]);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 1, "no second slot");
    assert_eq!(metric(&s, "nthpool_idempotent_replays_total{pool=\"p\"}"), 1);
    // A key whose lease ended before the stop takes a new slot.
    assert_ne!(s.acquire("Idempotency-Key: order-43\r\n", "").slot(), released);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 2);
    // The restored key expires with its lease.
    assert_eq!(s.release(&granted.slot(), "").json()["released"], true);
    assert_ne!(s.acquire("Idempotency-Key: order-42\r\n", "").slot(), granted.slot());
}

#[test]
fn a_corrupt_or_mismatched_snapshot_is_refused_and_the_crash_path_taken() {
    for spoil in ["corrupt", "other config", "other secret"] {
        let first = TestServer::start(&config(POOL, ""));
        let slot = first.acquire("", "").slot();
        let kept = stop(first, "TERM");
        let state = kept.0.join("nthpool.state");
        match spoil {
            "corrupt" => {
                let mut bytes = std::fs::read(&state).unwrap();
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x20;
                std::fs::write(&state, bytes).unwrap();
            }
            "other config" => std::fs::write(&kept.1, config(&POOL.replace("3", "4"), "")).unwrap(),
            _ => {
                // A snapshot another instance (another secret) wrote.
                let stranger = TestServer::start(&config(POOL, ""));
                let stranger_kept = stop(stranger, "TERM");
                std::fs::copy(stranger_kept.0.join("nthpool.state"), &state).unwrap();
            }
        }
        let s = restart(kept);
        assert_eq!(s.get_admin("/healthz").json()["status"], "recovering", "{spoil}");
        assert_eq!(s.acquire("", "").header("x-nthpool-deny-reason"), Some("recovering"), "{spoil}");
        // The holder is re-adopted from its id instead.
        assert_eq!(s.renew(&slot).status, 200, "{spoil}");
        assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 1, "{spoil}");
    }
}

#[test]
fn a_refused_snapshot_is_set_aside_and_never_loaded_by_a_later_start() {
    // A deploy changes a limit: the stop snapshot is refused, the window opens
    // and the new process grants slots. It crashes and the old configuration
    // is rolled back: the old snapshot must not come back as a stop's (no
    // window) while the crashed process's holders still hold their slots.
    let first = TestServer::start(&config(POOL, ""));
    first.acquire("", "").slot();
    let kept = stop(first, "TERM");
    let state = kept.0.join("nthpool.state");
    std::fs::write(&kept.1, config(&POOL.replace("3", "4"), "")).unwrap();
    let deployed = restart(kept);
    assert_eq!(deployed.get_admin("/healthz").json()["status"], "recovering");
    assert!(!state.exists(), "the refused snapshot was left where a later start finds it");
    assert!(deployed.dir.join("nthpool.state.refused").exists(), "kept aside for a look");
    let kept = kill_9(deployed);
    std::fs::write(&kept.1, config(POOL, "")).unwrap();
    let s = restart(kept);
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering", "a crash takes the crash path");
    assert_eq!(s.acquire("", "").header("x-nthpool-deny-reason"), Some("recovering"));
}

#[test]
fn a_deploy_that_lowers_the_term_waits_for_the_old_holders_to_renew() {
    // Holders of the old process renew every 2 s (term 6 s); the new
    // configuration's term is 1 s, and it turns learning off, so the
    // snapshot is refused. Its window must last until the leases the
    // refused snapshot holds would end, or their holders find a full pool.
    let old_pool = r#""concurrency":1,"termMs":6000,"renewIntervalMs":2000"#;
    let first = TestServer::start(&config(old_pool, ""));
    let slot = first.acquire("", "").slot();
    let kept = stop(first, "TERM");
    let new_pool = r#""concurrency":1,"termMs":1000,"renewIntervalMs":300,"adaptive":false"#;
    std::fs::write(&kept.1, config(new_pool, "")).unwrap();
    let s = restart(kept);
    std::thread::sleep(Duration::from_millis(1300));
    let denied = s.acquire("", "");
    assert_eq!(denied.header("x-nthpool-deny-reason"), Some("recovering"), "{denied:?}");
    assert_eq!(s.renew(&slot).status, 200, "the old holder is re-adopted past the new term");
    assert_eq!(s.acquire("", "").status, 429, "its slot counts");
}

#[test]
fn a_pool_a_crash_restarted_without_is_named_again_with_its_window() {
    // A crash while pool p holds every slot, then a start whose
    // configuration leaves p out (its holders are refused meanwhile), then
    // a reload that names p again while their leases may still live: p
    // opens its window as the start would have, so its old holders come back
    // before anything is granted in their places. A pool never seen before
    // starts afresh.
    let pool = r#""concurrency":2,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000"#;
    let first = TestServer::start(&config(pool, ""));
    let slots: Vec<String> = (0..2).map(|_| first.acquire("", "").slot()).collect();
    let kept = kill_9(first);
    let without_p = r#"{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{"other":{"keys":["other-key"]}}}"#;
    std::fs::write(&kept.1, without_p).unwrap();
    let s = restart(kept);
    assert_eq!(s.renew(&slots[0]).status, 401, "no pool p here yet");
    let fresh = r#""fresh":{"keys":["fresh-key"],"concurrency":1}"#;
    s.reload(&config(pool, "").replacen(r#""other":"#, &format!(r#"{fresh},"other":"#), 1));
    let denied = s.acquire("", "");
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-nthpool-deny-reason"), Some("recovering"), "{denied:?}");
    assert_eq!(s.renew(&slots[0]).status, 200, "the old holder is re-adopted");
    assert_eq!(s.release(&slots[1], "").json()["released"], true);
    let raw = post("/pools/fresh/lock/acquire", "fresh-key", "", "");
    assert_eq!(s.request(&raw).status, 200, "a pool no process had before opens no window");
    // Once the window ends, the re-adopted slot counts against the limit.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(s.renew(&slots[0]).status, 200, "the holder renews on its interval");
    }
    assert_eq!(s.acquire("", "").status, 200);
    assert_eq!(s.acquire("", "").status, 429, "the holder's slot and one new grant fill the pool");
}

#[test]
fn a_restart_that_lowers_the_limit_revokes_no_held_slot() {
    // Three holders of a pool of 3; a deploy (a graceful stop, whose
    // snapshot the lowered limit refuses) or a crash, then a start with a
    // limit of 1. A lowered limit never revokes a held slot: each holder
    // renews and releases as before, and a new grant waits for `held` to
    // fall under the new limit.
    for crash in [false, true] {
        let first = TestServer::start(&config(POOL, ""));
        let slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
        let kept = if crash { kill_9(first) } else { stop(first, "TERM") };
        let lowered = r#""concurrency":1,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000"#;
        std::fs::write(&kept.1, config(lowered, "")).unwrap();
        let s = restart(kept);
        for slot in &slots {
            assert_eq!(s.renew(slot).status, 200, "crash {crash}: every old holder is re-adopted");
        }
        assert_eq!(metric(&s, r#"nthpool_slots_held{pool="p"}"#), 3, "crash {crash}");
        for slot in &slots[1..] {
            assert_eq!(s.release(slot, "").json()["released"], true, "crash {crash}");
        }
        assert_eq!(s.renew(&slots[0]).status, 200, "crash {crash}");
        assert_eq!(s.acquire("", "").status, 429, "crash {crash}: held is at the new limit");
    }
}

#[test]
fn a_window_a_graceful_restart_carries_over_still_waits_for_every_old_holder() {
    // A crash, a start with the limit lowered from 3 to 1, one holder
    // re-adopted, then a graceful restart in the window: the other two
    // holders are still re-adopted by the window the snapshot carried.
    let first = TestServer::start(&config(POOL, ""));
    let slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
    let kept = kill_9(first);
    let lowered = r#""concurrency":1,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000"#;
    std::fs::write(&kept.1, config(lowered, "")).unwrap();
    let s = restart(kept);
    assert_eq!(s.renew(&slots[0]).status, 200);
    let s = restart(stop(s, "TERM"));
    assert_eq!(s.acquire("", "").header("x-nthpool-deny-reason"), Some("recovering"));
    for slot in &slots {
        assert_eq!(s.renew(slot).status, 200, "every old holder is held");
    }
    assert_eq!(metric(&s, r#"nthpool_slots_held{pool="p"}"#), 3);
}

/// A crash after `termMs` was lowered (by a reload, or by a graceful
/// deploy whose snapshot restored the old leases): the leases granted
/// before keep their old, longer term and renew at its cadence until their
/// request caps. The crash path's window must last that old term, or it
/// ends before they come back and their places are granted twice.
#[test]
fn a_crash_after_the_term_was_lowered_waits_for_the_old_term() {
    let old_pool = r#""concurrency":2,"termMs":6000,"renewIntervalMs":2000"#;
    let new_pool = r#""concurrency":2,"termMs":1000,"renewIntervalMs":300"#;
    for how in ["reload", "deploy"] {
        let first = TestServer::start(&config(old_pool, ""));
        let slots: Vec<String> = (0..2).map(|_| first.acquire("", "").slot()).collect();
        let lowered = match how {
            "reload" => {
                first.reload(&config(new_pool, ""));
                first
            }
            _ => {
                let kept = stop(first, "TERM");
                std::fs::write(&kept.1, config(new_pool, "")).unwrap();
                restart(kept)
            }
        };
        let s = restart(kill_9(lowered));
        // Past the new term, inside the old one: the old holders have not
        // had to renew yet, so nothing is granted in their places.
        std::thread::sleep(Duration::from_millis(1300));
        let denied = s.acquire("", "");
        assert_eq!(
            (denied.status, denied.header("x-nthpool-deny-reason")),
            (429, Some("recovering")),
            "{how}: {denied:?}"
        );
        for slot in &slots {
            assert_eq!(s.renew(slot).status, 200, "{how}: the old holder is re-adopted");
        }
        assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 2, "{how}: both places held");
    }
}

/// The terms record in `<stateFile>.lock` grows with the pools (about
/// 130 bytes each after a reload lowered their terms): one of megabytes is
/// read whole, and one that cannot be read is named in the log.
#[test]
fn a_crash_after_the_term_was_lowered_waits_for_the_old_term_however_many_pools_there_are() {
    let old_pool = r#""concurrency":2,"termMs":6000,"renewIntervalMs":2000"#;
    let new_pool = r#""concurrency":2,"termMs":1000,"renewIntervalMs":300"#;
    let first = TestServer::start(&config(old_pool, ""));
    let slots: Vec<String> = (0..2).map(|_| first.acquire("", "").slot()).collect();
    first.reload(&config(new_pool, ""));
    let kept = kill_9(first);
    // Other pools' terms, as 12 000 pools after such a reload leave them.
    let lock = kept.0.join("nthpool.state.lock");
    let mut record: serde_json::Value = serde_json::from_slice(&std::fs::read(&lock).unwrap()).unwrap();
    let until = unix_ms() + 60_000;
    let pools = record["pools"].as_object_mut().unwrap();
    for i in 0..12_000 {
        let terms = serde_json::json!([
            {"termMs": 6000, "untilUnixMs": until, "requestTimeoutMs": 60000},
            {"termMs": 1000, "untilUnixMs": 0, "requestTimeoutMs": 60000}
        ]);
        pools.insert(format!("tenant-{i:05}"), terms);
    }
    let text = serde_json::to_vec(&record).unwrap();
    assert!(text.len() > 1 << 20, "a record over 1 MiB: {} bytes", text.len());
    std::fs::write(&lock, text).unwrap();
    let s = TestServer::start_with_logged(kept.0, kept.1, "warn");
    std::thread::sleep(Duration::from_millis(1300));
    let denied = s.acquire("", "");
    assert_eq!((denied.status, denied.header("x-nthpool-deny-reason")), (429, Some("recovering")), "{denied:?}");
    for slot in &slots {
        assert_eq!(s.renew(slot).status, 200, "the old holder is re-adopted");
    }
    assert!(s.log().contains("pool `p`: its window lasts"), "{}", s.log());
    // A record that cannot be read is said to be so.
    let kept = kill_9(s);
    std::fs::write(kept.0.join("nthpool.state.lock"), b"{\"pools\":{\"p\":[{\"termMs\":6000,").unwrap();
    let s = TestServer::start_with_logged(kept.0, kept.1, "warn");
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
    let log = s.log();
    assert!(log.contains("nthpool.state.lock cannot be read") && log.contains("not a record of lease terms"), "{log}");
}

/// A `stateFile` that is a symbolic link stands for the file it leads to: a
/// second process naming that file is refused while the first runs, the
/// stop snapshot is written there (the link stays a link), and the
/// snapshot, once used, is gone from there, so a later crash takes the crash path.
#[test]
fn a_state_file_named_through_a_symbolic_link_is_the_file_it_leads_to() {
    let dir = common::scratch_dir();
    std::fs::create_dir(dir.join("real")).unwrap();
    std::os::unix::fs::symlink("real/nthpool.state", dir.join("link.state")).unwrap();
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config(POOL, r#""stateFile":"link.state""#)).unwrap();
    let s = TestServer::start_with(dir, config_path, &[]);
    let slot = s.acquire("", "").slot();
    let other = common::scratch_dir();
    let target = s.dir.join("real/nthpool.state");
    std::fs::write(other.join("config.json"), config(POOL, &format!(r#""stateFile":"{}""#, target.display()))).unwrap();
    let second = common::run(&other, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert!(second.stderr.contains("is in use by another running nthpool"), "{}", second.stderr);
    let (dir, config_path) = stop(s, "TERM");
    assert!(dir.join("link.state").symlink_metadata().unwrap().file_type().is_symlink(), "the link was replaced");
    assert!(dir.join("real/nthpool.state").exists(), "the stop snapshot, where the link leads");
    let s = TestServer::start_with(dir, config_path, &[]);
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok", "restored from the stop snapshot");
    assert!(!s.dir.join("real/nthpool.state").exists(), "a snapshot used once stays where a later start finds it");
    let s = restart(kill_9(s));
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering", "a crash takes the crash path");
    assert_eq!(s.renew(&slot).status, 200, "the holder, re-adopted");
}

/// A `stateFile` link pointed elsewhere while the server runs, with no
/// reload: the stop snapshot goes where the lock is held, and the log says
/// the name now leads elsewhere.
#[test]
fn a_state_file_link_repointed_without_a_reload_is_warned_of_at_the_stop() {
    let dir = common::scratch_dir();
    for d in ["a", "b"] {
        std::fs::create_dir(dir.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("a/nthpool.state", dir.join("link.state")).unwrap();
    std::fs::write(dir.join("config.json"), config(POOL, r#""stateFile":"link.state""#)).unwrap();
    let config_path = dir.join("config.json");
    let s = TestServer::start_with_logged(dir, config_path, "warn");
    s.acquire("", "").slot();
    std::fs::remove_file(s.dir.join("link.state")).unwrap();
    std::os::unix::fs::symlink("b/nthpool.state", s.dir.join("link.state")).unwrap();
    let (dir, _) = stop(s, "TERM");
    assert!(dir.join("a/nthpool.state").exists(), "the stop snapshot, where the lock is held");
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert!(log.contains("now leads elsewhere"), "{log}");
}

/// A `stateFile` whose links lead round in a loop names no file: refused
/// at start and by `--check-config`, not taken for one that cannot be read.
#[test]
fn a_state_file_that_is_a_loop_of_links_is_refused() {
    let dir = common::scratch_dir();
    std::os::unix::fs::symlink("b.state", dir.join("a.state")).unwrap();
    std::os::unix::fs::symlink("a.state", dir.join("b.state")).unwrap();
    std::fs::write(dir.join("config.json"), config(POOL, r#""stateFile":"a.state""#)).unwrap();
    for args in [&["--check-config", "config.json"][..], &["--config", "config.json", "--listen", "127.0.0.1:0"]] {
        let run = common::run(&dir, args);
        assert!(run.stderr.contains("is a loop of symbolic links"), "{args:?}: {}", run.stderr);
        assert!(!run.status.success(), "{args:?}");
    }
    assert!(dir.join("a.state").symlink_metadata().unwrap().file_type().is_symlink(), "the link was replaced");
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The old term and renewal interval, and a new term shorter than that interval.
const T1: u64 = 2000;
const R1: u64 = 600;
const T2: u64 = 200;

/// A holder of the one slot of `p` granted with a term of `T1` and told to
/// renew every `R1` ms goes on doing so across a graceful restart into a
/// configuration whose term is `T2`; `lower` changes the configuration (a
/// reload before the stop, or a new file while stopped) and restarts.
fn a_holder_renews_on_its_old_interval_across_a_restart(lower: impl FnOnce(TestServer, &str) -> TestServer) {
    let old = format!(r#""concurrency":1,"termMs":{T1},"renewIntervalMs":{R1}"#);
    let new = format!(r#""concurrency":1,"termMs":{T2},"renewIntervalMs":50"#);
    let first = TestServer::start(&config(&old, ""));
    let granted = first.acquire("", "");
    assert_eq!((granted.json()["termMs"].as_u64(), granted.json()["renewIntervalMs"].as_u64()), (Some(T1), Some(R1)));
    let slot = granted.slot();
    let mut last = Instant::now();
    let s = lower(first, &config(&new, ""));
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok", "restored from the snapshot: no window");
    for renewal in 0..4 {
        // Every R1 from the last renewal (the grant, before the restart).
        std::thread::sleep(Duration::from_millis(R1).saturating_sub(last.elapsed()));
        last = Instant::now();
        let before = unix_ms();
        let renewed = s.renew(&slot);
        assert_eq!(renewed.status, 200, "renewal {renewal}: {renewed:?}");
        let deadline = renewed.json()["leaseDeadline"].as_u64().unwrap();
        assert!(
            deadline + 50 >= before + T1,
            "renewal {renewal} extended by less than its term: {deadline} from {before}"
        );
        let second = s.acquire("", "");
        assert_eq!(second.header("x-nthpool-deny-reason"), Some("concurrency"), "renewal {renewal}: {second:?}");
    }
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0, "known from the snapshot");
    assert_eq!(s.release(&slot, "").json()["released"], true);
    assert_eq!(s.acquire("", "").json()["termMs"].as_u64(), Some(T2), "new grants take the new term");
}

#[test]
fn a_lease_keeps_its_term_across_a_graceful_restart_after_a_reload_lowered_it() {
    a_holder_renews_on_its_old_interval_across_a_restart(|s, lowered| {
        s.reload(lowered);
        restart(stop(s, "TERM"))
    });
}

#[test]
fn a_lease_keeps_its_term_across_a_graceful_restart_into_a_configuration_that_lowers_it() {
    a_holder_renews_on_its_old_interval_across_a_restart(|s, lowered| {
        let kept = stop(s, "TERM");
        std::fs::write(&kept.1, lowered).unwrap();
        restart(kept)
    });
}

#[test]
fn a_lost_secret_with_a_snapshot_left_still_opens_the_window() {
    // The snapshot says a process ran here: its holders get one term to be
    // told `404` before anything is granted anew (README, What survives
    // which failure: "Secret lost or replaced").
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let kept = stop(first, "TERM");
    std::fs::remove_file(kept.0.join("nthpool.secret")).unwrap();
    let s = restart(kept);
    assert_eq!(std::fs::read(s.dir.join("nthpool.secret")).unwrap().len(), 32, "a new secret");
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
    assert_eq!(s.acquire("", "").header("x-nthpool-deny-reason"), Some("recovering"));
    assert_eq!(s.renew(&slot).status, 404, "signed under the lost secret");
}

/// A crash, and the secret lost too: no snapshot says a process ran here,
/// but the lease terms it wrote into the state file's lock do. Its holders
/// get one term to be told `404` before anything is granted anew.
#[test]
fn a_lost_secret_after_a_crash_still_opens_the_window() {
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let kept = kill_9(first);
    std::fs::remove_file(kept.0.join("nthpool.secret")).unwrap();
    let s = restart(kept);
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
    assert_eq!(s.acquire("", "").header("x-nthpool-deny-reason"), Some("recovering"));
    assert_eq!(s.renew(&slot).status, 404, "signed under the lost secret");
}

#[test]
fn a_periodic_snapshot_restores_after_a_crash_but_the_window_still_opens() {
    // Long terms: the slots must outlive the wait for the snapshot.
    let pool = r#""concurrency":3,"termMs":20000,"renewIntervalMs":5000"#;
    let first = TestServer::start(&config(pool, r#""snapshotIntervalMs":1000"#));
    let slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
    assert_eq!(first.release(&slots[2], REFUSED).json()["released"], true);
    let state = first.dir.join("nthpool.state");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !state.exists() {
        assert!(Instant::now() < deadline, "no periodic snapshot was written");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let one more period pass so the snapshot has seen the release.
    std::thread::sleep(Duration::from_millis(1500));
    let s = restart(kill_9(first));
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
    let denied = s.acquire("", "");
    assert_eq!(denied.header("x-nthpool-deny-reason"), Some("recovering"));
    assert_eq!(denied.header("x-nthpool-effective-limit"), Some("2"), "the learned limit is restored");
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 2, "the slots the snapshot knew are held");
    assert_eq!(s.renew(&slots[0]).status, 200);
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0, "known from the snapshot, not re-adopted");
    // Its counters are older than the last scrape may have been: they start
    // again from zero (a reset), never from a smaller count.
    assert_eq!(metric(&s, "nthpool_grants_total{pool=\"p\"}"), 0);
    assert_eq!(metric(&s, "nthpool_renewals_total{pool=\"p\",outcome=\"renewed\"}"), 1);
}

#[test]
fn a_slot_released_after_the_periodic_snapshot_never_renews_over_the_limit_after_a_crash() {
    // `a` (under a key) and `b` are in the snapshot; then `a` is released
    // and `c` granted in its place, and the process dies. `b` and `c` renew
    // and fill the pool: `a`'s stale renewal and a retry under its key must
    // find it full (README, The re-adoption window).
    let pool = r#""concurrency":2,"termMs":20000,"renewIntervalMs":5000"#;
    let first = TestServer::start(&config(pool, r#""snapshotIntervalMs":1000"#));
    let a = first.acquire("Idempotency-Key: job-a\r\n", "").slot();
    let b = first.acquire("", "").slot();
    let state = first.dir.join("nthpool.state");
    eventually("a periodic snapshot", || state.exists());
    // One more period, so that a snapshot surely holds both.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(first.release(&a, "").json()["released"], true);
    let c = first.acquire("", "").slot();
    let s = restart(kill_9(first));
    assert_eq!(s.get_admin("/healthz").json()["status"], "recovering");
    assert_eq!(s.renew(&b).status, 200);
    assert_eq!(s.renew(&c).status, 200, "a grant the snapshot never saw is re-adopted");
    assert_eq!(s.renew(&a).status, 404, "the confirmed slots fill the pool");
    let retry = s.acquire("Idempotency-Key: job-a\r\n", "");
    assert_eq!((retry.status, retry.header("x-nthpool-deny-reason")), (429, Some("recovering")), "{retry:?}");
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 2);
    assert_eq!((s.renew(&b).status, s.renew(&c).status, s.renew(&a).status), (200, 200, 404));
}

#[test]
fn a_graceful_restart_after_a_reload_added_a_pool_restores_with_no_window() {
    // `a` sorts before `p`: a reload puts it after, a start before.
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    first.reload(&config(POOL, "").replace(r#""pools":{"#, r#""pools":{"a":{"keys":["a-key"]},"#));
    let kept = stop(first, "TERM");
    let s = restart(kept);
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok", "restored: no window");
    assert_eq!(s.renew(&slot).status, 200);
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0, "known from the snapshot");
}

#[test]
fn a_graceful_restart_keeps_the_draining_slots_of_a_pool_a_reload_removed() {
    // Pool `r` holds both its slots when a reload removes it; the server
    // stops and starts on that configuration, then a reload names `r` again.
    let r = r#""r":{"keys":["r-key"],"concurrency":2,"termMs":5000,"renewIntervalMs":1000}"#;
    let with_r = config(POOL, "").replace(r#""pools":{"#, &format!(r#""pools":{{{r},"#));
    let first = TestServer::start(&with_r);
    let on_r = |s: &TestServer, route: &str| s.request(&post(&format!("/pools/r/lock/{route}"), "r-key", "", ""));
    let slots: Vec<String> = (0..2).map(|_| on_r(&first, "acquire").slot()).collect();
    first.reload(&config(POOL, ""));
    assert_eq!(on_r(&first, &format!("{}/renew", slots[0])).status, 200, "draining");
    let s = restart(stop(first, "TERM"));
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"r\"}"), 2, "held, draining");
    assert_eq!(metric(&s, "nthpool_retired{pool=\"r\"}"), 1);
    // Its keys are not in the snapshot: no key opens `r` until a reload names it.
    assert_eq!(on_r(&s, &format!("{}/renew", slots[0])).status, 401);

    s.reload(&with_r);
    assert_eq!(on_r(&s, &format!("{}/renew", slots[0])).status, 200, "the restored slot renews again");
    let full = on_r(&s, "acquire");
    assert_eq!((full.status, full.header("x-nthpool-deny-reason")), (429, Some("concurrency")), "{full:?}");
    assert_eq!(on_r(&s, &format!("{}/release", slots[1])).json()["released"], true);
    assert_eq!(on_r(&s, "acquire").status, 200, "the freed slot is granted");
}

#[test]
fn a_reload_during_the_window_neither_ends_nor_extends_it_and_a_pool_it_adds_has_none() {
    let pool = |concurrency: u32| format!(r#""concurrency":{concurrency},"termMs":3000,"renewIntervalMs":500"#);
    let first = TestServer::start(&config(&pool(1), ""));
    let slot = first.acquire("", "").slot();
    let kept = kill_9(first);
    let s = restart(kept);
    let started = Instant::now();
    assert!(recovering(&s.acquire("", "")));
    std::thread::sleep(Duration::from_millis(1000));
    let with_fresh = config(&pool(2), "").replace(r#""pools":{"#, r#""pools":{"fresh":{"keys":["fresh-key"]},"#);
    s.reload(&with_fresh);
    let r = s.acquire("", "");
    assert!(recovering(&r), "the reload did not end the window: {r:?}");
    assert_eq!(r.header_u64("x-nthpool-limit"), 2, "and its limits apply");
    let fresh = s.request(&post("/pools/fresh/lock/acquire", "fresh-key", "", ""));
    assert_eq!(fresh.status, 200, "a pool the reload added has no window: {fresh:?}");
    assert_eq!(s.renew(&slot).status, 200, "an old holder is re-adopted after the reload");
    // The window ends one term after the start, not one term after the reload.
    let granted = loop {
        let r = s.acquire("", "");
        if r.status == 200 {
            break started.elapsed();
        }
        assert!(recovering(&r), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "the window never ended");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(granted < Duration::from_millis(3900), "the reload extended the window to {granted:?}");
}

#[test]
fn a_reload_moves_the_snapshot_and_retimes_the_periodic_writer() {
    let pool = r#""concurrency":3,"termMs":20000,"renewIntervalMs":5000"#;
    let s = TestServer::start(&config(pool, r#""stateFile":"a.state""#));
    let slot = s.acquire("", "").slot();
    let (a, b) = (s.dir.join("a.state"), s.dir.join("b.state"));

    // An interval and a new path, without a restart: the writer starts.
    s.reload(&config(pool, r#""stateFile":"b.state","snapshotIntervalMs":1000"#));
    eventually("a periodic snapshot at the new path", || b.exists());
    assert!(!a.exists(), "nothing at the old path");

    // The interval removed: the writer stops. Two of its periods pass with no file.
    s.reload(&config(pool, r#""stateFile":"b.state""#));
    // A write already under way when the reload came may still land.
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::remove_file(&b).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!b.exists(), "no periodic snapshot after the interval was removed");

    // The stop snapshot goes to the new path, and the restart restores it.
    let kept = stop(s, "TERM");
    assert!(b.exists() && !a.exists(), "the stop snapshot is at the reloaded path");
    let s = restart(kept);
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok", "restored: no window");
    assert_eq!(s.renew(&slot).status, 200);
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0, "known from the snapshot");
}

/// Where the clients of a load test find the server: it moves on a restart.
#[derive(Clone)]
struct Target(Arc<Mutex<SocketAddr>>);

impl Target {
    /// One request on a fresh connection, retried while the server is down
    /// (refused, reset, closed before answering), for up to 20 s.
    fn send(&self, raw: &[u8]) -> Response {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let addr = *self.0.lock().unwrap();
            let answer = TcpStream::connect(addr).ok().and_then(|mut c| {
                c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
                c.write_all(raw).ok()?;
                read_response_lenient(&mut c)
            });
            if let Some(r) = answer {
                return r;
            }
            assert!(Instant::now() < deadline, "the server did not come back");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `read_response`, but a connection cut mid-answer is `None` rather than a panic.
fn read_response_lenient(c: &mut TcpStream) -> Option<Response> {
    common::try_read_response(c).ok().flatten()
}

/// What the clients of a load test saw, counted as they went.
#[derive(Default)]
struct Seen {
    /// Slots the clients hold now: counted from the grant's arrival until the
    /// release is sent, so it never exceeds what the server holds.
    holding: AtomicUsize,
    most_holding: AtomicUsize,
    cycles: AtomicUsize,
    recovering: AtomicUsize,
    effective_limits: Mutex<BTreeSet<String>>,
    renew_failures: AtomicUsize,
    release_failures: AtomicUsize,
}

impl Seen {
    fn hold(&self) {
        let now = self.holding.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_holding.fetch_max(now, Ordering::SeqCst);
    }

    fn unhold(&self) {
        self.holding.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A client that acquires (`body` says how long it waits), renews `renews` times at `every`, and
/// releases (no report, so learning is left alone), until `halt`.
fn cycle_client(target: Target, seen: Arc<Seen>, halt: Arc<AtomicBool>, body: &str, renews: usize, every: Duration) {
    while !halt.load(Ordering::SeqCst) {
        let r = target.send(&post("/pools/p/lock/acquire", KEY, "", body));
        if let Some(limit) = r.header("x-nthpool-effective-limit") {
            seen.effective_limits.lock().unwrap().insert(limit.to_string());
        }
        if r.header("x-nthpool-deny-reason") == Some("recovering") {
            seen.recovering.fetch_add(1, Ordering::SeqCst);
        }
        if r.status != 200 {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        seen.hold();
        let slot = r.slot();
        let mut lost = false;
        for _ in 0..renews {
            std::thread::sleep(every);
            if target.send(&post(&format!("/pools/p/lock/{slot}/renew"), KEY, "", "")).status != 200 {
                seen.renew_failures.fetch_add(1, Ordering::SeqCst);
                lost = true;
                break;
            }
        }
        seen.unhold();
        if !lost && target.send(&post(&format!("/pools/p/lock/{slot}/release"), KEY, "", "")).json()["released"] != true
        {
            seen.release_failures.fetch_add(1, Ordering::SeqCst);
        }
        seen.cycles.fetch_add(1, Ordering::SeqCst);
    }
}

/// `waiting` clients that queue for up to 10 s, and `failing_fast` ones that do not queue.
fn start_clients(
    (waiting, failing_fast): (usize, usize),
    target: &Target,
    seen: &Arc<Seen>,
    halt: &Arc<AtomicBool>,
    renews: usize,
    every: Duration,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..waiting + failing_fast)
        .map(|i| {
            let (target, seen, halt) = (target.clone(), seen.clone(), halt.clone());
            let body = if i < waiting { r#"{"waitMs":10000}"# } else { "" };
            std::thread::spawn(move || cycle_client(target, seen, halt, body, renews, every))
        })
        .collect()
}

fn wait_for_cycles(seen: &Seen, at_least: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.cycles.load(Ordering::SeqCst) < at_least {
        assert!(Instant::now() < deadline, "the clients made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_graceful_restart_under_load_has_no_refusal_window_and_keeps_the_learned_limit() {
    let pool = r#""concurrency":4,"termMs":3000,"renewIntervalMs":200,"requestTimeoutMs":60000"#;
    let first = TestServer::start(&config(pool, ""));
    // Teach a limit of 2 (of 4): a concurrency refusal reported with one other call in flight.
    let a = first.acquire("", "").slot();
    let b = first.acquire("", "").slot();
    assert_eq!(first.release(&b, REFUSED).json()["released"], true);
    assert_eq!(first.release(&a, "").json()["released"], true);
    let probe = first.acquire("", "");
    assert_eq!(probe.header("x-nthpool-effective-limit"), Some("2"), "{probe:?}");
    assert_eq!(first.release(&probe.slot(), "").json()["released"], true);
    let limit = 2;
    // Four clients on a limit of two: the limit is what holds them back. Two
    // of them fail fast, so a re-adoption window would show as `recovering`.
    let target = Target(Arc::new(Mutex::new(first.addr)));
    let (seen, halt) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    let clients = start_clients((2, 2), &target, &seen, &halt, 3, Duration::from_millis(150));
    wait_for_cycles(&seen, 8);

    let before = seen.cycles.load(Ordering::SeqCst);
    let kept = stop(first, "TERM");
    let s = restart(kept);
    *target.0.lock().unwrap() = s.addr;
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok");
    wait_for_cycles(&seen, before + 12);
    halt.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(seen.recovering.load(Ordering::SeqCst), 0, "no acquire met a re-adoption window");
    assert_eq!(seen.renew_failures.load(Ordering::SeqCst), 0, "every held slot renewed across the restart");
    assert_eq!(seen.release_failures.load(Ordering::SeqCst), 0, "and released");
    assert_eq!(
        *seen.effective_limits.lock().unwrap(),
        BTreeSet::from([limit.to_string()]),
        "the learned limit held throughout"
    );
    assert!(seen.most_holding.load(Ordering::SeqCst) <= limit, "never more holders than the limit");
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0, "known from the snapshot, not re-adopted");
}

#[test]
fn kill_9_under_load_never_over_admits_readopts_live_holders_and_reclaims_vanished_ones() {
    let pool = r#""concurrency":3,"termMs":1500,"renewIntervalMs":300,"requestTimeoutMs":60000,"adaptive":false"#;
    let first = TestServer::start(&config(pool, ""));
    let target = Target(Arc::new(Mutex::new(first.addr)));
    let (seen, halt) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    // Four clients on three slots, each holding a slot for about 1.2 s and
    // renewing every 300 ms.
    let clients = start_clients((4, 0), &target, &seen, &halt, 4, Duration::from_millis(300));
    wait_for_cycles(&seen, 3);
    // One more holder that vanishes with the server. It may still be calling
    // the upstream until its lease deadline, so it counts as holding until then.
    let granted = first.acquire("", r#"{"waitMs":10000}"#);
    let vanished = granted.slot();
    seen.hold();
    let until = UNIX_EPOCH + Duration::from_millis(granted.json()["leaseDeadline"].as_u64().unwrap());
    let vanisher = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            std::thread::sleep(until.duration_since(SystemTime::now()).unwrap_or_default());
            seen.unhold();
        })
    };

    let s = restart(kill_9(first));
    *target.0.lock().unwrap() = s.addr;
    let after_crash = seen.cycles.load(Ordering::SeqCst);
    wait_for_cycles(&seen, after_crash + 6);
    halt.store(true, Ordering::SeqCst);
    for c in clients.into_iter().chain([vanisher]) {
        c.join().unwrap();
    }
    let most = seen.most_holding.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once on a limit of 3");
    assert_eq!(most, 3, "the clients did fill the limit");
    assert_eq!(seen.renew_failures.load(Ordering::SeqCst), 0, "live holders were re-adopted, never lost");
    assert!(metric(&s, "nthpool_readopted_total{pool=\"p\"}") >= 1);
    // The vanished holder never came back: it is not counted, and after the
    // window its place is free (all three slots can be taken now).
    assert_eq!(s.renew(&vanished).status, 404);
    let all: Vec<String> = (0..3).map(|_| s.acquire("", r#"{"waitMs":10000}"#).slot()).collect();
    assert_eq!(s.acquire("", "").header("x-nthpool-deny-reason"), Some("concurrency"), "and no more than three");
    drop(all);
}

/// Denials in the re-adoption window are in the dashboard's history by
/// their reason, as the metrics count them, and the pool's status says so.
#[test]
fn the_dashboard_history_shows_recovering_denials() {
    let pool = r#""concurrency":3,"termMs":5000,"renewIntervalMs":1000,"requestTimeoutMs":60000"#;
    let first = TestServer::start(&config(pool, ""));
    first.acquire("", "").slot();
    let s = restart(kill_9(first));
    let denied = s.acquire("", "");
    assert_eq!(denied.header("x-nthpool-deny-reason"), Some("recovering"), "{denied:?}");
    let v = s.get_admin("/api/pools/p").json();
    assert_eq!(v["pool"]["status"], "recovering", "{v}");
    assert_eq!(metric(&s, "nthpool_denials_total{pool=\"p\",reason=\"recovering\"}"), 1);
    // The history takes a sample once a second has ended.
    let start = Instant::now();
    let sum = |v: &serde_json::Value, key: &str| -> u64 {
        v["history"][key]
            .as_array()
            .unwrap_or_else(|| panic!("no history.{key}: {v}"))
            .iter()
            .filter_map(|x| x.as_u64())
            .sum()
    };
    loop {
        let v = s.get_admin("/api/pools/p").json();
        if sum(&v, "deniedRecovering") == 1 {
            let others = ["deniedConcurrency", "deniedRate", "deniedCooldown", "deniedQueueFull"];
            assert_eq!(others.iter().map(|k| sum(&v, k)).sum::<u64>(), 0, "{v}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no recovering denial in the history: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_stop_releases_the_grants_a_client_never_took_before_its_snapshot() {
    // A client that pipelines acquires and never reads, with a small receive
    // window: most of its grants are still in the server's output when the
    // stop's grace ends. Those were never delivered, so they are released
    // (SPEC §5), not written into the snapshot as held.
    let first = TestServer::start(&config(
        r#""concurrency":100000,"adaptive":false,"termMs":60000,"renewIntervalMs":10000"#,
        "",
    ));
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&first.addr.into()).unwrap();
    let mut greedy = std::net::TcpStream::from(socket);
    // A burst whose grants (about 16 MB) are more than the kernel's buffers
    // hold, sent until the server stops taking requests: its own output is
    // then full. A fixed time would not do: a slow (loaded) server is still
    // granting when the count is read, and then more come back held.
    let burst =
        format!("POST /pools/p/lock/acquire HTTP/1.1\r\nHost: x\r\nX-Nthpool-Key: {KEY}\r\n\r\n").repeat(40_000);
    let burst = burst.as_bytes();
    greedy.set_nonblocking(true).unwrap();
    let (mut sent, mut granted, deadline) = (0, 0, Instant::now() + Duration::from_secs(30));
    loop {
        while sent < burst.len() {
            match greedy.write(&burst[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let now = metric(&first, "nthpool_grants_total{pool=\"p\"}");
        if now == granted && now > 0 {
            break;
        }
        granted = now;
        assert!(Instant::now() < deadline, "{granted} grants, the server still taking requests");
    }
    assert!(granted > 1000, "only {granted} grants: the server's output never filled");
    let kept = stop(first, "TERM");
    // What the server had handed to the kernel still reaches the client
    // after the stop: its unread requests were dropped before the close, so
    // the close is a FIN, not a reset that would discard the grants.
    greedy.set_nonblocking(false).unwrap();
    greedy.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answers = Vec::new();
    let ended = std::io::Read::read_to_end(&mut greedy, &mut answers);
    assert!(ended.is_ok(), "the client's read ended with {ended:?}, not the FIN");
    let received = answers.windows(9).filter(|w| w == b"\"slotId\":").count() as u64;
    let s = restart(kept);
    let held = metric(&s, "nthpool_slots_held{pool=\"p\"}");
    assert!(held < granted, "all {granted} grants came back held after the stop: none was released");
    // Every slot held after the restart is one its client received (a grant
    // cut short by the close may show its id but is released).
    assert!(held <= received && received <= held + 1, "{held} held after the restart, {received} received");
}

/// Two processes with one `stateFile` would write over each other's
/// snapshots, and one would restore the other's slots as its own while its
/// own holders' slots were lost: the second is refused at start, a reload
/// onto a state file in use is refused, and once the first has stopped the
/// file is free.
#[test]
fn a_state_file_another_running_process_uses_is_refused() {
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let shared = first.dir.join("nthpool.state");
    let secret = first.dir.join("nthpool.secret");
    let on_shared =
        config(POOL, &format!(r#""stateFile":"{}","slotSecretFile":"{}""#, shared.display(), secret.display()));
    let dir = common::scratch_dir();
    std::fs::write(dir.join("config.json"), &on_shared).unwrap();
    let second = common::run(&dir, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert!(!second.status.success());
    assert!(second.stderr.contains("is in use by another running nthpool"), "{}", second.stderr);
    // Checking the file of a running instance is no conflict.
    assert!(common::run(&dir, &["--check-config", "config.json"]).status.success());

    let other = TestServer::start(&config(POOL, ""));
    let failed = || other.metric("nthpool_config_reload_failures_total").unwrap();
    std::fs::write(&other.config_path, &on_shared).unwrap();
    other.signal("HUP");
    eventually("the reload refused", || failed() == 1.0);

    // Kept until `s`, which uses its state file and secret, is dropped.
    let _first_dir = stop(first, "TERM");
    let config_path = dir.join("config.json");
    let s = TestServer::start_with(dir, config_path, &[]);
    assert_eq!(s.get_admin("/healthz").json()["status"], "ok", "the stop snapshot restored, no window");
    assert_eq!(s.renew(&slot).status, 200, "the first process's slot, held");
}

/// A start refused because another instance holds the state file's lock
/// creates nothing first: no slot secret of its own (which would make its
/// next start look like one after a lost secret), no access log.
#[test]
fn a_start_refused_on_the_state_lock_leaves_no_file_behind() {
    let first = TestServer::start(&config(POOL, ""));
    let shared = first.dir.join("nthpool.state");
    let dir = common::scratch_dir();
    let on_shared = config(POOL, &format!(r#""stateFile":"{}""#, shared.display()))
        .replace(r#""accessLog":null"#, r#""accessLog":"access.log""#);
    std::fs::write(dir.join("config.json"), &on_shared).unwrap();
    let second = common::run(&dir, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert_eq!(second.status.code(), Some(1), "{}", second.stderr);
    assert!(second.stderr.contains("is in use by another running nthpool"), "{}", second.stderr);
    assert!(!dir.join("nthpool.secret").exists(), "a slot secret was created by a start that did not run");
    assert!(!dir.join("access.log").exists(), "an access log was created by a start that did not run");
    drop(first);
}

/// What start-up finds beside the state file that would break it later is
/// refused, named, before anything is written (as a `.tmp` that is no
/// regular file is): a pipe as its `.lock` (the lease terms a crash waits
/// for could not be kept in it), a directory where a refused snapshot is
/// moved (the refused file would stay, for a later start to load).
#[test]
fn a_state_lock_that_is_a_pipe_or_a_refused_path_that_is_a_directory_is_refused_at_start() {
    let dir = common::scratch_dir();
    std::fs::write(dir.join("config.json"), config(POOL, "")).unwrap();
    let lock = dir.join("nthpool.state.lock");
    let made = std::process::Command::new("mkfifo").arg(&lock).status().unwrap();
    assert!(made.success());
    let start = common::run(&dir, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert_eq!(start.status.code(), Some(2), "{}", start.stderr);
    assert!(
        start.stderr.contains("nthpool.state.lock, the lock a running server holds, is not a regular file"),
        "{}",
        start.stderr
    );
    assert!(!common::run(&dir, &["--check-config", "config.json"]).status.success());
    std::fs::remove_file(&lock).unwrap();

    std::fs::write(dir.join("nthpool.state"), b"not a snapshot").unwrap();
    std::fs::create_dir(dir.join("nthpool.state.refused")).unwrap();
    let start = common::run(&dir, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert_eq!(start.status.code(), Some(2), "{}", start.stderr);
    assert!(
        start.stderr.contains("nthpool.state.refused, where a refused snapshot is moved, is a directory"),
        "{}",
        start.stderr
    );
    assert_eq!(std::fs::read(dir.join("nthpool.state")).unwrap(), b"not a snapshot", "left for the operator");
    std::fs::remove_dir(dir.join("nthpool.state.refused")).unwrap();
    let config_path = dir.join("config.json");
    let s = TestServer::start_with(dir, config_path, &[]);
    assert!(!s.dir.join("nthpool.state").exists(), "refused and moved aside");
    assert!(s.dir.join("nthpool.state.refused").is_file());
}

/// A reload that names the running `stateFile` and `slotSecretFile` with
/// another spelling (here through a symlinked directory; in use, as often
/// `./nthpool.state` beside a configuration named by a relative path) moves nothing: it applies (it
/// was once refused, the server's own lock taken for another process's), the
/// lock stays held, and the stop snapshot lands there.
#[test]
fn a_reload_naming_the_same_state_file_otherwise_applies_and_keeps_its_lock() {
    let s = TestServer::start_logged(&config(POOL, ""), "info");
    let slot = s.acquire("", "").slot();
    let state = s.dir.join("nthpool.state");
    let secret = s.dir.join("nthpool.secret");
    let failed = || s.metric("nthpool_config_reload_failures_total").unwrap();
    std::os::unix::fs::symlink(".", s.dir.join("here")).unwrap();
    let spellings = [
        r#""stateFile":"here/nthpool.state","slotSecretFile":"here/nthpool.secret""#.to_string(),
        format!(r#""stateFile":"{}","slotSecretFile":"{}""#, state.display(), secret.display()),
    ];
    for (i, spelled) in spellings.iter().enumerate() {
        let concurrency = 4 + i;
        s.reload(&config(&POOL.replace(r#""concurrency":3"#, &format!(r#""concurrency":{concurrency}"#)), spelled));
        assert_eq!(failed(), 0.0, "{spelled}: {}", s.log());
        assert_eq!(s.metric(r#"nthpool_limit{pool="p"}"#), Some(concurrency as f64), "{spelled}");
    }
    assert!(!s.log().contains("slotSecretFile"), "the same secret taken for a new one: {}", s.log());
    // Still locked: another process is refused the file.
    let dir = common::scratch_dir();
    let on_shared =
        config(POOL, &format!(r#""stateFile":"{}","slotSecretFile":"{}""#, state.display(), secret.display()));
    std::fs::write(dir.join("config.json"), &on_shared).unwrap();
    let second = common::run(&dir, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert!(second.stderr.contains("is in use by another running nthpool"), "{}", second.stderr);
    let (dir, config_path) = stop(s, "TERM");
    let s = TestServer::start_with(dir, config_path, &[]);
    assert_eq!(s.renew(&slot).status, 200, "the slot, restored from the stop snapshot");
}

/// Which state file a reload names is judged by the lock file held, not by
/// what a name leads to now: a symlinked directory swapped to another since
/// the start leads the old name elsewhere, and the file there is a new one
/// (its lock is taken, so another process is refused it); a directory
/// renamed since keeps the file whose lock is held under its new name (not
/// taken for another process's).
#[test]
fn a_reload_tells_a_state_file_moved_from_one_renamed_by_its_lock() {
    let dir = common::scratch_dir();
    for d in ["a", "b"] {
        std::fs::create_dir(dir.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("a", dir.join("cur")).unwrap();
    let with = |state: &str| config(POOL, &format!(r#""stateFile":"{state}","slotSecretFile":"a/s.secret""#));
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, with("cur/nthpool.state")).unwrap();
    let s = TestServer::start_with(dir, config_path, &[]);
    // `cur` now leads to `b`: `b/nthpool.state` is a new file.
    std::fs::remove_file(s.dir.join("cur")).unwrap();
    std::os::unix::fs::symlink("b", s.dir.join("cur")).unwrap();
    s.reload(&with("b/nthpool.state"));
    let other = common::scratch_dir();
    let on_b = config(POOL, &format!(r#""stateFile":"{}""#, s.dir.join("b/nthpool.state").display()));
    std::fs::write(other.join("config.json"), on_b).unwrap();
    let second = common::run(&other, &["--config", "config.json", "--listen", "127.0.0.1:0"]);
    assert!(second.stderr.contains("is in use by another running nthpool"), "b's lock not taken: {}", second.stderr);
    // `b` renamed to `c`: the file whose lock is held, under another name.
    std::fs::rename(s.dir.join("b"), s.dir.join("c")).unwrap();
    s.reload(&with("c/nthpool.state"));
    assert_eq!(s.metric("nthpool_config_reload_failures_total"), Some(0.0));
    let slot = s.acquire("", "").slot();
    let (dir, config_path) = stop(s, "TERM");
    assert!(dir.join("c/nthpool.state").exists(), "the stop snapshot where the lock is");
    let s = TestServer::start_with(dir, config_path, &[]);
    assert_eq!(s.renew(&slot).status, 200, "the slot, restored from the stop snapshot");
}

/// A device or a pipe named as the state file (`/dev/null` meant as "none")
/// is refused at start and by `--check-config`, never read (a pipe blocks)
/// nor renamed out of the way as a refused snapshot.
#[test]
fn a_state_file_that_is_not_a_regular_file_is_refused() {
    let dir = common::scratch_dir();
    let fifo = dir.join("state.fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // (Not `/dev/null` itself: a regression would take it from the machine.)
    std::fs::write(dir.join("config.json"), config(POOL, r#""stateFile":"state.fifo""#)).unwrap();
    for args in [&["--check-config", "config.json"][..], &["--config", "config.json", "--listen", "127.0.0.1:0"]] {
        let r = common::run(&dir, args);
        assert!(!r.status.success(), "{args:?}");
        assert!(r.stderr.contains("not a regular file"), "{args:?}: {}", r.stderr);
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the pipe is where it was");
}

/// `nthpool_waiters_gone_total` counts the waiters whose client went away,
/// not those the server answered: one a reload refused (its key removed)
/// and one a stop answered `503`, a count the snapshot carries to the next
/// start. Both count by their status in `nthpool_rejections_total`.
#[test]
fn waiters_the_server_answered_are_not_counted_as_gone() {
    const FRESH: &str = "fresh-key-0002";
    let keyed =
        |key: &str| config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":60000}"#, "").replacen(KEY, key, 1);
    let gone = |s: &TestServer| metric(s, r#"nthpool_waiters_gone_total{pool="p"}"#);
    let queue = |s: &TestServer, key: &str| {
        let mut c = s.connect();
        c.write_all(&post("/pools/p/lock/acquire", key, "", r#"{"waitMs":60000}"#)).unwrap();
        eventually("the waiter queued", || metric(s, r#"nthpool_waiters{pool="p"}"#) == 1);
        c
    };
    let s = TestServer::start(&keyed(KEY));
    s.acquire("", "").slot();
    let mut refused = queue(&s, KEY);
    s.reload(&keyed(FRESH));
    let r = read_response(&mut refused).expect("the waiter is answered");
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(gone(&s), 0, "refused by the reload, not gone");
    assert_eq!(metric(&s, r#"nthpool_rejections_total{pool="p",code="401"}"#), 1);
    let mut stopped = queue(&s, FRESH);
    let kept = stop(s, "TERM");
    let r = read_response(&mut stopped).expect("the waiter is answered");
    assert_eq!(r.status, 503, "{r:?}");
    let s = restart(kept);
    assert_eq!(gone(&s), 0, "answered by the stop, not gone");
}
