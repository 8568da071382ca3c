//! `--fill` and `--queue`: build state in the server and leave it there, for
//! the scale runs that time a cycle while the server holds a million slots
//! and keeps thousands of acquires waiting.
//!
//! Nothing here is a latency measurement, so none of [`crate::client`]'s
//! schedule and histogram machinery is needed: these modes only build the
//! state and say how much of it they built. One thread, one `mio` poll. A
//! connection lost mid-way is not reopened: a waiter's place in the queue, or
//! the fate of pipelined acquires, does not survive it, so the loss is counted
//! instead of hidden. Only refused connects are retried, as a server that is
//! still starting refuses them.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde_json::{json, Value};

use crate::options::Options;
use crate::request::Requests;
use crate::response::{self, Parsed};

/// Acquires in flight per connection while filling: enough for the server to
/// answer a batch with one write, few enough to stay inside socket buffers.
pub const FILL_PIPELINE: u64 = 16;
/// Connects in progress at once in queue mode, so the server's listen backlog
/// never overflows and no handshake waits a second for its SYN to be resent.
const CONNECTING_MAX: usize = 256;
const CONNECT_RETRY: Duration = Duration::from_millis(100);
const READ_CHUNK: usize = 64 * 1024;
/// Unframed bytes beyond this are a broken server, not an answer in progress.
const MAX_UNPARSED: usize = 1 << 20;
/// `EMFILE` and `ENFILE`: no file descriptor for one more socket.
const OUT_OF_FDS: [i32; 2] = [24, 23];
/// Linux's `EINPROGRESS`: a non-blocking connect has begun.
const EINPROGRESS: i32 = 115;
/// Queue connections to a loopback target come from this many loopback
/// source addresses (127.0.0.2 and up). Linux gives `connect` only half the
/// ephemeral port range before it starts scanning for a free port, which
/// costs milliseconds per connect past ~14,000 connections from one address
/// to one server; spread over several sources, each has ports to spare.
const LOOPBACK_SOURCES: u8 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Fill(u64),
    Queue(usize),
}

impl Mode {
    pub fn of(o: &Options) -> Option<Mode> {
        match (o.fill, o.queue) {
            (Some(n), _) => Some(Mode::Fill(n)),
            (_, Some(n)) => Some(Mode::Queue(n)),
            _ => None,
        }
    }

    fn requested(self) -> u64 {
        match self {
            Mode::Fill(n) => n,
            Mode::Queue(n) => n as u64,
        }
    }
}

/// What a fill or queue run built.
#[derive(Debug, Clone, Default)]
pub struct Built {
    pub requested: u64,
    pub connections: usize,
    /// Connections that finished their handshake.
    pub connected: u64,
    /// Acquires written out completely.
    pub sent: u64,
    pub statuses: BTreeMap<u16, u64>,
    /// Acquires whose connection died before their answer came.
    pub lost: u64,
    pub connect_errors: u64,
    /// A connect failed for want of a file descriptor; no more were tried.
    pub out_of_fds: bool,
    /// Connections still open when the run ended.
    pub open_at_end: u64,
    /// Fill: until the last answer. Queue: until the last acquire was sent.
    pub built_in: Option<Duration>,
    pub ran: Duration,
}

impl Built {
    pub fn answered(&self) -> u64 {
        self.statuses.values().sum()
    }

    pub fn granted(&self) -> u64 {
        self.statuses.iter().filter(|(s, _)| (200..300).contains(*s)).map(|(_, n)| n).sum()
    }

    /// Queue mode: acquires sent whose connection is open and still unanswered.
    pub fn waiting(&self) -> u64 {
        self.sent.saturating_sub(self.answered() + self.lost)
    }

    /// Whether the run built everything it was asked for.
    pub fn complete(&self, mode: Mode) -> bool {
        match mode {
            Mode::Fill(n) => self.granted() == n,
            // Every acquire reached the server and none was refused or timed
            // out; a granted connection the server later closed for idleness
            // still counts, as its slot stays held.
            Mode::Queue(n) => self.sent == n as u64 && self.lost == 0 && self.answered() == self.granted(),
        }
    }
}

struct Conn {
    stream: Option<TcpStream>,
    open: bool,
    /// Lost for good (closed by the server, reset, or no descriptor for it).
    dead: bool,
    wbuf: Vec<u8>,
    wpos: usize,
    /// Acquires in `wbuf` not yet written out completely.
    unsent: u64,
    /// Acquires sent (or about to be) whose answer has not arrived.
    in_flight: u64,
    rbuf: Vec<u8>,
}

impl Conn {
    fn new() -> Conn {
        Conn {
            stream: None,
            open: false,
            dead: false,
            wbuf: Vec::new(),
            wpos: 0,
            unsent: 0,
            in_flight: 0,
            rbuf: Vec::new(),
        }
    }
}

pub struct Holder<'a> {
    mode: Mode,
    opts: &'a Options,
    /// The acquire request, composed once (its `X-Request-Id` stamped per copy).
    requests: Requests,
    addr: SocketAddr,
    poll: Poll,
    conns: Vec<Conn>,
    /// Acquires not yet handed to any connection.
    to_send: u64,
    next_to_open: usize,
    connecting: usize,
    /// Refused connects to try again, oldest first: the pause is constant,
    /// so the queue is in deadline order.
    retries: VecDeque<(Instant, usize)>,
    started: Instant,
    scratch: Vec<u8>,
    built: Built,
}

impl<'a> Holder<'a> {
    pub fn new(mode: Mode, opts: &'a Options, addr: SocketAddr) -> io::Result<Holder<'a>> {
        let connections = match mode {
            Mode::Fill(_) => opts.connections,
            Mode::Queue(n) => n,
        };
        Ok(Holder {
            mode,
            opts,
            requests: Requests::new(opts),
            addr,
            poll: Poll::new()?,
            conns: (0..connections).map(|_| Conn::new()).collect(),
            to_send: mode.requested(),
            next_to_open: 0,
            connecting: 0,
            retries: VecDeque::new(),
            started: Instant::now(),
            scratch: vec![0; READ_CHUNK],
            built: Built { requested: mode.requested(), connections, ..Built::default() },
        })
    }

    /// Builds the state, holds it until `--duration` is over (queue) or stops
    /// once every acquire is answered (fill), and says what was built.
    pub fn run(mut self) -> io::Result<Built> {
        let mut events = Events::with_capacity(1024);
        self.started = Instant::now();
        let end = self.started + self.opts.duration;
        loop {
            let now = Instant::now();
            if now >= end || self.finished() {
                break;
            }
            self.open_more(now);
            let mut wake = end;
            if self.next_to_open < self.conns.len() && !self.built.out_of_fds {
                // Openings held back by CONNECTING_MAX go on as handshakes finish;
                // this is only the fallback should no event come.
                wake = wake.min(now + CONNECT_RETRY);
            }
            if let Some(&(at, _)) = self.retries.front() {
                wake = wake.min(at);
            }
            match self.poll.poll(&mut events, Some(wake.saturating_duration_since(now))) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for event in events.iter() {
                self.ready(event.token().0);
            }
        }
        self.built.ran = self.started.elapsed();
        self.built.open_at_end = self.conns.iter().filter(|c| c.open && !c.dead).count() as u64;
        // Dropping the sockets closes them: the server forgets the waiters,
        // while granted slots stay held until their term ends.
        self.conns.clear();
        Ok(self.built)
    }

    fn finished(&self) -> bool {
        let all_lost = self.next_to_open == self.conns.len() && self.conns.iter().all(|c| c.dead);
        match self.mode {
            Mode::Fill(n) => self.built.answered() + self.built.lost == n || all_lost,
            // A queue is held until the end of the run, unless nothing is left to hold.
            Mode::Queue(_) => all_lost,
        }
    }

    /// Opens connections not yet opened, and reopens refused ones whose pause is over.
    fn open_more(&mut self, now: Instant) {
        while self.retries.front().is_some_and(|&(at, _)| at <= now) {
            let (_, i) = self.retries.pop_front().expect("a due retry");
            self.connect(i);
        }
        while self.next_to_open < self.conns.len() && self.connecting < CONNECTING_MAX && !self.built.out_of_fds {
            let i = self.next_to_open;
            self.next_to_open += 1;
            self.connect(i);
        }
    }

    fn connect(&mut self, i: usize) {
        let source = match (self.mode, self.addr.ip()) {
            (Mode::Queue(_), IpAddr::V4(ip)) if ip.is_loopback() => {
                Some(Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(LOOPBACK_SOURCES)) as u8))
            }
            _ => None,
        };
        let mut stream = match connect_from(source, self.addr) {
            Ok(s) => s,
            Err(e) => return self.connect_failed(i, &e),
        };
        if let Err(e) = self.poll.registry().register(&mut stream, Token(i), Interest::READABLE | Interest::WRITABLE) {
            return self.connect_failed(i, &e);
        }
        self.conns[i].stream = Some(stream);
        self.connecting += 1;
    }

    fn connect_failed(&mut self, i: usize, e: &io::Error) {
        self.built.connect_errors += 1;
        let c = &mut self.conns[i];
        c.stream = None;
        if e.raw_os_error().is_some_and(|code| OUT_OF_FDS.contains(&code)) {
            // Retrying cannot help, and every further connection would fail too.
            self.built.out_of_fds = true;
            c.dead = true;
        } else {
            self.retries.push_back((Instant::now() + CONNECT_RETRY, i));
        }
    }

    fn ready(&mut self, i: usize) {
        let Some(c) = self.conns.get(i) else { return };
        if c.stream.is_none() || c.dead {
            return;
        }
        if !c.open && !self.finish_connect(i) {
            return;
        }
        if self.flush(i) {
            self.read(i);
        }
    }

    /// Learns the outcome of a non-blocking connect (mio's documented way);
    /// true once the connection is open.
    fn finish_connect(&mut self, i: usize) -> bool {
        let stream = self.conns[i].stream.as_ref().expect("connecting has a socket");
        let outcome = match stream.take_error() {
            Ok(None) => stream.peer_addr().map(|_| ()),
            Ok(Some(e)) | Err(e) => Err(e),
        };
        match outcome {
            // A spurious wake-up: the handshake is still going on.
            Err(e) if e.kind() == ErrorKind::NotConnected => return false,
            Err(e) => {
                self.connecting -= 1;
                if let Some(mut s) = self.conns[i].stream.take() {
                    let _ = self.poll.registry().deregister(&mut s);
                }
                self.connect_failed(i, &e);
                return false;
            }
            // Small requests; Nagle would only hold the pipeline back.
            Ok(()) => {
                let _ = stream.set_nodelay(true);
            }
        }
        self.connecting -= 1;
        self.built.connected += 1;
        self.conns[i].open = true;
        self.top_up(i);
        true
    }

    /// Gives the connection its next acquires: up to the pipeline depth when
    /// filling, exactly one per connection when queueing.
    fn top_up(&mut self, i: usize) {
        let c = &mut self.conns[i];
        let want = match self.mode {
            Mode::Fill(_) => FILL_PIPELINE.saturating_sub(c.in_flight),
            Mode::Queue(_) if c.in_flight == 0 && c.unsent == 0 && c.wpos == 0 && c.wbuf.is_empty() => 1,
            Mode::Queue(_) => 0,
        };
        let n = want.min(self.to_send);
        if n == 0 {
            return;
        }
        if c.wpos == c.wbuf.len() {
            c.wbuf.clear();
            c.wpos = 0;
        }
        for _ in 0..n {
            self.requests.append_acquire(&mut c.wbuf);
        }
        c.unsent += n;
        c.in_flight += n;
        self.to_send -= n;
    }

    /// Writes what is pending; false when the connection was lost.
    fn flush(&mut self, i: usize) -> bool {
        let c = &mut self.conns[i];
        let Some(stream) = c.stream.as_mut() else { return false };
        while c.wpos < c.wbuf.len() {
            match stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => return self.lose(i),
                Ok(n) => c.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.lose(i),
            }
        }
        c.wbuf.clear();
        c.wpos = 0;
        self.built.sent += std::mem::take(&mut c.unsent);
        if matches!(self.mode, Mode::Queue(n) if self.built.sent == n as u64) && self.built.built_in.is_none() {
            self.built.built_in = Some(self.started.elapsed());
            // The scripts wait for this line before they measure.
            eprintln!("queue: {} waiting acquires sent", self.built.sent);
        }
        true
    }

    /// Reads to `WouldBlock` (edge-triggered readiness) and counts every
    /// complete answer.
    fn read(&mut self, i: usize) {
        loop {
            let c = &mut self.conns[i];
            let Some(stream) = c.stream.as_mut() else { return };
            match stream.read(&mut self.scratch) {
                Ok(0) => {
                    self.lose(i);
                    return;
                }
                Ok(n) => {
                    c.rbuf.extend_from_slice(&self.scratch[..n]);
                    if !self.answers(i) {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.lose(i);
                    return;
                }
            }
        }
    }

    /// Counts the complete answers in the read buffer and refills the
    /// pipeline; false when the connection was given up.
    fn answers(&mut self, i: usize) -> bool {
        let c = &mut self.conns[i];
        let mut at = 0;
        let mut answered = 0;
        loop {
            match response::parse(&c.rbuf[at..]) {
                Ok(Parsed::Complete(r)) => {
                    at += r.len;
                    // An interim answer (100 Continue); the real one follows.
                    if (100..200).contains(&r.status) {
                        continue;
                    }
                    *self.built.statuses.entry(r.status).or_default() += 1;
                    answered += 1;
                }
                Ok(Parsed::Partial | Parsed::UntilClose { .. }) => break,
                Err(_) => {
                    c.rbuf.clear();
                    return self.lose(i);
                }
            }
        }
        c.rbuf.drain(..at);
        c.in_flight -= answered.min(c.in_flight);
        if matches!(self.mode, Mode::Fill(n) if self.built.answered() + self.built.lost == n) {
            self.built.built_in = Some(self.started.elapsed());
        }
        if c.rbuf.len() > MAX_UNPARSED {
            return self.lose(i);
        }
        self.top_up(i);
        self.flush(i)
    }

    /// The connection is gone for good: its unanswered acquires are lost.
    fn lose(&mut self, i: usize) -> bool {
        let c = &mut self.conns[i];
        if let Some(mut s) = c.stream.take() {
            // The socket is dropped right after; epoll forgets it either way.
            let _ = self.poll.registry().deregister(&mut s);
        }
        // Acquires never written were never seen by the server: another
        // connection may still send them.
        self.to_send += c.unsent;
        self.built.lost += c.in_flight - c.unsent;
        c.in_flight = 0;
        c.unsent = 0;
        c.wbuf.clear();
        c.wpos = 0;
        c.dead = true;
        false
    }
}

/// Starts a non-blocking connect, from `source` (any free port) when given.
fn connect_from(source: Option<Ipv4Addr>, addr: SocketAddr) -> io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr);
    };
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddr::from((source, 0)).into())?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// The report of a fill or queue run, as a table or as one JSON object.
pub fn table(mode: Mode, o: &Options, target: &str, b: &Built) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(t, "====== nthpool-bench {} ({target}) ======", o.addr);
    match mode {
        Mode::Fill(n) => {
            let _ = writeln!(
                t,
                "  fill: {n} acquires on pool {} over {} connections, {FILL_PIPELINE} pipelined each, left held",
                o.pool, b.connections
            );
            let took = b.built_in.unwrap_or(b.ran).as_secs_f64();
            let _ = writeln!(
                t,
                "  {} granted in {took:.2} s ({:.1} acquires/s){}",
                b.granted(),
                rate(b.answered(), took),
                if b.complete(mode) { "" } else { " -- INCOMPLETE" }
            );
        }
        Mode::Queue(n) => {
            let _ = writeln!(
                t,
                "  queue: {n} connections with one waiting acquire each (waitMs {}) on pool {}, held {:.2} s",
                o.wait_ms.unwrap_or(0),
                o.pool,
                b.ran.as_secs_f64()
            );
            let sent_in =
                b.built_in.map_or("not all sent".to_string(), |d| format!("all within {:.2} s", d.as_secs_f64()));
            let _ = writeln!(
                t,
                "  {} connected, {} sent ({sent_in}), {} granted, {} still waiting at the end{}",
                b.connected,
                b.sent,
                b.granted(),
                b.waiting(),
                if b.complete(mode) { "" } else { " -- INCOMPLETE" }
            );
        }
    }
    let _ = write!(t, "\nanswers by status");
    let _ = writeln!(t, "{}", if b.statuses.is_empty() { ": none" } else { "" });
    for (code, n) in &b.statuses {
        let _ = writeln!(t, "  {code} {n:>12}");
    }
    let _ = write!(t, "\nerrors");
    if b.connect_errors == 0 && b.lost == 0 {
        let _ = writeln!(t, ": none");
    } else {
        let _ = writeln!(t);
        if b.connect_errors > 0 {
            let _ = writeln!(t, "  connect  {:>12}", b.connect_errors);
        }
        if b.lost > 0 {
            let _ = writeln!(t, "  lost     {:>12}  (connection closed before the answer)", b.lost);
        }
    }
    if b.out_of_fds {
        let _ = writeln!(t, "  out of file descriptors: raise `ulimit -n` (each connection needs one)");
    }
    t
}

pub fn json(mode: Mode, o: &Options, target: &str, b: &Built) -> Value {
    let statuses: serde_json::Map<String, Value> =
        b.statuses.iter().map(|(c, n)| (c.to_string(), (*n).into())).collect();
    let took = b.built_in.map(|d| d.as_secs_f64());
    json!({
        "addr": o.addr,
        "target": target,
        "mode": match mode { Mode::Fill(_) => "fill", Mode::Queue(_) => "queue" },
        "pool": o.pool,
        "varyHeader": o.vary_header,
        "noReport": o.no_report,
        "requested": b.requested,
        "connections": b.connections,
        "connected": b.connected,
        "sent": b.sent,
        "granted": b.granted(),
        "waiting": b.waiting(),
        "lost": b.lost,
        "statuses": statuses,
        "connectErrors": b.connect_errors,
        "outOfFds": b.out_of_fds,
        "openAtEnd": b.open_at_end,
        "builtInS": took,
        "acquiresPerSec": match mode {
            Mode::Fill(_) => Some(rate(b.answered(), b.built_in.unwrap_or(b.ran).as_secs_f64())),
            Mode::Queue(_) => None,
        },
        "ranS": b.ran.as_secs_f64(),
        "complete": b.complete(mode),
    })
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}
