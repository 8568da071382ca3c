//! The lock API's side of proxy mode (SPEC §12): which requests are proxy
//! traffic, who may send them, and their admission through the same
//! governor as every acquire. The relaying itself is the reactor's
//! (`crate::proxy`); this module never touches a socket.

use super::{wait_budget, ApiError, App, Attempt, Ctx, UNKNOWN_POOL};
use crate::config::upstream::Upstream;
use crate::governor::lease::SlotId;
use crate::governor::{Admission, Grant, Ms, Outcome, PoolId};
use crate::http::request::{BodyFraming, Head};
use crate::http::response::Status;
use crate::time::Now;

/// Request fields that carry a pool credential, removed before forwarding.
#[derive(Debug, Clone, Copy, Default)]
pub struct CredentialFields {
    /// `Authorization` may carry the pool key or a JWT.
    pub authorization: bool,
    /// `x-api-key` may carry the pool key.
    pub api_key: bool,
    /// `Cf-Access-Jwt-Assertion` is checked.
    pub cf_access: bool,
}

/// A proxied request let through auth, with what its admission came to.
pub struct Admitted {
    pub attempt: Attempt,
    pub admission: Admission,
}

impl App {
    /// Rebuilds the main listener's host table from the pools' `upstream.hosts`.
    pub(super) fn index_proxy_hosts(&mut self) {
        self.proxy_hosts.clear();
        for (i, creds) in self.creds.iter().enumerate() {
            for host in creds.upstream.iter().flat_map(|u| &u.hosts) {
                self.proxy_hosts.insert(host.clone(), PoolId(i as u32));
            }
        }
    }

    /// The pool a request is proxy traffic for: the pool whose own listener
    /// it came in on, or on the main listener the pool whose `hosts` holds
    /// its `Host` (port ignored, case-insensitive).
    pub fn proxy_route(&self, listener_pool: Option<PoolId>, head: &Head) -> Option<PoolId> {
        if listener_pool.is_some() || self.proxy_hosts.is_empty() {
            return listener_pool;
        }
        let name = super::host_without_port(head.host?);
        let mut lower = [0u8; 253];
        let lower = lower.get_mut(..name.len())?;
        for (l, b) in lower.iter_mut().zip(name) {
            *l = b.to_ascii_lowercase();
        }
        self.proxy_hosts.get(&*lower).copied()
    }

    pub fn upstream(&self, pid: PoolId) -> Option<&Upstream> {
        self.creds.get(pid.0 as usize)?.upstream.as_ref()
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
    /// answered into `out` (logged and counted like an acquire's).
    pub fn admit_proxied(
        &mut self,
        ctx: &Ctx,
        pid: PoolId,
        head: &Head,
        out: &mut Vec<u8>,
    ) -> Result<Admitted, ApiError> {
        let upstream = self.upstream(pid).ok_or(ApiError::RouteNotFound)?;
        let (default_wait, max_bytes) = (upstream.wait_ms, upstream.max_request_bytes);
        if self.gov.pool(pid).retired {
            return Err(UNKNOWN_POOL);
        }
        let creds = &self.creds[pid.0 as usize];
        creds.keys.check_proxied(head)?;
        let client = creds.access.client_addr(ctx.peer, head);
        if !creds.access.is_open() {
            creds.access.check_head(head, client, ctx.now.wall())?;
        }
        if head.header("upgrade").is_some() {
            return Err(ApiError::NotImplemented("Protocol upgrades are not relayed by the proxy."));
        }
        if matches!(head.framing, BodyFraming::Length(n) if n > max_bytes) {
            return Err(ApiError::PayloadTooLarge);
        }
        let wait_ms = match head.api.queue_timeout_ms {
            None if head.api.no_queue => 0,
            None => default_wait,
            Some(_) => wait_budget(head, &[])?,
        };
        let attempt = Attempt { pool: pid, client, wait_ms, started: ctx.started };
        let admission = self.gov.acquire(pid, wait_ms, ctx.conn.owner(), ctx.now.ms);
        if let Admission::Denied(denial) = &admission {
            self.answer_denial(out, denial, Status::TooManyRequests, &attempt, ctx.now, ctx.close);
        }
        Ok(Admitted { attempt, admission })
    }

    /// A proxied request got its slot: the server holds it for the whole
    /// exchange (no renewals), to its request deadline at most. Logged like
    /// a granted acquire.
    pub fn hold_proxied(&mut self, grant: &Grant, attempt: &Attempt, now: Now) {
        self.gov.hold_to_request_deadline(&grant.slot);
        self.note_acquire(attempt, now.wall(), Status::Ok, None, grant.queued_ms, Some(grant.slot.log_ref()));
    }

    /// The exchange is over: the slot goes back with what the upstream said.
    pub fn release_proxied(&mut self, pid: PoolId, slot: &SlotId, outcome: Option<&Outcome>, now: Ms) {
        self.gov.release(pid, &slot.encode(), outcome, now);
    }
}
