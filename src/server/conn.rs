//! One client connection: its buffers, its request in progress, its phase,
//! its per-turn budget and its deadline.
//!
//! What a request means is `api`'s business: a connection only carries
//! what `api` hands it to keep (the verdicts of its last heads, its place
//! in a queue) and the index of its proxied exchange. The loop that moves
//! bytes is in `server/mod.rs`, and the requests are answered in
//! `server/pipeline.rs`.
//!
//! A connection is in one [`Phase`] at a time:
//!
//! ```text
//!   Open ──acquire queued──▶ Waiting ──answered──▶ Open
//!    │                          │ (Connection: close, or the client went away)
//!    └──last answer written─────┴──────────────▶ Closing ──flushed──▶ Lingering ──EOF or deadline──▶ closed
//! ```
//!
//! Orthogonal to the phase are the socket's readiness facts (`readable`,
//! `hangup`, `read_closed`), each a bool the reactor keeps.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::TcpStream;

use crate::api::{PoolId, Queued, SlotId, Verdicts};
use crate::http::chunked::ChunkedDecoder;
use crate::http::request::HeadMemo;
use crate::time::Ms;
use crate::wheel::TimerKey;

pub const NEVER: Ms = u64::MAX;

/// How long a connection may take over each phase (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A request head (and its body) must arrive within this.
    pub head_ms: u64,
    /// A keep-alive connection with nothing to do is closed after this.
    pub idle_ms: u64,
    /// A client that does not read its answers for this long is closed.
    pub write_ms: u64,
}
/// Above this much unsent output, no more requests are read from the client
/// (nor, for a proxied answer, from the upstream). The buffer holds at most
/// twice what is unsent (`drop_sent`), and one answer or one upstream read
/// (16 KiB) may pass the mark: so it stays within 256 KiB.
pub const OUTPUT_HIGH_WATER: usize = 112 * 1024;
/// The most a stop reads and drops from one connection before closing it
/// (`Conn::discard_input`), and a client cut off for not reading its answers
/// while it lingers (`Conn::drain_until`): a client still sending past it
/// gets a reset.
pub const DISCARD_AT_CLOSE: usize = 4 << 20;
const INITIAL_INPUT: usize = 4096;
/// Buffers grown to this (a power of two) are given back once their connection has
/// nothing pending (`Conn::trim_if_idle`): what one large body or burst of
/// answers grew them to is not kept by a connection that then sits idle
/// for minutes. They grow again if it needs them.
pub const KEEP_IDLE_BYTES: usize = 64 * 1024;
const _: () = assert!(KEEP_IDLE_BYTES.is_power_of_two());

/// What one socket operation came to (sozu's `SocketResult`, trimmed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    /// Progress was made and more may be possible.
    Continue,
    /// A read took less than it had room for: the socket is empty for now.
    Drained,
    /// The kernel has nothing more (or no room); wait for readiness.
    WouldBlock,
    /// The peer closed (EOF on read).
    Closed,
    /// The peer reset the connection: what it sent is still answered in
    /// effect (a release still releases), but nothing can be written to it.
    Reset,
}

/// What a flush came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Everything was written.
    Done,
    /// The socket is full; the rest waits for writability.
    Pending,
    /// The peer is gone.
    Closed,
}

/// Input bytes: `buf[start..end]` is unprocessed. `buf` is zero-filled once
/// when it grows, so reads never re-initialise memory.
pub struct Input {
    pub buf: Vec<u8>,
    pub start: usize,
    pub end: usize,
    limit: usize,
}

impl Input {
    fn new(limit: usize) -> Input {
        Input { buf: Vec::new(), start: 0, end: 0, limit }
    }

    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Whether all it holds is (part of) the one empty line a client may
    /// send after a request (RFC 9112 §2.2: some end a POST body with an
    /// extra CRLF), which the next parse would skip: no request has begun.
    pub fn only_empty_line(&self) -> bool {
        matches!(self.data(), [b'\r'] | [b'\n'] | [b'\r', b'\n'])
    }

    pub fn consume(&mut self, n: usize) {
        self.start += n;
        debug_assert!(self.start <= self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Room to read into, compacting or growing up to the limit; `None` when full.
    fn room(&mut self) -> Option<&mut [u8]> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.buf.len() < self.limit {
                let grown = (self.buf.len() * 2).clamp(INITIAL_INPUT, self.limit);
                // Exactly: grown to the limit, it is not rounded up past it.
                self.buf.reserve_exact(grown - self.buf.len());
                self.buf.resize(grown, 0);
            } else {
                return None;
            }
        }
        Some(&mut self.buf[self.end..])
    }
}

/// Reads per connection per turn before the others get their go.
pub const READ_BUDGET: u32 = 8;
/// Bytes read per connection per turn: a turn's length does not grow with
/// what each client has waiting in its socket (hundreds of clients sending
/// large bodies would otherwise each be read megabytes at a time, and every
/// other client, health checks included, would wait for all of it).
pub const READ_BYTES_BUDGET: usize = 16 * 1024;
/// Requests answered per connection per turn before the others get their
/// go: a client pipelining thousands of requests is served this many, then
/// waits for the next turn like everyone else.
pub const REQUEST_BUDGET: u32 = 16;

/// What a connection may still do in the current reactor turn. However
/// often a turn comes back to a connection (a read, a flush that made room,
/// a queued answer), it draws on the same budget.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    turn: u64,
    pub reads: u32,
    pub requests: u32,
    pub bytes: usize,
}

impl Budget {
    fn new(turn: u64) -> Budget {
        Budget { turn, reads: READ_BUDGET, requests: REQUEST_BUDGET, bytes: READ_BYTES_BUDGET }
    }

    /// Whether this turn's requests are spent (the reads and bytes are
    /// counted where the socket is read).
    pub fn requests_spent(&self) -> bool {
        self.requests == 0
    }
}

/// Where a connection is in its life (see the module doc).
#[derive(Debug)]
pub enum Phase {
    /// Requests are read and answered in order.
    Open,
    /// An acquire waits in its pool's queue; what was pipelined behind it
    /// waits too. `close`: its answer ends the connection; `http10_keep_alive`:
    /// it is an HTTP/1.0 request that asked to keep it, so an answer that does
    /// must say so.
    Waiting { queued: Queued, close: bool, http10_keep_alive: bool },
    /// The last answer is written (or being written); nothing more is
    /// answered, and the connection closes once the output is out.
    Closing,
    /// Answered and half-closed by us: unread input is drained and dropped
    /// until the peer closes or `until`, so the kernel does not answer that
    /// input with a reset that could destroy the answer in flight.
    Lingering { until: Ms },
}

/// A request whose head is complete but whose body is still arriving.
pub struct PendingBody {
    /// For chunked bodies: the decoder and the raw bytes it has eaten (the
    /// body so far is in `Conn::body`).
    pub chunked: Option<(ChunkedDecoder, usize)>,
    pub continue_sent: bool,
    /// For a `Content-Length` body: the input bytes the request takes, head
    /// and whole body. Until the input holds them its head is not parsed
    /// again (a body arriving in many reads would cost a parse per read)...
    pub need: usize,
    /// ...while the body limit is the one it was judged under (a reload
    /// that lowers it refuses the body at the next read, not once it is in).
    pub max_body: usize,
}

pub struct Conn {
    pub stream: TcpStream,
    /// The peer's address, an IPv4-mapped one (a dual-stack listener's) as
    /// IPv4: logs, `ipAllow` and `trustedProxies` see one spelling.
    pub peer: SocketAddr,
    pub serial: u32,
    /// Accepted on the admin listener: only admin routes are served.
    pub admin: bool,
    /// Its deadline passed with answers pending and a write was tried at
    /// the end of that turn; the next check closes it unless the write went
    /// through (`Server::on_conn_timer`).
    pub write_probed: bool,
    /// Registered for writability too: once a write left output unsent.
    /// Until then only reads are watched, so the ACKs of answers a client
    /// took at once wake nobody.
    pub watch_writable: bool,
    /// The last write left output the socket would not take: writing again
    /// waits for its writable edge (trying before would find it full).
    pub write_blocked: bool,
    /// Accepted over its listener's budget: its only answer is the `503`
    /// it was given, then it lingers and closes (counted apart).
    pub refused: bool,
    /// Bytes read and written, for the server's counters.
    pub received: u64,
    /// Lingering, it is closed once `received` passes this: a client cut
    /// off for not reading is drained for `DISCARD_AT_CLOSE` bytes at most.
    pub drain_until: u64,
    pub sent: u64,
    pub input: Input,
    pub output: Vec<u8>,
    pub out_pos: usize,
    /// How far the current head has been searched for its end.
    pub head_scanned: usize,
    /// The header blocks this client sent last, already judged.
    pub head_memo: HeadMemo,
    /// What the lock API found those heads to be (pool, client, kind).
    pub verdicts: Verdicts,
    pub pending: Option<PendingBody>,
    /// Decoded chunked body (reused between requests).
    pub body: Vec<u8>,
    phase: Phase,
    budget: Budget,
    /// Grants written to `output` but not yet sent: released if the connection dies first.
    pub undelivered: Vec<(SlotId, usize)>,
    /// The peer sent its FIN (or reset): nothing more will arrive.
    pub read_closed: bool,
    /// The peer reset the connection (`Io::Reset`).
    pub reset: bool,
    /// Closed with a reset once its output is written (`reset_at_close`).
    pub resets: bool,
    /// The socket may hold unread input (edge-triggered readiness, remembered
    /// until a read finds it empty).
    pub readable: bool,
    /// Listed in the server's flush list for this turn.
    pub dirty: bool,
    /// Listed to be resumed next turn (`Server::ready`, `Server::postponed`
    /// or, from the turn's end, `Server::ready_carry`).
    pub carried: bool,
    /// The peer's FIN was reported: read to EOF even after a short read.
    pub hangup: bool,
    pub request_started: Option<Ms>,
    /// A stop began while a request of it was arriving: that request is
    /// answered (with `Connection: close`) if it completes within the
    /// grace, and the connection then closes.
    pub last_request: bool,
    /// A stop began: the requests it had read are answered, and the one
    /// that ends its input is the last, its answer saying `Connection:
    /// close` (RFC 9112 §9.6); those before it keep the connection for it.
    pub stopping: bool,
    pub last_active: Ms,
    /// When bytes were last read into the input: no request complete in it
    /// was read later (one that waits there behind a queued acquire was
    /// read earlier than the turn that comes to it).
    pub read_at: Ms,
    pub out_since: Ms,
    pub timer: Option<(Ms, TimerKey)>,
    /// Accepted on a pool's own proxy listener: every request is proxied for it.
    pub listener_pool: Option<PoolId>,
    /// The proxied exchange this connection is in (`crate::proxy`), and
    /// when it must end if nothing changes.
    pub exchange: Option<usize>,
    pub exchange_deadline: Ms,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: SocketAddr, serial: u32, admin: bool, input_limit: usize, now: Ms) -> Conn {
        Conn {
            stream,
            peer: SocketAddr::new(peer.ip().to_canonical(), peer.port()),
            serial,
            admin,
            refused: false,
            write_probed: false,
            watch_writable: false,
            write_blocked: false,
            received: 0,
            drain_until: u64::MAX,
            sent: 0,
            input: Input::new(input_limit),
            output: Vec::new(),
            out_pos: 0,
            head_scanned: 0,
            head_memo: HeadMemo::default(),
            verdicts: Verdicts::default(),
            pending: None,
            body: Vec::new(),
            phase: Phase::Open,
            budget: Budget::new(0),
            undelivered: Vec::new(),
            read_closed: false,
            reset: false,
            resets: false,
            readable: false,
            dirty: false,
            carried: false,
            hangup: false,
            request_started: None,
            last_request: false,
            stopping: false,
            last_active: now,
            read_at: now,
            out_since: now,
            timer: None,
            listener_pool: None,
            exchange: None,
            exchange_deadline: NEVER,
        }
    }

    pub fn unsent(&self) -> usize {
        self.output.len() - self.out_pos
    }

    /// The bytes its buffers hold allocated: input, answers, a decoded body.
    pub fn buffered(&self) -> usize {
        self.input.buf.len() + self.output.capacity() + self.body.capacity()
    }

    /// Gives back buffers grown to `KEEP_IDLE_BYTES` when nothing is
    /// pending: called as the last answer leaves (`flush`), with the input
    /// read to its end (nginx frees a keep-alive connection's large buffers
    /// the same way). A client that sends such bodies one after another
    /// grows them again for each.
    #[cold]
    #[inline(never)]
    fn trim_if_idle(&mut self) {
        let idle = self.unsent() == 0
            && self.input.is_empty()
            && self.pending.is_none()
            && self.request_started.is_none()
            && self.exchange.is_none();
        if idle {
            self.input = Input::new(self.input.limit);
            self.output = Vec::new();
            self.out_pos = 0;
            self.body = Vec::new();
        }
    }

    /// Whether requests may be answered now (not waiting, not closing).
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    pub fn is_waiting(&self) -> bool {
        matches!(self.phase, Phase::Waiting { .. })
    }

    /// Closing or lingering: no more answers.
    pub fn is_closing(&self) -> bool {
        matches!(self.phase, Phase::Closing | Phase::Lingering { .. })
    }

    /// Whether the connection ends once its output is written (or, waiting,
    /// once its queued answer is).
    pub fn closes_after_flush(&self) -> bool {
        self.is_closing() || matches!(self.phase, Phase::Waiting { close: true, .. })
    }

    pub fn is_lingering(&self) -> bool {
        matches!(self.phase, Phase::Lingering { .. })
    }

    /// A request of it is arriving, or waits to be read, with no answer
    /// written or decided for it: what closing it now leaves unanswered (an
    /// acquire among them is logged as such, as is any request on a pool's
    /// own proxy listener; one relayed is its exchange's to log).
    pub fn has_unanswered_request(&self) -> bool {
        self.request_started.is_some()
            && !self.input.is_empty()
            && !self.closes_after_flush()
            && !self.is_lingering()
            && !self.admin
            && !self.refused
            && self.exchange.is_none()
    }

    /// Open → Waiting: an acquire was queued.
    pub fn wait(&mut self, queued: Queued, close: bool, http10_keep_alive: bool) {
        debug_assert!(self.is_open(), "only an open connection queues an acquire: {:?}", self.phase);
        self.phase = Phase::Waiting { queued, close, http10_keep_alive };
    }

    /// The acquire this connection waits on, if it waits.
    pub fn queued(&self) -> Option<&Queued> {
        match &self.phase {
            Phase::Waiting { queued, .. } => Some(queued),
            _ => None,
        }
    }

    /// The peer has stopped sending: its FIN was read, or reported (`hangup`)
    /// while input before it is still unread (a full input buffer).
    pub fn peer_done_sending(&self) -> bool {
        self.read_closed || self.hangup
    }

    /// The waiting acquire's request asked to close after its answer.
    pub fn waits_to_close(&self) -> bool {
        matches!(self.phase, Phase::Waiting { close: true, .. })
    }

    /// The waiting acquire's answer must say the connection is kept (HTTP/1.0).
    pub fn waits_http10_keep_alive(&self) -> bool {
        matches!(self.phase, Phase::Waiting { http10_keep_alive: true, close: false, .. })
    }

    /// Waiting → Open (or Closing when its answer ends the connection): the
    /// queued acquire is answered or withdrawn. Returns it and whether the
    /// answer must close; `None` when nothing waits.
    pub fn stop_waiting(&mut self) -> Option<(Queued, bool)> {
        let Phase::Waiting { queued, close, .. } = self.phase else {
            return None;
        };
        self.phase = if close { Phase::Closing } else { Phase::Open };
        Some((queued, close))
    }

    /// Open → Closing: the answer just written is the last. Closing again
    /// is harmless; a waiting acquire is taken first (`stop_waiting`).
    pub fn close_after_flush(&mut self) {
        debug_assert!(!self.is_waiting(), "a waiting acquire is answered before closing: {:?}", self.phase);
        if !self.is_closing() {
            self.phase = Phase::Closing;
        }
    }

    /// Closes after its output with a reset (`SO_LINGER` 0), not a FIN: for
    /// an answer cut short whose body a close would end, the reset is the
    /// only sign left to the client that it is not whole.
    pub fn reset_at_close(&mut self) {
        self.close_after_flush();
        self.resets = socket2::SockRef::from(&self.stream).set_linger(Some(std::time::Duration::ZERO)).is_ok();
    }

    /// Closing → Lingering until `until`.
    pub fn linger(&mut self, until: Ms) {
        debug_assert!(matches!(self.phase, Phase::Closing), "only a closing connection lingers: {:?}", self.phase);
        self.phase = Phase::Lingering { until };
    }

    /// This turn's budget: fresh on the connection's first visit of `turn`.
    pub fn budget(&mut self, turn: u64) -> &mut Budget {
        if self.budget.turn != turn {
            self.budget = Budget::new(turn);
        }
        &mut self.budget
    }

    /// A request of `consumed` bytes (head and body) was answered this
    /// turn: it leaves the input and the turn's budget, and the next one, if
    /// any of it has arrived, started arriving `now`.
    #[inline]
    pub fn request_answered(&mut self, turn: u64, consumed: usize, now: Ms) {
        self.request_taken(turn, consumed);
        self.request_started = (!self.input.is_empty()).then_some(now);
    }

    /// A request's head was taken by a proxied exchange, which streams its
    /// body (if any) from the input from now on: the head leaves the input
    /// and the turn's budget, and what was read of the body for the lock
    /// API before a reload made this a proxied request is forgotten.
    pub fn head_proxied(&mut self, turn: u64, head_len: usize) {
        self.request_taken(turn, head_len);
        self.request_started = None;
    }

    /// Whatever took a request: `consumed` bytes leave the input, and no
    /// body is pending any more (its state belongs to that request only).
    #[inline]
    fn request_taken(&mut self, turn: u64, consumed: usize) {
        self.budget(turn).requests -= 1;
        self.input.consume(consumed);
        self.pending = None;
        self.head_scanned = 0;
    }

    /// No request limit for the rest of this turn (shutdown answers all that was read).
    pub fn lift_budget(&mut self, turn: u64) {
        self.budget(turn).requests = u32::MAX;
    }

    /// When this connection must be closed if nothing changes.
    pub fn deadline(&self, t: &Timeouts) -> Ms {
        match self.phase {
            Phase::Lingering { until } => return until,
            // The queue deadline answers it; the wheel holds that one. A
            // waiter that leaves earlier answers unread is still a client
            // that does not read: the wait does not suspend `write_ms`.
            Phase::Waiting { .. } if self.unsent() == 0 => return NEVER,
            Phase::Waiting { .. } => return self.out_since + t.write_ms,
            Phase::Open | Phase::Closing => {}
        }
        // A proxied exchange has its own deadlines (upstream timeout, request cap).
        let mut at = match self.request_started {
            _ if self.exchange.is_some() => self.exchange_deadline,
            // Answers past the high-water mark hold reading back, so a head
            // can wait in the socket on the server: its time runs from the
            // last write that made room, not from before the wait. Nor is a
            // connection idle while the client takes its answers.
            Some(started) => started.max(self.out_since) + t.head_ms,
            None => self.last_active.max(self.out_since) + t.idle_ms,
        };
        if self.unsent() > 0 {
            at = at.min(self.out_since + t.write_ms);
        }
        at
    }

    /// Reads once into the input buffer, at most `max` bytes.
    pub fn read_once(&mut self, max: usize) -> io::Result<Io> {
        let Some(room) = self.input.room() else {
            return Ok(Io::WouldBlock);
        };
        let room_len = room.len().min(max);
        let room = &mut room[..room_len];
        match self.stream.read(room) {
            Ok(0) => Ok(Io::Closed),
            Ok(n) => {
                self.input.end += n;
                self.received += n as u64;
                Ok(if n < room_len { Io::Drained } else { Io::Continue })
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Io::WouldBlock),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Io::Continue),
            Err(e) if is_reset(&e) => Ok(Io::Reset),
            Err(e) => Err(e),
        }
    }

    /// Whether reading now makes sense: input may be waiting, and there is
    /// room for it and for the answers it would produce.
    pub fn may_read(&self) -> bool {
        self.readable && !self.read_closed && !self.input_full() && self.unsent() <= OUTPUT_HIGH_WATER
    }

    /// Whether the input buffer is at its limit (reading must wait for processing).
    pub fn input_full(&self) -> bool {
        self.input.end == self.input.buf.len() && self.input.start == 0 && self.input.buf.len() >= self.input.limit
    }

    /// One write of the pending output, whatever it takes: the last words
    /// of a connection the stop is about to close (what it took counts as
    /// sent, so the grants left unsent are known).
    #[cold]
    pub fn write_last(&mut self) {
        if let Ok(n) = self.stream.write(&self.output[self.out_pos..]) {
            self.out_pos += n;
        }
    }

    /// Reads and drops what the client sent that will never be answered (at
    /// most `DISCARD_AT_CLOSE` bytes), so that closing sends a FIN: closed
    /// with unread input, the socket would send a reset, and the client's
    /// kernel would drop the answers it already holds, grants included,
    /// which the stop's snapshot counts as delivered.
    /// Returns how much it dropped.
    #[cold]
    pub fn discard_input(&mut self) -> usize {
        let mut scratch = [0u8; 16 * 1024];
        let mut dropped = 0;
        while dropped < DISCARD_AT_CLOSE {
            match self.stream.read(&mut scratch) {
                Ok(0) => break,
                Ok(n) => dropped += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        dropped
    }

    /// Writes as much pending output as the socket takes.
    pub fn flush(&mut self, now: Ms) -> io::Result<Flush> {
        while self.out_pos < self.output.len() {
            match self.stream.write(&self.output[self.out_pos..]) {
                Ok(0) => return Ok(Flush::Closed),
                Ok(n) => {
                    self.out_pos += n;
                    self.sent += n as u64;
                    self.out_since = now;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_reset(&e) => return Ok(Flush::Closed),
                Err(e) => return Err(e),
            }
        }
        let sent = self.out_pos;
        if sent == self.output.len() {
            self.output.clear();
            self.out_pos = 0;
            self.undelivered.clear();
            // One of them is at least the (power-of-two) mark when their OR is.
            if (self.input.buf.len() | self.output.capacity() | self.body.capacity()) >= KEEP_IDLE_BYTES {
                self.trim_if_idle();
            }
            Ok(Flush::Done)
        } else {
            self.undelivered.retain(|&(_, end)| end > sent);
            if sent >= self.output.len() - sent {
                self.drop_sent();
            }
            Ok(Flush::Pending)
        }
    }

    /// A stream relayed to a slower reader never empties the buffer: the
    /// sent part is dropped once it outweighs the rest, so the buffer stays
    /// within twice what is unsent and each byte is moved at most once.
    #[cold]
    #[inline(never)]
    fn drop_sent(&mut self) {
        let sent = self.out_pos;
        self.output.drain(..sent);
        self.out_pos = 0;
        for (_, end) in &mut self.undelivered {
            *end -= sent;
        }
    }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe)
}
