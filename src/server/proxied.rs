//! The reactor's side of proxy mode: pool listeners, upstream readiness,
//! and the client connection's part in an exchange (SPEC §12).
//!
//! An exchange begins when a request head routed to a proxy pool is read
//! (`begin`), is admitted or queued through the governor like an acquire,
//! and is then pumped (`pump_exchange`) whenever either of its sockets is
//! ready or the client's output drains. It ends in one place
//! (`end_exchange`), which releases the slot with the outcome report.

use std::io;

use log::debug;
use mio::event::Event;
use mio::net::TcpListener;
use mio::{Interest, Registry, Token};

use super::conn::{Conn, NEVER, OUTPUT_HIGH_WATER};
use super::pipeline::strip_body;
use super::{client_mut, Server};
use crate::api::proxy::{ProxiedLine, WaitEnd};
use crate::api::{governor_headers, Admission, ApiError, App, ConnId, Ctx, Grant, PoolId, Queued, Wake, SHUTTING_DOWN};
use crate::config::upstream::Upstream;
use crate::config::Config;
use crate::http::chunked::ChunkError;
use crate::http::request::{BodyFraming, Head, Method};
use crate::http::response::{say_kept_alive, Status, Writer, CONTINUE};
use crate::proxy::head::{self, ClientSide};
use crate::proxy::{request_relay, Attached, ClientIo, Exchange, Expired, Keep, NewExchange, Phase, Proxy, Step};
use crate::time::{Ms, Now};

/// Upstream connections are registered at `UPSTREAM_BASE + slab index`.
pub const UPSTREAM_BASE: usize = usize::MAX / 2;
/// A pool's own listener is registered at `PROXY_LISTENER_BASE + its index`.
pub const PROXY_LISTENER_BASE: usize = usize::MAX / 4;

/// How an exchange ended.
#[derive(Debug, Clone, Copy)]
pub enum End {
    /// The response was relayed whole.
    Complete { close_client: bool },
    /// Answered by this server instead of the upstream (502, 504, 400, 413).
    Answered(ApiError),
    /// The upstream broke off mid-response: the client's connection is closed.
    Cut,
    /// The client's body broke its framing or its limit mid-response (this
    /// error): the client's connection is closed.
    BodyBroken(ApiError),
    /// The request cap was reached mid-response: the client's connection is closed.
    Capped,
    /// The client's connection ended, for this reason (as `close_for`
    /// says it: `client_gone` when the client left, `request_timeout` when
    /// it stopped reading for `writeTimeoutMs`, `unavailable` at a stop).
    Closed((u16, &'static str)),
    /// The server stopped with the response under way (its head sent): the
    /// client's connection is closed.
    Stopped,
    /// Never admitted: its queue wait ended in a refusal, already answered and logged.
    Refused,
}

/// Binds every pool's own `upstream.listen`.
pub fn bind_listeners(config: &Config, app: &App, registry: &Registry) -> Result<Vec<(TcpListener, PoolId)>, String> {
    let mut listeners = Vec::new();
    for name in config.pools.keys() {
        let pid = app.pool_id(name).expect("a configured pool");
        let Some(addr) = app.upstream(pid).and_then(|u| u.listen) else {
            continue;
        };
        let mut l =
            super::listen(addr).map_err(|e| format!("cannot listen on {addr} (pools.{name}.upstream.listen): {e}"))?;
        registry
            .register(&mut l, Token(PROXY_LISTENER_BASE + listeners.len()), Interest::READABLE)
            .map_err(|e| format!("cannot register the proxy listener of pool {name}: {e}"))?;
        listeners.push((l, pid));
    }
    Ok(listeners)
}

/// What admitting a proxied request came to.
pub enum Begun {
    /// Answered here (refused, or denied by the governor): close after it when set.
    Answered {
        close: bool,
    },
    Queued(usize, Queued),
    Granted(usize, Grant),
}

/// What the reactor does next with a connection whose exchange just began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Nothing,
    Pump,
    /// No upstream connection could be started: answer with this `502`.
    Fail(ApiError),
}

/// The request head `head` is proxy traffic for `pid`: admits it and, unless refused, opens its
/// exchange. Refusals are written to `output`. The caller consumes the head
/// (`head.head_len` bytes) and then calls `enter`.
#[allow(clippy::too_many_arguments)]
pub fn begin(
    app: &mut App,
    proxy: &mut Proxy,
    output: &mut Vec<u8>,
    client: ConnId,
    ctx: &Ctx,
    head: &Head,
    pid: PoolId,
) -> Begun {
    let has_body = head.framing != BodyFraming::None;
    let start = output.len();
    let head_request = head.method == Method::Head;
    let say_kept =
        |output: &mut Vec<u8>, close: bool| adapt_own_answer(output, start, close, head.http11, head_request);
    // A refusal leaves the body unread: its answer closes the connection.
    let admitted = match app.admit_proxied(&Ctx { close: ctx.close || has_body, ..*ctx }, pid, head, output) {
        Ok(Some(admitted)) => admitted,
        Ok(None) => {
            // What the proxy itself offers is no more than relaying: no `Allow`.
            let close = ctx.close || has_body;
            Writer::start(output, Status::Ok).finish(b"", close);
            say_kept(output, close);
            return Begun::Answered { close };
        }
        Err(e) => {
            // The body is not read: nothing after it could be told apart.
            let close = ctx.close || has_body || e.closes();
            app.refuse_proxied(&Ctx { close, ..*ctx }, pid, head, e, output);
            proxy.stats.refused(pid.0 as usize);
            say_kept(output, close);
            return Begun::Answered { close };
        }
    };
    let upstream = app.upstream(pid).expect("admitted to a proxy pool");
    let (request, body) = request_relay(head.framing, upstream.max_request_bytes);
    let new = NewExchange {
        client: (client.index as usize, client.serial),
        pool: pid,
        head_key: upstream.head_key,
        attempt: admitted.attempt,
        request,
        client_side: ClientSide {
            http11: head.http11,
            keep_alive: head.keep_alive,
            head_request: head.method == Method::Head,
        },
        expect_continue: head.expect_continue && has_body,
    };
    let open = |proxy: &mut Proxy| {
        let mut up_head = proxy.head_buffer();
        head::write_request(&mut up_head, head, upstream, app.credential_fields(pid), body);
        proxy.open(new, up_head)
    };
    match admitted.admission {
        // Answered by `admit_proxied`.
        Admission::Denied(_) => {
            proxy.stats.refused(pid.0 as usize);
            let close = has_body || ctx.close;
            say_kept(output, close);
            Begun::Answered { close }
        }
        Admission::Queued(key) => Begun::Queued(open(proxy), Queued { key, attempt: admitted.attempt, proxied: true }),
        Admission::Granted(grant) => Begun::Granted(open(proxy), grant),
    }
}

/// Puts the connection into the state `begun` says, once its head is consumed.
pub fn enter(app: &mut App, proxy: &mut Proxy, registry: &Registry, conn: &mut Conn, begun: Begun, now: Now) -> After {
    match begun {
        Begun::Answered { close } => {
            if close {
                conn.close_after_flush();
            }
            After::Nothing
        }
        Begun::Queued(ex, queued) => {
            conn.exchange = Some(ex);
            conn.wait(queued, false, false);
            After::Nothing
        }
        Begun::Granted(ex, grant) => {
            conn.exchange = Some(ex);
            match start(app, proxy, registry, conn, ex, &grant, now) {
                Ok(()) => After::Pump,
                Err(err) => After::Fail(err),
            }
        }
    }
}

/// The exchange holds its slot: the lease is kept by the server, the
/// upstream connection attached (or its name looked up first) and the
/// request head queued on it.
fn start(
    app: &mut App,
    proxy: &mut Proxy,
    registry: &Registry,
    conn: &mut Conn,
    ex: usize,
    grant: &Grant,
    now: Now,
) -> Result<(), ApiError> {
    let e = &mut proxy.exchanges[ex];
    app.hold_proxied(grant, &e.attempt, now);
    e.slot = Some(grant.slot);
    let upstream = upstream_for(app, e)?;
    e.queued_ms = grant.queued_ms;
    e.signals.clear();
    governor_headers(&mut e.signals, &grant.signals, grant.queued_ms);
    e.request_deadline = grant.request_deadline.saturating_sub(CAP_LEAD_MS).max(now.ms);
    // A grant's deadlines both count from the grant: the lease's one term,
    // the request's `requestTimeoutMs`.
    let granted_at = grant.lease_deadline.saturating_sub(grant.term_ms);
    e.request_timeout_ms = grant.request_deadline.saturating_sub(granted_at);
    (e.timeout_ms, e.tls) = (upstream.timeout_ms, upstream.tls.clone());
    e.deadline = (now.ms + e.timeout_ms).min(e.request_deadline);
    conn.exchange_deadline = e.deadline;
    // Body bytes already here (sent with the head, or while it queued) were
    // not held back for the 100: it is omitted (RFC 9110 §10.1.1).
    if e.expect_continue && e.client_side.http11 && conn.input.is_empty() {
        conn.output.extend_from_slice(CONTINUE);
    }
    attach(proxy, ex, upstream, now.ms, registry)
}

/// How long before its lease's request deadline a proxied exchange is cut
/// at the cap. Both would otherwise be due in the same millisecond, and the
/// governor, whose timers fire first, would take the lease back before the
/// exchange released it: its outcome would never reach the pool, and its
/// slot would count as reclaimed. The lead covers a loop a little late.
const CAP_LEAD_MS: Ms = 20;

/// A request admitted under a pool's `upstream` that a reload took away
/// before the request reached it (queued, or waiting for the name).
const NO_LONGER_PROXIED: ApiError =
    ApiError::Unavailable("A configuration reload ended this pool's proxying before the request was sent.", 1);
/// A request whose head was written for an upstream (its address, `Host`,
/// `setHeaders`) that a reload changed before the request was sent: sent
/// now, it would carry the old credentials to the new upstream.
const UPSTREAM_CHANGED: ApiError =
    ApiError::Unavailable("A configuration reload changed this pool's upstream before the request was sent.", 1);

/// The upstream exchange `e`'s head was written for, if the pool still has it.
pub(super) fn upstream_for<'a>(app: &'a App, e: &Exchange) -> Result<&'a Upstream, ApiError> {
    match app.upstream(e.pool) {
        Some(upstream) if upstream.head_key == e.head_key => Ok(upstream),
        Some(_) => Err(UPSTREAM_CHANGED),
        None => Err(NO_LONGER_PROXIED),
    }
}

/// Attaches an upstream connection to the exchange, or leaves it waiting
/// for its upstream's name.
fn attach(proxy: &mut Proxy, ex: usize, upstream: &Upstream, now: Ms, registry: &Registry) -> Result<(), ApiError> {
    // The TLS settings the exchange started with (a reload may have changed
    // the pool's while its upstream's name was looked up).
    let tls = proxy.exchanges[ex].tls.clone();
    match proxy.attach(ex, &upstream.target, tls.as_ref(), now, registry, UPSTREAM_BASE) {
        Attached::Yes | Attached::Resolving => Ok(()),
        // Counted as a failed connection by `Proxy::attach`.
        Attached::No(why) => Err(ApiError::BadGatewayBecause(why)),
    }
}

/// Before the response head, `timeoutMs` runs from the grant, then again
/// from each piece of the client's body taken (`body_progress`), then from
/// when the whole request has left for the upstream: the response head's
/// timeout runs from there (SPEC §12), so a client slow to send its body
/// does not eat the upstream's time, and one that stalls it is told apart.
fn restart_timer(proxy: &mut Proxy, ex: usize, now: Ms, body_progress: bool) {
    let e = &proxy.exchanges[ex];
    if e.request_sent || e.phase != Phase::Sending {
        return;
    }
    let flushed = proxy.request_flushed(ex);
    if !flushed && !body_progress {
        return;
    }
    let e = &mut proxy.exchanges[ex];
    e.request_sent = flushed;
    e.deadline = (now + e.timeout_ms).min(e.request_deadline);
}

impl Server {
    /// Accepts on a pool's own proxy listener.
    pub(super) fn accept_proxy(&mut self, i: usize) {
        if self.accept_paused {
            return;
        }
        loop {
            let Some((listener, pid)) = self.proxy_listeners.get(i) else {
                return;
            };
            let pid = *pid;
            match listener.accept() {
                Ok((stream, peer)) => {
                    if let Some(conn) = self.admit(stream, peer, false).and_then(|id| client_mut(&mut self.conns, id)) {
                        conn.listener_pool = Some(pid);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.free_a_descriptor(&e) => {}
                Err(e) => return self.pause_accepts(&e),
            }
        }
    }

    /// An upstream connection is ready: its exchange moves on, or an idle
    /// one is checked for having been closed.
    pub(super) fn on_upstream(&mut self, idx: usize, event: &Event) {
        let Some(up) = self.proxy.ups.get_mut(idx) else {
            return;
        };
        let hangup = event.is_read_closed() || event.is_error();
        up.on_event(event.is_readable(), hangup);
        match up.exchange {
            None => self.proxy.on_idle_event(idx, event.is_readable() || hangup, self.poll.registry()),
            Some(ex) => {
                let (index, serial) = self.proxy.exchanges[ex].client;
                self.pump_exchange(ConnId { index: index as u32, serial });
            }
        }
    }

    /// A queued proxied request got its slot.
    pub(super) fn grant_exchange(&mut self, id: ConnId, grant: &Grant) {
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        let ex = conn.exchange.expect("a queued exchange");
        let started = start(&mut self.app, &mut self.proxy, self.poll.registry(), conn, ex, grant, self.now);
        match started {
            Err(err) => {
                self.end_exchange(id, End::Answered(err));
                // Its answer is written out now: no event of its own will come.
                self.mark_dirty(id);
            }
            Ok(()) => self.pump_exchange(id),
        }
    }

    /// The resolver thread answered: the exchanges that waited for a name
    /// get their connection (or their `502`).
    pub(super) fn on_resolved(&mut self) {
        for ex in self.proxy.resolved(self.now.ms) {
            let Some(e) = self.proxy.exchanges.get(ex) else {
                continue;
            };
            let (index, serial) = e.client;
            let id = ConnId { index: index as u32, serial };
            if client_mut(&mut self.conns, id).is_none_or(|c| c.exchange != Some(ex)) {
                continue;
            }
            let attached = upstream_for(&self.app, &self.proxy.exchanges[ex])
                .and_then(|upstream| attach(&mut self.proxy, ex, upstream, self.now.ms, self.poll.registry()));
            match attached {
                Ok(()) => self.pump_exchange(id),
                Err(err) => {
                    self.end_exchange(id, End::Answered(err));
                    self.mark_dirty(id);
                }
            }
        }
    }

    /// Moves the connection's exchange as far as its sockets allow.
    pub(super) fn pump_exchange(&mut self, id: ConnId) {
        let epoch_now = self.now.wall().0;
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        let Some(ex) = conn.exchange else {
            return;
        };
        if conn.peer_done_sending() {
            // A client that closes mid-exchange is gone: its slot is freed now,
            // also when its FIN waits behind input a full buffer left unread
            // (an upload the upstream reads slowly, a pipeline behind a wait).
            self.end_exchange(id, End::Closed(crate::api::UNANSWERED_CLIENT_GONE));
            // Its connection closes now (`end_exchange` marked it so): no
            // event of its own will come to flush it.
            self.mark_dirty(id);
            return;
        }
        if self.proxy.exchanges[ex].up.is_none() {
            // Queued (its connection waits: no timer), or granted while its
            // upstream's name is looked up: its deadline runs meanwhile.
            self.arm_timer(id);
            return;
        }
        let before = conn.unsent();
        let mut body_progress = false;
        let step = loop {
            let mut io = ClientIo {
                input: conn.input.data(),
                consumed: 0,
                output: &mut conn.output,
                out_pos: conn.out_pos,
                high_water: OUTPUT_HIGH_WATER,
            };
            let step = self.proxy.pump(ex, &mut io, epoch_now);
            let consumed = io.consumed;
            body_progress |= consumed > 0;
            conn.input.consume(consumed);
            if step != Step::Retry {
                break step;
            }
            let tls = self.proxy.exchanges[ex].tls.clone();
            if self.proxy.reattach(ex, tls.as_ref(), self.now.ms, self.poll.registry(), UPSTREAM_BASE).is_err() {
                break Step::BadGateway("cannot reconnect");
            }
        };
        if step == Step::Pending {
            restart_timer(&mut self.proxy, ex, self.now.ms, body_progress);
        }
        conn.exchange_deadline = self.proxy.deadline(ex);
        if before == 0 && conn.unsent() > 0 {
            conn.out_since = self.now.ms;
        }
        match step {
            Step::Pending | Step::Retry => {}
            Step::Complete { close_client } => self.end_exchange(id, End::Complete { close_client }),
            Step::BadGateway(why) => {
                debug!("upstream failed: {why}");
                self.end_exchange(id, End::Answered(ApiError::BadGateway));
            }
            Step::Unusable(why) => self.end_exchange(id, End::Answered(ApiError::BadGatewayBecause(why))),
            Step::Broken(why) => {
                debug!("upstream broke off: {why}");
                self.end_exchange(id, End::Cut);
            }
            Step::BadBody(err) => {
                let err = match err {
                    ChunkError::TooLarge(limit) => ApiError::PayloadTooLarge(limit),
                    ChunkError::Malformed(why) => ApiError::BadRequest(why),
                };
                // Mid-response the client can only be cut; it is not the upstream's doing.
                let end = match self.proxy.exchanges[ex].phase {
                    Phase::Relaying => End::BodyBroken(err),
                    Phase::Queued | Phase::Sending => End::Answered(err),
                };
                self.end_exchange(id, end);
            }
        }
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        // Output to write (unless the socket is full: its writable edge
        // flushes it), or input it can take now that the upstream took some.
        if conn.unsent() > 0 && !conn.write_blocked || conn.may_read() || conn.closes_after_flush() {
            self.mark_dirty(id);
        }
        self.arm_timer(id);
    }

    /// The connection's proxied request left the queue without a slot
    /// (`end`): answered and logged with its method and path; its exchange ends.
    pub(super) fn end_queued_exchange(&mut self, id: ConnId, queued: &Queued, end: WaitEnd, close: bool) {
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        let Some(ex) = conn.exchange else {
            return;
        };
        let e = &self.proxy.exchanges[ex];
        // `Connection: close`, or a body not read: the answer ends the connection.
        let close = close || !e.client_side.keep_alive || !e.request_done();
        let start = conn.output.len();
        self.app.end_proxied_wait(&mut conn.output, end, queued, id, self.now, close, e.method_and_path());
        adapt_own_answer(&mut conn.output, start, close, e.client_side.http11, e.client_side.head_request);
        self.end_exchange(id, End::Refused);
        if close {
            if let Some(conn) = client_mut(&mut self.conns, id) {
                conn.close_after_flush();
            }
        }
        self.mark_dirty(id);
    }

    /// The exchange's deadline passed: before the response head that is a
    /// `504 upstream_timeout` — or a `408 body_timeout` when the client
    /// stalled its body, which is no outcome of the upstream's; at the
    /// request cap, or mid-response, the exchange is cut. A TLS handshake
    /// that ran out of its own time goes on to the name's next address
    /// while one is left, else it is a `502` saying so.
    pub(super) fn exchange_timed_out(&mut self, id: ConnId) {
        let Some(ex) = client_mut(&mut self.conns, id).and_then(|c| c.exchange) else {
            return;
        };
        // The request cap, when it is what ran out, is named as such, also
        // while the body is still coming: the client kept sending.
        let capped = self.now.ms >= self.proxy.exchanges[ex].request_deadline;
        let expired = self.proxy.handshake_expired(ex, self.now.ms);
        if expired == Some(Expired::TryNext) {
            // Each address takes one of the name's finite list, and the
            // request's deadline still holds: this ends.
            let tls = self.proxy.exchanges[ex].tls.clone();
            if self.proxy.reattach(ex, tls.as_ref(), self.now.ms, self.poll.registry(), UPSTREAM_BASE).is_ok() {
                // Its timer is armed again for the new handshake's deadline.
                return self.pump_exchange(id);
            }
            self.end_exchange(id, End::Answered(ApiError::BadGateway));
        } else if let Some(Expired::Failed(why)) = expired {
            self.end_exchange(id, End::Answered(ApiError::BadGatewayBecause(why)));
        } else if let Some(Expired::TimedOut(ms)) = expired {
            self.end_exchange(id, End::Answered(ApiError::HandshakeTimeout(ms)));
        } else if !capped && self.proxy.exchanges[ex].phase == Phase::Sending && self.proxy.client_body_stalled(ex) {
            let timeout_ms = self.proxy.exchanges[ex].timeout_ms;
            self.end_exchange(id, End::Answered(ApiError::BodyTimeout(timeout_ms)));
        } else if self.proxy.exchanges[ex].phase != Phase::Relaying {
            // No response head yet (nor, its name still being looked up, an
            // upstream connection): the client is told which limit ran out.
            let e = &self.proxy.exchanges[ex];
            let err = if capped {
                ApiError::RequestCapped(e.request_timeout_ms)
            } else {
                ApiError::UpstreamTimeout(e.timeout_ms)
            };
            self.proxy.note_connect_timed_out(ex);
            self.end_exchange(id, End::Answered(err));
        } else {
            self.end_exchange(id, End::Capped);
        }
        self.mark_dirty(id);
    }

    /// Ends the connection's exchange: the upstream connection is kept for
    /// reuse or closed, the slot released with the outcome report, and the
    /// client answered or closed as `end` says.
    pub(super) fn end_exchange(&mut self, id: ConnId, end: End) {
        let Some(conn) = client_mut(&mut self.conns, id) else {
            return;
        };
        let Some(ex) = conn.exchange.take() else {
            return;
        };
        conn.exchange_deadline = NEVER;
        if let Some((queued, _)) = conn.stop_waiting() {
            self.app.waiter_gone(&queued, id, self.now);
        }
        // Not after a `HEAD`: its answer announces a body that must not
        // come, and one a broken upstream sends late would be read as the
        // answer to the next request sent on the connection, another
        // client's perhaps.
        let reusable = matches!(end, End::Complete { .. }) && !self.proxy.exchanges[ex].client_side.head_request;
        let e = self.finish_exchange(ex, reusable);
        let failure = match end {
            End::Answered(
                err @ (ApiError::BadGateway
                | ApiError::BadGatewayBecause(_)
                | ApiError::HandshakeTimeout(_)
                | ApiError::UpstreamTimeout(_)
                | ApiError::RequestCapped(_)),
            ) => Some(err.status().code()),
            End::Cut if e.response_head.is_none() => Some(ApiError::UpstreamTimeout(e.timeout_ms).status().code()),
            _ => None,
        };
        if let Some(slot) = &e.slot {
            let outcome = Proxy::outcome(&e, failure);
            self.app.release_proxied(e.pool, slot, outcome.as_ref(), self.now.ms);
        }
        self.note_exchange(&e, end);
        let Some(conn) = client_mut(&mut self.conns, id) else {
            self.proxy.retire(e);
            return;
        };
        let body_done = e.request_done();
        let close = match end {
            End::Complete { close_client } => close_client,
            End::Answered(err) => {
                let close = !body_done || !e.client_side.keep_alive || err.closes();
                let start = conn.output.len();
                // A granted exchange's answer, from the upstream or not,
                // carries the governor headers of its grant.
                self.app.write_error_of(Some(e.pool), &mut conn.output, err, close, &e.signals);
                adapt_own_answer(&mut conn.output, start, close, e.client_side.http11, e.client_side.head_request);
                close
            }
            End::Cut | End::BodyBroken(_) | End::Capped | End::Stopped if e.client_body_ends_at_close() => {
                conn.reset_at_close();
                true
            }
            End::Cut | End::BodyBroken(_) | End::Capped | End::Closed(_) | End::Stopped => true,
            // The request body was never read.
            End::Refused => !body_done,
        };
        if close {
            conn.close_after_flush();
        } else if self.shutdown_at.is_some() {
            // Stopping: what it pipelined is answered, then it closes.
            self.stopping.push(id);
        }
        self.proxy.retire(e);
        conn.last_active = self.now.ms;
        conn.request_started = (!conn.input.is_empty()).then_some(self.now.ms);
        // What the governor decided meanwhile (a waiter granted the freed slot).
        self.drain_events();
    }

    /// Takes the exchange out of the proxy, its connection kept idle (with
    /// a sweep on the wheel for when it expires) or closed.
    fn finish_exchange(&mut self, ex: usize, reusable: bool) -> Exchange {
        let keep = match self.app.upstream(self.proxy.exchanges[ex].pool) {
            Some(u) => Keep { limit: u.idle_connections, idle_ms: u.idle_timeout_ms },
            None => Keep { limit: 0, idle_ms: 0 },
        };
        let (e, sweep) = self.proxy.finish(ex, reusable, keep, self.now.ms, self.poll.registry());
        if let Some(at) = sweep {
            self.app.schedule(at, Wake::UpstreamIdle);
        }
        e
    }

    /// The idle-connection sweep came due: the expired ones are closed.
    pub(super) fn sweep_idle_upstreams(&mut self) {
        if let Some(at) = self.proxy.close_expired(self.now.ms, self.poll.registry()) {
            self.app.schedule(at, Wake::UpstreamIdle);
        }
    }

    /// The stop's grace is over: every exchange still running is ended. A
    /// client that got no response head is answered `503` (best effort: one
    /// write); one mid-response is cut. Each is logged as such.
    #[cold]
    #[inline(never)]
    pub(super) fn cut_exchanges(&mut self) {
        let running: Vec<(ConnId, usize)> = self
            .conns
            .iter()
            .filter_map(|(t, entry)| match entry {
                super::Entry::Client(c) => c.exchange.map(|ex| (ConnId { index: t as u32, serial: c.serial }, ex)),
            })
            .collect();
        for (id, ex) in running {
            // Ending one exchange may have ended another since the list was made.
            if client_mut(&mut self.conns, id).is_none_or(|c| c.exchange != Some(ex)) {
                continue;
            }
            self.proxy.exchanges[ex].client_side.keep_alive = false;
            let end = match self.proxy.exchanges[ex].phase {
                Phase::Relaying => End::Stopped,
                Phase::Queued | Phase::Sending => End::Answered(SHUTTING_DOWN),
            };
            self.end_exchange(id, end);
            if let Some(conn) = client_mut(&mut self.conns, id) {
                conn.write_last();
            }
        }
    }

    /// The client connection is closing while in an exchange, for `why`.
    pub(super) fn abandon_exchange(&mut self, ex: usize, why: (u16, &'static str)) {
        let e = self.finish_exchange(ex, false);
        if let Some(slot) = &e.slot {
            let outcome = Proxy::outcome(&e, None);
            self.app.release_proxied(e.pool, slot, outcome.as_ref(), self.now.ms);
        }
        self.note_exchange(&e, End::Closed(why));
        self.proxy.retire(e);
    }

    /// The access-log line and the metrics of an ended exchange.
    fn note_exchange(&mut self, e: &Exchange, end: End) {
        let upstream_status = e.response_head.map(|h| h.status);
        let upstream_ms = e.sent_at.map(|t| crate::time::millis(t.elapsed()));
        self.proxy.stats.count(e.pool.0 as usize, upstream_status, upstream_ms, e.bytes_up, e.bytes_down);
        let (status, error) = match end {
            // Its queue wait ended in a refusal, logged as it was answered.
            End::Refused => return,
            End::Complete { .. } => (upstream_status.unwrap_or(0), None),
            End::Answered(err) => (err.status().code(), Some(err.code())),
            End::Cut => (upstream_status.unwrap_or(ApiError::BadGateway.status().code()), Some("upstream_cut")),
            End::BodyBroken(err) => (upstream_status.unwrap_or(err.status().code()), Some(err.code())),
            End::Closed((status, code)) => (status, Some(code)),
            End::Stopped => (upstream_status.unwrap_or(0), Some("shutdown_cut")),
            End::Capped => (upstream_status.unwrap_or(0), Some("request_capped")),
        };
        // Never granted: it was queued all along.
        let queued_ms = match e.slot {
            Some(_) => e.queued_ms,
            None => crate::time::millis(e.attempt.started.elapsed()),
        };
        let (method, path) = e.method_and_path();
        let line = ProxiedLine {
            status,
            error,
            deny_reason: None,
            queued_ms,
            slot_ref: e.slot.map(|s| s.log_ref()),
            method,
            path,
            upstream_status,
            upstream_ms,
        };
        self.app.log_proxied(&e.attempt, self.now.wall(), &line);
    }
}

/// An answer the proxy writes itself (a refusal, a `502`/`504`), from
/// `start`, adapted to its request as the lock API's are: a `HEAD` request's
/// has no body (RFC 9110 §9.3.2), or a client that reads none would take it
/// for the next answer; and an HTTP/1.0 connection is kept only when the
/// answer says so (RFC 9112 §C.2.2).
fn adapt_own_answer(output: &mut Vec<u8>, start: usize, close: bool, http11: bool, head_request: bool) {
    if head_request {
        strip_body(output, start);
    }
    if !close && !http11 {
        say_kept_alive(output, start);
    }
}
