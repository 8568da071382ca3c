//! Hostile clients against the real server: slowloris heads, clients that
//! never read, too many connections, garbage bytes, half-closed sockets.
//! Each test checks that the server protects itself (closes or refuses the
//! offender) and that a well-behaved client is still served meanwhile.
//!
//! Nothing here asserts on speed: "eventually" gets a generous bound, and
//! every loop is bounded in requests and time.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACQUIRE: &str = "/pools/p/lock/acquire";

fn connect(addr: SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_nodelay(true).unwrap();
    c
}

/// One acquire and its release on a fresh connection, the way a normal caller
/// behaves; panics unless both are answered with success.
fn acquire_release(addr: SocketAddr) {
    let mut c = connect(addr);
    c.write_all(&post(ACQUIRE, KEY, "", "")).unwrap();
    let slot = read_response(&mut c).expect("an answer to a normal acquire").slot();
    c.write_all(&post(&format!("/pools/p/lock/{slot}/release"), KEY, "", "")).unwrap();
    let r = read_response(&mut c).expect("an answer to a normal release");
    assert_eq!(r.json()["released"], true, "{r:?}");
}

/// How a connection ended, as seen by a reader that takes everything.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// EOF or a reset: the server closed it.
    Closed,
    /// Nothing more within the read timeout: the server kept it open.
    StillOpen,
}

/// Reads until the server closes or `quiet` passes without a byte; returns
/// what arrived and how it ended.
fn read_to_end(c: &mut TcpStream, quiet: Duration) -> (Vec<u8>, End) {
    c.set_read_timeout(Some(quiet)).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match c.read_some(&mut buf) {
            Ok(0) => return (got, End::Closed),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return (got, End::StillOpen),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return (got, End::Closed),
        }
    }
}

/// Answers to `SMALL` requests in a byte stream, counted by their status
/// lines (their body, "No such route.", never contains one).
fn count_answers(bytes: &[u8]) -> usize {
    bytes.windows(9).filter(|w| w == b"HTTP/1.1 ").count()
}

/// The first answer in `bytes` and what follows it; an error when the head is
/// incomplete or the body is shorter than its `Content-Length`.
fn parse_answer(bytes: &[u8]) -> Result<(Response, &[u8]), String> {
    let shown = || String::from_utf8_lossy(bytes).into_owned();
    let end =
        bytes.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| format!("no whole head in {:?}", shown()))? + 4;
    let text = std::str::from_utf8(&bytes[..end]).map_err(|_| format!("head is not UTF-8: {:?}", shown()))?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {:?}", shown()))?;
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let len = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map_or(Ok(0), |(_, v)| v.parse::<usize>())
        .map_err(|_| format!("bad Content-Length in {:?}", shown()))?;
    let rest = &bytes[end..];
    if rest.len() < len {
        return Err(format!("Content-Length says {len} but the body has {} bytes: {:?}", rest.len(), shown()));
    }
    Ok((Response { status, headers, body: rest[..len].to_vec() }, &rest[len..]))
}

/// The soft limit on open files, from /proc (no libc here to raise it).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Runs acquire+release cycles against `addr` until `stop`, counting them;
/// any cycle that is not answered fails the thread.
fn normal_client(addr: SocketAddr, stop: Arc<AtomicBool>, cycles: Arc<AtomicUsize>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let give_up = Instant::now() + Duration::from_secs(40);
        while !stop.load(Ordering::SeqCst) && Instant::now() < give_up {
            acquire_release(addr);
            cycles.fetch_add(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(20));
        }
    })
}

#[test]
fn slowloris_heads_are_cut_at_the_head_deadline_while_others_are_served() {
    const HEAD_MS: u64 = 1000;
    const DRIP: Duration = Duration::from_millis(300);
    // The server inherits this process's descriptor limit, and both ends hold
    // one descriptor per connection; other tests of this file run alongside.
    let budget = open_files_limit().map_or(400, |limit| limit.saturating_sub(250));
    let count = budget.min(1000);
    assert!(count >= 100, "too few file descriptors for a slowloris test ({budget})");

    let s = TestServer::start(&config("", &format!(r#""headTimeoutMs":{HEAD_MS},"idleTimeoutMs":60000"#)));
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let normal = normal_client(s.addr, stop.clone(), cycles.clone());

    // A head that never ends: one byte of it every DRIP.
    let head: &[u8] =
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    struct Loris {
        c: TcpStream,
        started: Instant,
        last_drip: Instant,
        sent: usize,
        closed: Option<Instant>,
    }
    // Connect them all first, then start every head at once, so the clock of
    // each starts when its first byte goes out, not while others connect.
    let idle: Vec<TcpStream> = (0..count)
        .map(|_| {
            let c = TcpStream::connect(s.addr).unwrap();
            c.set_nodelay(true).unwrap();
            c
        })
        .collect();
    let mut lorises: Vec<Loris> = idle
        .into_iter()
        .map(|mut c| {
            let started = Instant::now();
            c.write_all(&head[..1]).unwrap();
            c.set_nonblocking(true).unwrap();
            Loris { c, started, last_drip: started, sent: 1, closed: None }
        })
        .collect();
    let cycles_at_attack = cycles.load(Ordering::SeqCst);

    let give_up = lorises.last().unwrap().started + Duration::from_millis(HEAD_MS + 8000);
    let mut buf = [0u8; 512];
    while lorises.iter().any(|l| l.closed.is_none()) && Instant::now() < give_up {
        for l in lorises.iter_mut().filter(|l| l.closed.is_none()) {
            let now = Instant::now();
            match l.c.read_some(&mut buf) {
                Ok(0) => l.closed = Some(now),
                // An answer (a 408, say) is allowed before the close.
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => l.closed = Some(now),
            }
            if l.closed.is_none() && now.duration_since(l.last_drip) >= DRIP {
                l.last_drip = now;
                match l.c.write(&head[l.sent % head.len()..][..1]) {
                    Ok(_) => l.sent += 1,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => l.closed = Some(now),
                }
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    normal.join().expect("every normal acquire and release was answered during the attack");
    let during = cycles.load(Ordering::SeqCst) - cycles_at_attack;

    let open = lorises.iter().filter(|l| l.closed.is_none()).count();
    assert_eq!(open, 0, "{open} of {count} slowloris connections were still open after their head deadline");
    for (i, l) in lorises.iter().enumerate() {
        let lived = l.closed.unwrap().duration_since(l.started);
        assert!(
            lived >= Duration::from_millis(HEAD_MS - 50),
            "slowloris {i} was closed after {lived:?}, before its head deadline"
        );
        assert!(
            lived <= Duration::from_millis(HEAD_MS + 4000),
            "slowloris {i} was closed only after {lived:?} (head deadline {HEAD_MS} ms)"
        );
    }
    assert!(during >= 1, "no normal cycle completed during the attack");
    // The server is still whole after the attack.
    acquire_release(s.addr);
}

/// A request that costs almost nothing to send and gets a much longer answer.
const SMALL: &[u8] = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n";

/// Writes pipelined `SMALL` requests until the socket stops taking them for
/// `stall`, or `cap` bytes; returns the whole requests written.
fn pipeline_until_stalled(c: &mut TcpStream, stall: Duration, cap: usize) -> usize {
    c.set_write_timeout(Some(stall)).unwrap();
    let batch: Vec<u8> = SMALL.iter().copied().cycle().take(SMALL.len() * 2048).collect();
    let mut written = 0usize;
    while written < cap {
        let at = written % batch.len();
        match c.write(&batch[at..]) {
            Ok(n) => written += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    written / SMALL.len()
}

#[test]
fn a_client_that_never_reads_is_cut_off_and_closed() {
    const WRITE_MS: u64 = 1000;
    const CAP: usize = 64 * 1024 * 1024;
    let s = TestServer::start(&config("", &format!(r#""writeTimeoutMs":{WRITE_MS}"#)));
    let mut hog = connect(s.addr);
    let sent = pipeline_until_stalled(&mut hog, Duration::from_millis(500), CAP);
    assert!(sent * SMALL.len() < CAP, "the server read {CAP} bytes from a client that reads nothing");

    // Others are served while the hog is stuck.
    for _ in 0..3 {
        acquire_release(s.addr);
    }
    // The hog's answers are not taken for writeTimeoutMs: the server closes it.
    thread::sleep(Duration::from_millis(WRITE_MS + 1500));
    let (got, end) = read_to_end(&mut hog, Duration::from_secs(5));
    assert_eq!(end, End::Closed, "the server kept a client that read nothing for {} ms", WRITE_MS + 1500);
    let answered = count_answers(&got);
    assert!(answered < sent, "all {sent} requests were answered: the server never stopped");
    acquire_release(s.addr);
}

#[test]
fn grants_the_kernel_took_reach_a_client_cut_off_for_not_reading() {
    // Pipelined acquires whose answers are not read: the server stops reading
    // past its output mark and closes the client at writeTimeoutMs, releasing
    // the grants still in its own buffer. Those the kernel took are held, so
    // the close must not destroy them: input left unread would make it a
    // reset, and the client could never see, renew or release those slots.
    const WRITE_MS: u64 = 500;
    let pool = r#""concurrency":1000000,"adaptive":false"#;
    let s = TestServer::start(&config(pool, &format!(r#""writeTimeoutMs":{WRITE_MS}"#)));
    let mut c = connect(s.addr);
    // About 2.7 MB: more than the server reads before the answers (some
    // 4 MB in the kernel, then its output mark) stop it, less than the 4 MiB
    // it drains from a client it cut off.
    let acquire = post(ACQUIRE, KEY, "", "");
    let all: Vec<u8> = acquire.iter().copied().cycle().take(acquire.len() * 30_000).collect();
    let mut writer = c.try_clone().unwrap();
    writer.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let write = thread::spawn(move || writer.write_all(&all).is_ok());
    thread::sleep(Duration::from_millis(WRITE_MS + 1500));
    let (got, end) = read_to_end(&mut c, Duration::from_secs(5));
    assert_eq!(end, End::Closed, "the server kept a client that read nothing");
    let mut received = 0;
    let mut rest = &got[..];
    while let Ok((r, after)) = parse_answer(rest) {
        assert_eq!(r.status, 200, "{r:?}");
        received += 1;
        rest = after;
    }
    let held = s.metric(r#"nthpool_slots_held{pool="p"}"#).unwrap() as usize;
    assert!(held > 0, "no grant was taken by the kernel");
    assert_eq!(received, held, "held grants the client never received (of {} bytes read)", got.len());
    assert!(received < 30_000, "every acquire was answered: the server never stopped reading");
    assert!(write.join().unwrap(), "the pipeline was reset, not drained");
}

#[test]
fn a_client_that_reads_late_still_gets_every_answer() {
    // The output cap stops reading from a client that does not read; once it
    // reads again, every pipelined request must be answered, including the
    // ones still in the kernel when reading stopped.
    const REQUESTS: usize = 60_000;
    let s = TestServer::start(&config("", r#""writeTimeoutMs":20000"#));
    let c = connect(s.addr);
    let mut writer = c.try_clone().unwrap();
    let all: Vec<u8> = SMALL.iter().copied().cycle().take(SMALL.len() * REQUESTS).collect();
    let write = thread::spawn(move || writer.write_all(&all).is_ok());
    thread::sleep(Duration::from_millis(1500));
    acquire_release(s.addr);

    let mut reader = c;
    reader.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answered = 0;
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let give_up = Instant::now() + Duration::from_secs(30);
    while answered < REQUESTS && Instant::now() < give_up {
        match reader.read_some(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Status lines may straddle reads: keep the last few bytes.
                tail.extend_from_slice(&buf[..n]);
                answered += count_answers(&tail);
                let keep = tail.len().min(8);
                tail.drain(..tail.len() - keep);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    assert_eq!(answered, REQUESTS, "pipelined requests left unanswered after the client caught up");
    assert!(write.join().unwrap(), "the server stopped taking the pipeline");
}

#[test]
fn a_client_reading_slower_than_the_kernel_reports_room_is_not_cut() {
    // Answers fill the server's socket buffer (megabytes) far beyond what
    // this client reads in `writeTimeoutMs`, and the kernel reports the
    // socket writable only once a third of it drained: writability stays
    // silent for longer than the write timeout though the client reads all
    // along. The write the server tries at the deadline sees the progress.
    // Two seconds, not one: a loaded machine may hold this reader back for
    // a second, and the server is right to cut a client that reads nothing
    // for its write timeout.
    let s = TestServer::start(&config("", r#""headTimeoutMs":2000,"writeTimeoutMs":2000"#));
    let c = connect(s.addr);
    socket2::SockRef::from(&c).set_recv_buffer_size(8 * 1024).unwrap();
    let mut writer = c.try_clone().unwrap();
    let one = post("/pools/p/lock/none/renew", KEY, "", "");
    // Megabytes of answers; the writer stops when the test drops the connection.
    thread::spawn(move || writer.write_all(&one.repeat(25_000)));
    let mut c = c;
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 4 * 1024];
    let (started, mut read) = (Instant::now(), 0);
    while started.elapsed() < Duration::from_millis(4500) {
        match c.read_some(&mut buf) {
            Ok(0) => panic!("closed after {read} bytes in {:?}", started.elapsed()),
            Ok(n) => read += n,
            Err(e) => panic!("{e} after {read} bytes in {:?}", started.elapsed()),
        }
        // About 400 KB/s: well over what the kernel lets a write overshoot
        // its buffer by (one segment), far under a third of the buffer.
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_burst_of_connections_while_the_server_is_busy_finds_room_in_the_backlog() {
    // While the loop accepts nothing (here: the process stopped), the
    // kernel completes handshakes up to the listen backlog. 500 clients
    // arriving at once all connect at once and are all served: with the
    // common default of 128, the rest would wait out a SYN retransmit.
    const BURST: usize = 500;
    let s = TestServer::start(&config("", ""));
    let mut burst = Vec::new();
    s.while_stopped(|| {
        for i in 0..BURST {
            let c = TcpStream::connect_timeout(&s.addr, Duration::from_millis(300))
                .unwrap_or_else(|e| panic!("connection {i} of the burst: {e}"));
            burst.push(c);
        }
    });
    let probe = post("/pools/p/lock/none/release", KEY, "", "");
    for (i, c) in burst.iter_mut().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(&probe).unwrap();
        let r = read_response(c).unwrap_or_else(|| panic!("connection {i} of the burst was not served"));
        assert_eq!(r.status, 200, "{r:?}");
    }
}

#[test]
fn a_deep_pipeline_read_slowly_but_steadily_is_not_cut() {
    // Megabytes of answers pipelined ahead of a client that takes them at a
    // few MB/s: the server holds back reading (its backpressure), and the
    // kernel reports the socket writable only in large steps. Neither the
    // head timeout of the requests held back nor the write timeout may cut
    // a client that keeps reading; every answer arrives.
    const REQUESTS: usize = 30_000;
    let s = TestServer::start(&config("", r#""headTimeoutMs":400,"writeTimeoutMs":400"#));
    let c = connect(s.addr);
    socket2::SockRef::from(&c).set_recv_buffer_size(32 * 1024).unwrap();
    let mut writer = c.try_clone().unwrap();
    let one = post("/pools/p/lock/none/renew", KEY, "", "");
    let sending = thread::spawn(move || {
        let pipeline = one.repeat(1000);
        (0..REQUESTS / 1000).all(|_| writer.write_all(&pipeline).is_ok())
    });
    let mut c = c;
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut answers, mut tail, mut buf) = (0, Vec::new(), vec![0u8; 16 * 1024]);
    let started = Instant::now();
    while answers < REQUESTS {
        let n = match c.read_some(&mut buf) {
            Ok(0) => panic!("closed after {answers} answers, {:?} in", started.elapsed()),
            Ok(n) => n,
            Err(e) => panic!("{e} after {answers} answers, {:?} in", started.elapsed()),
        };
        // Counted across read boundaries: the last 8 bytes are kept.
        tail.extend_from_slice(&buf[..n]);
        answers += tail.windows(9).filter(|w| w == b"HTTP/1.1 ").count();
        tail.drain(..tail.len().saturating_sub(8));
        // About 3 MB/s: slower than the server writes.
        thread::sleep(Duration::from_millis(5));
    }
    assert!(sending.join().unwrap(), "the server stopped taking the pipeline");
    assert_eq!(answers, REQUESTS);
}

#[test]
fn connections_over_the_cap_get_503_and_are_closed() {
    const CAP: usize = 20;
    let s = TestServer::start(&config("", &format!(r#""maxConnections":{CAP},"idleTimeoutMs":60000"#)));
    let probe = post("/pools/p/lock/none/release", KEY, "", "");
    let served = |c: &mut TcpStream| -> Option<Response> {
        c.write_all(&probe).ok()?;
        read_response(c)
    };

    let mut held: Vec<TcpStream> = (0..CAP)
        .map(|i| {
            let mut c = connect(s.addr);
            let r = served(&mut c).unwrap_or_else(|| panic!("connection {i} under the cap was closed"));
            assert_eq!(r.status, 200, "connection {i} under the cap: {r:?}");
            c
        })
        .collect();

    // The one over the cap: its request, written before the answer is read,
    // is drained by a lingering close, so the answer ends in a clean EOF,
    // never a reset that could take the answer with it.
    let over_cap = |what: &str| {
        let mut c = connect(s.addr);
        c.write_all(&probe).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let ended = c.read_to_end(&mut got);
        assert!(ended.is_ok(), "{what}: the refusal ended in {ended:?}, not EOF");
        let (r, rest) = parse_answer(&got).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status, 503, "{what}: {r:?}");
        assert_eq!(r.error_code(), "unavailable", "{what}");
        // The limit is named with its number, as a 413 names its own.
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        let named = format!("The server already has the {CAP} open connections it accepts; retry shortly.");
        assert_eq!(message, named, "{what}");
        assert!(r.header_u64("retry-after") >= 1, "{what}");
        assert_eq!(r.header("connection"), Some("close"), "{what}");
        assert!(rest.is_empty(), "{what}: more after the 503: {:?}", String::from_utf8_lossy(rest));
    };
    over_cap("connection 21");
    over_cap("connection 22");

    // Close five; the server notices, and exactly five new ones are served.
    for c in held.drain(..5) {
        c.shutdown(Shutdown::Both).unwrap();
    }
    for i in 0..5 {
        let give_up = Instant::now() + Duration::from_secs(10);
        let c = loop {
            let mut c = connect(s.addr);
            match served(&mut c) {
                Some(r) if r.status == 200 => break c,
                Some(r) => assert_eq!(r.status, 503, "{r:?}"),
                None => {}
            }
            assert!(Instant::now() < give_up, "replacement {i} was never served after others closed");
            thread::sleep(Duration::from_millis(50));
        };
        held.push(c);
    }
    over_cap("connection 21 again");
    // The connections that stayed were not disturbed.
    for (i, c) in held.iter_mut().enumerate() {
        let r = served(c).unwrap_or_else(|| panic!("held connection {i} was closed"));
        assert_eq!(r.status, 200, "held connection {i}: {r:?}");
    }
}

/// One garbage payload and how to deliver it.
struct Garbage {
    name: String,
    bytes: Vec<u8>,
    /// Write the payload in pieces of this size (1 = a byte per write).
    piece: usize,
    /// Close right after writing, without reading anything.
    hang_up: bool,
}

fn garbage_cases() -> Vec<Garbage> {
    let case =
        |name: &str, bytes: Vec<u8>| Garbage { name: name.to_string(), bytes, piece: usize::MAX, hang_up: false };
    let mut cases = Vec::new();
    let mut rng = StdRng::seed_from_u64(0x6e74_6870_6f6f_6c21);
    for i in 0..12 {
        let len = rng.gen_range(1..6000);
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        cases.push(case(&format!("random bytes #{i} ({len})"), bytes));
    }
    for i in 0..4 {
        let len = rng.gen_range(1..3000);
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen_range(b' '..=b'~')).collect();
        cases.push(case(&format!("random printable text #{i} ({len})"), bytes));
    }
    let full = post(ACQUIRE, KEY, "", r#"{"waitMs":0}"#);
    for cut in [1, 10, full.len() / 2, full.len() - 3, full.len() - 1] {
        cases.push(case(&format!("request cut at {cut}"), full[..cut].to_vec()));
    }
    let mut huge_line = b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nX-Huge: ".to_vec();
    huge_line.resize(200 * 1024, b'h');
    cases.push(case("200 KiB header line", huge_line));
    let mut huge_target = b"GET /".to_vec();
    huge_target.resize(40 * 1024, b'x');
    cases.push(case("40 KiB request target", huge_target));
    cases.push(case("NUL bytes", vec![0; 4096]));
    cases.push(case("NUL bytes then CRLFs", [&[0u8; 64][..], b"\r\n\r\n"].concat()));
    cases.push(case("NUL in the request line", b"GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec()));
    cases.push(case("NUL in a header name", b"GET / HTTP/1.1\r\nHo\0st: a\r\n\r\n".to_vec()));
    cases.push(case("20 KiB of CRLF", b"\r\n".repeat(10 * 1024)));
    cases.push(case("only LFs", vec![b'\n'; 1000]));
    cases.push(case("TLS client hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello".to_vec()));
    cases.push(case("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()));
    cases.push(case("high bytes in a header name", b"GET / HTTP/1.1\r\nHost: a\r\nX-\xff\xfe: b\r\n\r\n".to_vec()));
    let mut lying = post(ACQUIRE, KEY, "", "");
    lying.truncate(lying.len() - 4);
    lying.extend_from_slice(b"Content-Length: 100\r\n\r\n{\"wa");
    cases.push(case("body shorter than its Content-Length", lying));
    let chunked = format!(
        "POST {ACQUIRE} HTTP/1.1\r\nHost: a\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{{\"wa"
    );
    cases.push(case("chunked body cut short", chunked.into_bytes()));
    // No acquires among the requests of a client that hangs up: a grant the
    // kernel took before the hang-up counts as delivered and stays held.
    let mut hundred = Vec::new();
    for _ in 0..100 {
        hundred.extend(post("/pools/p/lock/x/release", KEY, "", ""));
        hundred.extend(post("/pools/p/lock/x/renew", KEY, "", ""));
        hundred.extend_from_slice(b"GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n");
    }
    cases.push(Garbage {
        name: "pipelined requests, then hang up unread".into(),
        bytes: hundred,
        piece: usize::MAX,
        hang_up: true,
    });
    let release = post("/pools/p/lock/x/release", KEY, "", r#"{"status":200}"#);
    cases.push(Garbage {
        name: "request a byte per write, then hang up".into(),
        bytes: release,
        piece: 1,
        hang_up: true,
    });
    cases.push(Garbage {
        name: "head a byte per write, kept open".into(),
        bytes: full[..40].to_vec(),
        piece: 1,
        hang_up: false,
    });
    cases.push(Garbage {
        name: "random bytes in small writes, then hang up".into(),
        bytes: (0..2000).map(|_| rng.gen()).collect(),
        piece: 7,
        hang_up: true,
    });
    cases
}

/// `GET /healthz` on a fresh admin connection.
fn health_check(admin: SocketAddr) -> Response {
    let mut c = connect(admin);
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    read_response(&mut c).expect("an answer to a health check")
}

#[test]
fn idle_admin_connections_never_keep_a_health_check_out() {
    let s = TestServer::start(&config("", ""));
    let admin = s.admin.unwrap();
    // As many bare connections as the admin listener takes, never a byte sent.
    let mut idle: Vec<TcpStream> = (0..16).map(|_| connect(admin)).collect();
    for round in 0..24 {
        let r = health_check(admin);
        assert_eq!(r.status, 200, "round {round}: {r:?}");
    }
    // The longest idle went first (then answered checks still lingering).
    let mut byte = [0u8; 1];
    assert!(matches!(idle[0].read_some(&mut byte), Ok(0)), "the longest idle connection is still open");
    // Requests still arriving, however young: on loopback a request arrives
    // at once, so one still arriving is a slow client, and a health check
    // comes first. The one arriving longest makes way.
    let mut busy: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut c = connect(admin);
            c.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            c
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    for round in 0..4 {
        let r = health_check(admin);
        assert_eq!(r.status, 200, "round {round}: requests in progress kept the health check out: {r:?}");
    }
    assert!(matches!(busy[0].read_some(&mut byte), Ok(0)), "the oldest request's connection is still open");
    drop(busy);
    // Clients that pipeline health checks and never read the answers: the
    // one whose answers have waited longest makes way.
    let pipelined = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(50_000);
    let _flooders: Vec<TcpStream> = (0..16)
        .map(|_| {
            let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            c.set_recv_buffer_size(4096).unwrap();
            c.connect(&admin.into()).unwrap();
            let mut c = TcpStream::from(c);
            c.set_nonblocking(true).unwrap();
            let mut sent = 0;
            let deadline = Instant::now() + Duration::from_secs(5);
            while sent < pipelined.len() && Instant::now() < deadline {
                match c.write(&pipelined[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
                    Err(e) => panic!("{e}"),
                }
            }
            c
        })
        .collect();
    // Time for the server to answer until their windows are full.
    thread::sleep(Duration::from_millis(1000));
    for round in 0..4 {
        let r = health_check(admin);
        assert_eq!(r.status, 200, "round {round}: clients that never read kept the health check out: {r:?}");
    }
}

#[test]
fn a_flood_of_new_admin_connections_never_keeps_health_checks_out() {
    // A thousand new admin connections a second, each pipelining scrapes it
    // never reads: they make way for each other first in, first out, so a
    // health check accepted among them is answered before its turn comes.
    let s = TestServer::start(&config("", ""));
    let admin = s.admin.unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let flood = {
        let done = done.clone();
        thread::spawn(move || {
            let scrapes = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(200);
            let mut open = std::collections::VecDeque::new();
            let until = Instant::now() + Duration::from_secs(6);
            while !done.load(Ordering::Relaxed) && Instant::now() < until {
                let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                c.set_recv_buffer_size(2048).unwrap();
                if c.connect(&admin.into()).is_ok() {
                    let mut c = TcpStream::from(c);
                    c.set_nonblocking(true).unwrap();
                    let _ = c.write(&scrapes);
                    open.push_back(c);
                    if open.len() > 40 {
                        open.pop_front();
                    }
                }
                thread::sleep(Duration::from_millis(1));
            }
        })
    };
    thread::sleep(Duration::from_millis(300));
    let answered = (0..30)
        .filter(|_| {
            let mut c = connect(admin);
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_ok()
                && matches!(try_read_response(&mut c), Ok(Some(r)) if r.status == 200)
        })
        .count();
    done.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    assert!(answered >= 27, "{answered} of 30 health checks answered during the flood");
    assert_eq!(health_check(admin).status, 200);
}

#[test]
fn garbage_never_kills_the_server() {
    const HEAD_MS: u64 = 1000;
    let mut s = TestServer::start(&config("", &format!(r#""headTimeoutMs":{HEAD_MS},"idleTimeoutMs":60000"#)));
    let mut failures = Vec::new();
    for g in garbage_cases() {
        let mut c = connect(s.addr);
        // The server may answer and close before it has read everything: a
        // failed write is a fine outcome here, not a test failure.
        for piece in g.bytes.chunks(g.piece.min(g.bytes.len()).max(1)) {
            if c.write_all(piece).is_err() {
                break;
            }
        }
        if g.hang_up {
            drop(c);
        } else {
            let (got, end) = read_to_end(&mut c, Duration::from_millis(HEAD_MS + 4000));
            if end != End::Closed {
                failures.push(format!("{}: connection left open", g.name));
            }
            if !got.is_empty() {
                match parse_answer(&got) {
                    Ok((r, rest)) if matches!(r.status, 400 | 414 | 431 | 505) && rest.is_empty() => {}
                    Ok(_) => failures.push(format!("{}: answered {:?}", g.name, String::from_utf8_lossy(&got))),
                    Err(e) => failures.push(format!("{}: {e}", g.name)),
                }
            }
        }
        if let Ok(Some(status)) = s.child.try_wait() {
            panic!("the server died after {:?}: {status}", g.name);
        }
        acquire_release(s.addr);
    }
    assert!(failures.is_empty(), "garbage cases that failed:\n{}", failures.join("\n"));
    // Every grant above was released, whatever the garbage did before it.
    let r = s.acquire("", "");
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 15, "{r:?}");
}

#[test]
fn a_half_closed_client_still_gets_its_answer() {
    let s = TestServer::start(&config("", r#""idleTimeoutMs":30000"#));
    let mut c = connect(s.addr);
    c.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":0}"#)).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let r = read_response(&mut c).expect("an answer after shutdown(Write)");
    let slot = r.slot();
    // Nothing more can come from this client, so the server ends the connection
    // instead of keeping it for the idle timeout.
    let (rest, end) = read_to_end(&mut c, Duration::from_secs(5));
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert_eq!(end, End::Closed, "the server kept a half-closed connection open");
    assert_eq!(s.release(&slot, "").json()["released"], true, "the delivered grant was held");
}

#[test]
fn a_half_closed_client_gets_every_pipelined_answer() {
    let s = TestServer::start(&config(r#""concurrency":1"#, r#""idleTimeoutMs":30000"#));
    let mut c = connect(s.addr);
    let mut batch = post("/pools/p/lock/x/release", KEY, "", "");
    batch.extend(post(ACQUIRE, KEY, "", ""));
    batch.extend(post(ACQUIRE, KEY, "", ""));
    c.write_all(&batch).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let (got, end) = read_to_end(&mut c, Duration::from_secs(5));
    let text = String::from_utf8_lossy(&got);
    let statuses: Vec<&str> = text.match_indices("HTTP/1.1 ").map(|(i, _)| &text[i + 9..i + 12]).collect();
    assert_eq!(statuses, ["200", "200", "429"], "{text}");
    assert_eq!(end, End::Closed, "the server kept a half-closed connection open");
}

#[test]
fn a_half_closed_client_gets_answers_beyond_one_turns_budget() {
    // More requests than one turn answers per connection (16): the rest are
    // answered in the next turns before the connection closes, not dropped.
    let s = TestServer::start(&config("", r#""idleTimeoutMs":30000"#));
    let mut c = connect(s.addr);
    let batch: Vec<u8> = (0..40).flat_map(|_| post("/pools/p/lock/x/release", KEY, "", "")).collect();
    c.write_all(&batch).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let (got, end) = read_to_end(&mut c, Duration::from_secs(5));
    assert_eq!(count_answers(&got), 40, "{}", String::from_utf8_lossy(&got));
    assert_eq!(end, End::Closed, "the server kept a half-closed connection open");
}

#[test]
fn bodies_larger_than_a_turns_read_are_read_whole_over_several_turns() {
    // A connection is read at most 16 KiB per turn, so no client's backlog
    // makes every other client wait for it. Bodies several times that, sent
    // pipelined on several connections at once, are still read whole and
    // answered in order.
    let s = TestServer::start(&config("", r#""maxBodyBytes":262144,"idleTimeoutMs":30000"#));
    let body = format!("{{\"status\":200{}}}", " ".repeat(200_000));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let addr = s.addr;
            let body = body.clone();
            thread::spawn(move || {
                let mut c = connect(addr);
                let batch: Vec<u8> = (0..5).flat_map(|_| post("/pools/p/lock/x/release", KEY, "", &body)).collect();
                let writer = {
                    let mut c = c.try_clone().unwrap();
                    thread::spawn(move || {
                        c.write_all(&batch).unwrap();
                        c.shutdown(Shutdown::Write).unwrap();
                    })
                };
                let (got, end) = read_to_end(&mut c, Duration::from_secs(20));
                writer.join().unwrap();
                (got, end)
            })
        })
        .collect();
    for client in clients {
        let (got, end) = client.join().unwrap();
        assert_eq!(count_answers(&got), 5, "{}", String::from_utf8_lossy(&got));
        assert_eq!(got.windows(18).filter(|w| w == b"{\"released\":false}").count(), 5);
        assert_eq!(end, End::Closed);
    }
}

#[test]
fn a_connection_gives_back_what_a_large_body_grew_its_buffers_to() {
    // A 200 KB report grows the connection's buffers to hold it while it
    // arrives (the input, and for a chunked one the decoded body too); once
    // it is answered and nothing more is pending, the memory is given back,
    // and it grows again when the connection needs it.
    let s = TestServer::start(&config("", r#""maxBodyBytes":262144,"idleTimeoutMs":30000"#));
    let body = format!("{{\"status\":200{}}}", " ".repeat(200_000));
    let chunked: String = body
        .as_bytes()
        .chunks(16 * 1024)
        .map(|c| format!("{:x}\r\n{}\r\n", c.len(), String::from_utf8_lossy(c)))
        .collect();
    let requests = [
        post("/pools/p/lock/x/release", KEY, "", &body),
        format!(
            "POST /pools/p/lock/x/release HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n\
             Transfer-Encoding: chunked\r\n\r\n{chunked}0\r\n\r\n"
        )
        .into_bytes(),
    ];
    let buffered = || s.metric("nthpool_connection_buffer_bytes").expect("the gauge") as u64;
    for request in &requests {
        let mut c = connect(s.addr);
        for _ in 0..2 {
            // All but the last 10 bytes: the request is still arriving.
            let (most, rest) = request.split_at(request.len() - 10);
            c.write_all(most).unwrap();
            eventually("the arriving body's buffers counted", || buffered() >= 150_000);
            c.write_all(rest).unwrap();
            assert_eq!(read_response(&mut c).expect("an answer").json()["released"], false);
            eventually("the buffers given back", || buffered() < 64 * 1024);
        }
    }
}

/// A pool of one slot, held (its id returned), whose connections buffer
/// 16 KiB + 2 KiB + 64 KiB of input (`maxBodyBytes` 1024).
fn full_pool_with_small_buffers() -> (TestServer, String) {
    let s = TestServer::start(&config(
        r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000},"adaptive":false"#,
        r#""maxBodyBytes":1024"#,
    ));
    let holder = s.acquire("", "").slot();
    (s, holder)
}

#[test]
fn a_waiter_that_closes_behind_a_full_input_buffer_is_never_granted() {
    // With maxBodyBytes 1024 a connection buffers 16 KiB + 2 KiB + 64 KiB of
    // input. The departed waiter sent more than that behind its acquire, so
    // its FIN cannot be read: the hang-up alone must take it out of the queue.
    let (s, holder) = full_pool_with_small_buffers();
    let mut gone = connect(s.addr);
    gone.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":10000}"#)).unwrap();
    thread::sleep(Duration::from_millis(100));
    gone.write_all(&vec![b'x'; 100 * 1024]).unwrap();
    drop(gone);
    thread::sleep(Duration::from_millis(300));
    let mut next = connect(s.addr);
    next.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":3000}"#)).unwrap();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(s.release(&holder, "").json()["released"], true);
    let r = read_response(&mut next).expect("an answer");
    assert_eq!(r.status, 200, "the freed slot went to the departed waiter: {r:?}");
}

#[test]
fn a_waiter_with_more_pipelined_behind_it_than_its_connection_buffers_is_refused_and_closed() {
    // Past the 82 KiB this connection buffers and what the kernel holds, a
    // FIN the client sent would wait behind input the server has no room to
    // read: whether the waiter is still there cannot be known, so it is not
    // kept waiting for a slot it might never take.
    let (s, holder) = full_pool_with_small_buffers();
    let mut deep = connect(s.addr);
    deep.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":10000}"#)).unwrap();
    eventually("the acquire queued", || s.metric("nthpool_waiters{pool=\"p\"}") == Some(1.0));
    // Renews of an unknown slot, 4 MiB of them, sent from a thread: the
    // server stops reading once its buffer is full, and closes.
    let mut writer = deep.try_clone().unwrap();
    let renews = post("/pools/p/lock/x/renew", KEY, "", "").repeat(4 * 1024 * 1024 / 100);
    let sender = thread::spawn(move || {
        writer.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = writer.write_all(&renews);
    });
    let r = read_response(&mut deep).expect("an answer");
    assert_eq!((r.status, r.json()["error"].as_str()), (400, Some("bad_request")), "{r:?}");
    let buffered = (16 + 2 + 64) * 1024;
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains(&format!(" {buffered} bytes ")), "the limit is not named: {message:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert_eq!(s.metric("nthpool_waiters{pool=\"p\"}"), Some(0.0), "it left the queue");
    let mut rest = Vec::new();
    let _ = deep.read_to_end(&mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains("HTTP/1.1"), "nothing pipelined behind it is answered");
    sender.join().unwrap();
    // The slot it waited for goes to the next waiter.
    let mut next = connect(s.addr);
    next.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":3000}"#)).unwrap();
    eventually("the next acquire queued", || s.metric("nthpool_waiters{pool=\"p\"}") == Some(1.0));
    assert_eq!(s.release(&holder, "").json()["released"], true);
    assert_eq!(read_response(&mut next).expect("an answer").status, 200);
}

#[test]
fn a_client_that_pipelines_and_never_reads_holds_at_most_464_kib_of_buffers() {
    // README, Decisions: 208 KiB of input (16 KiB + 2 × 64 KiB + 64 KiB) and
    // an output buffer of at most 256 KiB.
    const BOUND: f64 = 464.0 * 1024.0;
    let s = TestServer::start(&config("", ""));
    let renews = post("/pools/p/lock/x/renew", KEY, "", "").repeat(3 * 1024 * 1024 / 100);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let mut c = connect(s.addr);
            c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            let renews = renews.clone();
            thread::spawn(move || {
                // Blocks once every buffer on the way is full; never reads.
                let _ = c.write_all(&renews);
                c
            })
        })
        .collect();
    // Until the buffers have stayed full for a while (or 10 s).
    let (deadline, mut full_since) = (Instant::now() + Duration::from_secs(10), None);
    let mut peak = 0.0f64;
    while Instant::now() < deadline && full_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500)) {
        peak = peak.max(s.metric("nthpool_connection_buffer_bytes").unwrap_or(0.0));
        if full_since.is_none() && peak / 4.0 > 300.0 * 1024.0 {
            full_since = Some(Instant::now());
        }
        thread::sleep(Duration::from_millis(10));
    }
    let per_client = peak / 4.0;
    assert!(per_client > 300.0 * 1024.0, "the buffers never filled: {per_client} bytes each");
    assert!(per_client <= BOUND, "{per_client} bytes buffered for each client that never reads");
    drop(clients.into_iter().map(|c| c.join().unwrap()).collect::<Vec<_>>());
}

#[test]
fn a_waiter_that_hangs_up_at_once_is_never_granted() {
    // The acquire and the FIN arrive together: the server must still see the
    // close, drop the waiter, and not hand it the next free slot.
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000}"#, ""));
    let holder = s.acquire("", "").slot();
    let mut gone = connect(s.addr);
    gone.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":10000}"#)).unwrap();
    drop(gone);
    thread::sleep(Duration::from_millis(300));
    let r = s.acquire("", "");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-queue-depth"), 0, "the departed waiter is still queued");
    assert_eq!(s.release(&holder, "").json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 200, "the freed slot went to the departed waiter: {r:?}");
}

/// One server-wide series of an admin scrape, e.g. `nthpool_bytes_sent_total`
/// or `nthpool_waiters{pool="p"}`.
fn metric(text: &str, series: &str) -> u64 {
    let line = text.lines().find(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with(' ')));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("no {series} in the scrape"))
}

#[test]
fn a_waiter_that_leaves_its_answers_unread_is_closed_at_the_write_timeout() {
    // A client whose earlier answers fill the kernel and wait in the
    // server, with an acquire queued behind them: the wait must not
    // suspend writeTimeoutMs (it did, up to the queue's 30 s).
    const WRITE_MS: u64 = 1000;
    const BATCH: usize = 256;
    let s = TestServer::start(&config(
        r#""concurrency":1,"queue":{"size":10,"timeoutMs":30000},"adaptive":false"#,
        &format!(r#""writeTimeoutMs":{WRITE_MS}"#),
    ));
    let admin = s.admin.unwrap();
    let holder = s.acquire("", "").slot();
    // The length of one answer to `SMALL` (the `Date` header is fixed-width).
    let mut one = connect(s.addr);
    one.write_all(SMALL).unwrap();
    let (bytes, _) = read_to_end(&mut one, Duration::from_millis(500));
    let (_, rest) = parse_answer(&bytes).unwrap();
    let answer_len = (bytes.len() - rest.len()) as u64;
    drop(one);

    // Bytes the server wrote so far, less its own earlier scrapes' answers.
    let mut scraped = 0u64;
    let mut scrape = || {
        let text = admin_get(admin, "/metrics");
        let sent = metric(&text, "nthpool_bytes_sent_total") - scraped;
        scraped += text.len() as u64;
        (text, sent)
    };
    let (text, sent0) = scrape();
    let not_found0 = metric(&text, r#"nthpool_rejections_total{code="404"}"#);
    let mut waiter = connect(s.addr);
    let batch: Vec<u8> = SMALL.repeat(BATCH);
    let give_up = Instant::now() + Duration::from_secs(60);
    let mut requests = 0u64;
    loop {
        assert!(Instant::now() < give_up, "the kernel never filled after {requests} requests");
        waiter.write_all(&batch).unwrap();
        requests += BATCH as u64;
        // Every request answered (then one scrape more: the answers of the
        // last turn are flushed before a later one).
        while metric(&scrape().0, r#"nthpool_rejections_total{code="404"}"#) - not_found0 < requests {
            assert!(Instant::now() < give_up, "the server stopped answering at {requests} requests");
            thread::sleep(Duration::from_millis(5));
        }
        let (_, sent) = scrape();
        if sent - sent0 < requests * answer_len {
            break;
        }
    }
    // Answers wait in the server (fewer than a batch's: below the output's
    // high-water mark, so the acquire is read and queued).
    waiter.write_all(&post(ACQUIRE, KEY, "", r#"{"waitMs":30000}"#)).unwrap();
    let queued = Instant::now();
    loop {
        let (text, _) = scrape();
        if metric(&text, r#"nthpool_waiters{pool="p"}"#) == 1 {
            break;
        }
        assert!(queued.elapsed() < Duration::from_secs(10), "the acquire was never queued");
        thread::sleep(Duration::from_millis(20));
    }
    loop {
        let (text, _) = scrape();
        if metric(&text, r#"nthpool_waiters{pool="p"}"#) == 0 {
            assert_eq!(metric(&text, r#"nthpool_waiters_gone_total{pool="p"}"#), 1, "{text}");
            break;
        }
        assert!(
            queued.elapsed() < Duration::from_millis(WRITE_MS + 8000),
            "a waiter that reads nothing was kept {:?} (writeTimeoutMs {WRITE_MS})",
            queued.elapsed()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let (_, end) = read_to_end(&mut waiter, Duration::from_secs(5));
    assert_eq!(end, End::Closed, "the waiter's connection is still open");
    // The queue is whole: the slot goes to the next caller, not to the
    // departed waiter.
    assert_eq!(s.release(&holder, "").json()["released"], true);
    assert_eq!(s.acquire("", "").status, 200);
}

/// The server's peak resident memory (`VmHWM`), in KiB.
fn peak_kib(server: &TestServer) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A release report's `headers` cost memory by the body's size, not by its
/// shape: a long header name with thousands of values (each a field line)
/// once took hundreds of MB for a 64 KB body, and stalled every client.
#[test]
fn a_report_with_a_long_name_and_many_values_costs_its_size() {
    let server = TestServer::start(&config("", r#""maxBodyBytes":1048576"#));
    let before = peak_kib(&server);
    let many = vec!["0"; 200_000].join(",");
    for body in [
        format!(r#"{{"status":200,"headers":{{"{}":[{many}]}}}}"#, "a".repeat(500_000)),
        format!(r#"{{"status":200,"headers":[["{}",[{many}]]]}}"#, "a".repeat(500_000)),
        format!(r#"{{"status":200,"headers":{{"retry-after":[{many}]}}}}"#),
    ] {
        let slot = server.acquire("", "").slot();
        let r = server.release(&slot, &body);
        assert_eq!((r.status, r.body.as_slice()), (200, &br#"{"released":true}"#[..]), "{r:?}");
    }
    let grown = peak_kib(&server).saturating_sub(before);
    // The bodies are 0.9 MB each; 64 MB leaves room for any allocator.
    assert!(grown < 64 * 1024, "peak memory grew by {grown} KiB");
}

#[test]
fn acquires_pipelined_behind_a_waiter_with_their_budget_spent_are_answered_at_once() {
    // Each spent acquire behind the waiter used to wait for a tick of its
    // own: 400 of them answered the last 400 ms or more past its deadline.
    const WAIT_MS: u64 = 300;
    const BEHIND: usize = 400;
    let s = TestServer::start(&config(r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000},"adaptive":false"#, ""));
    let holder = s.acquire("", "").slot();
    let mut c = connect(s.addr);
    let body = format!(r#"{{"waitMs":{WAIT_MS}}}"#);
    c.write_all(&post(ACQUIRE, KEY, "", &body).repeat(BEHIND + 1)).unwrap();
    let mut last = None;
    for i in 0..=BEHIND {
        let r = read_response(&mut c).unwrap_or_else(|| panic!("acquire {i} was not answered"));
        assert_eq!((r.status, r.error_code().as_str()), (504, "queue_timeout"), "acquire {i}: {r:?}");
        last = Some(r);
    }
    let queued_ms = last.unwrap().header_u64("x-nthpool-queued-ms");
    // Generous for a loaded machine, and well short of one tick each.
    assert!(queued_ms < WAIT_MS + 200, "the last was answered {queued_ms} ms after it was read");
    assert_eq!(s.release(&holder, "").json()["released"], true);
    s.acquire("", "").slot();
}
