//! The non-blocking TLS client stream against a real rustls server on
//! loopback, with certificates made for each test.

mod common;
mod tls_support;

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::scratch_dir;
use mio::{Events, Interest, Poll, Token};
use nthpool::net::tls::{ClientTls, TlsConfigError, TlsError, TlsStream};
use tls_support::{echo, Ca, TlsServer};

const CONN: Token = Token(1);

/// Client settings trusting `ca` (and the bundled roots).
fn client_for(ca: &Ca) -> ClientTls {
    let dir = scratch_dir();
    ClientTls::new(Some(&ca.write_pem(&dir))).unwrap()
}

/// A client session driven by its own poll, as the reactor would drive it.
struct Client {
    poll: Poll,
    events: Events,
    stream: TlsStream,
}

impl Client {
    fn connect(tls: &ClientTls, addr: SocketAddr, host: &str) -> Client {
        let tcp = mio::net::TcpStream::connect(addr).unwrap();
        let mut stream = tls.connect(tcp, host, u64::MAX).unwrap();
        let poll = Poll::new().unwrap();
        poll.registry().register(stream.tcp(), CONN, Interest::READABLE | Interest::WRITABLE).unwrap();
        Client { poll, events: Events::with_capacity(8), stream }
    }

    /// Sends `out` and reads until `want` bytes came back (or the peer
    /// closed, or an error), within 20 s.
    fn exchange(&mut self, out: &[u8], want: usize) -> io::Result<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut sent = 0;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        while got.len() < want || sent < out.len() {
            assert!(Instant::now() < deadline, "exchange stalled: sent {sent}, got {}", got.len());
            // A stop and continue of this process ends a wait with EINTR.
            if let Err(e) = self.poll.poll(&mut self.events, Some(Duration::from_millis(50))) {
                assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
            }
            while sent < out.len() {
                match self.stream.write(&out[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            match self.stream.flush() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            loop {
                match self.stream.read(&mut buf) {
                    Ok(0) => return Ok(got),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(got)
    }

    /// Drives the handshake until it finishes or fails.
    fn handshake(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 64];
        while self.stream.is_handshaking() {
            assert!(Instant::now() < deadline, "handshake stalled");
            // A stop and continue of this process ends a wait with EINTR.
            if let Err(e) = self.poll.poll(&mut self.events, Some(Duration::from_millis(50))) {
                assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
            }
            match self.stream.flush() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match self.stream.read(&mut buf) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn cause(result: io::Result<()>) -> TlsError {
    let err = result.expect_err("the handshake should have been refused");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    TlsError::of(&err).unwrap_or_else(|| panic!("no TLS cause in {err:?}")).clone()
}

#[test]
fn handshake_then_bytes_both_ways_with_sni_and_alpn() {
    let ca = Ca::new("test ca");
    let server = TlsServer::start(&ca.leaf(&["localhost"]), echo());
    let tls = client_for(&ca);
    let mut client = Client::connect(&tls, server.addr, "localhost");
    let back = client.exchange(b"hello over tls\n", 15).unwrap();
    assert_eq!(back, b"hello over tls\n");
    assert_eq!(client.stream.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert!(!client.stream.resumed());
    assert_eq!(client.stream.handshake_deadline(), None);
    let seen = server.seen(1);
    assert_eq!(seen[0].sni.as_deref(), Some("localhost"));
    assert_eq!(seen[0].alpn.as_deref(), Some(&b"http/1.1"[..]));
}

#[test]
fn a_megabyte_each_way_through_bounded_buffers() {
    let ca = Ca::new("test ca");
    let server = TlsServer::start(&ca.leaf(&["localhost"]), echo());
    let tls = client_for(&ca);
    let mut client = Client::connect(&tls, server.addr, "localhost");
    let out: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let back = client.exchange(&out, out.len()).unwrap();
    assert_eq!(back.len(), out.len());
    assert!(back == out, "echoed bytes differ");
}

#[test]
fn an_ip_address_is_verified_against_the_certificate_without_sni() {
    let ca = Ca::new("test ca");
    let server = TlsServer::start(&ca.leaf(&["127.0.0.1"]), echo());
    let tls = client_for(&ca);
    let mut client = Client::connect(&tls, server.addr, "127.0.0.1");
    assert_eq!(client.exchange(b"ip\n", 3).unwrap(), b"ip\n");
    assert_eq!(server.seen(1)[0].sni, None);
}

#[test]
fn an_unknown_ca_is_refused_and_named() {
    let trusted = Ca::new("trusted ca");
    let stranger = Ca::new("stranger ca");
    let server = TlsServer::start(&stranger.leaf(&["localhost"]), echo());
    let tls = client_for(&trusted);
    let mut client = Client::connect(&tls, server.addr, "localhost");
    let err = cause(client.handshake());
    assert_eq!(err, TlsError::UnknownCa);
    assert_eq!(err.cause(), "unknown_ca");
    assert!(err.to_string().contains("not signed by a trusted certificate authority"));
    // The refusal reached the server as an alert.
    let seen = server.seen(1);
    let server_error = seen[0].error.as_deref().unwrap_or("");
    assert!(server_error.contains("UnknownCA"), "{server_error}");
    // Every later call gives the same cause.
    let mut buf = [0u8; 8];
    let again = client.stream.read(&mut buf).unwrap_err();
    assert_eq!(TlsError::of(&again), Some(&TlsError::UnknownCa));
}

#[test]
fn a_ca_certificate_served_as_the_server_s_own_is_refused_and_named() {
    let (leaf, pem) = tls_support::self_signed_ca_as_server(&["localhost"]);
    let server = TlsServer::start(&leaf, echo());
    let dir = scratch_dir();
    let ca_file = dir.join("self-signed.pem");
    std::fs::write(&ca_file, pem).unwrap();
    let tls = ClientTls::new(Some(&ca_file)).unwrap();
    let mut client = Client::connect(&tls, server.addr, "localhost");
    let err = cause(client.handshake());
    assert_eq!(err, TlsError::CaUsedAsEndEntity);
    assert_eq!(err.cause(), "ca_used_as_end_entity");
    let text = err.to_string();
    assert!(text.contains("a certificate authority's own (CA:TRUE)") && text.contains("issued by that CA"), "{text}");
}

#[test]
fn a_certificate_for_another_host_is_refused_and_named() {
    let ca = Ca::new("test ca");
    let server = TlsServer::start(&ca.leaf(&["other.test"]), echo());
    let tls = client_for(&ca);
    let mut client = Client::connect(&tls, server.addr, "localhost");
    let err = cause(client.handshake());
    match &err {
        TlsError::WrongHostName { host, presented } => {
            assert_eq!(host, "localhost");
            assert!(presented.iter().any(|p| p.contains("other.test")), "{presented:?}");
        }
        other => panic!("expected a wrong host name, got {other:?}"),
    }
    assert_eq!(err.cause(), "wrong_host_name");
    let text = err.to_string();
    assert!(text.contains("not valid for the host name localhost") && text.contains("other.test"), "{text}");
}

#[test]
fn an_expired_certificate_is_refused_and_named() {
    let ca = Ca::new("test ca");
    let server = TlsServer::start(&ca.expired_leaf(&["localhost"]), echo());
    let tls = client_for(&ca);
    let mut client = Client::connect(&tls, server.addr, "localhost");
    let err = cause(client.handshake());
    assert_eq!(err, TlsError::Expired);
    assert_eq!(err.to_string(), "the upstream's certificate has expired");
}

#[test]
fn a_peer_that_does_not_speak_tls_is_a_protocol_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    let ca = Ca::new("test ca");
    let tls = client_for(&ca);
    let mut client = Client::connect(&tls, addr, "localhost");
    let err = cause(client.handshake());
    assert!(matches!(err, TlsError::Protocol(_)), "{err:?}");
    peer.join().unwrap();
}

#[test]
fn a_second_connection_resumes_the_first_session() {
    let ca = Ca::new("test ca");
    let server = TlsServer::start(&ca.leaf(&["localhost"]), echo());
    let tls = client_for(&ca);
    // The first exchange also takes in the session tickets the server sends.
    let mut first = Client::connect(&tls, server.addr, "localhost");
    assert_eq!(first.exchange(b"one\n", 4).unwrap(), b"one\n");
    assert!(!first.stream.resumed());
    let mut second = Client::connect(&tls.clone(), server.addr, "localhost");
    assert_eq!(second.exchange(b"two\n", 4).unwrap(), b"two\n");
    assert!(second.stream.resumed(), "the second handshake was a full one");
    let seen = server.seen(2);
    assert!(!seen[0].resumed && seen[1].resumed, "{seen:?}");
}

#[test]
fn a_handshake_past_its_deadline_fails_with_a_timeout() {
    // A peer that accepts and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let ca = Ca::new("test ca");
    let tls = client_for(&ca);
    let tcp = mio::net::TcpStream::connect(addr).unwrap();
    let _held = listener.accept().unwrap();
    let mut stream = tls.connect(tcp, "localhost", 5_000).unwrap();
    assert_eq!(stream.handshake_deadline(), Some(5_000));
    assert_eq!(stream.check_deadline(4_999), Ok(()));
    assert_eq!(stream.check_deadline(5_000), Err(TlsError::HandshakeTimeout));
    let err = stream.flush().unwrap_err();
    assert_eq!(TlsError::of(&err), Some(&TlsError::HandshakeTimeout));
    assert_eq!(TlsError::HandshakeTimeout.cause(), "handshake_timeout");
}

#[test]
fn an_unusable_ca_file_is_a_configuration_error_naming_the_file() {
    let dir = scratch_dir();
    let missing = dir.join("missing.pem");
    let err = ClientTls::new(Some(&missing)).unwrap_err();
    assert!(matches!(err, TlsConfigError::CaFile { .. }));
    let text = err.to_string();
    assert!(text.contains("missing.pem") && text.contains("cannot be read"), "{text}");

    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let text = ClientTls::new(Some(&empty)).unwrap_err().to_string();
    assert!(text.contains("empty.pem") && text.contains("no PEM certificate"), "{text}");
}

#[test]
fn a_name_that_is_not_a_host_is_refused_before_any_byte() {
    let ca = Ca::new("test ca");
    let tls = client_for(&ca);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = mio::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let err = tls.connect(tcp, "not a host", 0).unwrap_err();
    assert!(matches!(err, TlsError::InvalidHostName(_)), "{err:?}");
}
