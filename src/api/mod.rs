//! The lock API: routes a parsed request to the governor and writes the answer.
//!
//! This layer owns the governor and the per-pool credentials. It sees a
//! parsed `Head`, the body bytes and a little context from the reactor (the
//! time, the peer, which connection); it never touches a socket. It is the
//! reactor's one door into the application (`door.rs`): a queued acquire is
//! answered later through `answer_notice`, and the reactor's own deadlines
//! come back as typed `Wake`s.

pub mod auth;
pub mod door;
pub mod error;
mod grant;
pub mod proxy;
pub mod route;
mod scrape;
pub mod settings;
mod verdict;

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::access::PoolAccess;
use crate::accesslog::{AccessLog, Record};
use crate::config::Config;
use crate::governor::history::{self, Attempts, History};
use crate::governor::idempotency::IdemKey;
pub use crate::governor::lease::SlotId;
/// The governor's types the reactor handles, through this one door.
pub use crate::governor::{Admission, Entropy, Grant, PoolId};
use crate::governor::{Denial, DenyReason, Governor, Leaving, RenewError, WaiterKey};
use crate::http::request::{Head, Method};
use crate::http::response::{json_u64, push_u64, Status, Writer};
use crate::metrics::Histogram;
use crate::report::{self, check_object, is_blank};
use crate::time::{EpochMs, Ms, Now};
use auth::{KeyPrint, KnownKeys, PoolKeys};
pub use door::{Answer, ConnId, Event, Wake};
pub use error::ApiError;
use route::Route;
pub use settings::pool_settings;
use std::time::Instant;
pub use verdict::Verdicts;

/// What the reactor knows about the request being handled.
#[derive(Clone, Copy)]
pub struct Ctx {
    pub now: Now,
    /// The connection the request came on: a queued acquire's answer goes to it.
    pub conn: ConnId,
    pub peer: IpAddr,
    /// The answer must close the connection (HTTP/1.0, `Connection: close`).
    pub close: bool,
    /// When the reactor turn that read this request began.
    pub started: Instant,
    /// When the request was read (`now.ms` unless it waited in its
    /// connection's input, behind a queued acquire): its wait budget runs
    /// from here.
    pub read: Ms,
}

/// An acquire in progress: what its answer and its log line need.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub pool: PoolId,
    pub client: IpAddr,
    pub wait_ms: u64,
    /// When the server started on the request (the reactor turn it arrived in).
    pub started: Instant,
}

/// An acquire attempt answered in this turn, kept until the reactor has
/// answered the turn's requests and is about to write the answers: only then
/// is its server time known, from one clock reading for all of them
/// (`App::settle_answers`).
struct Answered {
    /// Everything but the server time.
    line: history::Attempt,
    started: Instant,
    client: IpAddr,
    /// Its pool, when the request named a known one.
    pid: Option<PoolId>,
    /// Where the pool name the request gave lies in `App::answered_names`
    /// (`None`: the line goes under the pool's own name).
    name: Option<(u32, u32)>,
    /// Counted in the pool's latency histogram.
    timed: bool,
    /// Written to the access log (else the history and histogram only).
    logged: bool,
}

/// A queued acquire the reactor must remember until its notice comes.
#[derive(Debug, Clone, Copy)]
pub struct Queued {
    pub key: WaiterKey,
    pub attempt: Attempt,
    /// A proxied request's wait: its log line is its exchange's, with method and path.
    pub proxied: bool,
}

pub enum Handled {
    Done,
    /// The answer said `Connection: close`: nothing after it may be read.
    Close,
    /// A slot was granted; if the answer cannot be delivered, release it.
    Granted(SlotId),
    Queued(Queued),
}

/// Who may use a pool: its keys and its access policies.
struct Credentials {
    keys: PoolKeys,
    access: PoolAccess,
    /// Proxy mode: where this pool's traffic goes (SPEC §12).
    upstream: Option<crate::config::upstream::Upstream>,
    /// Its pool was removed and drained, and what only its traffic needed
    /// was given back (`App::begin_turn`).
    shed: bool,
}

pub struct App {
    gov: Governor<door::Timer>,
    /// Indexed by `PoolId`, like the governor's pools.
    creds: Vec<Credentials>,
    public_host: Option<Box<[u8]>>,
    /// `public_host` as a request's `Host` is compared with it: an IPv6
    /// address without its brackets, a name without a trailing dot.
    public_host_name: Option<Box<[u8]>>,
    pub max_body: usize,
    pub log: AccessLog,
    /// Acquire server time per pool, indexed by `PoolId`.
    latency: Vec<Histogram>,
    pub rejections: Rejections,
    /// What the dashboard shows, indexed by `PoolId`.
    pub history: Vec<(History, Attempts)>,
    /// The second the histories were last sampled in.
    history_second: Option<u64>,
    /// The current reactor turn's time.
    turn: Now,
    /// The access log's flush is on the wheel.
    log_timer_armed: bool,
    /// `adminToken`: every admin route but `/healthz` asks for it.
    pub admin_token: Option<Box<str>>,
    /// The public listener's bound address, for the dashboard's Examples.
    pub listen_addr: Option<std::net::SocketAddr>,
    /// Proxy hosts on the main listener (lower case, no port) and their pools.
    proxy_hosts: std::collections::HashMap<Box<[u8]>, PoolId>,
    scratch: Vec<u8>,
    grant_tail: grant::GrantTail,
    /// Attempts answered since the reactor last settled them, in order, and
    /// the pool names their requests gave (see `Answered`).
    answered: Vec<Answered>,
    answered_names: String,
    /// Bumped by every (re)configuration: verdicts kept under an older one
    /// do not hold (see `verdict`).
    generation: u64,
    /// What each lock-route acquire waiting in a queue presented, and the
    /// `generation` it was admitted under, by its waiter's index: a reload
    /// that revokes its key refuses it (`recheck_waiter`). Kept beside the
    /// waiters, not in `Queued`, which every answer carries.
    waiter_prints: Vec<(KeyPrint, u64)>,
    /// Every pool's keys, retired pools' too (`logged_pool_name`).
    known_keys: KnownKeys,
}

/// Lock API answers of 400 and above, by pool and status code: one counter
/// per pool and code, bumped where the answer is written. Row 0 counts the
/// answers whose pool is unknown or not yet resolved (a malformed head, an
/// unknown pool, a connection refused at the cap); row `pid + 1` is pool
/// `pid`'s. Rows only grow (pools are retired, never removed), so counting
/// is two indexings and never allocates.
#[derive(Debug, Clone)]
pub struct Rejections {
    rows: Vec<[u64; Rejections::CODES.len()]>,
}

impl Default for Rejections {
    fn default() -> Self {
        Rejections { rows: vec![[0; Rejections::CODES.len()]] }
    }
}

impl Rejections {
    /// Every code an acquire, renew, release or proxied request can be
    /// answered with by this server (and a request too malformed to route):
    /// the series exist from the start.
    pub const CODES: [u16; 18] =
        [400, 401, 403, 404, 405, 408, 409, 413, 414, 417, 421, 429, 431, 501, 502, 503, 504, 505];

    /// The column of `code` in a row: its place in `CODES`.
    fn column(code: u16) -> Option<usize> {
        Self::CODES.iter().position(|&c| c == code)
    }

    /// Makes room for `pools` pools (never shrinks).
    pub fn set_pools(&mut self, pools: usize) {
        if self.rows.len() < pools + 1 {
            self.rows.resize(pools + 1, [0; Rejections::CODES.len()]);
        }
    }

    /// Counts an answer of `pool` (`None`: not known) with `status`.
    pub fn count(&mut self, pool: Option<PoolId>, status: Status) {
        let row = pool.map_or(0, |pid| pid.0 as usize + 1);
        let column = Self::column(status.code());
        debug_assert!(column.is_some(), "{} has no rejections series", status.code());
        if let (Some(column), Some(row)) = (column, self.rows.get_mut(row)) {
            row[column] += 1;
        }
    }

    /// The count of `code` for `pool` (`None`: the answers with no pool).
    pub fn get(&self, pool: Option<PoolId>, code: u16) -> u64 {
        let row = pool.map_or(0, |pid| pid.0 as usize + 1);
        Self::column(code).and_then(|column| self.rows.get(row).map(|r| r[column])).unwrap_or(0)
    }

    /// `(code, count)` for every code of `CODES`, for `pool`.
    pub fn by_code(&self, pool: Option<PoolId>) -> Vec<(u16, u64)> {
        Self::CODES.iter().map(|&code| (code, self.get(pool, code))).collect()
    }
}

/// Builds every pool's keys and access policies (JWKS files read and
/// checked): the one step start-up, reload and `--check-config` share.
/// `previous` gives a pool's running policies on a reload; `now` is when.
fn credentials<'c, 'p>(
    config: &'c Config,
    previous: impl Fn(&str) -> Option<&'p Credentials>,
    now: EpochMs,
) -> Result<BTreeMap<&'c str, Credentials>, String> {
    let mut fresh = BTreeMap::new();
    for (name, pool) in &config.pools {
        let running = previous(name);
        let access = PoolAccess::build(name, &pool.access, running.map(|c| &c.access), now)
            .map_err(|e| format!("pools.{name}.{e}"))?;
        let upstream = pool
            .upstream
            .as_ref()
            .map(|u| crate::config::upstream::Upstream::rebuild(u, running.and_then(|c| c.upstream.as_ref())))
            .transpose()
            .map_err(|e| format!("pools.{name}.{e}"))?;
        fresh.insert(name.as_str(), Credentials { keys: PoolKeys::new(pool), access, upstream, shed: false });
    }
    Ok(fresh)
}

/// Checks what start-up would check beyond the file itself (JWKS files),
/// without opening anything else or serving.
pub fn check(config: &Config) -> Result<(), String> {
    credentials(config, |_| None, EpochMs(0)).map(drop)
}

impl App {
    /// The application for `config`; `entropy` is the governor's random source.
    pub fn new(config: &Config, entropy: Entropy) -> Result<App, String> {
        let mut app = App {
            gov: Governor::new(&BTreeMap::new(), entropy),
            creds: Vec::new(),
            public_host: None,
            public_host_name: None,
            max_body: config.max_body_bytes,
            log: AccessLog::open(config.access_log.as_deref())?,
            latency: Vec::new(),
            rejections: Rejections::default(),
            history: Vec::new(),
            history_second: None,
            turn: Now::default(),
            log_timer_armed: false,
            admin_token: None,
            listen_addr: None,
            proxy_hosts: Default::default(),
            scratch: Vec::with_capacity(512),
            grant_tail: grant::GrantTail::default(),
            answered: Vec::new(),
            answered_names: String::new(),
            generation: 0,
            waiter_prints: Vec::new(),
            known_keys: KnownKeys::default(),
        };
        app.reconfigure(config, Now::default())?;
        Ok(app)
    }

    /// Applies a (re)loaded configuration; pools keep their live state. On
    /// error (an access log or JWKS file that cannot be opened) nothing
    /// changes. The access log is always reopened, so SIGHUP after a log
    /// rotation writes to the new file. The queues are granted what the
    /// new limits free only at `grant_after_reload`.
    pub fn reconfigure(&mut self, config: &Config, now: Now) -> Result<(), String> {
        // Everything that can fail comes first, so a failure leaves all as it was.
        let log = AccessLog::open(config.access_log.as_deref())?;
        let previous = |name: &str| self.gov.pool_id(name).map(|pid| &self.creds[pid.0 as usize]);
        let mut fresh = credentials(config, previous, now.wall())?;
        self.gov.reconfigure(&pool_settings(config), now.ms);
        self.generation += 1;
        self.public_host = config.public_host.as_ref().map(|h| h.as_bytes().into());
        self.public_host_name = self.public_host.as_deref().map(|h| host_name(h).into());
        self.max_body = config.max_body_bytes;
        self.log.flush();
        self.log.replace_sink(log);
        self.latency.resize_with(self.gov.pools().count(), Histogram::acquire_us);
        self.history.resize_with(self.gov.pools().count(), Default::default);
        for ((_, pool), (history, _)) in self.gov.pools().zip(&mut self.history) {
            if !pool.drained_away() {
                history.begin(pool, now.ms);
            }
        }
        self.rejections.set_pools(self.gov.pools().count());
        self.admin_token = config.admin_token.as_deref().map(Into::into);
        // Retired pools keep their old credentials so their leases can still be released.
        let mut old = std::mem::take(&mut self.creds).into_iter();
        for (_, pool) in self.gov.pools() {
            let previous = old.next();
            let creds = match (fresh.remove(&*pool.name), previous) {
                (Some(mut new), Some(mut previous)) => {
                    new.access.carry_state_from(&mut previous.access, now.wall());
                    new
                }
                (Some(new), None) => new,
                (None, Some(previous)) => previous,
                (None, None) => unreachable!("a pool is configured or was before"),
            };
            self.creds.push(creds);
        }
        self.known_keys = KnownKeys::of(self.creds.iter().map(|c| &c.keys));
        self.index_proxy_hosts();
        Ok(())
    }

    /// The name an acquire's access-log line gives a pool no configuration
    /// has: the one its path named when that could be a pool's (a DNS label,
    /// as every configured name is) and is no pool's key, else empty. A path
    /// is the client's: one that put a key there by mistake (a UUID is a DNS
    /// label), or thousands of bytes, has neither written out.
    fn logged_pool_name<'n>(&self, name: &'n str) -> &'n str {
        if crate::config::is_dns_label(name) && !self.known_keys.holds(name.as_bytes()) {
            name
        } else {
            ""
        }
    }

    /// `logged_pool_name` of a path's `{pool}` segment read as the look-up
    /// reads it, its percent-escapes decoded into `room` (`n%6fpe` is
    /// `nope`), so a request is logged under one name whether it was
    /// answered or cut short.
    fn logged_segment<'a>(&self, segment: &'a [u8], room: &'a mut Option<route::DecodedName>) -> &'a str {
        *room = if segment.contains(&b'%') { route::decode_pool(segment).ok().flatten() } else { None };
        let name = room.as_ref().map_or(segment, |name| name.as_bytes());
        self.logged_pool_name(std::str::from_utf8(name).unwrap_or_default())
    }

    /// After a reload, once the waiters it refuses are answered
    /// (`refused_since_reload`, `withdraw_unsendable`): the queues are
    /// granted what the new limits free, so none of those waiters takes a
    /// slot, a rate token or a learned budget's grant before its refusal.
    pub fn grant_after_reload(&mut self, now: Now) {
        self.gov.grant_after_reload(now.ms);
    }

    /// Pools the snapshot brought back retired, beyond the configured ones:
    /// their keys and policies are not in it, so no key opens them. Their
    /// leases count until they end; a reload that names a pool again gives
    /// it its keys, and its holders renew and release as before.
    fn fit_retired_pools(&mut self) {
        let pools = self.gov.pools().count();
        while self.creds.len() < pools {
            self.creds.push(Credentials {
                keys: PoolKeys::none(),
                access: PoolAccess::build("", &Default::default(), None, EpochMs(0)).expect("no policy to build"),
                upstream: None,
                shed: false,
            });
        }
        self.latency.resize_with(pools, Histogram::acquire_us);
        self.history.resize_with(pools, Default::default);
        self.rejections.set_pools(pools);
    }

    /// The current turn's time.
    pub fn turn(&self) -> Now {
        self.turn
    }

    /// The governor, to read (metrics, the dashboard).
    pub fn governor(&self) -> &Governor<door::Timer> {
        &self.gov
    }

    /// `publicHost`, when configured.
    pub fn public_host(&self) -> Option<&[u8]> {
        self.public_host.as_deref()
    }

    /// What a caller of `pid` must send besides the key (the dashboard's
    /// Examples show it).
    pub fn credentials_asked(&self, pid: PoolId) -> CredentialsAsked {
        let access = &self.creds[pid.0 as usize].access;
        CredentialsAsked { jwt: access.reads_jwt(), cloudflare: access.reads_cloudflare(), hmac: access.needs_body() }
    }

    /// What can be decided from the head alone (route, method, host, key,
    /// access policies, and of a signature its headers), so `Expect:
    /// 100-continue` can be refused before the body is sent, with the
    /// answer the whole request would get.
    pub fn precheck(&self, ctx: &Ctx, head: &Head) -> Result<(), ApiError> {
        let (route, pid) = self.resolve(head)?;
        let client = self.client_addr(pid, ctx, head);
        self.authorize(ctx, route, pid, client, head)?;
        // `dispatch` checks the signature right after `authorize`, so its
        // header-only refusals come in the same order here.
        self.creds[pid.0 as usize].access.check_signed_head(head, ctx.now.wall())?;
        Ok(())
    }

    /// The caller's address as the pool's `trustedProxies` tell it: worked
    /// out once per request.
    fn client_addr(&self, pid: PoolId, ctx: &Ctx, head: &Head) -> IpAddr {
        self.creds[pid.0 as usize].access.client_addr(ctx.peer, head)
    }

    /// The key, then every policy that the head alone decides.
    fn authorize(&self, ctx: &Ctx, route: Route, pid: PoolId, client: IpAddr, head: &Head) -> Result<(), ApiError> {
        // A pool dropped by a reload is unknown to new callers; its leases still drain.
        if matches!(route, Route::Acquire { .. }) && self.gov.pool(pid).retired {
            return Err(UNKNOWN_POOL);
        }
        let creds = &self.creds[pid.0 as usize];
        creds.keys.check(head)?;
        if !creds.access.is_open() {
            creds.access.check_head(head, client, ctx.now.wall())?;
        }
        Ok(())
    }

    /// The lock route, pool and client address of a request that passed
    /// routing and every check its head alone decides. A head its
    /// connection's `verdicts` already judged under this configuration is
    /// not judged again: repeated whole as an acquire, it is not even routed;
    /// nor is a renew or release whose path is the remembered one but for
    /// its slot id (`SlotAt`). Any other head with a request line of the
    /// same length is routed, and checked only if that finds another pool or
    /// another kind of request.
    fn admit<'h>(
        &self,
        ctx: &Ctx,
        head: &Head<'h>,
        verdicts: &mut Verdicts,
    ) -> Result<(Lock<'h>, PoolId, IpAddr), ApiError> {
        let kept = head.recall.and_then(|r| verdicts.get(r, self.generation).map(|v| (r, v)));
        if let Some((recall, v)) = kept {
            if recall.same_line && v.whole && v.acquire {
                return Ok((Lock::Acquire, v.pool, v.client));
            }
            // The line may not be the remembered one: its method and host
            // are looked at here as `resolve` would.
            let slot = v.slot.zip(recall.path).and_then(|(at, remembered)| at.lock(head.path, remembered));
            if let Some(lock) = slot.filter(|_| head.method == Method::Post && self.on_public_host(head)) {
                return Ok((lock, v.pool, v.client));
            }
        }
        let (route, pid) = self.resolve(head)?;
        let lock = Lock::of(route);
        let acquire = matches!(lock, Lock::Acquire);
        if let Some((_, v)) = kept.filter(|(_, v)| v.pool == pid && v.acquire == acquire) {
            return Ok((lock, pid, v.client));
        }
        let addr = self.client_addr(pid, ctx, head);
        self.authorize(ctx, route, pid, addr, head)?;
        if let Some(recall) = head.recall.filter(|_| self.creds[pid.0 as usize].access.is_open()) {
            verdicts.keep(recall, self.generation, pid, addr, lock, head.path);
        }
        Ok((lock, pid, addr))
    }

    fn resolve<'h>(&self, head: &Head<'h>) -> Result<(Route<'h>, PoolId), ApiError> {
        // A line read by comparison with a remembered one has its target checked here.
        head.check_target()?;
        let route = route::route(head.path).ok_or_else(|| no_route(head.path))?;
        // The host first: on another host the lock routes do not exist at all.
        if !self.on_public_host(head) {
            return Err(ApiError::OFF_PUBLIC_HOST);
        }
        if head.method != Method::Post {
            return Err(ApiError::MethodNotAllowed);
        }
        let pid = self.pool_in_path(route.pool())?.ok_or(UNKNOWN_POOL)?;
        Ok((route, pid))
    }

    /// The pool a path's `{pool}` segment names: as it stands, else with
    /// its percent-encoding decoded (`d%65mo` is `demo`). An escape that
    /// can name no pool (not hex, or a byte no pool name holds) is an
    /// error, never a look-up.
    pub fn pool_in_path(&self, segment: &[u8]) -> Result<Option<PoolId>, route::BadEscape> {
        match self.gov.pool_id(segment) {
            Some(pid) => Ok(Some(pid)),
            None => self.escaped_pool(segment),
        }
    }

    /// `pool_in_path` for a segment no pool is named by as it stands: only
    /// one holding a `%` is decoded, so a path without one pays a byte
    /// search on its way to `401`, and a known pool's path nothing.
    #[cold]
    #[inline(never)]
    fn escaped_pool(&self, segment: &[u8]) -> Result<Option<PoolId>, route::BadEscape> {
        if !segment.contains(&b'%') {
            return Ok(None);
        }
        Ok(route::decode_pool(segment)?.and_then(|name| self.gov.pool_id(name.as_bytes())))
    }

    /// Whether `head` is for the host the lock routes are served on (any
    /// host unless `publicHost` is set).
    fn on_public_host(&self, head: &Head) -> bool {
        self.public_host_name.as_ref().is_none_or(|public| {
            let name = host_name(head.host.unwrap_or_default());
            name.eq_ignore_ascii_case(public)
        })
    }

    /// Answers a lock-API request; `verdicts` are its connection's (see `verdict`).
    pub fn handle(
        &mut self,
        ctx: &Ctx,
        head: &Head,
        body: &[u8],
        out: &mut Vec<u8>,
        verdicts: &mut Verdicts,
    ) -> Handled {
        let mut client = None;
        match self.dispatch(ctx, head, body, out, &mut client, verdicts) {
            Ok(handled) => handled,
            // `OPTIONS *` asks what the server as a whole supports (RFC 9110 §9.3.7).
            Err(ApiError::RouteNotFound(_)) if head.path == b"*" => {
                let mut w = Writer::start(out, Status::Ok);
                w.header(b"Allow", b"POST");
                w.finish(b"", ctx.close);
                Handled::Done
            }
            Err(e) => {
                self.reject_from(ctx, head, e, client, out);
                if e.closes() {
                    Handled::Close
                } else {
                    Handled::Done
                }
            }
        }
    }

    /// Answers a request with an error; acquire attempts are logged too
    /// (malformed and unauthorized ones included).
    pub fn reject(&mut self, ctx: &Ctx, head: &Head, error: ApiError, out: &mut Vec<u8>) {
        self.reject_from(ctx, head, error, None, out);
    }

    /// `reject`, with the client address when it was already worked out.
    fn reject_from(&mut self, ctx: &Ctx, head: &Head, error: ApiError, client: Option<IpAddr>, out: &mut Vec<u8>) {
        let route = route::route(head.path);
        let pool = route.and_then(|r| self.pool_in_path(r.pool()).ok().flatten());
        self.rejections.count(self.counted_under(pool), error.status());
        error.write(out, &mut self.scratch, ctx.close);
        if let Some(Route::Acquire { pool: name }) = route {
            let client = client.unwrap_or_else(|| pool.map_or(ctx.peer, |pid| self.client_addr(pid, ctx, head)));
            let line = history::Attempt {
                epoch_ms: ctx.now.wall().0,
                status: error.status().code(),
                error: Some(error.code()),
                ..history::Attempt::default()
            };
            // A known pool's line goes under its own name, also when the
            // path spelled it with percent-escapes; an unknown one's under
            // the name the escapes spell.
            let mut room = None;
            let name = match pool {
                Some(_) => None,
                None => Some(self.logged_segment(name, &mut room)),
            };
            self.record_attempt(pool, name, client, line, ctx.started, true);
        }
    }

    /// Records one acquire attempt that started at `started`, once the
    /// reactor settles the turn's answers (`settle_answers`): in its pool's
    /// history for the dashboard and, when `timed`, its latency histogram
    /// (both when the pool is known), and as an access-log line under `name`
    /// (the name the request gave), else under the pool's name.
    fn record_attempt(
        &mut self,
        pid: Option<PoolId>,
        name: Option<&str>,
        client: IpAddr,
        line: history::Attempt,
        started: Instant,
        timed: bool,
    ) {
        let logged = self.log.is_on() && (name.is_some() || pid.is_some());
        let name = name.filter(|_| logged).map(|name| {
            let start = self.answered_names.len();
            self.answered_names.push_str(name);
            (start as u32, self.answered_names.len() as u32)
        });
        self.answered.push(Answered { line, started, client, pid, name, timed, logged });
    }

    /// An attempt in its pool's history and, when `timed`, latency histogram
    /// only (a proxied request's line is written by its exchange).
    fn observe(&mut self, attempt: &Attempt, line: history::Attempt, timed: bool) {
        let (started, client, pid) = (attempt.started, attempt.client, Some(attempt.pool));
        self.answered.push(Answered { line, started, client, pid, name: None, timed, logged: false });
    }

    /// Whether attempts answered since the last `settle_answers` wait for it.
    pub fn has_answered(&self) -> bool {
        !self.answered.is_empty()
    }

    /// Records the attempts answered since the last call (see
    /// `record_attempt`), their answers about to be written: `at` is when,
    /// and each one's server time runs from its `started` to it. The reactor
    /// calls this once a turn's requests are answered, so one clock reading
    /// serves all of the turn's answers.
    pub fn settle_answers(&mut self, at: Instant) {
        let answered = std::mem::take(&mut self.answered);
        // Most of a turn's attempts started in that turn: one subtraction,
        // and one look-up of the latency bucket (every pool's histogram has
        // the same bounds), serve them.
        let mut since: Option<(Instant, u64, usize)> = None;
        for a in &answered {
            let (server_us, bucket) = match since {
                Some((started, us, bucket)) if started == a.started => (us, bucket),
                _ => {
                    let us = crate::time::micros(at.saturating_duration_since(a.started));
                    let bucket = Histogram::acquire_us().bucket_of(us);
                    since = Some((a.started, us, bucket));
                    (us, bucket)
                }
            };
            if let Some(pid) = a.pid {
                if a.timed {
                    self.latency[pid.0 as usize].observe_in(bucket, server_us);
                }
                self.history[pid.0 as usize].1.push(history::Attempt { server_us, ..a.line });
            }
            if a.logged {
                let pool = match (a.name, a.pid) {
                    (Some((start, end)), _) => &self.answered_names[start as usize..end as usize],
                    (None, Some(pid)) => &*self.gov.pool(pid).name,
                    (None, None) => continue,
                };
                self.log.record(&Record { server_us, ..record_of(pool, a.client, &a.line) });
            }
        }
        self.answered = answered;
        self.answered.clear();
        self.answered_names.clear();
    }

    /// Answers a lock route; `client` is set as soon as the caller's address is known.
    fn dispatch(
        &mut self,
        ctx: &Ctx,
        head: &Head,
        body: &[u8],
        out: &mut Vec<u8>,
        client: &mut Option<IpAddr>,
        verdicts: &mut Verdicts,
    ) -> Result<Handled, ApiError> {
        let (lock, pid, addr) = self.admit(ctx, head, verdicts)?;
        *client = Some(addr);
        let access = &mut self.creds[pid.0 as usize].access;
        if access.needs_body() {
            access.check_signed(head, body, ctx.now.wall())?;
        }
        match lock {
            Lock::Acquire => {
                // No body and no header: fail fast, the usual acquire, without a call.
                let asked = !body.is_empty() || head.api.queue_timeout_ms().is_some();
                let mut wait_ms = if asked { wait_budget(head, body)? } else { 0 };
                if head.api.moved() && self.moved_by_trusted_proxy(pid, ctx.peer) {
                    wait_ms = 0;
                }
                let attempt = Attempt { pool: pid, client: addr, wait_ms, started: ctx.started };
                let (owner, now) = (ctx.conn.owner(), ctx.now.ms);
                let admission = match head.api.idempotency_key() {
                    None => self.gov.acquire_read_at(pid, attempt.wait_ms, owner, ctx.read, now),
                    Some(raw) => {
                        // Scopes the key to the pool key that presented it (which
                        // was checked: the hash only tells the pool's keys apart).
                        let presented = self.creds[pid.0 as usize].keys.presented(head).unwrap_or_default();
                        let credential = crate::governor::fnv1a(crate::governor::FNV_OFFSET, presented);
                        let key = IdemKey::new(credential, crate::http::trim(raw)).ok_or(BAD_IDEMPOTENCY_KEY)?;
                        let admission =
                            self.gov.acquire_keyed_read_at(pid, &key, attempt.wait_ms, owner, ctx.read, now);
                        admission.map_err(|full| ApiError::KeysFull(full.capacity.into()))?
                    }
                };
                match admission {
                    Admission::Granted(grant) => {
                        self.answer_grant(out, &grant, &attempt, ctx.now, ctx.close);
                        Ok(Handled::Granted(grant.slot))
                    }
                    Admission::Denied(denial) => {
                        self.answer_denial(out, &denial, Status::TooManyRequests, &attempt, ctx.now, ctx.close);
                        Ok(Handled::Done)
                    }
                    Admission::Queued(key) => {
                        self.keep_print(key, self.creds[pid.0 as usize].keys.print(head));
                        Ok(Handled::Queued(Queued { key, attempt, proxied: false }))
                    }
                }
            }
            Lock::Renew(slot) => {
                // An unchecked target (a line read by comparison) is named
                // before its body, as a fresh parse names it.
                check_renew_body(body).map_err(|e| head.check_target().map_or_else(ApiError::from, |()| e))?;
                match self.gov.renew(pid, slot, ctx.now.ms) {
                    Ok(deadline) => {
                        self.scratch.clear();
                        self.scratch.push(b'{');
                        json_u64(&mut self.scratch, b"leaseDeadline", ctx.now.wall_at(deadline).0);
                        self.scratch.push(b'}');
                        Writer::start(out, Status::Ok).finish_json(&self.scratch, ctx.close);
                        Ok(Handled::Done)
                    }
                    Err(RenewError::NotFound) => {
                        // A slot id holds none of the bytes a target may not:
                        // only a line read by comparison (whose target was not
                        // checked) can get here with one, and it gets the `400`
                        // its bytes would get in any other head.
                        head.check_target()?;
                        Err(ApiError::NotFound)
                    }
                    Err(RenewError::Capped) => Err(ApiError::Capped),
                }
            }
            Lock::Release(slot) => {
                let outcome = report::parse_release(body, ctx.now.wall().0)
                    .map_err(|e| head.check_target().map_or_else(ApiError::from, |()| ApiError::BadRequest(e)))?;
                let released = self.gov.release(pid, slot, outcome.as_ref(), ctx.now.ms);
                if !released {
                    // As for a renew: an unchecked target is checked when it names no slot.
                    head.check_target()?;
                }
                Writer::start(out, Status::Ok).raw(released_rest(released, ctx.close));
                Ok(Handled::Done)
            }
        }
    }

    /// Counts and logs one answered acquire.
    fn note_acquire(
        &mut self,
        attempt: &Attempt,
        epoch_now: EpochMs,
        status: Status,
        reason: Option<DenyReason>,
        queued_ms: u64,
        slot_ref: Option<u32>,
    ) {
        let code = (status != Status::Ok).then(|| denial_code(status));
        self.log_acquire(attempt, epoch_now, status, code, reason, queued_ms, slot_ref);
    }

    /// Counts and logs one answered acquire under the log's error `code`.
    #[allow(clippy::too_many_arguments)]
    fn log_acquire(
        &mut self,
        attempt: &Attempt,
        epoch_now: EpochMs,
        status: Status,
        code: Option<&'static str>,
        reason: Option<DenyReason>,
        queued_ms: u64,
        slot_ref: Option<u32>,
    ) {
        let line = acquire_line(attempt, epoch_now, status, code, reason, queued_ms, slot_ref);
        self.record_attempt(Some(attempt.pool), None, attempt.client, line, attempt.started, true);
    }

    /// Counts an answered acquire in the latency histogram and the
    /// dashboard's history.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn observe_acquire(
        &mut self,
        attempt: &Attempt,
        epoch_now: EpochMs,
        status: Status,
        code: Option<&'static str>,
        reason: Option<DenyReason>,
        queued_ms: u64,
        slot_ref: Option<u32>,
    ) {
        let line = acquire_line(attempt, epoch_now, status, code, reason, queued_ms, slot_ref);
        self.observe(attempt, line, true);
    }

    /// The `200` of an acquire, immediate or after queueing, logged.
    pub fn answer_grant(&mut self, out: &mut Vec<u8>, grant: &Grant, attempt: &Attempt, now: Now, close: bool) {
        self.note_acquire(attempt, now.wall(), Status::Ok, None, grant.queued_ms, Some(grant.slot.log_ref()));
        self.grant_tail.write(out, grant, now, close);
    }

    /// A queued acquire cut short by shutdown: `503` with `Retry-After`,
    /// logged with the time it waited; `close` when nothing was pipelined behind it.
    pub fn answer_shutdown(&mut self, out: &mut Vec<u8>, queued: &Queued, conn: ConnId, now: Now, close: bool) {
        self.gov.cancel_waiter(queued.key, conn.owner(), Leaving::Answered);
        self.answer_queued_error(out, &queued.attempt, now, SHUTTING_DOWN, close);
    }

    /// A queued acquire whose place a retry with its `Idempotency-Key` took:
    /// `409 superseded`, logged with the time it waited.
    fn answer_superseded(&mut self, out: &mut Vec<u8>, attempt: &Attempt, now: Now, close: bool) {
        self.answer_queued_error(out, attempt, now, ApiError::Superseded, close);
    }

    /// `X-Nthpool-Moved` from one of the pool's trusted proxies: the proxy
    /// moved this pool here from an instance out of rotation, and its
    /// re-adoption window opens. From anyone else the field is ignored (it
    /// would hold up fail-fast acquires for a term).
    ///
    /// Called for every request that carries the field, before anything can
    /// refuse it: the proxy marks the requests of the pool after the move
    /// until this instance answers one (its stick table names this instance
    /// from then on: see `moved_by_trusted_proxy`), and the first may be one
    /// this instance refuses (a bad key, an unknown route under the pool, a
    /// proxied request's bad head, one placed by a stale map and refused
    /// `421`), yet the pool has moved all the same. The pool that moved is
    /// the one the proxy placed the request by (`X-Nthpool-Pool`, the key of
    /// its stick table), whatever pool the request reaches here; without
    /// that field it is found as the proxy finds it: by the host of proxy
    /// traffic, else by the `{pool}` segment of `/pools/{pool}`.
    #[cold]
    pub fn note_move(&mut self, listener_pool: Option<PoolId>, ctx: &Ctx, head: &Head) {
        match head.api.placed_as() {
            Some(placed_as) => self.note_move_of(placed_as, ctx.peer, ctx.now.ms),
            None => {
                if let Some((pid, _)) = self.routed_by_trusted_proxy(listener_pool, head, ctx.peer) {
                    self.gov.moved_here(pid, ctx.now.ms);
                }
            }
        }
    }

    /// `note_move` for a head refused before its fields were read (`400`,
    /// `431`, …, answered by `refuse_head`): the pool the proxy placed it by
    /// has moved all the same.
    #[cold]
    pub fn note_refused_move(&mut self, input: &[u8], peer: IpAddr, now: Now) {
        if let Some(placed_as) = crate::http::request::moved_placed_as(input) {
            self.note_move_of(placed_as, peer, now.ms);
        }
    }

    /// Opens the window of the pool named `placed_as`, moved here by one of
    /// its trusted proxies.
    fn note_move_of(&mut self, placed_as: &[u8], peer: IpAddr, now: Ms) {
        if let Some(pid) = self.gov.pool_id(placed_as).filter(|&pid| self.moved_by_trusted_proxy(pid, peer)) {
            self.gov.moved_here(pid, now);
        }
    }

    /// A request the proxy in front moved here (`X-Nthpool-Moved`, from one
    /// of `pid`'s trusted proxies) is answered at once, a waiting acquire as
    /// a fail-fast one (`429 recovering` in the window it opened): HAProxy
    /// records where a pool lives when the instance it chose answers, and a
    /// request held in the queue for the window would leave the record
    /// naming the failed instance, which the pool's other requests would go
    /// back to once it is up again, beside this one.
    #[cold]
    pub(crate) fn moved_by_trusted_proxy(&self, pid: PoolId, peer: IpAddr) -> bool {
        self.creds[pid.0 as usize].access.trusts_proxy(peer)
    }

    /// The pool a request reaches, found as the proxy in front finds it (by
    /// the host of proxy traffic, else by the `{pool}` segment), and whether
    /// it is proxied; `None` unless `peer` is one of that pool's trusted
    /// proxies, the only peers whose routing fields are heard.
    fn routed_by_trusted_proxy(
        &self,
        listener_pool: Option<PoolId>,
        head: &Head,
        peer: IpAddr,
    ) -> Option<(PoolId, bool)> {
        let proxied = self.proxy_route(listener_pool, head);
        let pid = proxied.or_else(|| self.pool_in_path(route::pool_segment(head.path)?).ok().flatten())?;
        self.creds[pid.0 as usize].access.trusts_proxy(peer).then_some((pid, proxied.is_some()))
    }

    /// `X-Nthpool-Pool` from one of the pool's trusted proxies names the
    /// pool the proxy placed this request by (empty: its map named none).
    /// When that is not the pool the request reaches here, found as the
    /// proxy finds it (by the host of proxy traffic, else by the `{pool}`
    /// segment), the proxy's host map is older than this instance's
    /// configuration and is splitting the pool's traffic between
    /// instances: the request is refused with `421` (and the connection
    /// closes, its body unread) rather than governed beside the pool's own
    /// instance. Returns whether it was. From anyone else the field is
    /// ignored, as is a request that reaches no pool.
    #[cold]
    pub fn refuse_misplaced(
        &mut self,
        listener_pool: Option<PoolId>,
        ctx: &Ctx,
        head: &Head,
        out: &mut Vec<u8>,
    ) -> bool {
        let Some(placed_as) = head.api.placed_as() else { return false };
        let Some((pid, proxied)) = self.routed_by_trusted_proxy(listener_pool, head, ctx.peer) else { return false };
        if placed_as == self.gov.pool(pid).name.as_bytes() {
            return false;
        }
        let ctx = Ctx { close: true, ..*ctx };
        if proxied {
            self.refuse_proxied(&ctx, pid, head, ApiError::Misdirected, out);
        } else {
            self.reject(&ctx, head, ApiError::Misdirected, out);
        }
        true
    }

    /// A queued acquire ended by `error` rather than by the governor.
    fn answer_queued_error(&mut self, out: &mut Vec<u8>, attempt: &Attempt, now: Now, error: ApiError, close: bool) {
        self.rejections.count(self.counted_under(Some(attempt.pool)), error.status());
        self.log_queued_end(attempt, now.wall(), error.status().code(), error.code(), true);
        error.write(out, &mut self.scratch, close);
    }

    /// Keeps what a reload needs to recheck a waiting acquire
    /// (`recheck_waiter`). Out of line: the usual acquire does not wait.
    #[inline(never)]
    fn keep_print(&mut self, key: WaiterKey, print: KeyPrint) {
        let print = (print, self.generation);
        let at = key.index();
        if self.waiter_prints.len() <= at {
            self.waiter_prints.resize(at + 1, Default::default());
        }
        self.waiter_prints[at] = print;
    }

    /// A queued acquire after a reload: one whose key the reload removed, or
    /// whose address the pool's `ipAllow` no longer admits, leaves the
    /// queue and is answered as a new request would be (`401`, `403`),
    /// instead of being granted a slot it could neither renew nor release.
    /// (Tokens and signatures were checked when the request came, and are
    /// not kept.) `false` when it still waits, or no longer does: the
    /// governor answered it already.
    pub fn recheck_waiter(&mut self, out: &mut Vec<u8>, queued: &Queued, conn: ConnId, now: Now, close: bool) -> bool {
        let Some(error) = self.refused_since_reload(queued, conn, now) else {
            return false;
        };
        self.answer_queued_error(out, &queued.attempt, now, error, close);
        true
    }

    /// `recheck_waiter` for either kind of waiter: the refusal of one the
    /// reload no longer admits, which has left the queue; the caller
    /// answers it (a proxied request's exchange ends with that answer).
    pub fn refused_since_reload(&mut self, queued: &Queued, conn: ConnId, now: Now) -> Option<ApiError> {
        let kept = self.waiter_prints.get(queued.key.index()).copied();
        let (print, _) = kept.filter(|&(_, generation)| generation != self.generation)?;
        let creds = &self.creds[queued.attempt.pool.0 as usize];
        let error = if !creds.keys.still_opens(print) {
            ApiError::Unauthorized(if queued.proxied {
                "The pool key this request presented was removed while it waited."
            } else {
                "The pool key this acquire presented was removed while it waited."
            })
        } else {
            ApiError::from(creds.access.check_address(queued.attempt.client).err()?)
        };
        self.gov.withdraw_waiter(queued.key, conn.owner(), now.ms, Leaving::Answered)?;
        Some(error)
    }

    /// A queued proxied request whose head was written for an upstream a
    /// reload changed or took away leaves the queue, to be answered by the
    /// caller; false when it no longer waits (the reload removed its pool,
    /// and the governor answers it).
    pub fn withdraw_unsendable(&mut self, queued: &Queued, conn: ConnId, now: Now) -> bool {
        self.gov.withdraw_waiter(queued.key, conn.owner(), now.ms, Leaving::Answered).is_some()
    }

    /// A queued acquire whose connection ended before it was answered: it
    /// leaves the queue, and its log line says `client_gone` with status 499
    /// (no answer was sent) and the time it waited.
    pub fn waiter_gone(&mut self, queued: &Queued, conn: ConnId, now: Now) {
        self.gov.cancel_waiter(queued.key, conn.owner(), Leaving::ClientGone);
        if queued.proxied {
            // Logged when its exchange ends.
            self.observe_queued_end(&queued.attempt, now.wall(), CLIENT_GONE_STATUS, "client_gone", false);
            return;
        }
        self.log_queued_end(&queued.attempt, now.wall(), CLIENT_GONE_STATUS, "client_gone", false);
    }

    /// The log line of a queued acquire that ends without a governor answer;
    /// `answered` when an answer is written (it is timed, as every answered
    /// acquire is), not when its client left first.
    fn log_queued_end(
        &mut self,
        attempt: &Attempt,
        epoch_now: EpochMs,
        status: u16,
        code: &'static str,
        answered: bool,
    ) {
        let line = queued_end_line(attempt, epoch_now, status, code);
        self.record_attempt(Some(attempt.pool), None, attempt.client, line, attempt.started, answered);
    }

    /// Such an end in its pool's history only (a proxied request's line is
    /// written by its exchange); returns the time it spent queued.
    pub(crate) fn observe_queued_end(
        &mut self,
        attempt: &Attempt,
        epoch_now: EpochMs,
        status: u16,
        code: &'static str,
        answered: bool,
    ) -> u64 {
        let line = queued_end_line(attempt, epoch_now, status, code);
        self.observe(attempt, line, answered);
        line.queued_ms
    }

    /// Answers a head refused before it could be used (framing, version,
    /// size) and closes; if its request line names an acquire route, or it
    /// came on a pool's own proxy listener (`listener_pool`: every request
    /// there is that pool's proxy traffic), the attempt is logged (by the
    /// peer's address: no header is trusted).
    #[allow(clippy::too_many_arguments)]
    pub fn refuse_head(
        &mut self,
        input: &[u8],
        peer: IpAddr,
        listener_pool: Option<PoolId>,
        started: Instant,
        now: Now,
        error: ApiError,
        out: &mut Vec<u8>,
    ) {
        self.write_error_of(listener_pool, out, error, true, b"");
        self.log_unanswered(input, peer, listener_pool, started, now, (error.status().code(), error.code()));
    }

    /// The access-log line of an acquire known only by its request line, at
    /// the start of `input`: a refused head, or one its connection closes on
    /// before it was complete or read (`UNANSWERED_*`: neither is sent). On
    /// a pool's own proxy listener that is a proxied request of the pool's.
    pub fn log_unanswered(
        &mut self,
        input: &[u8],
        peer: IpAddr,
        listener_pool: Option<PoolId>,
        started: Instant,
        now: Now,
        (status, code): (u16, &'static str),
    ) {
        if let Some(pid) = listener_pool {
            return self.log_unanswered_proxied(pid, input, peer, started, now, (status, code));
        }
        let Some(Route::Acquire { pool }) = logged_path(input).and_then(route::route) else {
            return;
        };
        let line =
            history::Attempt { epoch_ms: now.wall().0, status, error: Some(code), ..history::Attempt::default() };
        // No pool is looked up: the line is the access log's only. One
        // spelled with percent-escapes is logged decoded, as a routed
        // request's line names its pool.
        let mut room = None;
        let name = self.logged_segment(pool, &mut room);
        self.record_attempt(None, Some(name), peer, line, started, false);
    }

    /// A `429` or `504` for an acquire, logged.
    pub fn answer_denial(
        &mut self,
        out: &mut Vec<u8>,
        denial: &Denial,
        status: Status,
        attempt: &Attempt,
        now: Now,
        close: bool,
    ) {
        self.rejections.count(self.counted_under(Some(attempt.pool)), status);
        self.note_acquire(attempt, now.wall(), status, Some(denial.reason), denial.queued_ms, None);
        self.write_denial(out, denial, status, attempt.pool, close);
    }

    /// The `504` of a queued acquire whose client half-closed: its wait ends
    /// now, so what it pipelined behind can be answered in order. Logged.
    fn answer_withdrawn(&mut self, out: &mut Vec<u8>, denial: &Denial, attempt: &Attempt, now: Now, close: bool) {
        let status = Status::GatewayTimeout;
        self.rejections.count(self.counted_under(Some(attempt.pool)), status);
        self.log_acquire(attempt, now.wall(), status, Some("client_gone"), Some(denial.reason), denial.queued_ms, None);
        let message = "The client half-closed its connection, so its wait ended without a slot.";
        self.write_denial_as(out, denial, status, "queue_timeout", message, close);
    }

    /// A `429` (fail fast, queue full) or `504` (queue deadline, or the
    /// pool removed by a reload: a retired pool has no waiters left, as they
    /// are all answered the moment it is retired).
    fn write_denial(&mut self, out: &mut Vec<u8>, denial: &Denial, status: Status, pool: PoolId, close: bool) {
        let message = if status == Status::GatewayTimeout {
            match self.gov.pool(pool).retired {
                false => "No slot opened within the wait budget.",
                true => "The pool was removed from the configuration while this request waited.",
            }
        } else {
            match denial.reason {
                DenyReason::QueueFull => "The pool's wait queue is full.",
                DenyReason::Rate => "The pool's rate budget is spent for now.",
                DenyReason::Cooldown => "The pool is cooling down after the upstream asked to slow down.",
                DenyReason::Concurrency => "No free slot in this pool.",
                DenyReason::Recovering => "The pool is re-adopting the slots held before a restart.",
            }
        };
        self.write_denial_as(out, denial, status, denial_code(status), message, close);
    }

    fn write_denial_as(
        &mut self,
        out: &mut Vec<u8>,
        denial: &Denial,
        status: Status,
        code: &str,
        message: &str,
        close: bool,
    ) {
        self.scratch.clear();
        crate::http::response::error_body(&mut self.scratch, code, message);
        let mut w = Writer::start(out, status);
        write_signals(&mut w, &denial.signals, denial.queued_ms);
        w.header(b"x-nthpool-deny-reason", denial.reason.as_str().as_bytes());
        w.header_u64(b"Retry-After", denial.retry_after_ms.div_ceil(1000).max(1));
        w.finish_json(&self.scratch, close);
    }

    /// An error answer written by the reactor (framing errors, limits),
    /// before any pool is known.
    pub fn write_error(&mut self, out: &mut Vec<u8>, error: ApiError, close: bool) {
        self.write_error_of(None, out, error, close, b"");
    }

    /// An error answer about `pool`'s request (`None`: no pool known yet),
    /// with `headers` (whole lines: a granted exchange's governor headers).
    pub fn write_error_of(
        &mut self,
        pool: Option<PoolId>,
        out: &mut Vec<u8>,
        error: ApiError,
        close: bool,
        headers: &[u8],
    ) {
        self.rejections.count(self.counted_under(pool), error.status());
        error.write_with(out, &mut self.scratch, close, headers);
    }

    /// The pool an answer about `pool` counts under in
    /// `nthpool_rejections_total`: none for a pool a reload removed that has
    /// drained away, whose series `/metrics` no longer shows (it counts with
    /// the answers about pools that do not exist, rather than unseen).
    fn counted_under(&self, pool: Option<PoolId>) -> Option<PoolId> {
        pool.filter(|&pid| !self.gov.pool(pid).drained_away())
    }
}

/// The access-log record of an attempt: the one place a line's fields are filled.
pub(crate) fn record_of<'a>(pool: &'a str, client: IpAddr, line: &history::Attempt) -> Record<'a> {
    Record {
        epoch_ms: line.epoch_ms,
        pool,
        client,
        status: line.status,
        error: line.error,
        deny_reason: line.reason.map(DenyReason::as_str),
        wait_ms: line.wait_ms,
        queued_ms: line.queued_ms,
        server_us: line.server_us,
        slot_ref: line.slot_ref,
    }
}

/// What a lock route asks for, once its pool is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock<'h> {
    Acquire,
    Renew(&'h [u8]),
    Release(&'h [u8]),
}

impl<'h> Lock<'h> {
    fn of(route: Route<'h>) -> Lock<'h> {
        match route {
            Route::Acquire { .. } => Lock::Acquire,
            Route::Renew { slot, .. } => Lock::Renew(slot),
            Route::Release { slot, .. } => Lock::Release(slot),
        }
    }
}

/// The status an access-log line shows for a waiter that went away unanswered
/// (nginx's "client closed request"); never sent on the wire.
pub const CLIENT_GONE_STATUS: u16 = 499;

/// How an access-log line names an acquire whose client went away before
/// it was complete.
pub const UNANSWERED_CLIENT_GONE: (u16, &str) = (CLIENT_GONE_STATUS, "client_gone");
/// ... whose connection reached its deadline before it was complete.
pub const UNANSWERED_TIMEOUT: (u16, &str) = (408, "request_timeout");
/// ... still arriving when a stop's grace ended.
pub const UNANSWERED_STOPPED: (u16, &str) = (503, "unavailable");

/// The error code of a denied acquire: `504` when its wait ran out, else `429`.
fn denial_code(status: Status) -> &'static str {
    match status {
        Status::GatewayTimeout => "queue_timeout",
        _ => "too_many_requests",
    }
}

/// The path of the request line at the start of `input`, origin or absolute
/// form cut as the head parser cuts them (an absolute target refused for
/// its authority still names its route), if the line is there. A fragment
/// (`#…`, refused in a target) ends the path, as in any URI (RFC 3986 §3.5).
fn logged_path(input: &[u8]) -> Option<&[u8]> {
    let line = &input[..input.iter().position(|&b| b == b'\n').unwrap_or(input.len())];
    let target = line.split(|&b| b == b' ').nth(1)?;
    let target = target.split(|&b| b == b'#').next()?;
    crate::http::target::target_parts(target).ok().map(|(path, _)| path)
}

/// The credentials a pool's access policies ask for besides its key.
#[derive(Debug, Clone, Copy)]
pub struct CredentialsAsked {
    /// A JWT (`X-Nthpool-Jwt`, or `Authorization: Bearer`).
    pub jwt: bool,
    /// A Cloudflare Access token (`Cf-Access-Jwt-Assertion`).
    pub cloudflare: bool,
    /// An HMAC signature over the request (`X-Nthpool-Timestamp`, `-Nonce`, `-Signature`).
    pub hmac: bool,
}

/// The `404` of a path that is no lock route, named as closely as the path allows.
#[cold]
fn no_route(path: &[u8]) -> ApiError {
    if route::lacks_slot(path) {
        ApiError::NO_SLOT_ID
    } else {
        ApiError::NO_ROUTE
    }
}

const UNKNOWN_POOL: ApiError = ApiError::Unauthorized("A valid pool key is required (X-Nthpool-Key).");
/// A renew takes no body (SPEC §4: one that is present must be a JSON
/// object, and then says nothing); anything else is refused before the
/// lease is touched. The usual renew sends none and only tests for it.
#[inline(always)]
fn check_renew_body(body: &[u8]) -> Result<(), ApiError> {
    if !body.is_empty() && !is_blank(body) {
        check_object(body).map_err(ApiError::BadRequest)?;
        serde_json::from_slice::<serde::de::IgnoredAny>(body)
            .map_err(|_| ApiError::BadRequest("The renew body must be empty or a JSON object."))?;
    }
    Ok(())
}

const BAD_IDEMPOTENCY_KEY: ApiError =
    ApiError::BadRequest("Idempotency-Key must be 1 to 128 printable ASCII characters.");

/// The history and access-log entry of one answered acquire (its server
/// time is filled in when it is settled).
#[allow(clippy::too_many_arguments)]
fn acquire_line(
    attempt: &Attempt,
    epoch_now: EpochMs,
    status: Status,
    error: Option<&'static str>,
    reason: Option<DenyReason>,
    queued_ms: u64,
    slot_ref: Option<u32>,
) -> history::Attempt {
    history::Attempt {
        epoch_ms: epoch_now.0,
        status: status.code(),
        error,
        reason,
        wait_ms: attempt.wait_ms,
        queued_ms,
        server_us: 0,
        slot_ref,
    }
}

/// The answer to a queued acquire cut short by shutdown.
pub(crate) const SHUTTING_DOWN: ApiError =
    ApiError::Unavailable("The server is shutting down; retry against its replacement.", 1);

/// The history line of a queued acquire that ends without a governor answer
/// (its server time is filled in when it is settled).
fn queued_end_line(attempt: &Attempt, epoch_now: EpochMs, status: u16, code: &'static str) -> history::Attempt {
    history::Attempt {
        epoch_ms: epoch_now.0,
        status,
        error: Some(code),
        reason: None,
        wait_ms: attempt.wait_ms,
        // The attempt started in the turn its request arrived, so this is
        // the time spent queued (to the turn's precision).
        queued_ms: crate::time::millis(attempt.started.elapsed()),
        server_us: 0,
        slot_ref: None,
    }
}

/// The governor headers of every acquire answer. Each constant carries the
/// previous header's CRLF, so the block is one append per header.
fn write_signals(w: &mut Writer, s: &crate::governor::Signals, queued_ms: u64) {
    w.with_out(|out| governor_headers(out, s, queued_ms));
}

/// The governor header lines, each ending in CRLF; proxied responses carry them too.
pub fn governor_headers(out: &mut Vec<u8>, s: &crate::governor::Signals, queued_ms: u64) {
    out.extend_from_slice(REMAINING_SLOTS);
    push_u64(out, s.remaining_slots as u64);
    governor_headers_after_remaining(out, s, queued_ms);
}

/// The name that starts the governor header block.
pub(crate) const REMAINING_SLOTS: &[u8] = b"x-nthpool-remaining-slots: ";

/// A release's answer after its `Date` line: the same four texts every time.
fn released_rest(released: bool, close: bool) -> &'static [u8] {
    macro_rules! rest {
        ($body:literal, $len:literal, $connection:literal) => {
            concat!("Content-Type: application/json\r\nContent-Length: ", $len, "\r\n", $connection, "\r\n", $body)
                .as_bytes()
        };
    }
    match (released, close) {
        (true, false) => rest!("{\"released\":true}", 17, ""),
        (true, true) => rest!("{\"released\":true}", 17, "Connection: close\r\n"),
        (false, false) => rest!("{\"released\":false}", 18, ""),
        (false, true) => rest!("{\"released\":false}", 18, "Connection: close\r\n"),
    }
}

/// The governor header block after the remaining-slots number: the lines
/// that change rarely, which a grant answer caches (see `grant.rs`).
pub(crate) fn governor_headers_after_remaining(out: &mut Vec<u8>, s: &crate::governor::Signals, queued_ms: u64) {
    out.extend_from_slice(b"\r\nx-nthpool-effective-limit: ");
    push_u64(out, s.effective_limit as u64);
    out.extend_from_slice(b"\r\nx-nthpool-queued-ms: ");
    push_u64(out, queued_ms);
    out.extend_from_slice(b"\r\nx-nthpool-limit: ");
    push_u64(out, s.limit as u64);
    out.extend_from_slice(b"\r\nx-nthpool-queue-depth: ");
    push_u64(out, s.queue_depth as u64);
    if let Some(tokens) = s.rpm_remaining {
        out.extend_from_slice(b"\r\nx-nthpool-rpm-remaining: ");
        push_u64(out, tokens);
    }
    out.extend_from_slice(b"\r\n");
}

/// The name a `Host` value gives: without its port, an IPv6 literal without
/// its brackets, and a name without the dot that makes it absolute
/// (`api.example.com.` is `api.example.com`, RFC 1034 §3.1).
pub(crate) fn host_name(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        // An IPv6 literal: keep the brackets' content only.
        return match host.iter().position(|&b| b == b']') {
            Some(end) => &host[1..end],
            None => host,
        };
    }
    let name = match host.iter().rposition(|&b| b == b':') {
        Some(colon) => &host[..colon],
        None => host,
    };
    name.strip_suffix(b".").filter(|n| !n.is_empty()).unwrap_or(name)
}

/// The caller's wait budget: body `waitMs`, else `X-Nthpool-Queue-Timeout-Ms`;
/// `X-Nthpool-No-Queue` forces 0. Anything but a whole number of ms is
/// refused; a number too large to hold is as long as any (the governor
/// clamps every budget to the pool's queue timeout).
pub(crate) fn wait_budget(head: &Head, body: &[u8]) -> Result<u64, ApiError> {
    const BAD_WAIT: ApiError =
        ApiError::BadRequest("`waitMs` and X-Nthpool-Queue-Timeout-Ms must be whole milliseconds of at least 0.");
    let mut wait = None;
    if !is_blank(body) {
        check_object(body).map_err(ApiError::BadRequest)?;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct AcquireBody {
            #[serde(default)]
            wait_ms: Option<serde_json::Number>,
        }
        let parsed: AcquireBody = serde_json::from_slice(body).map_err(|e| {
            ApiError::BadRequest(if crate::report::is_duplicate_field(&e) {
                "The acquire body gives `waitMs` twice; send it once."
            } else {
                "The acquire body is not valid JSON with a numeric `waitMs`."
            })
        })?;
        if let Some(n) = parsed.wait_ms {
            // Past 64 bits it is surely past any queue timeout.
            wait = Some(crate::report::integral_or_huge(&n).ok_or(BAD_WAIT)?);
        }
    }
    if wait.is_none() {
        if let Some(value) = head.api.queue_timeout_ms() {
            // Only HTTP's white space (SP, HTAB) surrounds a value: any other
            // byte, a Unicode space included, makes it no number.
            let digits = crate::http::trim(value);
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(BAD_WAIT);
            }
            // Only digits: parsing fails only past u64::MAX.
            let text = std::str::from_utf8(digits).map_err(|_| BAD_WAIT)?;
            wait = Some(text.parse::<u64>().unwrap_or(u64::MAX));
        }
    }
    let wait = wait.unwrap_or(0);
    if head.api.no_queue() {
        return Ok(0);
    }
    Ok(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_status_has_its_series() {
        let pool = Some(PoolId(0));
        let mut r = Rejections::default();
        r.set_pools(1);
        let refusals: Vec<Status> = Status::ALL.into_iter().filter(|s| s.code() >= 400).collect();
        for &status in &refusals {
            r.count(pool, status);
            assert_eq!(r.get(pool, status.code()), 1, "{} has no series", status.code());
        }
        assert_eq!(Rejections::CODES.len(), refusals.len(), "a series for a status the server never sends");
    }

    #[test]
    fn host_port_and_the_absolute_names_dot_are_ignored() {
        assert_eq!(host_name(b"api.example.com:443"), b"api.example.com");
        assert_eq!(host_name(b"api.example.com"), b"api.example.com");
        assert_eq!(host_name(b"api.example.com."), b"api.example.com");
        assert_eq!(host_name(b"api.example.com.:443"), b"api.example.com");
        assert_eq!(host_name(b"[::1]:7070"), b"::1");
        assert_eq!(host_name(b"."), b".");
    }

    #[test]
    fn release_answers_are_framed_by_their_length() {
        for (released, close) in [(true, false), (true, true), (false, false), (false, true)] {
            let rest = std::str::from_utf8(released_rest(released, close)).unwrap();
            let (head, body) = rest.split_once("\r\n\r\n").unwrap();
            let len: usize =
                head.split("Content-Length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
            assert_eq!(len, body.len(), "{rest}");
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v, serde_json::json!({ "released": released }));
            assert_eq!(head.ends_with("\r\nConnection: close"), close, "{rest}");
            assert!(head.starts_with("Content-Type: application/json\r\n"), "{rest}");
        }
    }
}
