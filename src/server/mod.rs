//! The reactor: one thread, one `mio::Poll`, every socket and the clock.
//!
//! Each turn of the loop: wait for readiness (the timeout comes from the
//! timer wheel), fire due timers, read and answer what arrived, hand queued
//! acquires their answers, then flush every connection with output — replies
//! to pipelined requests go out in one write (Redis's `beforeSleep`).
//!
//! Readiness is edge-triggered: reads and writes are drained to `WouldBlock`
//! (a client connection is watched for writability only once a write left
//! output unsent: until then the ACK of every answer would wake the loop),
//! except that a connection has a budget per turn — `READ_BUDGET` reads and
//! `REQUEST_BUDGET` requests answered, however often the turn comes back to
//! it — and is revisited on the next turn, so one busy client cannot starve
//! the others. A turn has a time as well (`turn.rs`): the connections it
//! comes to past that time are postponed, and the next turn serves them
//! first, so thousands of busy clients cannot keep the loop from its poll
//! (a stop signal, a health check) for long.
//!
//! The reactor talks to the application through one door, `api::App`
//! (`api/door.rs`): requests in, answers out, its own deadlines on the one
//! wheel as typed `Wake`s, and the governor's decisions drained as
//! `Event`s. It never reaches the governor.
//!
//! # Kinds of connection
//!
//! Accepted connections live in one slab, as an [`Entry`]; a [`ConnId`]
//! (slab index and serial) names one in timers, in the flush and carry
//! lists and in the governor's queues. Everything the reactor tells a
//! connection — readiness, a resumed budget, its deadline, shutdown — goes
//! through [`Server::dispatch`] as a [`Signal`]. The `match`es on the kind
//! are `Entry::serial`, `Server::signal_entry` (behind `dispatch`),
//! `Server::retire` (behind `close`) and `client_mut`, and the walks of
//! every connection (`close_idlest_admin`, the admin's metrics gathering in
//! `admin.rs`, `proxied::cut_exchanges`). A new kind that
//! wants these services (a budget per turn, a deadline on the wheel as
//! `Wake::Conn`) is a new `Entry` variant, registered under its slab index,
//! with an arm in each: its serial, its signals handed to its own handler
//! module, its close, and none in `client_mut`. The flush list is the
//! client connections' alone: the end of a turn writes each one's output
//! directly, as every answer passes there (a new kind with output of its
//! own would get a list of its own).
//!
//! Proxy mode's outbound connections to upstreams (`crate::proxy`,
//! `proxied.rs`) are kept by the proxy in a slab of its own, registered at
//! `proxied::UPSTREAM_BASE + index`, and their pools' listeners at
//! `proxied::PROXY_LISTENER_BASE + index`: one arm each in `run`'s token
//! match routes their readiness, and an upstream's only moves the exchange
//! of the client connection it serves, whose deadline stands for both.

pub mod admin;
pub mod clock;
pub mod conn;
mod fds;
mod idle;
mod pipeline;
pub mod proxied;
mod turn;

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGXFSZ};
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use crate::api::proxy::WaitEnd;
use crate::api::{ApiError, App, ConnId, Entropy, Event, PoolId, Wake};
use crate::config::{Config, ConfigError};
use crate::http::request::MAX_HEAD_BYTES;
use crate::http::response::write_kept_alive;
use crate::proxy::Proxy;
use crate::state;
use crate::time::{Ms, Now};
use crate::wheel::TimerKey;
use admin::ServerStats;
use clock::Clock;
use conn::{Conn, Flush, Io, Timeouts, NEVER};
use turn::TurnTime;

const LISTENER: Token = Token(usize::MAX - 1);
const ADMIN: Token = Token(usize::MAX - 2);
const SIGNALS: Token = Token(usize::MAX - 3);
/// The resolver thread wakes the loop with this token when it has answers.
const RESOLVER: Token = Token(usize::MAX - 4);
/// Wait before accepting again when the process is out of file descriptors.
const ACCEPT_PAUSE_MS: u64 = 100;
/// Failed accepts are logged at most once in this long (with how many were
/// not): out of descriptors, the listener fails again after every pause.
const ACCEPT_WARN_EVERY_MS: u64 = 10_000;
/// How long a closing connection's unread input is drained (see `conn::Phase::Lingering`).
const LINGER_MS: u64 = 1000;
/// The clients' grace in a graceful stop, whatever they do (less
/// `CLOSE_EACH_US` per connection open when it begins, and less the time
/// the snapshot is expected to take): at its end every connection still
/// open is cut; the closes, the access log's last flush and the snapshot
/// follow, done by `STOP_DONE_MS`.
const SHUTDOWN_GRACE_MS: u64 = 800;
/// However large the snapshot, the grace is at least this long (less
/// `CLOSE_EACH_US` per connection), to answer what was read.
const MIN_GRACE_MS: u64 = 100;
/// At the grace's end every connection still open is closed (`close_all`),
/// and a close takes the kernel time of its own: what the socket holds both
/// ways is freed and its FIN or reset sent, about 20 µs for a client that
/// pipelined and never read (measured with 8 000 of them). The grace is
/// shorter by this much per connection open when the stop begins, so that
/// closing them all still fits in the stop's second.
const CLOSE_EACH_US: u64 = 25;
/// While stopping, how long a turn may spend shutting connections down
/// (answering what each had read): the rest wait for the next turns, so
/// the grace's deadline is looked at however many clients pipelined.
const SHUTDOWN_SLICE_MS: u64 = 20;
/// At the grace's end, how long the last writes may go on reading and
/// dropping what clients sent (so that the close is a FIN): past it, the
/// remaining connections are closed at once.
const CLOSE_ALL_MS: u64 = 50;
/// At the stop's end, how long the sockets' closes may run before the
/// snapshot is written (and never past the time it must begin): what is
/// left is closed after it (`close_all`).
const CLOSE_BEFORE_SNAPSHOT_MS: u64 = 100;
/// From the stop's signal, when its work is done: the grace, the closes,
/// the access log's last flush (a slow reader of standard output or a pipe
/// gets until the snapshot must begin) and the snapshot. The rest of SPEC
/// §2's second is for the exit itself on a loaded machine.
const STOP_DONE_MS: u64 = 900;
/// Open connections on the admin listener: its own budget, so health checks
/// and scrapes are answered however many public connections are open.
pub const ADMIN_MAX_CONNECTIONS: usize = 16;
/// Admin connections accepted per turn at most (the rest a millisecond
/// later, `Wake::AdminAccept`): a turn reads the ones accepted before it
/// accepts more, so a health check accepted in a flood of new connections is
/// read before as many arrive after it as the listener has places (each
/// making way for one: `close_idlest_admin`).
const ADMIN_ACCEPTS_PER_TURN: usize = ADMIN_MAX_CONNECTIONS / 2;
/// An admin request still arriving after this long makes way for a new
/// connection when the admin listener is full.
const ADMIN_SLOW_REQUEST_MS: Ms = 1000;
/// Connections refused over a listener's budget that are kept for their
/// lingering close (the `503` flushed, then what they sent drained): past
/// this many at once, a refused connection is closed as soon as its `503`
/// is written.
const REFUSED_LINGERING_MAX: usize = 64;

/// What lives behind a slab index: one variant per kind of connection.
pub enum Entry {
    /// A client of the lock API or of the admin routes.
    Client(Conn),
}

impl Entry {
    fn serial(&self) -> u32 {
        match self {
            Entry::Client(c) => c.serial,
        }
    }
}

/// What the reactor tells a connection (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// Readiness from the poll: input (or the peer's FIN or an error) may be
    /// waiting, and/or the socket may take output.
    Ready { readable: bool, hangup: bool, writable: bool },
    /// Its budget ran out last turn with work possibly left, or the turn's
    /// time before it was served: go on.
    Resume,
    /// Its deadline may have come.
    Deadline,
    /// The server is stopping: answer what was read, then close.
    Shutdown,
}

/// The client connection `id` names, if it is still the one it named.
fn client_mut(conns: &mut Slab<Entry>, id: ConnId) -> Option<&mut Conn> {
    match conns.get_mut(id.index as usize) {
        Some(Entry::Client(c)) if c.serial == id.serial => Some(c),
        _ => None,
    }
}

pub struct Server {
    poll: Poll,
    /// `None` once shutdown has begun.
    listener: Option<TcpListener>,
    admin: Option<TcpListener>,
    signals: Signals,
    /// The file SIGHUP re-reads; `None` for the embedded configuration.
    config_path: Option<PathBuf>,
    /// The listener addresses bound at start, as the configuration (and
    /// `--listen`) named them: a reload that names others is told they wait
    /// for a restart, one that names these again is not.
    bound_listen: Listening,
    /// `--listen`, in place of the file's `listen`: a reload is checked
    /// against it as the next start with the same command line would be.
    listen_override: Option<SocketAddr>,
    conns: Slab<Entry>,
    /// What is sent, best effort, to a connection over the `maxConnections` cap.
    over_capacity: Vec<u8>,
    stats: ServerStats,
    /// The length of the last `/metrics` text: the next scrape reserves that
    /// much once, instead of growing the answer by doubling (the text itself
    /// is not kept: with thousands of pools it is tens of megabytes).
    metrics_len: usize,
    /// Set when a stop signal (TERM, INT, QUIT) arrived: exit once every connection is done,
    /// or at this time, the grace's end.
    shutdown_at: Option<Ms>,
    /// When the stop began (the turn that read its signal).
    shutdown_began: Ms,
    /// While stopping, when the snapshot must begin to be done by `STOP_DONE_MS`.
    snapshot_by: Ms,
    app: App,
    /// The slot secret's and the snapshot's files.
    persistence: state::Persistence,
    /// The periodic snapshot's timer and when it is due, while one is armed.
    snapshot_timer: Option<(Ms, TimerKey)>,
    clock: Clock,
    now: Now,
    /// Counts reactor turns: a connection's budget is per turn.
    turn: u64,
    /// When the current reactor turn began: the start of every request's server time.
    turn_started: Instant,
    /// Whether the turn has served connections long enough (`turn.rs`).
    turn_time: TurnTime,
    next_serial: u32,
    /// `maxConnections`, or fewer when the open-descriptor limit allows fewer.
    connection_cap: fds::ConnectionCap,
    /// The open-descriptor limit, raised at start to the hard limit.
    fd_limit: Option<u64>,
    /// Open connections per listener, each against its own budget.
    open_public: usize,
    open_admin: usize,
    /// Refused connections lingering (at most `REFUSED_LINGERING_MAX`).
    open_refused: usize,
    /// Connections of either budget whose answers are all written and which
    /// only drain what the client still sends: a stop does not wait for them.
    lingering: usize,
    /// The admin listener's connections (at most `ADMIN_MAX_CONNECTIONS`):
    /// where to find one to close when a health check finds it full.
    admin_conns: Vec<ConnId>,
    timeouts: Timeouts,
    /// `idleSpinUs`: how long the wait polls before it sleeps after concurrent work.
    idle_spin: Duration,
    input_limit: usize,
    accept_paused: bool,
    /// When a failed accept was last logged, the failures not logged since,
    /// and when the last of those was.
    accept_warned: Option<(Ms, u64, Ms)>,
    /// `Wake::Warnings`, while armed: when, and its timer.
    warnings_timer: Option<(Ms, TimerKey)>,
    /// The turn the admin listener last accepted in (`ADMIN_ACCEPTS_PER_TURN`).
    admin_accept_turn: u64,
    /// Connections with output to flush before the loop sleeps (each once:
    /// `Conn::dirty` says it is listed), and the list swapped in while it is.
    dirty: Vec<ConnId>,
    dirty_spare: Vec<ConnId>,
    /// Connections to resume next turn, each listed once (`Conn::carried`):
    /// those the turn came to after its time was up (`postponed`), then
    /// those whose budget ran out with work possibly left (`ready`). The
    /// turn's end moves both to `ready_carry`, postponed first, so a
    /// connection postponed is not passed over again by one served; the
    /// three lists take turns, so none reallocates.
    ready: Vec<ConnId>,
    postponed: Vec<ConnId>,
    ready_carry: Vec<ConnId>,
    /// Proxy mode: upstream connections and exchanges, and the pools' own listeners.
    proxy: Proxy,
    proxy_listeners: Vec<(TcpListener, PoolId)>,
    /// While stopping: connections still to be shut down (what they
    /// pipelined answered, then closed): every one at the signal, and later
    /// those whose proxied exchange ended.
    stopping: Vec<ConnId>,
    /// `drain_events` is running: a call from inside it leaves the events
    /// to its loop.
    draining: bool,
}

/// Whether any pool proxies (each proxied exchange holds two descriptors).
fn proxies(config: &Config) -> bool {
    config.pools.values().any(|p| p.upstream.is_some())
}

/// The resolver, whose thread (started by the first lookup; the other
/// thread there can be is the periodic snapshot's writer) runs the blocking lookups for upstream host names
/// (`net::resolve`).
fn new_resolver(
    poll: &Poll,
    config: &crate::config::resolver::ResolverConfig,
) -> Result<crate::net::resolve::Resolver, String> {
    let waker =
        mio::Waker::new(poll.registry(), RESOLVER).map_err(|e| format!("cannot create the resolver's waker: {e}"))?;
    Ok(crate::net::resolve::Resolver::new(std::sync::Arc::new(waker), config.policy(), config.nameservers()))
}

/// Connections the kernel queues for `accept` per listener (capped by
/// `net.core.somaxconn`), as nginx's 511 and more: a fleet reconnecting at
/// once after a restart or failover finds room, where std's and mio's 128
/// would drop SYNs and make clients wait out a one-second retransmit.
const LISTEN_BACKLOG: i32 = 1024;

/// A listener on `addr` with `LISTEN_BACKLOG`.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    // Listening again on a listening socket sets its backlog (listen(2)).
    socket2::SockRef::from(&listener).listen(LISTEN_BACKLOG)?;
    Ok(listener)
}

impl Server {
    /// Binds the listeners; errors name the cause for a one-line start-up failure.
    pub fn bind(
        config: &Config,
        listen_override: Option<SocketAddr>,
        config_path: Option<PathBuf>,
    ) -> Result<Server, String> {
        let listen = listen_override.unwrap_or_else(|| config.listen_addr());
        let poll = Poll::new().map_err(|e| format!("cannot create the event loop: {e}"))?;
        let mut listener = self::listen(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| format!("cannot register the listener: {e}"))?;
        let admin = match config.admin_addr() {
            None => None,
            Some(addr) => {
                let mut l = self::listen(addr).map_err(|e| format!("cannot listen on {addr} (adminListen): {e}"))?;
                poll.registry()
                    .register(&mut l, ADMIN, Interest::READABLE)
                    .map_err(|e| format!("cannot register the admin listener: {e}"))?;
                Some(l)
            }
        };
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2])
            .map_err(|e| format!("cannot install signal handlers: {e}"))?;
        // A write past a file size limit (`ulimit -f`, systemd's
        // `LimitFSIZE=`) raises SIGXFSZ, whose default ends the process: with
        // a handler the write fails with EFBIG instead, and the access log
        // and the snapshot count and log it like any failed write.
        signal_hook::flag::register(SIGXFSZ, Default::default())
            .map_err(|e| format!("cannot install signal handlers: {e}"))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(|e| format!("cannot register signals: {e}"))?;
        let mut clock = Clock::start();
        // Before the access log is opened: it must not be one of the files
        // checked (opened, it would create or grow that file).
        if let Some(path) = config_path.as_deref() {
            state::check_files(config, path)?;
        }
        // Before any file is created (the access log, the slot secret): a
        // second instance on this state file stops here and leaves nothing.
        let state_lock = state::StateLock::take(config, config_path.as_deref())?;
        let mut app = App::new(config, Entropy::from_fn(state::os_random))?;
        app.listen_addr = listener.local_addr().ok();
        let proxy_listeners = proxied::bind_listeners(config, &app, poll.registry())?;
        let fd_limit = fds::raise_limit();
        let resolver = new_resolver(&poll, &config.resolver)?;
        let persistence = app.start_state(config, config_path.as_deref(), state_lock, clock.epoch())?;
        let snapshot_timer = arm_snapshot(&mut app, &persistence, 0);
        Ok(Server {
            poll,
            listener: Some(listener),
            admin,
            signals,
            config_path,
            bound_listen: Listening::of(config, listen_override),
            listen_override,
            conns: Slab::with_capacity(1024),
            over_capacity: Vec::new(),
            stats: ServerStats::default(),
            metrics_len: 0,
            shutdown_at: None,
            shutdown_began: 0,
            snapshot_by: 0,
            app,
            persistence,
            snapshot_timer,
            now: clock.at(Instant::now()),
            clock,
            turn: 0,
            turn_started: Instant::now(),
            turn_time: TurnTime::default(),
            next_serial: 0,
            connection_cap: fds::ConnectionCap::new(config.max_connections, fd_limit, proxies(config), None),
            fd_limit,
            open_public: 0,
            open_admin: 0,
            open_refused: 0,
            lingering: 0,
            admin_conns: Vec::with_capacity(ADMIN_MAX_CONNECTIONS),
            timeouts: Timeouts::from(config),
            idle_spin: Duration::from_micros(config.idle_spin_us),
            input_limit: input_limit(config),
            accept_paused: false,
            accept_warned: None,
            warnings_timer: None,
            admin_accept_turn: 0,
            dirty: Vec::new(),
            dirty_spare: Vec::new(),
            ready: Vec::new(),
            postponed: Vec::new(),
            ready_carry: Vec::new(),
            proxy: Proxy::new(resolver),
            proxy_listeners,
            stopping: Vec::new(),
            draining: false,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.as_ref().expect("listening").local_addr()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Each pool's own proxy listener (`upstream.listen`), by pool name.
    pub fn proxy_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.proxy_listeners
            .iter()
            .filter_map(|(l, pid)| Some((self.app.pool_name(*pid).to_owned(), l.local_addr().ok()?)))
            .collect()
    }

    /// Serves until a stop signal (TERM, INT, QUIT) has been handled.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        // Whether the wait spins before it sleeps (`idle`): after concurrent work.
        let mut spin = false;
        // From here until the stop's end, a log line never waits for standard error.
        crate::stdio::serving();
        // The clock reading the next wait counts from, when not the turn's.
        let mut waited_from = None;
        loop {
            let timeout = self.poll_timeout(waited_from.take().unwrap_or(self.now.ms));
            let spin_for = if spin { self.idle_spin } else { Duration::ZERO };
            match idle::wait(&mut self.poll, &mut events, timeout, spin_for) {
                Ok(found_spinning) => spin = found_spinning || idle::concurrent(&events),
                // A signal, or the process stopped and continued (SIGSTOP, a
                // debugger), which ends the wait early: any time may have
                // passed since the turn's reading, so the wait goes on from
                // a fresh one, not for its whole timeout again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    waited_from = Some(self.clock.now_ms());
                    continue;
                }
                Err(e) => return Err(e),
            }
            // One clock read per turn serves both the governor and server times.
            self.turn += 1;
            self.turn_started = Instant::now();
            self.turn_time.begin();
            self.now = self.clock.at(self.turn_started);
            self.app.begin_turn(self.now);
            crate::http::response::set_date(self.now.wall().0);
            // Deadlines due by now come first: a lease whose term ended is
            // reclaimed, and a waiter whose budget ran out is answered `504`,
            // before any request of this turn is read, so none of them is
            // answered from the state before (a 429 for a free slot, a grant
            // for a wait that had ended). What they decide is delivered below.
            self.app.advance(self.now.ms);
            // Those carried over from the last turn go first: the ones it
            // postponed have waited longest.
            let mut carried = std::mem::take(&mut self.ready_carry);
            for &id in &carried {
                if self.stop_is_due() {
                    break;
                }
                self.dispatch(id, Signal::Resume);
            }
            carried.clear();
            let (mut accept_public, mut accept_admin) = (false, false);
            for event in events.iter() {
                if self.stop_is_due() {
                    break;
                }
                match event.token() {
                    LISTENER => accept_public = true,
                    ADMIN => accept_admin = true,
                    SIGNALS => self.on_signals(),
                    RESOLVER => self.on_resolved(),
                    Token(t) if t >= proxied::UPSTREAM_BASE => self.on_upstream(t - proxied::UPSTREAM_BASE, event),
                    Token(t) if t >= proxied::PROXY_LISTENER_BASE => {
                        self.accept_proxy(t - proxied::PROXY_LISTENER_BASE)
                    }
                    Token(t) => {
                        let Some(entry) = self.conns.get(t) else {
                            continue;
                        };
                        let id = ConnId { index: t as u32, serial: entry.serial() };
                        let hangup = event.is_read_closed() || event.is_error();
                        let readable = event.is_readable() || hangup;
                        // The entry was just found under this id: no second check.
                        self.signal_entry(id, Signal::Ready { readable, hangup, writable: event.is_writable() });
                    }
                }
            }
            self.drain_events();
            if !self.stopping.is_empty() {
                self.shut_down_stopping();
            }
            self.settle_answers();
            self.flush_dirty();
            // Accepting comes last, so a connection whose close was read this
            // turn no longer counts against the budget of a new one.
            if accept_public {
                self.accept(false);
            }
            if accept_admin {
                self.accept(true);
            }
            self.stats.connections_open = self.conns.len() as u64;
            // What writing and accepting answered in turn (rarely anything).
            self.settle_answers();
            self.arm_trailing_warnings();
            self.app.end_turn(self.now.ms);
            self.ready_carry = if self.postponed.is_empty() {
                std::mem::replace(&mut self.ready, carried)
            } else {
                let mut next = std::mem::replace(&mut self.postponed, carried);
                next.append(&mut self.ready);
                next
            };
            if let Some(at) = self.shutdown_at {
                // Lingering connections have had every answer: an idle
                // keep-alive connection (HAProxy keeps some) ends the stop's
                // wait as soon as its FIN is sent.
                if self.conns.len() == self.lingering || self.clock.now_ms() >= at {
                    // A slow reader of the access log gets until the snapshot
                    // must begin, one of standard error until the stop is done.
                    let now = self.clock.now_ms();
                    let instant = |ms: Ms| Instant::now() + Duration::from_millis(ms.saturating_sub(now));
                    let log_until = instant(self.snapshot_by);
                    crate::stdio::stopping(instant(self.shutdown_began + STOP_DONE_MS));
                    self.cut_exchanges();
                    let (cut, draining) = (self.conns.len() - self.lingering, self.lingering);
                    let unclosed = self.close_all();
                    self.app.flush_log(log_until);
                    self.app.write_stop_snapshot(&mut self.persistence, self.clock.now_ms());
                    // The snapshot is safe: the kernel's part of the closes put off can take its time.
                    drop(unclosed);
                    self.write_trailing_warnings(true);
                    info!(
                        "shut down ({cut} connections cut at the deadline, {draining} closed while draining after their last answer)"
                    );
                    return Ok(());
                }
            }
        }
    }

    /// Stopping, and the grace has ended: what is left of the turn's work
    /// is cut (its connections are all closed at the turn's end), so a turn
    /// with many busy clients cannot hold the stop up.
    #[inline]
    fn stop_is_due(&self) -> bool {
        self.shutdown_at.is_some_and(|at| self.clock.now_ms() >= at)
    }

    /// Every open connection's id (for a pass that may close some).
    fn conn_ids(&self) -> Vec<ConnId> {
        self.conns.iter().map(|(t, entry)| ConnId { index: t as u32, serial: entry.serial() }).collect()
    }

    /// The stop's end: every connection still open gets one last write and
    /// is closed, so the grants that never left its output are released
    /// (SPEC §5) before the snapshot would keep them as held. What it sent
    /// and was never read is dropped first: the close is a FIN, and what
    /// the kernel took of its answers still reaches it.
    ///
    /// Each connection's grants and waits are settled here, but the sockets
    /// closed past `CLOSE_BEFORE_SNAPSHOT_MS` are returned open, to be
    /// dropped once the snapshot is written: with hundreds of thousands of
    /// connections the kernel's part of the closes takes seconds, and a
    /// supervisor's kill in that time must not cost the snapshot.
    #[cold]
    fn close_all(&mut self) -> Vec<TcpStream> {
        let discard_until = self.clock.now_ms() + CLOSE_ALL_MS;
        let mut sending = Vec::new();
        for id in self.conn_ids() {
            if let Some(conn) = client_mut(&mut self.conns, id) {
                conn.write_last();
                if self.clock.now_ms() < discard_until && conn.discard_input() > 0 {
                    sending.push((id, 0));
                }
            }
        }
        // A client still sending has more in its own kernel, which comes as
        // the reads make room: input arriving after the close would reset
        // it too. Dropped until none came for two milliseconds, within the
        // same bound.
        while !sending.is_empty() && self.clock.now_ms() < discard_until {
            std::thread::sleep(Duration::from_millis(1));
            sending.retain_mut(|(id, quiet)| {
                let Some(conn) = client_mut(&mut self.conns, *id) else { return false };
                *quiet = if conn.discard_input() > 0 { 0 } else { *quiet + 1 };
                *quiet < 2
            });
        }
        let close_until = (self.clock.now_ms() + CLOSE_BEFORE_SNAPSHOT_MS).min(self.snapshot_by);
        let mut unclosed = Vec::new();
        for id in self.conn_ids() {
            let socket = self.retire(id, crate::api::UNANSWERED_STOPPED);
            if !unclosed.is_empty() || self.clock.now_ms() >= close_until {
                unclosed.push(socket);
            }
        }
        // The lines of requests cut short (`pipeline::log_unanswered`) reach the log's last flush.
        self.settle_answers();
        unclosed
    }

    /// Hands a signal to the connection `id` names, by its kind; nothing
    /// when that connection is gone.
    fn dispatch(&mut self, id: ConnId, signal: Signal) {
        if self.conns.get(id.index as usize).is_some_and(|entry| entry.serial() == id.serial) {
            self.signal_entry(id, signal);
        }
    }

    /// `dispatch` for an `id` known to name a live entry.
    fn signal_entry(&mut self, id: ConnId, signal: Signal) {
        match self.conns[id.index as usize] {
            Entry::Client(_) => self.client_signal(id, signal),
        }
    }

    /// Removes the connection `id` names (which must exist), by its kind:
    /// its client went away, or has had all it will get.
    fn close(&mut self, id: ConnId) {
        self.close_for(id, crate::api::UNANSWERED_CLIENT_GONE);
    }

    /// `close`, saying why for an acquire it leaves unanswered (`pipeline::log_unanswered`).
    fn close_for(&mut self, id: ConnId, why: (u16, &'static str)) {
        drop(self.retire(id, why));
    }

    /// Removes the connection `id` names (which must exist) and settles
    /// what it held, as `close_for` does, but returns its socket still open.
    fn retire(&mut self, id: ConnId, why: (u16, &'static str)) -> TcpStream {
        match self.conns.remove(id.index as usize) {
            Entry::Client(conn) => self.close_client(id, conn, why),
        }
    }

    fn on_signals(&mut self) {
        let pending: Vec<i32> = self.signals.pending().collect();
        for signal in pending {
            match signal {
                SIGHUP => self.reload(Config::reload),
                // As nginx reads them: USR1 reopens the log files (what
                // logrotate recipes send), QUIT stops gracefully; USR2 (nginx's
                // binary upgrade) has no meaning here. None of them may end
                // the process by default, which would leave no snapshot.
                SIGUSR1 => {
                    info!("SIGUSR1: reopening the access log");
                    self.reopen_access_log();
                }
                SIGUSR2 => warn!("SIGUSR2 means nothing to this server; ignored"),
                _ => self.begin_shutdown(),
            }
        }
    }

    /// SIGHUP: re-read the configuration file with `load` and apply it
    /// without dropping anything; a bad file changes nothing. In the event
    /// loop, `load` is `Config::reload`, which opens nothing that could
    /// wait (a named pipe); before serving, `Config::load`, as at start.
    fn reload(&mut self, load: fn(&Path) -> Result<Config, ConfigError>) {
        // What was answered before the reload is logged where it was answered.
        self.settle_answers();
        let Some(path) = &self.config_path else {
            warn!("SIGHUP: running on the embedded configuration, nothing to reload");
            self.reopen_access_log();
            return;
        };
        let bound_admin = self.admin.as_ref().and_then(|l| l.local_addr().ok());
        let result = load(path).map_err(|e| e.to_string()).and_then(|config| {
            if let Some(bound) = bound_admin {
                config.check_admin_bound(bound).map_err(|e| e.to_string())?;
            }
            if let Some(listen) = self.listen_override {
                config.check_listen_override(listen).map_err(|e| e.to_string())?;
            }
            self.persistence.check_reload(&config, path)?;
            // The pools this process never had, before the reload makes them.
            let added: Vec<String> =
                config.pools.keys().filter(|name| self.app.pool_id(name).is_none()).cloned().collect();
            self.app.reconfigure(&config, self.now)?;
            Ok((config, added))
        });
        match result {
            Ok((config, added)) => {
                let before = Some(self.connection_cap);
                self.connection_cap =
                    fds::ConnectionCap::new(config.max_connections, self.fd_limit, proxies(&config), before);
                let timeouts = Timeouts::from(&config);
                if std::mem::replace(&mut self.timeouts, timeouts) != timeouts {
                    // A shorter timeout reaches the connections open now.
                    rearm_conn_timers(&mut self.app, &self.timeouts, &mut self.conns);
                }
                self.idle_spin = Duration::from_micros(config.idle_spin_us);
                self.input_limit = input_limit(&config);
                if let Some(resolver) = self.proxy.resolver.as_mut() {
                    resolver.reconfigure(config.resolver.policy(), config.resolver.nameservers());
                }
                if Listening::of(&config, self.listen_override) != self.bound_listen {
                    warn!(
                        "reload: new `listen`, `adminListen` or pool `upstream.listen` addresses take effect at the next restart"
                    );
                }
                if self.app.reconfigure_state(&mut self.persistence, &config, path, &added, self.now) {
                    // A new interval counts from the reload.
                    if let Some((_, timer)) = self.snapshot_timer.take() {
                        self.app.cancel_timer(timer);
                    }
                    self.snapshot_timer = arm_snapshot(&mut self.app, &self.persistence, self.now.ms);
                }
                self.stats.reloads_ok += 1;
                info!("configuration reloaded from {}", path.display());
                for caution in config.cautions() {
                    warn!("reload: {caution}");
                }
                self.recheck_waiters();
                self.app.grant_after_reload(self.now);
                self.drain_events();
            }
            Err(e) => {
                self.stats.reloads_failed += 1;
                error!("reload refused, the running configuration stays: {e}");
                self.reopen_access_log();
            }
        }
    }

    /// A SIGHUP whose configuration was not applied still reopens the
    /// access log (an applied one opened it anew): log rotation does not
    /// depend on the configuration file's fate.
    fn reopen_access_log(&mut self) {
        if let Err(e) = self.app.log.reopen() {
            warn!("reopening the access log: {e}; lines go on to the file open before");
        }
    }

    /// While stopping: the connections listed in `stopping` are shut down
    /// (what they pipelined is answered, then they close), in order, for at
    /// most `SHUTDOWN_SLICE_MS` of this turn; the others wait for the next.
    #[cold]
    #[inline(never)]
    fn shut_down_stopping(&mut self) {
        let mut ids = std::mem::take(&mut self.stopping);
        let until = self.clock.now_ms() + SHUTDOWN_SLICE_MS;
        let mut done = 0;
        for &id in &ids {
            if (done > 0 && self.clock.now_ms() >= until) || self.stop_is_due() {
                break;
            }
            self.dispatch(id, Signal::Shutdown);
            done += 1;
        }
        ids.drain(..done);
        // Those listed meanwhile (an exchange that ended) come after.
        ids.append(&mut self.stopping);
        self.stopping = ids;
    }

    /// A stop signal (TERM, INT, QUIT): stop accepting, answer what was already read (waiters
    /// get a 503), then close everything and exit within the grace period.
    fn begin_shutdown(&mut self) {
        if self.shutdown_at.is_some() {
            return;
        }
        let snapshot_ms = self.app.stop_snapshot_ms(&self.persistence);
        let times = StopTimes::new(self.now.ms, self.conns.len(), snapshot_ms);
        info!("shutting down: clients have {} ms, the snapshot {snapshot_ms} ms", times.grace_end - self.now.ms);
        self.shutdown_began = self.now.ms;
        self.shutdown_at = Some(times.grace_end);
        self.snapshot_by = times.snapshot_by;
        for mut l in [self.listener.take(), self.admin.take()].into_iter().flatten() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        for (mut l, _) in self.proxy_listeners.drain(..) {
            let _ = self.poll.registry().deregister(&mut l);
        }
        // Shut down a slice per turn (`shut_down_stopping`, this turn too).
        self.stopping = self.conn_ids();
    }

    /// How long the poll may wait: until the next deadline, counted from
    /// `now`, the turn's clock reading (as event loops commonly do), so a
    /// deadline fires at most one turn's work late and a turn costs one
    /// clock read; after an interrupted wait, a fresh reading.
    fn poll_timeout(&mut self, now: Ms) -> Option<Duration> {
        if !self.ready_carry.is_empty() || !self.dirty.is_empty() || !self.stopping.is_empty() {
            return Some(Duration::ZERO);
        }
        // Stopping with nothing left to answer (a stop asked for while starting): the next turn ends it.
        if self.shutdown_at.is_some() && self.conns.len() == self.lingering {
            return Some(Duration::ZERO);
        }
        // A stopping server wakes at its deadline whatever else is (or is not) due.
        let wake = match (self.app.next_deadline(), self.shutdown_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        wake.map(|at| Duration::from_millis(at.saturating_sub(now)))
    }

    fn accept(&mut self, admin: bool) {
        if self.accept_paused {
            return;
        }
        if admin && std::mem::replace(&mut self.admin_accept_turn, self.turn) == self.turn {
            // This turn's share is taken: the rest wait for a wake.
            self.app.schedule(self.now.ms + 1, Wake::AdminAccept);
            return;
        }
        for accepted in 0.. {
            if admin && accepted == ADMIN_ACCEPTS_PER_TURN {
                // No new edge will announce the rest: a wake does, next turn.
                self.app.schedule(self.now.ms + 1, Wake::AdminAccept);
                return;
            }
            let listener = if admin { &self.admin } else { &self.listener };
            let Some(listener) = listener else { return };
            match listener.accept() {
                Ok((stream, peer)) => {
                    self.admit(stream, peer, admin);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.free_a_descriptor(&e) => {}
                Err(e) => return self.pause_accepts(&e),
            }
        }
    }

    /// Out of descriptors with upstream connections kept idle for reuse:
    /// one is closed for the client waiting to be accepted. Whether one was.
    pub(super) fn free_a_descriptor(&mut self, e: &io::Error) -> bool {
        crate::net::resolve::out_of_descriptors(e) && self.proxy.close_oldest_idle(self.poll.registry())
    }

    /// EMFILE and friends: the pending connection stays in the backlog and
    /// the listener would fire again at once, so every listener stops
    /// accepting for a moment instead of spinning; `Wake::Accept` resumes
    /// them all, the admin listener first.
    pub(super) fn pause_accepts(&mut self, e: &io::Error) {
        match &mut self.accept_warned {
            Some((at, unlogged, last)) if self.now.ms < *at + ACCEPT_WARN_EVERY_MS => {
                *unlogged += 1;
                *last = self.now.ms;
            }
            last => {
                let unlogged = match last.map_or(0, |(_, n, _)| n) {
                    0 => String::new(),
                    n => format!(" ({n} more failures since the last such warning)"),
                };
                warn!("accept failed ({e}); pausing accepts for {ACCEPT_PAUSE_MS} ms at a time{unlogged}");
                *last = Some((self.now.ms, 0, self.now.ms));
            }
        }
        self.accept_paused = true;
        self.app.schedule(self.now.ms + ACCEPT_PAUSE_MS, Wake::Accept);
    }

    /// Arms `Wake::Warnings` for when a warning left out by its interval (a
    /// failed accept's, an upstream's) may have had none like it for that
    /// long, so the count of those left out is written even when no warning
    /// like them follows. Each turn; two comparisons when nothing was left out.
    fn arm_trailing_warnings(&mut self) {
        let upstream = self.proxy.warnings_due().map(|at| self.clock.ms_at(at) + 1);
        let accept = self.accept_warned.filter(|&(_, n, _)| n > 0).map(|(_, _, last)| last + ACCEPT_WARN_EVERY_MS);
        let Some(due) = upstream.into_iter().chain(accept).min() else {
            return;
        };
        if let Some((armed, key)) = self.warnings_timer {
            if armed <= due {
                return;
            }
            self.app.cancel_timer(key);
        }
        self.warnings_timer = Some((due, self.app.schedule(due, Wake::Warnings)));
    }

    /// Writes how many warnings were left out where none like them has come
    /// for their interval since (all of them when `all`: at the stop), so a
    /// burst that ends is counted whole in the log.
    fn write_trailing_warnings(&mut self, all: bool) {
        self.proxy.write_trailing_warnings(all);
        if let Some((_, unlogged, last)) = &mut self.accept_warned {
            if *unlogged > 0 && (all || self.now.ms >= *last + ACCEPT_WARN_EVERY_MS) {
                warn!("failed accepts have stopped ({unlogged} more failures since the last such warning)");
                *unlogged = 0;
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr, admin: bool) -> Option<ConnId> {
        let (open, budget) =
            if admin { (self.open_admin, ADMIN_MAX_CONNECTIONS) } else { (self.open_public, self.connection_cap.cap) };
        // A full admin listener closes its longest-idle connection for the
        // new one: idle connections must not keep health checks out.
        if open >= budget && !(admin && self.close_idlest_admin()) {
            self.stats.connections_refused += 1;
            if !admin {
                self.app.count_refused_connection();
            }
            // Written anew each time, for its `Date`.
            self.over_capacity.clear();
            let headers: &[u8] = if admin { crate::dashboard::SECURITY_HEADERS } else { b"" };
            ApiError::OverCapacity(budget as u64).write_with(&mut self.over_capacity, &mut Vec::new(), true, headers);
            if self.open_refused < REFUSED_LINGERING_MAX {
                // Kept until its answer is flushed and what it sent is
                // drained, so the close cannot reset the answer away.
                if let Some(id) = self.insert_conn(stream, peer, admin) {
                    let conn = client_mut(&mut self.conns, id).expect("just inserted");
                    conn.refused = true;
                    conn.output.extend_from_slice(&self.over_capacity);
                    conn.close_after_flush();
                    self.open_refused += 1;
                    self.arm_timer(id);
                    self.mark_dirty(id);
                }
            } else {
                let _ = stream.write(&self.over_capacity);
            }
            return None;
        }
        self.stats.connections_accepted += 1;
        let id = self.insert_conn(stream, peer, admin)?;
        *(if admin { &mut self.open_admin } else { &mut self.open_public }) += 1;
        if admin {
            self.admin_conns.push(id);
        }
        self.arm_timer(id);
        Some(id)
    }

    /// Registers an accepted stream and gives it a connection entry.
    fn insert_conn(&mut self, mut stream: TcpStream, peer: SocketAddr, admin: bool) -> Option<ConnId> {
        let _ = stream.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let token = entry.key();
        if self.poll.registry().register(&mut stream, Token(token), Interest::READABLE).is_err() {
            return None;
        }
        let serial = self.next_serial;
        self.next_serial = serial.wrapping_add(1);
        // Registering reports readiness that already exists, so no read is tried here.
        entry.insert(Entry::Client(Conn::new(stream, peer, serial, admin, self.input_limit, self.now.ms)));
        Some(ConnId { index: token as u32, serial })
    }

    /// Makes way for a new admin connection, so that a health check always
    /// gets in. First to go is a connection stuck for `ADMIN_SLOW_REQUEST_MS`
    /// or more: idle longest (nothing in progress: no input, no body,
    /// nothing unsent), else its request arriving longest (on loopback a
    /// request arrives at once: a client sending it that slowly, on purpose
    /// or not, must not keep health checks out), else its answers unread
    /// longest; then one done and lingering (closing that one may cut its
    /// last answer short); then, the listener full of connections younger
    /// than that, the one that has been in its state longest. A flood of new
    /// connections (that pipeline and never read, say) then goes first in,
    /// first out, and a health check accepted among them has as many
    /// arrivals' time to be answered as the listener has places, rather than
    /// going first as "idle" before it was read. Returns whether one was
    /// closed.
    fn close_idlest_admin(&mut self) -> bool {
        let now = self.now.ms;
        let stuck = |since: Ms| now.saturating_sub(since) >= ADMIN_SLOW_REQUEST_MS;
        let idlest = self
            .admin_conns
            .iter()
            .filter_map(|&id| {
                let Some(Entry::Client(conn)) = self.conns.get(id.index as usize) else { return None };
                debug_assert_eq!(conn.serial, id.serial, "admin_conns lists the connections open");
                if conn.is_lingering() {
                    return Some(((3, conn.last_active), id));
                }
                let open = conn.is_open() && conn.unsent() == 0;
                let (rank, since) = match conn.request_started {
                    None if open && conn.input.is_empty() && conn.pending.is_none() => (0, conn.last_active),
                    Some(started) if open => (1, started),
                    _ if conn.unsent() > 0 => (2, conn.out_since),
                    _ => return None,
                };
                // Young: one being answered goes before one still arriving,
                // before one not read from yet (a health check just accepted).
                Some(((if stuck(since) { rank } else { 6 - rank }, since), id))
            })
            .min_by_key(|&(order, _)| order);
        let Some((_, id)) = idlest else {
            return false;
        };
        debug!("admin listener full: closing the connection idle longest");
        self.close(id);
        true
    }

    /// The attempts answered so far this turn are recorded (history,
    /// latency, access log) with their server time up to now, as their
    /// answers are about to be written: one clock reading serves them all.
    fn settle_answers(&mut self) {
        if self.app.has_answered() {
            self.app.settle_answers(Instant::now());
        }
    }

    /// Writes every listed connection's pending output, then closes the ones
    /// that are done. Once the stop is due, the rest get their last write
    /// from `close_all` instead.
    fn flush_dirty(&mut self) {
        let mut dirty = std::mem::replace(&mut self.dirty, std::mem::take(&mut self.dirty_spare));
        for &id in &dirty {
            if self.stop_is_due() {
                break;
            }
            // Only client connections are listed; one gone since is skipped.
            self.flush(id);
        }
        // Flushing above may have queued more output in `self.dirty`: it is
        // flushed next turn (the poll does not sleep while it is non-empty).
        dirty.clear();
        self.dirty_spare = dirty;
    }

    /// Acts on what the application decided since the last call: queued
    /// acquires answered, the reactor's own timers.
    ///
    /// Acting on one event may queue the next: an exchange granted a slot
    /// fails at once (its upstream refuses connections), its release grants
    /// the next waiter, and so on down the queue. Those are taken by the
    /// loop already running, never by a nested one, so the stack does not
    /// grow with the queue (thousands of waiters overflowed it).
    fn drain_events(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        while let Some(event) = self.app.next_event() {
            match event {
                Event::Answer(id, answer) => self.deliver(id, answer),
                Event::Wake(Wake::AdminAccept) => self.accept(true),
                Event::Wake(Wake::Accept) => {
                    // Descriptors freed since the pause go to health checks
                    // and scrapes first: the public backlog would take them all.
                    self.accept_paused = false;
                    self.accept(true);
                    self.accept(false);
                    for i in 0..self.proxy_listeners.len() {
                        self.accept_proxy(i);
                    }
                }
                Event::Wake(Wake::Conn(id)) => self.dispatch(id, Signal::Deadline),
                Event::Wake(Wake::UpstreamIdle) => self.sweep_idle_upstreams(),
                Event::Wake(Wake::Warnings) => {
                    self.warnings_timer = None;
                    self.write_trailing_warnings(false);
                }
                // Not the armed timer's when a reload in this turn re-armed it
                // after this one fired (its interval counts from the reload),
                // or disarmed it: another periodic chain would start.
                Event::Wake(Wake::Snapshot) if self.snapshot_timer.is_none_or(|(at, _)| at > self.now.ms) => {}
                // A stop writes its own at its end: none begins in its grace,
                // whose copy and write the stop's snapshot would wait for.
                Event::Wake(Wake::Snapshot) if self.shutdown_at.is_some() => {}
                Event::Wake(Wake::Snapshot) => {
                    self.app.write_periodic_snapshot(&mut self.persistence, self.now.ms);
                    self.snapshot_timer = arm_snapshot(&mut self.app, &self.persistence, self.now.ms);
                }
            }
        }
        self.draining = false;
    }

    // ------------------------------------------------------------ client connections

    fn client_signal(&mut self, id: ConnId, signal: Signal) {
        match signal {
            Signal::Ready { readable, hangup, writable } => {
                if readable {
                    self.on_readable(id, hangup);
                }
                if writable {
                    if let Some(conn) = client_mut(&mut self.conns, id) {
                        conn.write_blocked = false;
                    }
                    self.mark_dirty(id);
                }
            }
            Signal::Resume => {
                if let Some(conn) = client_mut(&mut self.conns, id) {
                    conn.carried = false;
                }
                self.read_and_process(id);
            }
            Signal::Deadline => self.on_conn_timer(id),
            Signal::Shutdown => self.shut_down_client(id),
        }
    }

    /// Every request already read is answered: a waiter gets its 503, then
    /// what was pipelined behind it runs, the last answer saying the
    /// connection closes (`Conn::stopping`). Then the connection closes; one in
    /// a proxied exchange closes once the exchange ends (`end_exchange` lists
    /// it in `stopping`), or is cut at the end of the grace (`cut_exchanges`).
    fn shut_down_client(&mut self, id: ConnId) {
        let (now, turn) = (self.now, self.turn);
        if let Some(conn) = client_mut(&mut self.conns, id) {
            conn.lift_budget(turn);
            conn.stopping = true;
        }
        self.process(id);
        while let Some(conn) = client_mut(&mut self.conns, id) {
            let say_kept_alive = conn.waits_http10_keep_alive();
            let Some((queued, _)) = conn.stop_waiting() else {
                break;
            };
            let last = conn.input.is_empty();
            if conn.exchange.is_some() {
                self.end_queued_exchange(id, &queued, WaitEnd::ShuttingDown, last);
            } else {
                // What was pipelined behind it is answered on this connection.
                write_kept_alive(&mut conn.output, say_kept_alive && !last, |out| {
                    self.app.answer_shutdown(out, &queued, id, now, last)
                });
            }
            self.process(id);
        }
        if let Some(conn) = client_mut(&mut self.conns, id) {
            match conn.exchange {
                // In flight: it finishes within the grace. With nothing read
                // behind it, its response head says the connection closes.
                Some(ex) if conn.input.is_empty() => self.proxy.exchanges[ex].client_side.keep_alive = false,
                Some(_) => {}
                // A request still arriving: answered if it completes within
                // the grace, then the connection closes.
                None if conn.request_started.is_some() && conn.unsent() <= conn::OUTPUT_HIGH_WATER => {
                    conn.last_request = true
                }
                None => {
                    // Behind answers it does not read: what it sent is never read.
                    let why = crate::api::UNANSWERED_STOPPED;
                    pipeline::log_unanswered(&mut self.app, conn, self.turn_started, self.now, why);
                    conn.close_after_flush();
                }
            }
            self.mark_dirty(id);
        }
    }

    /// A readiness event: the socket may hold data (or the peer's FIN).
    fn on_readable(&mut self, id: ConnId, hangup: bool) {
        self.read_and_process_after(id, Some(hangup));
    }

    /// Reads what the socket holds, within the turn's budget and the
    /// connection's buffer limits, then answers what arrived. Reading pauses
    /// (the socket stays marked readable) while the input is full or the
    /// output is over its high-water mark; answering or flushing resumes it.
    fn read_and_process(&mut self, id: ConnId) {
        self.read_and_process_after(id, None);
    }

    /// `read_and_process`, after a readiness event (`Some` with its hangup
    /// flag) or not (`None`).
    fn read_and_process_after(&mut self, id: ConnId, hangup_event: Option<bool>) {
        let (now, turn) = (self.now, self.turn);
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        if let Some(hangup) = hangup_event {
            conn.readable = true;
            // With the FIN already seen, a short read is not the end: read to
            // EOF, since no new edge will announce it.
            conn.hangup |= hangup;
        }
        if self.turn_time.is_up(self.turn_started) {
            // The turn's time is up: the next turn begins with it, its
            // readiness kept. A client whose FIN is seen still leaves the
            // queue now (see below).
            carry(&mut self.postponed, conn, id);
            if conn.hangup {
                self.withdraw_stopped_waiter(id, now);
            }
            return;
        }
        if conn.is_lingering() {
            self.drain_lingering(id);
            return;
        }
        let received = conn.received;
        let mut failed = false;
        while conn.may_read() {
            let budget = conn.budget(turn);
            if budget.reads == 0 || budget.bytes == 0 {
                // Fairness: the rest waits for the next turn.
                carry(&mut self.ready, conn, id);
                break;
            }
            budget.reads -= 1;
            let max = budget.bytes;
            let was_empty = conn.input.is_empty();
            let before_read = conn.received;
            let io = conn.read_once(max);
            conn.budget(turn).bytes -= (conn.received - before_read) as usize;
            match io {
                Ok(io @ (Io::Continue | Io::Drained)) => {
                    conn.last_active = now.ms;
                    conn.read_at = now.ms;
                    if was_empty && conn.pending.is_none() && conn.request_started.is_none() {
                        conn.request_started = Some(now.ms);
                    }
                    // A short read emptied the socket; new data raises a new edge.
                    if io == Io::Drained && !conn.hangup {
                        conn.readable = false;
                    }
                }
                Ok(Io::WouldBlock) => conn.readable = false,
                Ok(io @ (Io::Closed | Io::Reset)) => {
                    conn.read_closed = true;
                    conn.reset |= io == Io::Reset;
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
            self.close(id);
            return;
        }
        // A client that closed or half-closed leaves the queue now, before
        // anything later in this turn can grant it a slot: as soon as its FIN
        // is seen, even when a full input buffer keeps it from being read. It
        // is answered (a half-closed client still reads), and what it
        // pipelined behind the acquire is answered after it. A proxied
        // request's wait ends with its exchange (`pump_exchange`), which
        // counts the FIN the same way.
        if conn.read_closed | conn.hangup {
            self.withdraw_stopped_waiter(id, now);
        } else if conn.is_waiting() && conn.input_full() {
            self.refuse_deep_waiter(id, now);
        }
        self.process(id);
        match client_mut(&mut self.conns, id) {
            // Stopping: a proxied request still arriving at the signal that
            // now waits in its pool's queue is answered as the waiters were.
            Some(conn) if conn.stopping && conn.is_waiting() => self.shut_down_client(id),
            // Answering may have made room for input still in the socket.
            Some(conn) if conn.may_read() => carry(&mut self.ready, conn, id),
            _ => {}
        }
    }

    /// Reads and drops what a closing client still sends; closes at its EOF.
    fn drain_lingering(&mut self, id: ConnId) {
        let turn = self.turn;
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        loop {
            let budget = conn.budget(turn);
            if budget.reads == 0 {
                // Still more: continue next turn.
                carry(&mut self.ready, conn, id);
                return;
            }
            budget.reads -= 1;
            let io = conn.read_once(usize::MAX);
            conn.input.consume(conn.input.end - conn.input.start);
            match io {
                // A client cut off for not reading, still sending past what
                // it may: it is reset.
                Ok(Io::Continue | Io::Drained) if conn.received > conn.drain_until => {
                    self.close(id);
                    return;
                }
                Ok(Io::Continue) => {}
                Ok(Io::Drained) if conn.hangup => {}
                Ok(Io::Drained | Io::WouldBlock) => {
                    conn.readable = false;
                    return;
                }
                Ok(Io::Closed | Io::Reset) | Err(_) => {
                    self.close(id);
                    return;
                }
            }
        }
    }

    fn mark_dirty(&mut self, id: ConnId) {
        if let Some(conn) = client_mut(&mut self.conns, id) {
            mark_conn_dirty(&mut self.dirty, conn, id);
        }
    }

    /// Writes the connection's pending output, then closes it if it is done.
    fn flush(&mut self, id: ConnId) {
        let now = self.now;
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        conn.dirty = false;
        if conn.read_closed {
            // A half-closed client leaves the queue at once.
            if let Some((queued, _)) = conn.stop_waiting() {
                self.app.waiter_gone(&queued, id, now);
            }
            // Complete requests left behind this turn's budget or the
            // output's high-water mark are answered first; a request that
            // can never be completed closes the connection where it stops
            // (`pipeline::process`).
            if conn.input.is_empty() || conn.exchange.is_some() {
                conn.close_after_flush();
            }
        }
        let sent = conn.sent;
        let flushed = conn.flush(now.ms);
        conn.write_blocked = matches!(flushed, Ok(Flush::Pending));
        if conn.write_blocked && !conn.watch_writable {
            // Re-registering reports the socket writable if it already is.
            let both = Interest::READABLE | Interest::WRITABLE;
            if self.poll.registry().reregister(&mut conn.stream, Token(id.index as usize), both).is_ok() {
                conn.watch_writable = true;
            } else {
                // Never woken to write the rest: its deadline closes it.
                warn!("{}: cannot watch the connection for writability", conn.peer);
            }
        }
        let (app, timeouts) = (&mut self.app, &self.timeouts);
        self.stats.bytes_sent += conn.sent - sent;
        match flushed {
            Ok(Flush::Done) if conn.is_closing() => {
                if conn.read_closed || conn.resets {
                    self.close(id);
                } else if conn.is_lingering() {
                    // Already draining (a writable event, say): its EOF or
                    // its deadline closes it, not this.
                } else {
                    // Close our side, then drain what the client still sends.
                    let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                    conn.linger(now.ms + LINGER_MS);
                    self.lingering += 1;
                    conn.input.consume(conn.input.end - conn.input.start);
                    self.arm_timer(id);
                    self.read_and_process(id);
                }
            }
            Ok(Flush::Done | Flush::Pending) if conn.exchange.is_some() => {
                // Room in the output: the upstream may be read on, and the
                // client's body taken. Not when the socket took nothing: the
                // exchange is as it was (and would mark it for a flush again).
                if !conn.write_blocked || conn.sent > sent {
                    self.read_and_process(id);
                }
            }
            Ok(Flush::Done | Flush::Pending) => {
                let resume = conn.unsent() == 0 && (conn.readable || !conn.input.is_empty()) && !conn.is_waiting();
                arm_conn_timer(app, timeouts, conn, id);
                if resume {
                    // Output drained below the high-water mark: read on.
                    self.read_and_process(id);
                }
            }
            Ok(Flush::Closed) => self.close(id),
            Err(e) => {
                debug!("write failed: {e}");
                self.close(id);
            }
        }
    }

    /// Writes a queued acquire's answer to the connection that waits for it,
    /// then goes on with what it pipelined; an answer nobody waits for any
    /// more is handed back (a granted slot is released).
    fn deliver(&mut self, id: ConnId, answer: crate::api::Answer) {
        let now = self.now;
        let Some(conn) = client_mut(&mut self.conns, id).filter(|c| c.is_waiting()) else {
            // Its client is gone: the answer cannot be delivered.
            self.app.answer_undeliverable(answer, now.ms);
            return;
        };
        let say_kept_alive = conn.waits_http10_keep_alive();
        let (queued, close) = conn.stop_waiting().expect("the connection waits");
        if conn.unsent() == 0 {
            conn.out_since = now.ms;
        }
        if conn.exchange.is_some() {
            let end = match answer {
                crate::api::Answer::Granted(grant) => return self.grant_exchange(id, &grant),
                crate::api::Answer::TimedOut(denial) => WaitEnd::TimedOut(denial),
                crate::api::Answer::Superseded => WaitEnd::Superseded,
            };
            self.end_queued_exchange(id, &queued, end, close);
            self.read_and_process(id);
            return;
        }
        // The answer is the connection's activity: its idle time (and the
        // head time of what it pipelined behind) counts from now, as after
        // any answer, not from the acquire that began the wait.
        conn.last_active = now.ms;
        conn.request_started = (!conn.input.is_empty()).then_some(now.ms);
        let peer_done_sending = conn.peer_done_sending();
        let granted = write_kept_alive(&mut conn.output, say_kept_alive, |out| match answer {
            // Granted in the turn its client's close was read, before that:
            // the slot goes back at once, and the client hears its wait ended.
            crate::api::Answer::Granted(grant) if peer_done_sending => {
                self.app.withdraw_granted(out, &grant, &queued, now, close);
                None
            }
            answer => self.app.answer_notice(out, answer, &queued, now, close),
        });
        if let Some(slot) = granted {
            conn.undelivered.push((slot, conn.output.len()));
        }
        self.mark_dirty(id);
        self.read_and_process(id);
    }

    /// A waiting client stopped sending: its acquire is withdrawn and
    /// answered `504` (saying `Connection: close` when its request did),
    /// unless the governor answered it earlier in this turn (a release
    /// granted it, a retry superseded it): that answer comes first, from
    /// `deliver`, which hands no grant to a client that stopped sending.
    #[cold]
    fn withdraw_stopped_waiter(&mut self, id: ConnId, now: Now) {
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        let Some(queued) = conn.queued().copied().filter(|_| conn.read_closed || conn.exchange.is_none()) else {
            return;
        };
        if conn.reset && conn.exchange.is_none() {
            // Nothing can reach a client that reset: it is gone (`499`), as
            // when its connection closes while it waits.
            conn.stop_waiting();
            self.app.waiter_gone(&queued, id, now);
            return;
        }
        let (close, say_kept_alive) = (conn.waits_to_close(), conn.waits_http10_keep_alive());
        if write_kept_alive(&mut conn.output, say_kept_alive, |out| self.app.withdraw(out, &queued, id, now, close)) {
            conn.stop_waiting();
            self.mark_dirty(id);
        }
    }

    /// After a reload: the acquires and proxied requests waiting in a queue
    /// whose key or address the configuration no longer admits are answered
    /// (`App::refused_since_reload`), and so are the proxied requests whose
    /// head was written for an upstream the reload changed or took away:
    /// they can never be sent, and left waiting each would take a slot and
    /// a rate token, and hold its place in the queue, only to be refused.
    /// The reload grants nothing before this (`App::grant_after_reload`).
    #[cold]
    fn recheck_waiters(&mut self) {
        let now = self.now;
        for id in self.conn_ids() {
            let Some(conn) = client_mut(&mut self.conns, id) else {
                continue;
            };
            let Some(queued) = conn.queued().copied() else {
                continue;
            };
            let (close, say_kept_alive) = (conn.waits_to_close(), conn.waits_http10_keep_alive());
            if let Some(ex) = conn.exchange {
                let refused = self.app.refused_since_reload(&queued, id, now).or_else(|| {
                    let error = proxied::upstream_for(&self.app, &self.proxy.exchanges[ex]).err()?;
                    self.app.withdraw_unsendable(&queued, id, now).then_some(error)
                });
                if let Some(error) = refused {
                    conn.stop_waiting();
                    self.end_queued_exchange(id, &queued, WaitEnd::Refused(error), close);
                }
                continue;
            }
            let refused = |out: &mut Vec<u8>| self.app.recheck_waiter(out, &queued, id, now, close);
            if write_kept_alive(&mut conn.output, say_kept_alive, refused) {
                conn.stop_waiting();
                self.mark_dirty(id);
            }
        }
    }

    /// A waiting client whose pipelined input filled its connection's
    /// buffer: its close could not be seen any more (see
    /// `App::refuse_deep_waiter`), so it is answered and the connection closes.
    #[cold]
    fn refuse_deep_waiter(&mut self, id: ConnId, now: Now) {
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        let Some(queued) = conn.queued().copied().filter(|_| conn.exchange.is_none()) else {
            return;
        };
        // Full: its buffer is as large as the connection's input may grow.
        let buffered = conn.input.buf.len();
        if self.app.refuse_deep_waiter(&mut conn.output, &queued, id, now, buffered) {
            conn.stop_waiting();
            conn.close_after_flush();
            self.mark_dirty(id);
        }
    }

    fn on_conn_timer(&mut self, id: ConnId) {
        let now = self.now.ms;
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        conn.timer = None;
        if conn.exchange.is_some() && !conn.is_waiting() && conn.exchange_deadline <= now {
            self.exchange_timed_out(id);
        } else if conn.deadline(&self.timeouts) <= now {
            if conn.request_started.is_some() && conn.pending.is_none() && conn.input.only_empty_line() {
                // The head clock was started by nothing but the empty line
                // some clients send after a request (in one read or two): it
                // is dropped, as the next parse would skip it, and the
                // connection is idle, kept to `idleTimeoutMs`. Found here,
                // when that clock runs out, the request path pays nothing.
                let taken = conn.input.end - conn.input.start;
                conn.input.consume(taken);
                conn.request_started = None;
                self.arm_timer(id);
                return;
            }
            if conn.unsent() > 0 && !conn.write_probed {
                // Writability lags what the client read (a full socket is
                // reported writable only once much of it drained): before a
                // client with answers pending is taken for one that stopped
                // reading, the end of this turn tries a write, and the
                // connection is judged again a moment later. A write that
                // goes through moves its deadlines on.
                conn.write_probed = true;
                mark_conn_dirty(&mut self.dirty, conn, id);
                let again = now + 1;
                conn.timer = Some((again, self.app.schedule(again, Wake::Conn(id))));
                return;
            }
            debug!("closing {}: deadline passed", conn.peer);
            if conn.unsent() > 0 && conn.exchange.is_none() && !conn.is_lingering() {
                self.cut_off(id);
            } else {
                self.close_for(id, crate::api::UNANSWERED_TIMEOUT);
            }
        } else {
            conn.write_probed = false;
            self.arm_timer(id);
        }
    }

    /// A client that took none of its answers for `writeTimeoutMs`: the
    /// answers it was never sent are dropped (their grants released, as at
    /// any close), and it closes as after a last answer, draining what it
    /// still sends (`Phase::Lingering`). Closed with that input unread, the
    /// socket would send a reset, and the client's kernel would drop the
    /// answers it already took: grants counted as delivered, which their
    /// client could then never see, renew or release.
    #[cold]
    fn cut_off(&mut self, id: ConnId) {
        let now = self.now;
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        pipeline::log_unanswered(&mut self.app, conn, self.turn_started, now, crate::api::UNANSWERED_TIMEOUT);
        if let Some((queued, _)) = conn.stop_waiting() {
            self.app.waiter_gone(&queued, id, now);
        }
        for (slot, end) in conn.undelivered.drain(..) {
            if end > conn.out_pos {
                self.app.release_undelivered(&slot, now.ms);
            }
        }
        conn.output.truncate(conn.out_pos);
        conn.drain_until = conn.received + conn::DISCARD_AT_CLOSE as u64;
        conn.close_after_flush();
        // Flushed with the turn's other output: a call to `flush` here
        // would make the compiler keep it out of line on every answer's path.
        mark_conn_dirty(&mut self.dirty, conn, id);
    }

    /// Makes sure the wheel holds an entry no later than the connection's
    /// deadline. Later deadlines are not moved: the entry fires, re-checks
    /// and re-arms (one wheel entry per connection at most).
    fn arm_timer(&mut self, id: ConnId) {
        if let Some(conn) = client_mut(&mut self.conns, id) {
            arm_conn_timer(&mut self.app, &self.timeouts, conn, id);
        }
    }

    fn close_client(&mut self, id: ConnId, mut conn: Conn, why: (u16, &'static str)) -> TcpStream {
        pipeline::log_unanswered(&mut self.app, &conn, self.turn_started, self.now, why);
        if conn.is_lingering() {
            self.lingering -= 1;
        }
        if conn.refused {
            self.open_refused -= 1;
        } else if conn.admin {
            self.open_admin -= 1;
        } else {
            self.open_public -= 1;
        }
        if conn.admin {
            self.admin_conns.retain(|&a| a != id);
        }
        if let Some((queued, _)) = conn.stop_waiting() {
            self.app.waiter_gone(&queued, id, self.now);
        }
        if let Some((_, key)) = conn.timer.take() {
            self.app.cancel_timer(key);
        }
        for (slot, end) in conn.undelivered.drain(..) {
            if end > conn.out_pos {
                self.app.release_undelivered(&slot, self.now.ms);
            }
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if let Some(ex) = conn.exchange {
            self.abandon_exchange(ex, why);
        }
        conn.stream
    }
}

/// The addresses a configuration listens on: bound at start only, so a
/// reload that names others than the start's is told to need a restart.
#[derive(PartialEq, Eq)]
struct Listening {
    listen: String,
    admin: Option<String>,
    /// Each pool's own `upstream.listen`, by pool name.
    pools: Vec<(String, String)>,
}

impl Listening {
    /// The addresses `config` asks for, `--listen` (`listen_override`) in
    /// place of its `listen`.
    fn of(config: &Config, listen_override: Option<SocketAddr>) -> Listening {
        let pools = config
            .pools
            .iter()
            .filter_map(|(name, pool)| Some((name.clone(), pool.upstream.as_ref()?.listen.clone()?)))
            .collect();
        let listen = listen_override.map_or_else(|| config.listen.clone(), |l| l.to_string());
        Listening { listen, admin: config.admin_listen.clone(), pools }
    }
}

/// A stop's deadlines, counted from the turn that read its signal.
#[derive(Debug, PartialEq)]
struct StopTimes {
    /// The clients' grace ends: what is still open is cut.
    grace_end: Ms,
    /// The snapshot, expected to take `snapshot_ms`, must begin.
    snapshot_by: Ms,
}

impl StopTimes {
    /// A stop that began at `began` with `open` connections and a snapshot
    /// expected to take `snapshot_ms`: the grace gives up the snapshot's
    /// time (down to `MIN_GRACE_MS`) and the closes', so that the snapshot
    /// is done `STOP_DONE_MS` after the signal.
    fn new(began: Ms, open: usize, snapshot_ms: u64) -> StopTimes {
        let closing = open as u64 * CLOSE_EACH_US / 1000;
        let grace = SHUTDOWN_GRACE_MS.saturating_sub(snapshot_ms).max(MIN_GRACE_MS).saturating_sub(closing);
        StopTimes { grace_end: began + grace, snapshot_by: began + STOP_DONE_MS.saturating_sub(snapshot_ms) }
    }
}

/// The periodic snapshot's timer, one interval from `now`, and when it is
/// due; `None` when the configuration asks for none.
fn arm_snapshot(app: &mut App, persistence: &state::Persistence, now: Ms) -> Option<(Ms, TimerKey)> {
    let at = now + persistence.interval_ms()?;
    Some((at, app.schedule(at, Wake::Snapshot)))
}

/// Every connection's timer, brought forward where its deadline under
/// `timeouts` is sooner (a later one is found when the timer fires).
fn rearm_conn_timers(app: &mut App, timeouts: &Timeouts, conns: &mut Slab<Entry>) {
    for (index, entry) in conns.iter_mut() {
        let Entry::Client(conn) = entry;
        let id = ConnId { index: index as u32, serial: conn.serial };
        arm_conn_timer(app, timeouts, conn, id);
    }
}

/// `Server::arm_timer` for a connection already in hand.
fn arm_conn_timer(app: &mut App, timeouts: &Timeouts, conn: &mut Conn, id: ConnId) {
    let at = conn.deadline(timeouts);
    if at == NEVER {
        return;
    }
    match conn.timer {
        Some((armed, _)) if armed <= at => {}
        Some((_, key)) => {
            app.cancel_timer(key);
            conn.timer = Some((at, app.schedule(at, Wake::Conn(id))));
        }
        None => conn.timer = Some((at, app.schedule(at, Wake::Conn(id)))),
    }
}

/// `Server::mark_dirty` for a connection already in hand.
fn mark_conn_dirty(dirty: &mut Vec<ConnId>, conn: &mut Conn, id: ConnId) {
    if !conn.dirty {
        conn.dirty = true;
        dirty.push(id);
    }
}

/// Lists a connection to be resumed next turn (once: `Conn::carried` says
/// it is listed, in `Server::ready` or `Server::postponed`).
fn carry(list: &mut Vec<ConnId>, conn: &mut Conn, id: ConnId) {
    if !conn.carried {
        conn.carried = true;
        list.push(id);
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

/// Signals that arrive while the server starts (a large configuration
/// takes a while to read): by default each would end the process, which
/// systemd counts as a clean exit (SIGHUP, SIGUSR1, SIGUSR2) or which
/// leaves no snapshot and no exit status of 0 (SIGTERM, SIGINT, SIGQUIT).
/// Caught from the first line of `main`; a reload or a reopen asked for
/// then is done once the server is up, before it serves (or stops); a stop
/// makes the server stop as soon as it is up, serving nothing. The default catches
/// none (a server started in-process, as the bench tools do).
#[derive(Default)]
pub struct EarlySignals {
    stop: Arc<AtomicBool>,
    reload: Arc<AtomicBool>,
    reopen: Arc<AtomicBool>,
}

impl EarlySignals {
    pub fn catch() -> Result<EarlySignals, String> {
        let early = EarlySignals::default();
        let flags = [
            (SIGTERM, &early.stop),
            (SIGINT, &early.stop),
            (SIGQUIT, &early.stop),
            (SIGHUP, &early.reload),
            (SIGUSR1, &early.reopen),
            (SIGUSR2, &Arc::default()),
        ];
        for (signal, flag) in flags {
            signal_hook::flag::register(signal, Arc::clone(flag))
                .map_err(|e| format!("cannot install signal handlers: {e}"))?;
        }
        Ok(early)
    }
}

/// Starts a server and runs it until a graceful shutdown; the binary's body.
/// `listen` is the command line's `--listen`, in place of the file's.
/// `on_ready` gets the bound public and admin addresses.
pub fn serve(
    config: &Config,
    listen: Option<SocketAddr>,
    config_path: Option<PathBuf>,
    early: EarlySignals,
    on_ready: impl FnOnce(SocketAddr, Option<SocketAddr>, &[(String, SocketAddr)]),
) -> Result<(), String> {
    let mut server = Server::bind(config, listen, config_path)?;
    if early.reopen.load(Ordering::Relaxed) {
        info!("SIGUSR1 during start-up: reopening the access log");
        server.reopen_access_log();
    }
    // Before a stop asked for too: its snapshot is then of the configuration
    // the file now holds, which the next start reads (as a running server
    // does both, in either order).
    if early.reload.load(Ordering::Relaxed) {
        info!("SIGHUP during start-up: reloading the configuration");
        server.reload(Config::load);
    }
    if early.stop.load(Ordering::Relaxed) {
        info!("a stop was asked for during start-up: stopping as soon as the server is up");
        server.begin_shutdown();
        return server.run().map_err(|e| format!("event loop failed: {e}"));
    }
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    info!("listening on {addr}");
    on_ready(addr, server.admin_addr(), &server.proxy_addrs());
    server.run().map_err(|e| format!("event loop failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_leaves_its_snapshot_room_within_the_second() {
        // No snapshot to write, a few connections: the grace is 0.8 s.
        assert_eq!(StopTimes::new(1000, 4, 0), StopTimes { grace_end: 1800, snapshot_by: 1900 });
        // 400 000 held slots (300 ms expected): the grace ends that much sooner,
        // and the snapshot is done 0.9 s after the signal.
        assert_eq!(StopTimes::new(1000, 0, 300), StopTimes { grace_end: 1500, snapshot_by: 1600 });
        // 4 000 connections to close take 100 ms more from it.
        assert_eq!(StopTimes::new(1000, 4000, 300), StopTimes { grace_end: 1400, snapshot_by: 1600 });
        // A snapshot as long as the grace leaves clients their least.
        assert_eq!(StopTimes::new(1000, 0, 1500), StopTimes { grace_end: 1100, snapshot_by: 1000 });
        assert_eq!(StopTimes::new(1000, 8000, 1500), StopTimes { grace_end: 1000, snapshot_by: 1000 });
    }
}
