//! The one type all upstream-connection I/O goes through.
//!
//! `Plain` is a non-blocking TCP stream, `Tls` a rustls session over one
//! (`net::tls`); both have the same methods, so the exchange code never
//! learns which one it drives. Reads and writes behave like a socket's:
//! `WouldBlock` when nothing can be done now, `Ok(0)` from `read` when the
//! peer closed.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::TcpStream;

use crate::net::resolve::Dial;
use crate::net::tls::{ClientTls, TlsError, TlsStream};
use crate::time::Ms;

pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// What a new connection speaks: TLS to the upstream's name, or plain.
#[derive(Clone, Copy)]
pub struct Security<'a> {
    pub tls: Option<&'a ClientTls>,
    /// The name the certificate must carry (and SNI sends).
    pub name: &'a str,
    /// When the handshake must be done.
    pub handshake_deadline: Ms,
}

impl Transport {
    /// Starts a non-blocking connect to the next address `dial` has left;
    /// completion is reported as writability. The one place an upstream
    /// connection is opened.
    pub fn connect(dial: &mut Dial, security: Security) -> io::Result<(Transport, SocketAddr)> {
        let (stream, addr) = dial.start_next()?;
        let _ = stream.set_nodelay(true);
        let transport = match security.tls {
            None => Transport::Plain(stream),
            Some(tls) => Transport::Tls(Box::new(
                tls.connect(stream, security.name, security.handshake_deadline)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            )),
        };
        Ok((transport, addr))
    }

    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }

    pub fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    /// Pushes out bytes the transport itself still holds (TLS records);
    /// `WouldBlock` while some remain.
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(_) => Ok(()),
            Transport::Tls(s) => s.flush(),
        }
    }

    /// The socket, for registration and connect checks.
    pub fn tcp(&mut self) -> &mut TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => s.tcp(),
        }
    }

    /// When the TLS handshake must be done, while it is not.
    pub fn handshake_deadline(&self) -> Option<Ms> {
        match self {
            Transport::Plain(_) => None,
            Transport::Tls(s) => s.handshake_deadline(),
        }
    }

    /// Fails a TLS handshake still going at `now` past its deadline.
    pub fn check_deadline(&mut self, now: Ms) -> Result<(), TlsError> {
        match self {
            Transport::Plain(_) => Ok(()),
            Transport::Tls(s) => s.check_deadline(now),
        }
    }

    /// Whether this TLS session was resumed rather than fully negotiated.
    pub fn resumed(&self) -> bool {
        matches!(self, Transport::Tls(s) if s.resumed())
    }
}
