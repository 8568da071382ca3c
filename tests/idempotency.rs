//! Idempotent acquire (SPEC §11) over real sockets: a retry under the same
//! `Idempotency-Key` gets the grant its key already holds, takes the place of
//! its own queued attempt, and a full store refuses a new key instead of
//! evicting a live one.

mod common;

use std::io::Write;

use common::{config, post, read_response, Response, TestServer, KEY};

fn keyed(s: &TestServer, key: &str, body: &str) -> Response {
    keyed_with(s, key, "", body)
}

fn keyed_with(s: &TestServer, key: &str, headers: &str, body: &str) -> Response {
    s.acquire(&format!("Idempotency-Key: {key}\r\n{headers}"), body)
}

fn metric(s: &TestServer, name: &str) -> u64 {
    let series = format!("{name}{{pool=\"p\"}}");
    s.metric(&series).unwrap_or_else(|| panic!("no {series}")) as u64
}

fn held(s: &TestServer) -> u64 {
    metric(s, "nthpool_slots_held")
}

#[test]
fn a_retry_after_a_lost_answer_gets_the_same_slot_and_another_key_another() {
    let s = TestServer::start(&config(r#""concurrency":4"#, ""));
    let first = keyed(&s, "order-42", "");
    let slot = first.slot();
    // The answer was lost in transit: the client retries with the same key.
    let retry = keyed(&s, "order-42", "");
    assert_eq!(retry.slot(), slot, "the same grant, not a second slot");
    assert_eq!(retry.json()["requestDeadline"], first.json()["requestDeadline"]);
    assert_eq!(held(&s), 1);
    assert_eq!(retry.header("x-nthpool-remaining-slots"), Some("3"));
    // The retry's answer shows the current deadlines after a renew.
    let renewed = s.renew(&slot).json()["leaseDeadline"].as_u64().unwrap();
    assert_eq!(keyed(&s, "order-42", "").json()["leaseDeadline"].as_u64(), Some(renewed));

    let other = keyed(&s, "order-43", "").slot();
    assert_ne!(other, slot);
    assert_eq!(s.acquire("", "").status, 200, "no key: a slot of its own");
    assert_eq!(held(&s), 3);
    assert_eq!(metric(&s, "nthpool_idempotent_replays_total"), 2);
    assert_eq!(metric(&s, "nthpool_idempotency_keys"), 2);
    // The key expires with its lease: after the release, the key takes a new slot.
    assert_eq!(s.release(&slot, "").json()["released"], true);
    let again = keyed(&s, "order-42", "").slot();
    assert_ne!(again, slot);
    assert_eq!(held(&s), 3);
}

#[test]
fn a_key_is_scoped_to_the_pool_key_that_presented_it() {
    let pool = format!(r#""keys":["{KEY}","second-key-0002"],"concurrency":4"#);
    let json = config("", "").replacen(&format!(r#""keys":["{KEY}"]"#), &pool, 1);
    let s = TestServer::start(&json);
    let mine = keyed(&s, "job-1", "").slot();
    let theirs = s.request(&post("/pools/p/lock/acquire", "second-key-0002", "Idempotency-Key: job-1\r\n", "")).slot();
    assert_ne!(mine, theirs, "another caller's key of the same text is another key");
}

#[test]
fn a_retry_while_queued_takes_the_place_of_the_first_attempt() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let holder = s.acquire("", "").slot();
    let wait = r#"{"waitMs":20000}"#;
    let mut first = s.connect();
    first.write_all(&post("/pools/p/lock/acquire", KEY, "Idempotency-Key: job-7\r\n", wait)).unwrap();
    // Wait until the first attempt is queued, then queue one without a key behind it.
    let queued = || {
        let r = s.acquire("X-Nthpool-No-Queue: 1\r\n", "");
        r.header_u64("x-nthpool-queue-depth")
    };
    while queued() < 1 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut behind = s.connect();
    behind.write_all(&post("/pools/p/lock/acquire", KEY, "", wait)).unwrap();
    while queued() < 2 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A retry that fails fast does not wait, so it takes no place: it is
    // denied like any fail-fast acquire behind a queue.
    for (headers, body) in [("", ""), ("X-Nthpool-No-Queue: 1\r\n", wait)] {
        let r = keyed_with(&s, "job-7", headers, body);
        assert_eq!((r.status, r.error_code()), (429, "too_many_requests".to_string()), "{headers:?} {body:?}: {r:?}");
        assert_eq!(r.header("x-nthpool-deny-reason"), Some("concurrency"));
    }
    assert_eq!(queued(), 2, "the first attempt is still queued");
    assert_eq!(metric(&s, "nthpool_superseded_total"), 0);
    let timed = metric(&s, "nthpool_acquire_server_time_us_count");
    let mut retry = s.connect();
    retry.write_all(&post("/pools/p/lock/acquire", KEY, "Idempotency-Key: job-7\r\n", wait)).unwrap();
    let superseded = read_response(&mut first).expect("the first attempt's answer");
    assert_eq!((superseded.status, superseded.error_code()), (409, "superseded".to_string()), "{superseded:?}");
    assert_eq!(queued(), 2, "the retry took the first attempt's place, not a new one");
    assert_eq!(metric(&s, "nthpool_superseded_total"), 1);
    // Answered, so timed like every answered acquire: the 409 and the 429 of `queued()`.
    assert_eq!(metric(&s, "nthpool_acquire_server_time_us_count"), timed + 2);

    // The retry stands where the first attempt stood: ahead of `behind`.
    assert_eq!(s.release(&holder, "").json()["released"], true);
    let granted = read_response(&mut retry).expect("the retry's grant");
    let slot = granted.slot();
    assert_eq!(keyed(&s, "job-7", "").slot(), slot, "and the key now names that grant");
    assert_eq!(s.release(&slot, "").json()["released"], true);
    assert_eq!(read_response(&mut behind).expect("then the next waiter").status, 200);
}

#[test]
fn a_full_store_refuses_a_new_key_and_keeps_the_live_ones() {
    let s = TestServer::start(&config(r#""concurrency":8,"idempotencyKeys":2"#, ""));
    let a = keyed(&s, "a", "").slot();
    keyed(&s, "b", "").slot();
    let full = keyed(&s, "c", "");
    assert_eq!((full.status, full.error_code()), (503, "unavailable".to_string()), "{full:?}");
    assert_eq!(full.header("Retry-After"), Some("1"));
    let message = full.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("idempotencyKeys, 2;"), "the limit is named with its number: {message}");
    assert_eq!(keyed(&s, "a", "").slot(), a, "a live key is never evicted");
    assert_eq!(s.acquire("", "").status, 200, "acquires without a key are not limited by the store");
    assert_eq!(s.release(&a, "").json()["released"], true);
    assert_eq!(keyed(&s, "c", "").status, 200, "a released slot's key makes room");
}

#[test]
fn bad_keys_are_a_clear_400() {
    let s = TestServer::start(&config("", ""));
    for bad in ["x".repeat(129), "tab\there".to_string(), String::new()] {
        let r = keyed(&s, &bad, "");
        assert_eq!((r.status, r.error_code()), (400, "bad_request".to_string()), "{bad:?}: {r:?}");
        assert!(r.json()["message"].as_str().unwrap().contains("Idempotency-Key"));
    }
    assert_eq!(keyed(&s, &"k".repeat(128), "").status, 200);
    assert_eq!(held(&s), 1, "the refused attempts took nothing");
}

/// Sends `request` many times on a connection that never reads, until the
/// server stops answering (its output to the connection is full: what is in
/// it is never delivered), then drops the connection unread (a reset).
/// Returns when the server has closed it.
fn flood_unread(s: &TestServer, request: &[u8]) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&s.addr.into()).unwrap();
    let mut flood = std::net::TcpStream::from(socket);
    let burst = request.repeat(20_000);
    flood.set_nonblocking(true).unwrap();
    let (mut sent, mut answered) = (0, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        while sent < burst.len() {
            match flood.write(&burst[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = metric(s, "nthpool_idempotent_replays_total");
        if now == answered && now > 0 {
            break;
        }
        answered = now;
        assert!(std::time::Instant::now() < deadline, "{answered} replays, the server still answering");
    }
    assert!(answered > 100, "only {answered} replays: the server's output never filled");
    drop(flood);
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.metric("nthpool_connections_open").is_some_and(|open| open > 1.0) && std::time::Instant::now() < gone {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_retrys_answer_that_never_arrives_leaves_the_holder_its_slot() {
    // The holder got its grant; a retry of the same acquire then comes on a
    // connection that never reads and goes away: its answers (the same
    // grant) were never delivered. The slot is the holder's still: it
    // renews it, and a one-slot pool grants no second caller beside it.
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = keyed(&s, "job-9", "").slot();
    flood_unread(&s, &post("/pools/p/lock/acquire", KEY, "Idempotency-Key: job-9\r\n", ""));
    assert_eq!(s.renew(&slot).status, 200, "the holder's slot was released with the retry's lost answers");
    assert_eq!(held(&s), 1);
    assert_eq!(s.acquire("X-Nthpool-No-Queue: 1\r\n", "").status, 429, "a second caller beside the holder");
}
