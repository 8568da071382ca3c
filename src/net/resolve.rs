//! Host-name resolution that never blocks the event loop.
//!
//! The system resolver (`getaddrinfo`), or the name servers the
//! configuration names (`net::nameserver`), are asked by blocking calls, so
//! lookups run on one resolver thread beside the event loop (the periodic
//! snapshot's writer is the only other thread there can be). The loop owns a
//! [`Resolver`]; asking it for a name answers at once from its cache, or sends
//! the name to the thread and answers [`Lookup::Pending`]. When the thread has
//! an answer it queues it and wakes the loop through a `mio::Waker`; the loop
//! then calls [`Resolver::take_answers`], which files the answers in the cache
//! and tells which names are now ready, so connections waiting on them go on.
//!
//! The cache keeps an answer for its TTL: the DNS answer's, held between
//! `min_ttl_ms` and `max_ttl_ms`, or `ttl_ms` when the lookup reports none
//! (`getaddrinfo` does not). Past that the old addresses are still served, and a
//! refresh is sent to the thread in the background, until `max_stale_ms`:
//! beyond it a caller waits for a fresh answer. A failed refresh keeps the
//! old addresses until then. A name that does not resolve is remembered as
//! such for `negative_ttl_ms`, so a burst of requests makes one lookup.
//!
//! Lookups are one at a time, in the order asked, each name at most once in
//! flight. The thread starts with the first lookup it has to make: a server
//! whose upstreams are IP literals, or that serves the lock API only, stays
//! one thread, and the C library then skips the cancellation bookkeeping it
//! wraps around every socket call of a multi-threaded process (about 100 to
//! 180 instructions per request, docs/performance-history.md). The thread ends when the
//! `Resolver` is dropped and it has finished its current lookup; it is not
//! joined, so a stuck lookup cannot hold up a shutdown.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use mio::net::TcpStream;

pub use super::nameserver::{Found, Nameservers};
use crate::time::Ms;

/// How long an answer without a TTL is used before it is refreshed in the background.
pub const DEFAULT_TTL_MS: Ms = 30_000;
/// The shortest and the longest a DNS answer's TTL is taken to be.
pub const DEFAULT_MIN_TTL_MS: Ms = 1_000;
pub const DEFAULT_MAX_TTL_MS: Ms = 300_000;
/// How long past its TTL an answer may still be used while a refresh runs.
pub const DEFAULT_MAX_STALE_MS: Ms = 300_000;
/// How long a name that did not resolve is answered as such without asking again.
pub const DEFAULT_NEGATIVE_TTL_MS: Ms = 1_000;

/// Longest host name accepted (RFC 1035: 253 characters in text form).
pub const MAX_HOST_LEN: usize = 253;

/// The blocking lookup the thread runs: a host name to its addresses, in the
/// order the system prefers, with their TTL when known. Replaceable so tests
/// can be slow or fail at will.
pub type LookupFn = dyn Fn(&str) -> io::Result<Found> + Send + Sync;

/// Why a name has no addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// The resolver answered, with an error or with no address.
    NotFound { host: String, why: String },
    /// No nameserver answered in time: the name may well exist.
    Unanswered { host: String, why: String },
    /// The name is longer than [`MAX_HOST_LEN`] or empty.
    InvalidName(String),
    /// The resolver thread is gone (it panicked); no lookup can be made.
    ResolverGone,
}

impl ResolveError {
    /// One sentence for the client that got `502 bad_gateway` because of it.
    pub fn sentence(&self) -> &'static str {
        match self {
            ResolveError::NotFound { .. } | ResolveError::InvalidName(_) => {
                "The upstream's host name does not resolve."
            }
            ResolveError::Unanswered { .. } => "The upstream's host name could not be resolved in time.",
            ResolveError::ResolverGone => "The upstream's host name cannot be resolved: the resolver has stopped.",
        }
    }
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::NotFound { host, why } => {
                write!(f, "the upstream host name {host} does not resolve: {why}")
            }
            ResolveError::Unanswered { host, why } => {
                write!(f, "the upstream host name {host} could not be resolved in time: {why}")
            }
            ResolveError::InvalidName(host) => {
                write!(f, "{host:?} is not a host name that can be resolved")
            }
            ResolveError::ResolverGone => f.write_str("the resolver thread has stopped"),
        }
    }
}

impl std::error::Error for ResolveError {}

/// What the cache can say about a name right now.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Addresses to try, in order.
    Ready(&'a [SocketAddr]),
    /// A lookup is under way; the name comes back from `take_answers`.
    Pending,
    /// The name does not resolve.
    Failed(&'a ResolveError),
}

/// Timing of the cache, all in milliseconds of the caller's clock.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    /// For answers that carry no TTL.
    pub ttl_ms: Ms,
    pub min_ttl_ms: Ms,
    pub max_ttl_ms: Ms,
    pub max_stale_ms: Ms,
    pub negative_ttl_ms: Ms,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            ttl_ms: DEFAULT_TTL_MS,
            min_ttl_ms: DEFAULT_MIN_TTL_MS,
            max_ttl_ms: DEFAULT_MAX_TTL_MS,
            max_stale_ms: DEFAULT_MAX_STALE_MS,
            negative_ttl_ms: DEFAULT_NEGATIVE_TTL_MS,
        }
    }
}

impl CachePolicy {
    /// How long an answer with `ttl_s` (DNS seconds) is fresh.
    fn ttl(&self, ttl_s: Option<u32>) -> Ms {
        match ttl_s {
            Some(s) => (Ms::from(s) * 1_000).clamp(self.min_ttl_ms, self.max_ttl_ms),
            None => self.ttl_ms,
        }
    }
}

struct Entry {
    /// The last good answer (port 0) and until when it is fresh.
    addrs: Vec<SocketAddr>,
    fresh_until: Option<Ms>,
    /// The last failure and when it came, if the last answer was one.
    failure: Option<(ResolveError, Ms)>,
    in_flight: bool,
}

struct Answer {
    host: String,
    result: io::Result<Found>,
}

/// What the loop sends the thread.
enum Job {
    Lookup(String),
    /// Ask this from now on (a reload changed `resolver.nameservers`).
    Use(Arc<LookupFn>),
}

/// The loop's side of the resolver: the cache and the thread.
pub struct Resolver {
    thread: Thread,
    cache: HashMap<String, Entry>,
    policy: CachePolicy,
    gone: ResolveError,
}

/// The lookup thread, started by the first lookup sent to it.
enum Thread {
    NotStarted {
        waker: Arc<mio::Waker>,
        lookup: Arc<LookupFn>,
    },
    Running {
        jobs: Sender<Job>,
        answers: Receiver<Answer>,
    },
    /// It could not be started; every lookup fails as if it were gone.
    Failed,
}

impl Thread {
    /// Hands `job` to the thread, starting it first if need be; false when
    /// the thread is gone or cannot be started.
    fn send(&mut self, job: Job) -> bool {
        if let Thread::NotStarted { waker, lookup } = self {
            *self = match start(waker.clone(), lookup.clone()) {
                Ok(running) => running,
                Err(e) => {
                    log::error!("cannot start the resolver thread: {e}");
                    Thread::Failed
                }
            };
        }
        match self {
            Thread::Running { jobs, .. } => jobs.send(job).is_ok(),
            Thread::NotStarted { .. } | Thread::Failed => false,
        }
    }
}

/// Starts the lookup thread: it asks `lookup` for each name sent to it,
/// queues the answer and wakes the loop through `waker`.
fn start(waker: Arc<mio::Waker>, lookup: Arc<LookupFn>) -> io::Result<Thread> {
    let (jobs, job_rx) = mpsc::channel::<Job>();
    let (answer_tx, answers) = mpsc::channel::<Answer>();
    std::thread::Builder::new().name("nthpool-resolve".into()).spawn(move || {
        let mut lookup = lookup;
        for job in job_rx {
            let host = match job {
                Job::Lookup(host) => host,
                Job::Use(other) => {
                    lookup = other;
                    continue;
                }
            };
            let result = lookup(&host);
            if answer_tx.send(Answer { host, result }).is_err() {
                return;
            }
            if let Err(e) = waker.wake() {
                log::warn!("resolver could not wake the event loop: {e}");
            }
        }
    })?;
    Ok(Thread::Running { jobs, answers })
}

impl Resolver {
    /// A resolver that asks `nameservers` when given, else the system's
    /// resolver. `waker` is woken each time an answer is queued. Its thread
    /// starts with the first lookup.
    pub fn new(waker: Arc<mio::Waker>, policy: CachePolicy, nameservers: Option<Nameservers>) -> Resolver {
        Self::with_lookup(waker, policy, lookup_with(nameservers))
    }

    /// A reload: `policy` for answers filed from now on, `nameservers` (or
    /// the system's resolver) for the lookups after the one under way.
    /// Answers in the cache are kept until their TTL.
    pub fn reconfigure(&mut self, policy: CachePolicy, nameservers: Option<Nameservers>) {
        self.policy = policy;
        let next = lookup_with(nameservers);
        match &mut self.thread {
            Thread::NotStarted { lookup, .. } => *lookup = next,
            // A thread that is gone is reported by the next lookup.
            Thread::Running { jobs, .. } => {
                let _ = jobs.send(Job::Use(next));
            }
            Thread::Failed => {}
        }
    }

    /// A resolver that runs `lookup` in place of the system's.
    pub fn with_lookup(waker: Arc<mio::Waker>, policy: CachePolicy, lookup: Arc<LookupFn>) -> Resolver {
        Resolver {
            thread: Thread::NotStarted { waker, lookup },
            cache: HashMap::new(),
            policy,
            gone: ResolveError::ResolverGone,
        }
    }

    /// Whether the lookup thread runs (it starts with the first lookup).
    #[cfg(test)]
    pub fn started(&self) -> bool {
        matches!(self.thread, Thread::Running { .. })
    }

    /// The addresses of `host` as far as known at `now`, never waiting. IP
    /// literals are answered without a lookup. Addresses carry port 0; see
    /// [`with_port`].
    pub fn lookup(&mut self, host: &str, now: Ms) -> Lookup<'_> {
        if host.is_empty() || host.len() > MAX_HOST_LEN {
            // Filed like an answer, so it can be lent out; names come from
            // the configuration, so their number is bounded.
            let entry = self.cache.entry(host.to_owned()).or_insert_with(|| Entry {
                addrs: Vec::new(),
                fresh_until: None,
                failure: Some((ResolveError::InvalidName(host.to_owned()), u64::MAX)),
                in_flight: false,
            });
            return Lookup::Failed(&entry.failure.as_ref().expect("set above").0);
        }
        let policy = self.policy;
        if !self.cache.contains_key(host) {
            let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
            let entry = Entry {
                addrs: literal.map(|ip| vec![SocketAddr::new(ip, 0)]).unwrap_or_default(),
                fresh_until: literal.map(|_| u64::MAX),
                failure: None,
                in_flight: false,
            };
            self.cache.insert(host.to_owned(), entry);
        }
        let entry = self.cache.get_mut(host).expect("inserted above");
        let usable_until = entry.fresh_until.map(|t| t.saturating_add(policy.max_stale_ms));
        let needs_refresh = entry.fresh_until.is_none_or(|t| now >= t);
        let failure_current =
            entry.failure.as_ref().is_some_and(|(_, at)| now < at.saturating_add(policy.negative_ttl_ms));
        if needs_refresh && !entry.in_flight && !failure_current {
            if !self.thread.send(Job::Lookup(host.to_owned())) {
                return Lookup::Failed(&self.gone);
            }
            entry.in_flight = true;
        }
        if usable_until.is_some_and(|t| now < t) {
            return Lookup::Ready(&entry.addrs);
        }
        match &entry.failure {
            Some((err, _)) if failure_current || !entry.in_flight => Lookup::Failed(err),
            _ => Lookup::Pending,
        }
    }

    /// Files every answer the thread has queued, at `now`, and calls
    /// `ready` with each name answered (resolved or not), so the caller can
    /// go on with the connections that waited for it.
    pub fn take_answers(&mut self, now: Ms, mut ready: impl FnMut(&str)) {
        let Thread::Running { answers, .. } = &self.thread else {
            return;
        };
        while let Ok(Answer { host, result }) = answers.try_recv() {
            let Some(entry) = self.cache.get_mut(&host) else {
                continue;
            };
            entry.in_flight = false;
            match result {
                Ok(found) if !found.ips.is_empty() => {
                    entry.addrs.clear();
                    entry.addrs.extend(found.ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
                    entry.fresh_until = Some(now.saturating_add(self.policy.ttl(found.ttl_s)));
                    entry.failure = None;
                }
                Ok(_) => {
                    let why = "no address".to_owned();
                    entry.failure = Some((ResolveError::NotFound { host: host.clone(), why }, now));
                }
                Err(e) => {
                    let (host, why) = (host.clone(), e.to_string());
                    let failure = match e.kind() {
                        io::ErrorKind::TimedOut => ResolveError::Unanswered { host, why },
                        _ => ResolveError::NotFound { host, why },
                    };
                    entry.failure = Some((failure, now));
                }
            }
            ready(&host);
        }
    }
}

/// The lookup the thread runs: `nameservers` asked, or the system's resolver.
fn lookup_with(nameservers: Option<Nameservers>) -> Arc<LookupFn> {
    match nameservers {
        Some(ns) => Arc::new(move |host: &str| ns.lookup(host)),
        None => Arc::new(system_lookup),
    }
}

/// The system resolver, as the thread runs it.
fn system_lookup(host: &str) -> io::Result<Found> {
    let ips = (host, 0u16).to_socket_addrs()?.map(|a| a.ip()).collect();
    Ok(Found { ips, ttl_s: None })
}

/// `addrs` with their port set to `port`.
pub fn with_port(addrs: &[SocketAddr], port: u16) -> Vec<SocketAddr> {
    addrs.iter().map(|a| SocketAddr::new(a.ip(), port)).collect()
}

/// Connecting to a host's addresses one after the other: the next one is
/// tried when the current one fails, in the order the resolver gave them.
#[derive(Debug)]
pub struct Dial {
    addrs: Vec<SocketAddr>,
    next: usize,
    last_error: Option<io::Error>,
}

/// The most of a request that may wait unsent in the kernel's send buffer
/// of an upstream connection: what the proxy holds of a client's body (64 KiB).
pub const UPSTREAM_UNSENT_MAX: u32 = 64 * 1024;

/// Keeps at most `UPSTREAM_UNSENT_MAX` bytes unsent in the socket's send
/// buffer (`TCP_NOTSENT_LOWAT`), so the socket turns writable as the
/// upstream reads, not once the megabytes the kernel lets the buffer grow
/// to have drained. The proxy restarts `timeoutMs` on each piece of a body
/// it passes on: an upstream that reads a large upload steadily, but slowly,
/// is then seen to make progress, and one that stops is told apart. Bytes
/// sent and not yet acknowledged are not limited, so throughput is not.
fn limit_unsent(stream: &TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_notsent_lowat(UPSTREAM_UNSENT_MAX) {
        log::debug!("TCP_NOTSENT_LOWAT not set on an upstream connection: {e}");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = stream;
}

impl Dial {
    pub fn new(addrs: Vec<SocketAddr>) -> Dial {
        Dial { addrs, next: 0, last_error: None }
    }

    /// Starts a non-blocking connect to the next address not yet tried;
    /// addresses that fail at once are passed over. The error, when none is
    /// left, names the last failure.
    pub fn start_next(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        while let Some(&addr) = self.addrs.get(self.next) {
            self.next += 1;
            match TcpStream::connect(addr) {
                Ok(stream) => {
                    limit_unsent(&stream);
                    return Ok((stream, addr));
                }
                Err(e) if out_of_descriptors(&e) => {
                    // No fault of the address: it is tried again next.
                    self.next -= 1;
                    return Err(e);
                }
                Err(e) => self.failed(addr, e),
            }
        }
        Err(self.exhausted())
    }

    /// Whether an address is left to try.
    pub fn has_next(&self) -> bool {
        self.next < self.addrs.len()
    }

    /// Records that the connect to `addr` failed with `err` (seen on its
    /// writable event); the next `start_next` goes on with the next address.
    pub fn failed(&mut self, addr: SocketAddr, err: io::Error) {
        log::debug!("connect to {addr} failed: {err}");
        self.last_error = Some(err);
    }

    /// Whether a connect started by `start_next` has completed, asked on
    /// its writable event: `Ok(false)` while it is still in progress, the
    /// error when it failed.
    pub fn check(stream: &TcpStream) -> io::Result<bool> {
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
        match stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn exhausted(&mut self) -> io::Error {
        let tried = self.addrs.len();
        match self.last_error.take() {
            Some(e) => {
                io::Error::new(e.kind(), format!("all {tried} addresses refused the connection, the last with: {e}"))
            }
            None => io::Error::new(io::ErrorKind::NotFound, "no address to connect to"),
        }
    }
}

/// The process or the system is out of file descriptors (`EMFILE`,
/// `ENFILE`): a socket could not even be made, and closing one lets it be.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    matches!(e.raw_os_error(), Some(ENFILE | EMFILE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll, Token};
    use std::net::Ipv4Addr;
    use std::sync::Mutex;
    use std::time::Duration;

    const WAKE: Token = Token(0);

    /// A lookup that answers from a table and counts its calls.
    fn table(answers: &'static [(&'static str, &'static [[u8; 4]])]) -> (Arc<LookupFn>, Arc<Mutex<Vec<String>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        let lookup = move |host: &str| {
            seen.lock().unwrap().push(host.to_owned());
            match answers.iter().find(|(h, _)| *h == host) {
                Some((_, ips)) => Ok(found(ips.iter().map(|ip| IpAddr::from(*ip)).collect())),
                None => Err(io::Error::new(io::ErrorKind::NotFound, "unknown host")),
            }
        };
        (Arc::new(lookup), calls)
    }

    fn found(ips: Vec<IpAddr>) -> Found {
        Found { ips, ttl_s: None }
    }

    fn policy() -> CachePolicy {
        CachePolicy { ttl_ms: 1_000, min_ttl_ms: 2_000, max_ttl_ms: 60_000, max_stale_ms: 10_000, negative_ttl_ms: 500 }
    }

    struct Loop {
        poll: Poll,
        events: Events,
        resolver: Resolver,
    }

    impl Loop {
        fn new(lookup: Arc<LookupFn>) -> Loop {
            let poll = Poll::new().unwrap();
            let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE).unwrap());
            let resolver = Resolver::with_lookup(waker, policy(), lookup);
            Loop { poll, events: Events::with_capacity(8), resolver }
        }

        /// Polls until the waker fires and returns the names answered.
        fn wait_answers(&mut self, now: Ms) -> Vec<String> {
            let mut names = Vec::new();
            for _ in 0..100 {
                // A stop and continue of this process ends a wait with EINTR.
                if let Err(e) = self.poll.poll(&mut self.events, Some(Duration::from_millis(100))) {
                    assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
                }
                self.resolver.take_answers(now, |h| names.push(h.to_owned()));
                if !names.is_empty() {
                    return names;
                }
            }
            panic!("no answer from the resolver thread within 10 s");
        }
    }

    fn v4(a: [u8; 4]) -> SocketAddr {
        SocketAddr::new(IpAddr::from(a), 0)
    }

    #[test]
    fn a_name_is_pending_then_ready_through_the_waker() {
        let (lookup, calls) = table(&[("api.test", &[[10, 0, 0, 1], [10, 0, 0, 2]])]);
        let mut l = Loop::new(lookup);
        assert!(!l.resolver.started(), "no thread before the first lookup");
        assert_eq!(l.resolver.lookup("api.test", 0), Lookup::Pending);
        assert!(l.resolver.started());
        assert_eq!(l.wait_answers(5), vec!["api.test".to_owned()]);
        assert_eq!(l.resolver.lookup("api.test", 6), Lookup::Ready(&[v4([10, 0, 0, 1]), v4([10, 0, 0, 2])]));
        assert_eq!(calls.lock().unwrap().len(), 1);
    }

    #[test]
    fn ip_literals_need_no_lookup() {
        let (lookup, calls) = table(&[]);
        let mut l = Loop::new(lookup);
        let v6 = SocketAddr::new(IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 0);
        assert_eq!(l.resolver.lookup("127.0.0.1", 0), Lookup::Ready(&[v4([127, 0, 0, 1])]));
        assert_eq!(l.resolver.lookup("[::1]", u64::MAX / 2), Lookup::Ready(&[v6]));
        assert!(calls.lock().unwrap().is_empty());
        assert!(!l.resolver.started(), "literals start no thread");
    }

    /// A nameserver that did not answer in time says nothing of the name:
    /// the client is not told it does not resolve.
    #[test]
    fn a_lookup_no_nameserver_answered_in_time_is_told_apart() {
        let lookup =
            |_: &str| -> io::Result<Found> { Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")) };
        let mut l = Loop::new(Arc::new(lookup));
        assert_eq!(l.resolver.lookup("slow.test", 0), Lookup::Pending);
        l.wait_answers(10);
        match l.resolver.lookup("slow.test", 20) {
            Lookup::Failed(err) => {
                assert_eq!(err.sentence(), "The upstream's host name could not be resolved in time.");
                let text = err.to_string();
                assert!(text.contains("slow.test") && text.contains("no answer in time"), "{text}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_name_that_does_not_resolve_says_so_and_is_not_asked_again_at_once() {
        let (lookup, calls) = table(&[]);
        let mut l = Loop::new(lookup);
        assert_eq!(l.resolver.lookup("nowhere.test", 0), Lookup::Pending);
        l.wait_answers(10);
        match l.resolver.lookup("nowhere.test", 20) {
            Lookup::Failed(err) => {
                let text = err.to_string();
                assert!(text.contains("nowhere.test") && text.contains("does not resolve"), "{text}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        // Within the negative TTL: answered from the cache.
        assert!(matches!(l.resolver.lookup("nowhere.test", 400), Lookup::Failed(_)));
        assert_eq!(calls.lock().unwrap().len(), 1);
        // After it: asked again.
        assert_eq!(l.resolver.lookup("nowhere.test", 600), Lookup::Pending);
        l.wait_answers(610);
        assert_eq!(calls.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_stale_answer_is_served_while_it_is_refreshed_in_the_background() {
        let (lookup, calls) = table(&[("api.test", &[[10, 0, 0, 1]])]);
        let mut l = Loop::new(lookup);
        assert_eq!(l.resolver.lookup("api.test", 0), Lookup::Pending);
        l.wait_answers(0);
        // Fresh: no new lookup.
        assert!(matches!(l.resolver.lookup("api.test", 999), Lookup::Ready(_)));
        assert_eq!(calls.lock().unwrap().len(), 1);
        // Past the TTL: still answered at once, and a refresh goes out once.
        assert!(matches!(l.resolver.lookup("api.test", 1_500), Lookup::Ready(_)));
        assert!(matches!(l.resolver.lookup("api.test", 1_600), Lookup::Ready(_)));
        l.wait_answers(1_700);
        assert_eq!(calls.lock().unwrap().len(), 2);
        // The refresh restarted the TTL.
        assert!(matches!(l.resolver.lookup("api.test", 2_600), Lookup::Ready(_)));
        assert_eq!(calls.lock().unwrap().len(), 2);
        // Past TTL + max stale: the caller waits for a fresh answer.
        assert_eq!(l.resolver.lookup("api.test", 20_000), Lookup::Pending);
    }

    #[test]
    fn a_dns_ttl_is_honoured_within_its_bounds() {
        let ttl = Arc::new(Mutex::new(5u32));
        let answer = ttl.clone();
        let lookup =
            move |_: &str| Ok(Found { ips: vec![IpAddr::from([10, 0, 0, 1])], ttl_s: Some(*answer.lock().unwrap()) });
        let mut l = Loop::new(Arc::new(lookup));
        // 5 s: fresh until 5 000, then refreshed.
        assert_eq!(l.resolver.lookup("api.test", 0), Lookup::Pending);
        l.wait_answers(0);
        assert!(matches!(l.resolver.lookup("api.test", 4_999), Lookup::Ready(_)));
        assert_eq!(l.resolver.cache["api.test"].fresh_until, Some(5_000));
        // 0 s is held at the 2 s minimum, a day at the 60 s maximum.
        *ttl.lock().unwrap() = 0;
        assert!(matches!(l.resolver.lookup("api.test", 5_000), Lookup::Ready(_)));
        l.wait_answers(5_000);
        assert_eq!(l.resolver.cache["api.test"].fresh_until, Some(7_000));
        *ttl.lock().unwrap() = 86_400;
        assert!(matches!(l.resolver.lookup("api.test", 7_000), Lookup::Ready(_)));
        l.wait_answers(7_000);
        assert_eq!(l.resolver.cache["api.test"].fresh_until, Some(67_000));
    }

    #[test]
    fn a_failed_refresh_keeps_the_old_addresses_until_max_stale() {
        let fail = Arc::new(Mutex::new(false));
        let failing = fail.clone();
        let lookup = move |_: &str| {
            if *failing.lock().unwrap() {
                Err(io::Error::other("server failure"))
            } else {
                Ok(found(vec![IpAddr::from([10, 0, 0, 1])]))
            }
        };
        let mut l = Loop::new(Arc::new(lookup));
        assert_eq!(l.resolver.lookup("api.test", 0), Lookup::Pending);
        l.wait_answers(0);
        *fail.lock().unwrap() = true;
        assert!(matches!(l.resolver.lookup("api.test", 2_000), Lookup::Ready(_)));
        l.wait_answers(2_000);
        assert_eq!(l.resolver.lookup("api.test", 2_100), Lookup::Ready(&[v4([10, 0, 0, 1])]));
        // Past TTL + max stale: no more old addresses; the next answer decides.
        assert_eq!(l.resolver.lookup("api.test", 11_500), Lookup::Pending);
        l.wait_answers(11_600);
        assert!(matches!(l.resolver.lookup("api.test", 11_700), Lookup::Failed(_)));
    }

    #[test]
    fn a_slow_lookup_does_not_block_the_caller() {
        // The lookup of slow.test blocks until the test lets it go: were
        // `lookup` to wait for it, this test would never get past it.
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let lookup = move |host: &str| {
            if host == "slow.test" {
                gate.lock().unwrap().recv().unwrap();
            }
            Ok(found(vec![IpAddr::from(Ipv4Addr::new(10, 0, 0, 9))]))
        };
        let mut l = Loop::new(Arc::new(lookup));
        assert_eq!(l.resolver.lookup("slow.test", 0), Lookup::Pending);
        assert_eq!(l.resolver.lookup("slow.test", 1), Lookup::Pending);
        // Another name, an IP literal, is answered while the lookup hangs.
        assert!(matches!(l.resolver.lookup("10.1.1.1", 2), Lookup::Ready(_)));
        let mut names = Vec::new();
        l.resolver.take_answers(3, |h| names.push(h.to_owned()));
        assert!(names.is_empty());
        release.send(()).unwrap();
        assert_eq!(l.wait_answers(4), vec!["slow.test".to_owned()]);
        assert_eq!(l.resolver.lookup("slow.test", 5), Lookup::Ready(&[v4([10, 0, 0, 9])]));
    }

    #[test]
    fn an_overlong_name_is_refused_without_a_lookup() {
        let (lookup, calls) = table(&[]);
        let mut l = Loop::new(lookup);
        let long = "a".repeat(MAX_HOST_LEN + 1);
        assert!(matches!(l.resolver.lookup(&long, 0), Lookup::Failed(ResolveError::InvalidName(_))));
        assert!(calls.lock().unwrap().is_empty());
    }

    #[test]
    fn localhost_resolves_through_the_system_resolver() {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE).unwrap());
        let resolver = Resolver::new(waker, policy(), None);
        let mut l = Loop { poll, events: Events::with_capacity(8), resolver };
        assert_eq!(l.resolver.lookup("localhost", 0), Lookup::Pending);
        l.wait_answers(0);
        match l.resolver.lookup("localhost", 1) {
            Lookup::Ready(addrs) => assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}"),
            other => panic!("localhost did not resolve: {other:?}"),
        }
    }

    #[test]
    fn dial_tries_every_address_in_order_until_one_accepts() {
        // Two ports with nothing listening (bound then dropped), then a listener.
        let closed: Vec<SocketAddr> =
            (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()).collect();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap();
        let mut dial = Dial::new(vec![closed[0], closed[1], open]);
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let mut tried = Vec::new();
        let connected = 'outer: loop {
            let (mut stream, addr) = dial.start_next().expect("an address is left");
            tried.push(addr);
            poll.registry().register(&mut stream, Token(1), mio::Interest::WRITABLE).unwrap();
            for _ in 0..100 {
                // A stop and continue of this process ends a wait with EINTR.
                if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(100))) {
                    assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
                }
                match Dial::check(&stream) {
                    Ok(true) => break 'outer addr,
                    Ok(false) => continue,
                    Err(e) => {
                        dial.failed(addr, e);
                        poll.registry().deregister(&mut stream).unwrap();
                        continue 'outer;
                    }
                }
            }
            panic!("connect to {addr} neither failed nor succeeded in 10 s");
        };
        assert_eq!(connected, open);
        assert_eq!(tried, vec![closed[0], closed[1], open]);
        listener.accept().unwrap();
    }

    #[test]
    fn dial_names_the_last_failure_when_every_address_refuses() {
        let mut dial = Dial::new(Vec::new());
        let err = dial.start_next().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let addr = v4([127, 0, 0, 1]);
        dial.failed(addr, io::Error::from(io::ErrorKind::ConnectionRefused));
        let err = dial.start_next().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        assert!(err.to_string().contains("all 0 addresses"), "{err}");
    }
}
