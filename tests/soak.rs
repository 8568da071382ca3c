//! Soak: under load, nothing is lost.
//!
//! Many concurrent clients work one pool at random — fail-fast and queued
//! acquires, holds renewed on time, too late on purpose and past the cap,
//! releases with and without outcome reports, waiters that walk away politely
//! (half-close) or rudely (reset) — while a few clients run in child processes
//! of this test binary that are frozen with `SIGSTOP` for longer than the term.
//! Every client records what it was told and when; afterwards those records
//! are checked against the README's guarantees and the server's own counters:
//!
//! 1. never more than `concurrency` legitimate holders at once, where a
//!    client holds from the grant's arrival to the earlier of its release and
//!    its last known `leaseDeadline` (a frozen client may believe it holds
//!    longer; the server does not promise otherwise);
//! 2. every grant ended exactly one way (released, or reclaimed at its
//!    deadline) and no `slotId` was granted twice;
//! 3. after a quiet period nothing is held or queued, and the server's grants,
//!    releases, reclaims, renewals, denials and queue outcomes match what the
//!    clients saw (exactly, except for the few acquires whose client vanished
//!    without reading the answer: those bound the difference).
//!
//! `soak_short` (5 s, 50 clients) runs with every `cargo test`. The long run
//! is `cargo test --test soak -- --ignored`; `NTHPOOL_SOAK_SECS` (60) and
//! `NTHPOOL_SOAK_CLIENTS` (1000) size it and `NTHPOOL_SOAK_SEED` replays the
//! random choices of a run (timing still differs).

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use common::{config, post, scratch_dir, ReadSome, TestServer, KEY};

const CONCURRENCY: u64 = 20;
const TERM_MS: u64 = 300;
const RENEW_MS: u64 = 100;
const REQUEST_TIMEOUT_MS: u64 = 2000;
const QUEUE_SIZE: u64 = 100;
const QUEUE_TIMEOUT_MS: u64 = 1000;
/// Clients per paused-capable child process.
const CHILD_CLIENTS: usize = 4;
const CHILD_TEST: &str = "paused_client_process";
/// Set (to a JSON `ChildSpec`) only in the child processes this test starts.
const CHILD_ENV: &str = "NTHPOOL_SOAK_CHILD";
/// The server answers in microseconds; this only catches a hang.
const ANSWER_DEADLINE: Duration = Duration::from_secs(20);
/// `x-nthpool-deny-reason` values, in the order `Counts::denied` keeps them.
const DENY_REASONS: [&str; 4] = ["concurrency", "rate", "cooldown", "queue_full"];
/// The slot a hard-abandoning client renews first: the 404 stays unread in
/// its socket, so closing it sends a reset rather than a FIN.
const PROBE_SLOT: &str = "vanished-client-probe";
/// How far the server's Unix deadlines may sit from this machine's clock:
/// both come from the same clock, read once at start-up.
const CLOCK_TOLERANCE_US: i64 = 20_000;
const MAX_ROUNDS: usize = 100_000;
const MAX_RENEWS: usize = 64;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn soak_short() {
    soak(5, 50);
}

#[test]
#[ignore = "long soak; run with `cargo test --test soak -- --ignored` (NTHPOOL_SOAK_SECS, NTHPOOL_SOAK_CLIENTS)"]
fn soak_long() {
    let secs = env_number("NTHPOOL_SOAK_SECS", 60);
    let clients = env_number("NTHPOOL_SOAK_CLIENTS", 1000);
    soak(secs, clients as usize);
}

/// The paused-capable clients: the soak tests re-run this binary with only
/// this test selected and `NTHPOOL_SOAK_CHILD` set. Run by hand it does nothing.
#[test]
#[ignore = "helper process of the soak tests; does nothing unless they start it"]
fn paused_client_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec: ChildSpec = serde_json::from_str(&spec).expect("a child spec");
    let clock = WallClock::new();
    let end = Instant::now() + ms(spec.run_ms);
    let addr: SocketAddr = spec.addr.parse().unwrap();
    let clients: Vec<_> = (0..spec.clients)
        .map(|i| {
            let id = spec.first_id + i as u32;
            let client = Client::new(spec.process, id, addr, clock, spec.seed);
            spawn_client(client, end)
        })
        .collect();
    let logs: Vec<ClientLog> = clients.into_iter().map(|h| h.join().expect("a client thread")).collect();
    std::fs::write(&spec.out, serde_json::to_vec(&logs).unwrap()).expect("write the child's records");
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

// ---------------------------------------------------------------------------
// Records

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildSpec {
    addr: String,
    run_ms: u64,
    process: u32,
    first_id: u32,
    clients: usize,
    seed: u64,
    out: PathBuf,
}

/// One grant as its client saw it. Times are Unix microseconds of the
/// client's process (`WallClock`); deadlines are the server's Unix ms.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GrantRec {
    process: u32,
    client: u32,
    slot: String,
    /// How the client meant to hold it (for the summary only).
    kind: String,
    acquire_sent_us: u64,
    received_us: u64,
    lease_deadline_ms: u64,
    request_deadline_ms: u64,
    renews: Vec<RenewRec>,
    release: Option<ReleaseRec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RenewRec {
    sent_us: u64,
    answered_us: u64,
    status: u16,
    lease_deadline_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReleaseRec {
    sent_us: u64,
    answered_us: u64,
    released: bool,
    report: String,
}

/// What a client's acquires came to.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Counts {
    acquires: u64,
    granted: u64,
    denied: [u64; 4],
    timed_out: u64,
    /// Half-closed while queued, answered by the connection closing.
    left_queue: u64,
    half_closes: u64,
    /// Half-closed while queued and granted all the same (the grant was made
    /// before the server read the half-close, or in the same turn).
    half_close_granted: u64,
    hard_abandons: u64,
    /// Hard abandons that closed without seeing the acquire's answer.
    blind: u64,
    /// Of the hard abandons, those whose probe renew was seen answered.
    probes_seen: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.acquires += o.acquires;
        self.granted += o.granted;
        for (a, b) in self.denied.iter_mut().zip(o.denied) {
            *a += b;
        }
        self.timed_out += o.timed_out;
        self.left_queue += o.left_queue;
        self.half_closes += o.half_closes;
        self.half_close_granted += o.half_close_granted;
        self.hard_abandons += o.hard_abandons;
        self.blind += o.blind;
        self.probes_seen += o.probes_seen;
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClientLog {
    process: u32,
    client: u32,
    grants: Vec<GrantRec>,
    counts: Counts,
}

/// Unix time advanced by the monotonic clock, as the server computes its
/// deadlines: the offset between two processes then stays constant, and the
/// verification measures it instead of trusting the two wall-clock readings.
#[derive(Debug, Clone, Copy)]
struct WallClock {
    base_us: u64,
    start: Instant,
}

impl WallClock {
    /// Pairs the two clocks from readings bracketed tightly by the monotonic
    /// one: a process frozen or preempted between them would otherwise start
    /// off by the length of the stall.
    fn new() -> WallClock {
        let mut best: Option<(Duration, WallClock)> = None;
        for _ in 0..1000 {
            let before = Instant::now();
            let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            let gap = before.elapsed();
            let clock = WallClock { base_us: (wall - gap / 2).as_micros() as u64, start: before };
            if best.as_ref().is_none_or(|(g, _)| gap < *g) {
                best = Some((gap, clock));
            }
            if gap < Duration::from_micros(50) {
                break;
            }
        }
        best.expect("at least one reading").1
    }

    fn now_us(&self) -> u64 {
        self.base_us + self.start.elapsed().as_micros() as u64
    }
}

// ---------------------------------------------------------------------------
// The wire

struct Answer {
    status: u16,
    deny_reason: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// The first complete answer in `buf` and its length, or `None` while incomplete.
fn parse_answer(buf: &[u8]) -> Option<(Answer, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut headers);
    let head_len = match head.parse(buf).expect("the server speaks HTTP/1.1") {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let mut body_len = 0;
    let mut deny_reason = None;
    for h in head.headers.iter() {
        let value = std::str::from_utf8(h.value).expect("ASCII header values");
        if h.name.eq_ignore_ascii_case("content-length") {
            body_len = value.parse::<usize>().expect("a numeric Content-Length");
        } else if h.name.eq_ignore_ascii_case("x-nthpool-deny-reason") {
            deny_reason = Some(value.to_string());
        }
    }
    let status = head.code.expect("a status code");
    let total = head_len + body_len;
    (buf.len() >= total).then(|| (Answer { status, deny_reason, body: buf[head_len..total].to_vec() }, total))
}

/// A keep-alive connection with a read buffer: `common::read_response`
/// reads a byte per syscall, too slow for thousands of clients on two cores.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        // Short reads: a read cut by SIGSTOP/SIGCONT (EINTR with a socket
        // timeout) or by the timeout just loops until `ANSWER_DEADLINE`.
        stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        Conn { stream, buf: Vec::with_capacity(1024) }
    }

    fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).unwrap_or_else(|e| panic!("write failed: {e}"));
    }

    /// The next answer; `None` when the server closed before sending one.
    fn answer(&mut self) -> Option<Answer> {
        let started = Instant::now();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((answer, len)) = parse_answer(&self.buf) {
                self.buf.drain(..len);
                return Some(answer);
            }
            assert!(started.elapsed() < ANSWER_DEADLINE, "no answer within {ANSWER_DEADLINE:?}");
            match self.stream.read_some(&mut chunk) {
                Ok(0) => {
                    assert!(self.buf.is_empty(), "connection closed in the middle of an answer");
                    return None;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset && self.buf.is_empty() => return None,
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    fn call(&mut self, raw: &[u8]) -> Answer {
        self.send(raw);
        self.answer().expect("an answer on a keep-alive connection")
    }
}

// ---------------------------------------------------------------------------
// A client

enum Acquired {
    Granted(GrantRec),
    Denied,
    TimedOut,
    /// Walked away from the queue; the answer, if any, was never read.
    Left,
}

#[derive(Debug, Clone, Copy)]
enum HoldKind {
    /// Renews every `renewIntervalMs` for a random time, then releases.
    OnTime,
    /// Renews on time a few times, then once more after the term has passed.
    Late,
    /// Renews until the request deadline caps the lease and past it.
    PastCap,
    /// Never renews; releases after the term.
    Forgetful,
    /// Releases at once.
    Immediate,
}

struct Client {
    process: u32,
    id: u32,
    addr: SocketAddr,
    clock: WallClock,
    rng: StdRng,
    conn: Option<Conn>,
    log: ClientLog,
}

fn spawn_client(client: Client, end: Instant) -> thread::JoinHandle<ClientLog> {
    thread::Builder::new()
        .name(format!("soak-{}-{}", client.process, client.id))
        // A thousand threads: their stacks need not be the default 2 MiB.
        .stack_size(256 * 1024)
        .spawn(move || client.run(end))
        .expect("spawn a client thread")
}

impl Client {
    fn new(process: u32, id: u32, addr: SocketAddr, clock: WallClock, seed: u64) -> Client {
        let rng = StdRng::seed_from_u64(seed ^ (u64::from(process) << 32 | u64::from(id)).wrapping_mul(0x9e37_79b9));
        let log = ClientLog { process, client: id, grants: Vec::new(), counts: Counts::default() };
        Client { process, id, addr, clock, rng, conn: None, log }
    }

    fn run(mut self, end: Instant) -> ClientLog {
        // Spread the first connects so the listen backlog is not one burst.
        thread::sleep(ms(self.rng.gen_range(0..500)));
        for _ in 0..MAX_ROUNDS {
            if Instant::now() >= end {
                break;
            }
            self.round();
        }
        self.log
    }

    fn main_conn(&mut self) -> &mut Conn {
        let addr = self.addr;
        self.conn.get_or_insert_with(|| Conn::open(addr))
    }

    fn round(&mut self) {
        let wait_ms = self.rng.gen_range(100..=1500u64);
        let acquired = match self.rng.gen_range(0..100) {
            0..=39 => self.acquire("", ""),
            40..=69 => self.acquire("", &format!(r#"{{"waitMs":{wait_ms}}}"#)),
            70..=89 => self.acquire(&format!("X-Nthpool-Queue-Timeout-Ms: {wait_ms}\r\n"), ""),
            90..=94 => self.acquire_then_half_close(wait_ms),
            _ => self.acquire_then_vanish(wait_ms),
        };
        let pause = match acquired {
            Acquired::Granted(grant) => {
                self.hold(grant);
                self.rng.gen_range(0..250)
            }
            // Retry-After says 1 s for a concurrency limit; a random shorter
            // back-off keeps the pool contended, which is the point here.
            Acquired::Denied => self.rng.gen_range(100..1000),
            Acquired::TimedOut => self.rng.gen_range(0..200),
            Acquired::Left => self.rng.gen_range(50..300),
        };
        thread::sleep(ms(pause));
    }

    fn classify(&mut self, answer: Answer, acquire_sent_us: u64) -> Acquired {
        let received_us = self.clock.now_us();
        match answer.status {
            200 => {
                let j = answer.json();
                self.log.counts.granted += 1;
                Acquired::Granted(GrantRec {
                    process: self.process,
                    client: self.id,
                    slot: j["slotId"].as_str().expect("a slotId").to_string(),
                    kind: String::new(),
                    acquire_sent_us,
                    received_us,
                    lease_deadline_ms: j["leaseDeadline"].as_u64().expect("a leaseDeadline"),
                    request_deadline_ms: j["requestDeadline"].as_u64().expect("a requestDeadline"),
                    renews: Vec::new(),
                    release: None,
                })
            }
            429 => {
                let reason = answer.deny_reason.as_deref().expect("a 429 says why");
                let i = DENY_REASONS.iter().position(|r| *r == reason).unwrap_or_else(|| panic!("reason {reason}"));
                self.log.counts.denied[i] += 1;
                Acquired::Denied
            }
            504 => {
                self.log.counts.timed_out += 1;
                Acquired::TimedOut
            }
            s => panic!("client {}: acquire answered {s}: {}", self.id, String::from_utf8_lossy(&answer.body)),
        }
    }

    fn acquire(&mut self, headers: &str, body: &str) -> Acquired {
        let raw = post("/pools/p/lock/acquire", KEY, headers, body);
        self.log.counts.acquires += 1;
        let sent = self.clock.now_us();
        let answer = self.main_conn().call(&raw);
        self.classify(answer, sent)
    }

    /// Queues on a connection of its own, then half-closes it while (most
    /// likely) still queued: the server takes the waiter out of the queue and
    /// still writes any answer it already has, so nothing goes unseen.
    fn acquire_then_half_close(&mut self, wait_ms: u64) -> Acquired {
        let mut c = Conn::open(self.addr);
        self.log.counts.acquires += 1;
        self.log.counts.half_closes += 1;
        let sent = self.clock.now_us();
        c.send(&post("/pools/p/lock/acquire", KEY, "", &format!(r#"{{"waitMs":{wait_ms}}}"#)));
        thread::sleep(ms(self.rng.gen_range(20..=wait_ms * 2 / 3)));
        c.stream.shutdown(Shutdown::Write).expect("half-close");
        match c.answer() {
            // Taken out of the queue by the half-close, and told so.
            Some(answer) if answer.status == 504 && String::from_utf8_lossy(&answer.body).contains("half-closed") => {
                self.log.counts.left_queue += 1;
                Acquired::Left
            }
            Some(answer) => {
                let acquired = self.classify(answer, sent);
                self.log.counts.half_close_granted += matches!(acquired, Acquired::Granted(_)) as u64;
                acquired
            }
            None => {
                self.log.counts.left_queue += 1;
                Acquired::Left
            }
        }
    }

    /// Queues behind an answered probe, then closes with that answer unread
    /// (a reset): the server must drop the waiter, or release a grant it
    /// could not deliver. If the acquire's answer is already visible it is
    /// read instead — only answers truly never seen are left unaccounted.
    fn acquire_then_vanish(&mut self, wait_ms: u64) -> Acquired {
        let mut c = Conn::open(self.addr);
        self.log.counts.acquires += 1;
        self.log.counts.hard_abandons += 1;
        let mut raw = post(&format!("/pools/p/lock/{PROBE_SLOT}/renew"), KEY, "", "");
        raw.extend(post("/pools/p/lock/acquire", KEY, "", &format!(r#"{{"waitMs":{wait_ms}}}"#)));
        let sent = self.clock.now_us();
        c.send(&raw);
        thread::sleep(ms(self.rng.gen_range(20..=wait_ms * 2 / 3)));
        let mut peeked = [0u8; 4096];
        c.stream.set_nonblocking(true).unwrap();
        let n = match c.stream.peek(&mut peeked) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => 0,
            Err(e) => panic!("peek failed: {e}"),
        };
        c.stream.set_nonblocking(false).unwrap();
        let probe_len = parse_answer(&peeked[..n]).map(|(_, len)| len);
        if probe_len.is_some() {
            self.log.counts.probes_seen += 1;
        }
        match probe_len {
            Some(len) if n > len => {
                let probe = c.answer().expect("the probe's answer");
                assert_eq!(probe.status, 404, "a renew of no slot");
                let answer = c.answer().expect("the acquire's answer has begun");
                let acquired = self.classify(answer, sent);
                // The connection is sound; it becomes this client's own.
                self.conn = Some(c);
                acquired
            }
            _ => {
                self.log.counts.blind += 1;
                drop(c);
                Acquired::Left
            }
        }
    }

    fn hold(&mut self, mut g: GrantRec) {
        let kind = match self.rng.gen_range(0..100) {
            0..=77 => HoldKind::OnTime,
            78..=85 => HoldKind::Late,
            86..=88 => HoldKind::PastCap,
            89..=94 => HoldKind::Forgetful,
            _ => HoldKind::Immediate,
        };
        g.kind = format!("{kind:?}");
        let granted = Instant::now();
        // A renew answered 404: the slot was reclaimed.
        let mut lost = false;
        match kind {
            HoldKind::OnTime => {
                let hold = ms(self.rng.gen_range(0..=800));
                for _ in 0..MAX_RENEWS {
                    let left = hold.saturating_sub(granted.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    thread::sleep(left.min(ms(RENEW_MS)));
                    if granted.elapsed() >= hold {
                        break;
                    }
                    if self.renew(&mut g) == 404 {
                        lost = true;
                        break;
                    }
                }
            }
            HoldKind::Late => {
                for _ in 0..self.rng.gen_range(0..=3) {
                    thread::sleep(ms(RENEW_MS));
                    if self.renew(&mut g) == 404 {
                        lost = true;
                        break;
                    }
                }
                if !lost {
                    thread::sleep(ms(TERM_MS + self.rng.gen_range(30..=250)));
                    lost = self.renew(&mut g) == 404;
                }
            }
            HoldKind::PastCap => {
                for _ in 0..MAX_RENEWS {
                    thread::sleep(ms(RENEW_MS));
                    if self.renew(&mut g) == 404 {
                        lost = true;
                        break;
                    }
                }
            }
            HoldKind::Forgetful => thread::sleep(ms(TERM_MS + self.rng.gen_range(30..=300))),
            HoldKind::Immediate => {}
        }
        // After a 404 the slot is gone; releasing it anyway must say so.
        if !lost || self.rng.gen_bool(0.5) {
            self.release(&mut g);
        }
        self.log.grants.push(g);
    }

    fn renew(&mut self, g: &mut GrantRec) -> u16 {
        let raw = post(&format!("/pools/p/lock/{}/renew", g.slot), KEY, "", "");
        let sent_us = self.clock.now_us();
        let answer = self.main_conn().call(&raw);
        let answered_us = self.clock.now_us();
        let lease_deadline_ms = match answer.status {
            200 => Some(answer.json()["leaseDeadline"].as_u64().expect("a leaseDeadline")),
            404 | 409 => None,
            s => panic!("renew answered {s}: {}", String::from_utf8_lossy(&answer.body)),
        };
        g.renews.push(RenewRec { sent_us, answered_us, status: answer.status, lease_deadline_ms });
        answer.status
    }

    fn release(&mut self, g: &mut GrantRec) {
        let (report, body) = match self.rng.gen_range(0..400) {
            // Few 429s: each cuts the adaptive limit by a tenth and only a
            // limit's worth of successes adds one back, so more would keep
            // the pool far below `concurrency` and the overlap check slack.
            0..=199 => ("200", r#"{"status":200}"#.to_string()),
            200..=379 => ("none", String::new()),
            380..=391 => ("500", r#"{"status":500}"#.to_string()),
            392..=397 => ("429", r#"{"status":429,"throttled":1}"#.to_string()),
            _ => ("429+retry", format!(r#"{{"status":429,"retryAfterMs":{}}}"#, self.rng.gen_range(50..=250))),
        };
        let raw = post(&format!("/pools/p/lock/{}/release", g.slot), KEY, "", &body);
        let sent_us = self.clock.now_us();
        let answer = self.main_conn().call(&raw);
        let answered_us = self.clock.now_us();
        assert_eq!(answer.status, 200, "release: {}", String::from_utf8_lossy(&answer.body));
        let released = answer.json()["released"].as_bool().expect("released: bool");
        g.release = Some(ReleaseRec { sent_us, answered_us, released, report: report.to_string() });
    }
}

// ---------------------------------------------------------------------------
// The run

/// Child processes this test started; on the way out (a failure included)
/// none is left frozen or running.
struct Children {
    procs: Vec<(Child, PathBuf)>,
    reaped: Vec<bool>,
}

impl Children {
    fn signal(&self, i: usize, sig: &str) {
        if self.reaped[i] {
            return;
        }
        let pid = self.procs[i].0.id().to_string();
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(&pid).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "kill -{sig} {pid} failed");
    }

    /// Waits for every child until `deadline`; returns their records.
    fn collect(&mut self, deadline: Instant) -> Vec<ClientLog> {
        let mut logs = Vec::new();
        for i in 0..self.procs.len() {
            let status = loop {
                if let Some(status) = self.procs[i].0.try_wait().expect("wait for a child") {
                    break status;
                }
                assert!(Instant::now() < deadline, "paused-client process {} did not finish", i + 1);
                thread::sleep(ms(20));
            };
            self.reaped[i] = true;
            assert!(status.success(), "paused-client process {} failed: {status}", i + 1);
            let raw = std::fs::read(&self.procs[i].1).expect("the child's records");
            let mut child_logs: Vec<ClientLog> = serde_json::from_slice(&raw).expect("records as JSON");
            logs.append(&mut child_logs);
        }
        logs
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            if !self.reaped[i] {
                let _ = Command::new("kill").arg("-CONT").arg(self.procs[i].0.id().to_string()).status();
                let _ = self.procs[i].0.kill();
                let _ = self.procs[i].0.wait();
            }
        }
    }
}

/// How many clients this process and the server can hold sockets for: each
/// client may have two connections open at once (its own and an abandoned
/// one), and each is a descriptor here and one in the server.
fn fit_clients(requested: usize) -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024);
    let fit = soft.saturating_sub(256) / 3;
    if requested > fit {
        println!("soak: {requested} clients do not fit {soft} descriptors; running {fit}");
    }
    requested.min(fit).max(2 * CHILD_CLIENTS + 1)
}

type Metrics = HashMap<String, u64>;

fn scrape(admin: SocketAddr) -> Metrics {
    let mut c = Conn::open(admin);
    c.send(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let answer = c.answer().expect("metrics");
    assert_eq!(answer.status, 200);
    String::from_utf8(answer.body)
        .expect("UTF-8 metrics")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(name, v)| Some((name.to_string(), v.parse::<u64>().ok()?)))
        .collect()
}

fn metric(m: &Metrics, name: &str) -> u64 {
    *m.get(name).unwrap_or_else(|| panic!("metric {name} missing"))
}

/// What a sampler saw of the server's own count while the clients ran.
#[derive(Default)]
struct Sampled {
    scrapes: u64,
    max_held: u64,
    max_waiters: u64,
    held_sum: u64,
    min_effective: u64,
    over_limit: Vec<String>,
}

fn soak(secs: u64, requested_clients: usize) {
    let clients = fit_clients(requested_clients);
    let processes = (clients / 100).clamp(2, 6);
    let thread_clients = clients - processes * CHILD_CLIENTS;
    let seed = std::env::var("NTHPOOL_SOAK_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("NTHPOOL_SOAK_SEED is a number"))
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64);
    let pool = [
        format!(r#""concurrency":{CONCURRENCY},"termMs":{TERM_MS},"renewIntervalMs":{RENEW_MS}"#),
        format!(
            r#""requestTimeoutMs":{REQUEST_TIMEOUT_MS},"queue":{{"size":{QUEUE_SIZE},"timeoutMs":{QUEUE_TIMEOUT_MS}}}"#
        ),
    ]
    .join(",");
    let server = TestServer::start(&config(&pool, &format!(r#""maxConnections":{}"#, clients * 3 + 100)));
    let admin = server.admin.expect("an admin listener");
    let dir = scratch_dir();
    let clock = WallClock::new();
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);

    let mut children = Children { procs: Vec::new(), reaped: Vec::new() };
    let exe = std::env::current_exe().expect("the test binary");
    for p in 1..=processes {
        let out = dir.join(format!("process-{p}.json"));
        let spec = ChildSpec {
            addr: server.addr.to_string(),
            run_ms: end.saturating_duration_since(Instant::now()).as_millis() as u64,
            process: p as u32,
            first_id: (thread_clients + (p - 1) * CHILD_CLIENTS) as u32,
            clients: CHILD_CLIENTS,
            seed,
            out: out.clone(),
        };
        let child = Command::new(&exe)
            .args(["--exact", CHILD_TEST, "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, serde_json::to_string(&spec).unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a paused-client process");
        children.procs.push((child, out));
        children.reaped.push(false);
    }
    let threads: Vec<_> =
        (0..thread_clients).map(|i| spawn_client(Client::new(0, i as u32, server.addr, clock, seed), end)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut s = Sampled::default();
            for _ in 0..secs * 10 + 300 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let m = scrape(admin);
                let held = metric(&m, r#"nthpool_slots_held{pool="p"}"#);
                let effective = metric(&m, r#"nthpool_effective_limit{pool="p"}"#);
                if held > CONCURRENCY || effective > CONCURRENCY {
                    s.over_limit.push(format!("server held {held}, effective limit {effective}"));
                }
                s.scrapes += 1;
                s.max_held = s.max_held.max(held);
                s.held_sum += held;
                s.min_effective = if s.scrapes == 1 { effective } else { s.min_effective.min(effective) };
                s.max_waiters = s.max_waiters.max(metric(&m, r#"nthpool_waiters{pool="p"}"#));
                thread::sleep(ms(200));
            }
            s
        })
    };

    // Freeze one child at a time for longer than the term.
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut pauses, mut paused_ms) = (0u64, 0u64);
    for _ in 0..secs * 10 + 10 {
        thread::sleep(ms(rng.gen_range(100..600)));
        if Instant::now() >= end {
            break;
        }
        let i = rng.gen_range(0..processes);
        let pause = rng.gen_range(TERM_MS + 100..=TERM_MS * 4);
        children.signal(i, "STOP");
        thread::sleep(ms(pause));
        children.signal(i, "CONT");
        pauses += 1;
        paused_ms += pause;
    }

    let mut logs: Vec<ClientLog> = threads.into_iter().map(|h| h.join().expect("a client thread")).collect();
    logs.extend(children.collect(end + Duration::from_secs(60)));
    let ran = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let sampled = sampler.join().expect("the sampler");
    // Quiet: every lease still standing reaches its deadline.
    thread::sleep(ms(TERM_MS + 700));
    let m = scrape(admin);

    let v = verify(&logs, &m);
    let mut failures = v.failures.clone();
    failures.extend(sampled.over_limit.iter().take(5).cloned());
    if pauses == 0 {
        failures.push("no client process was paused".into());
    }
    let c = &v.counts;
    let g = |name: &str| metric(&m, name);
    println!(
        "soak: {:.1} s, {clients} clients ({thread_clients} threads + {processes} processes × {CHILD_CLIENTS} \
         paused-capable), concurrency {CONCURRENCY}, term {TERM_MS} ms, renew {RENEW_MS} ms, \
         cap {REQUEST_TIMEOUT_MS} ms, seed {seed}",
        ran.as_secs_f64()
    );
    println!(
        "  acquires {}: granted {}, 429 {} (concurrency {}, cooldown {}, queue_full {}), 504 {}, \
         half-closed {} (granted {}, left the queue {}), vanished {} (answer unseen {})",
        c.acquires,
        c.granted,
        c.denied.iter().sum::<u64>(),
        c.denied[0],
        c.denied[2],
        c.denied[3],
        c.timed_out,
        c.half_closes,
        c.half_close_granted,
        c.left_queue,
        c.hard_abandons,
        c.blind
    );
    println!(
        "  grants: clients {} ({} distinct slotIds), server {}; ended: released {} (server {}), \
         reclaimed {} (server term {} + cap {})",
        v.grants,
        v.distinct_slots,
        g(r#"nthpool_grants_total{pool="p"}"#),
        v.released,
        g(r#"nthpool_releases_total{pool="p",outcome="released"}"#),
        v.reclaimed,
        g(r#"nthpool_reclaims_total{pool="p",cause="term"}"#),
        g(r#"nthpool_reclaims_total{pool="p",cause="cap"}"#),
    );
    println!(
        "  renewals: {} renewed, {} capped, {} not found; releases answered false: {}",
        v.renewed, v.capped, v.renew_not_found, v.release_false
    );
    println!(
        "  max legitimate overlap {} of {CONCURRENCY}; max believed overlap {}; server in {} scrapes: \
         held max {} mean {:.1}, waiters max {}, effective limit min {}",
        v.max_overlap,
        v.max_believed,
        sampled.scrapes,
        sampled.max_held,
        sampled.held_sum as f64 / sampled.scrapes.max(1) as f64,
        sampled.max_waiters,
        sampled.min_effective
    );
    println!(
        "  paused: {pauses} pauses ({paused_ms} ms) of {processes} processes; their clients: {} grants, {} reclaimed, \
         {} arrived after their lease deadline",
        v.paused_grants, v.paused_reclaimed, v.arrived_expired
    );
    println!("  clock offset server − client per process, µs: {}", v.offsets);
    println!(
        "  after {} ms quiet: held {}, waiters {}, open connections {}",
        TERM_MS + 700,
        g(r#"nthpool_slots_held{pool="p"}"#),
        g(r#"nthpool_waiters{pool="p"}"#),
        g("nthpool_connections_open")
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.iter().take(30).cloned().collect::<Vec<_>>().join("\n")
    );
}

// ---------------------------------------------------------------------------
// Verification

#[derive(Default)]
struct Verdict {
    failures: Vec<String>,
    counts: Counts,
    grants: u64,
    distinct_slots: usize,
    released: u64,
    reclaimed: u64,
    renewed: u64,
    capped: u64,
    renew_not_found: u64,
    release_false: u64,
    max_overlap: u64,
    max_believed: u64,
    paused_grants: u64,
    paused_reclaimed: u64,
    arrived_expired: u64,
    offsets: String,
}

/// Bounds on the server's clock minus one process's clock, in µs. Each
/// grant says the server's time: `leaseDeadline - termMs` (Unix ms, rounded
/// down twice: at its start-up reading and at its clock read), and that time
/// lies between sending the acquire and reading the grant. So
/// `lo = max(reported - received)` and `hi = min(reported - sent) + 2 ms`.
fn clock_offsets(logs: &[ClientLog]) -> HashMap<u32, (i64, i64)> {
    let mut out: HashMap<u32, (i64, i64)> = HashMap::new();
    for log in logs {
        let entry = out.entry(log.process).or_insert((i64::MIN, i64::MAX));
        for g in &log.grants {
            let mut samples = vec![(g.lease_deadline_ms, g.acquire_sent_us, g.received_us)];
            // A renewal below the cap also says `now + termMs`.
            samples.extend(
                g.renews
                    .iter()
                    .filter_map(|r| Some((r.lease_deadline_ms?, r.sent_us, r.answered_us)))
                    .filter(|(d, _, _)| *d < g.request_deadline_ms),
            );
            for (deadline, sent, received) in samples {
                let reported = ((deadline - TERM_MS) * 1000) as i64;
                entry.0 = entry.0.max(reported - received as i64);
                entry.1 = entry.1.min(reported - sent as i64);
            }
        }
    }
    for v in out.values_mut() {
        v.1 = v.1.saturating_add(2000);
    }
    out
}

fn verify(logs: &[ClientLog], m: &Metrics) -> Verdict {
    let mut v = Verdict::default();
    let offsets = clock_offsets(logs);
    let mut keys: Vec<_> = offsets.keys().copied().collect();
    keys.sort_unstable();
    v.offsets = keys
        .iter()
        .map(|p| {
            let (lo, hi) = offsets[p];
            if lo > hi {
                v.failures.push(format!("process {p}: server times contradict the clock ({lo} > {hi} µs)"));
            }
            // Measured offsets would absorb a server that shifts every
            // deadline it reports; one machine's clocks agree far better.
            if lo > CLOCK_TOLERANCE_US || hi < -CLOCK_TOLERANCE_US {
                v.failures.push(format!(
                    "process {p}: the server's Unix times are [{lo}, {hi}] µs off this machine's clock \
                     (a deadline misreported, or the wall clock stepped during the run)"
                ));
            }
            format!("{p}: [{lo}, {hi}]")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut slots = HashSet::new();
    // Interval endpoints (µs, +1 start / -1 end) of legitimate and believed holding.
    let mut legit: Vec<(i64, i64)> = Vec::new();
    let mut believed: Vec<(i64, i64)> = Vec::new();
    for log in logs {
        v.counts.add(&log.counts);
        for g in &log.grants {
            v.grants += 1;
            if !slots.insert(g.slot.as_str()) {
                v.failures.push(format!("slotId {} granted twice", g.slot));
            }
            let (lo, hi) = offsets[&g.process];
            let (fails, end) = check_grant(g, lo, hi);
            let who = format!("process {} client {} slot {} ({})", g.process, g.client, g.slot, g.kind);
            v.failures.extend(fails.into_iter().map(|f| format!("{who}: {f}")));
            v.renewed += g.renews.iter().filter(|r| r.status == 200).count() as u64;
            v.capped += g.renews.iter().filter(|r| r.status == 409).count() as u64;
            v.renew_not_found += g.renews.iter().filter(|r| r.status == 404).count() as u64;
            v.release_false += g.release.as_ref().is_some_and(|r| !r.released) as u64;
            let released = g.release.as_ref().is_some_and(|r| r.released);
            if released {
                v.released += 1;
            } else {
                v.reclaimed += 1;
            }
            if g.process > 0 {
                v.paused_grants += 1;
                v.paused_reclaimed += !released as u64;
            }
            let start = g.received_us as i64;
            if end > start {
                legit.push((start, 1));
                legit.push((end, -1));
            } else {
                v.arrived_expired += 1;
            }
            let last_belief = g
                .release
                .as_ref()
                .map(|r| r.sent_us)
                .or_else(|| g.renews.iter().find(|r| r.status == 404).map(|r| r.answered_us))
                .unwrap_or(g.received_us) as i64;
            if last_belief > start {
                believed.push((start, 1));
                believed.push((last_belief, -1));
            }
        }
    }
    v.distinct_slots = slots.len();
    v.max_overlap = max_overlap(&mut legit);
    v.max_believed = max_overlap(&mut believed);
    if v.max_overlap > CONCURRENCY {
        v.failures
            .push(format!("{} clients legitimately held a slot at once (concurrency {CONCURRENCY})", v.max_overlap));
    }
    reconcile(&mut v, m);
    v
}

/// Checks one grant's story against the lease rules; returns the failures
/// and the end (µs) of its legitimate holding. `lo`/`hi` bound the server's
/// clock minus this client's (see `clock_offsets`).
fn check_grant(g: &GrantRec, lo: i64, hi: i64) -> (Vec<String>, i64) {
    let mut fails = Vec::new();
    let cap = g.request_deadline_ms;
    if cap - g.lease_deadline_ms != REQUEST_TIMEOUT_MS - TERM_MS {
        fails.push(format!("granted lease {} and request deadline {cap}", g.lease_deadline_ms));
    }
    // The latest leaseDeadline the client was told, in µs.
    let mut deadline = g.lease_deadline_ms;
    let us = |ms: u64| (ms * 1000) as i64;
    // Reclaimed at the server no earlier than `us(deadline) - hi`; a request
    // it served while the lease lived was sent before `us(deadline) - lo + 1 ms`.
    let mut gone = false;
    for r in &g.renews {
        match (r.status, r.lease_deadline_ms) {
            (200, Some(d)) => {
                if gone {
                    fails.push("renewed after a 404".into());
                }
                if r.sent_us as i64 >= us(deadline) - lo + 1000 {
                    fails.push(format!("renewed at {} µs, after its lease deadline {deadline}", r.sent_us));
                }
                if deadline == cap {
                    fails.push("renewed a capped lease (expected 409)".into());
                }
                if d > cap || d < deadline {
                    fails.push(format!("renew moved the deadline {deadline} to {d} (cap {cap})"));
                }
                deadline = d;
            }
            (409, _) => {
                if deadline != cap {
                    fails.push(format!("409 capped while its deadline {deadline} was below the cap {cap}"));
                }
                if gone {
                    fails.push("409 after a 404".into());
                }
            }
            (404, _) => {
                if (r.answered_us as i64) < us(deadline) - hi {
                    fails.push(format!(
                        "renew answered 404 at {} µs, before its lease deadline {deadline}",
                        r.answered_us
                    ));
                }
                gone = true;
            }
            (s, _) => fails.push(format!("renew answered {s}")),
        }
    }
    let lease_end = us(deadline) - hi.max(0);
    let end = match &g.release {
        Some(r) if r.released => {
            if gone {
                fails.push("released:true after a 404".into());
            }
            if r.sent_us as i64 >= us(deadline) - lo + 1000 {
                fails.push(format!("released:true at {} µs, after its lease deadline {deadline}", r.sent_us));
            }
            lease_end.min(r.sent_us as i64)
        }
        Some(r) => {
            if (r.answered_us as i64) < us(deadline) - hi {
                fails.push(format!("released:false at {} µs, before its lease deadline {deadline}", r.answered_us));
            }
            lease_end.min(r.sent_us as i64)
        }
        None => {
            if !gone {
                fails.push("never released and never told it was reclaimed".into());
            }
            lease_end
        }
    };
    (fails, end)
}

/// The most intervals open at once: a sweep over sorted endpoints, ends
/// before starts at the same instant (touching intervals do not overlap).
fn max_overlap(points: &mut [(i64, i64)]) -> u64 {
    points.sort_unstable();
    let (mut open, mut max) = (0i64, 0i64);
    for &(_, delta) in points.iter() {
        open += delta;
        max = max.max(open);
    }
    max as u64
}

/// The server's counters against the clients' records. Exact wherever every
/// answer was read; a client that vanished without seeing its acquire's
/// answer leaves one unknown outcome, so those (`blind`) bound the rest.
fn reconcile(v: &mut Verdict, m: &Metrics) {
    let p = |name: &str| metric(m, name);
    let mut check = |ok: bool, what: String| {
        if !ok {
            v.failures.push(what);
        }
    };
    let c = v.counts.clone();
    let blind = c.blind;
    let held = p(r#"nthpool_slots_held{pool="p"}"#);
    let waiters = p(r#"nthpool_waiters{pool="p"}"#);
    let grants = p(r#"nthpool_grants_total{pool="p"}"#);
    let released = p(r#"nthpool_releases_total{pool="p",outcome="released"}"#);
    let gone = p(r#"nthpool_releases_total{pool="p",outcome="already_gone"}"#);
    let term = p(r#"nthpool_reclaims_total{pool="p",cause="term"}"#);
    let cap = p(r#"nthpool_reclaims_total{pool="p",cause="cap"}"#);
    let renewed = p(r#"nthpool_renewals_total{pool="p",outcome="renewed"}"#);
    let capped = p(r#"nthpool_renewals_total{pool="p",outcome="capped"}"#);
    let not_found = p(r#"nthpool_renewals_total{pool="p",outcome="not_found"}"#);
    let timeouts = p(r#"nthpool_queue_timeouts_total{pool="p"}"#);
    let waiters_gone = p(r#"nthpool_waiters_gone_total{pool="p"}"#);
    let denied: Vec<u64> =
        DENY_REASONS.iter().map(|r| p(&format!(r#"nthpool_denials_total{{pool="p",reason="{r}"}}"#))).collect();
    let open = p("nthpool_connections_open");

    check(held == 0, format!("{held} slots still held after the quiet period"));
    check(waiters == 0, format!("{waiters} waiters still queued after the quiet period"));
    check(open == 1, format!("{open} connections open after every client left (only the scrape should be)"));
    check(
        grants == released + term + cap,
        format!("server: grants {grants} != released {released} + reclaimed term {term} + cap {cap}"),
    );
    check(v.grants == c.granted, format!("{} grant records for {} grants", v.grants, c.granted));
    // Every grant a client saw is one the server made; the only others are
    // answers to vanished clients (released undelivered, or reclaimed).
    check(
        v.grants <= grants && grants <= v.grants + blind,
        format!("server grants {grants}, clients saw {}, {blind} answers unseen", v.grants),
    );
    check(
        v.released <= released && released - v.released <= blind,
        format!("server released {released}, clients were told {}, {blind} answers unseen", v.released),
    );
    check(
        v.reclaimed <= term + cap && term + cap - v.reclaimed <= blind,
        format!("server reclaimed {}, clients learnt of {}, {blind} answers unseen", term + cap, v.reclaimed),
    );
    check(gone == v.release_false, format!("server: {gone} releases already gone, clients saw {}", v.release_false));
    check(renewed == v.renewed, format!("server: {renewed} renewals, clients saw {}", v.renewed));
    check(capped == v.capped, format!("server: {capped} capped renewals, clients saw {}", v.capped));
    // Each vanished client's probe renew counts as not found once processed.
    let (nf_lo, nf_hi) = (v.renew_not_found + c.probes_seen, v.renew_not_found + c.hard_abandons);
    check(
        (nf_lo..=nf_hi).contains(&not_found),
        format!("server: {not_found} renewals not found, clients account for {nf_lo}..={nf_hi}"),
    );
    for (i, reason) in DENY_REASONS.iter().enumerate() {
        check(
            c.denied[i] <= denied[i] && denied[i] <= c.denied[i] + blind,
            format!("server: {} denials for {reason}, clients saw {}", denied[i], c.denied[i]),
        );
    }
    check(
        c.timed_out <= timeouts && timeouts <= c.timed_out + blind,
        format!("server: {timeouts} queue timeouts, clients saw {}", c.timed_out),
    );
    check(
        c.left_queue <= waiters_gone && waiters_gone <= c.left_queue + blind,
        format!("server: {waiters_gone} waiters gone, clients left {}", c.left_queue),
    );
    // Every acquire the server read ended one way; a vanished client's may not have been read.
    let ended = grants + denied.iter().sum::<u64>() + timeouts + waiters_gone;
    check(
        ended <= c.acquires && c.acquires - ended <= blind,
        format!("server ended {ended} acquires, clients sent {} ({blind} vanished unseen)", c.acquires),
    );
}
