//! The lock API's side of proxy mode (SPEC §12): which requests are proxy
//! traffic, who may send them, and their admission through the same
//! governor as every acquire. The relaying itself is the reactor's
//! (`crate::proxy`); this module never touches a socket.

use super::{wait_budget, ApiError, App, Attempt, ConnId, Ctx, Queued, SHUTTING_DOWN, UNKNOWN_POOL};
use crate::accesslog::Proxied;
use crate::config::upstream::Upstream;
use crate::governor::history;
use crate::governor::lease::SlotId;
use crate::governor::{Admission, Denial, DenyReason, Grant, Leaving, Ms, Outcome, PoolId};
use crate::http::request::{BodyFraming, Head};
use crate::http::response::Status;
use crate::time::{EpochMs, Now};

/// Request fields that carry a pool credential, removed before forwarding.
#[derive(Debug, Clone, Copy, Default)]
pub struct CredentialFields {
    /// `Authorization` may carry the pool key or a JWT.
    pub authorization: bool,
    /// `x-api-key` may carry the pool key.
    pub api_key: bool,
    /// `Cf-Access-Jwt-Assertion` is checked (its token also rides in the
    /// `CF_Authorization` cookie, which is dropped too).
    pub cf_access: bool,
}

/// What a proxied request's access-log line says beyond its attempt.
pub struct ProxiedLine<'a> {
    /// The status the client got (the upstream's, or this server's answer;
    /// 499 when the client went away first).
    pub status: u16,
    pub error: Option<&'static str>,
    pub deny_reason: Option<DenyReason>,
    pub queued_ms: u64,
    pub slot_ref: Option<u32>,
    pub method: &'a str,
    /// Without the query, which may carry secrets.
    pub path: &'a str,
    pub upstream_status: Option<u16>,
    pub upstream_ms: Option<u64>,
}

impl<'a> ProxiedLine<'a> {
    /// The line of a request answered here, never forwarded.
    fn refused((method, path): (&'a str, &'a str), status: u16, code: &'static str, queued_ms: u64) -> Self {
        ProxiedLine {
            status,
            error: Some(code),
            deny_reason: None,
            queued_ms,
            slot_ref: None,
            method,
            path,
            upstream_status: None,
            upstream_ms: None,
        }
    }
}

/// How a queued proxied request's wait ended without a slot.
#[derive(Debug)]
pub enum WaitEnd {
    /// Its wait budget ran out: `504 queue_timeout`.
    TimedOut(Denial),
    /// A retry with its `Idempotency-Key` took its place: `409 superseded`.
    Superseded,
    /// The server is shutting down: `503`.
    ShuttingDown,
    /// A reload no longer admits it (`App::refused_since_reload`).
    Refused(ApiError),
}

/// A proxied request let through auth, with what its admission came to.
pub struct Admitted {
    pub attempt: Attempt,
    pub admission: Admission,
}

impl App {
    /// Rebuilds the main listener's host table from the configured pools'
    /// `upstream.hosts`. A pool a reload removed keeps its credentials (to
    /// release what it holds) but routes no host: one that a configured pool
    /// took over goes to that pool.
    pub(super) fn index_proxy_hosts(&mut self) {
        self.proxy_hosts.clear();
        for (i, creds) in self.creds.iter().enumerate() {
            if self.gov.pool(PoolId(i as u32)).retired {
                continue;
            }
            for host in creds.upstream.iter().flat_map(|u| &u.hosts) {
                self.proxy_hosts.insert(host.clone(), PoolId(i as u32));
            }
        }
    }

    /// The pool a request is proxy traffic for: the pool whose own listener
    /// it came in on, or on the main listener the pool whose `hosts` holds
    /// its `Host` (port and an absolute name's final dot ignored, case-insensitive).
    /// Asked of every request: without proxy hosts it is a test inlined in
    /// the caller.
    #[inline]
    pub fn proxy_route(&self, listener_pool: Option<PoolId>, head: &Head) -> Option<PoolId> {
        if listener_pool.is_some() || self.proxy_hosts.is_empty() {
            return listener_pool;
        }
        self.proxy_route_by_host(head)
    }

    /// `proxy_route` on the main listener when some pool has proxy hosts.
    #[inline(never)]
    fn proxy_route_by_host(&self, head: &Head) -> Option<PoolId> {
        let name = super::host_name(head.host?);
        let mut lower = [0u8; 253];
        let lower = lower.get_mut(..name.len())?;
        for (l, b) in lower.iter_mut().zip(name) {
            *l = b.to_ascii_lowercase();
        }
        self.proxy_hosts.get(&*lower).copied()
    }

    /// The pool's upstream; none for a pool that proxies no more, one a
    /// reload removed included: its requests not yet sent (waiting for
    /// the upstream's name) are not sent, as when a reload takes the
    /// `upstream` away, and its connections are not kept for reuse.
    pub fn upstream(&self, pid: PoolId) -> Option<&Upstream> {
        let creds = self.creds.get(pid.0 as usize)?;
        if self.gov.pool(pid).retired {
            return None;
        }
        creds.upstream.as_ref()
    }

    pub fn credential_fields(&self, pid: PoolId) -> CredentialFields {
        let creds = &self.creds[pid.0 as usize];
        CredentialFields {
            authorization: creds.keys.reads_authorization() || creds.access.reads_jwt(),
            api_key: creds.keys.reads_authorization(),
            cf_access: creds.access.reads_cloudflare(),
        }
    }

    /// Auth, limits and one acquire for a proxied request. A refusal is
    /// answered into `out` (logged and counted like an acquire's). `None`:
    /// the request is not relayed but answered by the caller, `OPTIONS`
    /// with `Max-Forwards: 0`.
    pub fn admit_proxied(
        &mut self,
        ctx: &Ctx,
        pid: PoolId,
        head: &Head,
        out: &mut Vec<u8>,
    ) -> Result<Option<Admitted>, ApiError> {
        head.check_target()?;
        if self.gov.pool(pid).retired {
            return Err(UNKNOWN_POOL);
        }
        let upstream = self.upstream(pid).ok_or(ApiError::NO_ROUTE)?;
        let (default_wait, max_bytes) = (upstream.wait_ms, upstream.max_request_bytes);
        let creds = &self.creds[pid.0 as usize];
        creds.keys.check_proxied(head)?;
        let client = creds.access.client_addr(ctx.peer, head);
        if !creds.access.is_open() {
            creds.access.check_head(head, client, ctx.now.wall())?;
        }
        // An offer of cleartext HTTP/2 alone (`Upgrade: h2c`, what curl
        // `--http2` and Java's HttpClient send on `http://`) is ignored, as
        // RFC 9110 §7.8 lets a server do: the exchange goes on in HTTP/1.1
        // and the offer, hop-by-hop, is not forwarded. Any other protocol
        // (a WebSocket) expects the switch, which is not relayed.
        if head.headers.into_iter().any(|h| h.name.eq_ignore_ascii_case(b"upgrade") && !offers_only_h2c(h.value)) {
            return Err(ApiError::NotImplemented("Protocol upgrades are not relayed by the proxy."));
        }
        // An upstream answering TRACE echoes the request it got, `setHeaders`
        // credentials included (RFC 9110 §9.3.8): it is not relayed.
        if head.method_name.eq_ignore_ascii_case("TRACE") {
            return Err(ApiError::NotImplemented("TRACE is not relayed by the proxy."));
        }
        if matches!(head.framing, BodyFraming::Length(n) if n > max_bytes) {
            return Err(ApiError::PayloadTooLarge(max_bytes));
        }
        let wait_ms = match head.api.queue_timeout_ms() {
            _ if head.api.moved() && self.moved_by_trusted_proxy(pid, ctx.peer) => 0,
            None if head.api.no_queue() => 0,
            None => default_wait,
            Some(_) => wait_budget(head, &[])?,
        };
        // An `OPTIONS` that may go no further is answered here, as its final
        // recipient (RFC 9110 §7.6.2), and takes no slot.
        if head.method_name.eq_ignore_ascii_case("OPTIONS") && head.max_forwards() == Some(0) {
            return Ok(None);
        }
        let attempt = Attempt { pool: pid, client, wait_ms, started: ctx.started };
        let admission = self.gov.acquire_read_at(pid, wait_ms, ctx.conn.owner(), ctx.read, ctx.now.ms);
        match &admission {
            Admission::Denied(denial) => {
                let line = method_and_path(head);
                self.deny_proxied(out, &attempt, denial, Status::TooManyRequests, ctx.now, ctx.close, line);
            }
            // A reload may revoke its key while it waits (`refused_since_reload`).
            Admission::Queued(key) => self.keep_print(*key, self.creds[pid.0 as usize].keys.print_proxied(head)),
            Admission::Granted(_) => {}
        }
        Ok(Some(Admitted { attempt, admission }))
    }

    /// A `429` (at once) or `504` (after queueing) for a proxied request:
    /// answered into `out`, counted like an acquire's, logged with its
    /// method and path.
    #[allow(clippy::too_many_arguments)]
    fn deny_proxied(
        &mut self,
        out: &mut Vec<u8>,
        attempt: &Attempt,
        denial: &Denial,
        status: Status,
        now: Now,
        close: bool,
        method_and_path: (&str, &str),
    ) {
        let code = if status == Status::GatewayTimeout { "queue_timeout" } else { "too_many_requests" };
        let epoch_now = now.wall();
        self.rejections.count(self.counted_under(Some(attempt.pool)), status);
        self.observe_acquire(attempt, epoch_now, status, Some(code), Some(denial.reason), denial.queued_ms, None);
        self.write_denial(out, denial, status, attempt.pool, close);
        let line = ProxiedLine {
            deny_reason: Some(denial.reason),
            ..ProxiedLine::refused(method_and_path, status.code(), code, denial.queued_ms)
        };
        self.log_proxied(attempt, epoch_now, &line);
    }

    /// A queued proxied request's wait ended without a slot (`end`): answered
    /// into `out`, counted like a queued acquire's end, and logged with its
    /// method and path. Its exchange ends as `Refused`.
    #[allow(clippy::too_many_arguments)]
    pub fn end_proxied_wait(
        &mut self,
        out: &mut Vec<u8>,
        end: WaitEnd,
        queued: &Queued,
        conn: ConnId,
        now: Now,
        close: bool,
        method_and_path: (&str, &str),
    ) {
        let error = match end {
            WaitEnd::TimedOut(denial) => {
                let status = Status::GatewayTimeout;
                return self.deny_proxied(out, &queued.attempt, &denial, status, now, close, method_and_path);
            }
            WaitEnd::Superseded => ApiError::Superseded,
            WaitEnd::Refused(error) => error,
            WaitEnd::ShuttingDown => {
                self.gov.cancel_waiter(queued.key, conn.owner(), Leaving::Answered);
                SHUTTING_DOWN
            }
        };
        let (status, code) = (error.status(), error.code());
        self.rejections.count(self.counted_under(Some(queued.attempt.pool)), status);
        let queued_ms = self.observe_queued_end(&queued.attempt, now.wall(), status.code(), code, true);
        error.write(out, &mut self.scratch, close);
        let line = ProxiedLine::refused(method_and_path, status.code(), code, queued_ms);
        self.log_proxied(&queued.attempt, now.wall(), &line);
    }

    /// A proxied request got its slot: the server holds it for the whole
    /// exchange (no renewals), to its request deadline at most. Counted like
    /// a granted acquire; its log line is written when the exchange ends.
    pub fn hold_proxied(&mut self, grant: &Grant, attempt: &Attempt, now: Now) {
        self.gov.hold_to_request_deadline(&grant.slot);
        let slot_ref = Some(grant.slot.log_ref());
        self.observe_acquire(attempt, now.wall(), Status::Ok, None, None, grant.queued_ms, slot_ref);
    }

    /// The access-log line of a proxied request: the acquire's fields with
    /// the status the client got, then method, path, upstream status and time.
    pub fn log_proxied(&mut self, attempt: &Attempt, epoch_now: EpochMs, line: &ProxiedLine) {
        if !self.log.is_on() {
            return;
        }
        let attempt_line = history::Attempt {
            epoch_ms: epoch_now.0,
            status: line.status,
            error: line.error,
            reason: line.deny_reason,
            wait_ms: attempt.wait_ms,
            queued_ms: line.queued_ms,
            server_us: crate::time::micros(attempt.started.elapsed()),
            slot_ref: line.slot_ref,
        };
        let record = super::record_of(&self.gov.pool(attempt.pool).name, attempt.client, &attempt_line);
        let proxied = Proxied {
            method: line.method,
            path: line.path,
            upstream_status: line.upstream_status,
            upstream_ms: line.upstream_ms,
        };
        self.log.record_proxied(&record, &proxied);
    }

    /// A proxied request refused before admission (key, policies, limits):
    /// answered into `out`, counted, and logged with its method and path.
    pub fn refuse_proxied(&mut self, ctx: &Ctx, pid: PoolId, head: &Head, error: ApiError, out: &mut Vec<u8>) {
        self.write_error_of(Some(pid), out, error, ctx.close, b"");
        // The client the pool's policies see, as a lock route's refusal logs it.
        let client = self.client_addr(pid, ctx, head);
        let attempt = Attempt { pool: pid, client, wait_ms: 0, started: ctx.started };
        // Timed and kept in the pool's attempts like a lock route's refusal.
        self.observe_acquire(&attempt, ctx.now.wall(), error.status(), Some(error.code()), None, 0, None);
        let line = ProxiedLine::refused(method_and_path(head), error.status().code(), error.code(), 0);
        self.log_proxied(&attempt, ctx.now.wall(), &line);
    }

    /// A request on `pid`'s own proxy listener known only by its request
    /// line: its head was refused, or its connection closed before it was
    /// complete (`App::log_unanswered`). Logged with the method and path
    /// that line gives, as far as it came, and the peer's address.
    #[cold]
    pub(super) fn log_unanswered_proxied(
        &mut self,
        pid: PoolId,
        input: &[u8],
        peer: std::net::IpAddr,
        started: std::time::Instant,
        now: Now,
        (status, code): (u16, &'static str),
    ) {
        let (method, path) = request_line_parts(input);
        // Bytes that do not start with a method (a stray line end, noise)
        // are not known to be a request.
        if method.is_empty() {
            return;
        }
        let attempt = Attempt { pool: pid, client: peer, wait_ms: 0, started };
        let line = ProxiedLine::refused((method, path), status, code, 0);
        self.log_proxied(&attempt, now.wall(), &line);
    }

    /// The exchange is over: the slot goes back with what the upstream said.
    pub fn release_proxied(&mut self, pid: PoolId, slot: &SlotId, outcome: Option<&Outcome>, now: Ms) {
        self.gov.release_id(pid, slot, outcome, now);
    }
}

/// A request's method and its path without the query, for the log.
fn method_and_path<'h>(head: &Head<'h>) -> (&'h str, &'h str) {
    (head.method_name, path_without_query(head.path_str()))
}

/// The method and the path without its query of the request line at the
/// start of `input` (after the empty lines a client may send before it, RFC
/// 9112 §2.2), each empty when that line does not give one.
fn request_line_parts(input: &[u8]) -> (&str, &str) {
    let input = &input[input.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(input.len())..];
    let method = input.split(|&b| b == b' ').next().filter(|m| m.iter().all(|&b| crate::http::is_tchar(b)));
    let method = method.and_then(|m| std::str::from_utf8(m).ok()).unwrap_or_default();
    let path = super::logged_path(input).and_then(|p| std::str::from_utf8(p).ok()).map(path_without_query);
    // An empty path before a query (`http://h?q`) is the root, as it is relayed.
    let path = path.map(|p| if p.is_empty() { "/" } else { p }).unwrap_or_default();
    (method, path)
}

/// `/v1/chat?key=x` → `/v1/chat`: queries may carry secrets.
pub fn path_without_query(target: &str) -> &str {
    target.split_once('?').map_or(target, |(p, _)| p)
}

/// Whether an `Upgrade` value offers cleartext HTTP/2 and nothing else.
fn offers_only_h2c(value: &[u8]) -> bool {
    let mut protocols = value.split(|&b| b == b',').map(crate::http::trim).filter(|p| !p.is_empty()).peekable();
    protocols.peek().is_some() && protocols.all(|p| p.eq_ignore_ascii_case(b"h2c"))
}
