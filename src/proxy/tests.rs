//! The exchange state machine over real loopback sockets, driven step by
//! step without a server, for what the wire cannot stage on demand: the
//! upstream resetting a kept-alive connection after it was taken from the
//! idle pool (and found open) but before the request was written to it, or,
//! over TLS, while the request is still inside the session.

#[path = "../../tests/tls_support/mod.rs"]
mod tls_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::*;
use crate::http::request::BodyFraming;

const BASE: usize = 1000;
const POOL: PoolId = PoolId(0);
const REQUEST_HEAD: &[u8] = b"POST /charge HTTP/1.1\r\nHost: up\r\nContent-Length: 5\r\n\r\n";
const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
const WAIT: Duration = Duration::from_secs(10);

/// An upstream listener, the proxy's state and the poll its sockets are registered with.
struct Rig {
    poll: Poll,
    events: Events,
    listener: TcpListener,
    /// Where new connections go: the listener, or a TLS server.
    upstream: std::net::SocketAddr,
    target: Target,
    tls: Option<ClientTls>,
    proxy: Proxy,
}

/// One client's side of an exchange: what it sent that the exchange has not taken, what it got.
#[derive(Default)]
struct Client {
    input: Vec<u8>,
    output: Vec<u8>,
}

impl Rig {
    fn new() -> Rig {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let target =
            Target { tls: false, name: "127.0.0.1".into(), port, authority: format!("127.0.0.1:{port}").into() };
        let upstream = listener.local_addr().unwrap();
        let (poll, events) = (Poll::new().unwrap(), Events::with_capacity(16));
        Rig { poll, events, listener, upstream, target, tls: None, proxy: Proxy::default() }
    }

    /// New connections go to the TLS server at `addr`, whose certificate
    /// names `localhost` and is signed by the CA in `ca_file`.
    fn tls(addr: std::net::SocketAddr, ca_file: &std::path::Path) -> Rig {
        let mut rig = Rig::new();
        rig.upstream = addr;
        let authority = format!("localhost:{}", addr.port()).into();
        rig.target = Target { tls: true, name: "localhost".into(), port: addr.port(), authority };
        rig.tls = Some(ClientTls::new(Some(ca_file)).unwrap());
        rig
    }

    /// Opens an exchange for `POST /charge` with a 5-byte body and attaches
    /// it: to an idle connection when there is one, else to a new one.
    fn open(&mut self) -> usize {
        let (request, _) = request_relay(BodyFraming::Length(5), 1 << 20);
        let attempt =
            Attempt { pool: POOL, client: IpAddr::V4(Ipv4Addr::LOCALHOST), wait_ms: 0, started: Instant::now() };
        let new = NewExchange {
            client: (0, 0),
            pool: POOL,
            head_key: 0,
            attempt,
            request,
            client_side: ClientSide { http11: true, keep_alive: true, head_request: false },
            expect_continue: false,
        };
        let ex = self.proxy.open(new, REQUEST_HEAD.to_vec());
        if self.proxy.idle_total() > 0 {
            let attached = self.proxy.attach(ex, &self.target, self.tls.as_ref(), 0, self.poll.registry(), BASE);
            assert_eq!(attached, Attached::Yes);
        } else {
            // What `attach` does once the name is resolved.
            let dial = Dial::new(vec![self.upstream]);
            let security = security(&self.target, self.tls.as_ref(), 0).unwrap();
            let idx = self.proxy.connect(POOL, &self.target, dial, security, self.poll.registry(), BASE).unwrap();
            self.proxy.attach_to(ex, idx, false, None);
        }
        ex
    }

    fn pump(&mut self, ex: usize, client: &mut Client) -> Step {
        let mut io =
            ClientIo { input: &client.input, consumed: 0, output: &mut client.output, out_pos: 0, high_water: 1 << 20 };
        let step = self.proxy.pump(ex, &mut io, 0);
        let consumed = io.consumed;
        client.input.drain(..consumed);
        step
    }

    /// Pumps the exchange until it is no longer pending, giving `peer` its
    /// turn (reading what arrived, answering) between pumps.
    fn drive(&mut self, ex: usize, client: &mut Client, mut peer: impl FnMut() -> bool) -> Step {
        let until = Instant::now() + WAIT;
        loop {
            let step = self.pump(ex, client);
            if step != Step::Pending {
                return step;
            }
            assert!(Instant::now() < until, "the exchange is still pending");
            if !peer() {
                self.poll_upstreams(Duration::from_millis(20));
            }
        }
    }

    /// Polls, and hands each upstream connection its readiness, as the reactor does.
    fn poll_upstreams(&mut self, timeout: Duration) {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Err(e) if e.kind() == ErrorKind::Interrupted => return,
            polled => polled.unwrap(),
        }
        for e in self.events.iter() {
            if let Some(up) = e.token().0.checked_sub(BASE).and_then(|idx| self.proxy.ups.get_mut(idx)) {
                up.on_event(e.is_readable(), e.is_read_closed() || e.is_error());
            }
        }
    }

    /// Waits until the connection the exchange uses has seen its peer's reset.
    fn await_reset(&mut self, ex: usize) {
        let token = Token(BASE + self.proxy.exchanges[ex].up.unwrap());
        let until = Instant::now() + WAIT;
        loop {
            assert!(Instant::now() < until, "no reset arrived");
            self.poll_upstreams(Duration::from_millis(50));
            if self.events.iter().any(|e| e.token() == token && (e.is_error() || e.is_read_closed())) {
                return;
            }
        }
    }

    fn accept(&self) -> TcpStream {
        let (s, _) = self.listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        s
    }
}

/// Reads what is there (up to a short timeout) onto `got`; whether anything came.
fn read_some(s: &mut TcpStream, got: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    match s.read(&mut buf) {
        Ok(n) => {
            got.extend_from_slice(&buf[..n]);
            n > 0
        }
        // Interrupted: a stop and continue of this process cut the wait short.
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => false,
        Err(e) => panic!("upstream read: {e}"),
    }
}

/// Closes `s` with a reset rather than a FIN.
fn reset(s: TcpStream) {
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
    drop(s);
}

fn request() -> Vec<u8> {
    [REQUEST_HEAD, b"hello"].concat()
}

/// Relays the exchange to completion, the upstream `s` answering `OK` once
/// the whole request arrived; returns what the upstream got.
fn serve(rig: &mut Rig, ex: usize, client: &mut Client, s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let step = rig.drive(ex, client, || {
        let more = read_some(s, &mut got);
        if more && got.len() == request().len() {
            s.write_all(OK).unwrap();
        }
        more
    });
    assert_eq!(step, Step::Complete { close_client: false });
    got
}

/// Relays one exchange on a fresh connection and keeps that connection idle;
/// then opens a second exchange, which takes it from the idle pool, and has
/// the upstream reset it before the exchange is pumped. Returns the second
/// exchange with its client, whose body is still unread.
fn reused_then_reset(rig: &mut Rig) -> (usize, Client) {
    let first = rig.open();
    let mut s1 = rig.accept();
    let mut client = Client { input: b"hello".to_vec(), ..Client::default() };
    assert_eq!(serve(rig, first, &mut client, &mut s1), request());
    assert!(client.output.ends_with(b"ok"), "{:?}", String::from_utf8_lossy(&client.output));
    rig.proxy.finish(first, true, Keep { limit: 4, idle_ms: 60_000 }, 0, rig.poll.registry());
    assert_eq!(rig.proxy.idle_total(), 1);

    let second = rig.open();
    assert_eq!(rig.proxy.stats.upstream_reuses, 1, "the idle connection was found open and taken");
    reset(s1);
    rig.await_reset(second);
    (second, Client { input: b"hello".to_vec(), ..Client::default() })
}

#[test]
fn a_reused_connection_failing_before_the_request_is_written_is_retried_once_on_a_fresh_one() {
    let mut rig = Rig::new();
    let (ex, mut client) = reused_then_reset(&mut rig);
    assert_eq!(rig.pump(ex, &mut client), Step::Retry);
    assert!(client.input.is_empty(), "the body was taken into the request");
    rig.proxy.reattach(ex, None, 0, rig.poll.registry(), BASE).unwrap();
    assert_eq!(rig.proxy.stats.retries, 1);
    let fresh = rig.proxy.exchanges[ex].up.unwrap();
    assert!(!rig.proxy.ups[fresh].reused, "the fresh connection gets no retry of its own");

    let mut s2 = rig.accept();
    let got = serve(&mut rig, ex, &mut client, &mut s2);
    assert_eq!(got, request(), "the fresh connection carried the whole request, head and body, once");
    assert!(client.output.ends_with(b"ok"));
    assert_eq!((rig.proxy.stats.retries, rig.proxy.stats.upstream_connects), (1, 2));
}

#[test]
fn a_retried_request_whose_fresh_connection_fails_too_is_a_bad_gateway_not_a_second_retry() {
    let mut rig = Rig::new();
    let (ex, mut client) = reused_then_reset(&mut rig);
    assert_eq!(rig.pump(ex, &mut client), Step::Retry);
    rig.proxy.reattach(ex, None, 0, rig.poll.registry(), BASE).unwrap();
    // The upstream takes the fresh connection and resets it before a byte arrives.
    reset(rig.accept());
    rig.await_reset(ex);
    let step = rig.drive(ex, &mut client, || false);
    assert!(matches!(step, Step::BadGateway(_)), "{step:?}");
    assert_eq!(rig.proxy.stats.retries, 1);
    rig.listener.set_nonblocking(true).unwrap();
    let third = rig.listener.accept();
    assert!(matches!(&third, Err(e) if e.kind() == ErrorKind::WouldBlock), "no third connection: {third:?}");
}

#[test]
fn idle_connections_are_closed_oldest_first_once_their_idle_timeout_passed() {
    let mut rig = Rig::new();
    let (a, b) = (rig.open(), rig.open());
    let mut upstream = [rig.accept(), rig.accept()];
    let mut got = [Vec::new(), Vec::new()];
    let mut clients = [(); 2].map(|_| Client { input: b"hello".to_vec(), ..Client::default() });
    for (ex, client) in [a, b].into_iter().zip(&mut clients) {
        let step = rig.drive(ex, client, || {
            let mut more = false;
            for (s, got) in upstream.iter_mut().zip(&mut got) {
                let fresh = read_some(s, got);
                if fresh && got.len() == request().len() {
                    s.write_all(OK).unwrap();
                }
                more |= fresh;
            }
            more
        });
        assert_eq!(step, Step::Complete { close_client: false });
    }
    let keep = Keep { limit: 4, idle_ms: 100 };
    // Idle from 0 and from 30, each for 100 ms: one sweep, due at 100.
    assert_eq!(rig.proxy.finish(a, true, keep, 0, rig.poll.registry()).1, Some(100));
    assert_eq!(rig.proxy.finish(b, true, keep, 30, rig.poll.registry()).1, None, "the sweep at 100 comes first");
    assert_eq!(rig.proxy.close_expired(99, rig.poll.registry()), None, "a sweep is still due at 100");
    assert_eq!(rig.proxy.idle_total(), 2);
    assert_eq!(rig.proxy.close_expired(100, rig.poll.registry()), Some(130), "the next sweep is for the other");
    assert_eq!(rig.proxy.idle_total(), 1);
    assert_eq!(rig.proxy.close_expired(130, rig.poll.registry()), None, "nothing left to sweep");
    assert_eq!(rig.proxy.idle_total(), 0);
    // Both upstream sockets see the close.
    for s in &mut upstream {
        s.set_read_timeout(Some(WAIT)).unwrap();
        loop {
            match s.read(&mut [0u8; 16]) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                read => break assert_eq!(read.unwrap(), 0),
            }
        }
    }
}

#[test]
fn a_drained_upstream_socket_is_read_again_only_once_its_readiness_event_came() {
    let mut rig = Rig::new();
    let first = rig.open();
    let mut s = rig.accept();
    let mut client = Client { input: b"hello".to_vec(), ..Client::default() };
    serve(&mut rig, first, &mut client, &mut s);
    rig.proxy.finish(first, true, Keep { limit: 4, idle_ms: 60_000 }, 0, rig.poll.registry());

    // Taken from the idle pool (found drained), the request written at once.
    let second = rig.open();
    let mut client = Client { input: b"hello".to_vec(), ..Client::default() };
    assert_eq!(rig.pump(second, &mut client), Step::Pending);
    let (mut got, until) = (Vec::new(), Instant::now() + WAIT);
    while got.len() < request().len() {
        assert!(Instant::now() < until, "the request never arrived");
        read_some(&mut s, &mut got);
    }
    assert_eq!(got, request());
    s.write_all(OK).unwrap();
    let idx = rig.proxy.exchanges[second].up.unwrap();
    while rig.proxy.ups[idx].transport.tcp().peek(&mut [0u8; 1]).is_err() {
        assert!(Instant::now() < until, "the answer never reached the socket");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The answer is in the socket, but no event announced it: no read is made.
    assert_eq!(rig.pump(second, &mut client), Step::Pending);
    assert!(client.output.is_empty());
    // Its event comes, and the answer is relayed.
    assert_eq!(rig.drive(second, &mut client, || false), Step::Complete { close_client: false });
    assert!(client.output.ends_with(b"ok"));
}

/// A TLS upstream that answers one request on its first connection, then
/// reads nothing more and resets that connection once told to; on later
/// connections it answers one request. Records what each connection received.
struct ResettingUpstream {
    server: tls_support::TlsServer,
    reset_now: mpsc::Sender<()>,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl ResettingUpstream {
    fn start(leaf: &tls_support::Leaf) -> ResettingUpstream {
        let (reset_now, told) = mpsc::channel::<()>();
        let told = Mutex::new(told);
        let got = Arc::new(Mutex::new(Vec::new()));
        let (got2, count) = (got.clone(), AtomicUsize::new(0));
        let handler: tls_support::Handler = Arc::new(move |stream: &mut tls_support::TlsServerStream| {
            let first = count.fetch_add(1, Ordering::SeqCst) == 0;
            let mut request = vec![0u8; request().len()];
            stream.read_exact(&mut request).unwrap();
            got2.lock().unwrap().push(request);
            stream.write_all(OK).unwrap();
            stream.flush().unwrap();
            if first {
                told.lock().unwrap().recv_timeout(WAIT).unwrap();
                socket2::SockRef::from(&stream.sock).set_linger(Some(Duration::ZERO)).unwrap();
            }
        });
        ResettingUpstream { server: tls_support::TlsServer::start(leaf, handler), reset_now, got }
    }
}

#[test]
fn a_reused_tls_connection_failing_with_the_request_still_in_the_session_is_retried() {
    let ca = tls_support::Ca::new("retry test CA");
    let dir = std::env::temp_dir().join(format!("nthpool-tls-retry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let upstream = ResettingUpstream::start(&ca.leaf(&["localhost"]));
    let mut rig = Rig::tls(upstream.server.addr, &ca.write_pem(&dir));

    let first = rig.open();
    let mut client = Client { input: b"hello".to_vec(), ..Client::default() };
    assert_eq!(rig.drive(first, &mut client, || false), Step::Complete { close_client: false });
    rig.proxy.finish(first, true, Keep { limit: 4, idle_ms: 60_000 }, 0, rig.poll.registry());

    let second = rig.open();
    assert_eq!(rig.proxy.stats.upstream_reuses, 1, "the idle connection was found open and taken");
    // The socket is made to take nothing more (the upstream no longer reads),
    // so the session accepts the request but cannot send a byte of it.
    let idx = rig.proxy.exchanges[second].up.unwrap();
    let tcp = rig.proxy.ups[idx].transport.tcp();
    socket2::SockRef::from(&*tcp).set_send_buffer_size(4096).unwrap();
    let until = Instant::now() + WAIT;
    while tcp.write(&[0u8; 64 * 1024]).is_ok() {
        assert!(Instant::now() < until, "the socket never filled");
    }
    let mut client = Client { input: b"hello".to_vec(), ..Client::default() };
    assert_eq!(rig.pump(second, &mut client), Step::Pending);
    assert!(client.input.is_empty(), "the body went into the session with the head");
    upstream.reset_now.send(()).unwrap();
    rig.await_reset(second);
    assert_eq!(rig.drive(second, &mut client, || false), Step::Retry);

    rig.proxy.reattach(second, rig.tls.as_ref(), 0, rig.poll.registry(), BASE).unwrap();
    assert_eq!(rig.drive(second, &mut client, || false), Step::Complete { close_client: false });
    assert!(client.output.ends_with(b"ok"));
    assert_eq!(
        *upstream.got.lock().unwrap(),
        vec![request(), request()],
        "the fresh connection carried the whole request once"
    );
    assert_eq!(rig.proxy.stats.retries, 1);
    let _ = std::fs::remove_dir_all(&dir);
}
