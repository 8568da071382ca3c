//! Model-based wire fuzz of the reactor, the request pipeline and the
//! governor, over real sockets.
//!
//! A few client connections drive the real server with a seeded
//! pseudo-random sequence of lock requests: fail-fast and queued acquires,
//! renews, releases with and without reports, releases twice, renews after
//! release, pipelined batches of mixed requests, requests split at random
//! byte boundaries across writes, connections dropped mid-request or while
//! queued, half-closes after sending, malformed requests (framing, bodies,
//! keys, routes, slot ids) and `Idempotency-Key` retries, in many header
//! styles (so each connection's memo of header blocks both hits and misses).
//! A tiny reference model of the pool follows along: the slots each client
//! believes it holds and until when, the acquires waiting in the queue, the
//! ids that are gone.
//!
//! The server's clock is known only to lie between a request's first byte
//! and its answer, so every deadline in the model is a window of the test's
//! own monotonic clock, and a prediction is certain only when the whole
//! window is on one side of the deadline; otherwise (a term expiring while a
//! renew is on its way, a waiter's deadline against a grant) both outcomes
//! are allowed and the answer tells the model which one happened. What is
//! checked, strictly:
//!
//! - every answer is well-formed HTTP/1.1 (status line, CRLF, one
//!   `Content-Length`, `Date`), says `Connection: close` exactly when the
//!   model expects the connection to end (and then it ends), and error
//!   answers carry a JSON body with `error` and `message`;
//! - pipelined answers come back in order, each the kind of answer its
//!   request asks for, with the status the model predicts where it can
//!   (grants, `429` reasons, `404`, `409 capped`, `released` true or false,
//!   `409 superseded`, the error table), and the governor headers agree;
//! - no slot id is granted twice, a key's retry gets its grant back, and a
//!   waiter is answered `504` no earlier than its deadline;
//! - `/metrics` (scraped often): held and queued lie within the model's
//!   bounds, held never exceeds the concurrency, and a queue is never
//!   non-empty beside a pool with a free slot;
//! - at the end, with everything released or expired: nothing held or
//!   queued, only the scrape's own connection open, every grant ended one
//!   way (released or reclaimed), and the server still running.
//!
//! Bounded: `SEEDS` fixed seeds of `STEPS` steps each (a few seconds in
//! all). A failure prints the seed and the step log, and
//! `NTHPOOL_WIRE_SEED=<seed>` replays that seed (the timing differs, the
//! operations do not). To hunt, off by default:
//! `NTHPOOL_WIRE_SEEDS=500 NTHPOOL_WIRE_STEPS=400 cargo test --release --test wire_model`
//! (`NTHPOOL_WIRE_FIRST_SEED` moves the range; `NTHPOOL_WIRE_RAW=1` adds each
//! request's bytes to the step log).

mod common;
#[path = "common/framing.rs"]
mod framing;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{ReadSome, TestServer, KEY};

const CONCURRENCY: u64 = 3;
const QUEUE_SIZE: u64 = 2;
const QUEUE_TIMEOUT_MS: u64 = 400;
const TERM_MS: u64 = 300;
const RENEW_MS: u64 = 100;
const REQUEST_TIMEOUT_MS: u64 = 500;
const MAX_BODY: usize = 1024;
const CLIENTS: usize = 4;
const OTHER_KEY: &str = "other-key";
/// Slack between the server's clock readings and ours (the same monotonic
/// clock, read in whole milliseconds on both sides).
const EPS: u64 = 3;
/// How long past its deadline a lease may still count as held: it is
/// reclaimed in the server's next turn.
const RECLAIM_SLACK: u64 = 150;
/// How long a grant whose answer nobody read may stay held.
const ORPHAN_MS: u64 = TERM_MS + 1000;
/// An answer that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(5);
/// The model's clock starts here, so windows never go below zero.
const ORIGIN: u64 = 100_000;
/// Seeds and steps of the default run.
const SEEDS: u64 = 4;
const STEPS: usize = 150;

#[test]
fn wire_model() {
    let number = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name}")));
    let steps = number("NTHPOOL_WIRE_STEPS").map_or(STEPS, |n| n as usize);
    let seeds: Vec<u64> = match number("NTHPOOL_WIRE_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = number("NTHPOOL_WIRE_FIRST_SEED").unwrap_or(1);
            (first..first + number("NTHPOOL_WIRE_SEEDS").unwrap_or(SEEDS)).collect()
        }
    };
    let started = Instant::now();
    for &seed in &seeds {
        let mut run = Run::new(seed);
        let outcome = run.play(steps);
        if let Err(e) = outcome {
            let log = run.log.join("\n");
            let server_log = run.server.log();
            panic!(
                "wire model failed, seed {seed} (replay: NTHPOOL_WIRE_SEED={seed} NTHPOOL_WIRE_STEPS={steps}): {e}\n\
                 --- step log ---\n{log}\n--- server log ---\n{server_log}"
            );
        }
        if std::env::var_os("NTHPOOL_WIRE_VERBOSE").is_some() {
            println!("{}", run.log.join("\n"));
        }
    }
    println!("wire model: {} seeds x {steps} steps in {:?}", seeds.len(), started.elapsed());
}

/// Pool `p` is the one the model follows. Pool `q` takes the same key (so
/// its requests share header blocks with `p`'s on one connection) and one
/// slot, held for seconds; `other` has a key of its own. `spin` varies a
/// setting that changes nothing here, for reloads.
fn server_config(spin: bool) -> String {
    let p = format!(
        r#""keys":["{KEY}"],"concurrency":{CONCURRENCY},"queue":{{"size":{QUEUE_SIZE},"timeoutMs":{QUEUE_TIMEOUT_MS}}},"termMs":{TERM_MS},"renewIntervalMs":{RENEW_MS},"requestTimeoutMs":{REQUEST_TIMEOUT_MS},"adaptive":false"#
    );
    let q = format!(r#""keys":["{KEY}"],"concurrency":1,"adaptive":false"#);
    let spin = if spin { 50 } else { 0 };
    format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"maxBodyBytes":{MAX_BODY},"idleSpinUs":{spin},
        "pools":{{"p":{{{p}}},"q":{{{q}}},"other":{{"keys":["{OTHER_KEY}"]}}}}}}"#
    )
}

// ------------------------------------------------------------------ randomness

/// xorshift64*: small, fast, and the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 16) % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

// ------------------------------------------------------------------ answers on the wire

#[derive(Debug, Clone)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn header_u64(&self, name: &str) -> Result<u64, String> {
        self.header(name)
            .ok_or_else(|| format!("no {name} in {}", self.summary()))?
            .parse()
            .map_err(|_| format!("{name} is not a number in {}", self.summary()))
    }

    fn says_close(&self) -> bool {
        self.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    fn json(&self) -> Result<serde_json::Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("body is not JSON ({e}): {}", self.summary()))
    }

    fn code(&self) -> String {
        self.json().ok().and_then(|v| v["error"].as_str().map(str::to_string)).unwrap_or_default()
    }

    fn message(&self) -> String {
        self.json().ok().and_then(|v| v["message"].as_str().map(str::to_string)).unwrap_or_default()
    }

    fn summary(&self) -> String {
        let body = String::from_utf8_lossy(&self.body);
        let body: String = body.chars().take(150).collect();
        let reason = self.header("x-nthpool-deny-reason").map(|r| format!(" [{r}]")).unwrap_or_default();
        format!("{}{reason} {body}", self.status)
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One answer from the start of `buf`, `Ok(None)` while incomplete. Strict:
/// anything that is not well-formed HTTP/1.1 as this server writes it is an error.
fn parse_response(buf: &[u8], head_method: bool) -> Result<Option<(Resp, usize)>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 65536 {
            return Err("no end of an answer head in 64 KiB".into());
        }
        return Ok(None);
    };
    let lossy = || String::from_utf8_lossy(&buf[..end.min(400)]).into_owned();
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| format!("answer head not UTF-8: {}", lossy()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let rest = status_line.strip_prefix("HTTP/1.1 ").ok_or_else(|| format!("bad status line in {:?}", lossy()))?;
    let (code, reason) = rest.split_once(' ').ok_or_else(|| format!("bad status line in {:?}", lossy()))?;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) || reason.is_empty() {
        return Err(format!("bad status line in {:?}", lossy()));
    }
    let status: u16 = code.parse().unwrap();
    let mut headers = Vec::new();
    for line in lines {
        if line.contains(['\r', '\n']) {
            return Err(format!("a bare CR or LF in the answer head {:?}", lossy()));
        }
        let (name, value) = line.split_once(':').ok_or_else(|| format!("bad header line {line:?}"))?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(format!("bad header name in {line:?}"));
        }
        headers.push((name.to_string(), value.trim().to_string()));
    }
    if status == 100 {
        return Ok(Some((Resp { status, headers, body: Vec::new() }, end + 4)));
    }
    let lengths: Vec<&str> =
        headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.as_str()).collect();
    if lengths.len() != 1 {
        return Err(format!("not exactly one Content-Length in {:?}", lossy()));
    }
    if headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding")) {
        return Err(format!("Transfer-Encoding in an answer: {:?}", lossy()));
    }
    let len: usize = lengths[0].parse().map_err(|_| format!("bad Content-Length in {:?}", lossy()))?;
    let len = if head_method { 0 } else { len };
    if buf.len() < end + 4 + len {
        return Ok(None);
    }
    let body = buf[end + 4..end + 4 + len].to_vec();
    Ok(Some((Resp { status, headers, body }, end + 4 + len)))
}

/// What every final answer must have, whatever the model says about it.
fn check_common(resp: &Resp, head_method: bool) -> Result<(), String> {
    if resp.header("date").is_none() {
        return Err(format!("no Date in {}", resp.summary()));
    }
    if head_method {
        return Ok(());
    }
    if resp.status >= 400 {
        if !resp.header("content-type").is_some_and(|t| t.starts_with("application/json")) {
            return Err(format!("an error answer that is not JSON: {}", resp.summary()));
        }
        let v = resp.json()?;
        let code = v["error"].as_str().unwrap_or_default();
        let message = v["message"].as_str().unwrap_or_default();
        if code.is_empty() || !code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') || message.len() < 5 {
            return Err(format!("an error answer without `error` and `message`: {}", resp.summary()));
        }
    }
    if resp.status == 200 && !resp.json()?.is_object() {
        return Err(format!("a 200 whose body is not a JSON object: {}", resp.summary()));
    }
    Ok(())
}

/// What a read came to.
enum Got {
    Answer(Resp),
    Eof,
    Timeout,
}

/// One client connection: raw bytes each way.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    writer: Option<JoinHandle<()>>,
    /// We sent our FIN.
    half_closed: bool,
    /// The unfinished request we sent last asked for `100 Continue`.
    tail_expects_continue: bool,
    /// Its number, for the log.
    n: u32,
}

impl Conn {
    fn open(addr: SocketAddr, n: u32) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect to the server");
        stream.set_nodelay(true).unwrap();
        Conn { stream, buf: Vec::new(), writer: None, half_closed: false, tail_expects_continue: false, n }
    }

    fn join_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }

    /// Sends `bytes` in pieces cut at `cuts` (a millisecond apart, so they
    /// arrive in separate reads), then the FIN when `fin`. Large or cut
    /// sends run on a thread while the answers are read. Write errors are
    /// left to the reads to tell (the server may have closed on purpose).
    fn send(&mut self, bytes: Vec<u8>, cuts: Vec<usize>, fin: bool) {
        self.join_writer();
        if fin {
            self.half_closed = true;
        }
        let inline = bytes.len() <= 16 * 1024 && cuts.is_empty();
        let mut stream = self.stream.try_clone().expect("clone the stream");
        let job = move || {
            let mut at = 0;
            for cut in cuts.into_iter().chain(std::iter::once(bytes.len())) {
                if cut <= at {
                    continue;
                }
                if at > 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if stream.write_all(&bytes[at..cut]).is_err() {
                    return;
                }
                at = cut;
            }
            if fin {
                let _ = stream.shutdown(Shutdown::Write);
            }
        };
        if inline {
            job();
        } else {
            self.writer = Some(std::thread::spawn(job));
        }
    }

    /// Reads one answer (skipping one `100 Continue` when `interim` allows it).
    fn read(&mut self, patience: Duration, head_method: bool, mut interim: bool) -> Result<Got, String> {
        let until = Instant::now() + patience;
        loop {
            if let Some((resp, used)) = parse_response(&self.buf, head_method)? {
                self.buf.drain(..used);
                if resp.status == 100 {
                    if !interim {
                        return Err("a 100 Continue nobody asked for".into());
                    }
                    interim = false;
                    continue;
                }
                return Ok(Got::Answer(resp));
            }
            let now = Instant::now();
            if now >= until {
                return Ok(Got::Timeout);
            }
            self.stream.set_read_timeout(Some(until - now)).unwrap();
            let mut chunk = [0u8; 16384];
            match self.stream.read_some(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(Got::Eof),
                Ok(0) => {
                    return Err(format!(
                        "the connection ended inside an answer: {:?}",
                        String::from_utf8_lossy(&self.buf[..self.buf.len().min(300)])
                    ))
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset && self.buf.is_empty() => return Ok(Got::Eof),
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }
}

// ------------------------------------------------------------------ the model

/// A window of the test's clock (ms): the server did it at some time inside.
type Win = (u64, u64);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tri {
    No,
    Maybe,
    Yes,
}

/// A slot a client believes it holds.
#[derive(Debug, Clone)]
struct Slot {
    id: String,
    key: Option<String>,
    /// When it was granted, and last renewed.
    granted: Win,
    renewed: Option<Win>,
    /// Its deadlines in Unix ms as the server last said them.
    lease_unix: u64,
    req_unix: u64,
    /// Its last renew answered with the lease at its request deadline: the next renew is `409`.
    at_cap: bool,
    /// Renews or releases of it sent but not answered yet (behind a queued acquire).
    limbo: u32,
    /// A renew or release of it went on a connection dropped before the answer.
    lost: bool,
}

impl Slot {
    fn uncertain(&self) -> bool {
        self.limbo > 0 || self.lost
    }

    /// When it ends unless renewed or released: `(earliest, latest)`.
    fn deadline(&self) -> Win {
        let req = (self.granted.0 + REQUEST_TIMEOUT_MS, self.granted.1 + REQUEST_TIMEOUT_MS);
        if self.uncertain() {
            let base = self.renewed.unwrap_or(self.granted);
            return ((base.0 + TERM_MS).min(req.0), req.1);
        }
        if self.at_cap {
            return req;
        }
        let base = self.renewed.unwrap_or(self.granted);
        ((base.0 + TERM_MS).min(req.0), (base.1 + TERM_MS).min(req.1))
    }

    fn alive_for_sure(&self, w: Win) -> bool {
        !self.uncertain() && w.1 < self.deadline().0
    }

    fn dead_for_sure(&self, w: Win) -> bool {
        w.0 >= self.deadline().1
    }

    /// Whether the server may still count it at `t`.
    fn maybe_held(&self, t: u64) -> bool {
        t < self.deadline().1 + RECLAIM_SLACK
    }

    fn capped(&self) -> Tri {
        if self.uncertain() {
            Tri::Maybe
        } else if self.at_cap {
            Tri::Yes
        } else {
            Tri::No
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WState {
    /// Certainly not granted (nothing that could free a slot happened).
    Queued,
    MaybeGranted,
    /// Certainly granted: a release freed a slot while it headed the queue.
    Granted,
}

/// An acquire waiting in the queue, as far as the model knows.
#[derive(Debug, Clone)]
struct Waiter {
    id: u32,
    client: usize,
    key: Option<String>,
    sent: u64,
    /// Its wait budget, clamped to the queue timeout.
    wait: u64,
    /// When a scrape showed it queued.
    confirmed: Option<u64>,
    state: WState,
    /// The earliest its grant can have been.
    granted_lo: u64,
    /// It may have been refused at once (the queue may have been full).
    may_deny_now: bool,
}

impl Waiter {
    fn maybe_timed_out(&self, t: u64) -> bool {
        t >= self.sent.saturating_sub(EPS) + self.wait
    }

    fn surely_timed_out(&self, t: u64) -> bool {
        self.confirmed.is_some_and(|c| t > c + EPS + self.wait + RECLAIM_SLACK)
    }

    fn certainly_queued(&self, w: Win) -> bool {
        // A scrape answered before the request was sent saw it queued.
        self.state == WState::Queued && self.confirmed.is_some_and(|c| c <= w.0 + EPS) && !self.maybe_timed_out(w.1)
    }
}

#[derive(Debug, Clone)]
enum Expect {
    /// An acquire; `wait` is its budget as the server takes it (0: fail fast).
    Acquire {
        wait: u64,
        key: Option<String>,
    },
    /// The answer of a queued acquire.
    Waiter(u32),
    /// A renew or release of one of the client's slot ids (or of one gone).
    Renew {
        id: String,
        limbo: bool,
    },
    Release {
        id: String,
        limbo: bool,
    },
    /// A renew or release naming an id its pool does not hold.
    Gone404,
    GoneFalse,
    /// An error answer.
    Error {
        status: u16,
        code: &'static str,
    },
    /// A fail-fast acquire on pool `q`, and a release there.
    QAcquire,
    QRelease(String),
}

#[derive(Debug, Clone)]
struct Pending {
    expect: Expect,
    sent: u64,
    desc: String,
    /// The answer ends the connection.
    closes: bool,
    head_method: bool,
    expect_continue: bool,
    /// HTTP/1.0 asking for keep-alive: the answer must say so.
    http10_keep_alive: bool,
}

/// A request on the wire and what its answer must be.
struct Req {
    bytes: Vec<u8>,
    pending: Pending,
}

#[derive(Default)]
struct Client {
    conn: Option<Conn>,
    slots: Vec<Slot>,
    /// Ids it held once: released or ended.
    stale: Vec<String>,
    pending: VecDeque<Pending>,
    /// Header style bits (see `Run::request`).
    style: u64,
}

#[derive(Debug, Clone)]
enum KeyHolder {
    Slot(usize, String),
    Waiter,
}

type Metrics = HashMap<String, u64>;

struct Run {
    seed: u64,
    rng: Rng,
    server: TestServer,
    admin_addr: SocketAddr,
    admin: Option<Conn>,
    clients: Vec<Client>,
    /// In the order they queued.
    waiters: Vec<Waiter>,
    /// Waiters whose connection was dropped: gone once the server reads that.
    leaving: u64,
    /// Grants nobody will read (their connection was dropped): until when they may be held.
    orphans: Vec<u64>,
    keys: HashMap<String, KeyHolder>,
    seen_ids: HashSet<String>,
    /// Grants of pool `p` the clients saw.
    p_grants: u64,
    t0: Instant,
    next_id: u32,
    conns_opened: u32,
    /// Requests are built without `Connection: close` or plain HTTP/1.0.
    no_close: bool,
    /// The slot pool `q` holds, unless an unread answer left it unknown.
    q_slot: Option<String>,
    q_unknown: bool,
    /// Reloads asked for, and the setting the configuration file has now.
    reloads: u64,
    spin: bool,
    log: Vec<String>,
}

fn short(id: &str) -> &str {
    &id[id.len().saturating_sub(6)..]
}

impl Run {
    fn new(seed: u64) -> Run {
        let server = TestServer::start_logged(&server_config(false), "warn");
        let admin_addr = server.admin.expect("an admin listener");
        Run {
            seed,
            rng: Rng::new(seed),
            server,
            admin_addr,
            admin: None,
            clients: (0..CLIENTS).map(|_| Client::default()).collect(),
            waiters: Vec::new(),
            leaving: 0,
            orphans: Vec::new(),
            keys: HashMap::new(),
            seen_ids: HashSet::new(),
            p_grants: 0,
            t0: Instant::now(),
            next_id: 0,
            conns_opened: 0,
            no_close: false,
            q_slot: None,
            q_unknown: false,
            reloads: 0,
            spin: false,
            log: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        ORIGIN + self.t0.elapsed().as_millis() as u64
    }

    fn note(&mut self, line: String) {
        let t = self.now() - ORIGIN;
        self.log.push(format!("{t:>6} {line}"));
    }

    // -------------------------------------------------------------- bounds

    /// How many slots the server may hold over `w`: `(surely, at most)`.
    fn held_bounds(&self, w: Win) -> (u64, u64) {
        let (mut lo, mut hi) = (0, 0);
        for s in self.clients.iter().flat_map(|c| &c.slots) {
            lo += s.alive_for_sure(w) as u64;
            hi += s.maybe_held(w.0) as u64;
        }
        for x in &self.waiters {
            match x.state {
                WState::Queued => {}
                WState::MaybeGranted => hi += 1,
                WState::Granted => {
                    hi += 1;
                    lo += (w.1 < x.granted_lo + TERM_MS) as u64;
                }
            }
        }
        hi += self.orphans.iter().filter(|&&until| w.0 <= until).count() as u64;
        (lo, hi)
    }

    /// How many acquires may wait in the queue over `w`: `(surely, at most)`.
    fn waiter_bounds(&self, w: Win) -> (u64, u64) {
        let lo = self.waiters.iter().filter(|x| x.certainly_queued(w)).count() as u64;
        let hi = self.waiters.iter().filter(|x| x.state != WState::Granted && !x.surely_timed_out(w.0)).count() as u64;
        (lo, hi + self.leaving)
    }

    /// A slot freed (`certain`: by a release just answered, over `w`), or may have.
    fn on_free(&mut self, certain: bool, w: Win) {
        let Some(first) = self.waiters.iter().position(|x| x.state != WState::Granted) else {
            return;
        };
        if certain && self.leaving == 0 && self.waiters[first].certainly_queued(w) {
            let x = &mut self.waiters[first];
            x.state = WState::Granted;
            x.granted_lo = w.0;
            return;
        }
        for x in &mut self.waiters {
            if x.state == WState::Queued {
                x.state = WState::MaybeGranted;
            }
        }
    }

    /// While anything may end unseen (a lease past its earliest deadline
    /// but not surely gone, a grant nobody read), a slot may free at any
    /// moment: no waiter is sure to be still waiting.
    fn note_possible_frees(&mut self, t: u64) {
        self.orphans.retain(|&until| t <= until);
        let slots = self.clients.iter().flat_map(|c| &c.slots).any(|s| t + EPS >= s.deadline().0);
        let grants = self.waiters.iter().any(|x| x.state != WState::Queued && t + EPS >= x.granted_lo + TERM_MS);
        if slots || grants || !self.orphans.is_empty() {
            self.on_free(false, (t, t));
        }
    }

    /// Forgets the slots that surely ended by `t`.
    fn drop_dead(&mut self, t: u64) {
        for c in 0..CLIENTS {
            let dead: Vec<String> = self.clients[c]
                .slots
                .iter()
                .filter(|s| s.limbo == 0 && s.dead_for_sure((t, t)))
                .map(|s| s.id.clone())
                .collect();
            for id in dead {
                self.end_slot(c, &id);
            }
        }
    }

    /// The slot is gone: its id is stale, its key free.
    fn end_slot(&mut self, c: usize, id: &str) -> Option<Slot> {
        let at = self.clients[c].slots.iter().position(|s| s.id == id)?;
        let slot = self.clients[c].slots.remove(at);
        if let Some(k) = &slot.key {
            if matches!(self.keys.get(k), Some(KeyHolder::Slot(_, held)) if held == id) {
                self.keys.remove(k);
            }
        }
        self.clients[c].stale.push(slot.id.clone());
        Some(slot)
    }

    fn slot(&self, c: usize, id: &str) -> Option<&Slot> {
        self.clients[c].slots.iter().find(|s| s.id == id)
    }

    fn slot_mut(&mut self, c: usize, id: &str) -> Option<&mut Slot> {
        self.clients[c].slots.iter_mut().find(|s| s.id == id)
    }

    fn has_waiter(&self, c: usize) -> bool {
        self.clients[c].pending.iter().any(|p| matches!(p.expect, Expect::Waiter(_)))
    }

    // -------------------------------------------------------------- the scrape

    fn scrape(&mut self) -> Result<Metrics, String> {
        for attempt in 0..2 {
            if self.admin.is_none() {
                self.conns_opened += 1;
                self.admin = Some(Conn::open(self.admin_addr, self.conns_opened));
            }
            let admin = self.admin.as_mut().unwrap();
            admin.send(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(), Vec::new(), false);
            match admin.read(HANG, false, false)? {
                Got::Answer(resp) => {
                    if resp.status != 200 {
                        return Err(format!("/metrics answered {}", resp.summary()));
                    }
                    if resp.says_close() {
                        self.admin = None;
                    }
                    let text = String::from_utf8(resp.body).map_err(|_| "metrics not UTF-8")?;
                    return Ok(text
                        .lines()
                        .filter(|l| !l.starts_with('#'))
                        .filter_map(|l| l.rsplit_once(' '))
                        .filter_map(|(name, v)| Some((name.to_string(), v.parse::<u64>().ok()?)))
                        .collect());
                }
                Got::Eof if attempt == 0 => self.admin = None,
                Got::Eof => return Err("the admin listener closed the scrape".into()),
                Got::Timeout => return Err("/metrics did not answer (the server hangs?)".into()),
            }
        }
        unreachable!()
    }

    /// Scrapes and checks the gauges against the model.
    fn check_metrics(&mut self, why: &str) -> Result<Metrics, String> {
        let s = self.now();
        let m = self.scrape()?;
        let r = self.now();
        let w = (s.saturating_sub(EPS), r + EPS);
        self.note_possible_frees(r);
        let held = metric(&m, "nthpool_slots_held{pool=\"p\"}")?;
        let queued = metric(&m, "nthpool_waiters{pool=\"p\"}")?;
        let (lo, hi) = self.held_bounds(w);
        let (wlo, whi) = self.waiter_bounds(w);
        self.note(format!("  metrics ({why}): held {held} in [{lo},{hi}], queued {queued} in [{wlo},{whi}]"));
        if held > CONCURRENCY {
            return Err(format!("{held} slots held, over the concurrency of {CONCURRENCY}"));
        }
        if queued > QUEUE_SIZE {
            return Err(format!("{queued} waiters, over the queue size of {QUEUE_SIZE}"));
        }
        if queued > 0 && held < CONCURRENCY {
            return Err(format!("{queued} acquires wait while only {held} of {CONCURRENCY} slots are held"));
        }
        if held < lo || held > hi {
            return Err(format!("held {held} outside the model's [{lo}, {hi}]\n{}", self.dump()));
        }
        if queued < wlo || queued > whi {
            return Err(format!("queued {queued} outside the model's [{wlo}, {whi}]\n{}", self.dump()));
        }
        if metric(&m, "nthpool_slots_held{pool=\"other\"}")? != 0 {
            return Err("pool `other` holds slots nobody acquired".into());
        }
        Ok(m)
    }

    /// The model's state, for a failure message.
    fn dump(&self) -> String {
        let now = self.now();
        let mut out = format!("model at {}:\n", now - ORIGIN);
        for (c, client) in self.clients.iter().enumerate() {
            for s in &client.slots {
                let dl = s.deadline();
                out.push_str(&format!(
                    "  client {c} slot ..{} deadline [{}, {}] limbo {} lost {} capped {:?}\n",
                    short(&s.id),
                    dl.0 as i64 - ORIGIN as i64,
                    dl.1 as i64 - ORIGIN as i64,
                    s.limbo,
                    s.lost,
                    s.capped()
                ));
            }
        }
        for x in &self.waiters {
            out.push_str(&format!(
                "  waiter {} of client {} sent {} wait {} confirmed {:?} {:?}\n",
                x.id,
                x.client,
                x.sent - ORIGIN,
                x.wait,
                x.confirmed.map(|c| c - ORIGIN),
                x.state
            ));
        }
        out.push_str(&format!(
            "  orphans until {:?}, leaving {}\n",
            self.orphans.iter().map(|o| o - ORIGIN).collect::<Vec<_>>(),
            self.leaving
        ));
        out
    }

    /// After a new waiter: wait until the server shows every waiter queued
    /// (possible only while the model is sure of all of them).
    fn confirm_waiters(&mut self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(2);
        let waiting = |x: &&Waiter| x.state != WState::Granted;
        while self.waiters.iter().filter(waiting).any(|x| x.confirmed.is_none()) {
            let t = self.now();
            let all_sure = self.leaving == 0
                && self.waiters.iter().filter(waiting).all(|x| x.state == WState::Queued && !x.maybe_timed_out(t + 50));
            if !all_sure || Instant::now() > until {
                return Ok(());
            }
            let m = self.check_metrics("confirming the queue")?;
            let r = self.now();
            if metric(&m, "nthpool_waiters{pool=\"p\"}")? == self.waiters.iter().filter(waiting).count() as u64 {
                for x in self.waiters.iter_mut().filter(|x| x.state != WState::Granted) {
                    x.confirmed.get_or_insert(r);
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// After dropping a waiter's connection: wait until the server let it go.
    fn settle_leaving(&mut self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(2);
        while self.leaving > 0 {
            let m = self.check_metrics("waiting for a dropped waiter to leave")?;
            let w = (self.now(), self.now());
            let (_, whi) = self.waiter_bounds(w);
            if metric(&m, "nthpool_waiters{pool=\"p\"}")? <= whi - self.leaving {
                self.leaving = 0;
                return Ok(());
            }
            if Instant::now() > until {
                return Err(format!("a dropped waiter still counts after 2 s\n{}", self.dump()));
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        Ok(())
    }

    // -------------------------------------------------------------- requests

    /// A request in the client's current header style; `body` framed by
    /// length or chunked. Returns the bytes and the flags its answer follows.
    fn request(&mut self, c: usize, method: &str, path: &str, key: Option<&str>, extra: &str, body: &[u8]) -> Req {
        if self.rng.chance(15) {
            self.clients[c].style = self.rng.next();
        }
        let st = self.clients[c].style;
        let bit = |n: u32| st >> n & 1 == 1;
        let lower = bit(4);
        let name = |n: &str| if lower { n.to_ascii_lowercase() } else { n.to_string() };
        let http10 = bit(8) && bit(9) && bit(10);
        let close = !self.no_close && self.rng.chance(3);
        let http10_plain = !self.no_close && !http10 && self.rng.chance(2);
        let version = if http10 || http10_plain { "HTTP/1.0" } else { "HTTP/1.1" };
        let target = if bit(6) && bit(7) { format!("http://localhost{path}") } else { path.to_string() };
        let mut head = format!("{method} {target} {version}\r\n");
        let host = format!("{}: localhost\r\n", name("Host"));
        let key_line = key.map(|k| format!("{}: {k}\r\n", name("X-Nthpool-Key"))).unwrap_or_default();
        if bit(0) {
            head.push_str(&key_line);
            head.push_str(&host);
        } else {
            head.push_str(&host);
            head.push_str(&key_line);
        }
        if bit(2) {
            head.push_str(&format!("{}: {}\r\n", name("X-Trace"), self.rng.below(1_000_000)));
        }
        if close {
            head.push_str(&format!("{}: close\r\n", name("Connection")));
        } else if (bit(3) && !http10_plain) || http10 {
            head.push_str(&format!("{}: keep-alive\r\n", name("Connection")));
        }
        head.push_str(extra);
        let chunked = bit(5) && !body.is_empty() && version == "HTTP/1.1";
        let expect_continue = bit(11) && !body.is_empty() && version == "HTTP/1.1";
        if chunked {
            head.push_str(&format!("{}: chunked\r\n", name("Transfer-Encoding")));
        } else if !body.is_empty() || bit(1) {
            head.push_str(&format!("{}: {}\r\n", name("Content-Length"), body.len()));
        }
        if expect_continue {
            head.push_str(&format!("{}: 100-continue\r\n", name("Expect")));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        if chunked {
            let mut rest = body;
            while !rest.is_empty() {
                let n = (1 + self.rng.below(rest.len() as u64)) as usize;
                let ext = if self.rng.chance(20) { ";x=y" } else { "" };
                bytes.extend_from_slice(format!("{n:x}{ext}\r\n").as_bytes());
                bytes.extend_from_slice(&rest[..n]);
                bytes.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            bytes.extend_from_slice(b"0\r\n\r\n");
        } else {
            bytes.extend_from_slice(body);
        }
        let closes = close || http10_plain;
        let pending = Pending {
            expect: Expect::Gone404,
            sent: 0,
            desc: format!(
                "{method} {path}{}",
                if body.is_empty() { String::new() } else { format!(" {}", String::from_utf8_lossy(body)) }
            ),
            closes,
            head_method: method == "HEAD",
            expect_continue,
            http10_keep_alive: http10 && !close,
        };
        Req { bytes, pending }
    }

    fn with(mut req: Req, expect: Expect) -> Req {
        req.pending.expect = expect;
        req
    }

    /// An acquire: fail fast (`wait` 0) or waiting up to `wait` ms, said
    /// in the body or the header, under `key` if any.
    fn acquire_req(&mut self, c: usize, wait: u64, key: Option<String>) -> Req {
        let mut extra = String::new();
        if let Some(k) = &key {
            extra.push_str(&format!("Idempotency-Key: {k}\r\n"));
        }
        let body: String;
        let mut effective = wait.min(QUEUE_TIMEOUT_MS);
        if wait == 0 {
            body = match self.rng.below(6) {
                0 => "{}".into(),
                1 => r#"{"waitMs":0}"#.into(),
                2 => {
                    extra.push_str("X-Nthpool-Queue-Timeout-Ms: 0\r\n");
                    String::new()
                }
                3 => {
                    extra.push_str("X-Nthpool-No-Queue: 1\r\n");
                    format!(r#"{{"waitMs":{}}}"#, 100 + self.rng.below(300))
                }
                _ => String::new(),
            };
        } else {
            body = match self.rng.below(3) {
                0 => {
                    extra.push_str(&format!("X-Nthpool-Queue-Timeout-Ms: {wait}\r\n"));
                    String::new()
                }
                1 => {
                    extra.push_str(&format!("X-Nthpool-Queue-Timeout-Ms: {}\r\n", self.rng.below(5000)));
                    format!(r#"{{"waitMs":{wait}}}"#)
                }
                _ => format!(r#"{{"waitMs":{wait}}}"#),
            };
            if self.rng.chance(5) {
                extra.push_str("X-Nthpool-No-Queue: yes\r\n");
                effective = 0;
            }
        }
        let req = self.request(c, "POST", "/pools/p/lock/acquire", Some(KEY), &extra, body.as_bytes());
        Self::with(req, Expect::Acquire { wait: effective, key })
    }

    fn renew_req(&mut self, c: usize, id: &str, limbo: bool) -> Req {
        let body = self.rng.pick(&["", "", "", "{}", " "]);
        let req = self.request(c, "POST", &format!("/pools/p/lock/{id}/renew"), Some(KEY), "", body.as_bytes());
        Self::with(req, Expect::Renew { id: id.to_string(), limbo })
    }

    fn release_req(&mut self, c: usize, id: &str, limbo: bool) -> Req {
        let body = self.rng.pick(&[
            "",
            "",
            r#"{"status":200}"#,
            r#"{"status":429,"throttled":1,"retryAfterMs":1500}"#,
            r#"{"status":200,"headers":{"x-ratelimit-remaining-requests":"10","x-ratelimit-reset-requests":"6m0s"}}"#,
            r#"{"status":503,"rate":{"limit":100,"remaining":0,"resetMs":2000}}"#,
            r#"{"status":200,"headers":{"retry-after":"soon"}}"#,
            r#"{"status":200.0,"throttled":0}"#,
            " ",
        ]);
        let req = self.request(c, "POST", &format!("/pools/p/lock/{id}/release"), Some(KEY), "", body.as_bytes());
        Self::with(req, Expect::Release { id: id.to_string(), limbo })
    }

    /// A slot id the pool does not hold: stale, garbage, forged, or flipped.
    fn wrong_id(&mut self, c: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let client = &self.clients[c];
        match self.rng.below(4) {
            0 if !client.stale.is_empty() => client.stale[self.rng.below(client.stale.len() as u64) as usize].clone(),
            1 if !client.slots.is_empty() => {
                let mut id = client.slots[self.rng.below(client.slots.len() as u64) as usize].id.clone().into_bytes();
                let at = self.rng.below(id.len() as u64) as usize;
                let was = id[at];
                while id[at] == was {
                    id[at] = ALPHABET[self.rng.below(64) as usize];
                }
                String::from_utf8(id).unwrap()
            }
            2 => (0..56).map(|_| ALPHABET[self.rng.below(64) as usize] as char).collect(),
            _ => (0..1 + self.rng.below(70)).map(|_| ALPHABET[self.rng.below(64) as usize] as char).collect(),
        }
    }

    fn gone_req(&mut self, c: usize) -> Req {
        let id = self.wrong_id(c);
        // A slot of pool `p` named under pool `other` is not that pool's either.
        let (pool, key) = match self.clients[c].slots.first() {
            Some(s) if self.rng.chance(25) => ("other", s.id.clone()),
            _ => ("p", id),
        };
        let pool_key = if pool == "other" { OTHER_KEY } else { KEY };
        if self.rng.chance(50) {
            let req = self.request(c, "POST", &format!("/pools/{pool}/lock/{key}/renew"), Some(pool_key), "", b"");
            Self::with(req, Expect::Gone404)
        } else {
            let body = self.rng.pick(&["", r#"{"status":200}"#]);
            let req = self.request(
                c,
                "POST",
                &format!("/pools/{pool}/lock/{key}/release"),
                Some(pool_key),
                "",
                body.as_bytes(),
            );
            Self::with(req, Expect::GoneFalse)
        }
    }

    /// A request that is refused, and how.
    fn bad_req(&mut self, c: usize) -> Req {
        let own = self.clients[c].slots.first().map(|s| s.id.clone());
        let closes = |mut req: Req, status: u16, code: &'static str| {
            req.pending.closes = true;
            Self::with(req, Expect::Error { status, code })
        };
        let stays = |req: Req, status: u16, code: &'static str| Self::with(req, Expect::Error { status, code });
        match self.rng.below(16) {
            0 | 1 => {
                let usable: Vec<_> = framing::FRAMING.iter().filter(|(_, _, status)| *status != 501).collect();
                let (name, raw, status) = usable[self.rng.below(usable.len() as u64) as usize];
                let code = framing::code_of(*status);
                let pending = Pending {
                    expect: Expect::Error { status: *status, code },
                    sent: 0,
                    desc: format!("framing: {name}"),
                    closes: true,
                    head_method: false,
                    expect_continue: false,
                    http10_keep_alive: false,
                };
                Req { bytes: raw.to_vec(), pending }
            }
            2 => {
                let body = self.rng.pick(&[
                    r#"{"waitMs":-1}"#,
                    r#"{"waitMs":1.5}"#,
                    r#"{"waitMs":"10"}"#,
                    "[1]",
                    "{",
                    "null",
                    r#"{"waitMs":10}x"#,
                ]);
                let req = self.request(c, "POST", "/pools/p/lock/acquire", Some(KEY), "", body.as_bytes());
                closes(req, 400, "bad_request")
            }
            3 => {
                // A refused release releases nothing.
                let id = own.unwrap_or_else(|| "x".repeat(56));
                let body = self.rng.pick(&[
                    r#"{"status":99}"#,
                    r#"{"status":600}"#,
                    r#"{"status":"200"}"#,
                    "[]",
                    r#"{"throttled":-1}"#,
                    r#"{"retryAfterMs":1.5}"#,
                    r#"{"headers":[1]}"#,
                    r#"{"status":200"#,
                ]);
                let req =
                    self.request(c, "POST", &format!("/pools/p/lock/{id}/release"), Some(KEY), "", body.as_bytes());
                closes(req, 400, "bad_request")
            }
            4 => {
                let id = own.unwrap_or_else(|| "x".repeat(56));
                let body = self.rng.pick(&["[]", "\"x\"", "{", "1"]);
                let req = self.request(c, "POST", &format!("/pools/p/lock/{id}/renew"), Some(KEY), "", body.as_bytes());
                closes(req, 400, "bad_request")
            }
            5 => {
                let req = self.request(c, "POST", "/pools/p/lock/acquire", Some("wrong-key"), "", b"");
                stays(req, 401, "unauthorized")
            }
            6 => {
                let req = self.request(c, "POST", "/pools/nope/lock/acquire", Some(KEY), "", b"");
                stays(req, 401, "unauthorized")
            }
            7 => {
                let req = self.request(c, "POST", "/pools/p/lock/acquire", None, "", b"");
                stays(req, 401, "unauthorized")
            }
            8 => {
                let method = self.rng.pick(&["GET", "PUT", "DELETE", "HEAD"]);
                let req = self.request(c, method, "/pools/p/lock/acquire", Some(KEY), "", b"");
                stays(req, 405, "method_not_allowed")
            }
            9 => {
                let path = self.rng.pick(&["/pools/p/lock", "/pools/p/lock/x/y/renew", "/healthz", "/metrics", "/"]);
                let req = self.request(c, "POST", path, Some(KEY), "", b"");
                stays(req, 404, "not_found")
            }
            10 => {
                let bad_key = self.rng.pick(&["", "\u{1}x"]);
                let long = "k".repeat(129);
                let k = if self.rng.chance(50) { long.as_str() } else { bad_key };
                let req = self.request(
                    c,
                    "POST",
                    "/pools/p/lock/acquire",
                    Some(KEY),
                    &format!("Idempotency-Key: {k}\r\n"),
                    b"",
                );
                closes(req, 400, "bad_request")
            }
            11 => {
                let req = self.request(
                    c,
                    "POST",
                    "/pools/p/lock/acquire",
                    Some(KEY),
                    &format!("X-Nthpool-Key: {KEY}\r\n"),
                    b"",
                );
                closes(req, 400, "bad_request")
            }
            12 => {
                let v = self.rng.pick(&["abc", "-1", "1.5", ""]);
                let req = self.request(
                    c,
                    "POST",
                    "/pools/p/lock/acquire",
                    Some(KEY),
                    &format!("X-Nthpool-Queue-Timeout-Ms: {v}\r\n"),
                    b"",
                );
                closes(req, 400, "bad_request")
            }
            13 => {
                let body = vec![b' '; MAX_BODY + 1 + self.rng.below(2000) as usize];
                let mut req = self.request(c, "POST", "/pools/p/lock/acquire", Some(KEY), "", &body);
                // A chunked body over the limit is refused at its size line: same answer.
                req.pending.desc = format!("POST /pools/p/lock/acquire with a body of {} bytes", body.len());
                closes(req, 413, "payload_too_large")
            }
            14 => {
                let pad = "a".repeat(17 * 1024);
                let req =
                    self.request(c, "POST", "/pools/p/lock/acquire", Some(KEY), &format!("X-Pad: {pad}\r\n"), b"");
                let mut req = closes(req, 431, "request_header_fields_too_large");
                req.pending.desc = "a head over 16 KiB".into();
                req
            }
            _ => {
                let raw = format!(
                    "POST /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\nHost: other\r\n\r\n"
                );
                let pending = Pending {
                    expect: Expect::Error { status: 400, code: "bad_request" },
                    sent: 0,
                    desc: "two Hosts".into(),
                    closes: true,
                    head_method: false,
                    expect_continue: false,
                    http10_keep_alive: false,
                };
                Req { bytes: raw.into_bytes(), pending }
            }
        }
    }

    // -------------------------------------------------------------- sending and reading

    fn connect(&mut self, c: usize) {
        if self.clients[c].conn.is_none() {
            self.conns_opened += 1;
            let n = self.conns_opened;
            self.clients[c].conn = Some(Conn::open(self.server.addr, n));
            self.note(format!("c{c}: connect #{n}"));
        }
    }

    /// Puts `reqs` on client `c`'s connection (cut at random places when
    /// `split`, then the FIN when `fin`, then `tail`: the start of one more
    /// request), then reads every answer that is due.
    fn exchange(&mut self, c: usize, reqs: Vec<Req>, split: bool, fin: bool, tail: &[u8]) -> Result<(), String> {
        self.connect(c);
        if reqs.iter().any(|r| matches!(r.pending.expect, Expect::Acquire { wait, .. } if wait > 0)) {
            // The server may take this acquire before another connection's
            // that it has not yet seen queued: their order is unknown.
            for x in self.waiters.iter_mut().filter(|x| x.client != c && x.confirmed.is_none()) {
                x.may_deny_now = true;
                if x.state == WState::Queued {
                    x.state = WState::MaybeGranted;
                }
            }
        }
        let mut bytes = Vec::new();
        let sent = self.now();
        for r in reqs {
            bytes.extend_from_slice(&r.bytes);
            let mut p = r.pending;
            p.sent = sent;
            self.note(format!("c{c}: > {} ({:?})", p.desc, p.expect));
            if std::env::var("NTHPOOL_WIRE_RAW").is_ok() {
                self.note(format!("RAW {:?}", String::from_utf8_lossy(&r.bytes)));
            }
            if let Expect::Renew { id, limbo: true } | Expect::Release { id, limbo: true } = &p.expect {
                let release = matches!(p.expect, Expect::Release { .. });
                let id = id.clone();
                if let Some(s) = self.slot_mut(c, &id) {
                    s.limbo += 1;
                }
                if release {
                    self.on_free(false, (sent, sent));
                }
            }
            self.clients[c].pending.push_back(p);
        }
        bytes.extend_from_slice(tail);
        let expects_continue = String::from_utf8_lossy(tail).to_ascii_lowercase().contains("100-continue");
        self.clients[c].conn.as_mut().unwrap().tail_expects_continue = expects_continue;
        let mut cuts = Vec::new();
        if split && bytes.len() > 1 {
            for _ in 0..1 + self.rng.below(4) {
                cuts.push(1 + self.rng.below(bytes.len() as u64 - 1) as usize);
            }
            cuts.sort_unstable();
        }
        if fin || !tail.is_empty() {
            self.note(format!("c{c}: {} bytes, cut at {cuts:?}, fin {fin}, partial tail {}", bytes.len(), tail.len()));
        }
        self.clients[c].conn.as_mut().unwrap().send(bytes, cuts, fin);
        self.read_answers(c)
    }

    /// Reads client `c`'s answers in order, until one that must wait (a
    /// queued acquire) or none is left; a half-closed connection then ends.
    fn read_answers(&mut self, c: usize) -> Result<(), String> {
        let half_closed = self.clients[c].conn.as_ref().is_some_and(|k| k.half_closed);
        while let Some(p) = self.clients[c].pending.front().cloned() {
            let mut patience = HANG;
            match &p.expect {
                Expect::Waiter(_) if !half_closed => return Ok(()),
                Expect::Acquire { wait, key } if *wait > 0 && !half_closed => {
                    let w = (p.sent.saturating_sub(EPS), self.now() + EPS);
                    self.note_possible_frees(w.1);
                    let (hlo, hhi) = self.held_bounds(w);
                    let (wlo, whi) = self.waiter_bounds(w);
                    let replay = key.as_ref().and_then(|k| match self.keys.get(k) {
                        Some(KeyHolder::Slot(owner, id)) => self.slot(*owner, id).map(|s| s.alive_for_sure(w)),
                        _ => None,
                    });
                    let free = hhi < CONCURRENCY && whi == 0;
                    let full = hlo >= CONCURRENCY || wlo > 0;
                    if replay == Some(true) || free || (full && wlo >= QUEUE_SIZE) {
                        // Answered at once.
                    } else if full && whi < QUEUE_SIZE && replay.is_none() {
                        self.make_waiter(c, &p, true, false);
                        return self.confirm_waiters();
                    } else {
                        patience = Duration::from_millis(60);
                    }
                }
                _ => {}
            }
            let conn = self.clients[c].conn.as_mut().ok_or("no connection to read from")?;
            let n = conn.n;
            match conn.read(patience, p.head_method, p.expect_continue)? {
                Got::Answer(resp) => self.resolve(c, resp)?,
                Got::Timeout if patience < HANG => {
                    let may_deny = self.waiter_bounds((p.sent, self.now())).1 >= QUEUE_SIZE;
                    self.make_waiter(c, &p, false, may_deny);
                    return Ok(());
                }
                Got::Timeout => return Err(format!("c{c}: no answer to {} within {HANG:?} (conn #{n})", p.desc)),
                Got::Eof => return Err(format!("c{c}: the server closed conn #{n} before answering {}", p.desc)),
            }
            if self.clients[c].conn.is_none() {
                return Ok(());
            }
        }
        if half_closed {
            self.expect_end(c, "after answering a half-closed connection")?;
        }
        Ok(())
    }

    /// The server must close client `c`'s connection now, with nothing more to say.
    fn expect_end(&mut self, c: usize, why: &str) -> Result<(), String> {
        let mut conn = self.clients[c].conn.take().ok_or("no connection")?;
        conn.join_writer();
        // An unfinished request's head may have been answered `100 Continue`.
        let interim = conn.tail_expects_continue;
        match conn.read(HANG, false, interim)? {
            Got::Eof => Ok(()),
            Got::Answer(resp) => Err(format!("c{c}: an answer {why} should have been the last: {}", resp.summary())),
            Got::Timeout => Err(format!("c{c}: conn #{} still open {why}", conn.n)),
        }
    }

    fn make_waiter(&mut self, c: usize, p: &Pending, certain: bool, may_deny_now: bool) {
        let Expect::Acquire { wait, key } = &p.expect else { unreachable!("only acquires wait") };
        self.next_id += 1;
        let id = self.next_id;
        let x = Waiter {
            id,
            client: c,
            key: key.clone(),
            sent: p.sent,
            wait: *wait,
            confirmed: None,
            state: if certain { WState::Queued } else { WState::MaybeGranted },
            granted_lo: p.sent.saturating_sub(EPS),
            may_deny_now,
        };
        self.note(format!("c{c}:   waits (waiter {id}, {})", if certain { "surely queued" } else { "maybe queued" }));
        if let Some(k) = key {
            self.keys.insert(k.clone(), KeyHolder::Waiter);
        }
        self.waiters.push(x);
        self.clients[c].pending.front_mut().unwrap().expect = Expect::Waiter(id);
    }

    /// Checks the answer at the front of client `c`'s pending requests and
    /// moves the model on.
    fn resolve(&mut self, c: usize, resp: Resp) -> Result<(), String> {
        let p = self.clients[c].pending.pop_front().expect("a pending request");
        let r = self.now();
        let w = (p.sent.saturating_sub(EPS), r + EPS);
        self.note(format!("c{c}: < {} (for {})", resp.summary(), p.desc));
        self.note_possible_frees(w.1);
        self.drop_dead(w.0);
        check_common(&resp, p.head_method).map_err(|e| format!("c{c}: answer to {}: {e}", p.desc))?;
        if resp.says_close() != p.closes {
            return Err(format!(
                "c{c}: the answer to {} {} `Connection: close`: {}",
                p.desc,
                if p.closes { "lacks" } else { "has" },
                resp.summary()
            ));
        }
        if p.http10_keep_alive
            && !p.closes
            && !resp.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("keep-alive"))
        {
            return Err(format!(
                "c{c}: an HTTP/1.0 keep-alive answer without `Connection: keep-alive`: {}",
                resp.summary()
            ));
        }
        let half_closed = self.clients[c].conn.as_ref().is_some_and(|k| k.half_closed);
        let checked = match &p.expect {
            Expect::Acquire { wait, key } => self.resolve_acquire(c, *wait, key.clone(), &resp, w, half_closed),
            Expect::Waiter(id) => self.resolve_waiter(c, *id, &resp, w, half_closed),
            Expect::Renew { id, limbo } => self.resolve_renew(c, id, *limbo, &resp, w),
            Expect::Release { id, limbo } => self.resolve_release(c, id, *limbo, &resp, w),
            Expect::Gone404 => expect_error(&resp, 404, "not_found"),
            Expect::GoneFalse => expect_released(&resp, false),
            Expect::QAcquire => self.resolve_q_acquire(&resp),
            Expect::QRelease(id) => {
                let held = self.q_slot.as_deref() == Some(id.as_str());
                if held {
                    self.q_slot = None;
                }
                expect_released(&resp, held)
            }
            Expect::Error { status, code } => {
                if p.head_method {
                    (resp.status == *status).then_some(()).ok_or_else(|| format!("expected {status}"))
                } else {
                    expect_error(&resp, *status, code)
                }
            }
        };
        checked.map_err(|e| format!("c{c}: answer to {}: {e}", p.desc))?;
        if p.closes {
            self.drop_behind_close(c)?;
        }
        Ok(())
    }

    /// Client `c`'s answer said `Connection: close`: nothing it sent after
    /// that request is read (those requests never happened), and the
    /// connection ends.
    fn drop_behind_close(&mut self, c: usize) -> Result<(), String> {
        for dropped in std::mem::take(&mut self.clients[c].pending) {
            if let Expect::Renew { id, limbo: true } | Expect::Release { id, limbo: true } = &dropped.expect {
                self.out_of_limbo(c, id);
            }
            self.note(format!("c{c}:   dropped behind the close: {}", dropped.desc));
        }
        self.expect_end(c, "after `Connection: close`")
    }

    fn resolve_acquire(
        &mut self,
        c: usize,
        wait: u64,
        key: Option<String>,
        resp: &Resp,
        w: Win,
        half_closed: bool,
    ) -> Result<(), String> {
        if let Some(k) = &key {
            if let Some(KeyHolder::Slot(owner, id)) = self.keys.get(k).cloned() {
                if let Some(slot) = self.slot(owner, &id).cloned() {
                    let same = resp.status == 200 && resp.json()?["slotId"].as_str() == Some(id.as_str());
                    if same {
                        if slot.dead_for_sure(w) {
                            return Err(format!("the key replayed ..{} past its deadline", short(&id)));
                        }
                        let g = check_grant(resp)?;
                        if g.queued_ms != 0 || g.req_unix != slot.req_unix {
                            return Err(format!("a replay differs from the grant: {}", resp.summary()));
                        }
                        if !slot.uncertain() && g.lease_unix != slot.lease_unix {
                            return Err(format!(
                                "a replay says leaseDeadline {} where the lease stands at {}",
                                g.lease_unix, slot.lease_unix
                            ));
                        }
                        return Ok(());
                    }
                    if slot.alive_for_sure(w) {
                        return Err(format!(
                            "a retry with the key of the live ..{} got {}",
                            short(&id),
                            resp.summary()
                        ));
                    }
                    // It ended before the retry, and its key with it.
                    self.end_slot(owner, &id);
                    self.on_free(false, w);
                }
                self.keys.remove(k);
            }
        }
        let (hlo, hhi) = self.held_bounds(w);
        let (wlo, whi) = self.waiter_bounds(w);
        let free = hhi < CONCURRENCY && whi == 0;
        let full = hlo >= CONCURRENCY || wlo > 0;
        let bounds = format!("held [{hlo},{hhi}] queued [{wlo},{whi}]");
        match resp.status {
            200 => {
                if full {
                    return Err(format!("granted while the pool is full ({bounds})\n{}", self.dump()));
                }
                let g = check_grant(resp)?;
                if g.queued_ms > 0 && wait == 0 {
                    return Err("a fail-fast acquire was queued".into());
                }
                if g.queued_ms == 0 && g.depth != 0 {
                    return Err(format!("granted at once past {} waiters", g.depth));
                }
                if g.remaining + hlo + 1 > CONCURRENCY {
                    return Err(format!("remaining slots {} with {bounds}", g.remaining));
                }
                self.add_slot(c, &g, key, (w.0 + g.queued_ms.saturating_sub(2), w.1))?;
            }
            429 => {
                let reason = resp.header("x-nthpool-deny-reason").unwrap_or_default();
                expect_error(resp, 429, "too_many_requests")?;
                if resp.header_u64("retry-after")? < 1 {
                    return Err("Retry-After below 1".into());
                }
                check_signals(resp)?;
                match reason {
                    "concurrency" if wait == 0 => {
                        if free {
                            return Err(format!("refused while the pool has room ({bounds})\n{}", self.dump()));
                        }
                        if resp.header_u64("x-nthpool-remaining-slots")? != 0 {
                            return Err("refused for concurrency with slots remaining".into());
                        }
                    }
                    "queue_full" if wait > 0 => {
                        if whi < QUEUE_SIZE || free {
                            return Err(format!("queue_full with room in the queue ({bounds})\n{}", self.dump()));
                        }
                        if resp.header_u64("x-nthpool-queue-depth")? != QUEUE_SIZE {
                            return Err("queue_full with a queue depth under its size".into());
                        }
                    }
                    _ => return Err(format!("unexpected denial for a wait of {wait} ms")),
                }
            }
            504 => {
                expect_error(resp, 504, "queue_timeout")?;
                if wait == 0 || free {
                    return Err(format!("504 for an acquire that could not wait ({bounds})"));
                }
                check_signals(resp)?;
                if resp.message().contains("half-closed") {
                    if !half_closed {
                        return Err("withdrawn for a half-close that did not happen".into());
                    }
                } else if w.1 < w.0 + wait {
                    return Err(format!("timed out before its wait of {wait} ms"));
                }
            }
            _ => return Err("unexpected status".into()),
        }
        Ok(())
    }

    fn resolve_q_acquire(&mut self, resp: &Resp) -> Result<(), String> {
        match (&self.q_slot, resp.status) {
            (None, 200) => {
                let id = resp.json()?["slotId"].as_str().ok_or("no slotId")?.to_string();
                if !self.seen_ids.insert(id.clone()) {
                    return Err(format!("slot id ..{} granted twice", short(&id)));
                }
                if resp.header_u64("x-nthpool-limit")? != 1 {
                    return Err("pool q's grant shows another pool's limit".into());
                }
                self.q_slot = Some(id);
                Ok(())
            }
            (Some(_), 429) => {
                expect_error(resp, 429, "too_many_requests")?;
                if resp.header_u64("x-nthpool-limit")? != 1 {
                    return Err("pool q's denial shows another pool's limit".into());
                }
                Ok(())
            }
            (held, _) => Err(format!("pool q holds {held:?}")),
        }
    }

    /// A fail-fast acquire on pool `q`, or a release of what it holds
    /// (sometimes named under pool `p`, which must not release it).
    fn q_req(&mut self, c: usize) -> Req {
        match self.q_slot.clone() {
            Some(id) if self.rng.chance(70) => {
                if self.rng.chance(20) {
                    let req = self.request(c, "POST", &format!("/pools/p/lock/{id}/release"), Some(KEY), "", b"");
                    return Self::with(req, Expect::GoneFalse);
                }
                let req = self.request(c, "POST", &format!("/pools/q/lock/{id}/release"), Some(KEY), "", b"");
                Self::with(req, Expect::QRelease(id))
            }
            _ => {
                let req = self.request(c, "POST", "/pools/q/lock/acquire", Some(KEY), "", b"");
                Self::with(req, Expect::QAcquire)
            }
        }
    }

    fn add_slot(&mut self, c: usize, g: &Grant, key: Option<String>, granted: Win) -> Result<(), String> {
        if !self.seen_ids.insert(g.id.clone()) {
            return Err(format!("slot id ..{} granted twice", short(&g.id)));
        }
        self.p_grants += 1;
        if let Some(k) = &key {
            self.keys.insert(k.clone(), KeyHolder::Slot(c, g.id.clone()));
        }
        self.clients[c].slots.push(Slot {
            id: g.id.clone(),
            key,
            granted,
            renewed: None,
            lease_unix: g.lease_unix,
            req_unix: g.req_unix,
            at_cap: false,
            limbo: 0,
            lost: false,
        });
        Ok(())
    }

    fn resolve_waiter(&mut self, c: usize, id: u32, resp: &Resp, w: Win, half_closed: bool) -> Result<(), String> {
        let at = self.waiters.iter().position(|x| x.id == id).ok_or("an unknown waiter")?;
        let x = self.waiters.remove(at);
        if let Some(k) = &x.key {
            self.keys.remove(k);
        }
        let what = format!("waiter {id} ({:?}, sent {}, wait {})", x.state, x.sent - ORIGIN, x.wait);
        match resp.status {
            200 => {
                if x.state == WState::Queued {
                    return Err(format!("{what} granted though no slot could have freed\n{}", self.dump()));
                }
                let g = check_grant(resp)?;
                if g.queued_ms > x.wait + 1 {
                    return Err(format!("{what} granted after {} ms in the queue", g.queued_ms));
                }
                let lo = (x.sent.saturating_sub(EPS) + g.queued_ms.saturating_sub(2))
                    .max(if x.state == WState::Granted { x.granted_lo } else { 0 });
                self.add_slot(c, &g, x.key.clone(), (lo, w.1))?;
            }
            504 => {
                expect_error(resp, 504, "queue_timeout")?;
                check_signals(resp)?;
                if x.state == WState::Granted {
                    return Err(format!("{what} answered 504 though a release granted it\n{}", self.dump()));
                }
                if x.state == WState::MaybeGranted {
                    // A grant taken back at a half-close frees its slot again.
                    self.on_free(false, w);
                }
                if resp.message().contains("half-closed") {
                    if !half_closed {
                        return Err(format!("{what} withdrawn for a half-close that did not happen"));
                    }
                } else {
                    if !x.maybe_timed_out(w.1) {
                        return Err(format!("{what} timed out early\n{}", self.dump()));
                    }
                    let queued = resp.header_u64("x-nthpool-queued-ms")?;
                    if queued + 1 < x.wait {
                        return Err(format!("{what} timed out after only {queued} ms"));
                    }
                }
            }
            429 => {
                if !x.may_deny_now {
                    return Err(format!("{what} refused though the queue had room"));
                }
                expect_error(resp, 429, "too_many_requests")?;
            }
            _ => return Err(format!("unexpected answer for {what}")),
        }
        Ok(())
    }

    /// A renew or release of client `c`'s slot `id` that might have ended it
    /// was answered (or will never be read).
    fn out_of_limbo(&mut self, c: usize, id: &str) {
        if let Some(s) = self.slot_mut(c, id) {
            s.limbo -= 1;
        }
    }

    fn resolve_renew(&mut self, c: usize, id: &str, limbo: bool, resp: &Resp, w: Win) -> Result<(), String> {
        if limbo {
            self.out_of_limbo(c, id);
        }
        let Some(s) = self.slot(c, id).cloned() else {
            return expect_error(resp, 404, "not_found");
        };
        let alive = s.alive_for_sure(w);
        let dead = s.dead_for_sure(w);
        match resp.status {
            200 => {
                if dead {
                    return Err(format!("renewed ..{} past its deadline\n{}", short(id), self.dump()));
                }
                if s.capped() == Tri::Yes {
                    return Err(format!("renewed ..{} though it stands at its request deadline", short(id)));
                }
                let lease = resp.json()?["leaseDeadline"].as_u64().ok_or("no leaseDeadline")?;
                if lease > s.req_unix {
                    return Err(format!("a renew past the request deadline: {lease} > {}", s.req_unix));
                }
                if !s.uncertain() && lease < s.lease_unix {
                    return Err(format!("a renew moved the lease back: {lease} < {}", s.lease_unix));
                }
                let s = self.slot_mut(c, id).unwrap();
                s.renewed = Some(w);
                s.lease_unix = lease;
                s.at_cap = lease == s.req_unix;
                s.lost = false;
            }
            409 => {
                expect_error(resp, 409, "capped")?;
                if dead {
                    return Err(format!("409 for ..{} past its deadline", short(id)));
                }
                if s.capped() == Tri::No {
                    return Err(format!("409 capped for ..{}, which was not at its request deadline", short(id)));
                }
                let s = self.slot_mut(c, id).unwrap();
                s.at_cap = true;
                s.lease_unix = s.req_unix;
                s.lost = false;
            }
            404 => {
                expect_error(resp, 404, "not_found")?;
                if alive {
                    return Err(format!("404 for ..{}, which is surely alive\n{}", short(id), self.dump()));
                }
                self.end_slot(c, id);
                self.on_free(false, w);
            }
            _ => return Err("unexpected status".into()),
        }
        Ok(())
    }

    fn resolve_release(&mut self, c: usize, id: &str, limbo: bool, resp: &Resp, w: Win) -> Result<(), String> {
        if limbo {
            self.out_of_limbo(c, id);
        }
        let Some(s) = self.slot(c, id).cloned() else {
            return expect_released(resp, false);
        };
        let released = resp.json()?["released"].as_bool().ok_or("no `released`")?;
        expect_released(resp, released)?;
        if released && s.dead_for_sure(w) {
            return Err(format!("released ..{} past its deadline\n{}", short(id), self.dump()));
        }
        if !released && s.alive_for_sure(w) {
            return Err(format!("`released: false` for ..{}, which is surely alive\n{}", short(id), self.dump()));
        }
        self.end_slot(c, id);
        // A release behind a queued acquire was counted as a possible free when sent.
        if !limbo {
            self.on_free(released && !s.uncertain(), w);
        }
        Ok(())
    }

    // -------------------------------------------------------------- steps

    fn play(&mut self, steps: usize) -> Result<(), String> {
        self.note(format!("seed {}", self.seed));
        self.check_metrics("start")?;
        for step in 0..steps {
            self.note(format!("--- step {step}"));
            self.step()?;
            if self.rng.chance(30) {
                self.check_metrics("after the step")?;
            }
            if let Ok(Some(status)) = self.server.child.try_wait() {
                return Err(format!("the server exited: {status}"));
            }
        }
        self.finish()
    }

    fn own_slot(&mut self, c: usize) -> Option<String> {
        let slots = &self.clients[c].slots;
        (!slots.is_empty()).then(|| slots[self.rng.below(slots.len() as u64) as usize].id.clone())
    }

    fn new_key(&mut self, c: usize) -> Option<String> {
        self.rng.chance(30).then(|| format!("k{c}-{}-{}", self.seed, self.rng.next() % 1_000_000_000))
    }

    fn step(&mut self) -> Result<(), String> {
        let c = self.rng.below(CLIENTS as u64) as usize;
        if self.has_waiter(c) {
            return self.step_waiting(c);
        }
        let split = self.rng.chance(15);
        // Clients holding slots mostly renew and release them; against a
        // full pool, acquires mostly wait.
        let acquires = match self.clients[c].slots.len() {
            0 => 30,
            1 => 15,
            _ => 6,
        };
        let roll = if self.rng.below(100) < acquires {
            let now = self.now();
            let full = self.held_bounds((now, now)).0 >= CONCURRENCY;
            if self.rng.chance(if full { 75 } else { 40 }) {
                20
            } else {
                0
            }
        } else {
            30 + self.rng.below(70)
        };
        match roll {
            0..=13 => {
                let key = self.new_key(c);
                let req = self.acquire_req(c, 0, key);
                self.exchange(c, vec![req], split, false, b"")
            }
            14..=29 => {
                let key = if self.rng.chance(60) {
                    self.new_key(c).or(Some(format!("w{c}-{}", self.rng.next())))
                } else {
                    None
                };
                let wait = 50 + self.rng.below(400);
                let req = self.acquire_req(c, wait, key);
                self.exchange(c, vec![req], split, false, b"")
            }
            30..=41 => match self.own_slot(c) {
                Some(id) => {
                    let req = self.renew_req(c, &id, false);
                    self.exchange(c, vec![req], split, false, b"")
                }
                None => self.acquire_then(c),
            },
            42..=53 => match self.own_slot(c) {
                Some(id) => {
                    let req = self.release_req(c, &id, false);
                    self.exchange(c, vec![req], split, false, b"")
                }
                None => self.acquire_then(c),
            },
            54..=57 => match self.own_slot(c) {
                // Released twice, or renewed after release, in one write.
                Some(id) => {
                    let first = self.release_req(c, &id, false);
                    let second = if self.rng.chance(50) {
                        self.release_req(c, &id, false)
                    } else {
                        self.renew_req(c, &id, false)
                    };
                    self.exchange(c, vec![first, second], split, false, b"")
                }
                None => self.acquire_then(c),
            },
            58..=67 => {
                let reqs = self.batch(c, 2, 5);
                self.exchange(c, reqs, split, false, b"")
            }
            68..=71 => {
                let reqs = (0..1 + self.rng.below(3)).map(|_| self.gone_req(c)).collect();
                self.exchange(c, reqs, split, false, b"")
            }
            72..=77 => {
                let mut reqs = self.batch(c, 0, 3);
                reqs.retain(|r| !matches!(r.pending.expect, Expect::Acquire { wait, .. } if wait > 0));
                let at = self.rng.below(reqs.len() as u64 + 1) as usize;
                let bad = self.bad_req(c);
                reqs.insert(at, bad);
                if self.rng.chance(50) {
                    reqs.push(self.gone_req(c));
                }
                self.exchange(c, reqs, split, false, b"")
            }
            78..=81 => self.idempotent_retry(c),
            82..=85 => {
                let reqs = self.batch(c, 0, 4);
                let tail = self.partial(c);
                self.exchange(c, reqs, split, true, &tail)
            }
            86..=88 => self.drop_connection(c),
            89..=91 => {
                let ms = 10 + self.rng.below(TERM_MS / 2);
                self.note(format!("sleep {ms} ms"));
                std::thread::sleep(Duration::from_millis(ms));
                Ok(())
            }
            92..=95 => self.race_deadline(c),
            96 => self.long_pipeline(c),
            97 if !self.q_unknown => {
                let req = self.q_req(c);
                self.exchange(c, vec![req], split, false, b"")
            }
            98 => {
                // A reload that changes nothing the pools do.
                self.spin = !self.spin;
                self.reloads += 1;
                // Written aside and renamed into place, as an operator would:
                // the server may still be reading the file for the reload before.
                let aside = self.server.config_path.with_extension("json.new");
                std::fs::write(&aside, server_config(self.spin)).unwrap();
                std::fs::rename(&aside, &self.server.config_path).unwrap();
                self.server.signal("HUP");
                self.note("reload".into());
                Ok(())
            }
            _ => {
                // Another connection for this client: slot ids outlive connections.
                if let Some(mut conn) = self.clients[c].conn.take() {
                    conn.join_writer();
                    self.note(format!("c{c}: close #{} (all answered)", conn.n));
                }
                self.connect(c);
                Ok(())
            }
        }
    }

    /// A client with nothing to renew or release acquires instead.
    fn acquire_then(&mut self, c: usize) -> Result<(), String> {
        let key = self.new_key(c);
        let req = self.acquire_req(c, 0, key);
        self.exchange(c, vec![req], false, false, b"")
    }

    /// A mixed batch of `least` requests and up to `spread - 1` more, for
    /// one write; a waiting acquire only last.
    fn batch(&mut self, c: usize, least: u64, spread: u64) -> Vec<Req> {
        let n = (least + self.rng.below(spread)) as usize;
        let mut reqs = Vec::new();
        for i in 0..n {
            let roll = self.rng.below(100);
            let req = match (roll, self.own_slot(c)) {
                (0..=29, _) => {
                    let key = self.new_key(c);
                    let wait = if i + 1 == n && self.rng.chance(30) { 50 + self.rng.below(300) } else { 0 };
                    self.acquire_req(c, wait, key)
                }
                (30..=49, Some(id)) => self.renew_req(c, &id, false),
                (50..=74, Some(id)) => self.release_req(c, &id, false),
                (75..=84, _) => self.gone_req(c),
                (85..=89, _) if !self.q_unknown => self.q_req(c),
                _ => {
                    let key = self.new_key(c);
                    self.acquire_req(c, 0, key)
                }
            };
            reqs.push(req);
        }
        reqs
    }

    /// The first bytes of one more request, never completed.
    fn partial(&mut self, c: usize) -> Vec<u8> {
        if self.rng.chance(50) {
            return Vec::new();
        }
        let req = self.acquire_req(c, 0, None);
        let n = 1 + self.rng.below(req.bytes.len() as u64 - 1) as usize;
        req.bytes[..n].to_vec()
    }

    /// A retry of an acquire whose grant the client holds, with its key,
    /// maybe on a fresh connection (as after a lost answer).
    fn idempotent_retry(&mut self, c: usize) -> Result<(), String> {
        let keyed: Vec<(String, String)> =
            self.clients[c].slots.iter().filter_map(|s| Some((s.key.clone()?, s.id.clone()))).collect();
        if keyed.is_empty() {
            let key = Some(format!("k{c}-{}-{}", self.seed, self.rng.next() % 1_000_000_000));
            let req = self.acquire_req(c, 0, key);
            return self.exchange(c, vec![req], false, false, b"");
        }
        let (key, _) = keyed[self.rng.below(keyed.len() as u64) as usize].clone();
        if self.rng.chance(50) {
            self.clients[c].conn = None;
        }
        let wait = if self.rng.chance(50) { 0 } else { 50 + self.rng.below(300) };
        let req = self.acquire_req(c, wait, Some(key));
        self.exchange(c, vec![req], false, false, b"")
    }

    /// Closes the connection without reading, maybe after a batch and in
    /// the middle of one more request.
    fn drop_connection(&mut self, c: usize) -> Result<(), String> {
        self.connect(c);
        let reqs = if self.rng.chance(50) { self.batch(c, 1, 3) } else { Vec::new() };
        let reqs: Vec<Req> = reqs
            .into_iter()
            .filter(|r| !matches!(r.pending.expect, Expect::Acquire { wait, .. } if wait > 0))
            .collect();
        let tail = self.partial(c);
        let mut bytes = Vec::new();
        let sent = self.now();
        for r in reqs {
            bytes.extend_from_slice(&r.bytes);
            let mut p = r.pending;
            p.sent = sent;
            self.note(format!("c{c}: > {} (unread)", p.desc));
            self.clients[c].pending.push_back(p);
        }
        bytes.extend_from_slice(&tail);
        let conn = self.clients[c].conn.as_mut().unwrap();
        conn.send(bytes, Vec::new(), false);
        conn.join_writer();
        self.abandon(c)
    }

    /// Drops client `c`'s connection with whatever it has not read.
    fn abandon(&mut self, c: usize) -> Result<(), String> {
        let conn = self.clients[c].conn.take();
        self.note(format!("c{c}: drop #{}", conn.as_ref().map_or(0, |k| k.n)));
        drop(conn);
        let now = self.now();
        let mut leaving = false;
        for p in std::mem::take(&mut self.clients[c].pending) {
            match p.expect {
                Expect::Acquire { key, .. } => {
                    // Maybe granted and delivered: held until its term.
                    self.orphans.push(now + ORPHAN_MS);
                    if let Some(k) = key {
                        self.keys.remove(&k);
                    }
                    self.on_free(false, (now, now));
                }
                Expect::Waiter(id) => {
                    let at = self.waiters.iter().position(|x| x.id == id).expect("a known waiter");
                    let x = self.waiters.remove(at);
                    if let Some(k) = &x.key {
                        self.keys.remove(k);
                    }
                    if x.state == WState::Queued {
                        self.leaving += 1;
                        leaving = true;
                    } else {
                        self.orphans.push(now + ORPHAN_MS);
                        self.on_free(false, (now, now));
                    }
                }
                Expect::Renew { id, limbo } | Expect::Release { id, limbo } => {
                    if let Some(s) = self.slot_mut(c, &id) {
                        s.lost = true;
                        if limbo {
                            s.limbo -= 1;
                        }
                    }
                    self.on_free(false, (now, now));
                }
                Expect::QAcquire | Expect::QRelease(_) => {
                    self.q_unknown = true;
                    self.q_slot = None;
                }
                Expect::Gone404 | Expect::GoneFalse | Expect::Error { .. } => {}
            }
        }
        if leaving {
            self.settle_leaving()?;
        }
        Ok(())
    }

    /// Waits until about the deadline of one of the client's slots, then
    /// renews or releases it: the server may see it either side.
    fn race_deadline(&mut self, c: usize) -> Result<(), String> {
        let Some(id) = self.own_slot(c) else { return self.acquire_then(c) };
        let dl = self.slot(c, &id).unwrap().deadline();
        let target = dl.0 + self.rng.below(dl.1 - dl.0 + 40);
        let target = target.saturating_sub(20);
        let now = self.now();
        if target > now + 350 {
            return Ok(());
        }
        let ms = target.saturating_sub(now);
        self.note(format!("c{c}: sleep {ms} ms to the deadline of ..{}", short(&id)));
        std::thread::sleep(Duration::from_millis(ms));
        let req = if self.rng.chance(60) { self.renew_req(c, &id, false) } else { self.release_req(c, &id, false) };
        self.exchange(c, vec![req], false, false, b"")
    }

    /// Hundreds of small requests in one go, read as they come: the
    /// per-turn budget, the input and output limits, and the order.
    fn long_pipeline(&mut self, c: usize) -> Result<(), String> {
        let n = 100 + self.rng.below(1400) as usize;
        let mut reqs = Vec::with_capacity(n);
        let own = self.own_slot(c);
        self.no_close = true;
        for i in 0..n {
            let req = match self.rng.below(10) {
                0 if i < 5 => self.acquire_req(c, 0, None),
                1 | 2 if own.is_some() => self.renew_req(c, own.as_ref().unwrap(), false),
                _ => self.gone_req(c),
            };
            reqs.push(req);
        }
        self.no_close = false;
        self.note(format!("c{c}: a pipeline of {} requests", reqs.len()));
        self.exchange(c, reqs, true, false, b"")
    }

    /// Client `c` has an acquire waiting in the queue.
    fn step_waiting(&mut self, c: usize) -> Result<(), String> {
        match self.rng.below(100) {
            0..=39 => self.collect(c),
            40..=54 => {
                // Another client releases: the head waiter gets the slot.
                let holders: Vec<usize> =
                    (0..CLIENTS).filter(|&o| !self.has_waiter(o) && !self.clients[o].slots.is_empty()).collect();
                if holders.is_empty() {
                    return self.collect(c);
                }
                let o = holders[self.rng.below(holders.len() as u64) as usize];
                let id = self.own_slot(o).unwrap();
                let req = self.release_req(o, &id, false);
                self.exchange(o, vec![req], false, false, b"")
            }
            55..=64 => {
                // Requests pipelined behind the waiting acquire wait with it.
                let Some(id) = self.own_slot(c) else { return self.collect(c) };
                let req =
                    if self.rng.chance(50) { self.renew_req(c, &id, true) } else { self.release_req(c, &id, true) };
                self.exchange(c, vec![req], false, false, b"")
            }
            65..=74 => self.drop_connection(c),
            75..=84 => {
                // A half-close: the waiter is withdrawn, what follows answered.
                let reqs = self.batch(c, 0, 3);
                let tail = self.partial(c);
                self.exchange(c, reqs, false, true, &tail)
            }
            _ => self.supersede(c),
        }
    }

    /// Reads the answer of client `c`'s waiting acquire, and what follows it.
    fn collect(&mut self, c: usize) -> Result<(), String> {
        let Some(Expect::Waiter(id)) = self.clients[c].pending.front().map(|p| p.expect.clone()) else {
            return self.read_answers(c);
        };
        let x = self.waiters.iter().find(|x| x.id == id).expect("a known waiter").clone();
        let until = x.sent + x.wait + 3000;
        let patience = Duration::from_millis(until.saturating_sub(self.now()).max(100));
        let p = self.clients[c].pending.front().unwrap().clone();
        let conn = self.clients[c].conn.as_mut().ok_or("a waiter without a connection")?;
        match conn.read(patience, false, p.expect_continue)? {
            Got::Answer(resp) => self.resolve(c, resp)?,
            Got::Timeout => {
                return Err(format!("c{c}: waiter {id} not answered 3 s past its deadline\n{}", self.dump()))
            }
            Got::Eof => return Err(format!("c{c}: the server closed on waiter {id}")),
        }
        if self.clients[c].conn.is_some() {
            self.read_answers(c)?;
        }
        Ok(())
    }

    /// A retry with the key of client `c`'s waiting acquire, on a new
    /// connection: it takes the waiter's place, and the first is answered
    /// `409`. The retry waits too: one that fails fast takes no place (it is
    /// denied, the waiter stays; `tests/idempotency.rs`).
    fn supersede(&mut self, c: usize) -> Result<(), String> {
        let Some(Expect::Waiter(id)) = self.clients[c].pending.front().map(|p| p.expect.clone()) else {
            return self.collect(c);
        };
        let x = self.waiters.iter().find(|x| x.id == id).unwrap().clone();
        let now = self.now();
        let Some(key) = x.key.clone().filter(|_| x.certainly_queued((now, now + 100))) else {
            return self.collect(c);
        };
        let old = self.clients[c].conn.take().unwrap();
        let old_pending = std::mem::take(&mut self.clients[c].pending);
        let wait = 50 + self.rng.below(300);
        // This step is about a retry that waits: one that fails fast (an
        // `X-Nthpool-No-Queue` drawn by `acquire_req`) takes no place and is
        // denied at once, or gets the grant if the waiter had one by then,
        // which `tests/idempotency.rs` covers.
        let req = loop {
            let req = self.acquire_req(c, wait, Some(key.clone()));
            if matches!(req.pending.expect, Expect::Acquire { wait: 1.., .. }) {
                break req;
            }
        };
        self.conns_opened += 1;
        let mut fresh = Conn::open(self.server.addr, self.conns_opened);
        let sent = self.now();
        self.note(format!("c{c}: > retry of waiter {id} on #{} with its key", fresh.n));
        fresh.send(req.bytes, Vec::new(), false);
        // The old connection hears first.
        self.clients[c].conn = Some(old);
        self.clients[c].pending = old_pending;
        // The waiter's own request may have been answered `100 Continue`.
        let interim = self.clients[c].pending.front().is_some_and(|p| p.expect_continue);
        let conn = self.clients[c].conn.as_mut().unwrap();
        let resp = match conn.read(HANG, false, interim)? {
            Got::Answer(resp) => resp,
            _ => return Err(format!("c{c}: no answer for the superseded waiter {id}")),
        };
        if resp.status == 409 {
            self.note(format!("c{c}: < {} (superseded)", resp.summary()));
            check_common(&resp, false)?;
            expect_error(&resp, 409, "superseded")?;
            let mut waiting = self.clients[c].pending.pop_front().unwrap();
            if resp.says_close() != waiting.closes {
                return Err(format!("c{c}: the superseded waiter's `Connection: close` is wrong: {}", resp.summary()));
            }
            if waiting.closes {
                self.drop_behind_close(c)?;
            } else {
                // What the old connection pipelined behind it is answered now.
                self.read_answers(c)?;
            }
            if let Some(mut conn) = self.clients[c].conn.take() {
                conn.join_writer();
            }
            waiting.closes = req.pending.closes;
            waiting.http10_keep_alive = req.pending.http10_keep_alive;
            waiting.expect_continue = req.pending.expect_continue;
            self.clients[c].conn = Some(fresh);
            self.clients[c].pending = VecDeque::from([waiting]);
            return Ok(());
        }
        // Answered before the retry arrived: the retry is an acquire of its own.
        self.resolve(c, resp)?;
        if self.clients[c].conn.is_some() {
            self.read_answers(c)?;
        }
        self.clients[c].conn = Some(fresh);
        let mut p = req.pending;
        p.sent = sent;
        self.clients[c].pending = VecDeque::from([p]);
        self.read_answers(c)
    }

    /// Everything answered, released and closed; then nothing may be left.
    fn finish(&mut self) -> Result<(), String> {
        self.note("--- finish".into());
        for c in 0..CLIENTS {
            while self.has_waiter(c) {
                self.collect(c)?;
            }
        }
        for c in 0..CLIENTS {
            let ids: Vec<String> = self.clients[c].slots.iter().map(|s| s.id.clone()).collect();
            for id in ids {
                let req = self.release_req(c, &id, false);
                self.exchange(c, vec![req], false, false, b"")?;
            }
            if let Some(mut conn) = self.clients[c].conn.take() {
                conn.join_writer();
            }
        }
        if let Some(id) = self.q_slot.clone() {
            self.connect(0);
            let req = self.request(0, "POST", &format!("/pools/q/lock/{id}/release"), Some(KEY), "", b"");
            let req = Self::with(req, Expect::QRelease(id));
            self.exchange(0, vec![req], false, false, b"")?;
            if let Some(mut conn) = self.clients[0].conn.take() {
                conn.join_writer();
            }
        }
        let until = Instant::now() + Duration::from_millis(REQUEST_TIMEOUT_MS + ORPHAN_MS + 2000);
        loop {
            let m = self.scrape()?;
            let held = metric(&m, "nthpool_slots_held{pool=\"p\"}")?;
            let queued = metric(&m, "nthpool_waiters{pool=\"p\"}")?;
            let open = metric(&m, "nthpool_connections_open")?;
            let q_held = metric(&m, "nthpool_slots_held{pool=\"q\"}")?;
            if held == 0 && queued == 0 && open == 1 && (q_held == 0 || self.q_unknown) {
                if metric(&m, "nthpool_config_reload_failures_total")? != 0 {
                    return Err("a reload of an unchanged configuration was refused".into());
                }
                if self.reloads > 0 && metric(&m, "nthpool_config_reloads_total")? == 0 {
                    return Err(format!("{} reloads asked for, none applied", self.reloads));
                }
                let grants = metric(&m, "nthpool_grants_total{pool=\"p\"}")?;
                let released = metric(&m, "nthpool_releases_total{pool=\"p\",outcome=\"released\"}")?;
                let term = metric(&m, "nthpool_reclaims_total{pool=\"p\",cause=\"term\"}")?;
                let cap = metric(&m, "nthpool_reclaims_total{pool=\"p\",cause=\"cap\"}")?;
                self.note(format!(
                    "end: grants {grants}, released {released}, reclaimed {term} + {cap}, ids seen {}",
                    self.p_grants
                ));
                if grants != released + term + cap {
                    return Err(format!("{grants} grants but {released} released and {} reclaimed", term + cap));
                }
                if grants < self.p_grants {
                    return Err(format!("{grants} grants counted, {} seen", self.p_grants));
                }
                break;
            }
            if Instant::now() > until {
                return Err(format!(
                    "at the end: held {held}, queued {queued}, {open} connections open\n{}",
                    self.dump()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Ok(Some(status)) = self.server.child.try_wait() {
            return Err(format!("the server exited: {status}"));
        }
        Ok(())
    }
}

fn metric(m: &Metrics, name: &str) -> Result<u64, String> {
    m.get(name).copied().ok_or_else(|| format!("metric {name} missing"))
}

fn expect_error(resp: &Resp, status: u16, code: &str) -> Result<(), String> {
    if resp.status != status || resp.code() != code {
        return Err(format!("expected {status} {code}"));
    }
    Ok(())
}

fn expect_released(resp: &Resp, released: bool) -> Result<(), String> {
    let expected = if released { &b"{\"released\":true}"[..] } else { &b"{\"released\":false}"[..] };
    if resp.status != 200 || resp.body != expected {
        return Err(format!("expected released: {released}"));
    }
    Ok(())
}

/// What a grant said.
struct Grant {
    id: String,
    lease_unix: u64,
    req_unix: u64,
    queued_ms: u64,
    remaining: u64,
    depth: u64,
}

/// The governor headers of an acquire answer.
fn check_signals(resp: &Resp) -> Result<(), String> {
    if resp.header_u64("x-nthpool-limit")? != CONCURRENCY
        || resp.header_u64("x-nthpool-effective-limit")? != CONCURRENCY
    {
        return Err(format!("limits other than {CONCURRENCY}: {:?}", resp.headers));
    }
    if resp.header_u64("x-nthpool-remaining-slots")? > CONCURRENCY
        || resp.header_u64("x-nthpool-queue-depth")? > QUEUE_SIZE
    {
        return Err(format!("governor headers out of range: {:?}", resp.headers));
    }
    resp.header_u64("x-nthpool-queued-ms")?;
    Ok(())
}

fn check_grant(resp: &Resp) -> Result<Grant, String> {
    check_signals(resp)?;
    let v = resp.json()?;
    let id = v["slotId"].as_str().ok_or("no slotId")?.to_string();
    if id.len() != 56 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!("a slot id that is not 56 URL-safe characters: {id:?}"));
    }
    let lease_unix = v["leaseDeadline"].as_u64().ok_or("no leaseDeadline")?;
    let req_unix = v["requestDeadline"].as_u64().ok_or("no requestDeadline")?;
    if v["termMs"].as_u64() != Some(TERM_MS) || v["renewIntervalMs"].as_u64() != Some(RENEW_MS) {
        return Err("termMs or renewIntervalMs differ from the configuration".into());
    }
    if lease_unix > req_unix {
        return Err("a lease past its request deadline".into());
    }
    Ok(Grant {
        id,
        lease_unix,
        req_unix,
        queued_ms: resp.header_u64("x-nthpool-queued-ms")?,
        remaining: resp.header_u64("x-nthpool-remaining-slots")?,
        depth: resp.header_u64("x-nthpool-queue-depth")?,
    })
}
