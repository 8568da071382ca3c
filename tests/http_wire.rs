//! HTTP/1.1 as the real server speaks it over a socket (SPEC §4): keep-alive,
//! pipelining, split reads, bodies, `Expect: 100-continue`, the limits, the
//! error answers of the lock routes, and a table of framing attacks that must
//! each get a `400` and a closed connection.
//!
//! Every case checks three things: the status, the JSON `error` code, and
//! whether the connection stays usable or is closed by the server.

mod common;
#[path = "common/framing.rs"]
mod framing;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use framing::FRAMING;

const ACQUIRE: &str = "/pools/p/lock/acquire";

/// Writes `raw` and reads one answer; panics if the server closes instead.
fn exchange(c: &mut TcpStream, raw: &[u8]) -> Response {
    c.write_all(raw).unwrap();
    read_response(c).unwrap_or_else(|| panic!("no answer to {:?}", String::from_utf8_lossy(raw)))
}

/// Whether the server closed the connection: EOF or a reset. Unlike the
/// harness's `is_closed`, a read that times out means "still open", so a
/// server that forgets to close is caught; bytes instead of EOF are a failure.
fn closed_by_server(c: &mut TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 256];
    match c.read_some(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("expected the connection to end, got {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
        Err(_) => true,
    }
}

#[track_caller]
fn assert_closed(c: &mut TcpStream, what: &str) {
    assert!(closed_by_server(c), "{what}: the server should have closed the connection");
}

/// The connection still serves: a harmless request on it gets its answer.
#[track_caller]
fn assert_open(c: &mut TcpStream, what: &str) {
    let probe = post("/pools/p/lock/no-such-slot/release", KEY, "", "");
    if c.write_all(&probe).is_err() {
        panic!("{what}: the connection was closed, it should stay open");
    }
    match read_response(c) {
        Some(r) => {
            assert_eq!(r.status, 200, "{what}: probe answer {r:?}");
            assert_eq!(r.json()["released"], false, "{what}");
        }
        None => panic!("{what}: the connection was closed, it should stay open"),
    }
}

#[track_caller]
fn assert_error(r: &Response, status: u16, code: &str, what: &str) {
    assert_eq!(r.status, status, "{what}: {r:?}");
    assert_eq!(r.error_code(), code, "{what}: {r:?}");
    let message = r.json()["message"].as_str().map(str::to_string).unwrap_or_default();
    assert!(!message.is_empty(), "{what}: an error says why in `message`: {r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
}

/// `Connection: close` on the answer, and the server then really closes.
#[track_caller]
fn assert_answer_closes(c: &mut TcpStream, r: &Response, what: &str) {
    assert_eq!(r.header("connection").map(str::to_ascii_lowercase).as_deref(), Some("close"), "{what}: {r:?}");
    assert_closed(c, what);
}

fn chunked_post(path: &str, chunks: &[&str]) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    for chunk in chunks {
        raw.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    raw.push_str("0\r\n\r\n");
    raw.into_bytes()
}

/// `raw` (a request from `post`) with another method.
fn with_method(method: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = method.as_bytes().to_vec();
    out.extend_from_slice(raw.strip_prefix(b"POST").expect("a POST"));
    out
}

fn release_path(slot: &str) -> String {
    format!("/pools/p/lock/{slot}/release")
}

#[test]
fn keep_alive_serves_a_whole_lease_on_one_connection() {
    let s = TestServer::start(&config(r#""concurrency":2"#, ""));
    let mut c = s.connect();
    for _ in 0..3 {
        let r = exchange(&mut c, &post(ACQUIRE, KEY, "", ""));
        assert!(r.header("connection").is_none(), "keep-alive is the HTTP/1.1 default: {r:?}");
        let slot = r.slot();
        let r = exchange(&mut c, &post(&format!("/pools/p/lock/{slot}/renew"), KEY, "", ""));
        assert_eq!(r.status, 200, "{r:?}");
        let r = exchange(&mut c, &post(&release_path(&slot), KEY, "", r#"{"status":200}"#));
        assert_eq!(r.json()["released"], true);
    }
    assert_open(&mut c, "after three leases");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let s = TestServer::start(&config(r#""concurrency":2"#, ""));
    let mut c = s.connect();
    let mut batch = Vec::new();
    batch.extend(post(ACQUIRE, KEY, "", ""));
    batch.extend(post("/nowhere", KEY, "", ""));
    batch.extend(post(&release_path("not-a-slot"), KEY, "", ""));
    batch.extend(chunked_post(ACQUIRE, &[r#"{"wait"#, r#"Ms":0}"#]));
    batch.extend(b"GET /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\n\r\n");
    batch.extend(post(ACQUIRE, KEY, "", r#"{"waitMs":0}"#));
    batch.extend(post("/pools/p/lock/x/renew", KEY, "", ""));
    c.write_all(&batch).unwrap();
    let mut answers = Vec::new();
    for _ in 0..7 {
        answers.push(read_response(&mut c).expect("every pipelined request is answered"));
    }
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 404, 200, 200, 405, 429, 404], "{answers:#?}");
    assert!(answers[0].json()["slotId"].is_string());
    assert_eq!(answers[1].error_code(), "not_found");
    assert_eq!(answers[2].json()["released"], false);
    assert!(answers[3].json()["slotId"].is_string());
    assert_eq!(answers[4].header("allow"), Some("POST"));
    assert_eq!(answers[5].header("x-nthpool-deny-reason"), Some("concurrency"));
    assert_eq!(answers[6].error_code(), "not_found");
    assert_open(&mut c, "after a pipelined batch");
}

#[test]
fn a_request_written_one_byte_at_a_time_is_answered() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let trickle = |c: &mut TcpStream, raw: &[u8]| {
        for b in raw {
            c.write_all(std::slice::from_ref(b)).unwrap();
            thread::sleep(Duration::from_millis(1));
        }
    };
    trickle(&mut c, &post(ACQUIRE, KEY, "X-Nthpool-Queue-Timeout-Ms: 0\r\n", r#"{"waitMs":0}"#));
    let slot = read_response(&mut c).expect("answer to a trickled acquire").slot();
    // A chunked body split at every byte, CRLFs included.
    trickle(&mut c, &chunked_post(&release_path(&slot), &[r#"{"status""#, r#":200}"#]));
    let r = read_response(&mut c).expect("answer to a trickled chunked release");
    assert_eq!(r.json()["released"], true, "{r:?}");
    assert_open(&mut c, "after trickled requests");
    // The admin listener too, twice on one connection.
    let mut c = s.connect_admin();
    for _ in 0..2 {
        trickle(&mut c, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = read_response(&mut c).expect("answer to a trickled health check");
        assert_eq!(r.status, 200, "{r:?}");
    }
}

#[test]
fn a_body_arriving_in_pieces_is_taken_once_whole_and_one_cut_short_is_not_taken() {
    let s = TestServer::start(&config(r#""concurrency":1"#, r#""idleTimeoutMs":30000"#));
    let slot = s.acquire("", "").slot();
    // The release's body comes in three writes, the last one with an
    // acquire pipelined behind it: both are answered, in order.
    let release = post(&release_path(&slot), KEY, "", r#"{"status":200,"throttled":0}"#);
    let cut = release.len() - 20;
    let mut c = s.connect();
    for piece in [&release[..cut], &release[cut..cut + 10]] {
        c.write_all(piece).unwrap();
        thread::sleep(Duration::from_millis(30));
    }
    let mut last = release[cut + 10..].to_vec();
    last.extend(post(ACQUIRE, KEY, "", ""));
    c.write_all(&last).unwrap();
    let r = read_response(&mut c).expect("the release's answer");
    assert_eq!(r.json()["released"], true, "{r:?}");
    let r = read_response(&mut c).expect("the pipelined acquire's answer");
    assert_eq!(r.status, 200, "the release came before the acquire behind it: {r:?}");
    let slot = r.slot();
    assert_open(&mut c, "after a body read in pieces");
    // A body its client stops short of: nothing is answered or released,
    // and the connection closes.
    let release = post(&release_path(&slot), KEY, "", r#"{"status":200}"#);
    c.write_all(&release[..release.len() - 3]).unwrap();
    thread::sleep(Duration::from_millis(30));
    c.shutdown(std::net::Shutdown::Write).unwrap();
    // Bytes instead of the end fail here: a cut body is not answered.
    assert_closed(&mut c, "a body that can never end");
    assert_eq!(s.acquire("", "").status, 429, "the cut release released its slot");
    assert_eq!(s.release(&slot, "").json()["released"], true);
}

#[test]
fn a_reload_that_lowers_the_body_limit_refuses_a_body_still_arriving_at_its_next_read() {
    let with_limit = |bytes: u32| config("", &format!(r#""maxBodyBytes":{bytes},"idleTimeoutMs":30000"#));
    let s = TestServer::start(&with_limit(65_536));
    let slot = s.acquire("", "").slot();
    let report = format!(r#"{{"status":200,"headers":{{"x-pad":"{}"}}}}"#, "p".repeat(40_000));
    let release = post(&release_path(&slot), KEY, "", &report);
    let mut c = s.connect();
    c.write_all(&release[..release.len() - 20_000]).unwrap();
    thread::sleep(Duration::from_millis(50));
    s.reload(&with_limit(1_024));
    c.write_all(&release[release.len() - 20_000..release.len() - 10_000]).unwrap();
    // Refused now, before the rest is sent, and nothing released.
    let r = read_response(&mut c).expect("an answer before the body's end");
    assert_error(&r, 413, "payload_too_large", "a body over the new limit");
    assert_eq!(s.release(&slot, "").json()["released"], true, "the refused release released its slot");
}

/// An HTTP/1.0 POST to `path` that asks for keep-alive.
fn http_1_0_keep_alive(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.0\r\nConnection: keep-alive\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn http_1_0_closes_unless_it_asks_for_keep_alive() {
    let s = TestServer::start(&config("", ""));
    let plain = format!("POST /pools/p/lock/x/release HTTP/1.0\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let mut c = s.connect();
    let r = exchange(&mut c, plain.as_bytes());
    assert_eq!(r.status, 200, "{r:?}");
    assert_answer_closes(&mut c, &r, "HTTP/1.0 without keep-alive");

    let keep = http_1_0_keep_alive("/pools/p/lock/x/release", "");
    let mut c = s.connect();
    for _ in 0..2 {
        let r = exchange(&mut c, keep.as_bytes());
        assert_eq!(r.status, 200, "{r:?}");
        // An HTTP/1.0 client takes a connection to close unless told otherwise.
        assert_eq!(r.header("connection"), Some("keep-alive"), "{r:?}");
    }
    // The last request of the keep-alive connection closes it again.
    let r = exchange(&mut c, plain.as_bytes());
    assert_answer_closes(&mut c, &r, "HTTP/1.0 after keep-alive");
}

#[test]
fn a_queued_acquire_over_http_1_0_keep_alive_is_answered_kept_alive() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":4,"timeoutMs":10000}"#, ""));
    let held = s.acquire("", "").slot();
    let mut c = s.connect();
    let body = r#"{"waitMs":5000}"#;
    let queued = http_1_0_keep_alive(ACQUIRE, body);
    c.write_all(queued.as_bytes()).unwrap();
    // Once it waits in the queue (a fail-fast acquire sees the depth), the slot is released.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.acquire("X-Nthpool-No-Queue: 1\r\n", "").header_u64("x-nthpool-queue-depth") == 0 {
        assert!(Instant::now() < deadline, "the acquire never queued");
        thread::sleep(Duration::from_millis(5));
    }
    s.release(&held, "");
    let r = read_response(&mut c).expect("the queued acquire's answer");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("connection"), Some("keep-alive"), "{r:?}");
    // And the connection is kept: its slot releases on it.
    let release = http_1_0_keep_alive(&release_path(&r.slot()), "");
    let r = exchange(&mut c, release.as_bytes());
    assert_eq!(r.json()["released"], true, "{r:?}");
    assert_eq!(r.header("connection"), Some("keep-alive"), "{r:?}");
}

/// An HTTP/1.0 keep-alive acquire that must wait, from a client whose FIN
/// is read with it, is withdrawn at once: its `504` keeps the connection for
/// the answers pipelined behind it and says so, as when the FIN comes later.
#[test]
fn a_queued_acquire_over_http_1_0_keep_alive_withdrawn_with_its_fin_is_answered_kept_alive() {
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":4,"timeoutMs":10000}"#, ""));
    let held = s.acquire("", "").slot();
    let mut c = s.connect();
    let body = r#"{"waitMs":5000}"#;
    let raw = http_1_0_keep_alive(ACQUIRE, body) + &http_1_0_keep_alive(&release_path(&held), "");
    // The server reads the requests and the FIN in one go.
    s.while_stopped(|| {
        c.write_all(raw.as_bytes()).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let r = read_response(&mut c).expect("the withdrawn acquire's answer");
    assert_error(&r, 504, "queue_timeout", "withdrawn at the half-close");
    assert_eq!(r.header("connection"), Some("keep-alive"), "its answer keeps the connection: {r:?}");
    let r = read_response(&mut c).expect("the release pipelined behind it");
    assert_eq!(r.json()["released"], true, "{r:?}");
    assert_eq!(r.header("connection"), Some("keep-alive"), "{r:?}");
    assert_closed(&mut c, "after the last answer to a half-closed client");
}

#[test]
fn connection_close_on_1_1_closes_after_the_answer() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let r = exchange(&mut c, &post(ACQUIRE, KEY, "Connection: close\r\n", ""));
    let slot = r.slot();
    assert_answer_closes(&mut c, &r, "Connection: close");
    // The grant was delivered, so it is held, and releasing it works.
    assert_eq!(s.release(&slot, "").json()["released"], true);
}

#[test]
fn content_length_and_chunked_bodies_are_read() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let mut c = s.connect();
    let slot = exchange(&mut c, &post(ACQUIRE, KEY, "", r#"{"waitMs":0}"#)).slot();
    let r = exchange(&mut c, &chunked_post(&release_path(&slot), &["{", r#""status":200,"throttled":0"#, "}"]));
    assert_eq!(r.json()["released"], true, "{r:?}");
    // Extensions and trailers are framing only.
    let slot = exchange(&mut c, &post(ACQUIRE, KEY, "", "")).slot();
    let raw = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n\
         e;ext=1\r\n{{\"status\":200}}\r\n0\r\nX-Trailer: t\r\n\r\n",
        release_path(&slot)
    );
    let r = exchange(&mut c, raw.as_bytes());
    assert_eq!(r.json()["released"], true, "{r:?}");
    assert_open(&mut c, "after chunked bodies");
}

#[test]
fn expect_continue_gets_100_then_the_answer() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let body = r#"{"waitMs":0}"#;
    let head = format!(
        "POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let interim = exchange(&mut c, head.as_bytes());
    assert_eq!(interim.status, 100, "{interim:?}");
    assert!(interim.body.is_empty());
    let r = exchange(&mut c, body.as_bytes());
    r.slot();
    assert_open(&mut c, "after 100-continue");
}

#[test]
fn expect_continue_is_refused_at_once_when_the_head_decides() {
    let s = TestServer::start(&config("", ""));
    let expect = |path: &str, key: &str, length: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {key}\r\nExpect: 100-continue\r\nContent-Length: {length}\r\n\r\n"
        )
    };
    for (what, head, status, code) in [
        ("wrong key", expect(ACQUIRE, "wrong-key", 12), 401, "unauthorized"),
        ("unknown pool", expect("/pools/nope/lock/acquire", KEY, 12), 401, "unauthorized"),
        ("over maxBodyBytes", expect(ACQUIRE, KEY, 65_537), 413, "payload_too_large"),
    ] {
        let mut c = s.connect();
        // Only the head is sent: the answer must not wait for the body.
        let r = exchange(&mut c, head.as_bytes());
        assert_error(&r, status, code, what);
        assert_answer_closes(&mut c, &r, what);
    }
}

/// A `413` says how large a body may be: its sentence names the limit in bytes.
#[track_caller]
fn assert_names_the_limit(r: &Response, limit: u64) {
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains(&format!(" {limit} bytes")), "the limit is not named: {message:?}");
}

#[test]
fn a_body_over_the_limit_is_refused_before_it_is_sent() {
    let s = TestServer::start(&config("", r#""maxBodyBytes":1024"#));
    let mut c = s.connect();
    let head =
        format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 1025\r\n\r\n");
    let r = exchange(&mut c, head.as_bytes());
    assert_error(&r, 413, "payload_too_large", "Content-Length over the limit");
    assert_names_the_limit(&r, 1024);
    assert_answer_closes(&mut c, &r, "413");

    // Chunks that add up to more than the limit: refused at the size line that breaks it.
    let mut c = s.connect();
    let head = format!(
        "POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n\
         400\r\n{}\r\n1\r\n",
        " ".repeat(1024)
    );
    let r = exchange(&mut c, head.as_bytes());
    assert_error(&r, 413, "payload_too_large", "chunks over the limit");
    assert_names_the_limit(&r, 1024);
    assert_answer_closes(&mut c, &r, "chunked 413");

    // Exactly the limit is fine.
    let mut c = s.connect();
    let body = format!("{{\"waitMs\":0{}}}", " ".repeat(1024 - 12));
    assert_eq!(body.len(), 1024);
    exchange(&mut c, &post(ACQUIRE, KEY, "", &body)).slot();
}

#[test]
fn chunk_framing_over_its_limits_is_refused_naming_them() {
    let s = TestServer::start(&config("", ""));
    let chunked = format!(
        "POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    // A size line longer than 1 KiB; a trailer section longer than 8 KiB.
    let cases = [
        (format!("{chunked}2;a={}\r\n", "b".repeat(1024)), "1 KiB"),
        (format!("{chunked}0\r\nX-T: {}\r\n\r\n", "t".repeat(8 * 1024)), "8 KiB"),
    ];
    for (raw, limit) in cases {
        let mut c = s.connect();
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", limit);
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(message.ends_with(&format!("longer than {limit}.")), "{limit}: {message:?}");
        assert_answer_closes(&mut c, &r, limit);
    }
}

#[test]
fn empty_lines_before_a_request_line_are_skipped_within_the_head_limit() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    // RFC 9112 §2.2: a server should ignore at least one empty line before a
    // request line; a few are skipped, and the connection goes on serving.
    for (n, what) in [(1, "one empty line"), (3, "three empty lines")] {
        let raw = [b"\r\n".repeat(n), post(ACQUIRE, KEY, "", "")].concat();
        let r = exchange(&mut c, &raw);
        assert_eq!(r.status, 200, "{what}: {r:?}");
    }
    assert_open(&mut c, "after empty lines");
    // They count toward the 16 KiB a head may take: a stream of them is an
    // oversized head, not a connection kept busy for nothing.
    let mut c = s.connect();
    let r = exchange(&mut c, &b"\r\n".repeat(9 * 1024));
    assert_error(&r, 431, "request_header_fields_too_large", "18 KiB of empty lines");
    assert_answer_closes(&mut c, &r, "431 after empty lines");
}

#[test]
fn a_head_over_16_kib_gets_431() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let mut head =
        format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nX-Pad: ").into_bytes();
    head.resize(17 * 1024, b'a');
    let r = exchange(&mut c, &head);
    assert_error(&r, 431, "request_header_fields_too_large", "17 KiB head");
    // The message names the limit the head broke, and only that one.
    assert_eq!(r.json()["message"], "The request head is larger than 16 KiB.");
    assert_answer_closes(&mut c, &r, "431");

    // Too many fields is the same answer, naming the field limit.
    let mut c = s.connect();
    let mut many = format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n");
    for i in 0..100 {
        many.push_str(&format!("X-F{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let r = exchange(&mut c, many.as_bytes());
    assert_error(&r, 431, "request_header_fields_too_large", "100 header fields");
    assert_eq!(r.json()["message"], "The request head has more than 64 fields.");
    assert_answer_closes(&mut c, &r, "431 fields");
    // Whatever follows the head (a body, the next request) and however the
    // head is split into writes, the verdict is the head's.
    let mut head = format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n");
    for i in 0..62 {
        head.push_str(&format!("X-F{i}: v\r\n"));
    }
    for body in ["{}\n", "\r\n {}", "{\r}", "{}"] {
        let raw = format!("{head}Content-Length: {}\r\n\r\n{body}", body.len());
        let r = exchange(&mut s.connect(), raw.as_bytes());
        assert_error(&r, 431, "request_header_fields_too_large", &format!("65 fields, body {body:?}"));
        // Cut inside the fields, and after the 65th with the empty line to come.
        for cut in [head.len() - 20, raw.find("\r\n\r\n").unwrap() + 2] {
            let mut c = s.connect();
            c.write_all(&raw.as_bytes()[..cut]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let r = exchange(&mut c, &raw.as_bytes()[cut..]);
            let what = format!("65 fields cut at {cut}, body {body:?}");
            assert_error(&r, 431, "request_header_fields_too_large", &what);
        }
    }

    // Just under the limit is served.
    let mut c = s.connect();
    let mut head =
        format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nX-Pad: ").into_bytes();
    head.resize(16 * 1024 - 4, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    exchange(&mut c, &head).slot();
}

/// A request line that alone runs past the head's 16 KiB: `414` when it is
/// the target that does (RFC 9112 §3), `400` when it is the method; either
/// way the connection closes, whether the line came whole or is still coming.
#[test]
fn a_target_over_16_kib_gets_414_and_a_method_that_long_400() {
    let s = TestServer::start(&config("", ""));
    let long_target = format!("POST /pools/p/lock/{} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(17 * 1024));
    let no_line_end = format!("GET /{}", "a".repeat(17 * 1024));
    let long_method = format!("{} / HTTP/1.1\r\nHost: localhost\r\n\r\n", "A".repeat(17 * 1024));
    for (raw, status, code) in [
        (long_target.as_str(), 414, "uri_too_long"),
        (no_line_end.as_str(), 414, "uri_too_long"),
        (&long_method[..16 * 1024 + 100], 400, "bad_request"),
        (long_method.as_str(), 400, "bad_request"),
    ] {
        let mut c = s.connect();
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, status, code, &raw[..40]);
        assert_answer_closes(&mut c, &r, code);
    }
    // A long target within the limit is read, and a long line with long
    // fields after it is a head too large.
    let mut c = s.connect();
    let under = format!("POST /pools/p/lock/{} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(15 * 1024));
    assert_error(&exchange(&mut c, under.as_bytes()), 404, "not_found", "a 15 KiB target");
    let both = format!(
        "POST /pools/p/lock/{} HTTP/1.1\r\nHost: localhost\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(10 * 1024),
        "b".repeat(10 * 1024)
    );
    assert_error(
        &exchange(&mut s.connect(), both.as_bytes()),
        431,
        "request_header_fields_too_large",
        "line and fields",
    );
    assert_eq!(s.metric("nthpool_rejections_total{code=\"414\"}"), Some(2.0));
}

#[test]
fn routes_methods_pools_and_keys() {
    let s = TestServer::start(&config("", ""));
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("GET acquire", get(ACQUIRE).into_bytes(), 405, "method_not_allowed"),
        ("GET renew", get("/pools/p/lock/abc/renew").into_bytes(), 405, "method_not_allowed"),
        ("PUT release", with_method("PUT", post("/pools/p/lock/abc/release", KEY, "", "")), 405, "method_not_allowed"),
        ("DELETE acquire", with_method("DELETE", post(ACQUIRE, KEY, "", "")), 405, "method_not_allowed"),
        ("unknown path", post("/nowhere", KEY, "", ""), 404, "not_found"),
        ("GET /", get("/").into_bytes(), 404, "not_found"),
        ("unknown action", post("/pools/p/lock/abc/cancel", KEY, "", ""), 404, "not_found"),
        ("unknown pool", post("/pools/nope/lock/acquire", KEY, "", ""), 401, "unauthorized"),
        ("other pool's key", post(ACQUIRE, "other-key", "", ""), 401, "unauthorized"),
        ("wrong key", post(ACQUIRE, "test-key-0002", "", ""), 401, "unauthorized"),
        ("no key", post(ACQUIRE, "", "", ""), 401, "unauthorized"),
        ("key for unknown pool release", post("/pools/nope/lock/abc/release", KEY, "", ""), 401, "unauthorized"),
    ];
    let mut c = s.connect();
    for (what, raw, status, code) in cases {
        let r = exchange(&mut c, &raw);
        assert_error(&r, status, code, what);
        if status == 405 {
            assert_eq!(r.header("allow"), Some("POST"), "{what}");
        }
        assert!(r.header("connection").is_none(), "{what}: a well-framed request keeps the connection: {r:?}");
    }
    assert_open(&mut c, "after error answers");
    // None of the refused acquires took a slot.
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-remaining-slots"), 15);
}

/// RFC 3986 §6.2.2.2: a percent-encoded unreserved character is the
/// character itself, so `prod%2Dacme` names the pool `prod-acme` on every
/// lock route, with either case of hex digits. An escape that can name no
/// pool (not hex, or a byte no pool name holds) is a bad path: `400` and
/// close, before any pool is looked up.
#[test]
fn a_percent_encoded_pool_name_names_the_pool_and_a_bad_escape_is_400() {
    const ACME_KEY: &str = "acme-key-0000001";
    let s = TestServer::start(&format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,
            "pools":{{"prod-acme":{{"keys":["{ACME_KEY}"],"concurrency":2}}}}}}"#
    ));
    let mut c = s.connect();
    for spelling in ["prod%2Dacme", "prod%2dacme", "%70rod-acme", "%70%72%6F%64%2d%61%63%6d%65"] {
        // Twice on one connection: the second head is read by comparison
        // with the first, and must reach the same pool.
        for round in 0..2 {
            let what = format!("{spelling}, round {round}");
            let r = exchange(&mut c, &post(&format!("/pools/{spelling}/lock/acquire"), ACME_KEY, "", ""));
            assert_eq!(r.status, 200, "{what}: {r:?}");
            let slot = r.slot();
            let renewed = exchange(&mut c, &post(&format!("/pools/{spelling}/lock/{slot}/renew"), ACME_KEY, "", ""));
            assert_eq!(renewed.status, 200, "{what}: {renewed:?}");
            let released = exchange(&mut c, &post(&format!("/pools/{spelling}/lock/{slot}/release"), ACME_KEY, "", ""));
            assert_eq!(released.json()["released"], true, "{what}: {released:?}");
        }
    }
    // A name that decodes to no pool is an unknown pool, as one spelled plainly.
    let r = exchange(&mut c, &post("/pools/prod%2Dacm/lock/acquire", ACME_KEY, "", ""));
    assert_error(&r, 401, "unauthorized", "an escaped unknown pool");
    for bad in ["prod%2Facme", "prod%2facme", "prod%00acme", "prod%zzacme", "prod%2", "prod%", "pr%4Fd-acme", "%2E%2E"]
    {
        for route in ["acquire", "some-slot/renew", "some-slot/release"] {
            let what = format!("{bad} {route}");
            let mut c = s.connect();
            let r = exchange(&mut c, &post(&format!("/pools/{bad}/lock/{route}"), ACME_KEY, "", ""));
            assert_error(&r, 400, "bad_request", &what);
            assert!(r.json()["message"].as_str().unwrap().contains("pool name"), "{what}: {r:?}");
            assert_answer_closes(&mut c, &r, &what);
        }
    }
    // None of them holds a slot.
    let r = exchange(&mut c, &post("/pools/prod-acme/lock/acquire", ACME_KEY, "", ""));
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 1, "{r:?}");
}

/// Sends a `HEAD` request with a probe pipelined behind it, and returns the
/// head of the first answer and the bytes that follow it.
fn head_then_probe(c: &mut TcpStream, target: &str, probe: &[u8]) -> (String, Vec<u8>) {
    let mut batch = format!("HEAD {target} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n\r\n").into_bytes();
    batch.extend_from_slice(probe);
    c.write_all(&batch).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(c.read_some(&mut byte).unwrap(), 1, "closed inside the HEAD answer");
        head.push(byte[0]);
    }
    let mut next = vec![0u8; 9];
    c.read_exact(&mut next).unwrap();
    (String::from_utf8_lossy(&head).into_owned(), next)
}

#[test]
fn answers_to_head_requests_have_no_body() {
    // RFC 9110 §9.3.2: an answer to HEAD carries the headers only. A body
    // would be read by the client as the start of the next answer.
    let s = TestServer::start(&config("", ""));
    let probe = post(&release_path("x"), KEY, "", "");
    for target in [ACQUIRE, "/nowhere"] {
        let mut c = s.connect();
        let (head, next) = head_then_probe(&mut c, target, &probe);
        assert!(head.starts_with("HTTP/1.1 405 ") || head.starts_with("HTTP/1.1 404 "), "{head}");
        assert_eq!(next, b"HTTP/1.1 ", "HEAD {target}: a body followed the head:\n{head}");
    }
    let mut c = s.connect_admin();
    let (head, next) = head_then_probe(&mut c, "/healthz", b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(next, b"HTTP/1.1 ", "HEAD /healthz: a body followed the head:\n{head}");
}

#[test]
fn refusals_of_head_requests_that_close_the_connection_have_no_body_either() {
    // The head is read, then everything up to the close: nothing may follow.
    let s = TestServer::start(&config("", ""));
    let fields: String = (0..65).map(|i| format!("X-F{i}: v\r\n")).collect();
    let refused = [
        ("HEAD * HTTP/1.1\r\nHost: localhost\r\n\r\n".to_string(), "400"),
        (format!("\r\nHEAD {ACQUIRE} HTTP/1.1\r\nHost: a b\r\n\r\n"), "400"),
        (format!("HEAD {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 999999999\r\n\r\n"), "413"),
        (format!("HEAD {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), "501"),
        (format!("HEAD {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\n{fields}\r\n"), "431"),
    ];
    for (listener, admin) in [("lock", false), ("admin", true)] {
        for (raw, status) in &refused {
            let mut c = if admin { s.connect_admin() } else { s.connect() };
            c.write_all(raw.as_bytes()).unwrap();
            let mut answer = Vec::new();
            let _ = c.read_to_end(&mut answer);
            let text = String::from_utf8_lossy(&answer);
            assert!(text.starts_with(&format!("HTTP/1.1 {status} ")), "{listener} {raw:?}: {text}");
            let head_len = text.find("\r\n\r\n").expect("a whole head") + 4;
            assert!(text[..head_len].contains("Content-Length: "), "{listener} {raw:?}: {text}");
            assert_eq!(&text[head_len..], "", "{listener} {raw:?}: a body followed the head");
        }
    }
    // The same refusals to other methods keep their JSON body.
    let mut c = s.connect();
    c.write_all(format!("POST {ACQUIRE} HTTP/1.1\r\nHost: a b\r\n\r\n").as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.ends_with(r#""message":"The Host header is not a valid host[:port]."}"#), "{answer}");
}

#[test]
fn authorization_header_only_when_the_pool_allows_it() {
    let bearer = format!("Authorization: Bearer {KEY}\r\n");
    let nthbouncer = format!("Authorization: Nthbouncer {KEY}\r\n");

    let closed = TestServer::start(&config("", ""));
    let mut c = closed.connect();
    for header in [&bearer, &nthbouncer] {
        let r = exchange(&mut c, &post(ACQUIRE, "", header, ""));
        assert_error(&r, 401, "unauthorized", header);
    }
    assert_open(&mut c, "after refused Authorization");

    let open = TestServer::start(&config(r#""allowAuthorizationHeader":true"#, ""));
    let mut c = open.connect();
    for header in [&bearer, &nthbouncer] {
        exchange(&mut c, &post(ACQUIRE, "", header, "")).slot();
    }
    let r = exchange(&mut c, &post(ACQUIRE, "", "Authorization: Bearer wrong\r\n", ""));
    assert_error(&r, 401, "unauthorized", "wrong bearer");
    let r = exchange(&mut c, &post(ACQUIRE, "", &format!("Authorization: Basic {KEY}\r\n"), ""));
    assert_error(&r, 401, "unauthorized", "another scheme");
}

#[test]
fn public_host_limits_lock_routes_to_one_host() {
    let s = TestServer::start(&config("", r#""publicHost":"api.example.com""#));
    let with_host = |host: &str, method: &str| {
        format!("{method} {ACQUIRE} HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n")
    };
    let mut c = s.connect();
    for host in ["localhost", "p.api.example.com", "api.example.com.evil", "evil.com:80", "[::1]:7070"] {
        let r = exchange(&mut c, with_host(host, "POST").as_bytes());
        assert_error(&r, 404, "not_found", host);
        // Said so, for the operator who pointed a client at the wrong name.
        assert_eq!(r.json()["message"], "The lock API is not served on this host.", "{host}");
    }
    for host in
        ["api.example.com", "api.example.com:7070", "API.Example.COM:443", "api.example.com.", "api.example.com.:80"]
    {
        let r = exchange(&mut c, with_host(host, "POST").as_bytes());
        r.slot();
        assert!(r.header("connection").is_none(), "{r:?}");
    }
    // HTTP/1.0 without Host is another host too.
    let mut c = s.connect();
    let raw = format!("POST {ACQUIRE} HTTP/1.0\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let r = exchange(&mut c, raw.as_bytes());
    assert_error(&r, 404, "not_found", "HTTP/1.0 without Host");

    // An IPv6 publicHost is written in brackets, and a name may end in a dot:
    // each matches the `Host` forms that name it.
    for (public, hosts) in
        [("[::1]", ["[::1]", "[::1]:7070"]), ("api.example.com.", ["api.example.com", "API.example.com.:1"])]
    {
        let s = TestServer::start(&config("", &format!(r#""publicHost":"{public}""#)));
        let mut c = s.connect();
        for host in hosts {
            exchange(&mut c, with_host(host, "POST").as_bytes()).slot();
        }
        assert_error(&exchange(&mut c, with_host("localhost", "POST").as_bytes()), 404, "not_found", public);
    }
}

#[test]
fn a_renew_or_release_without_its_slot_id_is_404_saying_so() {
    // What `$API/$SLOT_ID/release` becomes when the variable is unset.
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    for path in ["/pools/demo/lock//release", "/pools/demo/lock//renew"] {
        let r = exchange(&mut c, &post(path, "", "", ""));
        assert_error(&r, 404, "not_found", path);
        assert!(r.json()["message"].as_str().unwrap().contains("no slot id"), "{r:?}");
    }
    // Any other path that is no route keeps the plain sentence, on the same connection.
    let r = exchange(&mut c, &post("/pools/demo/lock/x/cancel", "", "", ""));
    assert_error(&r, 404, "not_found", "cancel");
    assert_eq!(r.json()["message"], "No such route.");
    exchange(&mut c, &post(ACQUIRE, KEY, "", "")).slot();
}

#[test]
fn public_host_hides_lock_routes_from_other_methods_too() {
    // On another host the lock routes do not exist (SPEC §4), so the answer is
    // 404 whatever the method: a 405 would tell the route is there.
    let s = TestServer::start(&config("", r#""publicHost":"api.example.com""#));
    let raw = format!("GET {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let r = s.request(raw.as_bytes());
    assert_error(&r, 404, "not_found", "GET on the wrong host");
}

/// On a warm connection a request line of the same length as the one before
/// is read by comparison and its target checked late; a target a fresh
/// parse refuses is still what the answer names, whatever else is wrong.
#[test]
fn a_bad_target_is_named_first_on_a_warm_connection_too() {
    let s = TestServer::start(&config("", ""));
    let bad_target = |r: &Response| r.status == 400 && r.json()["message"].as_str().unwrap().contains("request target");
    // A chunked acquire, then one whose chunk size is past any limit.
    let mut c = s.connect();
    let chunked = |target: &str, body: &str| {
        format!("POST {target} HTTP/1.1\r\nHost: h\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n{body}")
    };
    for _ in 0..3 {
        c.write_all(chunked(&format!("{ACQUIRE}?x"), "0\r\n\r\n").as_bytes()).unwrap();
        read_response(&mut c).expect("an answer").slot();
    }
    c.write_all(chunked(&format!("{ACQUIRE}?\""), "FFFFFFFF\r\n").as_bytes()).unwrap();
    let r = read_response(&mut c).expect("an answer");
    assert!(bad_target(&r), "{r:?}");
    // Releases, then one whose slot id holds a quote and whose body is no JSON.
    let mut c = s.connect();
    for _ in 0..3 {
        let slot = s.acquire("", "").slot();
        c.write_all(&post(&release_path(&slot), KEY, "", "{}       ")).unwrap();
        assert_eq!(read_response(&mut c).expect("an answer").json()["released"], true);
    }
    let slot = s.acquire("", "").slot();
    let quoted = format!("{}\"", &slot[..slot.len() - 1]);
    c.write_all(&post(&release_path(&quoted), KEY, "", "{bad json")).unwrap();
    let r = read_response(&mut c).expect("an answer");
    assert!(bad_target(&r), "{r:?}");
}

#[test]
fn a_bad_release_body_is_400_and_releases_nothing() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    for body in [
        r#"{"status":"#,
        "[1]",
        r#""status""#,
        "200",
        r#"{"status":"200"}"#,
        r#"{"status":99}"#,
        r#"{"status":600}"#,
        r#"{"throttled":-1}"#,
        r#"{"retryAfterMs":1.5}"#,
        r#"{"rate":[]}"#,
        r#"{"status":200,"rate":[10,0,60000]}"#,
        r#"{"headers":"retry-after: 5"}"#,
        "{}x",
        // Beyond a double's range a number is no number (see README, The API).
        r#"{"throttled":1e400}"#,
        r#"{"rate":{"limit":1e999}}"#,
    ] {
        let mut c = s.connect();
        let r = exchange(&mut c, &post(&release_path(&slot), KEY, "", body));
        assert_error(&r, 400, "bad_request", body);
        assert_answer_closes(&mut c, &r, body);
        // A member of the wrong type or range is named in the sentence.
        let named = [
            (r#"{"status":"200"}"#, "`status`"),
            (r#"{"status":600}"#, "`status`"),
            (r#"{"status":200,"rate":[10,0,60000]}"#, "`rate`"),
            (r#"{"headers":"retry-after: 5"}"#, "`headers`"),
        ];
        if let Some((_, named)) = named.iter().find(|(b, _)| *b == body) {
            assert!(r.json()["message"].as_str().unwrap().contains(named), "{body}: {r:?}");
        }
    }
    // Nothing was released: the pool is still full, and the slot still renews and releases.
    assert_eq!(s.acquire("", "").status, 429);
    assert_eq!(s.renew(&slot).status, 200);
    assert_eq!(s.release(&slot, r#"{"status":200}"#).json()["released"], true);
    s.acquire("", "").slot();
}

#[test]
fn a_bad_acquire_body_is_400_and_takes_no_slot() {
    let s = TestServer::start(&config(r#""concurrency":2"#, ""));
    for body in [r#"{"waitMs":"#, "[]", r#""waitMs""#, "0", "null", r#"{"waitMs":null}x"#] {
        let mut c = s.connect();
        let r = exchange(&mut c, &post(ACQUIRE, KEY, "", body));
        assert_error(&r, 400, "bad_request", body);
        assert_answer_closes(&mut c, &r, body);
    }
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-remaining-slots"), 1);
}

/// `post` with a body of any bytes.
fn post_bytes(path: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = post(path, KEY, "", "");
    let head = String::from_utf8(raw).unwrap().replace("Content-Length: 0", &format!("Content-Length: {}", body.len()));
    raw = head.into_bytes();
    raw.extend_from_slice(body);
    raw
}

#[test]
fn a_body_that_is_not_utf_8_is_400_on_every_route_and_changes_nothing() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let slot = s.acquire("", "").slot();
    let bodies: [&[u8]; 3] = [b"{\"a\xff\":1}", b"{\"note\":\"\xff\"}", b"{\"status\":200,\"x\":\"\xc3\"}"];
    for path in [ACQUIRE.to_string(), format!("/pools/p/lock/{slot}/renew"), release_path(&slot)] {
        for body in bodies {
            let what = format!("{path} {}", String::from_utf8_lossy(body));
            let mut c = s.connect();
            let r = exchange(&mut c, &post_bytes(&path, body));
            assert_error(&r, 400, "bad_request", &what);
            assert!(r.json()["message"].as_str().unwrap().contains("UTF-8"), "{what}: {r:?}");
        }
    }
    // Nothing was granted, renewed away or released: the pool is still full.
    assert_eq!(s.acquire("", "").status, 429);
    assert_eq!(s.release(&slot, "").status, 200);
}

#[test]
fn a_field_given_twice_is_named_as_such() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let r = s.request(&post(ACQUIRE, KEY, "", r#"{"waitMs":0,"waitMs":100}"#));
    assert_error(&r, 400, "bad_request", "waitMs twice");
    assert!(r.json()["message"].as_str().unwrap().contains("twice"), "{r:?}");
    let slot = s.acquire("", "").slot();
    let r = s.request(&post(&release_path(&slot), KEY, "", r#"{"status":200,"status":429}"#));
    assert_error(&r, 400, "bad_request", "status twice");
    assert!(r.json()["message"].as_str().unwrap().contains("twice"), "{r:?}");
    // A header may repeat: each value is a field line, as upstreams send them.
    let r = s.release(&slot, r#"{"status":200,"headers":{"x-a":"1","x-a":"2"}}"#);
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn header_values_a_client_library_typed_are_read_or_ignored_never_refused() {
    let s = TestServer::start(&config(r#""concurrency":1,"adaptive":true"#, ""));
    for headers in [
        r#"{"set-cookie":["a=1","b=2"],"x-ratelimit-limit":[60]}"#,
        r#"{"retry-after":null,"x-flag":true,"x-obj":{"a":1}}"#,
        r#"[["x-ratelimit-limit",60],["x-none",null]]"#,
        // Read as the strings they stand for: the budget is spent for 30 s.
        r#"{"x-ratelimit-remaining":0,"x-ratelimit-reset":30}"#,
    ] {
        let slot = s.acquire("", "").slot();
        let r = s.release(&slot, &format!(r#"{{"status":200,"headers":{headers}}}"#));
        assert_eq!(r.status, 200, "{headers}: {r:?}");
    }
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("rate")), "{r:?}");
    assert!((20..=30).contains(&r.header_u64("retry-after")), "{r:?}");
}

#[test]
fn nothing_after_an_answer_that_says_close_is_executed() {
    // `Connection: close` on an answer means the server reads no further
    // (RFC 9112 §9.6): an acquire pipelined behind a refused one must not run,
    // or it takes a slot whose grant the client will never read.
    let s = TestServer::start(&config(r#""concurrency":2"#, ""));
    let mut c = s.connect();
    let mut batch = post(ACQUIRE, KEY, "", r#"{"waitMs":-1}"#);
    batch.extend(post(ACQUIRE, KEY, "", ""));
    c.write_all(&batch).unwrap();
    let r = read_response(&mut c).expect("an answer to the bad acquire");
    assert_error(&r, 400, "bad_request", "negative waitMs");
    assert_answer_closes(&mut c, &r, "negative waitMs, then a pipelined acquire");
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-remaining-slots"), 1, "the pipelined acquire ran");
}

#[test]
fn bad_wait_budgets_are_400() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let mut cases: Vec<(String, String)> = Vec::new();
    let past_a_double = "9".repeat(400);
    for wait in ["-1", "1.5", r#""100""#, "-1e20", "2.5e-3", "true", "{}", "1e400", &past_a_double] {
        cases.push((String::new(), format!(r#"{{"waitMs":{wait}}}"#)));
    }
    // White space around a field value is SP and HTAB only (RFC 9110 §5.5):
    // a no-break or an em space beside the digits leaves them no number.
    for wait in ["-1", "1.5", "abc", "", "1 0", "+5", "0x10", "5\u{a0}", "\u{2003}5", "5\u{3000}"] {
        cases.push((format!("X-Nthpool-Queue-Timeout-Ms: {wait}\r\n"), String::new()));
    }
    for (header, body) in &cases {
        let what = format!("{header:?} {body:?}");
        let mut c = s.connect();
        let r = exchange(&mut c, &post(ACQUIRE, KEY, header, body));
        assert_error(&r, 400, "bad_request", &what);
        assert_answer_closes(&mut c, &r, &what);
    }
    // Good budgets on a free pool are grants; none of the above took the slot.
    let slot = s.acquire("X-Nthpool-Queue-Timeout-Ms: 0\r\n", r#"{"waitMs":86400000}"#).slot();
    s.release(&slot, "");
    let slot = s.acquire("X-Nthpool-Queue-Timeout-Ms: 250\r\n", "").slot();
    s.release(&slot, "");
}

#[test]
fn a_control_header_sent_twice_is_400_whichever_copy_is_valid() {
    // Which copy would count is a guess: a valid key beside a wrong one, a
    // wait budget beside a malformed one. None of them takes the slot.
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":8,"timeoutMs":1000}"#, ""));
    for header in [
        "X-Nthpool-Key: not-the-key\r\n",
        "X-Nthpool-Queue-Timeout-Ms: 300\r\nX-Nthpool-Queue-Timeout-Ms: abc\r\n",
        "X-Nthpool-Queue-Timeout-Ms: 300\r\nX-Nthpool-Queue-Timeout-Ms: 300\r\n",
        "Idempotency-Key: first\r\nIdempotency-Key: second\r\n",
        "Authorization: Bearer one\r\nAuthorization: Bearer two\r\n",
    ] {
        let mut c = s.connect();
        let r = exchange(&mut c, &post(ACQUIRE, KEY, header, ""));
        assert_error(&r, 400, "bad_request", header);
        assert!(r.json()["message"].as_str().unwrap().contains("twice"), "{header}: {r:?}");
    }
    let slot = s.acquire("X-Nthpool-Queue-Timeout-Ms: 300\r\n", "").slot();
    s.release(&slot, "");
}

#[test]
fn a_wait_budget_past_the_queue_timeout_is_clamped_to_it_however_large() {
    // The lock API clamps `waitMs` to the pool's queue timeout: a day, or a
    // number too large for 64 bits, waits the queue timeout and no longer.
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":8,"timeoutMs":200}"#, ""));
    let held = s.acquire("", "").slot();
    let mut cases: Vec<(String, String)> = Vec::new();
    for wait in ["86400001", "1e20", "18446744073709551616"] {
        cases.push((String::new(), format!(r#"{{"waitMs":{wait}}}"#)));
    }
    for wait in ["86400001", "99999999999999999999"] {
        cases.push((format!("X-Nthpool-Queue-Timeout-Ms: {wait}\r\n"), String::new()));
    }
    for (header, body) in &cases {
        let what = format!("{header:?} {body:?}");
        // The connection reads for 10 s at most: a budget not clamped would fail here.
        let r = exchange(&mut s.connect(), &post(ACQUIRE, KEY, header, body));
        assert_error(&r, 504, "queue_timeout", &what);
        // X-Nthpool-No-Queue still forces fail-fast.
        let no_queue = format!("{header}X-Nthpool-No-Queue: 1\r\n");
        let r = exchange(&mut s.connect(), &post(ACQUIRE, KEY, &no_queue, body));
        assert_error(&r, 429, "too_many_requests", &what);
    }
    s.release(&held, "");
}

#[test]
fn framing_attacks_get_400_or_413_and_a_closed_connection() {
    let s = TestServer::start(&config("", r#""maxBodyBytes":1024"#));
    let mut failures = Vec::new();
    for &(name, raw, status) in FRAMING {
        let mut c = s.connect();
        c.write_all(raw).unwrap();
        let Some(r) = read_response(&mut c) else {
            failures.push(format!("{name}: closed without an answer"));
            continue;
        };
        let code = framing::code_of(status);
        if r.status != status || r.error_code() != code {
            failures.push(format!("{name}: got {} {:?}", r.status, String::from_utf8_lossy(&r.body)));
            continue;
        }
        if r.header("connection").map(str::to_ascii_lowercase).as_deref() != Some("close") {
            failures.push(format!("{name}: no `Connection: close` on the answer"));
        }
        if !closed_by_server(&mut c) {
            failures.push(format!("{name}: connection left open"));
        }
    }
    assert!(failures.is_empty(), "framing cases that failed:\n{}", failures.join("\n"));
    // The server is unharmed and nothing smuggled took a slot.
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-remaining-slots"), 15);
}

#[test]
fn whitespace_before_the_first_field_is_named_apart_from_a_folded_line() {
    // RFC 9112 §2.2: whitespace after the request line folds nothing into
    // a field, so its `400` says what it is.
    let s = TestServer::start(&config("", ""));
    let first = format!("POST {ACQUIRE} HTTP/1.1\r\n Host: localhost\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let folded = format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n x\r\n\r\n");
    for (raw, says) in [
        (first, "Whitespace between the request line and the first header field is not accepted."),
        (folded, "Obsolete line folding is not accepted."),
    ] {
        let mut c = s.connect();
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", says);
        assert_eq!(r.json()["message"], says);
        assert_answer_closes(&mut c, &r, says);
    }
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-remaining-slots"), 15, "nothing took a slot");
}

#[test]
fn framing_attacks_behind_a_good_request_still_get_its_answer_first() {
    // A smuggling attempt pipelined after a valid request: the valid one is
    // answered, then the attack is refused and nothing after it is read.
    let s = TestServer::start(&config("", r#""maxBodyBytes":1024"#));
    for &(name, raw, status) in FRAMING {
        let mut c = s.connect();
        let mut batch = post(&release_path("x"), KEY, "", "");
        batch.extend_from_slice(raw);
        batch.extend(post(ACQUIRE, KEY, "", ""));
        c.write_all(&batch).unwrap();
        let first = read_response(&mut c).unwrap_or_else(|| panic!("{name}: no first answer"));
        assert_eq!(first.json()["released"], false, "{name}");
        let second = read_response(&mut c).unwrap_or_else(|| panic!("{name}: no answer to the attack"));
        assert_eq!(second.status, status, "{name}: {second:?}");
        assert_closed(&mut c, name);
    }
    assert_eq!(s.acquire("", "").header_u64("x-nthpool-remaining-slots"), 15, "no smuggled acquire ran");
}

#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let s = TestServer::start(&config("", r#""idleTimeoutMs":300"#));
    // After an answer, and without ever sending a byte.
    let mut used = s.connect();
    assert_eq!(exchange(&mut used, &post(&release_path("x"), KEY, "", "")).status, 200);
    let started = Instant::now();
    let mut silent = s.connect();
    assert_closed(&mut used, "idle after an answer");
    assert_closed(&mut silent, "idle from the start");
    // The server accepted `silent` after `started`, so it may not end sooner.
    assert!(started.elapsed() >= Duration::from_millis(290), "closed before the idle timeout");
}

#[test]
fn an_empty_line_after_a_request_leaves_the_connection_idle() {
    // RFC 9112 §2.2: some clients end a POST body with an extra CRLF, which
    // the next parse skips. Until a request follows, the connection is idle:
    // `idleTimeoutMs` closes it, not `headTimeoutMs`, as for any idle one.
    let s = TestServer::start(&config("", r#""headTimeoutMs":200,"idleTimeoutMs":30000"#));
    let mut c = s.connect();
    let mut raw = post(&release_path("x"), KEY, "", "");
    raw.extend_from_slice(b"\r\n");
    assert_eq!(exchange(&mut c, &raw).status, 200);
    thread::sleep(Duration::from_millis(800));
    let r = exchange(&mut c, &post(ACQUIRE, KEY, "", ""));
    assert_eq!(r.status, 200, "still open after the head deadline: {r:?}");
    // The line in two reads, and the request after it.
    c.write_all(b"\r").unwrap();
    thread::sleep(Duration::from_millis(100));
    c.write_all(b"\n").unwrap();
    thread::sleep(Duration::from_millis(800));
    let r = exchange(&mut c, &post(&release_path(&r.slot()), KEY, "", ""));
    assert_eq!(r.json()["released"], true, "{r:?}");
    // A head that has begun is still held to its deadline.
    c.write_all(b"\r\nP").unwrap();
    assert_closed(&mut c, "a head begun after an empty line");
}

#[test]
fn a_chunked_body_whose_framing_outgrows_the_input_buffer_is_413() {
    // Tiny chunks behind 1000-byte extensions: a 100-byte body in 100 KB of
    // framing, more than the connection buffers (16 KiB + 2 x maxBodyBytes + 64 KiB).
    let s = TestServer::start(&config("", r#""maxBodyBytes":1024"#));
    let ext = "x".repeat(1000);
    let chunk = format!("1;e={ext}\r\na\r\n");
    let mut raw = format!(
        "POST /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..100 {
        raw.extend_from_slice(chunk.as_bytes());
    }
    let mut c = s.connect();
    // The server may stop reading once it has answered; a failed write is expected then.
    let _ = c.write_all(&raw);
    let r = read_response(&mut c).expect("an answer, not a stall until the head deadline");
    assert_error(&r, 413, "payload_too_large", "chunked framing over the buffer");
    assert_answer_closes(&mut c, &r, "chunked framing over the buffer");
}

/// `Date` in IMF-fixdate (RFC 9110 §6.6.1), close to the real time.
#[track_caller]
fn assert_date(r: &Response, what: &str) {
    let date = r.header("date").unwrap_or_else(|| panic!("{what}: no Date header: {r:?}"));
    assert_eq!(date.len(), 29, "{what}: {date:?}");
    assert!(date.ends_with(" GMT") && date.as_bytes()[3] == b',', "{what}: {date:?}");
}

#[test]
fn every_answer_carries_a_date() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    let grant = s.acquire("", "");
    assert_date(&grant, "grant");
    assert_date(&s.acquire("", ""), "429");
    assert_date(&s.release(&grant.slot(), r#"{"status":200}"#), "release");
    assert_date(&s.request(&post("/nowhere", KEY, "", "")), "404");
    assert_date(&s.request(b"POST / HTTP/1.1\r\n\r\n"), "400 without Host");
}

#[test]
fn an_invalid_host_value_is_400_and_closes() {
    let s = TestServer::start(&config("", ""));
    for host in ["exa mple", "user@127.0.0.1", "127.0.0.1/path", "a, b", "x:abc", "[::1", "x:65536", "x:1:2"] {
        let mut c = s.connect();
        let raw =
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", host);
        assert_answer_closes(&mut c, &r, host);
    }
    for host in ["localhost", "127.0.0.1:7070", "[::1]:80", "api.example.com", "x:"] {
        let raw =
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
        let r = s.request(raw.as_bytes());
        assert_eq!(r.status, 200, "{host}: {r:?}");
        s.release(&r.slot(), r#"{"status":200}"#);
    }
    // A connection remembers its last valid Host; a bad one after it is still refused.
    for bad in ["127.0.0.1:7070/", "127.0.0.1:707x", "127.0.0.1 7070"] {
        let mut c = s.connect();
        let acquire = |host: &str| {
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n")
        };
        for _ in 0..2 {
            let r = exchange(&mut c, acquire("127.0.0.1:7070").as_bytes());
            assert_eq!(r.status, 200, "{r:?}");
            s.release(&r.slot(), r#"{"status":200}"#);
        }
        let r = exchange(&mut c, acquire(bad).as_bytes());
        assert_error(&r, 400, "bad_request", bad);
        assert_answer_closes(&mut c, &r, bad);
    }
}

/// RFC 3986 §3.2.2: inside brackets only an IPv6 address or an `IPvFuture`,
/// and a `%` in a name only as `%XX`; anything else is not a host, in `Host`
/// or in an absolute-form target alike.
#[test]
fn a_malformed_ip_literal_or_percent_encoding_in_host_is_400_and_closes() {
    let s = TestServer::start(&config("", ""));
    let bad = ["[1]", "[:::::]", "[1.2.3.4]", "[::1::2]", "[12345::]:80", "[v.x]", "%zz", "a%4", "local%host"];
    for host in bad {
        let mut c = s.connect();
        let raw =
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", host);
        assert_answer_closes(&mut c, &r, host);
        let mut c = s.connect();
        let raw = format!(
            "POST http://{host}{ACQUIRE} HTTP/1.1\r\nHost: x\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n"
        );
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", host);
        assert_answer_closes(&mut c, &r, host);
    }
    for host in ["[::ffff:127.0.0.1]:7070", "[v1.x]", "local%2Dhost"] {
        let raw =
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
        let r = s.request(raw.as_bytes());
        assert_eq!(r.status, 200, "{host}: {r:?}");
        s.release(&r.slot(), r#"{"status":200}"#);
    }
}

#[test]
fn an_absolute_form_target_is_served_with_its_authority_as_host() {
    let s = TestServer::start(&config("", r#""publicHost":"api.example.com""#));
    let raw = |authority: &str| {
        format!(
            "POST http://{authority}{ACQUIRE} HTTP/1.1\r\nHost: elsewhere\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n"
        )
    };
    let mut c = s.connect();
    let r = exchange(&mut c, raw("api.example.com:7070").as_bytes());
    assert_eq!(r.status, 200, "{r:?}");
    let release = format!(
        "POST HTTP://api.example.com{} HTTP/1.1\r\nHost: api.example.com\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 14\r\n\r\n{{\"status\":200}}",
        release_path(&r.slot())
    );
    assert_eq!(exchange(&mut c, release.as_bytes()).json()["released"], true);
    // The authority, not Host, is checked against publicHost.
    assert_error(&exchange(&mut c, raw("other.example.com").as_bytes()), 404, "not_found", "other authority");
    let mut bad = s.connect();
    let r = exchange(&mut bad, raw("user@api.example.com").as_bytes());
    assert_error(&r, 400, "bad_request", "authority with userinfo");
    assert_answer_closes(&mut bad, &r, "authority with userinfo");
}

/// `http://host` with no path is the path `/` (RFC 9112 §3.2.2), and so is
/// `http://host?q`'s empty one; the server answers them, again on the same
/// connection, and goes on serving.
#[test]
fn an_absolute_form_target_without_a_path_is_the_root() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    // An empty path before a query is `/` too (RFC 9110 §4.2.3).
    for target in ["api.example.com", "api.example.com", "API.example.com:80", "api.example.com?x=1"] {
        let authority = target.split('?').next().unwrap();
        let raw = format!("GET http://{target} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        assert_error(&exchange(&mut c, raw.as_bytes()), 404, "not_found", &raw);
    }
    let raw =
        format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(exchange(&mut c, raw.as_bytes()).status, 200);
    assert_eq!(exchange(&mut s.connect(), raw.as_bytes()).status, 200);
}

/// `OPTIONS *` asks what the server as a whole supports: `200` with `Allow`,
/// on the same connection. `CONNECT host:port` asks for a tunnel, which
/// this server does not open: `501` and close.
#[test]
fn options_asterisk_is_answered_and_connect_is_not_implemented() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    for _ in 0..2 {
        let r = exchange(&mut c, b"OPTIONS * HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("allow"), Some("POST"), "{r:?}");
        assert_eq!(r.header("content-length"), Some("0"), "{r:?}");
        assert!(r.body.is_empty());
    }
    let raw =
        format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(exchange(&mut c, raw.as_bytes()).status, 200, "served on after OPTIONS *");
    for (what, bad) in [
        ("OPTIONS with another asterisk", "OPTIONS *x HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        ("asterisk for another method", "GET * HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    ] {
        let mut c = s.connect();
        let r = exchange(&mut c, bad.as_bytes());
        assert_error(&r, 400, "bad_request", what);
        assert_answer_closes(&mut c, &r, what);
    }
    let mut c = s.connect();
    let r = exchange(&mut c, b"CONNECT localhost:80 HTTP/1.1\r\nHost: localhost:80\r\n\r\n");
    assert_error(&r, 501, "not_implemented", "CONNECT");
    assert_answer_closes(&mut c, &r, "CONNECT");
    assert_eq!(exchange(&mut s.connect(), raw.as_bytes()).status, 200);
    // The admin listener serves GET and HEAD.
    let mut c = s.connect_admin();
    let r = exchange(&mut c, b"OPTIONS * HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!((r.status, r.header("allow"), r.header("content-length")), (200, Some("GET, HEAD"), Some("0")), "{r:?}");
    assert_eq!(exchange(&mut c, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").status, 200);
}

/// A request target holds no fragment, backslash, quote, angle bracket,
/// backquote or byte past ASCII (RFC 9112 §3.2, RFC 3986): `400` and close,
/// whether the line is the connection's first or follows one it remembers.
#[test]
fn a_target_with_a_byte_no_uri_holds_is_400_and_closes() {
    let s = TestServer::start(&config("", ""));
    let acquire = |target: &[u8]| {
        [
            b"POST ",
            target,
            format!(" HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
        ]
        .concat()
    };
    let bad: [&[u8]; 7] = [
        b"/pools/p/lock/acquire?x#y",
        b"/pools/p/lock/acquire?a\\b",
        b"/pools/p/lock/acquire?a=\"b\"",
        b"/pools/p/lock/acquire?<b>",
        b"/pools/p/lock/acquire?`b`",
        b"/pools/p/lock/acquire?caf\xc3\xa9",
        b"/pools/p/lock/acquire?\xff\xfe",
    ];
    // The message names what is wrong with the target, a byte past ASCII too.
    let names_the_byte = |r: &Response, what: &str| {
        let message = r.json()["message"].as_str().map(str::to_string).unwrap_or_default();
        assert!(message.starts_with("The request target holds a byte a URI may not"), "{what}: {message}");
    };
    for target in bad {
        let what = String::from_utf8_lossy(target);
        let mut c = s.connect();
        let r = exchange(&mut c, &acquire(target));
        assert_error(&r, 400, "bad_request", &what);
        names_the_byte(&r, &what);
        assert_answer_closes(&mut c, &r, &what);
        // After a good request whose line is the same length but for the bad byte.
        let mut c = s.connect();
        let good: Vec<u8> = target
            .iter()
            .map(|&b| if b.is_ascii_alphanumeric() || b == b'/' || b == b'?' { b } else { b'z' })
            .collect();
        for _ in 0..2 {
            let r = exchange(&mut c, &acquire(&good));
            assert_eq!(r.status, 200, "{what}: {r:?}");
            s.release(&r.slot(), r#"{"status":200}"#);
        }
        let r = exchange(&mut c, &acquire(target));
        assert_error(&r, 400, "bad_request", &what);
        names_the_byte(&r, &what);
        assert_answer_closes(&mut c, &r, &what);
    }
    // A release or renew read by comparison with the one before on its
    // connection (only its slot id differs) gets the same 400 for such a byte.
    for (route, byte) in [("release", b'<'), ("renew", b'`'), ("release", b'"'), ("renew", b'\\')] {
        let what = format!("a {route} whose slot id holds {:?}", byte as char);
        let slots: Vec<String> = (0..3).map(|_| s.request(&post(ACQUIRE, KEY, "", "")).slot()).collect();
        let path = |slot: &str| format!("/pools/p/lock/{slot}/{route}");
        // Two good ones first: the second is read by comparison with the
        // first, and what it was found to be is kept for the third.
        let mut c = s.connect();
        for slot in &slots[..2] {
            assert_eq!(exchange(&mut c, &post(&path(slot), KEY, "", "")).status, 200, "{what}");
        }
        let mut bad = slots[2].clone().into_bytes();
        bad[10] = byte;
        let raw = [b"POST ".as_slice(), path(&String::from_utf8(bad).unwrap()).as_bytes(), &post("", KEY, "", "")[5..]]
            .concat();
        let r = exchange(&mut c, &raw);
        assert_error(&r, 400, "bad_request", &what);
        assert_answer_closes(&mut c, &r, &what);
        for slot in &slots {
            s.release(slot, "");
        }
    }
    // Bytes outside the URI grammar that clients send unencoded in queries pass.
    let r = s.request(&acquire(b"/pools/p/lock/acquire?a={b}|c^d[0]"));
    assert_eq!(r.status, 200, "{r:?}");
    s.release(&r.slot(), r#"{"status":200}"#);
}

/// An empty `Host`, with or without a port, names no host (RFC 9110 §4.2.1).
#[test]
fn an_empty_host_is_400_and_closes() {
    let s = TestServer::start(&config("", ""));
    for host in ["", ":80", " "] {
        let mut c = s.connect();
        let raw =
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost:{host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", &format!("Host {host:?}"));
        assert_answer_closes(&mut c, &r, host);
    }
}

#[test]
fn a_later_http_1_minor_version_is_served_as_1_1() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let raw =
        format!("POST {ACQUIRE} HTTP/1.2\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
    let r = exchange(&mut c, raw.as_bytes());
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("connection"), None, "kept alive as 1.1: {r:?}");
    assert_open(&mut c, "after HTTP/1.2");
    let mut c = s.connect();
    let r = exchange(&mut c, format!("POST {ACQUIRE} HTTP/2.0\r\nHost: localhost\r\n\r\n").as_bytes());
    assert_error(&r, 505, "http_version_not_supported", "HTTP/2.0");
    // The verdict waits for the whole request line: the same bytes get the
    // same answer however they were split into writes.
    let split = |line: &str, cut: usize| {
        let raw = format!("{line}\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n");
        let mut c = s.connect();
        c.write_all(&raw.as_bytes()[..cut]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        exchange(&mut c, &raw.as_bytes()[cut..])
    };
    for line in [format!("POST {ACQUIRE} HTTP/3.0"), format!("POST {ACQUIRE} HTTP/2.0"), "PRI * HTTP/2.0".into()] {
        let r = split(&line, line.len() - 2);
        assert_error(&r, 505, "http_version_not_supported", &format!("{line} cut before its last two bytes"));
    }
    let line = format!("POST {ACQUIRE} HTTP/1.2");
    let r = split(&line, line.len());
    assert_eq!(r.status, 200, "HTTP/1.2 cut before its CRLF: {r:?}");
    s.release(&r.slot(), "");
}

#[test]
fn an_unknown_transfer_coding_is_501_and_closes() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let raw = format!(
        "POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    );
    let r = exchange(&mut c, raw.as_bytes());
    assert_error(&r, 501, "not_implemented", "gzip, chunked");
    assert_answer_closes(&mut c, &r, "gzip, chunked");
    // With a Content-Length too, in either order, it is both at once: `400`.
    for fields in [
        "Transfer-Encoding: gzip, chunked\r\nContent-Length: 5",
        "Content-Length: 5\r\nTransfer-Encoding: gzip, chunked",
    ] {
        let mut c = s.connect();
        let raw =
            format!("POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n{fields}\r\n\r\n0\r\n\r\n");
        let r = exchange(&mut c, raw.as_bytes());
        assert_error(&r, 400, "bad_request", fields);
        assert_answer_closes(&mut c, &r, fields);
    }
}

#[test]
fn expect_continue_from_http_1_0_gets_no_interim_answer() {
    let s = TestServer::start(&config("", ""));
    let mut c = s.connect();
    let body = r#"{"waitMs":0}"#;
    let head = format!(
        "POST {ACQUIRE} HTTP/1.0\r\nX-Nthpool-Key: {KEY}\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    // Nothing may come before the body is sent: a 1xx would be an error for
    // an HTTP/1.0 client (RFC 9110 §10.1.1).
    c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 64];
    match c.read_some(&mut buf) {
        Ok(n) => panic!("the server answered before the body: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{e}"),
    }
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    let r = read_response(&mut c).expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
}

/// `100-continue` is the only expectation (RFC 9110 §10.1.1): any other
/// member of `Expect` is `417` at once, before a body, and the request has
/// no effect; on the admin listener too.
#[test]
fn an_expectation_other_than_100_continue_is_417_and_closes() {
    let s = TestServer::start(&config(r#""concurrency":1"#, ""));
    for (what, expect, body) in [
        ("unknown, no body", "200-ok", ""),
        ("listed beside 100-continue, body not sent", "100-continue, x-later", r#"{"waitMs":0}"#),
        ("100-continue with a parameter", "100-continue;q=1", ""),
    ] {
        let mut c = s.connect();
        let head = format!(
            "POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nExpect: {expect}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let r = exchange(&mut c, head.as_bytes());
        assert_error(&r, 417, "expectation_failed", what);
        assert_answer_closes(&mut c, &r, what);
    }
    let counted = |series: &str| s.metric(series).unwrap_or_else(|| panic!("no {series}"));
    let refused = counted(r#"nthpool_rejections_total{code="417"}"#)
        + counted(r#"nthpool_rejections_total{pool="p",code="417"}"#);
    assert_eq!(refused, 3.0, "every 417 is counted");
    // None of them took the pool's one slot; a list that is only
    // 100-continue (empty members aside) is the known expectation.
    let mut c = s.connect();
    let head = format!(
        "POST {ACQUIRE} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nExpect: 100-Continue,\r\nContent-Length: 2\r\n\r\n"
    );
    assert_eq!(exchange(&mut c, head.as_bytes()).status, 100);
    let r = exchange(&mut c, b"{}");
    assert_eq!(r.status, 200, "the one slot is still free: {r:?}");
    r.slot();

    let mut c = s.connect_admin();
    let r = exchange(&mut c, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nExpect: 200-ok\r\n\r\n");
    assert_error(&r, 417, "expectation_failed", "admin listener");
    assert_answer_closes(&mut c, &r, "admin listener");
}

/// A connection remembers the header blocks it sent last (the head memo):
/// the same fields after another request line, a changed field, a body
/// length that differs, and a bad request line before a remembered block
/// each get the answer a fresh connection would give.
#[test]
fn remembered_header_blocks_never_carry_a_verdict_over() {
    let s = TestServer::start(&config(r#""concurrency":4"#, ""));
    let mut c = s.connect();
    let granted = |c: &mut TcpStream| {
        let r = exchange(c, &post(ACQUIRE, KEY, "", ""));
        assert_eq!(r.status, 200, "{r:?}");
        r.slot()
    };
    let first = granted(&mut c);
    let second = granted(&mut c);
    // The same length of key, one byte apart: refused, and then the good one is served again.
    let r = exchange(&mut c, &post(ACQUIRE, "test-key-0002", "", ""));
    assert_error(&r, 401, "unauthorized", "another key");
    let third = granted(&mut c);
    // Releases alternate with acquires: the release block after each release line.
    for slot in [&first, &second] {
        let r = exchange(&mut c, &post(&release_path(slot), KEY, "", r#"{"status":200}"#));
        assert_eq!(r.json()["released"], true, "{r:?}");
        granted(&mut c);
    }
    let r = exchange(&mut c, &post(&release_path(&first), KEY, "", r#"{"status":200}"#));
    assert_eq!(r.json()["released"], false, "released twice: {r:?}");
    // A body of another length is framed by its own Content-Length.
    let r = exchange(&mut c, &post(&release_path(&third), KEY, "", r#"{"status":200,"throttled":0}"#));
    assert_eq!(r.json()["released"], true, "{r:?}");
    // The acquire's fields after another method and another route.
    let r = exchange(&mut c, &with_method("GET", post(ACQUIRE, KEY, "", "")));
    assert_error(&r, 405, "method_not_allowed", "GET with remembered fields");
    let r = exchange(&mut c, &post("/pools/p/lock/abc/cancel", KEY, "", ""));
    assert_error(&r, 404, "not_found", "unknown action with remembered fields");
    // A Host the memo has not seen, then a request line ended by a bare LF
    // before the remembered fields: both judged in full.
    let r = exchange(&mut c, &with_host("exa mple", post(ACQUIRE, KEY, "", "")));
    assert_error(&r, 400, "bad_request", "a bad Host after good ones");
    assert_answer_closes(&mut c, &r, "a bad Host after good ones");
    let mut c = s.connect();
    granted(&mut c);
    let mut raw = post(ACQUIRE, KEY, "", "");
    let cr = raw.iter().position(|&b| b == b'\r').unwrap();
    raw.remove(cr);
    let r = exchange(&mut c, &raw);
    assert_error(&r, 400, "bad_request", "a bare LF ending the request line");
    assert_answer_closes(&mut c, &r, "a bare LF ending the request line");
}

/// `raw` (a request from `post`) with another `Host` value.
fn with_host(host: &str, raw: Vec<u8>) -> Vec<u8> {
    String::from_utf8(raw).unwrap().replace("Host: localhost", &format!("Host: {host}")).into_bytes()
}
