//! A scripted mock upstream for proxy tests: a thread per connection on
//! `127.0.0.1:0`, reading HTTP/1.1 requests (Content-Length or chunked
//! bodies), recording each one, and answering as the test's script says.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{config, read_response, ReadSome, Response, TestServer, KEY};

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Which accepted connection it came on (0, 1, ...).
    pub conn: usize,
    /// The request line and header lines, as sent.
    pub head: String,
    /// The body, decoded when it was chunked.
    pub body: Vec<u8>,
    /// Whether it came chunked.
    pub chunked: bool,
}

impl Seen {
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    /// Every value of header `name` (case-insensitive).
    pub fn headers(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers(name).into_iter().next()
    }
}

/// What the upstream does with a request.
pub enum Reply {
    /// Writes these bytes and keeps the connection for the next request.
    Raw(Vec<u8>),
    /// Writes these bytes and closes.
    RawThenClose(Vec<u8>),
    /// Writes each piece after its pause (ms), then closes.
    Paced(Vec<(u64, Vec<u8>)>),
    /// Says nothing for this long, then closes.
    Silent(Duration),
    /// Writes `head`, then `piece` `times` times as fast as the socket takes
    /// it (a large body without holding it in memory), and keeps the connection.
    Repeat { head: Vec<u8>, piece: Vec<u8>, times: usize },
    /// Writes these bytes (none for a request never answered), then resets
    /// the connection: `SO_LINGER` 0 and close, so the peer gets an RST.
    RawThenReset(Vec<u8>),
}

/// A `200` with `body` under a `Content-Length` and the given extra header lines.
pub fn ok(body: &str, extra_headers: &str) -> Reply {
    Reply::Raw(format!("HTTP/1.1 200 OK\r\n{extra_headers}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes())
}

pub struct MockUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    /// Connections the other side ended while the upstream waited for a request.
    ended: Arc<Mutex<Vec<usize>>>,
}

type Script = dyn Fn(&Seen) -> Reply + Send + Sync;

impl MockUpstream {
    pub fn start(script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> MockUpstream {
        Self::start_on("127.0.0.1:0".parse().unwrap(), script)
    }

    /// Like `start`, listening on `addr` (another loopback address, a given port).
    pub fn start_on(addr: SocketAddr, script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> MockUpstream {
        let listener = TcpListener::bind(addr).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let (s, c, e) = (seen.clone(), connections.clone(), ended.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let n = c.fetch_add(1, Ordering::SeqCst);
                let (s, e, script) = (s.clone(), e.clone(), script.clone());
                std::thread::spawn(move || {
                    if serve(stream, n, &s, &*script) == Served::Ended {
                        e.lock().unwrap().push(n);
                    }
                });
            }
        });
        MockUpstream { addr, seen, connections, ended }
    }

    /// Waits up to `limit` for connection `conn` to be ended by the other
    /// side between requests; whether it was.
    pub fn wait_ended(&self, conn: usize, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.ended.lock().unwrap().contains(&conn) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// How a connection's service ended.
#[derive(PartialEq, Eq)]
enum Served {
    /// The other side ended it (or it failed, or went 30 s quiet) while a request was awaited.
    Ended,
    /// The script closed or reset it, or a write failed.
    Closed,
}

fn serve(mut stream: TcpStream, conn: usize, seen: &Mutex<Vec<Seen>>, script: &Script) -> Served {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf, conn) else { return Served::Ended };
        seen.lock().unwrap().push(request.clone());
        match script(&request) {
            Reply::Raw(bytes) => {
                if stream.write_all(&bytes).is_err() {
                    return Served::Closed;
                }
            }
            Reply::RawThenClose(bytes) => {
                let _ = stream.write_all(&bytes);
                return Served::Closed;
            }
            Reply::Paced(pieces) => {
                for (pause, bytes) in pieces {
                    std::thread::sleep(Duration::from_millis(pause));
                    if stream.write_all(&bytes).is_err() {
                        return Served::Closed;
                    }
                }
                return Served::Closed;
            }
            Reply::RawThenReset(bytes) => {
                let _ = stream.write_all(&bytes);
                reset(stream);
                return Served::Closed;
            }
            Reply::Silent(d) => {
                std::thread::sleep(d);
                return Served::Closed;
            }
            Reply::Repeat { head, piece, times } => {
                if stream.write_all(&head).is_err() {
                    return Served::Closed;
                }
                for _ in 0..times {
                    if stream.write_all(&piece).is_err() {
                        return Served::Closed;
                    }
                }
            }
        }
    }
}

/// Closes `stream` with an RST instead of a FIN (std has no stable `set_linger`).
fn reset(stream: TcpStream) {
    let socket = socket2::Socket::from(stream);
    socket.set_linger(Some(std::time::Duration::ZERO)).expect("SO_LINGER 0 on the mock upstream's socket");
}

fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read_some(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>, conn: usize) -> Option<Seen> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !fill(stream, buf) {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let mut seen = Seen { conn, head, body: Vec::new(), chunked: false };
    let length = seen.header("content-length").map(|v| v.parse::<usize>().expect("a numeric Content-Length"));
    if seen.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        seen.chunked = true;
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                if !fill(stream, buf) {
                    return None;
                }
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).expect("a chunk size");
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                if !fill(stream, buf) {
                    return None;
                }
            }
            if size == 0 {
                // No trailers are sent by the proxy: the final CRLF follows.
                buf.drain(..2);
                break;
            }
            seen.body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
        }
    } else if let Some(n) = length {
        while buf.len() < n {
            if !fill(stream, buf) {
                return None;
            }
        }
        seen.body = buf.drain(..n).collect();
    }
    Some(seen)
}

pub const HOST: &str = "p.proxy.test";

// The client side of proxy tests.

/// A server whose pool `p` (concurrency `concurrency`) proxies to `up` for
/// `Host: p.proxy.test`, with `extra` members in its `upstream` section.
pub fn proxy_server(up: &MockUpstream, concurrency: u32, extra: &str) -> TestServer {
    let sep = if extra.is_empty() { "" } else { "," };
    TestServer::start(&config(
        &format!(
            r#""concurrency":{concurrency},"adaptive":false,"queue":{{"size":10,"timeoutMs":5000}},
            "upstream":{{"url":"{}","hosts":["{HOST}"]{sep}{extra}}}"#,
            up.url()
        ),
        "",
    ))
}

/// A proxied request with the pool key, `extra` header lines and a body.
pub fn proxied(method: &str, target: &str, extra: &str, body: &str) -> Vec<u8> {
    let length =
        if body.is_empty() && method == "GET" { String::new() } else { format!("Content-Length: {}\r\n", body.len()) };
    format!("{method} {target} HTTP/1.1\r\nHost: {HOST}\r\nX-Nthpool-Key: {KEY}\r\n{extra}{length}\r\n{body}")
        .into_bytes()
}

/// Reads one response whatever its framing (Content-Length or chunked);
/// `None` on EOF before a head.
pub fn read_any(s: &mut TcpStream) -> Option<Response> {
    // The head (and a Content-Length body) as the harness reads them.
    let mut r = read_response(s)?;
    if r.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let line = read_line(s);
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            let mut chunk = vec![0u8; size + 2];
            s.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            r.body.extend_from_slice(&chunk[..size]);
        }
    }
    Some(r)
}

fn read_line(s: &mut TcpStream) -> String {
    String::from_utf8(read_through(s, b"\r\n", "a chunk-size line")).unwrap()
}

/// The bytes up to and with the first `end`, read one at a time so nothing
/// after it is taken; panics if the stream ends inside `what`.
pub fn read_through(s: &mut TcpStream, end: &[u8], what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(end) {
        assert_eq!(s.read_some(&mut byte).unwrap(), 1, "the stream ended inside {what}");
        got.push(byte[0]);
    }
    got
}

pub fn exchange(server: &TestServer, raw: &[u8]) -> Response {
    let mut s = server.connect();
    s.write_all(raw).unwrap();
    read_any(&mut s).expect("a response")
}

/// Polls until a fail-fast lock acquire gets a slot (the pool's slot was
/// given back), within a generous bound; returns the time it took.
pub fn slot_comes_back(server: &TestServer) -> Duration {
    let start = Instant::now();
    loop {
        let r = server.acquire("", "");
        if r.status == 200 {
            server.release(&r.slot(), "");
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the slot never came back: {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
