//! A mock DNS server for resolver tests: UDP on `127.0.0.1:0`, answering A
//! and AAAA queries from a table the test changes while it runs, each
//! answer after the name's delay (on its own thread, so a slow name holds up
//! no other), and recording every query it got.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the server says about one name.
#[derive(Debug, Clone, Default)]
pub struct Zone {
    /// Its A records, in this order; none and not `nxdomain`: an empty answer.
    pub a: Vec<Ipv4Addr>,
    pub ttl_s: u32,
    /// Wait this long before answering.
    pub delay: Duration,
    pub nxdomain: bool,
}

/// One query as the server got it.
#[derive(Debug, Clone)]
pub struct Query {
    pub name: String,
    pub qtype: u16,
    pub at: Instant,
}

pub struct MockDns {
    pub addr: SocketAddr,
    zones: Arc<Mutex<HashMap<String, Zone>>>,
    queries: Arc<Mutex<Vec<Query>>>,
}

impl MockDns {
    pub fn start() -> MockDns {
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let addr = socket.local_addr().unwrap();
        let zones: Arc<Mutex<HashMap<String, Zone>>> = Arc::default();
        let queries: Arc<Mutex<Vec<Query>>> = Arc::default();
        let (z, q) = (zones.clone(), queries.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf) else { return };
                let Some((name, qtype, question_end)) = parse_query(&buf[..n]) else { continue };
                q.lock().unwrap().push(Query { name: name.clone(), qtype, at: Instant::now() });
                let zone = z.lock().unwrap().get(&name).cloned();
                let reply = answer(&buf[..question_end], qtype, zone.as_ref());
                let delay = zone.map(|z| z.delay).unwrap_or_default();
                let socket = socket.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let _ = socket.send_to(&reply, from);
                });
            }
        });
        MockDns { addr, zones, queries }
    }

    /// Sets (or replaces) what the server answers for `name`.
    pub fn set(&self, name: &str, zone: Zone) {
        self.zones.lock().unwrap().insert(name.to_owned(), zone);
    }

    /// The A queries got so far for `name`.
    pub fn a_queries(&self, name: &str) -> Vec<Query> {
        self.queries.lock().unwrap().iter().filter(|q| q.name == name && q.qtype == 1).cloned().collect()
    }

    /// The `resolver` section that points nthpool at this server.
    pub fn resolver_config(&self, extra: &str) -> String {
        format!(r#""resolver":{{"nameservers":["{}"]{extra}}}"#, self.addr)
    }
}

/// The name (lower case), type and end of the question of a query.
fn parse_query(packet: &[u8]) -> Option<(String, u16, usize)> {
    if packet.len() < 12 || packet[2] & 0x80 != 0 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*packet.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(packet.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]);
    Some((labels.join("."), qtype, at + 4))
}

/// The answer to the query whose header and question are `question`.
fn answer(question: &[u8], qtype: u16, zone: Option<&Zone>) -> Vec<u8> {
    let mut out = question.to_vec();
    out[2] |= 0x80; // QR
    let nxdomain = zone.is_none_or(|z| z.nxdomain);
    out[3] = 0x80 | if nxdomain { 3 } else { 0 };
    let records: &[Ipv4Addr] = match zone {
        Some(z) if qtype == 1 && !z.nxdomain => &z.a,
        _ => &[],
    };
    out[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    let ttl = zone.map(|z| z.ttl_s).unwrap_or(0);
    for ip in records {
        out.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]);
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&[0, 4]);
        out.extend_from_slice(&ip.octets());
    }
    out
}
