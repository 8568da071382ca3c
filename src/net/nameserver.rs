//! The resolver thread's own DNS client, used when the configuration names
//! `resolver.nameservers`: A and AAAA queries over UDP to those servers, in
//! turn, the answer's TTL handed on to the cache.
//!
//! It blocks, and runs only on the resolver thread. Each query has a random
//! id and goes from a fresh socket on a port the system picks; a datagram is
//! taken as the answer only when it comes from the server's address and port
//! and carries that id, name and type (anything else is dropped and the wait
//! goes on). Every attempt has its deadline (`timeoutMs`). An answer too
//! long for a datagram (the TC bit) is asked again over TCP, under the same
//! deadline. A server that fails, times out or answers garbage is passed
//! over for the next; `NXDOMAIN` ends the lookup at once (the name does not
//! exist, asking elsewhere would not change that).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::dns::{self, DnsError, TYPE_A, TYPE_AAAA};

/// Where and how patiently to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nameservers {
    pub servers: Vec<SocketAddr>,
    /// The wait for one answer from one server.
    pub timeout: Duration,
    /// Rounds over all the servers before giving up.
    pub attempts: u32,
}

/// What a lookup found: addresses (IPv4 first, then IPv6, each in the
/// server's order) and the TTL of the shorter-lived of the two answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub ips: Vec<IpAddr>,
    pub ttl_s: Option<u32>,
}

impl Nameservers {
    /// Looks `host` up: its A and AAAA records from the first server that
    /// answers both. The error says why no address came.
    pub fn lookup(&self, host: &str) -> io::Result<Found> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no name server is configured");
        for _ in 0..self.attempts.max(1) {
            for &server in &self.servers {
                match self.ask_both(server, host) {
                    Ok(found) if found.ips.is_empty() => {
                        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{server} has no address for it")))
                    }
                    Ok(found) => return Ok(found),
                    Err(Failure::Final(e)) => {
                        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{server} says {e}")))
                    }
                    Err(Failure::TryNext(e)) => {
                        log::debug!("name server {server} for {host}: {e}");
                        last = io::Error::new(e.kind(), format!("{server}: {e}"));
                    }
                }
            }
        }
        Err(last)
    }

    /// The A and the AAAA answer of one server, asked at once over UDP;
    /// either one that comes truncated is asked again over TCP.
    fn ask_both(&self, server: SocketAddr, host: &str) -> Result<Found, Failure> {
        let deadline = Instant::now() + self.timeout;
        let [a, b] = random_ids();
        let mut queries = [Question::new(host, TYPE_A, a)?, Question::new(host, TYPE_AAAA, b)?];
        udp_exchange(server, &mut queries, deadline)?;
        let mut found = Found { ips: Vec::new(), ttl_s: None };
        for q in queries {
            let answer = match q.answer.expect("the exchange answered every question") {
                Err(DnsError::Truncated) => {
                    let packet = tcp_exchange(server, &q.packet, deadline).map_err(Failure::TryNext)?;
                    match dns::parse_answer(&packet, q.id, host, q.qtype) {
                        Err(DnsError::Truncated) => {
                            return Err(Failure::TryNext(io::Error::other("the answer is truncated over TCP too")))
                        }
                        other => other?,
                    }
                }
                other => other?,
            };
            found.ips.extend(answer.ips);
            found.ttl_s = match (found.ttl_s, answer.ttl_s) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(found)
    }
}

/// One query in flight and, once come, its answer.
struct Question<'a> {
    host: &'a str,
    qtype: u16,
    id: u16,
    packet: Vec<u8>,
    answer: Option<Result<dns::Answer, DnsError>>,
}

impl<'a> Question<'a> {
    fn new(host: &'a str, qtype: u16, id: u16) -> Result<Question<'a>, Failure> {
        let mut packet = Vec::with_capacity(64);
        dns::write_query(id, host, qtype, &mut packet).map_err(Failure::Final)?;
        Ok(Question { host, qtype, id, packet, answer: None })
    }
}

/// Why one server gave no answer.
enum Failure {
    /// The answer is known: the name does not exist (or cannot be asked).
    Final(DnsError),
    /// This server failed; another may answer.
    TryNext(io::Error),
}

impl From<DnsError> for Failure {
    fn from(e: DnsError) -> Failure {
        match e {
            DnsError::NxDomain | DnsError::BadName => Failure::Final(e),
            other => Failure::TryNext(io::Error::new(io::ErrorKind::InvalidData, other.to_string())),
        }
    }
}

/// Two random query ids, never the same (an answer names its query by id).
fn random_ids() -> [u16; 2] {
    let mut bytes = [0u8; 4];
    getrandom::getrandom(&mut bytes).expect("the OS random source is available");
    let a = u16::from_ne_bytes([bytes[0], bytes[1]]);
    let b = u16::from_ne_bytes([bytes[2], bytes[3]]);
    [a, if a == b { b ^ 1 } else { b }]
}

/// Sends every query to `server` from one fresh socket and waits until
/// `deadline` for their answers: datagrams from that server that are
/// answers to one of them (another source, id, name or type is dropped).
/// An error answer ends the wait when it is final; a truncated one is kept
/// for the caller to ask again over TCP.
fn udp_exchange(server: SocketAddr, queries: &mut [Question], deadline: Instant) -> Result<(), Failure> {
    let any: IpAddr = if server.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let socket = UdpSocket::bind((any, 0)).map_err(Failure::TryNext)?;
    for q in queries.iter() {
        socket.send_to(&q.packet, server).map_err(Failure::TryNext)?;
    }
    let mut buf = [0u8; dns::MAX_UDP_ANSWER];
    while queries.iter().any(|q| q.answer.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::TryNext(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")));
        }
        socket.set_read_timeout(Some(left)).map_err(Failure::TryNext)?;
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::TryNext(e)),
        };
        if from != server {
            log::debug!("dropped a datagram from {from}, not the name server {server}");
            continue;
        }
        let packet = &buf[..n];
        let Some(q) = queries.iter_mut().find(|q| q.answer.is_none() && dns::packet_id(packet) == Some(q.id)) else {
            log::debug!("dropped an answer from {server} to no query in flight");
            continue;
        };
        match dns::parse_answer(packet, q.id, q.host, q.qtype) {
            Err(DnsError::NotOurs) => log::debug!("dropped an answer from {server} to another query"),
            Err(e @ (DnsError::NxDomain | DnsError::BadName)) => return Err(Failure::Final(e)),
            Err(DnsError::Truncated) => q.answer = Some(Err(DnsError::Truncated)),
            Err(e) => return Err(Failure::from(e)),
            Ok(answer) => q.answer = Some(Ok(answer)),
        }
    }
    Ok(())
}

/// The same query over TCP (RFC 1035 §4.2.2: each message after its
/// two-byte length), for an answer that did not fit in a datagram.
fn tcp_exchange(server: SocketAddr, query: &[u8], deadline: Instant) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&server, time_left(deadline)?)?;
    stream.set_write_timeout(Some(time_left(deadline)?))?;
    let mut message = Vec::with_capacity(query.len() + 2);
    message.extend_from_slice(&(query.len() as u16).to_be_bytes());
    message.extend_from_slice(query);
    stream.write_all(&message).map_err(deadline_passed)?;
    let mut length = [0u8; 2];
    read_by(&mut stream, &mut length, deadline)?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(length))];
    read_by(&mut stream, &mut answer, deadline)?;
    Ok(answer)
}

/// The time left until `deadline`; `TimedOut` once none is.
fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    match left.is_zero() {
        true => Err(timed_out()),
        false => Ok(left),
    }
}

/// The lookup's deadline passed before an answer came over TCP.
fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no answer over TCP in time")
}

/// A socket timeout is `WouldBlock` (EAGAIN) on Unix: the deadline passed
/// during the call, and it is told as `TimedOut` like one passed before it.
fn deadline_passed(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock => timed_out(),
        _ => e,
    }
}

/// Fills `buf` from `stream` by `deadline`: each read waits only for the
/// time left, so a server that trickles its answer a byte at a time cannot
/// hold the lookup past it (`read_exact` under one read timeout would wait
/// that long again for every byte).
fn read_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        stream.set_read_timeout(Some(time_left(deadline)?))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(deadline_passed(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Answers to the query in `packet`: header and question copied, QR set,
    /// `flags_low` (RA, RCODE) and the A records given.
    fn reply(packet: &[u8], tc: bool, rcode: u8, records: &[[u8; 4]]) -> Vec<u8> {
        let question_end = 12 + packet[12..].iter().position(|&b| b == 0).unwrap() + 5;
        let mut out = packet[..question_end].to_vec();
        out[2] |= 0x80 | if tc { 0x02 } else { 0 };
        out[3] = 0x80 | rcode;
        let qtype = u16::from_be_bytes([packet[question_end - 4], packet[question_end - 3]]);
        let records: &[[u8; 4]] = if qtype == TYPE_A { records } else { &[] };
        out[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        for ip in records {
            out.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 42, 0, 4]);
            out.extend_from_slice(ip);
        }
        out
    }

    fn servers(addr: SocketAddr) -> Nameservers {
        Nameservers { servers: vec![addr], timeout: Duration::from_secs(5), attempts: 1 }
    }

    #[test]
    fn answers_from_the_server_with_the_ttl() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            for _ in 0..2 {
                let (n, from) = socket.recv_from(&mut buf).unwrap();
                // A stray datagram with a wrong id first, from the right
                // server: it must be dropped, not taken for the answer.
                let mut wrong = reply(&buf[..n], false, 0, &[[6, 6, 6, 6]]);
                wrong[0] ^= 0xFF;
                socket.send_to(&wrong, from).unwrap();
                socket.send_to(&reply(&buf[..n], false, 0, &[[10, 0, 0, 1], [10, 0, 0, 2]]), from).unwrap();
            }
        });
        let found = servers(addr).lookup("api.test").unwrap();
        assert_eq!(found, Found { ips: vec![[10, 0, 0, 1].into(), [10, 0, 0, 2].into()], ttl_s: Some(42) });
    }

    #[test]
    fn a_datagram_from_another_port_is_not_the_answer() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let imposter = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let (n, from) = socket.recv_from(&mut buf).unwrap();
            imposter.send_to(&reply(&buf[..n], false, 0, &[[6, 6, 6, 6]]), from).unwrap();
        });
        let mut ns = servers(addr);
        ns.timeout = Duration::from_millis(300);
        let err = ns.lookup("api.test").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    }

    #[test]
    fn nxdomain_ends_the_lookup() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let (n, from) = socket.recv_from(&mut buf).unwrap();
            socket.send_to(&reply(&buf[..n], false, 3, &[]), from).unwrap();
        });
        let err = servers(addr).lookup("nowhere.test").unwrap_err();
        assert!(err.to_string().contains("NXDOMAIN"), "{err}");
    }

    #[test]
    fn a_silent_server_is_passed_over_for_the_next() {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let good = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (silent_addr, good_addr) = (silent.local_addr().unwrap(), good.local_addr().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            for _ in 0..2 {
                let (n, from) = good.recv_from(&mut buf).unwrap();
                good.send_to(&reply(&buf[..n], false, 0, &[[10, 0, 0, 7]]), from).unwrap();
            }
            drop(silent);
        });
        let ns =
            Nameservers { servers: vec![silent_addr, good_addr], timeout: Duration::from_millis(300), attempts: 1 };
        assert_eq!(ns.lookup("api.test").unwrap().ips, vec![IpAddr::from([10, 0, 0, 7])]);
    }

    /// A server whose UDP side answers both questions truncated (TC set),
    /// so they are asked again over TCP: its address, and its TCP listener.
    fn truncating_server() -> (SocketAddr, TcpListener) {
        // A UDP port the system picks may be taken for TCP: try until one is free for both.
        let (udp, tcp) = (0..100)
            .find_map(|_| {
                let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
                let tcp = TcpListener::bind(udp.local_addr().unwrap()).ok()?;
                Some((udp, tcp))
            })
            .expect("a loopback port free for both UDP and TCP");
        let addr = udp.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            for _ in 0..2 {
                let (n, from) = udp.recv_from(&mut buf).unwrap();
                udp.send_to(&reply(&buf[..n], true, 0, &[]), from).unwrap();
            }
        });
        (addr, tcp)
    }

    #[test]
    fn a_truncated_answer_is_asked_again_over_tcp() {
        let (addr, tcp) = truncating_server();
        std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = tcp.accept().unwrap();
                let mut len = [0u8; 2];
                s.read_exact(&mut len).unwrap();
                let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut query).unwrap();
                let answer = reply(&query, false, 0, &[[10, 0, 0, 8]]);
                s.write_all(&(answer.len() as u16).to_be_bytes()).unwrap();
                s.write_all(&answer).unwrap();
            }
        });
        assert_eq!(servers(addr).lookup("api.test").unwrap().ips, vec![IpAddr::from([10, 0, 0, 8])]);
    }

    /// A TCP answer that stops coming ends at the deadline as a timeout,
    /// not as the `WouldBlock` a socket's read timeout is on Unix.
    #[test]
    fn a_tcp_answer_that_stops_coming_is_a_timeout() {
        let (addr, tcp) = truncating_server();
        std::thread::spawn(move || {
            let (mut s, _) = tcp.accept().unwrap();
            let _ = s.write_all(&512u16.to_be_bytes());
            let _ = s.read(&mut [0u8; 64]);
            // Held open, silent, until the client hangs up.
            let _ = s.read(&mut [0u8; 64]);
        });
        let ns = Nameservers { servers: vec![addr], timeout: Duration::from_millis(300), attempts: 1 };
        let err = ns.lookup("api.test").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    }

    /// A server that trickles its TCP answer a byte at a time, each within
    /// the timeout, still has only the lookup's deadline in all.
    #[test]
    fn a_tcp_answer_trickled_byte_by_byte_ends_at_the_deadline() {
        let (addr, tcp) = truncating_server();
        std::thread::spawn(move || {
            let (mut s, _) = tcp.accept().unwrap();
            let _ = s.write_all(&60_000u16.to_be_bytes());
            // A byte every 100 ms, for at most 10 s, until the client hangs up.
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(&[0]).is_err() {
                    break;
                }
            }
        });
        let ns = Nameservers { servers: vec![addr], timeout: Duration::from_millis(500), attempts: 1 };
        let started = Instant::now();
        let err = ns.lookup("api.test").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        // Not the 60 000 reads of up to 500 ms each that a per-read timeout allows.
        assert!(started.elapsed() < Duration::from_secs(5), "ended after {:?}", started.elapsed());
    }
}
