//! The reactor: one thread, one `mio::Poll`, every socket and the clock.
//!
//! Each turn of the loop: wait for readiness (the timeout comes from the
//! timer wheel), read and answer what arrived, fire due timers, hand queued
//! acquires their answers, then flush every connection with output — replies
//! to pipelined requests go out in one write (Redis's `beforeSleep`).
//!
//! Readiness is edge-triggered: reads and writes are drained to `WouldBlock`,
//! except that a connection gets a bounded read budget per turn and is
//! revisited on the next turn, so one busy client cannot starve the others.

pub mod admin;
pub mod clock;
pub mod conn;
mod pipeline;
pub mod proxied;

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use crate::accesslog;
use crate::api::{ApiError, App};
use crate::config::Config;
use crate::governor::{Ms, Notice};
use crate::http::request::MAX_HEAD_BYTES;
use crate::http::response::Status;
use crate::proxy::Proxy;
use crate::state;
use admin::ServerStats;
use clock::Clock;
use conn::{Conn, Flush, Io, Timeouts, NEVER};

const LISTENER: Token = Token(usize::MAX - 1);
const ADMIN: Token = Token(usize::MAX - 2);
const SIGNALS: Token = Token(usize::MAX - 3);
/// Reads per connection per turn before others get their go.
const READ_BUDGET: usize = 8;
/// Wait before accepting again when the process is out of file descriptors.
const ACCEPT_PAUSE_MS: u64 = 100;
const ACCEPT_TIMER: u64 = u64::MAX;
const LOG_TIMER: u64 = u64::MAX - 1;
/// How long a closing connection's unread input is drained (see `Conn::lingering_until`).
const LINGER_MS: u64 = 1000;
/// Graceful shutdown finishes within this, whatever clients do.
const SHUTDOWN_GRACE_MS: u64 = 800;
/// Open connections on the admin listener: its own budget, so health checks
/// and scrapes are answered however many public connections are open.
pub const ADMIN_MAX_CONNECTIONS: usize = 16;

pub struct Server {
    poll: Poll,
    /// `None` once shutdown has begun.
    listener: Option<TcpListener>,
    admin: Option<TcpListener>,
    signals: Signals,
    /// The file SIGHUP re-reads; `None` for the embedded configuration.
    config_path: Option<PathBuf>,
    /// The listener addresses as last configured, to warn when a reload changes them.
    configured_listen: (String, Option<String>),
    conns: Slab<Conn>,
    /// Sent, best effort, to a connection over the `maxConnections` cap.
    over_capacity: Vec<u8>,
    stats: ServerStats,
    log_timer_armed: bool,
    /// Set when SIGTERM/SIGINT arrived: exit once every connection is done, or at this time.
    shutdown_at: Option<Ms>,
    app: App,
    clock: Clock,
    now: Ms,
    /// When the current reactor turn began: the start of every request's server time.
    turn_started: Instant,
    next_serial: u32,
    max_connections: usize,
    /// Open connections per listener, each against its own budget.
    open_public: usize,
    open_admin: usize,
    timeouts: Timeouts,
    input_limit: usize,
    accept_paused: bool,
    /// Connections with output to flush before the loop sleeps (each once:
    /// `Conn::dirty` says it is listed), and the list swapped in while it is.
    dirty: Vec<(usize, u32)>,
    dirty_spare: Vec<(usize, u32)>,
    /// Connections whose read budget ran out with input possibly left; read
    /// again next turn. Two lists, swapped each turn, so neither reallocates.
    ready: Vec<(usize, u32)>,
    ready_carry: Vec<(usize, u32)>,
    /// Proxy mode: upstream connections and exchanges, and the pools' own listeners.
    proxy: Proxy,
    proxy_listeners: Vec<(TcpListener, crate::governor::PoolId)>,
}

/// Identifies a connection for its whole life: slab index and serial.
fn owner(token: usize, serial: u32) -> u64 {
    (token as u64) | ((serial as u64) << 32)
}

fn split_owner(owner: u64) -> (usize, u32) {
    ((owner & 0xffff_ffff) as usize, (owner >> 32) as u32)
}

impl Server {
    /// Binds the listeners; errors name the cause for a one-line start-up failure.
    pub fn bind(config: &Config, listen: SocketAddr, config_path: Option<PathBuf>) -> Result<Server, String> {
        let poll = Poll::new().map_err(|e| format!("cannot create the event loop: {e}"))?;
        let mut listener = TcpListener::bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| format!("cannot register the listener: {e}"))?;
        let admin = match config.admin_addr() {
            None => None,
            Some(addr) => {
                let mut l =
                    TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr} (adminListen): {e}"))?;
                poll.registry()
                    .register(&mut l, ADMIN, Interest::READABLE)
                    .map_err(|e| format!("cannot register the admin listener: {e}"))?;
                Some(l)
            }
        };
        let mut signals =
            Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(|e| format!("cannot install signal handlers: {e}"))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(|e| format!("cannot register signals: {e}"))?;
        let clock = Clock::start();
        let mut app = App::new(config)?;
        app.listen_addr = listener.local_addr().ok();
        let proxy_listeners = proxied::bind_listeners(config, &app, poll.registry())?;
        let secret = match &config_path {
            Some(path) => state::secret::load_or_create(&state::secret::path_beside(path, &config.slot_secret_file))?,
            None => state::secret::ephemeral(),
        };
        app.gov.set_identity(&secret.bytes, clock.epoch_base_ms());
        if !secret.created {
            // Nothing says which slots the previous process held: give their
            // holders one term to come back before granting anew.
            app.gov.open_recovery_window(0);
            log::warn!("started without a snapshot: re-adoption window of one termMs per pool");
        }
        Ok(Server {
            poll,
            listener: Some(listener),
            admin,
            signals,
            config_path,
            configured_listen: (config.listen.clone(), config.admin_listen.clone()),
            conns: Slab::with_capacity(1024),
            over_capacity: {
                let mut answer = Vec::new();
                ApiError::Unavailable("The server has too many open connections.", 1).write(
                    &mut answer,
                    &mut Vec::new(),
                    true,
                );
                answer
            },
            stats: ServerStats::default(),
            log_timer_armed: false,
            shutdown_at: None,
            app,
            clock,
            now: 0,
            turn_started: Instant::now(),
            next_serial: 0,
            max_connections: config.max_connections,
            open_public: 0,
            open_admin: 0,
            timeouts: Timeouts::from(config),
            input_limit: input_limit(config),
            accept_paused: false,
            dirty: Vec::new(),
            dirty_spare: Vec::new(),
            ready: Vec::new(),
            ready_carry: Vec::new(),
            proxy: Proxy::default(),
            proxy_listeners,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.as_ref().expect("listening").local_addr()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until SIGTERM or SIGINT has been handled.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // One clock read per turn serves both the governor and server times.
            self.turn_started = Instant::now();
            self.now = self.clock.ms_at(self.turn_started);
            self.app.sample_history(self.now, self.clock.epoch_base_ms());
            crate::http::response::set_date(self.clock.epoch_base_ms() + self.now);
            let mut carried = std::mem::take(&mut self.ready_carry);
            let (mut accept_public, mut accept_admin) = (false, false);
            for event in events.iter() {
                match event.token() {
                    LISTENER => accept_public = true,
                    ADMIN => accept_admin = true,
                    SIGNALS => self.on_signals(),
                    Token(t) if t >= proxied::UPSTREAM_BASE => self.on_upstream(t - proxied::UPSTREAM_BASE),
                    Token(t) if t >= proxied::PROXY_LISTENER_BASE => {
                        self.accept_proxy(t - proxied::PROXY_LISTENER_BASE)
                    }
                    Token(t) => {
                        let Some(conn) = self.conns.get(t) else {
                            continue;
                        };
                        let serial = conn.serial;
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.on_readable(t, serial, event.is_read_closed() || event.is_error());
                        }
                        if event.is_writable() && self.conns.get(t).is_some_and(|c| c.serial == serial) {
                            self.mark_dirty(t, serial);
                        }
                    }
                }
            }
            for &(t, serial) in &carried {
                if self.conns.get(t).is_some_and(|c| c.serial == serial) {
                    self.read_and_process(t);
                }
            }
            carried.clear();
            self.ready.sort_unstable();
            self.ready.dedup();
            self.ready_carry = std::mem::replace(&mut self.ready, carried);
            self.app.gov.advance(self.now);
            self.drain_notices();
            self.flush_dirty();
            // Accepting comes last, so a connection whose close was read this
            // turn no longer counts against the budget of a new one.
            if accept_public {
                self.accept(false);
            }
            if accept_admin {
                self.accept(true);
            }
            self.after_turn();
            if let Some(at) = self.shutdown_at {
                if self.conns.is_empty() || self.clock.now_ms() >= at {
                    self.app.log.flush();
                    info!("shut down ({} connections cut at the deadline)", self.conns.len());
                    return Ok(());
                }
            }
        }
    }

    /// Work done once the turn's sockets are served: the access log.
    fn after_turn(&mut self) {
        self.stats.connections_open = self.conns.len() as u64;
        let buffered = self.app.log.buffered();
        if buffered >= accesslog::WRITE_THRESHOLD {
            self.app.log.flush();
        } else if buffered > 0 && !self.log_timer_armed {
            self.log_timer_armed = true;
            self.app.gov.schedule(self.now + accesslog::FLUSH_INTERVAL_MS, LOG_TIMER);
        }
    }

    fn on_signals(&mut self) {
        let pending: Vec<i32> = self.signals.pending().collect();
        for signal in pending {
            match signal {
                SIGHUP => self.reload(),
                _ => self.begin_shutdown(),
            }
        }
    }

    /// SIGHUP: re-read the configuration file and apply it without dropping
    /// anything; a bad file changes nothing.
    fn reload(&mut self) {
        let Some(path) = &self.config_path else {
            warn!("SIGHUP: running on the embedded configuration, nothing to reload");
            return;
        };
        let result = Config::load(path).map_err(|e| e.to_string()).and_then(|config| {
            self.app.reconfigure(&config, self.now, self.clock.epoch_base_ms() + self.now)?;
            Ok(config)
        });
        match result {
            Ok(config) => {
                self.max_connections = config.max_connections;
                self.timeouts = Timeouts::from(&config);
                self.input_limit = input_limit(&config);
                let listen = (config.listen.clone(), config.admin_listen.clone());
                if listen != self.configured_listen {
                    warn!("reload: new `listen` / `adminListen` addresses take effect at the next restart");
                    self.configured_listen = listen;
                }
                self.stats.reloads_ok += 1;
                info!("configuration reloaded from {}", path.display());
                self.drain_notices();
            }
            Err(e) => {
                self.stats.reloads_failed += 1;
                error!("reload refused, the running configuration stays: {e}");
            }
        }
    }

    /// SIGTERM/SIGINT: stop accepting, answer what was already read (waiters
    /// get a 503), then close everything and exit within the grace period.
    fn begin_shutdown(&mut self) {
        if self.shutdown_at.is_some() {
            return;
        }
        info!("shutting down");
        self.shutdown_at = Some(self.now + SHUTDOWN_GRACE_MS);
        for mut l in [self.listener.take(), self.admin.take()].into_iter().flatten() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        for (mut l, _) in self.proxy_listeners.drain(..) {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let tokens: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
        let epoch_now = self.clock.epoch_base_ms() + self.now;
        for token in tokens {
            // Every request already read is answered: a waiter gets its 503,
            // then what was pipelined behind it runs.
            self.process(token);
            while let Some(q) = self.conns[token].waiting.take() {
                let conn = &mut self.conns[token];
                self.app.gov.cancel_waiter(q.key, owner(token, conn.serial));
                let last = conn.input.is_empty();
                self.app.answer_shutdown(&mut conn.output, &q.attempt, epoch_now, last);
                self.process(token);
            }
            let conn = &mut self.conns[token];
            conn.close_after_flush = true;
            let serial = conn.serial;
            self.mark_dirty(token, serial);
        }
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        if !self.ready_carry.is_empty() || !self.dirty.is_empty() {
            return Some(Duration::ZERO);
        }
        let now = self.clock.now_ms();
        // A stopping server wakes at its deadline whatever else is (or is not) due.
        let wake = match (self.app.gov.next_deadline(), self.shutdown_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        wake.map(|at| Duration::from_millis(at.saturating_sub(now)))
    }

    fn accept(&mut self, admin: bool) {
        if self.accept_paused {
            return;
        }
        loop {
            let listener = if admin { &self.admin } else { &self.listener };
            let Some(listener) = listener else { return };
            match listener.accept() {
                Ok((stream, peer)) => {
                    self.admit(stream, peer, admin);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: the pending connection stays in the
                    // backlog and the listener would fire again at once, so stop
                    // accepting for a moment instead of spinning.
                    warn!("accept failed ({e}); pausing accepts for {ACCEPT_PAUSE_MS} ms");
                    self.accept_paused = true;
                    self.app.gov.schedule(self.now + ACCEPT_PAUSE_MS, ACCEPT_TIMER);
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr, admin: bool) -> Option<usize> {
        let (open, budget) =
            if admin { (self.open_admin, ADMIN_MAX_CONNECTIONS) } else { (self.open_public, self.max_connections) };
        if open >= budget {
            self.stats.connections_refused += 1;
            if !admin {
                self.app.rejections.count(Status::ServiceUnavailable);
            }
            let _ = stream.write(&self.over_capacity);
            return None;
        }
        self.stats.connections_accepted += 1;
        let _ = stream.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let token = entry.key();
        if self.poll.registry().register(&mut stream, Token(token), Interest::READABLE | Interest::WRITABLE).is_err() {
            return None;
        }
        let serial = self.next_serial;
        self.next_serial = serial.wrapping_add(1);
        // Registering reports readiness that already exists, so no read is tried here.
        entry.insert(Conn::new(stream, peer, serial, admin, self.input_limit, self.now));
        *(if admin { &mut self.open_admin } else { &mut self.open_public }) += 1;
        self.arm_timer(token);
        Some(token)
    }

    /// A readiness event: the socket may hold data (or the peer's FIN).
    fn on_readable(&mut self, token: usize, serial: u32, hangup: bool) {
        let Some(conn) = self.conns.get_mut(token).filter(|c| c.serial == serial) else {
            return;
        };
        conn.readable = true;
        // With the FIN already seen, a short read is not the end: read to EOF,
        // since no new edge will announce it.
        conn.hangup |= hangup;
        self.read_and_process(token);
    }

    /// Reads what the socket holds, within the turn's budget and the
    /// connection's buffer limits, then answers what arrived. Reading pauses
    /// (the socket stays marked readable) while the input is full or the
    /// output is over its high-water mark; answering or flushing resumes it.
    fn read_and_process(&mut self, token: usize) {
        if self.conns[token].lingering_until.is_some() {
            self.drain_lingering(token);
            return;
        }
        let now = self.now;
        let conn = &mut self.conns[token];
        let serial = conn.serial;
        let received = conn.received;
        let mut reads = 0;
        let mut failed = false;
        while conn.may_read() {
            if reads == READ_BUDGET {
                // Fairness: the rest waits for the next turn.
                self.ready.push((token, serial));
                break;
            }
            reads += 1;
            let was_empty = conn.input.is_empty();
            match conn.read_once() {
                Ok(io @ (Io::Continue | Io::Drained)) => {
                    conn.last_active = now;
                    if was_empty && conn.pending.is_none() && conn.request_started.is_none() {
                        conn.request_started = Some(now);
                    }
                    // A short read emptied the socket; new data raises a new edge.
                    if io == Io::Drained && !conn.hangup {
                        conn.readable = false;
                    }
                }
                Ok(Io::WouldBlock) => conn.readable = false,
                Ok(Io::Closed) => {
                    conn.read_closed = true;
                    conn.readable = false;
                }
                Err(e) => {
                    debug!("read from {} failed: {e}", conn.peer);
                    failed = true;
                    break;
                }
            }
        }
        self.stats.bytes_received += conn.received - received;
        if failed {
            self.close(token);
            return;
        }
        if conn.read_closed {
            // A client that closed or half-closed leaves the queue now, before
            // anything later in this turn can grant it a slot. It is answered
            // (a half-closed client still reads), and what it pipelined
            // behind the acquire is answered after it.
            if let Some(q) = conn.waiting.take() {
                withdraw(&mut self.app, conn, &q, owner(token, serial), now, self.clock.epoch_base_ms() + now);
                self.mark_dirty(token, serial);
            }
        }
        self.process(token);
        // Answering may have made room for input still in the socket.
        if reads < READ_BUDGET && self.conns[token].may_read() {
            self.ready.push((token, serial));
        }
    }

    /// Reads and drops what a closing client still sends; closes at its EOF.
    fn drain_lingering(&mut self, token: usize) {
        let conn = &mut self.conns[token];
        for _ in 0..READ_BUDGET {
            let io = conn.read_once();
            conn.input.consume(conn.input.end - conn.input.start);
            match io {
                Ok(Io::Continue) => {}
                Ok(Io::Drained) if conn.hangup => {}
                Ok(Io::Drained | Io::WouldBlock) => {
                    conn.readable = false;
                    return;
                }
                Ok(Io::Closed) | Err(_) => {
                    self.close(token);
                    return;
                }
            }
        }
        // Still more: continue next turn.
        let serial = conn.serial;
        self.ready.push((token, serial));
    }

    fn mark_dirty(&mut self, token: usize, serial: u32) {
        if let Some(conn) = self.conns.get_mut(token).filter(|c| c.serial == serial && !c.dirty) {
            conn.dirty = true;
            self.dirty.push((token, serial));
        }
    }

    /// Writes every connection's pending output, then closes the ones that are done.
    fn flush_dirty(&mut self) {
        let mut dirty = std::mem::replace(&mut self.dirty, std::mem::take(&mut self.dirty_spare));
        for &(token, serial) in &dirty {
            let now = self.now;
            let Some(conn) = self.conns.get_mut(token).filter(|c| c.serial == serial) else {
                continue;
            };
            conn.dirty = false;
            if conn.read_closed {
                // A half-closed client leaves the queue at once.
                if let Some(q) = conn.waiting.take() {
                    self.app.waiter_gone(&q, owner(token, serial), self.clock.epoch_base_ms() + now);
                }
                conn.close_after_flush = true;
            }
            let sent = conn.sent;
            let flushed = conn.flush(now);
            self.stats.bytes_sent += conn.sent - sent;
            match flushed {
                Ok(Flush::Done) if conn.close_after_flush && conn.waiting.is_none() => {
                    if conn.read_closed || conn.lingering_until.is_some() {
                        self.close(token);
                    } else {
                        // Close our side, then drain what the client still sends.
                        let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                        conn.lingering_until = Some(now + LINGER_MS);
                        conn.input.consume(conn.input.end - conn.input.start);
                        self.arm_timer(token);
                        self.read_and_process(token);
                    }
                }
                Ok(Flush::Done | Flush::Pending) if conn.exchange.is_some() => {
                    // Room in the output: the upstream may be read on, and the
                    // client's body taken.
                    self.read_and_process(token);
                }
                Ok(Flush::Done | Flush::Pending) => {
                    let resume =
                        conn.unsent() == 0 && (conn.readable || !conn.input.is_empty()) && conn.waiting.is_none();
                    self.arm_timer(token);
                    if resume {
                        // Output drained below the high-water mark: read on.
                        self.read_and_process(token);
                    }
                }
                Ok(Flush::Closed) => self.close(token),
                Err(e) => {
                    debug!("write failed: {e}");
                    self.close(token);
                }
            }
        }
        // Processing above may have queued more output in `self.dirty`: it is
        // flushed next turn (the poll does not sleep while it is non-empty).
        dirty.clear();
        self.dirty_spare = dirty;
    }

    /// Delivers what the governor decided since the last call.
    fn drain_notices(&mut self) {
        while let Some(notice) = self.app.gov.pop_notice() {
            match notice {
                Notice::Granted { owner: o, grant } => {
                    let Some((token, queued)) = self.take_waiting(o) else {
                        // Its client is gone: the grant cannot be delivered.
                        self.app.gov.release_undelivered(&grant.slot, self.now);
                        continue;
                    };
                    if self.conns[token].exchange.is_some() {
                        self.grant_exchange(token, &grant);
                        continue;
                    }
                    let epoch_now = self.clock.epoch_base_ms() + self.now;
                    let conn = &mut self.conns[token];
                    let close = conn.close_after_flush;
                    self.app.answer_grant(
                        &mut conn.output,
                        &grant,
                        &queued.attempt,
                        self.clock.epoch_base_ms(),
                        epoch_now,
                        close,
                    );
                    conn.undelivered.push((grant.slot, conn.output.len()));
                    self.after_answer(token);
                }
                Notice::TimedOut { owner: o, denial } => {
                    let Some((token, queued)) = self.take_waiting(o) else {
                        continue;
                    };
                    let epoch_now = self.clock.epoch_base_ms() + self.now;
                    let conn = &mut self.conns[token];
                    let close = conn.close_after_flush;
                    self.app.answer_denial(
                        &mut conn.output,
                        &denial,
                        Status::GatewayTimeout,
                        &queued.attempt,
                        epoch_now,
                        close,
                    );
                    if self.conns[token].exchange.is_some() {
                        self.end_exchange(token, proxied::End::Refused);
                    }
                    self.after_answer(token);
                }
                Notice::Timer(ACCEPT_TIMER) => {
                    self.accept_paused = false;
                    self.accept(false);
                    self.accept(true);
                }
                Notice::Timer(LOG_TIMER) => {
                    self.log_timer_armed = false;
                    self.app.log.flush();
                }
                Notice::Timer(tag) => {
                    let (token, serial) = split_owner(tag);
                    self.on_conn_timer(token, serial);
                }
            }
        }
    }

    /// The connection `owner` names, if it still waits, with its wait taken.
    fn take_waiting(&mut self, owner: u64) -> Option<(usize, crate::api::Queued)> {
        let (token, serial) = split_owner(owner);
        let conn = self.conns.get_mut(token).filter(|c| c.serial == serial)?;
        let queued = conn.waiting.take()?;
        if conn.unsent() == 0 {
            conn.out_since = self.now;
        }
        Some((token, queued))
    }

    /// A queued acquire was answered: continue with pipelined requests.
    fn after_answer(&mut self, token: usize) {
        let serial = self.conns[token].serial;
        self.mark_dirty(token, serial);
        self.read_and_process(token);
    }

    fn on_conn_timer(&mut self, token: usize, serial: u32) {
        let now = self.now;
        let Some(conn) = self.conns.get_mut(token).filter(|c| c.serial == serial) else {
            return;
        };
        conn.timer = None;
        if conn.exchange.is_some() && conn.waiting.is_none() && conn.exchange_deadline <= now {
            self.exchange_timed_out(token);
        } else if conn.deadline(&self.timeouts) <= now {
            debug!("closing {}: deadline passed", conn.peer);
            self.close(token);
        } else {
            self.arm_timer(token);
        }
    }

    /// Makes sure the wheel holds an entry no later than the connection's
    /// deadline. Later deadlines are not moved: the entry fires, re-checks
    /// and re-arms (one wheel entry per connection at most).
    fn arm_timer(&mut self, token: usize) {
        let Some(conn) = self.conns.get_mut(token) else {
            return;
        };
        let at = conn.deadline(&self.timeouts);
        if at == NEVER {
            return;
        }
        match conn.timer {
            Some((armed, _)) if armed <= at => {}
            Some((_, key)) => {
                self.app.gov.cancel_timer(key);
                conn.timer = Some((at, self.app.gov.schedule(at, owner(token, conn.serial))));
            }
            None => conn.timer = Some((at, self.app.gov.schedule(at, owner(token, conn.serial)))),
        }
    }

    fn close(&mut self, token: usize) {
        let mut conn = self.conns.remove(token);
        *(if conn.admin { &mut self.open_admin } else { &mut self.open_public }) -= 1;
        let o = owner(token, conn.serial);
        if let Some(q) = conn.waiting.take() {
            self.app.waiter_gone(&q, o, self.clock.epoch_base_ms() + self.now);
        }
        if let Some((_, key)) = conn.timer.take() {
            self.app.gov.cancel_timer(key);
        }
        for (slot, end) in conn.undelivered.drain(..) {
            if end > conn.out_pos {
                self.app.gov.release_undelivered(&slot, self.now);
            }
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if let Some(ex) = conn.exchange {
            self.abandon_exchange(ex);
        }
    }
}

/// Takes a half-closed client's acquire out of the queue and answers it `504`.
fn withdraw(app: &mut App, conn: &mut Conn, q: &crate::api::Queued, owner: u64, now: Ms, epoch_now: u64) {
    if let Some(denial) = app.gov.withdraw_waiter(q.key, owner, now) {
        app.answer_withdrawn(&mut conn.output, &denial, &q.attempt, epoch_now);
    }
}

/// Input a connection may buffer: a head, a body (chunked framing included)
/// and some pipelined requests behind them.
fn input_limit(config: &Config) -> usize {
    MAX_HEAD_BYTES + 2 * config.max_body_bytes + 64 * 1024
}

impl From<&Config> for Timeouts {
    fn from(c: &Config) -> Timeouts {
        Timeouts { head_ms: c.head_timeout_ms, idle_ms: c.idle_timeout_ms, write_ms: c.write_timeout_ms }
    }
}

/// Starts a server and runs it until a graceful shutdown; the binary's body.
/// `on_ready` gets the bound public and admin addresses.
pub fn serve(
    config: &Config,
    listen: SocketAddr,
    config_path: Option<PathBuf>,
    on_ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> Result<(), String> {
    let mut server = Server::bind(config, listen, config_path)?;
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    info!("listening on {addr}");
    on_ready(addr, server.admin_addr());
    server.run().map_err(|e| format!("event loop failed: {e}"))
}
