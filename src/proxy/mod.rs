//! Proxy mode (SPEC §12): the upstream connections and the exchanges that
//! use them, moved by the reactor in the same loop as every other socket.
//!
//! An `Exchange` is one proxied request: admitted through the governor like
//! an acquire, then relayed — request head and body to the upstream,
//! response head and body back — with bounded buffers on both sides: the
//! upstream is read only while the client's output is under its high-water
//! mark, and the client's body is taken only while the upstream's output is
//! under `UP_OUTPUT_HIGH`. Upstream connections live in a slab and are kept
//! per pool for reuse (`idleConnections`).
//!
//! This module owns upstream sockets (through `Transport`) but never the
//! client's: the reactor hands it the client's buffered input and output.
//! It never decides admission or writes lock-API answers; `api` does.

pub mod body;
pub mod head;
pub mod transport;
mod warned;

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use log::{debug, warn};
use slab::Slab;

use crate::api::Attempt;
use crate::config::upstream::Target;
use crate::governor::lease::SlotId;
use crate::governor::{Ms, Outcome, PoolId};
use crate::http::chunked::ChunkError;
use crate::net::resolve::{out_of_descriptors, with_port, Dial, Lookup, Resolver};
use crate::net::tls::{ClientTls, TlsError, DEFAULT_HANDSHAKE_TIMEOUT_MS};
use body::{Framing, Relay};
use head::{ClientBody, ClientSide, ResponseBody, ResponseHead};
use transport::{Security, Transport};
use warned::{Cause, Warned};

/// Above this much unsent request data, no more of the client's body is taken.
pub const UP_OUTPUT_HIGH: usize = 64 * 1024;
/// One read from an upstream; the input buffer holds at most a response head
/// (`head::MAX_RESPONSE_HEAD`) plus one read.
const UP_READ: usize = 16 * 1024;
const UP_INPUT_LIMIT: usize = head::MAX_RESPONSE_HEAD + UP_READ;

/// An upstream connection's input: a buffer zeroed once when the connection
/// opens, of which `buf[..filled]` is unprocessed.
struct InBuf {
    buf: Box<[u8]>,
    filled: usize,
}

impl InBuf {
    fn new() -> InBuf {
        InBuf { buf: vec![0; UP_INPUT_LIMIT].into_boxed_slice(), filled: 0 }
    }

    fn data(&self) -> &[u8] {
        &self.buf[..self.filled]
    }

    fn is_empty(&self) -> bool {
        self.filled == 0
    }

    fn is_full(&self) -> bool {
        self.filled + UP_READ > self.buf.len()
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.filled);
        self.buf.copy_within(n..self.filled, 0);
        self.filled -= n;
    }

    /// Room for one read.
    fn room(&mut self) -> &mut [u8] {
        &mut self.buf[self.filled..]
    }

    fn commit(&mut self, n: usize) {
        self.filled += n;
    }
}

/// One connection to an upstream.
pub struct UpConn {
    pub transport: Transport,
    pub addr: SocketAddr,
    /// The upstream it was opened to (a reload may point the pool elsewhere).
    target: Target,
    /// The TLS trust it was verified under (`ClientTls::identity`; 0 for
    /// plain HTTP): a reload may change `caFile`, and a connection verified
    /// under the old roots is not used under the new ones.
    trust: u64,
    /// The addresses not yet tried, should this connect fail.
    dial: Dial,
    pub pool: PoolId,
    /// The TCP connect completed.
    connected: bool,
    input: InBuf,
    output: Vec<u8>,
    out_pos: usize,
    /// The exchange using it; `None` while idle.
    pub exchange: Option<usize>,
    /// Bytes of the current request written: to the socket, or into the
    /// TLS session, which may still hold them.
    written: u64,
    /// A TLS session's `sent` when the current request began.
    sent_mark: u64,
    /// Taken from the idle pool (so a failure before writing may be retried).
    reused: bool,
    /// While idle: when it is closed unless taken again (`idleTimeoutMs`).
    idle_until: Ms,
    eof: bool,
    /// The connection ended otherwise than by a clean close (a reset, a TLS
    /// peer without `close_notify`): a close-delimited body was cut short.
    unclean_eof: bool,
    /// Writing the request failed (the upstream closed or reset the
    /// connection): nothing more is sent, but an answer it sent first, say
    /// a `413` at the head of a large upload, is still read and relayed.
    /// Never kept for reuse.
    send_failed: bool,
    /// The end of its TLS handshake has been counted.
    handshake_noted: bool,
    /// The socket may hold bytes not yet read: cleared when a read drains
    /// it (short, or `WouldBlock`), set again by its next readiness event.
    /// Edge-triggered epoll raises an event for every arrival, so a drained
    /// socket is not read again before one comes: the read right after a
    /// request is written, which could only end in `WouldBlock`, is not
    /// made. A TLS session may hold plaintext of its own: it is always read.
    readable: bool,
    /// The peer's FIN (or an error) was announced: reads go on to the end,
    /// since no event will announce it again.
    hangup: bool,
}

impl UpConn {
    fn unsent(&self) -> usize {
        self.output.len() - self.out_pos
    }

    /// No byte of the current request has reached the socket yet (so a
    /// reused connection that fails now may be retried): a plain one writes
    /// straight to it; a TLS session may have accepted bytes it never sent.
    fn nothing_sent(&self) -> bool {
        match &self.transport {
            Transport::Plain(_) => self.written == 0,
            Transport::Tls(s) => s.sent() == self.sent_mark,
        }
    }

    /// A failure now is retried on a fresh connection (SPEC §12).
    fn may_retry(&self) -> bool {
        self.reused && self.nothing_sent()
    }

    /// A fresh connection that failed before any of the request went out
    /// (its TLS handshake refused or cut off, say) goes on to the name's
    /// next address, as a failed connect does: nothing was written.
    fn may_try_next(&self) -> bool {
        // A session still in its handshake has sent none of the request:
        // only handshake records went out.
        let handshaking = matches!(&self.transport, Transport::Tls(s) if s.is_handshaking());
        !self.reused && (handshaking || self.nothing_sent()) && self.dial.has_next()
    }

    /// One read into the input buffer; `WouldBlock` without a system call
    /// when the socket is known to be drained.
    fn read_input(&mut self) -> io::Result<usize> {
        if !self.readable && matches!(self.transport, Transport::Plain(_)) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let room = self.input.room();
        let len = room.len();
        let read = self.transport.read(room);
        match &read {
            Ok(n) if *n > 0 && *n < len && !self.hangup => self.readable = false,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable = false,
            _ => {}
        }
        read
    }

    /// A readiness event for the socket: `readable` when it may hold bytes
    /// (or its end), `hangup` when the peer's FIN or an error was seen.
    pub fn on_event(&mut self, readable: bool, hangup: bool) {
        self.readable |= readable || hangup;
        self.hangup |= hangup;
    }
}

/// Where an exchange stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting in the pool's queue for a slot.
    Queued,
    /// Holding a slot; the request goes up and the response head is awaited.
    Sending,
    /// The response head went to the client; its body follows.
    Relaying,
}

/// One proxied request and its response.
pub struct Exchange {
    /// The client connection: slab token and serial.
    pub client: (usize, u32),
    pub pool: PoolId,
    /// The `head_key` of the upstream `head` was written for.
    pub head_key: u64,
    pub phase: Phase,
    pub slot: Option<SlotId>,
    pub attempt: Attempt,
    pub up: Option<usize>,
    /// The request head for the upstream, written when a connection is attached.
    head: Vec<u8>,
    request: Relay,
    response: Option<Relay>,
    pub client_side: ClientSide,
    pub expect_continue: bool,
    /// The governor headers for the response head.
    pub signals: Vec<u8>,
    pub response_head: Option<ResponseHead>,
    /// The upstream's `timeoutMs` and TLS settings when the exchange
    /// started: a reload changes them for the exchanges that start after it.
    pub timeout_ms: Ms,
    pub tls: Option<ClientTls>,
    /// When the head must have come (`timeoutMs`), then the request's cap.
    pub deadline: Ms,
    pub request_deadline: Ms,
    /// The pool's `requestTimeoutMs` the slot was granted under, named
    /// when it cuts the exchange.
    pub request_timeout_ms: u64,
    /// The whole request has left for the upstream: `deadline` now runs
    /// from then (the response head's `timeoutMs`).
    pub request_sent: bool,
    /// When the first byte of the request was written to the upstream.
    pub sent_at: Option<Instant>,
    /// How long it waited in the queue for its slot.
    pub queued_ms: u64,
    /// Bytes relayed to the upstream and to the client.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The client connection must close after the response (its body was not all read).
    close_client: bool,
}

impl Exchange {
    /// The client's request body has been taken whole.
    pub fn request_done(&self) -> bool {
        self.request.is_done()
    }

    /// The client's body ends at the close (an HTTP/1.0 client, sent a
    /// chunked or close-delimited answer as it comes): a clean close is its
    /// end, so one cut short must not close cleanly.
    pub fn client_body_ends_at_close(&self) -> bool {
        !self.client_side.http11
            && self.response_head.is_some_and(|h| matches!(h.body, ResponseBody::Chunked | ResponseBody::Close))
    }

    /// The method and the path without its query, from the request line
    /// the upstream is sent (the log's view of the request).
    pub fn method_and_path(&self) -> (&str, &str) {
        let line = self.head.split(|&b| b == b'\r').next().unwrap_or_default();
        let line = std::str::from_utf8(line).unwrap_or_default();
        let mut parts = line.split(' ');
        let method = parts.next().unwrap_or_default();
        let target = parts.next().unwrap_or_default();
        (method, crate::api::proxy::path_without_query(target))
    }
}

/// What a pump of an exchange came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Waiting on a socket.
    Pending,
    /// The response was relayed whole; `close_client` when the client
    /// connection cannot carry another request.
    Complete { close_client: bool },
    /// The upstream failed before the client got anything: answer `502`.
    BadGateway(&'static str),
    /// The upstream cannot be used (its TLS certificate was refused, its
    /// name does not resolve, its response head cannot be relayed): answer
    /// `502` with this sentence.
    Unusable(&'static str),
    /// A reused idle connection failed before any byte of the request was
    /// written: send the request again on a fresh connection (`reattach`).
    Retry,
    /// The upstream failed mid-response: the client's connection must close.
    Broken(&'static str),
    /// The client's request body broke its framing (or its limit): before a
    /// response began it is answered and closed, after that only closed.
    BadBody(ChunkError),
}

/// The client side of a pump: its unprocessed input and its output.
pub struct ClientIo<'a> {
    pub input: &'a [u8],
    /// Bytes of `input` the exchange took (the caller consumes them).
    pub consumed: usize,
    pub output: &'a mut Vec<u8>,
    /// How much of `output` is already written to the socket.
    pub out_pos: usize,
    pub high_water: usize,
}

impl ClientIo<'_> {
    fn has_room(&self) -> bool {
        self.output.len() - self.out_pos <= self.high_water
    }
}

/// Proxy counters, read by the metrics.
pub use crate::metrics::ProxyStats;

#[derive(Default)]
pub struct Proxy {
    pub ups: Slab<UpConn>,
    pub exchanges: Slab<Exchange>,
    /// Idle connections per pool (by `PoolId`), oldest first: taken from
    /// the back (the most recently used), closed from the front when their
    /// idle timeout passes.
    idle: Vec<Vec<usize>>,
    /// When the sweep of expired idle connections is next due on the wheel.
    sweep_at: Option<Ms>,
    /// Request-head buffers of finished exchanges, reused.
    spare: Vec<Vec<u8>>,
    /// Host names of upstreams, looked up off the loop (the reactor starts it).
    pub resolver: Option<Resolver>,
    /// Exchanges holding a slot while their upstream's name is looked up.
    resolving: Vec<usize>,
    pub stats: ProxyStats,
    /// The warnings about failing upstreams lately written (`warned.rs`).
    warned: Warned,
}

/// What attaching an upstream connection to an exchange came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Attached {
    /// A connection is attached (connecting, or reused).
    Yes,
    /// The upstream's name is being looked up; `resolved` goes on.
    Resolving,
    /// No connection can be had: answer `502` with this sentence.
    No(&'static str),
}

/// What an exchange's TLS handshake that ran out of time comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// The name has another address: the request goes there (`reattach`),
    /// with a handshake deadline of its own.
    TryNext,
    /// No address is left, or the request's own deadline has passed too:
    /// answer `502` with this sentence.
    Failed(&'static str),
    /// As `Failed`, the handshake having run out of its own time: answer
    /// `502` naming its `tlsHandshakeTimeoutMs`, this many milliseconds.
    TimedOut(u64),
}

/// How the request body is relayed: its framing in, and whether it goes up chunked.
pub fn request_relay(framing: crate::http::request::BodyFraming, max_bytes: u64) -> (Relay, head::RequestBody) {
    use crate::http::request::BodyFraming as F;
    match framing {
        F::None => (Relay::new(Framing::Length(0), false), head::RequestBody::None),
        F::Length(n) => (Relay::new(Framing::Length(n), false), head::RequestBody::Length(n)),
        F::Chunked => {
            let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
            (
                Relay::new(Framing::Chunked(crate::http::chunked::ChunkedDecoder::new(limit)), true),
                head::RequestBody::Chunked,
            )
        }
    }
}

/// How the connection of a finished exchange may be kept for reuse.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    /// The most idle connections its pool keeps (`idleConnections`).
    pub limit: usize,
    /// How long it is kept unused (`idleTimeoutMs`).
    pub idle_ms: Ms,
}

/// Everything an exchange starts with.
pub struct NewExchange {
    pub client: (usize, u32),
    pub pool: PoolId,
    /// The `head_key` of the upstream its head was written for.
    pub head_key: u64,
    pub attempt: Attempt,
    pub request: Relay,
    pub client_side: ClientSide,
    pub expect_continue: bool,
}

impl Proxy {
    /// Proxy state whose upstream names are looked up by `resolver`.
    pub fn new(resolver: Resolver) -> Proxy {
        Proxy { resolver: Some(resolver), ..Proxy::default() }
    }

    /// A buffer for a new exchange's upstream request head.
    pub fn head_buffer(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b
    }

    pub fn open(&mut self, new: NewExchange, head: Vec<u8>) -> usize {
        let signals = self.head_buffer();
        self.exchanges.insert(Exchange {
            client: new.client,
            pool: new.pool,
            head_key: new.head_key,
            phase: Phase::Queued,
            slot: None,
            attempt: new.attempt,
            up: None,
            head,
            request: new.request,
            response: None,
            client_side: new.client_side,
            expect_continue: new.expect_continue,
            signals,
            response_head: None,
            timeout_ms: 0,
            tls: None,
            deadline: Ms::MAX,
            request_deadline: Ms::MAX,
            request_timeout_ms: 0,
            request_sent: false,
            sent_at: None,
            queued_ms: 0,
            bytes_up: 0,
            bytes_down: 0,
            close_client: false,
        })
    }

    /// The exchange got its slot: attach a connection (an idle one that is
    /// still open, else a new one to an address of `target`) and queue the
    /// request head on it.
    pub fn attach(
        &mut self,
        ex: usize,
        target: &Target,
        tls: Option<&ClientTls>,
        now: Ms,
        registry: &mio::Registry,
        base: usize,
    ) -> Attached {
        let pool = self.exchanges[ex].pool;
        if let Some(idx) = self.take_idle(pool, target, tls.map_or(0, ClientTls::identity), registry) {
            self.attach_to(ex, idx, true, None);
            return Attached::Yes;
        }
        let addrs = match self.resolver.as_mut().map(|r| r.lookup(&target.name, now)) {
            Some(Lookup::Ready(addrs)) => with_port(addrs, target.port),
            Some(Lookup::Pending) => {
                self.resolving.push(ex);
                return Attached::Resolving;
            }
            Some(Lookup::Failed(err)) => {
                let why = err.sentence();
                if let Some(unlogged) = self.warned.allow("lookup", &target.authority, Cause::Said(why)) {
                    warn!("upstream {}: {err}{unlogged}", target.authority);
                }
                return self.not_opened(pool, why);
            }
            None => {
                return self.not_opened(pool, "The upstream's host name cannot be resolved: the resolver has stopped.")
            }
        };
        let Some(security) = security(target, tls, now) else {
            return self.not_opened(pool, NO_TLS_SETTINGS);
        };
        match self.connect(pool, target, Dial::new(addrs), security, registry, base) {
            Ok(idx) => {
                self.attach_to(ex, idx, false, None);
                Attached::Yes
            }
            Err(err) => {
                // Counted (an attempt, and an error) by `connect`.
                debug!("cannot connect to the upstream {}: {err}", target.authority);
                Attached::No("The upstream could not be reached.")
            }
        }
    }

    /// A connection of `pool` that could not even be begun (its name does
    /// not resolve): an attempt that failed to open, counted as both.
    fn not_opened(&mut self, pool: PoolId, why: &'static str) -> Attached {
        self.stats.upstream_connects += 1;
        self.stats.connect_error(pool.0 as usize);
        Attached::No(why)
    }

    /// Takes the answers the resolver thread has sent, and the exchanges
    /// that waited for a name (the caller attaches each again).
    pub fn resolved(&mut self, now: Ms) -> Vec<usize> {
        if let Some(r) = self.resolver.as_mut() {
            r.take_answers(now, |_| {});
        }
        std::mem::take(&mut self.resolving)
    }

    /// After `Step::Retry` (or `Expired::TryNext`): the failed connection is
    /// closed and the request goes on a new one, to the next address when a
    /// connect or a TLS handshake failed, else (a reused connection failed)
    /// to the same one, never retried again.
    pub fn reattach(
        &mut self,
        ex: usize,
        tls: Option<&ClientTls>,
        now: Ms,
        registry: &mio::Registry,
        base: usize,
    ) -> io::Result<()> {
        self.stats.retries += 1;
        let idx = self.exchanges[ex].up.take().expect("a retried exchange had a connection");
        let up = &mut self.ups[idx];
        // Nothing reached the socket, and the output is kept whole until
        // something does: it is the whole request so far.
        let pending = std::mem::take(&mut up.output);
        let dial = match up.dial.has_next() && !up.reused {
            true => std::mem::replace(&mut up.dial, Dial::new(Vec::new())),
            false => Dial::new(vec![up.addr]),
        };
        let (pool, target) = (up.pool, up.target.clone());
        self.close_up(idx, registry);
        let security = security(&target, tls, now).ok_or_else(|| io::Error::other(NO_TLS_SETTINGS))?;
        let idx = self.connect(pool, &target, dial, security, registry, base)?;
        self.attach_to(ex, idx, false, Some(pending));
        Ok(())
    }

    fn attach_to(&mut self, ex: usize, idx: usize, reused: bool, pending: Option<Vec<u8>>) {
        if reused {
            self.stats.upstream_reuses += 1;
        }
        let up = &mut self.ups[idx];
        up.exchange = Some(ex);
        up.written = 0;
        up.sent_mark = match &up.transport {
            Transport::Tls(s) => s.sent(),
            Transport::Plain(_) => 0,
        };
        up.reused = reused;
        let e = &mut self.exchanges[ex];
        e.up = Some(idx);
        e.phase = Phase::Sending;
        match pending {
            Some(bytes) => up.output = bytes,
            None => up.output.extend_from_slice(&e.head),
        }
    }

    fn connect(
        &mut self,
        pool: PoolId,
        target: &Target,
        mut dial: Dial,
        security: Security,
        registry: &mio::Registry,
        base: usize,
    ) -> io::Result<usize> {
        self.stats.upstream_connects += 1;
        let trust = security.tls.map_or(0, ClientTls::identity);
        let (mut transport, addr) = loop {
            match Transport::connect(&mut dial, security) {
                // Idle connections are kept only for reuse: out of
                // descriptors, one goes for the one needed now.
                Err(e) if out_of_descriptors(&e) && self.close_oldest_idle(registry) => {}
                done => break done.inspect_err(|_| self.stats.connect_error(pool.0 as usize))?,
            }
        };
        let entry = self.ups.vacant_entry();
        let idx = entry.key();
        registry
            .register(transport.tcp(), mio::Token(base + idx), mio::Interest::READABLE | mio::Interest::WRITABLE)
            .inspect_err(|_| self.stats.connect_error(pool.0 as usize))?;
        entry.insert(UpConn {
            transport,
            addr,
            target: target.clone(),
            trust,
            dial,
            pool,
            connected: false,
            input: InBuf::new(),
            output: Vec::new(),
            out_pos: 0,
            exchange: None,
            written: 0,
            sent_mark: 0,
            reused: false,
            idle_until: Ms::MAX,
            eof: false,
            unclean_eof: false,
            send_failed: false,
            handshake_noted: false,
            readable: true,
            hangup: false,
        });
        Ok(idx)
    }

    /// Whether the client's body has been taken whole and the upstream
    /// connection has no request bytes left to write.
    pub fn request_flushed(&self, ex: usize) -> bool {
        let e = &self.exchanges[ex];
        e.request.is_done() && e.up.is_some_and(|i| self.ups[i].unsent() == 0)
    }

    /// At the timer of an exchange still sending: the client stalled its
    /// body (the upstream took all that came and waits for the rest), as
    /// opposed to an upstream that did not take or did not answer.
    pub fn client_body_stalled(&self, ex: usize) -> bool {
        let e = &self.exchanges[ex];
        !e.request.is_done() && e.up.is_some_and(|i| self.ups[i].connected && self.ups[i].unsent() == 0)
    }

    /// When the exchange's timer must fire: its own deadline, or sooner the
    /// TLS handshake's.
    pub fn deadline(&self, ex: usize) -> Ms {
        let e = &self.exchanges[ex];
        let handshake = e.up.and_then(|i| self.ups[i].transport.handshake_deadline());
        handshake.map_or(e.deadline, |h| h.min(e.deadline))
    }

    /// At the exchange's timer: what comes of its TLS handshake if that ran
    /// out of time (`None` if it did not).
    pub fn handshake_expired(&mut self, ex: usize, now: Ms) -> Option<Expired> {
        let e = &self.exchanges[ex];
        let (idx, deadline) = (e.up?, e.deadline);
        let up = &mut self.ups[idx];
        let err = up.transport.check_deadline(now).err()?;
        // Nothing of the request went out, so the name's next address may
        // have it, as after a handshake cut off; not once the request's own
        // deadline has passed, which no new handshake could meet.
        if now < deadline && up.may_try_next() {
            if let Some(unlogged) = self.warned.allow("handshake", &up.target.authority, Cause::Said("next")) {
                warn!(
                    "the upstream {} at {} did not finish its TLS handshake in time; trying its next address{unlogged}",
                    up.target.authority, up.addr
                );
            }
            up.dial.failed(up.addr, io::Error::new(io::ErrorKind::TimedOut, err));
            return Some(Expired::TryNext);
        }
        self.stats.tls_failures += 1;
        if let Some(unlogged) = self.warned.allow("tls", &up.target.authority, Cause::Said(err.sentence())) {
            warn!("TLS with the upstream {} at {}: {err}{unlogged}", up.target.authority, up.addr);
        }
        up.eof = true;
        match (&err, &e.tls) {
            (TlsError::HandshakeTimeout, Some(tls)) => Some(Expired::TimedOut(tls.handshake_timeout_ms())),
            _ => Some(Expired::Failed(err.sentence())),
        }
    }

    /// The exchange ran out of time: a TCP connect still under way failed
    /// to open in time, and counts as a connection error like a refused one.
    pub fn note_connect_timed_out(&mut self, ex: usize) {
        let Some(idx) = self.exchanges[ex].up else { return };
        let up = &self.ups[idx];
        if !up.connected {
            debug!("the upstream {} at {} did not accept the connection in time", up.target.authority, up.addr);
            self.stats.connect_error(up.pool.0 as usize);
        }
    }

    /// The most recently used idle connection of `pool` to `target` that
    /// has not been closed by the upstream meanwhile; the dead ones found on
    /// the way are closed.
    fn take_idle(&mut self, pool: PoolId, target: &Target, trust: u64, registry: &mio::Registry) -> Option<usize> {
        while let Some(idx) = self.idle.get_mut(pool.0 as usize)?.pop() {
            let up = &mut self.ups[idx];
            let mut probe = [0u8; 1];
            let alive = up.target == *target
                && up.trust == trust
                && matches!(up.transport.read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
            if alive {
                // Drained: nothing is read again before its next readiness event.
                up.readable = false;
                return Some(idx);
            }
            let _ = up.transport.tcp().shutdown(std::net::Shutdown::Both);
            self.close_up(idx, registry);
        }
        None
    }

    /// An exchange is over: its connection goes back to the idle pool when
    /// `reusable` (and the pool has room), else it is closed. Returns the
    /// exchange, for its slot and counters (`retire` it afterwards), and
    /// when a sweep must be put on the wheel for the connection kept idle.
    pub fn finish(
        &mut self,
        ex: usize,
        reusable: bool,
        keep: Keep,
        now: Ms,
        registry: &mio::Registry,
    ) -> (Exchange, Option<Ms>) {
        let mut e = self.exchanges.remove(ex);
        let mut sweep = None;
        if let Some(at) = self.resolving.iter().position(|&w| w == ex) {
            self.resolving.swap_remove(at);
        }
        if let Some(idx) = e.up.take() {
            let up = &mut self.ups[idx];
            up.exchange = None;
            let clean =
                reusable && up.connected && !up.eof && !up.send_failed && up.unsent() == 0 && up.input.is_empty();
            let list = {
                let pid = up.pool.0 as usize;
                if self.idle.len() <= pid {
                    self.idle.resize_with(pid + 1, Vec::new);
                }
                &mut self.idle[pid]
            };
            if clean && list.len() < keep.limit {
                up.output.clear();
                up.out_pos = 0;
                up.idle_until = now.saturating_add(keep.idle_ms);
                list.push(idx);
                sweep = self.sweep_by(now.saturating_add(keep.idle_ms));
            } else {
                self.close_up(idx, registry);
            }
        }
        (e, sweep)
    }

    /// A connection goes idle until `at`: the time to put a sweep on the
    /// wheel for, unless one comes by then.
    fn sweep_by(&mut self, at: Ms) -> Option<Ms> {
        if self.sweep_at.is_some_and(|due| due <= at) {
            return None;
        }
        self.sweep_at = Some(at);
        Some(at)
    }

    /// A sweep came due: closes the idle connections whose idle timeout has
    /// passed (the upstream sees them closed). Returns when the next sweep
    /// must be put on the wheel, if one is needed and none is there by then.
    pub fn close_expired(&mut self, now: Ms, registry: &mio::Registry) -> Option<Ms> {
        if self.sweep_at.is_some_and(|due| due <= now) {
            self.sweep_at = None;
        }
        let mut next = Ms::MAX;
        for pid in 0..self.idle.len() {
            while let Some(&idx) = self.idle[pid].first() {
                let until = self.ups[idx].idle_until;
                if until > now {
                    next = next.min(until);
                    break;
                }
                debug!("closing an upstream connection idle past its idle timeout");
                self.close_up(idx, registry);
            }
        }
        (next < Ms::MAX).then(|| self.sweep_by(next)).flatten()
    }

    /// Keeps a finished exchange's buffers for the next one.
    pub fn retire(&mut self, e: Exchange) {
        self.spare.push(e.head);
        self.spare.push(e.signals);
    }

    pub fn close_up(&mut self, idx: usize, registry: &mio::Registry) {
        let mut up = self.ups.remove(idx);
        let _ = registry.deregister(up.transport.tcp());
        if let Some(list) = self.idle.get_mut(up.pool.0 as usize) {
            if let Some(at) = list.iter().position(|&i| i == idx) {
                // In order: the list stays oldest first.
                list.remove(at);
            }
        }
    }

    /// An idle connection had an event: unless it only says the socket is
    /// writable (which tells nothing), the upstream closed it or sent bytes
    /// nobody asked for, and the connection is done.
    pub fn on_idle_event(&mut self, idx: usize, readable: bool, registry: &mio::Registry) {
        if !readable {
            return;
        }
        let up = &mut self.ups[idx];
        let mut probe = [0u8; 64];
        match up.transport.read(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            _ => self.close_up(idx, registry),
        }
    }

    /// Closes the idle connection, of any pool, that would expire first:
    /// whether there was one. For a descriptor the process ran out of.
    pub fn close_oldest_idle(&mut self, registry: &mio::Registry) -> bool {
        let ups = &self.ups;
        let oldest = self.idle.iter().filter_map(|list| list.first().copied()).min_by_key(|&idx| ups[idx].idle_until);
        if let Some(idx) = oldest {
            debug!("out of descriptors: closing an idle upstream connection");
            self.close_up(idx, registry);
        }
        oldest.is_some()
    }

    /// When `write_trailing_warnings` next has a line to write, if ever.
    pub fn warnings_due(&self) -> Option<std::time::Instant> {
        self.warned.due()
    }

    /// Counts in the log the warnings about upstreams left out in a second
    /// that has ended with none like them written (all of them, at the stop).
    pub fn write_trailing_warnings(&mut self, all: bool) {
        self.warned.write_trailing(all);
    }

    /// Idle connections kept, over all pools.
    pub fn idle_total(&self) -> usize {
        self.idle.iter().map(Vec::len).sum()
    }

    /// The counters as of now, idle connections counted, into `into`.
    pub fn stats_into(&self, into: &mut ProxyStats) {
        *into = self.stats.clone();
        into.total.idle = self.idle_total() as u64;
        for (pool, list) in self.idle.iter().enumerate() {
            into.pool(pool).idle = list.len() as u64;
        }
    }

    /// Moves the exchange as far as its sockets and buffers allow.
    pub fn pump(&mut self, ex: usize, client: &mut ClientIo, now_epoch_ms: u64) -> Step {
        let e = &mut self.exchanges[ex];
        let Some(idx) = e.up else {
            return Step::Pending;
        };
        let up = &mut self.ups[idx];
        match relay(e, up, &mut self.stats, &mut self.warned, client, now_epoch_ms) {
            Ok(step) | Err(Halt::Now(step)) => step,
            Err(Halt::Tls(err)) => self.tls_failed(ex, err),
            Err(Halt::Upstream(why)) => self.upstream_failed(ex, why),
        }
    }

    /// The TLS session failed: logged with its cause; before the response
    /// began the client is told the cause in one sentence.
    fn tls_failed(&mut self, ex: usize, err: TlsError) -> Step {
        self.stats.tls_failures += 1;
        let e = &self.exchanges[ex];
        if let Some(up) = e.up.map(|i| &mut self.ups[i]) {
            if let Some(unlogged) = self.warned.allow("tls", &up.target.authority, Cause::Said(err.sentence())) {
                warn!("TLS with the upstream {} at {}: {err}{unlogged}", up.target.authority, up.addr);
            }
            up.eof = true;
        }
        match e.phase {
            Phase::Relaying => Step::Broken("the TLS session with the upstream failed"),
            _ => Step::Unusable(err.sentence()),
        }
    }

    fn upstream_failed(&mut self, ex: usize, why: &'static str) -> Step {
        let e = &self.exchanges[ex];
        if let Some(up) = e.up.map(|i| &mut self.ups[i]) {
            up.eof = true;
        }
        if e.phase == Phase::Relaying {
            Step::Broken(why)
        } else {
            Step::BadGateway(why)
        }
    }

    /// The outcome report of a finished exchange, from the upstream's answer.
    pub fn outcome(e: &Exchange, failure: Option<u16>) -> Option<Outcome> {
        match (e.response_head, failure) {
            (_, Some(status)) => Some(Outcome { status: Some(status), ..Outcome::default() }),
            (Some(rh), None) => Some(Outcome { status: Some(rh.status), throttled: 0, rate: rh.rate }),
            (None, None) => None,
        }
    }
}

/// Why a pump stops before its sockets would block.
enum Halt {
    /// This is the pump's step.
    Now(Step),
    /// The TLS session with the upstream failed (`Proxy::tls_failed`).
    Tls(TlsError),
    /// The upstream failed (`Proxy::upstream_failed`), for this reason.
    Upstream(&'static str),
}

/// The pump's loop: request bytes up, response bytes down, until a side
/// must wait or the exchange ends.
fn relay(
    e: &mut Exchange,
    up: &mut UpConn,
    stats: &mut ProxyStats,
    warned: &mut Warned,
    client: &mut ClientIo,
    now_epoch_ms: u64,
) -> Result<Step, Halt> {
    up.finish_connect(stats, warned)?;
    loop {
        let wrote = e.send(up, stats, warned, client)?;
        let mut progressed = e.take_head(up, client, now_epoch_ms)?;
        progressed |= e.relay_body(up, client)?;
        if let Some(step) = e.completed(up) {
            return Ok(step);
        }
        if up.eof {
            e.end_of_input(up, client)?;
            continue;
        }
        // Read more only while the client keeps up.
        if !client.has_room() {
            return Ok(Step::Pending);
        }
        // What was taken may have left the next head (after an interim
        // answer) or more body in the input: no read event will announce it.
        if progressed && !up.input.is_empty() {
            continue;
        }
        if up.input.is_full() {
            return Ok(Step::Pending);
        }
        // More of the body may fit now that some was written.
        let more_body = wrote && !e.request.is_done();
        if !up.fill(warned)? && !more_body && !progressed {
            return Ok(Step::Pending);
        }
    }
}

impl UpConn {
    /// Completes the TCP connect; a failed one is warned of (at most once a
    /// second) and goes on to the next address, or without one left is a
    /// `502`.
    fn finish_connect(&mut self, stats: &mut ProxyStats, warned: &mut Warned) -> Result<(), Halt> {
        if self.connected {
            return Ok(());
        }
        match Dial::check(self.transport.tcp()) {
            Ok(true) => {
                self.connected = true;
                Ok(())
            }
            Ok(false) => Err(Halt::Now(Step::Pending)),
            Err(err) => {
                stats.connect_error(self.pool.0 as usize);
                let next = self.dial.has_next();
                if let Some(unlogged) = warned.allow("connect", &self.target.authority, Cause::Io(err.kind())) {
                    let then = if next { "trying its next address" } else { "no address left: answered 502" };
                    warn!(
                        "the upstream {} at {}: connecting failed ({err}); {then}{unlogged}",
                        self.target.authority, self.addr
                    );
                }
                self.dial.failed(self.addr, err);
                Err(Halt::Now(if next { Step::Retry } else { Step::BadGateway("connect failed") }))
            }
        }
    }

    /// This address failed before the request was sent: warned of (at most
    /// once a second), kept as the dial's last error, and the next one tried.
    fn try_next_address(&mut self, warned: &mut Warned, err: io::Error) -> Halt {
        if let Some(unlogged) = warned.allow("failed", &self.target.authority, Cause::Io(err.kind())) {
            warn!(
                "the upstream {} at {} failed before the request was sent ({err}); trying its next address{unlogged}",
                self.target.authority, self.addr
            );
        }
        self.dial.failed(self.addr, err);
        Halt::Now(Step::Retry)
    }

    /// One read of what the upstream sent; `false` when nothing was there.
    fn fill(&mut self, warned: &mut Warned) -> Result<bool, Halt> {
        match self.read_input() {
            Ok(0) if self.may_try_next() => {
                if let Some(unlogged) = warned.allow("closed", &self.target.authority, Cause::Said("next")) {
                    warn!(
                        "the upstream {} at {} closed before the request was sent; trying its next address{unlogged}",
                        self.target.authority, self.addr
                    );
                }
                return Err(Halt::Now(Step::Retry));
            }
            Ok(0) => self.eof = true,
            Ok(n) => self.input.commit(n),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock || err.kind() == io::ErrorKind::Interrupted => {
                return Ok(false)
            }
            Err(_) if self.may_retry() => return Err(Halt::Now(Step::Retry)),
            Err(err) if self.may_try_next() => return Err(self.try_next_address(warned, err)),
            Err(err) => {
                if let Some(tls) = TlsError::of(&err) {
                    return Err(Halt::Tls(tls.clone()));
                }
                // A reset, or TLS ended without `close_notify`: not the
                // clean close that ends a close-delimited body.
                debug!("reading from the upstream failed: {err}");
                self.eof = true;
                self.unclean_eof = true;
            }
        }
        Ok(true)
    }
}

impl Exchange {
    /// The client's body onto the upstream's output, then out; `true` when
    /// bytes reached the upstream.
    fn send(
        &mut self,
        up: &mut UpConn,
        stats: &mut ProxyStats,
        warned: &mut Warned,
        client: &mut ClientIo,
    ) -> Result<bool, Halt> {
        if up.send_failed {
            return Ok(false);
        }
        if !self.request.is_done() && up.unsent() < UP_OUTPUT_HIGH {
            let input = &client.input[client.consumed..];
            let room = (UP_OUTPUT_HIGH - up.unsent()).min(input.len());
            let before = up.output.len();
            match self.request.pump(&input[..room], &mut up.output) {
                Ok(n) => client.consumed += n,
                Err(err) => return Err(Halt::Now(Step::BadBody(err))),
            }
            self.bytes_up += (up.output.len() - before) as u64;
        }
        let written_before = up.written;
        if !up.handshake_noted && up.transport.handshake_deadline().is_none() {
            // The TLS handshake is over (or there was none): counted once.
            up.handshake_noted = true;
            stats.tls_resumed += u64::from(up.transport.resumed());
        }
        if let Err(err) = flush(up) {
            if up.may_retry() {
                debug!("reused upstream connection failed before the request: {err}");
                return Err(Halt::Now(Step::Retry));
            }
            if up.may_try_next() {
                return Err(up.try_next_address(warned, err));
            }
            if let Some(tls) = TlsError::of(&err) {
                return Err(Halt::Tls(tls.clone()));
            }
            // What it answered before it closed is read on: with no answer,
            // its end is a 502 (`end_of_input`).
            debug!("writing the request to the upstream failed ({err}); reading what it answered");
            up.send_failed = true;
            up.output.clear();
            up.out_pos = 0;
            up.hangup = true;
            return Ok(false);
        }
        let wrote = up.written > written_before;
        if wrote && self.sent_at.is_none() {
            // `upstreamMs` runs from the first byte sent: none when nothing was.
            self.sent_at = Some(Instant::now());
        }
        Ok(wrote)
    }

    /// Takes the response head once all of it has arrived, its client
    /// version going out; `true` when a head (interim or final) was taken.
    fn take_head(&mut self, up: &mut UpConn, client: &mut ClientIo, now_epoch_ms: u64) -> Result<bool, Halt> {
        if self.phase != Phase::Sending || up.input.is_empty() {
            return Ok(false);
        }
        // An answer that comes before the whole request body closes the
        // client's connection (the rest of the body cannot be told from a
        // next request), and says so in its head.
        let side = match self.request.is_done() {
            true => self.client_side,
            false => head::ClientSide { keep_alive: false, ..self.client_side },
        };
        let taken = head::take_response(up.input.data(), side, &self.signals, now_epoch_ms, client.output);
        let (rh, to_client) = match taken {
            Ok(None) => return Ok(false),
            Ok(Some(taken)) => taken,
            Err(head::ResponseError::Invalid(why)) => {
                // Its answer cannot be relayed: the client's `502` says why.
                debug!("the upstream's response head cannot be relayed: {why}");
                up.eof = true;
                return Err(Halt::Now(Step::Unusable(why)));
            }
        };
        up.input.consume(rh.len);
        if rh.status >= 200 {
            let framing = match rh.body {
                ResponseBody::None => Framing::Length(0),
                ResponseBody::Length(n) => Framing::Length(n),
                ResponseBody::Chunked => Framing::Chunked(crate::http::chunked::ChunkedDecoder::new(usize::MAX)),
                ResponseBody::Close => Framing::Close,
            };
            self.response = Some(Relay::new(framing, to_client == ClientBody::Chunked));
            self.close_client |= to_client == ClientBody::Close || !side.keep_alive;
            self.response_head = Some(rh);
            self.phase = Phase::Relaying;
            self.deadline = self.request_deadline;
        }
        Ok(true)
    }

    /// What arrived of the response body, to the client while it has room;
    /// `true` when any was taken.
    fn relay_body(&mut self, up: &mut UpConn, client: &mut ClientIo) -> Result<bool, Halt> {
        if self.phase != Phase::Relaying || up.input.is_empty() || !client.has_room() {
            return Ok(false);
        }
        let relay = self.response.as_mut().expect("relaying has a relay");
        let before = client.output.len();
        let n = relay
            .pump(up.input.data(), client.output)
            .map_err(|_| Halt::Upstream("bad chunked framing from the upstream"))?;
        up.input.consume(n);
        self.bytes_down += (client.output.len() - before) as u64;
        Ok(n > 0)
    }

    /// `Complete` once the response is relayed whole, the connection
    /// marked for closing unless it can carry the pool's next request.
    fn completed(&mut self, up: &mut UpConn) -> Option<Step> {
        if self.phase != Phase::Relaying || !self.response.as_ref().is_some_and(Relay::is_done) {
            return None;
        }
        let rh = self.response_head.expect("relaying has a head");
        // A request body not whole now was not at the head either: the
        // client's connection is marked for closing already (`take_head`).
        if !(rh.keep_alive && self.request.is_done() && !up.eof) {
            up.eof = true;
        }
        Some(Step::Complete { close_client: self.close_client })
    }

    /// The upstream's input has ended: the end of a close-delimited body
    /// (`Ok`, the response is then complete), or a failure.
    fn end_of_input(&mut self, up: &UpConn, client: &mut ClientIo) -> Result<(), Halt> {
        if self.phase != Phase::Relaying {
            return Err(Halt::Upstream("the upstream closed before answering"));
        }
        let relay = self.response.as_mut().expect("relaying has a relay");
        if up.unclean_eof && relay.close_delimited() {
            return Err(Halt::Now(Step::Broken(
                "the upstream reset the connection, or ended TLS without close_notify, inside a close-delimited body",
            )));
        }
        let before = client.output.len();
        if !relay.end_of_input(client.output) {
            return Err(Halt::Now(Step::Broken("the upstream closed mid-response")));
        }
        self.bytes_down += (client.output.len() - before) as u64;
        Ok(())
    }
}

/// How a new connection to `target` is secured: TLS with its name and a
/// handshake deadline from `now`, or plain. `None` when the TLS settings do
/// not match the target, so an `https://` upstream is never spoken to in
/// plain text.
fn security<'a>(target: &'a Target, tls: Option<&'a ClientTls>, now: Ms) -> Option<Security<'a>> {
    (target.tls == tls.is_some()).then(|| Security {
        tls,
        name: &target.name,
        handshake_deadline: now
            .saturating_add(tls.map_or(DEFAULT_HANDSHAKE_TIMEOUT_MS, ClientTls::handshake_timeout_ms)),
    })
}

const NO_TLS_SETTINGS: &str = "The upstream's TLS settings do not match its URL.";

/// Writes the connection's pending output; counts request bytes written.
fn flush(up: &mut UpConn) -> io::Result<()> {
    while up.out_pos < up.output.len() {
        match up.transport.write(&up.output[up.out_pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                up.out_pos += n;
                up.written += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // A request that may still be retried (or sent to the name's next
    // address) stays whole for that. A
    // body sent to a slower upstream never empties the buffer: the sent part
    // is dropped once it outweighs the rest (each byte moved at most once).
    let sent = up.out_pos;
    if sent > 0 && sent >= up.output.len() - sent && !up.may_retry() && !up.may_try_next() {
        up.output.drain(..sent);
        up.out_pos = 0;
    }
    match up.transport.flush() {
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
