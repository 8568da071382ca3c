//! A blocking HTTP/1.1 keep-alive connection, enough for the workers' calls
//! to the server and the mock upstream (answers framed by Content-Length).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    /// Read timeout: the longest wait this connection's answers may take.
    timeout: Duration,
}

impl Conn {
    pub fn new(addr: SocketAddr, timeout: Duration) -> Conn {
        Conn { addr, stream: None, buf: Vec::with_capacity(4096), timeout }
    }

    /// Sends one request and reads its answer; a reused connection that fails
    /// before any answer byte is retried once on a fresh one.
    pub fn call(&mut self, head: &str, body: &[u8]) -> io::Result<Answer> {
        let reused = self.stream.is_some();
        match self.try_call(head, body) {
            Err(e) if reused && e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::TimedOut => {
                self.stream = None;
                self.try_call(head, body)
            }
            r => r,
        }
        .inspect_err(|_| self.stream = None)
    }

    fn try_call(&mut self, head: &str, body: &[u8]) -> io::Result<Answer> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(10))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            self.stream = Some(s);
            self.buf.clear();
        }
        let s = self.stream.as_mut().expect("connected");
        let mut req = Vec::with_capacity(head.len() + body.len() + 32);
        req.extend_from_slice(head.as_bytes());
        req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        req.extend_from_slice(body);
        s.write_all(&req)?;
        loop {
            if let Some((answer, used)) = parse(&self.buf)? {
                self.buf.drain(..used);
                if answer.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
                    self.stream = None;
                }
                return Ok(answer);
            }
            let mut chunk = [0u8; 4096];
            let n = match s.read(&mut chunk) {
                // A stop and continue of this process ends a read that has a timeout with EINTR.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                read => read?,
            };
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before the answer"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn parse(buf: &[u8]) -> io::Result<Option<(Answer, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let head = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
    };
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
        .collect();
    let len: usize =
        headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.trim().parse().ok()).unwrap_or(0);
    if buf.len() < head + len {
        return Ok(None);
    }
    let answer = Answer { status: r.code.unwrap_or(0), headers, body: buf[head..head + len].to_vec() };
    Ok(Some((answer, head + len)))
}
