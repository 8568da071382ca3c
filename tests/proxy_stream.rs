//! Proxy mode streaming and limits over real sockets (SPEC §12): events
//! relayed as they come, backpressure to a slow reader, HEAD, interim
//! answers, `Expect: 100-continue`, refused upgrades, the request cap, the
//! keep-alive pool, the access log and metrics, smuggling, and the one
//! concurrency limit shared by lock holders and proxied exchanges.

mod common;
#[path = "common/framing.rs"]
mod framing;
#[path = "common/upstream.rs"]
mod upstream;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upstream::*;

/// An SSE response head without framing (close-delimited, as many servers send it).
const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

fn paced_events(n: usize, pause_ms: u64) -> Vec<(u64, Vec<u8>)> {
    std::iter::once((0, SSE_HEAD.to_vec()))
        .chain((0..n).map(|i| (pause_ms, format!("data: {i}\n\n").into_bytes())))
        .collect()
}

#[test]
fn server_sent_events_reach_the_client_one_by_one() {
    let events = paced_events(20, 100);
    let up = MockUpstream::start(move |_| Reply::Paced(events.clone()));
    let server = proxy_server(&up, 2, "");
    let mut s = server.connect();
    let start = Instant::now();
    s.write_all(&proxied("GET", "/v1/stream", "Accept: text/event-stream\r\n", "")).unwrap();
    // The head, re-framed chunked for this HTTP/1.1 client, then the first event.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: 0\n\n") {
        let n = s.read_some(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first event");
        got.extend_from_slice(&buf[..n]);
    }
    let first = start.elapsed();
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.contains("Transfer-Encoding: chunked\r\n") && text.contains("x-nthpool-limit: 2"), "{text}");
    // The stream lasts two seconds; the first event came long before its end.
    assert!(first < Duration::from_millis(1500), "first event after {first:?}");
    // The upstream's close-delimited body is re-framed: it ends with the last chunk.
    read_to_last_chunk(&mut s, &mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(start.elapsed() >= Duration::from_millis(1900), "the upstream paced 20 events over 2 s");
    for i in 0..20 {
        assert!(text.contains(&format!("data: {i}\n\n")), "event {i} missing");
    }
    slot_comes_back(&server);
}

/// Reads onto `got` until a chunked body's last chunk is in. The connection
/// stays open after it (keep-alive), so reading to its end would wait out
/// the read timeout.
fn read_to_last_chunk(s: &mut TcpStream, got: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"\r\n0\r\n\r\n") {
        let n = s.read_some(&mut buf).expect("the last chunk came within the read timeout");
        assert!(n > 0, "the connection closed before the last chunk: {:?}", String::from_utf8_lossy(got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// The bytes of a response head, up to and with its empty line.
fn read_head(s: &mut TcpStream) -> Vec<u8> {
    read_through(s, b"\r\n\r\n", "a head")
}

/// Resident memory of a process, in KiB (Linux `/proc`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

const MB: usize = 1024 * 1024;

/// An upstream that answers every request with a `200` of `total` bytes
/// (a whole number of megabytes), written as fast as the socket takes it.
fn upstream_of(total: usize) -> MockUpstream {
    MockUpstream::start(move |_| Reply::Repeat {
        head: format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n").into_bytes(),
        piece: vec![b'x'; MB],
        times: total / MB,
    })
}

/// CPU time a process has used, user and system, in clock ticks (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().skip(11).take(2).map(|t| t.parse::<u64>().unwrap()).sum()
}

#[test]
fn a_client_that_stopped_reading_a_relayed_response_costs_the_server_no_cpu() {
    // The server's output to the client is full and the upstream's answer
    // waits behind it: the loop sleeps until the client reads (it once
    // retried the full socket on every turn, a whole core per such client,
    // for as long as a slow download ran).
    const TOTAL: usize = 16 * MB;
    let up = upstream_of(TOTAL);
    let server = proxy_server(&up, 2, "");
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&server.addr.into()).unwrap();
    let mut s = TcpStream::from(socket);
    s.write_all(&proxied("GET", "/big", "", "")).unwrap();
    // Stalled once the server's own buffer stops growing.
    let buffered = || server.metric("nthpool_connection_buffer_bytes").unwrap();
    let mut last = -1.0;
    eventually("the server's output to the client is full", || {
        std::thread::sleep(Duration::from_millis(100));
        let now = buffered();
        std::mem::replace(&mut last, now) == now && now > 0.0
    });
    let before = cpu_ticks(server.pid());
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(server.pid()) - before;
    // A clock tick is 10 ms: a spinning loop takes most of the 100.
    assert!(used < 25, "the server used {used} ticks of CPU in a second while the client read nothing");
    // Writing resumes when the client reads: the whole body arrives.
    let head = read_head(&mut s);
    assert!(String::from_utf8_lossy(&head).contains(&format!("Content-Length: {TOTAL}\r\n")));
    let mut buf = vec![0u8; MB];
    let mut received = 0;
    while received < TOTAL {
        let n = s.read_some(&mut buf[..MB.min(TOTAL - received)]).unwrap();
        assert!(n > 0, "the body ended after {received} of {TOTAL} bytes");
        received += n;
    }
}

#[test]
fn a_200_mb_response_to_a_slow_reader_keeps_server_memory_bounded() {
    const TOTAL: usize = 200 * MB;
    let up = upstream_of(TOTAL);
    let server = proxy_server(&up, 2, "");
    let baseline = rss_kib(server.pid());
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/big", "", "")).unwrap();
    let head = read_head(&mut s);
    assert!(String::from_utf8_lossy(&head).contains(&format!("Content-Length: {TOTAL}\r\n")));
    // Slow: 64 KiB a millisecond, far below what the upstream sends, so the
    // server's output to this client never empties, for 64 MB (or at most
    // eight seconds), watching the server; memory that grew with each byte
    // relayed would show here.
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = 0usize;
    let mut peak = baseline;
    let mut next_sample = 0;
    let slow_until = Instant::now() + Duration::from_secs(8);
    while received < 64 * MB && Instant::now() < slow_until {
        received += s.read_some(&mut buf).unwrap();
        if received >= next_sample {
            next_sample += 4 * MB;
            peak = peak.max(rss_kib(server.pid()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let slow = received;
    // Then as fast as it goes, to the end of the body.
    let mut big = vec![0u8; MB];
    let mut next_sample = received + 16 * MB;
    while received < TOTAL {
        let n = s.read_some(&mut big[..MB.min(TOTAL - received)]).unwrap();
        assert!(n > 0, "the body ended after {received} of {TOTAL} bytes");
        received += n;
        if received >= next_sample {
            next_sample += 16 * MB;
            peak = peak.max(rss_kib(server.pid()));
        }
    }
    let grown_mib = peak.saturating_sub(baseline) / 1024;
    println!(
        "server RSS: baseline {baseline} KiB, peak {peak} KiB while relaying {TOTAL} bytes, {slow} of them slowly"
    );
    assert!(
        grown_mib < 16,
        "server memory grew by {grown_mib} MiB relaying 200 MB, {slow} bytes to a slow reader (baseline {baseline} KiB, peak {peak} KiB)"
    );
    slot_comes_back(&server);
}

#[test]
fn a_64_mb_upload_to_a_slow_upstream_keeps_server_memory_bounded() {
    const TOTAL: usize = 64 * MB;
    // The upstream reads 64 KiB a millisecond, far below what the client
    // sends, so the server's output to it never empties; then it answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        // Bytes read, and those of the head once its end is seen.
        let (mut head, mut head_len, mut read) = (Vec::new(), None, 0usize);
        while head_len.is_none_or(|h| read - h < TOTAL) {
            let n = s.read_some(&mut buf).unwrap();
            assert!(n > 0, "the upload ended after {read} bytes");
            read += n;
            if head_len.is_none() {
                head.extend_from_slice(&buf[..n]);
                head_len = head.windows(4).position(|w| w == b"\r\n\r\n").map(|end| end + 4);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let body = read - head_len.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        body
    });
    let server = TestServer::start(&config(
        &format!(
            r#""concurrency":2,"adaptive":false,"upstream":{{"url":"http://{addr}","hosts":["{HOST}"],"maxRequestBytes":{TOTAL}}}"#
        ),
        "",
    ));
    let baseline = rss_kib(server.pid());
    let mut s = server.connect();
    let head =
        format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: {TOTAL}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let piece = vec![b'u'; MB];
    let mut peak = baseline;
    for _ in 0..TOTAL / MB {
        s.write_all(&piece).unwrap();
        peak = peak.max(rss_kib(server.pid()));
    }
    let answer = read_head(&mut s);
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{}", String::from_utf8_lossy(&answer));
    assert_eq!(upstream.join().unwrap(), TOTAL);
    let grown_mib = peak.saturating_sub(baseline) / 1024;
    println!("server RSS: baseline {baseline} KiB, peak {peak} KiB while relaying a {TOTAL}-byte upload");
    assert!(grown_mib < 16, "server memory grew by {grown_mib} MiB relaying a 64 MB upload to a slow upstream");
}

/// Writes `bytes` without blocking until the socket has taken none for
/// 300 ms (every buffer on the way is full) or all of it; the bytes written.
fn write_until_stuck(s: &mut TcpStream, bytes: &[u8]) -> usize {
    s.set_nonblocking(true).unwrap();
    let (mut sent, mut stuck_since) = (0, Instant::now());
    while sent < bytes.len() && stuck_since.elapsed() < Duration::from_millis(300) {
        match s.write(&bytes[sent..]) {
            Ok(n) => {
                sent += n;
                stuck_since = Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("{e}"),
        }
    }
    sent
}

/// Pipelined behind a proxied request: more than the server buffers for a
/// connection (16 KiB of head, twice `maxBodyBytes` (64 KiB), 64 KiB) by
/// 40 KiB, which the kernel's receive buffer holds, so the client's FIN
/// reaches the server behind bytes it has no room to read.
fn overflowing_tail() -> Vec<u8> {
    proxied("POST", "/behind", "", &"t".repeat(248 * 1024))
}

#[test]
fn a_client_that_leaves_with_more_pipelined_than_the_server_buffers_frees_its_slot_at_once() {
    // The upstream takes the request and answers nothing for 8 s. The client
    // pipelined more than the server reads while the exchange runs, then
    // closes: its FIN waits behind unread input, but it is seen, and the
    // client is gone: its slot comes back now, not when the upstream ends.
    let up = MockUpstream::start(|_| Reply::Silent(Duration::from_secs(8)));
    let server = TestServer::start(
        &config(
            &format!(
                r#""concurrency":1,"adaptive":false,"upstream":{{"url":"{}","hosts":["{HOST}"],"timeoutMs":30000}}"#,
                up.url()
            ),
            "",
        )
        .replace(r#""accessLog":null"#, r#""accessLog":"access.log""#),
    );
    let mut s = server.connect();
    let mut request = proxied("GET", "/stall", "", "");
    request.extend_from_slice(&overflowing_tail());
    assert_eq!(write_until_stuck(&mut s, &request), request.len(), "the kernel took less than it should");
    let start = Instant::now();
    while up.seen().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(5), "the request never reached the upstream");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(s);
    let took = slot_comes_back(&server);
    assert!(took < Duration::from_secs(4), "the slot came back after {took:?}");
    let line = access_log(&server, 1).into_iter().find(|l| l["path"] == "/stall").expect("the request's line");
    assert_eq!(line["status"], 499, "{line}");
}

#[test]
fn a_queued_client_that_left_behind_a_full_buffer_is_never_forwarded() {
    // A proxied request waits for the one slot, with more pipelined behind it
    // than the server buffers; then its client closes. Its FIN is behind
    // bytes never read, but it is seen: the request leaves the queue and
    // never reaches the upstream when the slot is freed.
    let up = MockUpstream::start(|_| ok("fine", ""));
    let server = TestServer::start(&config(
        &format!(r#""concurrency":1,"adaptive":false,"upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url()),
        "",
    ));
    let holder = server.acquire("", "").slot();
    let mut s = server.connect();
    let mut ghost = proxied("GET", "/ghost", "X-Nthpool-Queue-Timeout-Ms: 20000\r\n", "");
    ghost.extend_from_slice(&overflowing_tail());
    assert_eq!(write_until_stuck(&mut s, &ghost), ghost.len(), "the kernel took less than it should");
    let start = Instant::now();
    while server.metric("nthpool_waiters{pool=\"p\"}") != Some(1.0) {
        assert!(start.elapsed() < Duration::from_secs(5), "the request never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(s);
    while server.metric("nthpool_waiters{pool=\"p\"}") != Some(0.0) {
        assert!(start.elapsed() < Duration::from_secs(5), "the client that left still waits");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.release(&holder, "").json()["released"], true);
    slot_comes_back(&server);
    std::thread::sleep(Duration::from_millis(200));
    let lines: Vec<String> = up.seen().iter().map(|r| r.request_line().to_string()).collect();
    assert!(lines.is_empty(), "a client that had left was forwarded: {lines:?}");
}

#[test]
fn an_upstream_reading_a_large_upload_steadily_is_not_taken_for_one_that_stalled() {
    const KIB: usize = 1024;
    const TOTAL: usize = 4 * 1024 * KIB;
    // The upstream takes 64 KiB every 40 ms (about 1.6 MB/s, 2.6 s for the
    // whole upload), never pausing for anything near the 800 ms `timeoutMs`.
    // The kernel's send buffer to it may grow to megabytes: what sits there
    // unsent must not hide the upstream's progress from the timeout.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(64 * KIB).unwrap();
    socket.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    socket.listen(8).unwrap();
    let listener: std::net::TcpListener = socket.into();
    let addr = listener.local_addr().unwrap();
    let upstream = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = vec![0u8; 64 * KIB];
        let (mut head, mut head_len, mut read) = (Vec::new(), None, 0usize);
        while head_len.is_none_or(|h| read - h < TOTAL) {
            let n = s.read_some(&mut buf).unwrap();
            if n == 0 {
                return read.saturating_sub(head_len.unwrap_or(read));
            }
            read += n;
            if head_len.is_none() {
                head.extend_from_slice(&buf[..n]);
                head_len = head.windows(4).position(|w| w == b"\r\n\r\n").map(|end| end + 4);
            }
            std::thread::sleep(Duration::from_millis(40));
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        TOTAL
    });
    let server = TestServer::start(&config(
        &format!(
            r#""concurrency":1,"adaptive":false,"upstream":{{"url":"http://{addr}","hosts":["{HOST}"],"timeoutMs":800,"maxRequestBytes":{TOTAL}}}"#
        ),
        "",
    ));
    let mut s = server.connect();
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let head =
            format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: {TOTAL}\r\n\r\n");
        writer.write_all(head.as_bytes()).unwrap();
        // Fails once the server answers and closes: what it said is read below.
        let _ = writer.write_all(&vec![b'u'; TOTAL]);
    });
    let answer = read_head(&mut s);
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{}", String::from_utf8_lossy(&answer));
    assert_eq!(upstream.join().unwrap(), TOTAL, "the upstream got the whole upload");
    sender.join().unwrap();
}

/// Everything the server sends on `s` until it closes the connection.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read_some(&mut buf) {
            Ok(0) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return all,
            Err(e) => panic!("the connection was not closed: {e}; got {}", String::from_utf8_lossy(&all)),
        }
    }
}

#[test]
fn an_upstream_reset_inside_a_close_delimited_body_is_not_relayed_as_its_end() {
    // A close-delimited body ends at a clean close only: a reset cuts it,
    // and the client, which gets it chunked, must not be told it is whole.
    let up = MockUpstream::start(|_| {
        Reply::RawThenReset(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n".to_vec())
    });
    let server = proxy_server(&up, 1, "");
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/v1/events", "", "")).unwrap();
    let text = String::from_utf8(read_to_close(&mut s)).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n") && text.contains("Transfer-Encoding: chunked\r\n"), "{text}");
    assert!(!text.ends_with("\r\n0\r\n\r\n"), "a cut body was ended with the last chunk: {text}");
    slot_comes_back(&server);
}

/// How a connection ended: `true` for a reset, `false` for a clean close.
fn ended_by_reset(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read_some(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) => panic!("the connection was not closed: {e}"),
        }
    }
}

#[test]
fn an_http_1_0_client_whose_body_ends_at_the_close_is_reset_when_the_upstream_cuts_it() {
    // An HTTP/1.0 client is sent a chunked or close-delimited answer to the
    // close, so a clean close would tell it the body is whole: cut short,
    // its connection is reset instead. A framed body keeps its clean close.
    let up = MockUpstream::start(|seen| match seen.request_line() {
        "GET /chunked HTTP/1.1" => {
            Reply::RawThenClose(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec())
        }
        "GET /reset HTTP/1.1" => Reply::RawThenReset(b"HTTP/1.1 200 OK\r\n\r\nhello".to_vec()),
        _ => Reply::RawThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello".to_vec()),
    });
    let server = proxy_server(&up, 1, "");
    for (path, reset) in [("/chunked", true), ("/reset", true), ("/framed", false)] {
        let mut s = server.connect();
        let request = format!("GET {path} HTTP/1.0\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
        s.write_all(request.as_bytes()).unwrap();
        assert_eq!(ended_by_reset(&mut s), reset, "{path}");
        slot_comes_back(&server);
    }
}

#[test]
fn a_204_and_interim_answers_reach_the_client_without_framing_fields() {
    // RFC 9110 §8.6 and RFC 9112 §6.1: no Content-Length or Transfer-Encoding
    // in a 1xx or 204, whatever the upstream put there; a 304 keeps its own.
    let up = MockUpstream::start(|seen| match seen.request_line() {
        "GET /te HTTP/1.1" => Reply::Raw(b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()),
        "GET /cl HTTP/1.1" => Reply::Raw(
            b"HTTP/1.1 103 Early Hints\r\nContent-Length: 0\r\nLink: </a>\r\n\r\n\
              HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nX-Kept: 1\r\n\r\n"
                .to_vec(),
        ),
        _ => Reply::Raw(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\nETag: \"v\"\r\n\r\n".to_vec()),
    });
    let server = proxy_server(&up, 1, "");
    let mut s = server.connect();
    for (path, interim) in [("/te", false), ("/cl", true)] {
        s.write_all(&proxied("GET", path, "", "")).unwrap();
        if interim {
            let text = String::from_utf8(read_head(&mut s)).unwrap();
            assert_eq!(text, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n");
        }
        let text = String::from_utf8(read_head(&mut s)).unwrap();
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{text}");
        let lower = text.to_ascii_lowercase();
        assert!(!lower.contains("content-length") && !lower.contains("transfer-encoding"), "{path}: {text}");
    }
    s.write_all(&proxied("GET", "/etag", "", "")).unwrap();
    let text = String::from_utf8(read_head(&mut s)).unwrap();
    assert!(text.starts_with("HTTP/1.1 304 ") && text.contains("Content-Length: 50\r\n"), "{text}");
}

#[test]
fn a_final_answer_read_with_an_interim_one_reaches_an_http_1_0_client_however_large() {
    // An HTTP/1.0 client is sent no interim answer, so nothing written to it
    // wakes the exchange again: the final answer, already read with the 103
    // and filling the input, must be relayed from what is there.
    let body = vec![b'x'; 100_000];
    let head = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n";
    let reply = [head.as_slice(), &body].concat();
    let up = MockUpstream::start(move |_| Reply::Raw(reply.clone()));
    let server = proxy_server(&up, 1, r#""timeoutMs":3000"#);
    let mut s = server.connect();
    s.write_all(format!("GET /v1/hints HTTP/1.0\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n\r\n").as_bytes()).unwrap();
    let got = read_to_close(&mut s);
    let text = String::from_utf8_lossy(&got[..got.len().min(400)]).into_owned();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n") && text.contains("Content-Length: 100000\r\n"), "{text}");
    assert!(got.ends_with(&body), "{} bytes came: {text}", got.len());
    slot_comes_back(&server);
}

#[test]
fn an_http_1_0_client_is_named_no_transfer_coding_in_a_bodiless_answer() {
    // RFC 9112 §6.1: no `Transfer-Encoding` to an HTTP/1.0 client, even in
    // the head of a HEAD or 304 answer; an HTTP/1.1 client still sees it.
    let up = MockUpstream::start(|seen| match seen.request_line().starts_with("HEAD ") {
        true => Reply::Raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: \"v\"\r\n\r\n".to_vec()),
        false => Reply::Raw(b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\nETag: \"v\"\r\n\r\n".to_vec()),
    });
    let server = proxy_server(&up, 1, "");
    for (method, version) in [("HEAD", "1.0"), ("GET", "1.0"), ("HEAD", "1.1"), ("GET", "1.1")] {
        let mut s = server.connect();
        let request = format!("{method} /v1/file HTTP/{version}\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
        s.write_all(request.as_bytes()).unwrap();
        let text = String::from_utf8(read_head(&mut s)).unwrap();
        assert!(text.contains("ETag: \"v\"\r\n"), "{method} HTTP/{version}: {text}");
        let named = text.to_ascii_lowercase().contains("transfer-encoding");
        assert_eq!(named, version == "1.1", "{method} HTTP/{version}: {text}");
    }
}

#[test]
fn head_requests_get_the_head_and_no_body() {
    let up = MockUpstream::start(|seen| {
        assert!(seen.request_line().starts_with("HEAD "));
        Reply::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nETag: \"v1\"\r\n\r\n".to_vec())
    });
    let server = proxy_server(&up, 2, "");
    let mut s = server.connect();
    s.write_all(&proxied("HEAD", "/file", "", "")).unwrap();
    let text = String::from_utf8(read_head(&mut s)).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n") && text.contains("Content-Length: 1234\r\n"), "{text}");
    // No body follows: the next answer on the connection starts right away.
    s.write_all(&proxied("HEAD", "/file", "", "")).unwrap();
    let mut next = [0u8; 15];
    s.read_exact(&mut next).unwrap();
    assert_eq!(&next, b"HTTP/1.1 200 OK");
}

#[test]
fn expect_continue_interim_answers_and_upgrades() {
    let up = MockUpstream::start(|seen| {
        if seen.request_line().contains("/hints") {
            return Reply::Raw(
                b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    .to_vec(),
            );
        }
        ok(&format!("got {}", String::from_utf8_lossy(&seen.body)), "")
    });
    let server = proxy_server(&up, 2, "");
    // Expect: 100-continue: the 100 comes from the proxy once the slot is
    // held, the body follows, and the upstream never sees the expectation.
    let mut s = server.connect();
    s.write_all(format!("POST /v1/upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n").as_bytes())
        .unwrap();
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").unwrap();
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"got hello"[..]), "{r:?}");
    assert!(up.seen()[0].header("expect").is_none());
    // A body sent with the head, not waiting for the 100, gets none.
    let mut s = server.connect();
    s.write_all(format!("POST /v1/upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello").as_bytes())
        .unwrap();
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"got hello"[..]), "{r:?}");
    // An interim 103 is relayed before the final answer.
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/hints", "", "")).unwrap();
    let early = read_response(&mut s).unwrap();
    assert_eq!((early.status, early.header("link")), (103, Some("</style.css>; rel=preload")), "{early:?}");
    let r = read_any(&mut s).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]), "{r:?}");
    // Upgrades are refused, never forwarded.
    let before = up.seen().len();
    let r = exchange(&server, &proxied("GET", "/ws", "Connection: Upgrade\r\nUpgrade: websocket\r\n", ""));
    assert_eq!((r.status, r.error_code().as_str()), (501, "not_implemented"), "{r:?}");
    assert_eq!(up.seen().len(), before);
    let r = exchange(&server, &proxied("GET", "/ws", "Connection: Upgrade\r\nUpgrade: h2c, websocket\r\n", ""));
    assert_eq!((r.status, r.error_code().as_str()), (501, "not_implemented"), "{r:?}");
    assert_eq!(up.seen().len(), before);
    // An offer of cleartext HTTP/2 alone (curl --http2, Java's HttpClient) is
    // ignored: the request goes on in HTTP/1.1, the offer not forwarded.
    let h2c = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n";
    let r = exchange(&server, &proxied("GET", "/v1/models", h2c, ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"got "[..]), "{r:?}");
    let seen = up.seen();
    let last = seen.last().unwrap();
    assert!(last.header("upgrade").is_none() && last.header("http2-settings").is_none(), "{last:?}");
    let before = seen.len();
    // So is TRACE, which an upstream answers by echoing what it got,
    // managed credentials included.
    let r = exchange(&server, &proxied("TRACE", "/echo", "", ""));
    assert_eq!((r.status, r.error_code().as_str()), (501, "not_implemented"), "{r:?}");
    assert_eq!(up.seen().len(), before);
    // An expectation other than 100-continue is refused, never forwarded.
    let r = exchange(&server, &proxied("GET", "/v1/models", "Expect: 200-ok\r\n", ""));
    assert_eq!((r.status, r.error_code().as_str()), (417, "expectation_failed"), "{r:?}");
    assert_eq!(up.seen().len(), before);
}

#[test]
fn max_forwards_is_counted_down_and_an_options_at_zero_is_answered_by_the_proxy() {
    // RFC 9110 §7.6.2: an intermediary decrements `Max-Forwards` on an
    // OPTIONS it relays, and answers one at 0 itself; other methods pass it as sent.
    let up = MockUpstream::start(|seen| match seen.request_line().contains("/v1/slow") {
        true => Reply::Silent(Duration::from_secs(3)),
        false => ok("up", ""),
    });
    let server = proxy_server(&up, 1, "");
    let r = exchange(&server, &proxied("OPTIONS", "/v1/models", "Max-Forwards: 3\r\n", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"up"[..]), "{r:?}");
    assert_eq!(up.seen()[0].header("max-forwards").as_deref(), Some("2"));
    let r = exchange(&server, &proxied("GET", "/v1/models", "Max-Forwards: 3\r\n", ""));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(up.seen()[1].header("max-forwards").as_deref(), Some("3"));
    // At 0: answered here, with no slot taken (the one slot is held).
    let mut holder = server.connect();
    holder.write_all(&proxied("GET", "/v1/slow", "", "")).unwrap();
    eventually("the slow request holds the slot", || up.seen().len() == 3);
    let r = exchange(&server, &proxied("OPTIONS", "/v1/models", "Max-Forwards: 0\r\n", ""));
    assert_eq!((r.status, r.body.len()), (200, 0), "{r:?}");
    assert!(r.header("x-nthpool-deny-reason").is_none(), "{r:?}");
    assert_eq!(up.seen().len(), 3, "an OPTIONS at 0 was relayed");
    // Only for a caller the pool admits.
    let wrong_key = "OPTIONS /v1/models HTTP/1.1\r\nHost: ".to_string()
        + HOST
        + "\r\nX-Nthpool-Key: nope\r\nMax-Forwards: 0\r\n\r\n";
    assert_eq!(exchange(&server, wrong_key.as_bytes()).status, 401);
    // Nor does it pass a field the request would be refused for.
    let r = exchange(
        &server,
        &proxied("OPTIONS", "/v1/models", "Max-Forwards: 0\r\nX-Nthpool-Queue-Timeout-Ms: -1\r\n", ""),
    );
    assert_eq!(r.status, 400, "{r:?}");
}

#[test]
fn the_request_cap_cuts_a_long_exchange_and_frees_the_slot() {
    let events = paced_events(50, 100);
    let up = MockUpstream::start(move |_| Reply::Paced(events.clone()));
    let server = TestServer::start(&config(
        &format!(
            r#""concurrency":1,"termMs":200,"renewIntervalMs":50,"requestTimeoutMs":800,
            "upstream":{{"url":"{}","hosts":["{HOST}"]}}"#,
            up.url()
        ),
        "",
    ));
    let mut s = server.connect();
    let start = Instant::now();
    s.write_all(&proxied("GET", "/v1/stream", "", "")).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).ok();
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("data: 0\n\n"), "{text}");
    assert!(!text.contains("data: 49\n\n"), "the stream ran past the cap");
    assert!(took >= Duration::from_millis(700) && took < Duration::from_secs(4), "cut after {took:?}");
    // The lease outlived its term (the server holds it) and ended at the cap.
    slot_comes_back(&server);
}

#[test]
fn idle_connections_are_kept_up_to_the_limit_and_dropped_when_the_upstream_closes_them() {
    let up = MockUpstream::start(|_| ok("one", ""));
    let server = proxy_server(&up, 2, r#""idleConnections":0"#);
    for _ in 0..3 {
        assert_eq!(exchange(&server, &proxied("GET", "/", "", "")).status, 200);
    }
    assert_eq!(up.connections(), 3, "idleConnections 0 keeps none");
    // An upstream that closes its idle connections: the next request opens a new one.
    let closing =
        MockUpstream::start(|_| Reply::RawThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()));
    let server = proxy_server(&closing, 2, "");
    for _ in 0..3 {
        let r = exchange(&server, &proxied("GET", "/", "", ""));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]), "{r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(closing.connections(), 3);
}

#[test]
fn an_idle_upstream_connection_is_closed_at_its_idle_timeout_and_the_next_request_opens_a_fresh_one() {
    let up = MockUpstream::start(|_| ok("one", ""));
    let server = proxy_server(&up, 2, r#""idleTimeoutMs":300"#);
    let sent = Instant::now();
    assert_eq!(exchange(&server, &proxied("GET", "/a", "", "")).status, 200);
    // The upstream keeps it open (for 30 s): nthpool is the side that closes it.
    assert!(up.wait_ended(0, Duration::from_secs(10)), "the idle connection was not closed");
    assert!(sent.elapsed() >= Duration::from_millis(300), "closed before its idle timeout");
    let r = exchange(&server, &proxied("GET", "/b", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"one"[..]), "{r:?}");
    assert_eq!(up.connections(), 2, "the next request went on a fresh connection");
    let conns: Vec<(usize, String)> = up.seen().iter().map(|s| (s.conn, s.request_line().to_string())).collect();
    assert_eq!(conns, [(0, "GET /a HTTP/1.1".to_string()), (1, "GET /b HTTP/1.1".to_string())]);
}

#[test]
fn the_access_log_and_metrics_describe_proxied_requests() {
    let up = MockUpstream::start(|_| ok("hello", "x-ratelimit-remaining-requests: 10\r\n"));
    let server = TestServer::start(
        &config(&format!(r#""upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url()), "")
            .replace(r#""accessLog":null"#, r#""accessLog":"access.log""#),
    );
    let r = exchange(&server, &proxied("PATCH", "/v1/files/7?api_key=secret-in-query", "", "{}"));
    assert_eq!(r.status, 200, "{r:?}");
    let wrong_key = format!("GET /v1/x HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: wrong\r\n\r\n");
    let denied = exchange(&server, wrong_key.as_bytes());
    assert_eq!(denied.status, 401);
    let lines = access_log(&server, 2);
    let log = std::fs::read_to_string(server.dir.join("access.log")).unwrap();
    let ok_line = lines.iter().find(|l| l["status"] == 200).unwrap_or_else(|| panic!("{log}"));
    assert_eq!(ok_line["method"], "PATCH");
    assert_eq!(ok_line["path"], "/v1/files/7");
    assert_eq!(ok_line["upstreamStatus"], 200);
    assert!(ok_line["upstreamMs"].is_u64() && ok_line["slot"].is_string(), "{ok_line}");
    let refused = lines.iter().find(|l| l["status"] == 401).unwrap_or_else(|| panic!("{log}"));
    assert_eq!((refused["error"].as_str(), refused["path"].as_str()), (Some("unauthorized"), Some("/v1/x")));
    assert!(!log.contains("secret-in-query") && !log.contains(KEY), "{log}");
    let mut c = TcpStream::connect(server.admin.unwrap()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let metrics = String::from_utf8(read_response(&mut c).unwrap().body).unwrap();
    for sample in [
        "nthpool_proxy_requests_total{class=\"2xx\"} 1",
        "nthpool_proxy_upstream_time_ms_count 1",
        "nthpool_proxy_bytes_down_total ",
        "nthpool_proxy_upstream_connects_total 1",
        "nthpool_proxy_upstream_connection_errors_total 0",
        "nthpool_proxy_idle_connections 1",
    ] {
        assert!(metrics.contains(sample), "{sample} not in the metrics:\n{metrics}");
    }
}

/// The access log's lines once it holds at least `n` (it is flushed at
/// least every 200 ms), within a generous bound.
fn access_log(server: &TestServer, n: usize) -> Vec<serde_json::Value> {
    let path = server.dir.join("access.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= n || Instant::now() > deadline {
            return text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_client_body_that_breaks_its_framing_mid_response_is_logged_as_the_clients_doing() {
    // The upstream answers at the head and streams while the body comes; the
    // client then breaks its chunked framing: it is cut, and the log names its
    // error, not the upstream's.
    // It takes what comes until the proxy closes the connection.
    let addr = answer_at_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n", true);
    let server = TestServer::start(
        &config(&format!(r#""concurrency":1,"upstream":{{"url":"http://{addr}","hosts":["{HOST}"]}}"#), "")
            .replace(r#""accessLog":null"#, r#""accessLog":"access.log""#),
    );
    let mut s = server.connect();
    let head = format!(
        "POST /v1/upload HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let text = String::from_utf8(read_head(&mut s)).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    s.write_all(b"zz\r\n").unwrap();
    read_to_close(&mut s);
    slot_comes_back(&server);
    let lines = access_log(&server, 1);
    let line = lines.iter().find(|l| l["path"] == "/v1/upload").expect("the exchange's line");
    assert_eq!((line["status"].as_u64(), line["error"].as_str()), (Some(200), Some("bad_request")), "{line}");
}

#[test]
fn every_proxied_outcome_is_logged_once_with_method_and_path() {
    let up = MockUpstream::start(|seen| match seen.request_line().split(' ').nth(1).unwrap() {
        "/v1/reset" => Reply::RawThenReset(Vec::new()),
        "/v1/left-while-relayed" => Reply::Silent(Duration::from_secs(3)),
        _ => ok("fine", ""),
    });
    let mut server = TestServer::start(
        &config(
            &format!(
                r#""concurrency":1,"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
                "upstream":{{"url":"{}","hosts":["{HOST}"]}}"#,
                up.url()
            ),
            "",
        )
        .replace(r#""accessLog":null"#, r#""accessLog":"access.log""#),
    );
    // A lock-API holder has the pool's one slot: proxied requests queue.
    let held = server.acquire("", "");
    assert_eq!(held.status, 200, "{held:?}");
    let timeout_header = "X-Nthpool-Queue-Timeout-Ms: 300\r\n";
    let r = exchange(&server, &proxied("POST", "/v1/queued?token=secret-in-query", timeout_header, "{}"));
    assert_eq!((r.status, r.error_code()), (504, "queue_timeout".to_string()), "{r:?}");
    let mut gone = server.connect();
    gone.write_all(&proxied("GET", "/v1/left-in-queue", "X-Nthpool-Queue-Timeout-Ms: 10000\r\n", "")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(gone);
    server.release(&held.slot(), "");
    slot_comes_back(&server);
    // Granted, then the client leaves while the upstream is silent.
    let mut gone = server.connect();
    gone.write_all(&proxied("GET", "/v1/left-while-relayed", "", "")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.seen().is_empty() {
        assert!(Instant::now() < deadline, "the request never reached the upstream");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(gone);
    slot_comes_back(&server);
    assert_eq!(exchange(&server, &proxied("GET", "/v1/reset", "", "")).status, 502);
    assert_eq!(exchange(&server, &proxied("GET", "/v1/ok?page=2", "", "")).status, 200);
    let wrong_key = format!("DELETE /v1/refused HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: wrong\r\n\r\n");
    assert_eq!(exchange(&server, wrong_key.as_bytes()).status, 401);
    // Queued when the server is told to stop: answered 503.
    assert_eq!(server.acquire("", "").status, 200);
    let mut queued = server.connect();
    queued.write_all(&proxied("PUT", "/v1/at-shutdown", "X-Nthpool-Queue-Timeout-Ms: 10000\r\n", "{}")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    server.signal("TERM");
    assert_eq!(read_any(&mut queued).map(|r| r.status), Some(503));
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }

    let lines = access_log(&server, 9);
    let proxied_line = |path: &str| {
        let found: Vec<_> = lines.iter().filter(|l| l["path"] == path).collect();
        assert_eq!(found.len(), 1, "one line for {path}: {lines:#?}");
        found[0].clone()
    };
    let fields = |l: &serde_json::Value| {
        (
            l["method"].as_str().unwrap().to_string(),
            l["status"].as_u64().unwrap(),
            l["error"].as_str().map(String::from),
        )
    };
    let expect = [
        ("/v1/queued", "POST", 504, Some("queue_timeout")),
        ("/v1/left-in-queue", "GET", 499, Some("client_gone")),
        ("/v1/left-while-relayed", "GET", 499, Some("client_gone")),
        ("/v1/reset", "GET", 502, Some("bad_gateway")),
        ("/v1/ok", "GET", 200, None),
        ("/v1/refused", "DELETE", 401, Some("unauthorized")),
        ("/v1/at-shutdown", "PUT", 503, Some("unavailable")),
    ];
    for (path, method, status, error) in expect {
        let line = proxied_line(path);
        assert_eq!(fields(&line), (method.to_string(), status, error.map(String::from)), "{path}: {line}");
    }
    // Waited its whole budget in the queue, never forwarded.
    let timed_out = proxied_line("/v1/queued");
    assert!(timed_out["queuedMs"].as_u64().unwrap() >= 250, "{timed_out}");
    assert!(timed_out.get("upstreamStatus").is_none_or(|v| v.is_null()), "{timed_out}");
    let left = proxied_line("/v1/left-in-queue");
    assert!(left["queuedMs"].as_u64().unwrap() >= 250, "it waited until it left: {left}");
    // The upstream's status and time where there was an answer.
    let ok_line = proxied_line("/v1/ok");
    assert_eq!(ok_line["upstreamStatus"], 200, "{ok_line}");
    assert!(ok_line["upstreamMs"].is_u64(), "{ok_line}");
    assert!(proxied_line("/v1/reset")["upstreamMs"].is_u64(), "the request was sent");
    // The only lines without a method are the lock API's granted acquires.
    for line in lines.iter().filter(|l| l.get("method").is_none()) {
        assert!(line["status"] == 200 && line["slot"].is_string(), "{line}");
    }
    let text = std::fs::read_to_string(server.dir.join("access.log")).unwrap();
    assert!(!text.contains("secret-in-query"), "{text}");
}

/// `raw` with the pool key added after its request line.
fn with_key(raw: &[u8]) -> Vec<u8> {
    let at = raw.iter().position(|&b| b == b'\n').map_or(raw.len(), |i| i + 1);
    let mut out = raw[..at].to_vec();
    out.extend_from_slice(format!("X-Nthpool-Key: {KEY}\r\n").as_bytes());
    out.extend_from_slice(&raw[at..]);
    out
}

#[test]
fn framing_attacks_sent_to_the_proxy_never_reach_the_upstream_as_two_requests() {
    let up = MockUpstream::start(|_| ok("fine", ""));
    let port = free_port();
    let _server = TestServer::start(&config(
        &format!(r#""upstream":{{"url":"{}","listen":"127.0.0.1:{port}","maxRequestBytes":1024}}"#, up.url()),
        "",
    ));
    let good = format!("GET /good HTTP/1.1\r\nHost: a\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let after = format!("GET /after HTTP/1.1\r\nHost: a\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    let mut failures = Vec::new();
    for &(name, raw, status) in framing::FRAMING {
        let before = up.seen().len();
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut batch = good.clone().into_bytes();
        batch.extend(with_key(raw));
        batch.extend_from_slice(after.as_bytes());
        c.write_all(&batch).unwrap();
        let first = read_any(&mut c);
        if first.as_ref().map(|r| r.status) != Some(200) {
            failures.push(format!("{name}: the good request got {first:?}"));
            continue;
        }
        let refused = read_any(&mut c);
        if refused.as_ref().map(|r| (r.status, r.error_code())) != Some((status, framing::code_of(status).to_string()))
        {
            failures.push(format!("{name}: the attack got {refused:?}"));
        }
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        // Give the upstream time to have seen anything that leaked.
        std::thread::sleep(Duration::from_millis(50));
        let seen: Vec<String> = up.seen()[before..].iter().map(|s| s.request_line().to_string()).collect();
        let leaked: Vec<&String> = seen.iter().filter(|l| !l.starts_with("GET /good ")).collect();
        if seen.is_empty() || !leaked.is_empty() {
            failures.push(format!("{name}: the upstream saw {seen:?}"));
        }
    }
    assert!(failures.is_empty(), "framing cases that failed:\n{}", failures.join("\n"));
}

#[test]
fn lock_holders_and_proxied_exchanges_never_exceed_the_concurrency_limit() {
    const LIMIT: u32 = 3;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (f, p) = (in_flight.clone(), peak.clone());
    let up = MockUpstream::start(move |_| {
        // Counted while the upstream works: after the grant, before the release.
        let now = f.fetch_add(1, Ordering::SeqCst) + 1;
        p.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        f.fetch_sub(1, Ordering::SeqCst);
        ok("done", "")
    });
    let server = TestServer::start(&config(
        &format!(
            r#""concurrency":{LIMIT},"adaptive":false,"queue":{{"size":100,"timeoutMs":10000}},
            "upstream":{{"url":"{}","hosts":["{HOST}"],"waitMs":10000}}"#,
            up.url()
        ),
        "",
    ));
    let server = Arc::new(server);
    let mut workers = Vec::new();
    for w in 0..8 {
        let (server, f, p) = (server.clone(), in_flight.clone(), peak.clone());
        workers.push(std::thread::spawn(move || {
            for _ in 0..10 {
                if w % 2 == 0 {
                    let r = exchange(&server, &proxied("GET", "/work", "", ""));
                    assert_eq!(r.status, 200, "{r:?}");
                } else {
                    let slot = server.acquire("", r#"{"waitMs":10000}"#).slot();
                    let now = f.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    f.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(server.release(&slot, "").json()["released"], true);
                }
            }
        }));
    }
    for w in workers {
        w.join().unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= LIMIT as usize, "{peak} calls were in flight at once with a limit of {LIMIT}");
    assert!(peak >= 2, "the two kinds of traffic overlapped (peak {peak})");
    assert_eq!(up.seen().len(), 40);
}

#[test]
fn a_reload_keeps_exchanges_in_flight_and_applies_new_headers_to_new_ones() {
    let events = paced_events(10, 100);
    let up = MockUpstream::start(move |seen| {
        if seen.request_line().contains("/stream") {
            Reply::Paced(events.clone())
        } else {
            ok("fine", "")
        }
    });
    let pool = |team: &str| {
        config(
            &format!(r#""upstream":{{"url":"{}","hosts":["{HOST}"],"setHeaders":{{"X-Team":"{team}"}}}}"#, up.url()),
            "",
        )
    };
    let server = TestServer::start(&pool("before"));
    let mut s = server.connect();
    s.write_all(&proxied("GET", "/stream", "", "")).unwrap();
    let mut first = [0u8; 64];
    assert!(s.read_some(&mut first).unwrap() > 0);
    std::fs::write(&server.config_path, pool("after")).unwrap();
    server.signal("HUP");
    std::thread::sleep(Duration::from_millis(200));
    let r = exchange(&server, &proxied("GET", "/other", "", ""));
    assert_eq!(r.status, 200, "{r:?}");
    let mut rest = Vec::new();
    read_to_last_chunk(&mut s, &mut rest);
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("data: 9\n\n"), "the stream ran to its end: {text:?}");
    let teams: Vec<Option<String>> = up.seen().iter().map(|s| s.header("x-team")).collect();
    assert_eq!(teams, [Some("before".to_string()), Some("after".to_string())]);
}

/// A client that stops reading a relayed response is closed at
/// `writeTimeoutMs`, its slot freed, and its line says so as a lock API
/// acquire's would: `408 request_timeout` (the status is never sent), not
/// that the client left.
#[test]
fn a_client_that_stops_reading_a_relayed_response_is_logged_as_timed_out() {
    let big = "x".repeat(32 * 1024 * 1024);
    let up = MockUpstream::start(move |_| ok(&big, ""));
    let server = TestServer::start(
        &config(&format!(r#""concurrency":1,"upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url()), "")
            .replace(r#""accessLog":null"#, r#""accessLog":"access.log","writeTimeoutMs":300"#),
    );
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&server.addr.into()).unwrap();
    let mut stalled = TcpStream::from(socket);
    stalled.write_all(&proxied("GET", "/v1/big", "", "")).unwrap();
    // Never read: the server's output fills and the deadline closes it.
    eventually("the exchange holds the slot", || server.acquire("", "").status == 429);
    slot_comes_back(&server);
    let mut line = None;
    eventually("the exchange's line", || {
        line = access_log(&server, 1).into_iter().find(|l| l["path"] == "/v1/big");
        line.is_some()
    });
    let line = line.unwrap();
    assert_eq!((line["status"].as_u64(), line["error"].as_str()), (Some(408), Some("request_timeout")), "{line}");
    assert_eq!(line["upstreamStatus"], 200, "{line}");
    drop(stalled);
}
