//! The lock API over a real socket: grants, renewals, releases, the queue,
//! the RPM gate and what outcome reports change.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

fn epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[test]
fn grant_has_the_documented_body_and_headers() {
    let s = TestServer::start(&config(r#""concurrency":3,"termMs":30000,"renewIntervalMs":10000"#, ""));
    let before = epoch_ms();
    let r = s.acquire("", "");
    assert_eq!(r.status, 200);
    let j = r.json();
    let slot = j["slotId"].as_str().unwrap();
    assert!(slot.len() >= 22, "at least 128 bits");
    assert!(slot.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let lease = j["leaseDeadline"].as_u64().unwrap();
    let request = j["requestDeadline"].as_u64().unwrap();
    assert!(lease >= before + 30_000 - 1000 && lease <= epoch_ms() + 30_000 + 1000, "{lease}");
    assert_eq!(request - lease, 30_000);
    assert_eq!(j["termMs"], 30_000);
    assert_eq!(j["renewIntervalMs"], 10_000);
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 2);
    assert_eq!(r.header_u64("x-nthpool-effective-limit"), 3);
    assert_eq!(r.header_u64("x-nthpool-limit"), 3);
    assert_eq!(r.header_u64("x-nthpool-queued-ms"), 0);
    assert_eq!(r.header_u64("x-nthpool-queue-depth"), 0);
    assert!(r.header("x-nthpool-rpm-remaining").is_none(), "no gate configured");
    assert_eq!(r.header("content-type"), Some("application/json"));
}

#[test]
fn full_pool_fails_fast_with_429_and_a_reason() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    s.acquire("", "").slot();
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.error_code(), "too_many_requests");
    assert!(!r.json()["message"].as_str().unwrap().is_empty());
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("concurrency"));
    assert!(r.header_u64("Retry-After") >= 1);
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 0);
    assert_eq!(r.header_u64("x-nthpool-effective-limit"), 1);
    assert_eq!(r.header_u64("x-nthpool-queued-ms"), 0);
}

#[test]
fn renew_and_release_lifecycle() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    let r = s.renew(&slot);
    assert_eq!(r.status, 200);
    assert!(r.json()["leaseDeadline"].as_u64().unwrap() > epoch_ms());
    // Another pool's key never touches this slot.
    let foreign = s.request(&post(&format!("/pools/p/lock/{slot}/release"), "other-key", "", ""));
    assert_eq!(foreign.status, 401);
    let via_other_pool = s.request(&post(&format!("/pools/other/lock/{slot}/release"), "other-key", "", ""));
    assert_eq!(via_other_pool.json()["released"], false);
    let r = s.release(&slot, r#"{"status":200}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["released"], true);
    assert_eq!(s.release(&slot, "").json()["released"], false, "idempotent");
    let r = s.renew(&slot);
    assert_eq!(r.status, 404);
    assert_eq!(r.error_code(), "not_found");
    assert_eq!(s.renew("not-a-slot").status, 404);
    // The slot is free again.
    s.acquire("", "").slot();
}

#[test]
fn unrenewed_slot_is_reclaimed_after_its_term() {
    let s = TestServer::start(&config(r#""concurrency":1,"termMs":300,"renewIntervalMs":100"#, ""));
    let slot = s.acquire("", "").slot();
    assert_eq!(s.acquire("", "").status, 429);
    thread::sleep(Duration::from_millis(450));
    assert_eq!(s.renew(&slot).status, 404, "renew after expiry fails");
    s.acquire("", "").slot();
}

#[test]
fn renewing_keeps_a_slot_past_its_first_term() {
    let s =
        TestServer::start(&config(r#""concurrency":1,"termMs":400,"renewIntervalMs":100,"requestTimeoutMs":5000"#, ""));
    let slot = s.acquire("", "").slot();
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(150));
        assert_eq!(s.renew(&slot).status, 200);
    }
    assert_eq!(s.acquire("", "").status, 429, "still held after 900 ms of renewals");
}

#[test]
fn renew_stops_at_the_request_deadline_with_409() {
    let s =
        TestServer::start(&config(r#""concurrency":1,"termMs":300,"renewIntervalMs":100,"requestTimeoutMs":500"#, ""));
    let grant = s.acquire("", "");
    let request_deadline = grant.json()["requestDeadline"].as_u64().unwrap();
    let slot = grant.slot();
    thread::sleep(Duration::from_millis(250));
    let r = s.renew(&slot);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["leaseDeadline"].as_u64().unwrap(), request_deadline, "capped");
    let r = s.renew(&slot);
    assert_eq!(r.status, 409);
    assert_eq!(r.error_code(), "capped");
    thread::sleep(Duration::from_millis(400));
    assert_eq!(s.release(&slot, "").json()["released"], false, "reclaimed at the cap");
}

#[test]
fn many_clients_never_hold_more_than_the_limit() {
    const LIMIT: i64 = 3;
    let s = TestServer::start(&config(r#""concurrency":3"#, ""));
    let held = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let addr = s.addr;
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let (held, peak) = (held.clone(), peak.clone());
            thread::spawn(move || {
                let mut conn = std::net::TcpStream::connect(addr).unwrap();
                let mut grants = 0;
                for round in 0..60u64 {
                    conn.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
                    let r = read_response(&mut conn).unwrap();
                    if r.status != 200 {
                        assert_eq!(r.status, 429);
                        continue;
                    }
                    grants += 1;
                    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    if (round + i) % 3 == 0 {
                        thread::sleep(Duration::from_millis(1));
                    }
                    let slot = r.slot();
                    held.fetch_sub(1, Ordering::SeqCst);
                    conn.write_all(&post(&format!("/pools/p/lock/{slot}/release"), KEY, "", "")).unwrap();
                    assert_eq!(read_response(&mut conn).unwrap().json()["released"], true);
                }
                grants
            })
        })
        .collect();
    let total: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(total > 0);
    assert!(peak.load(Ordering::SeqCst) <= LIMIT, "peak {}", peak.load(Ordering::SeqCst));
    // Everything was released: the whole limit is free again.
    let slots: Vec<_> = (0..LIMIT).map(|_| s.acquire("", "").slot()).collect();
    assert_eq!(slots.len(), 3);
    assert_eq!(s.acquire("", "").status, 429);
}

/// Sends an acquire that will queue, on its own connection.
/// A server whose pool has one slot and a queue of ten with 10 s waits.
fn one_slot_with_a_queue() -> TestServer {
    TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000}"#, ""))
}

fn queue_acquire(s: &TestServer, wait_ms: u64) -> std::net::TcpStream {
    let mut c = s.connect();
    c.write_all(&post("/pools/p/lock/acquire", KEY, "", &format!(r#"{{"waitMs":{wait_ms}}}"#))).unwrap();
    c
}

#[test]
fn waiters_are_granted_in_arrival_order() {
    let s = one_slot_with_a_queue();
    let mut holder = s.acquire("", "").slot();
    let mut waiters: Vec<_> = (0..5)
        .map(|_| {
            let c = queue_acquire(&s, 10_000);
            // Each waiter must be queued before the next arrives.
            thread::sleep(Duration::from_millis(30));
            c
        })
        .collect();
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-queue-depth"), 5);
    for w in waiters.iter_mut() {
        assert_eq!(s.release(&holder, "").json()["released"], true);
        let r = read_response(w).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.header_u64("x-nthpool-queued-ms") > 0);
        holder = r.slot();
    }
}

#[test]
fn a_waiter_that_disconnects_is_never_granted() {
    let s = one_slot_with_a_queue();
    let holder = s.acquire("", "").slot();
    let gone = queue_acquire(&s, 10_000);
    thread::sleep(Duration::from_millis(50));
    drop(gone);
    thread::sleep(Duration::from_millis(50));
    let mut second = queue_acquire(&s, 10_000);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-queue-depth"), 1, "the closed waiter left the queue");
    s.release(&holder, "");
    let r = read_response(&mut second).unwrap();
    let slot = r.slot();
    s.release(&slot, "");
    // Nothing leaked to the departed waiter: the slot is free.
    s.acquire("", "").slot();
}

#[test]
fn a_waiter_that_half_closes_leaves_the_queue() {
    let s = one_slot_with_a_queue();
    let holder = s.acquire("", "").slot();
    let half = queue_acquire(&s, 10_000);
    thread::sleep(Duration::from_millis(50));
    half.shutdown(std::net::Shutdown::Write).unwrap();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-queue-depth"), 0);
    s.release(&holder, "");
    s.acquire("", "").slot();
}

#[test]
fn a_waiter_that_asked_to_close_and_half_closes_is_told_the_connection_closes() {
    let s = one_slot_with_a_queue();
    let holder = s.acquire("", "").slot();
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/p/lock/acquire", KEY, "Connection: close\r\n", r#"{"waitMs":10000}"#)).unwrap();
    thread::sleep(Duration::from_millis(50));
    waiter.shutdown(std::net::Shutdown::Write).unwrap();
    let left = read_response(&mut waiter).expect("a half-closed client still reads");
    assert_eq!((left.status, left.error_code().as_str()), (504, "queue_timeout"), "{left:?}");
    assert_eq!(left.header("connection"), Some("close"), "{left:?}");
    assert!(is_closed(&mut waiter));
    s.release(&holder, "");
}

#[test]
fn a_connection_answered_after_a_long_wait_is_kept_for_its_next_request() {
    // The wait (1.5 s) outlasts the idle timeout (1 s): the idle time counts
    // from the answer, not from the acquire that started the wait.
    let s = TestServer::start(&config(
        r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000},"adaptive":false"#,
        r#""idleTimeoutMs":1000"#,
    ));
    let holder = s.acquire("", "").slot();
    let mut waiter = queue_acquire(&s, 10_000);
    thread::sleep(Duration::from_millis(1500));
    s.release(&holder, "");
    let slot = read_response(&mut waiter).expect("the waiter is granted").slot();
    thread::sleep(Duration::from_millis(100));
    waiter.write_all(&post(&format!("/pools/p/lock/{slot}/release"), KEY, "", "")).unwrap();
    let r = read_response(&mut waiter).expect("the connection is still open for the release");
    assert_eq!(r.json()["released"], true, "{r:?}");
}

#[test]
fn a_full_queue_answers_429_queue_full() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":2,"timeoutMs":10000}"#, ""));
    s.acquire("", "").slot();
    let _a = queue_acquire(&s, 5000);
    let _b = queue_acquire(&s, 5000);
    thread::sleep(Duration::from_millis(50));
    let r = s.acquire("", r#"{"waitMs":5000}"#);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("queue_full"));
    assert_eq!(r.header_u64("x-nthpool-queue-depth"), 2);
    assert!(r.header_u64("Retry-After") >= 1);
}

#[test]
fn queue_deadline_answers_504_and_the_wait_is_clamped() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":300}"#, ""));
    s.acquire("", "").slot();
    let started = Instant::now();
    let r = s.acquire("", r#"{"waitMs":60000}"#);
    let waited = started.elapsed();
    assert_eq!(r.status, 504);
    assert_eq!(r.error_code(), "queue_timeout");
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("concurrency"));
    let queued = r.header_u64("x-nthpool-queued-ms");
    assert!((300..1000).contains(&queued), "queued {queued} ms");
    assert!(waited >= Duration::from_millis(290), "clamped to the pool's 300 ms, not 60 s");
    assert!(waited < Duration::from_secs(5));
}

#[test]
fn header_wait_budget_and_no_queue() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    s.acquire("", "").slot();
    let r = s.acquire("X-Nthpool-Queue-Timeout-Ms: 200\r\n", "");
    assert_eq!(r.status, 504, "the header budget queues");
    let started = Instant::now();
    let r = s.acquire("X-Nthpool-Queue-Timeout-Ms: 5000\r\n", r#"{"waitMs":150}"#);
    assert_eq!(r.status, 504);
    assert!(started.elapsed() < Duration::from_secs(3), "the body wins over the header");
    let r = s.acquire("X-Nthpool-No-Queue: 1\r\n", r#"{"waitMs":5000}"#);
    assert_eq!(r.status, 429, "no-queue forces fail fast");
    for bad in [r#"{"waitMs":-1}"#, r#"{"waitMs":1.5}"#, r#"{"waitMs":"10"}"#, r#"{"waitMs":1e-3}"#, "[1]"] {
        let r = s.acquire("", bad);
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.error_code(), "bad_request");
    }
    for bad in ["-5", "1.5", "soon", "1e3"] {
        let r = s.acquire(&format!("X-Nthpool-Queue-Timeout-Ms: {bad}\r\n"), "");
        assert_eq!(r.status, 400, "{bad}");
    }
}

/// "The JSON body wins if both are present": both wait budgets, that is. A
/// body that names no `waitMs` (an empty object, a report of other fields)
/// leaves the wait to `X-Nthpool-Queue-Timeout-Ms`, as SPEC §5 reads it
/// ("body `waitMs`, else header").
#[test]
fn a_body_without_wait_ms_leaves_the_wait_to_the_header() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    s.acquire("", "").slot();
    for body in ["{}", r#"{"note":"no wait here"}"#] {
        let started = Instant::now();
        let r = s.acquire("X-Nthpool-Queue-Timeout-Ms: 200\r\n", body);
        assert_eq!((r.status, r.error_code().as_str()), (504, "queue_timeout"), "{body}: {r:?}");
        assert!(started.elapsed() >= Duration::from_millis(190), "{body}: the header's 200 ms were waited");
        assert!(r.header_u64("x-nthpool-queued-ms") >= 190, "{body}: {r:?}");
    }
}

/// A wait budget is a floor: the server's clock reads whole milliseconds,
/// and a deadline counted from that rounded-down instant answered `504` up
/// to a millisecond before the caller's budget had passed (4 in 40 of 50-ms
/// waits did). Timed from before the request is sent, so the client's own
/// measure is never shorter than the server's.
#[test]
fn a_queued_acquire_is_never_answered_504_before_its_wait_budget() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    s.acquire("", "").slot();
    let budget = Duration::from_millis(7);
    let acquire = post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":7}"#);
    let mut c = s.connect();
    for round in 0..150 {
        let sent = Instant::now();
        c.write_all(&acquire).unwrap();
        let r = read_response(&mut c).expect("an answer");
        let waited = sent.elapsed();
        assert_eq!((r.status, r.error_code().as_str()), (504, "queue_timeout"), "{r:?}");
        assert!(waited >= budget, "round {round}: answered 504 after {waited:?}, under the 7 ms asked for");
        assert!(r.header_u64("x-nthpool-queued-ms") >= 7, "{r:?}");
    }
}

#[test]
fn a_reclaim_grants_the_head_waiter() {
    let s = TestServer::start(&config(
        r#""concurrency":1,"termMs":300,"renewIntervalMs":100,"queue":{"size":10,"timeoutMs":5000}"#,
        "",
    ));
    s.acquire("", "").slot();
    let started = Instant::now();
    let r = s.acquire("", r#"{"waitMs":5000}"#);
    assert_eq!(r.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(r.header_u64("x-nthpool-queued-ms") >= 200);
}

#[test]
fn pipelined_requests_behind_a_waiting_acquire_keep_their_order() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    let holder = s.acquire("", "").slot();
    let mut c = s.connect();
    let mut burst = post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":5000}"#);
    burst.extend(post("/pools/p/lock/not-a-slot/renew", KEY, "", ""));
    c.write_all(&burst).unwrap();
    thread::sleep(Duration::from_millis(100));
    s.release(&holder, "");
    let first = read_response(&mut c).unwrap();
    assert_eq!(first.status, 200, "the waiting acquire answers first");
    let second = read_response(&mut c).unwrap();
    assert_eq!(second.status, 404);
}

#[test]
fn rpm_gate_denies_with_retry_after_to_the_next_token() {
    let s = TestServer::start(&config(r#""concurrency":10,"rpm":60,"rpmBurst":1"#, ""));
    let r = s.acquire("", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header_u64("x-nthpool-rpm-remaining"), 0);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    assert_eq!(r.header_u64("Retry-After"), 1);
    assert_eq!(r.header_u64("x-nthpool-rpm-remaining"), 0);
    // A waiter gets the next token.
    let started = Instant::now();
    let r = s.acquire("", r#"{"waitMs":3000}"#);
    assert_eq!(r.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(500));
}

#[test]
fn rpm_remaining_counts_the_tokens_that_came_due_on_every_acquire_answer() {
    // One token a second, one slot: the token comes back while the slot is held.
    let s = TestServer::start(&config(
        r#""concurrency":1,"rpm":60,"rpmBurst":1,"adaptive":false,"queue":{"size":10,"timeoutMs":10000}"#,
        "",
    ));
    let key = "Idempotency-Key: job-1\r\n";
    let r = s.acquire(key, "");
    assert_eq!(r.header_u64("x-nthpool-rpm-remaining"), 0);
    thread::sleep(Duration::from_millis(1200));
    // The same grant again, and a wait that ends without a slot: the bucket
    // holds the token that came due meanwhile, as the metrics and a 429 say.
    let replay = s.acquire(key, "");
    assert_eq!((replay.status, replay.slot()), (200, r.slot()));
    assert_eq!(replay.header_u64("x-nthpool-rpm-remaining"), 1, "{replay:?}");
    let timed_out = s.acquire("", r#"{"waitMs":200}"#);
    assert_eq!(timed_out.status, 504);
    assert_eq!(timed_out.header_u64("x-nthpool-rpm-remaining"), 1, "{timed_out:?}");
    let refused = s.acquire("", "");
    assert_eq!((refused.status, refused.header_u64("x-nthpool-rpm-remaining")), (429, 1));
}

#[test]
fn a_429_report_lowers_the_effective_limit() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let slot = s.acquire("", "").slot();
    assert_eq!(s.release(&slot, r#"{"status":429,"throttled":1}"#).json()["released"], true);
    let r = s.acquire("", "");
    // Nothing else was in flight: the cut is the most one report may make, half.
    assert_eq!(r.header_u64("x-nthpool-effective-limit"), 5);
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 4);
    assert_eq!(r.header_u64("x-nthpool-limit"), 10);
}

#[test]
fn a_bad_report_releases_nothing() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    let r = s.release(&slot, r#"{"status":"teapot"}"#);
    assert_eq!(r.status, 400);
    assert_eq!(r.error_code(), "bad_request");
    assert_eq!(s.acquire("", "").status, 429, "still held");
    assert_eq!(s.release(&slot, r#"{"status":200}"#).json()["released"], true);
}

/// A refused report names the field that is wrong: an unknown member of
/// `rate` is ignored, as the body's own are, so it is not the one blamed
/// beside a `status` of the wrong type.
#[test]
fn a_bad_report_names_its_wrong_field_not_an_ignored_rate_member() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    let r = s.release(&slot, r#"{"status":"429","rate":{"remaining":0,"note":"from the SDK"}}"#);
    assert_eq!((r.status, r.error_code()), (400, "bad_request".to_string()), "{r:?}");
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("`status`"), "{message}");
    assert_eq!(s.acquire("", "").status, 429, "still held");
    assert_eq!(s.release(&slot, r#"{"status":429,"rate":{"note":"ok"}}"#).json()["released"], true);
}

/// Each release body is refused `400 bad_request` with a message naming
/// its wrong field (`named`), and the slot stays held until a good report.
fn assert_reports_refused_naming(bodies: &[(&str, &str)]) {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    for (body, named) in bodies {
        let r = s.release(&slot, body);
        assert_eq!((r.status, r.error_code()), (400, "bad_request".to_string()), "{r:?}");
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains(named), "{body}: {message}");
    }
    assert_eq!(s.acquire("", "").status, 429, "still held");
    assert_eq!(s.release(&slot, r#"{"status":200}"#).json()["released"], true);
}

/// A report that gives a field twice is refused naming that field, a member
/// of `rate` by its place there, and releases nothing.
#[test]
fn a_report_that_gives_a_field_twice_names_it() {
    assert_reports_refused_naming(&[
        (r#"{"status":200,"status":429}"#, "`status` is given twice"),
        (r#"{"status":429,"retryAfterMs":0,"retryAfterMs":9000}"#, "`retryAfterMs` is given twice"),
        (r#"{"status":429,"rate":{"remaining":5,"remaining":0}}"#, "`rate.remaining` is given twice"),
    ]);
}

/// A member of `rate` of the wrong type or range is refused by its name,
/// and the slot stays held.
#[test]
fn a_bad_rate_member_is_named() {
    assert_reports_refused_naming(&[
        (r#"{"status":429,"rate":{"limit":10,"resetMs":-1}}"#, "`rate.resetMs`"),
        (r#"{"status":200,"rate":{"remaining":3,"tokenRemaining":"0"}}"#, "`rate.tokenRemaining`"),
    ]);
}

/// A number no double holds (`1e400`) in a field the report reads is no
/// number: refused naming that field, and the slot stays held.
#[test]
fn a_number_past_a_doubles_range_names_its_field() {
    assert_reports_refused_naming(&[
        (r#"{"status":429,"retryAfterMs":1e400}"#, "`retryAfterMs`"),
        (r#"{"status":429,"rate":{"remaining":0,"resetMs":1e400}}"#, "`rate.resetMs`"),
    ]);
}

/// A member nested deeper than a JSON parser's usual limit is still JSON: the
/// refusal names the member that is wrong, not the body as "not valid JSON".
#[test]
fn a_bad_report_nested_deep_names_its_wrong_field() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for (body, named) in [
        (format!(r#"{{"status":{deep}}}"#), "`status`"),
        (format!(r#"{{"status":429,"rate":{{"remaining":{deep}}}}}"#), "`rate.remaining`"),
        (format!(r#"{{"status":"429","note":{deep}}}"#), "`status`"),
    ] {
        let r = s.release(&slot, &body);
        assert_eq!((r.status, r.error_code()), (400, "bad_request".to_string()), "{r:?}");
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains(named), "{}: {message}", &body[..30]);
    }
    assert_eq!(s.acquire("", "").status, 429, "still held");
    assert_eq!(s.release(&slot, &format!(r#"{{"status":200,"note":{deep}}}"#)).json()["released"], true);
}

/// A number no float holds, in a header nthpool reads, is an unparseable
/// value (SPEC §7): ignored, the report applied and the slot released, as
/// under a header nthpool does not read. Refused, a client that retried the
/// report would hold its slot until its term ended.
#[test]
fn a_header_number_past_a_floats_range_is_ignored_and_the_slot_released() {
    let s = TestServer::start(&config(r#""concurrency":1,"adaptive":true"#, ""));
    let digits = "9".repeat(400);
    for headers in [
        r#"{"retry-after":1e400}"#.to_string(),
        format!(r#"{{"x-ratelimit-remaining":{digits}}}"#),
        r#"[["retry-after",1e400]]"#.to_string(),
        r#"{"retry-after":[-1e400,1e400]}"#.to_string(),
        r#"{"x-unread":1e400}"#.to_string(),
    ] {
        // Each acquire needs the one slot the release before it freed.
        let slot = s.acquire("", "").slot();
        let r = s.release(&slot, &format!(r#"{{"status":200,"headers":{headers}}}"#));
        assert_eq!(r.status, 200, "{headers}: {r:?}");
        assert_eq!(r.json()["released"], true, "{headers}");
    }
    // The rest of the report applies: no request left for 30 s.
    let slot = s.acquire("", "").slot();
    let report =
        r#"{"status":200,"headers":{"retry-after":1e400,"x-ratelimit-remaining":"0","x-ratelimit-reset":"30"}}"#;
    assert_eq!(s.release(&slot, report).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("rate")), "{r:?}");
}

/// "If both `rate` and `headers` are sent, `rate` wins", over the wire and
/// both ways: a `rate.remaining` of 5 beside headers that say 0 leaves the
/// pool open, and a `rate.remaining` of 0 beside headers that say 5 closes
/// it until the reset.
#[test]
fn a_reports_rate_wins_over_its_headers() {
    let headers = |remaining: u32| {
        format!(
            r#""headers":{{"x-ratelimit-limit":"10","x-ratelimit-remaining":"{remaining}","x-ratelimit-reset":"60"}}"#
        )
    };
    let cases = [
        (format!(r#"{{"status":200,"rate":{{"remaining":5}},{}}}"#, headers(0)), 200),
        (format!(r#"{{"status":200,"rate":{{"limit":10,"remaining":0,"resetMs":60000}},{}}}"#, headers(5)), 429),
    ];
    for (report, next) in cases {
        let s = TestServer::start(&config(r#""concurrency":4,"adaptive":true"#, ""));
        let slot = s.acquire("", "").slot();
        assert_eq!(s.release(&slot, &report).json()["released"], true, "{report}");
        let r = s.acquire("", "");
        assert_eq!(r.status, next, "after {report}: {r:?}");
        if next == 429 {
            assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"), "{r:?}");
        }
    }
}

/// A body that is present must be a JSON object on every lock route: a
/// renew with anything else is `400` and extends nothing (an object says
/// nothing and renews), and white space JSON does not know (a form feed) is
/// not an absent report.
#[test]
fn a_renew_or_release_body_that_is_not_a_json_object_is_refused() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    let renew = |body: &str| s.request(&post(&format!("/pools/p/lock/{slot}/renew"), KEY, "", body));
    for body in ["garbage", "[]", "null", "{\"a\":", "{} x", "\u{c}"] {
        let r = renew(body);
        assert_eq!(r.status, 400, "{body:?}: {r:?}");
        assert_eq!(r.error_code(), "bad_request");
        assert!(r.json()["message"].as_str().is_some_and(|m| m.ends_with('.')), "{r:?}");
    }
    assert_eq!(renew("").status, 200);
    assert_eq!(renew(" {\"status\":200} ").status, 200);
    let m = admin_get(s.admin.expect("admin listener"), "/metrics");
    assert!(m.contains("nthpool_renewals_total{pool=\"p\",outcome=\"renewed\"} 2"), "{m}");
    let r = s.release(&slot, "\u{c}");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(s.acquire("", "").status, 429, "still held");
    assert_eq!(s.release(&slot, "").json()["released"], true);
}

#[test]
fn a_retry_after_report_pauses_the_pool() {
    let s = TestServer::start(&config(r#""concurrency":4,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    let slot = s.acquire("", "").slot();
    let started = Instant::now();
    s.release(&slot, r#"{"status":429,"headers":{"Retry-After":"1","x-ratelimit-remaining":"0"}}"#);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("cooldown"));
    assert_eq!(r.header_u64("Retry-After"), 1);
    let r = s.acquire("", r#"{"waitMs":5000}"#);
    assert_eq!(r.status, 200, "a waiter is granted when the cool-down ends");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[test]
fn openai_headers_with_no_remaining_requests_block_until_the_reset() {
    let s = TestServer::start(&config(r#""concurrency":4,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    let slot = s.acquire("", "").slot();
    let started = Instant::now();
    s.release(
        &slot,
        r#"{"status":200,"headers":{"x-ratelimit-limit-requests":"60","x-ratelimit-remaining-requests":"0","x-ratelimit-reset-requests":"700ms"}}"#,
    );
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    let r = s.acquire("", r#"{"waitMs":5000}"#);
    assert_eq!(r.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(650), "{:?}", started.elapsed());
}

#[test]
fn a_waiter_that_leaves_in_the_same_turn_as_a_release_is_not_granted() {
    let s = one_slot_with_a_queue();
    let holder = s.acquire("", "").slot();
    let mut waiter = queue_acquire(&s, 10_000);
    thread::sleep(Duration::from_millis(100));
    let mut releaser = s.connect();
    // Freeze the server so the hang-up and the release land in one turn.
    s.while_stopped(|| {
        waiter.shutdown(std::net::Shutdown::Write).unwrap();
        releaser.write_all(&post(&format!("/pools/p/lock/{holder}/release"), KEY, "", "")).unwrap();
    });
    assert_eq!(read_response(&mut releaser).unwrap().json()["released"], true);
    // The departed waiter is told its wait ended, never granted.
    let left = read_response(&mut waiter).expect("a half-closed client still reads");
    assert_eq!((left.status, left.error_code().as_str()), (504, "queue_timeout"), "{left:?}");
    // The slot went nowhere: a newcomer gets it at once.
    assert_eq!(s.acquire("", "").status, 200);
}

#[test]
fn a_waiter_granted_in_the_turn_its_half_close_is_read_is_answered_in_order() {
    let s = one_slot_with_a_queue();
    let mut holder = s.connect();
    holder.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    let slot = read_response(&mut holder).unwrap().slot();
    let mut waiter = queue_acquire(&s, 10_000);
    thread::sleep(Duration::from_millis(100));
    // Freeze the server so that the release (read first) grants the waiter
    // in the same turn as the waiter's half-close is read.
    s.while_stopped(|| {
        holder.write_all(&post(&format!("/pools/p/lock/{slot}/release"), KEY, "", "")).unwrap();
        thread::sleep(Duration::from_millis(50));
        waiter.write_all(&post("/pools/p/lock/x/renew", KEY, "", "")).unwrap();
        waiter.shutdown(std::net::Shutdown::Write).unwrap();
    });
    assert_eq!(read_response(&mut holder).unwrap().json()["released"], true);
    // The acquire is answered first, then the renew behind it.
    let left = read_response(&mut waiter).expect("the acquire's answer");
    assert_eq!((left.status, left.error_code().as_str()), (504, "queue_timeout"), "{left:?}");
    let renew = read_response(&mut waiter).expect("the renew's answer");
    assert_eq!(renew.status, 404, "{renew:?}");
    assert!(is_closed(&mut waiter));
    // The grant nobody could be handed went back at once.
    assert_eq!(s.acquire("", "").status, 200);
}

#[test]
fn an_acquire_read_after_a_lease_deadline_finds_the_slot_reclaimed() {
    let s = TestServer::start(&config(r#""concurrency":1,"termMs":300,"renewIntervalMs":100"#, ""));
    s.acquire("", "").slot();
    let mut late = s.connect();
    thread::sleep(Duration::from_millis(50));
    // Freeze the server past the lease's deadline, so the acquire and the
    // deadline fall in one turn: the reclaim is due before the acquire is read.
    s.while_stopped(|| {
        thread::sleep(Duration::from_millis(500));
        late.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    });
    let r = read_response(&mut late).unwrap();
    assert_eq!(r.status, 200, "the holder's term had ended: {r:?}");
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 0);
}

#[test]
fn a_waiter_whose_deadline_passed_is_not_granted_by_a_later_release() {
    let s = one_slot_with_a_queue();
    let holder = s.acquire("", "").slot();
    let mut waiter = queue_acquire(&s, 200);
    thread::sleep(Duration::from_millis(50));
    let mut releaser = s.connect();
    // Freeze the server past the waiter's deadline; the release that comes
    // meanwhile is read in the turn the deadline is due in.
    s.while_stopped(|| {
        thread::sleep(Duration::from_millis(400));
        releaser.write_all(&post(&format!("/pools/p/lock/{holder}/release"), KEY, "", "")).unwrap();
    });
    let r = read_response(&mut waiter).unwrap();
    assert_eq!((r.status, r.error_code().as_str()), (504, "queue_timeout"), "its budget had run out: {r:?}");
    assert_eq!(read_response(&mut releaser).unwrap().json()["released"], true);
    // The slot went nowhere: a newcomer gets it at once.
    assert_eq!(s.acquire("", "").status, 200);
}

#[test]
fn a_lease_that_ends_while_the_server_is_stopped_is_reclaimed_as_it_resumes() {
    let s = TestServer::start(&config(
        r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000},"termMs":2000,"renewIntervalMs":500"#,
        "",
    ));
    s.acquire("", "").slot();
    let mut waiter = queue_acquire(&s, 8_000);
    thread::sleep(Duration::from_millis(100));
    // The server sleeps until the lease's deadline, 2 s after the grant; it
    // is stopped past that deadline, and nothing arrives for it to read.
    s.signal("STOP");
    wait_stopped(s.pid());
    thread::sleep(Duration::from_millis(2_200));
    s.signal("CONT");
    let resumed = Instant::now();
    let r = read_response(&mut waiter).unwrap();
    assert_eq!(r.status, 200, "the holder's term had ended: {r:?}");
    // Not after the rest of the sleep it had begun before the stop.
    assert!(resumed.elapsed() < Duration::from_millis(1_000), "granted {:?} after resuming", resumed.elapsed());
}

/// A server with no upstream host name to resolve runs on one thread: the
/// resolver's starts with the first lookup, so every socket call skips the
/// C library's cancellation bookkeeping of a multi-threaded process.
#[cfg(target_os = "linux")]
#[test]
fn a_lock_api_server_runs_on_one_thread() {
    let s = TestServer::start(&config("", ""));
    for _ in 0..3 {
        let r = s.acquire("", "");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(s.release(&r.slot(), r#"{"status":200}"#).json()["released"], true);
    }
    let threads = std::fs::read_dir(format!("/proc/{}/task", s.child.id())).unwrap().count();
    assert_eq!(threads, 1, "threads of the server process");
}

/// RFC 9110 §15.5.2: every 401 names an authentication scheme. The challenge
/// is the same whatever went wrong (missing key, wrong key, unknown pool), so
/// it discloses nothing about a pool; a 403 (address not allowed) has none.
#[test]
fn every_401_carries_the_same_challenge_and_a_403_none() {
    let s = TestServer::start(&config("", ""));
    let answers = [
        s.request(&post("/pools/p/lock/acquire", "wrong-key", "", "")),
        s.request(b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        s.request(&post("/pools/nope/lock/acquire", KEY, "", "")),
        s.request(&post("/pools/p/lock/some-slot/renew", "wrong-key", "", "")),
        s.request(&post("/pools/p/lock/some-slot/release", "wrong-key", "", "")),
    ];
    for r in &answers {
        assert_eq!(r.status, 401);
        assert_eq!(r.header("www-authenticate"), Some(r#"Bearer realm="nthpool""#));
    }
    let walled = TestServer::start(&config(r#""access":{"ipAllow":["10.0.0.0/8"]}"#, ""));
    let forbidden = walled.acquire("", "");
    assert_eq!(forbidden.status, 403);
    assert_eq!(forbidden.header("www-authenticate"), None);
}
