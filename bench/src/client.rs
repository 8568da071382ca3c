//! One event-loop thread driving its share of the connections.
//!
//! A `mio` poll owns every socket of the thread; each connection is a small
//! state machine (connect → send → read → decide the next request) with one
//! request in flight. Timers that decide *when* the next request may go (hold
//! time, back-off, the open-loop schedule, reconnect delay) sit in a binary heap
//! with lazy invalidation; request timeouts are found by a coarse scan, since a
//! per-request heap entry would pile up stale entries at 100k+ requests/s.
//! The thread never shares state with the others while running: it returns its
//! [`Stats`] when done.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::options::Options;
use crate::request::Requests;
use crate::response::{self, Parsed};
use crate::stats::{Endpoint, Failure, Stats};

const READ_CHUNK: usize = 16 * 1024;
/// A body beyond this is a misconfigured target, not something to benchmark.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;
/// How often timeouts are looked for; their precision need not beat this.
const TIMEOUT_SCAN: u64 = 10_000_000;
/// A refused connect is retried after this pause so a missing server does not
/// turn the run into a busy loop of failing syscalls.
const CONNECT_RETRY: u64 = 100_000_000;
/// Pause before reopening a connection that failed mid-request.
const REOPEN_DELAY: u64 = 1_000_000;
/// `ready_at` when the workload asks for no pause. It must not be "now": in
/// the open loop that would move the schedule up to the present and silently
/// skip the requests a stalled server has made late (coordinated omission).
const NO_PAUSE: u64 = 0;

/// The time `len` after `from`, or no constraint at all for a zero pause.
fn pause(from: u64, len: u64) -> u64 {
    if len == 0 {
        NO_PAUSE
    } else {
        from + len
    }
}

/// Events handled per connection per wake-up before giving the others a turn.
const READS_PER_EVENT: usize = 64;

/// Run-wide clock and bounds, shared read-only by all threads.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub origin: Instant,
    /// Answers to requests intended before this are warm-up, not measured.
    pub measure_from: u64,
    /// No new cycle starts at or after this; held slots are then released.
    pub measure_until: u64,
}

impl Clock {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn measured(&self, intended: u64) -> bool {
        (self.measure_from..self.measure_until).contains(&intended)
    }
}

/// This thread's share of the run.
#[derive(Debug, Clone, Copy)]
pub struct Share {
    /// Index of the thread's first connection among all of them, to stagger
    /// the open-loop schedule across threads.
    pub first: usize,
    pub connections: usize,
    pub budget: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Closed,
    Connecting,
    Open,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Acquire,
    Renew,
    Release,
    Get,
}

struct Conn {
    stream: Option<TcpStream>,
    link: Link,
    next: Next,
    in_flight: Option<Endpoint>,
    /// When the in-flight request should have been sent; latency starts here.
    intended: u64,
    /// In-flight request or pending connect fails after this.
    expires: u64,
    /// The next request may not go before this (hold, back-off, reconnect).
    ready_at: u64,
    /// Open loop: the next slot of this connection's fixed schedule.
    tick: u64,
    granted_at: u64,
    /// When the connection last became free to send (answer or connect).
    free_at: u64,
    renews_done: u32,
    slot: Vec<u8>,
    rbuf: Vec<u8>,
    rlen: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    /// Bumped whenever a wake-up is scheduled; older heap entries are stale.
    generation: u32,
    done: bool,
}

pub struct Client<'a> {
    opts: &'a Options,
    requests: &'a Requests,
    addr: SocketAddr,
    clock: Clock,
    poll: Poll,
    conns: Vec<Conn>,
    timers: BinaryHeap<Reverse<(u64, usize, u32)>>,
    /// Nanoseconds between two requests of one connection, open loop only.
    interval: Option<u64>,
    budget: Option<u64>,
    stats: Stats,
    stopping: bool,
    /// Connections whose read was cut short by the per-event cap.
    resume: Vec<usize>,
}

impl<'a> Client<'a> {
    pub fn new(
        opts: &'a Options,
        requests: &'a Requests,
        addr: SocketAddr,
        clock: Clock,
        share: Share,
    ) -> io::Result<Client<'a>> {
        let interval = opts.rate.map(|r| (opts.connections as f64 * 1e9 / r).max(1.0) as u64);
        let first_next = if opts.get.is_some() { Next::Get } else { Next::Acquire };
        let conns = (0..share.connections)
            .map(|i| Conn {
                stream: None,
                link: Link::Closed,
                next: first_next,
                in_flight: None,
                intended: 0,
                expires: u64::MAX,
                ready_at: NO_PAUSE,
                // Global index × (1/R) spreads all connections' first requests
                // evenly over one interval, so the total rate is smooth.
                tick: opts.rate.map_or(0, |r| ((share.first + i) as f64 * 1e9 / r) as u64),
                granted_at: 0,
                free_at: 0,
                renews_done: 0,
                slot: Vec::with_capacity(64),
                rbuf: vec![0; READ_CHUNK],
                rlen: 0,
                wbuf: Vec::with_capacity(512),
                wpos: 0,
                generation: 0,
                done: false,
            })
            .collect();
        Ok(Client {
            opts,
            requests,
            addr,
            clock,
            poll: Poll::new()?,
            conns,
            timers: BinaryHeap::with_capacity(share.connections * 2),
            interval,
            budget: share.budget,
            stats: Stats::default(),
            stopping: false,
            resume: Vec::with_capacity(share.connections),
        })
    }

    /// Runs until every connection is done (or a grace period after the end
    /// has passed) and returns what was measured.
    pub fn run(mut self) -> io::Result<Stats> {
        let mut events = Events::with_capacity(1024);
        let now = self.clock.now();
        for i in 0..self.conns.len() {
            self.connect(i, now);
        }
        // Releases still in flight at the end get one timeout plus a second.
        let hard_stop = self.clock.measure_until + self.opts.timeout.as_nanos() as u64 + 1_000_000_000;
        let mut next_scan = now + TIMEOUT_SCAN;
        loop {
            let now = self.clock.now();
            if !self.stopping && now >= self.clock.measure_until {
                self.stop(now);
            }
            if self.conns.iter().all(|c| c.done) || now >= hard_stop {
                break;
            }
            if now >= next_scan {
                self.expire(now);
                next_scan = now + TIMEOUT_SCAN;
            }
            self.fire_timers(now);

            let mut wake = next_scan.min(hard_stop);
            if !self.stopping {
                wake = wake.min(self.clock.measure_until);
            }
            if let Some(Reverse((at, _, _))) = self.timers.peek() {
                wake = wake.min(*at);
            }
            let now = self.clock.now();
            let wait = wake.saturating_sub(now);
            // epoll sleeps in whole milliseconds, rounded up. The open-loop
            // schedule must not drift by that much, or the client itself would
            // add up to 1 ms to every measured latency: it sleeps until less
            // than a millisecond is left and polls without sleeping from there.
            let timeout = if !self.resume.is_empty() {
                Duration::ZERO
            } else if self.interval.is_some() {
                Duration::from_nanos(wait.saturating_sub(1_000_000))
            } else {
                Duration::from_nanos(wait)
            };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for event in events.iter() {
                let i = event.token().0;
                if i < self.conns.len() {
                    self.ready(i, event.is_read_closed() || event.is_error());
                }
            }
            if !self.resume.is_empty() {
                // A read may hit its cap again and queue itself for the next turn.
                let mut turn = std::mem::take(&mut self.resume);
                for &i in &turn {
                    self.ready(i, true);
                }
                turn.clear();
                if self.resume.is_empty() {
                    self.resume = turn;
                }
            }
        }
        Ok(self.stats)
    }

    fn fire_timers(&mut self, now: u64) {
        while let Some(&Reverse((at, i, generation))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let c = &self.conns[i];
            if c.generation != generation || c.done {
                continue;
            }
            match c.link {
                Link::Closed => self.connect(i, now),
                Link::Open if c.in_flight.is_none() => self.advance(i, now),
                _ => {}
            }
        }
    }

    fn wake_at(&mut self, i: usize, at: u64) {
        let c = &mut self.conns[i];
        c.generation = c.generation.wrapping_add(1);
        self.timers.push(Reverse((at, i, c.generation)));
    }

    /// The measuring window closed: idle connections release what they hold
    /// or finish; busy ones do the same when their answer arrives.
    fn stop(&mut self, now: u64) {
        self.stopping = true;
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            if c.done || c.in_flight.is_some() {
                continue;
            }
            match c.link {
                Link::Open => self.advance(i, now),
                // Reconnecting with a slot: it will be released once open.
                Link::Closed if c.slot.is_empty() => self.finish(i),
                Link::Closed | Link::Connecting => {}
            }
        }
    }

    fn expire(&mut self, now: u64) {
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            if c.expires > now || c.done {
                continue;
            }
            match (c.link, c.in_flight) {
                (Link::Connecting, _) => self.connect_failed(i, now),
                (Link::Open, Some(_)) => self.fail(i, Failure::Timeout, now),
                _ => {}
            }
        }
    }

    fn connect(&mut self, i: usize, now: u64) {
        if self.stopping && self.conns[i].slot.is_empty() {
            return self.finish(i);
        }
        let mut stream = match TcpStream::connect(self.addr) {
            Ok(s) => s,
            Err(_) => return self.connect_failed(i, now),
        };
        if self.poll.registry().register(&mut stream, Token(i), Interest::READABLE | Interest::WRITABLE).is_err() {
            return self.connect_failed(i, now);
        }
        let c = &mut self.conns[i];
        c.stream = Some(stream);
        c.link = Link::Connecting;
        c.expires = now + self.opts.timeout.as_nanos() as u64;
        c.rlen = 0;
        c.wpos = 0;
        c.wbuf.clear();
    }

    fn connect_failed(&mut self, i: usize, now: u64) {
        self.close(i);
        if now >= self.clock.measure_from {
            self.stats.connect_errors += 1;
        }
        self.wake_at(i, now + CONNECT_RETRY);
    }

    fn close(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if let Some(mut s) = c.stream.take() {
            // Deregistering a socket that is about to be dropped cannot fail in
            // a way that matters: dropping it removes it from epoll anyway.
            let _ = self.poll.registry().deregister(&mut s);
        }
        c.link = Link::Closed;
        c.in_flight = None;
        c.expires = u64::MAX;
        c.rlen = 0;
        c.wpos = 0;
        c.wbuf.clear();
    }

    fn finish(&mut self, i: usize) {
        self.close(i);
        self.conns[i].done = true;
    }

    /// A request died without an answer.
    fn fail(&mut self, i: usize, why: Failure, now: u64) {
        let c = &self.conns[i];
        if let Some(ep) = c.in_flight {
            if self.clock.measured(c.intended) {
                self.stats.failure(ep, why);
            }
        }
        self.close(i);
        let c = &mut self.conns[i];
        if c.slot.is_empty() {
            c.next = if self.opts.get.is_some() { Next::Get } else { Next::Acquire };
        } else {
            // Slot ids are not tied to a connection, and release is
            // idempotent: give the slot back over the new connection rather
            // than leave it to the server's reclaim.
            c.next = Next::Release;
        }
        c.ready_at = NO_PAUSE;
        self.wake_at(i, now + REOPEN_DELAY);
    }

    /// Readiness on connection `i`.
    /// `closing`: the event reported a hang-up or error, so the socket must be
    /// read to its end even after a short read.
    fn ready(&mut self, i: usize, closing: bool) {
        let now = self.clock.now();
        match self.conns[i].link {
            Link::Closed => {}
            Link::Connecting => self.finish_connect(i, now),
            Link::Open => {
                if !self.flush(i, now) {
                    return;
                }
                self.read(i, closing);
            }
        }
    }

    fn finish_connect(&mut self, i: usize, now: u64) {
        let Some(stream) = self.conns[i].stream.as_ref() else {
            return;
        };
        // mio's documented way to learn a non-blocking connect's outcome: an
        // error is final; NotConnected means the event was spurious.
        match stream.take_error() {
            Ok(None) => {}
            _ => return self.connect_failed(i, now),
        }
        match stream.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotConnected => return,
            Err(_) => return self.connect_failed(i, now),
        }
        // Requests are small and latency-bound; Nagle would hold them back.
        if stream.set_nodelay(true).is_err() {
            return self.connect_failed(i, now);
        }
        let c = &mut self.conns[i];
        c.link = Link::Open;
        c.expires = u64::MAX;
        c.free_at = now;
        self.advance(i, now);
    }

    /// Sends the connection's next request, or schedules it, or ends the
    /// connection when the run is over.
    fn advance(&mut self, i: usize, now: u64) {
        let c = &mut self.conns[i];
        debug_assert!(c.in_flight.is_none() && c.link == Link::Open);
        let out_of_budget = self.budget == Some(0);
        let holding = matches!(c.next, Next::Renew | Next::Release);
        if self.stopping || out_of_budget {
            if holding {
                // Always give the slot back so the next run starts from an
                // empty pool; skip renews and waiting out the hold.
                c.next = Next::Release;
                if self.stopping {
                    c.ready_at = NO_PAUSE;
                }
            } else {
                return self.finish(i);
            }
        }
        let mut at = if self.stopping { now } else { c.ready_at };
        if let (Some(interval), false) = (self.interval, self.stopping) {
            at = at.max(c.tick);
            if at <= now {
                c.tick = at + interval;
            }
        }
        if at > now {
            return self.wake_at(i, at);
        }
        // Closed loop: the request is meant to go now. Open loop: it was meant
        // to go at its schedule slot, however late the connection got free.
        let intended = if self.interval.is_some() { at } else { now };
        let ep = match c.next {
            Next::Acquire => {
                self.requests.acquire(&mut c.wbuf);
                Endpoint::Acquire
            }
            Next::Renew => {
                self.requests.renew(&c.slot, &mut c.wbuf);
                Endpoint::Renew
            }
            Next::Release => {
                self.requests.release(&c.slot, &mut c.wbuf);
                Endpoint::Release
            }
            Next::Get => {
                self.requests.get(&mut c.wbuf);
                Endpoint::Get
            }
        };
        c.wpos = 0;
        c.in_flight = Some(ep);
        c.intended = intended;
        c.expires = now + self.opts.timeout.as_nanos() as u64;
        if self.clock.measured(intended) {
            if let Some(b) = self.budget.as_mut() {
                *b = b.saturating_sub(1);
            }
            if self.interval.is_some() {
                // Only the client's own lateness: time spent waiting for the
                // previous answer is the server's and is in the latency.
                let lag = now.saturating_sub(intended.max(c.free_at));
                self.stats.send_lag.saturating_record(lag / 1000 + 1);
            }
        }
        self.flush(i, now);
    }

    /// Writes what is pending; false when the connection was lost.
    fn flush(&mut self, i: usize, now: u64) -> bool {
        let c = &mut self.conns[i];
        let Some(stream) = c.stream.as_mut() else {
            return false;
        };
        while c.wpos < c.wbuf.len() {
            match stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => {
                    self.fail(i, Failure::Closed, now);
                    return false;
                }
                Ok(n) => c.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(i, Failure::Reset, now);
                    return false;
                }
            }
        }
        true
    }

    /// Reads until the socket is drained (edge-triggered readiness), handling
    /// each complete answer as it arrives.
    ///
    /// A read that does not fill the buffer has emptied the socket, and bytes
    /// arriving later raise a new edge; stopping there instead of reading on
    /// to `WouldBlock` saves one syscall per answer, a third of the client's
    /// system calls. A hang-up does not raise a second edge, so `closing`
    /// turns the shortcut off.
    fn read(&mut self, i: usize, closing: bool) {
        for _ in 0..READS_PER_EVENT {
            let now = self.clock.now();
            let c = &mut self.conns[i];
            let Some(stream) = c.stream.as_mut() else {
                return;
            };
            if c.rlen == c.rbuf.len() {
                if c.rbuf.len() >= MAX_RESPONSE {
                    return self.fail(i, Failure::BadResponse, now);
                }
                c.rbuf.resize(c.rbuf.len() * 2, 0);
            }
            match stream.read(&mut c.rbuf[c.rlen..]) {
                Ok(0) => return self.eof(i, now),
                Ok(n) => {
                    let short = c.rlen + n < c.rbuf.len();
                    c.rlen += n;
                    if !self.answers(i, now) || (short && !closing) {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, Failure::Reset, now),
            }
        }
        // Still readable after the cap: come back on the next loop turn rather
        // than starve the other connections (edge-triggered, so no new event).
        self.resume.push(i);
    }

    /// Handles every complete answer in the read buffer; false when the
    /// connection was closed meanwhile.
    fn answers(&mut self, i: usize, now: u64) -> bool {
        loop {
            let c = &mut self.conns[i];
            if c.rlen == 0 || c.link != Link::Open {
                return c.link == Link::Open;
            }
            let parsed = if self.opts.redis.is_some() {
                response::parse_resp(&c.rbuf[..c.rlen])
            } else {
                response::parse(&c.rbuf[..c.rlen])
            };
            let r = match parsed {
                Ok(Parsed::Complete(r)) => r,
                Ok(Parsed::Partial | Parsed::UntilClose { .. }) => return true,
                Err(_) => {
                    self.fail(i, Failure::BadResponse, now);
                    return false;
                }
            };
            if (100..200).contains(&r.status) {
                // An interim answer (100 Continue); the real one follows.
                c.rbuf.copy_within(r.len..c.rlen, 0);
                c.rlen -= r.len;
                continue;
            }
            let Some(ep) = c.in_flight else {
                // Nothing was asked: an unsolicited answer (408 before an
                // idle close, for instance) is not a measured result.
                let close = r.close;
                c.rbuf.copy_within(r.len..c.rlen, 0);
                c.rlen -= r.len;
                if close {
                    self.reopen_idle(i, now);
                    return false;
                }
                continue;
            };
            let granted = ep == Endpoint::Acquire && (200..300).contains(&r.status);
            if granted {
                c.slot.clear();
                let body = &c.rbuf[r.body.clone()];
                let id = if self.opts.redis.is_some() { response::redis_id(body) } else { response::slot_id(body) };
                if let Some(id) = id {
                    c.slot.extend_from_slice(id);
                } else {
                    self.fail(i, Failure::BadResponse, now);
                    return false;
                }
            }
            c.rbuf.copy_within(r.len..c.rlen, 0);
            c.rlen -= r.len;
            self.answered(i, ep, r.status, now);
            if r.close {
                // The next step is decided; it goes out on a new connection.
                self.close(i);
                let at = self.conns[i].ready_at.max(now);
                self.wake_at(i, at);
                return false;
            }
            if self.conns[i].in_flight.is_none() && !self.conns[i].done {
                self.advance(i, now);
            }
        }
    }

    /// Records an answer and decides what the connection does next.
    fn answered(&mut self, i: usize, ep: Endpoint, status: u16, now: u64) {
        let c = &mut self.conns[i];
        c.in_flight = None;
        c.expires = u64::MAX;
        c.free_at = now;
        let measured = self.clock.measured(c.intended);
        if measured {
            self.stats.answer(ep, status, now - c.intended, now);
        }
        let ok = (200..300).contains(&status);
        let hold = self.opts.hold.as_nanos() as u64;
        let renews = self.opts.renews;
        // Renew k of K goes at k/(K+1) of the hold, the release at its end.
        let renew_at = |granted: u64, k: u32| pause(granted, hold * u64::from(k) / u64::from(renews + 1));
        match ep {
            Endpoint::Acquire if ok => {
                c.granted_at = now;
                c.renews_done = 0;
                if renews > 0 {
                    c.next = Next::Renew;
                    c.ready_at = renew_at(now, 1);
                } else {
                    c.next = Next::Release;
                    c.ready_at = pause(now, hold);
                }
            }
            Endpoint::Acquire => {
                // Denied (429/504) or refused: start the cycle over.
                c.next = Next::Acquire;
                c.ready_at = pause(now, self.opts.backoff.as_nanos() as u64);
            }
            Endpoint::Renew if status == 404 => {
                // The slot is gone (reclaimed); there is nothing to release.
                c.slot.clear();
                c.next = Next::Acquire;
                c.ready_at = NO_PAUSE;
            }
            Endpoint::Renew => {
                c.renews_done += 1;
                if ok && c.renews_done < renews {
                    c.next = Next::Renew;
                    c.ready_at = renew_at(c.granted_at, c.renews_done + 1);
                } else {
                    // Last renew, or 409 capped: release at the end of the hold.
                    c.next = Next::Release;
                    c.ready_at = pause(c.granted_at, hold);
                }
            }
            Endpoint::Release => {
                if measured {
                    self.stats.cycles += 1;
                }
                c.slot.clear();
                c.next = Next::Acquire;
                c.ready_at = NO_PAUSE;
            }
            Endpoint::Get => {
                c.next = Next::Get;
                c.ready_at = NO_PAUSE;
            }
        }
    }

    fn eof(&mut self, i: usize, now: u64) {
        let c = &mut self.conns[i];
        if let Some(ep) = c.in_flight {
            // A body delimited by the close is complete now.
            if let Ok(Parsed::UntilClose { status, body_start }) = response::parse(&c.rbuf[..c.rlen]) {
                if ep == Endpoint::Acquire && (200..300).contains(&status) {
                    c.slot.clear();
                    match response::slot_id(&c.rbuf[body_start..c.rlen]) {
                        Some(id) => c.slot.extend_from_slice(id),
                        None => return self.fail(i, Failure::BadResponse, now),
                    }
                }
                self.answered(i, ep, status, now);
                self.close(i);
                let at = self.conns[i].ready_at.max(now);
                return self.wake_at(i, at);
            }
            return self.fail(i, Failure::Closed, now);
        }
        self.reopen_idle(i, now);
    }

    /// The server closed a keep-alive connection between requests: not an
    /// error, but worth reporting, since reconnects cost the server too.
    fn reopen_idle(&mut self, i: usize, now: u64) {
        if now >= self.clock.measure_from {
            self.stats.idle_closes += 1;
        }
        // Slot ids are not tied to a connection: the cycle goes on over a
        // new one.
        self.close(i);
        let at = self.conns[i].ready_at.max(now);
        self.wake_at(i, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const GRANT: &str =
        "{\"slotId\":\"abc\",\"leaseDeadline\":1,\"requestDeadline\":2,\"termMs\":30000,\"renewIntervalMs\":10000}";

    /// A thread-per-connection lock server on loopback that grants every
    /// `deny`-th acquire a 429 and counts releases, so a test can check that
    /// every granted slot was given back.
    fn serve(deny: u64) -> (SocketAddr, Arc<[AtomicU64; 2]>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let counts: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let shared = counts.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let counts = shared.clone();
                std::thread::spawn(move || {
                    let mut out = stream.try_clone().unwrap();
                    let mut r = std::io::BufReader::new(stream);
                    let mut acquires = 0u64;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut length = 0;
                        loop {
                            let mut h = String::new();
                            r.read_line(&mut h).unwrap();
                            if h == "\r\n" {
                                break;
                            }
                            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                                length = v.trim().parse().unwrap();
                            }
                        }
                        let mut body = vec![0; length];
                        r.read_exact(&mut body).unwrap();
                        let (status, body) = if line.contains("/acquire") {
                            acquires += 1;
                            if deny > 0 && acquires.is_multiple_of(deny) {
                                ("429 Too Many Requests", "{\"error\":\"too_many_requests\"}")
                            } else {
                                counts[0].fetch_add(1, Ordering::SeqCst);
                                ("200 OK", GRANT)
                            }
                        } else if line.contains("/release") {
                            counts[1].fetch_add(1, Ordering::SeqCst);
                            ("200 OK", "{\"released\":true}")
                        } else {
                            ("200 OK", "{}")
                        };
                        let reply = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                        out.write_all(reply.as_bytes()).unwrap();
                    }
                });
            }
        });
        (addr, counts)
    }

    fn run(opts: &Options, addr: SocketAddr) -> Stats {
        let requests = Requests::new(opts);
        let clock = Clock {
            origin: Instant::now(),
            measure_from: opts.warmup.as_nanos() as u64,
            measure_until: (opts.warmup + opts.duration).as_nanos() as u64,
        };
        let share = Share { first: 0, connections: opts.connections, budget: opts.requests };
        Client::new(opts, &requests, addr, clock, share).unwrap().run().unwrap()
    }

    #[test]
    fn cycles_with_renews_and_denials_give_every_slot_back() {
        let (addr, counts) = serve(4);
        let opts = Options {
            connections: 3,
            duration: Duration::from_millis(300),
            hold: Duration::from_millis(2),
            renews: 2,
            ..Options::default()
        };
        let s = run(&opts, addr);
        let statuses = |ep| s.statuses(ep).collect::<Vec<_>>();
        assert_eq!(s.failure_total(), 0);
        assert!(s.cycles > 10, "{} cycles", s.cycles);
        let granted = statuses(Endpoint::Acquire)[0];
        assert_eq!(granted.0, 200);
        assert_eq!(statuses(Endpoint::Acquire)[1].0, 429);
        // Two renews per grant; the last cycles' renews may fall after the window.
        let renews = statuses(Endpoint::Renew)[0].1;
        assert!(renews + 6 >= 2 * granted.1 && renews <= 2 * granted.1);
        // Slots still held at the end were released during the drain.
        assert_eq!(counts[0].load(Ordering::SeqCst), counts[1].load(Ordering::SeqCst));
    }

    /// A Redis stand-in on loopback: `EVALSHA` grants a new id until `limit`
    /// are held (nil after that), `ZREM` gives one back.
    fn serve_redis(limit: usize) -> (SocketAddr, Arc<[AtomicU64; 2]>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let counts: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let shared = counts.clone();
        let held = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (counts, held) = (shared.clone(), held.clone());
                std::thread::spawn(move || {
                    let mut out = stream.try_clone().unwrap();
                    let mut r = std::io::BufReader::new(stream);
                    let mut line = String::new();
                    while r.read_line(&mut line).unwrap_or(0) > 0 {
                        let n: usize = line.trim().strip_prefix('*').unwrap().parse().unwrap();
                        let args: Vec<String> = (0..n)
                            .map(|_| {
                                let (mut len, mut arg) = (String::new(), String::new());
                                r.read_line(&mut len).unwrap();
                                r.read_line(&mut arg).unwrap();
                                arg.trim_end().to_string()
                            })
                            .collect();
                        let reply = match args[0].as_str() {
                            "EVALSHA" => {
                                let mut held = held.lock().unwrap();
                                if held.len() < limit {
                                    let id = counts[0].fetch_add(1, Ordering::SeqCst) + 1;
                                    held.insert(id.to_string());
                                    format!(":{id}\r\n")
                                } else {
                                    "$-1\r\n".to_string()
                                }
                            }
                            "ZREM" => {
                                counts[1].fetch_add(1, Ordering::SeqCst);
                                format!(":{}\r\n", u8::from(held.lock().unwrap().remove(&args[2])))
                            }
                            other => format!("-ERR unknown command {other}\r\n"),
                        };
                        out.write_all(reply.as_bytes()).unwrap();
                        line.clear();
                    }
                });
            }
        });
        (addr, counts)
    }

    #[test]
    fn redis_cycles_release_every_holder_id() {
        // Two holders at most for three connections: some acquires see nil.
        let (addr, counts) = serve_redis(2);
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let opts = Options {
            connections: 3,
            duration: Duration::from_millis(300),
            hold: Duration::from_millis(1),
            redis: Some(sha.into()),
            pool: "sem".into(),
            ..Options::default()
        };
        let s = run(&opts, addr);
        assert_eq!(s.failure_total(), 0);
        assert!(s.cycles > 10, "{} cycles", s.cycles);
        let acquires: Vec<_> = s.statuses(Endpoint::Acquire).map(|(code, _)| code).collect();
        assert_eq!(acquires, [200, 429]);
        assert_eq!(s.statuses(Endpoint::Release).map(|(code, _)| code).collect::<Vec<_>>(), [200]);
        assert_eq!(counts[0].load(Ordering::SeqCst), counts[1].load(Ordering::SeqCst));
    }

    #[test]
    fn request_cap_ends_the_run_early() {
        let (addr, counts) = serve(0);
        let opts = Options { connections: 2, requests: Some(100), ..Options::default() };
        let started = Instant::now();
        let s = run(&opts, addr);
        assert!(started.elapsed() < Duration::from_secs(5));
        // At most one release per connection beyond the cap.
        assert!((100..=102).contains(&s.answers()), "{}", s.answers());
        assert_eq!(counts[0].load(Ordering::SeqCst), counts[1].load(Ordering::SeqCst));
    }

    #[test]
    fn open_loop_keeps_its_rate() {
        let (addr, _) = serve(0);
        let opts = Options {
            connections: 4,
            rate: Some(2000.0),
            duration: Duration::from_millis(500),
            get: Some("/x".into()),
            ..Options::default()
        };
        let s = run(&opts, addr);
        assert_eq!(s.failure_total(), 0);
        // 1000 intended in the window; allow for a slow test machine.
        assert!((800..=1000).contains(&s.answers()), "{}", s.answers());
        assert_eq!(s.send_lag.len(), s.answers());
    }

    #[test]
    fn refused_connections_are_counted_and_retried() {
        // Bind and drop to get a loopback port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let opts = Options { connections: 2, duration: Duration::from_millis(250), ..Options::default() };
        let s = run(&opts, port);
        assert_eq!(s.answers(), 0);
        // Two connections, retried every 100 ms for 250 ms.
        assert!((4..=8).contains(&s.connect_errors), "{}", s.connect_errors);
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Accept and hold the sockets open without ever answering.
        let keep = std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().take(4) {
                held.push(s);
            }
            std::thread::sleep(Duration::from_secs(1));
        });
        let opts = Options {
            connections: 1,
            duration: Duration::from_millis(250),
            timeout: Duration::from_millis(50),
            ..Options::default()
        };
        let s = run(&opts, addr);
        let timeouts: u64 = s.failures(Endpoint::Acquire).map(|(_, n)| n).sum();
        assert!(timeouts >= 2, "{timeouts}");
        drop(keep);
    }
}
