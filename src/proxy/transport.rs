//! The one type all upstream-connection I/O goes through.
//!
//! `Plain` is a non-blocking TCP stream; a TLS variant keeps the same
//! methods, so the exchange code never learns which one it drives. Reads and
//! writes behave like a socket's: `WouldBlock` when nothing can be done now,
//! `Ok(0)` from `read` when the peer closed.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::TcpStream;

pub enum Transport {
    Plain(TcpStream),
}

impl Transport {
    /// Starts a non-blocking connect; completion is reported as writability.
    /// The one place an upstream connection is opened, so name resolution
    /// can be put in front of it.
    pub fn connect(addr: SocketAddr) -> io::Result<Transport> {
        let stream = TcpStream::connect(addr)?;
        let _ = stream.set_nodelay(true);
        Ok(Transport::Plain(stream))
    }

    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
        }
    }

    pub fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
        }
    }

    /// Pushes out bytes the transport itself still holds (TLS records);
    /// `WouldBlock` while some remain.
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(_) => Ok(()),
        }
    }

    /// Whether the transport holds bytes of its own to write.
    pub fn wants_write(&self) -> bool {
        match self {
            Transport::Plain(_) => false,
        }
    }

    /// The socket, for registration and connect checks.
    pub fn tcp(&mut self) -> &mut TcpStream {
        match self {
            Transport::Plain(s) => s,
        }
    }
}
