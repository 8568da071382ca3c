//! DNS messages for the resolver's own client (RFC 1035; AAAA, RFC 3596):
//! the query for one name and one type, and the parse of its answer.
//!
//! No I/O and no clock: bytes in, addresses and a TTL out. The parse trusts
//! nothing in the packet: every length is checked against the bytes there,
//! a compressed name follows at most [`MAX_POINTERS`] pointers and is at most
//! [`MAX_NAME_LEN`] bytes long, a CNAME chain at most [`MAX_CNAMES`] links,
//! and an answer that is not for our query id, name and type is refused.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Record types asked for or followed.
pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// The largest answer over UDP without EDNS (RFC 1035 §4.2.1); a longer one
/// comes truncated and is asked again over TCP.
pub const MAX_UDP_ANSWER: usize = 512;
/// Longest name in wire form, length bytes included (RFC 1035 §2.3.4).
pub const MAX_NAME_LEN: usize = 255;
/// Compression pointers followed while reading one name: a loop ends here.
pub const MAX_POINTERS: usize = 16;
/// CNAME links followed from the name asked to its addresses.
pub const MAX_CNAMES: usize = 8;
/// Records kept of each kind (links, addresses) from one answer: a name
/// with more addresses is reached through those (each is tried in turn,
/// and a TCP answer may hold thousands); the rest are passed over.
pub const MAX_RECORDS: usize = 64;

const HEADER_LEN: usize = 12;
const FLAG_QR: u16 = 0x8000;
const FLAG_TC: u16 = 0x0200;
const FLAG_RD: u16 = 0x0100;
const OPCODE_MASK: u16 = 0x7800;
const RCODE_NXDOMAIN: u8 = 3;

/// Why an answer gave no addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsError {
    /// The name does not exist (RCODE 3).
    NxDomain,
    /// The server answered with another error code (2 server failure, 5 refused, ...).
    Rcode(u8),
    /// The answer did not fit in the datagram: ask again over TCP.
    Truncated,
    /// The packet is not an answer to our query (another id, name or type):
    /// ignored, the real answer may still come.
    NotOurs,
    /// The packet breaks the format.
    Malformed(&'static str),
    /// The name cannot be asked for (empty label, label over 63 bytes, too long).
    BadName,
}

impl fmt::Display for DnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsError::NxDomain => f.write_str("no such name (NXDOMAIN)"),
            DnsError::Rcode(2) => f.write_str("the name server failed (SERVFAIL)"),
            DnsError::Rcode(5) => f.write_str("the name server refused the query (REFUSED)"),
            DnsError::Rcode(code) => write!(f, "the name server answered with error code {code}"),
            DnsError::Truncated => f.write_str("the answer was truncated"),
            DnsError::NotOurs => f.write_str("the answer is for another query"),
            DnsError::Malformed(why) => write!(f, "malformed answer: {why}"),
            DnsError::BadName => f.write_str("the name is not a valid DNS name"),
        }
    }
}

/// The addresses an answer gave and the shortest TTL (seconds) of the records
/// that led to them; `ttl_s` is `None` when there are no addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub ips: Vec<IpAddr>,
    pub ttl_s: Option<u32>,
}

/// Writes into `out` (cleared first) a recursive query with `id` for `name`
/// (a trailing dot is allowed) and `qtype`.
pub fn write_query(id: u16, name: &str, qtype: u16, out: &mut Vec<u8>) -> Result<(), DnsError> {
    out.clear();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&FLAG_RD.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() + 2 > MAX_NAME_LEN {
        return Err(DnsError::BadName);
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(DnsError::BadName);
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(())
}

/// The id of a packet, if it is long enough to have one.
pub fn packet_id(packet: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*packet.first()?, *packet.get(1)?]))
}

/// One resource record of the answer section, its owner name decoded.
struct Record {
    owner: Name,
    rtype: u16,
    ttl: u32,
    /// Where its data starts and ends in the packet.
    data: (usize, usize),
}

/// A decoded name: lower-case labels joined by dots, in a fixed buffer.
#[derive(Clone, Copy)]
struct Name {
    bytes: [u8; MAX_NAME_LEN],
    len: usize,
}

impl Name {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    fn from_text(text: &str) -> Option<Name> {
        let text = text.strip_suffix('.').unwrap_or(text);
        let mut name = Name { bytes: [0; MAX_NAME_LEN], len: 0 };
        if text.len() > MAX_NAME_LEN {
            return None;
        }
        name.bytes[..text.len()].copy_from_slice(text.as_bytes());
        name.bytes[..text.len()].make_ascii_lowercase();
        name.len = text.len();
        Some(name)
    }
}

/// Reads the name at `at`; returns it and where the bytes after it start
/// (after the first pointer, when the name is compressed).
fn read_name(packet: &[u8], mut at: usize) -> Result<(Name, usize), DnsError> {
    let mut name = Name { bytes: [0; MAX_NAME_LEN], len: 0 };
    let mut wire_len = 1usize;
    let mut end = None;
    let mut pointers = 0;
    loop {
        let &len = packet.get(at).ok_or(DnsError::Malformed("a name runs past the end"))?;
        match len & 0xC0 {
            0x00 if len == 0 => {
                return Ok((name, end.unwrap_or(at + 1)));
            }
            0x00 => {
                let len = usize::from(len);
                let label = packet.get(at + 1..at + 1 + len).ok_or(DnsError::Malformed("a label runs past the end"))?;
                wire_len += len + 1;
                if wire_len > MAX_NAME_LEN {
                    return Err(DnsError::Malformed("a name is longer than 255 bytes"));
                }
                if name.len > 0 {
                    name.bytes[name.len] = b'.';
                    name.len += 1;
                }
                name.bytes[name.len..name.len + len].copy_from_slice(label);
                name.bytes[name.len..name.len + len].make_ascii_lowercase();
                name.len += len;
                at += 1 + len;
            }
            0xC0 => {
                let &low = packet.get(at + 1).ok_or(DnsError::Malformed("a pointer runs past the end"))?;
                pointers += 1;
                if pointers > MAX_POINTERS {
                    return Err(DnsError::Malformed("a name's compression pointers loop"));
                }
                end.get_or_insert(at + 2);
                at = usize::from(u16::from_be_bytes([len & 0x3F, low]));
            }
            _ => return Err(DnsError::Malformed("a label of an unknown type")),
        }
    }
}

fn read_u16(packet: &[u8], at: usize) -> Result<u16, DnsError> {
    match packet.get(at..at + 2) {
        Some(b) => Ok(u16::from_be_bytes([b[0], b[1]])),
        None => Err(DnsError::Malformed("a record runs past the end")),
    }
}

fn read_u32(packet: &[u8], at: usize) -> Result<u32, DnsError> {
    Ok(u32::from(read_u16(packet, at)?) << 16 | u32::from(read_u16(packet, at + 2)?))
}

/// Parses `packet` as the answer to the query [`write_query`] made with
/// `id`, `name` and `qtype`. Only records of the answer section are used:
/// CNAMEs from `name` on, then the addresses of type `qtype` of the last
/// name of that chain. `Ok` with no address: the name exists but has none of
/// that type.
pub fn parse_answer(packet: &[u8], id: u16, name: &str, qtype: u16) -> Result<Answer, DnsError> {
    if packet.len() < HEADER_LEN {
        return Err(DnsError::Malformed("shorter than a DNS header"));
    }
    let flags = read_u16(packet, 2)?;
    if packet_id(packet) != Some(id) || flags & FLAG_QR == 0 || flags & OPCODE_MASK != 0 {
        return Err(DnsError::NotOurs);
    }
    let asked = Name::from_text(name).ok_or(DnsError::BadName)?;
    let (qdcount, ancount) = (read_u16(packet, 4)?, usize::from(read_u16(packet, 6)?));
    let mut at = HEADER_LEN;
    if qdcount != 1 {
        // A truncated answer may carry no question; otherwise it must echo ours.
        return if flags & FLAG_TC != 0 { Err(DnsError::Truncated) } else { Err(DnsError::NotOurs) };
    }
    let (question, after) = read_name(packet, at)?;
    if question.as_bytes() != asked.as_bytes()
        || read_u16(packet, after)? != qtype
        || read_u16(packet, after + 2)? != CLASS_IN
    {
        return Err(DnsError::NotOurs);
    }
    at = after + 4;
    if flags & FLAG_TC != 0 {
        return Err(DnsError::Truncated);
    }
    match (flags & 0x000F) as u8 {
        0 => {}
        RCODE_NXDOMAIN => return Err(DnsError::NxDomain),
        code => return Err(DnsError::Rcode(code)),
    }
    let mut records = Vec::with_capacity(ancount.min(2 * MAX_RECORDS));
    let (mut links, mut addresses) = (0, 0);
    for _ in 0..ancount {
        let (owner, after) = read_name(packet, at)?;
        let rtype = read_u16(packet, after)?;
        let ttl = read_u32(packet, after + 4)?;
        let len = usize::from(read_u16(packet, after + 8)?);
        let start = after + 10;
        if packet.len() < start + len {
            return Err(DnsError::Malformed("a record's data runs past the end"));
        }
        let class = read_u16(packet, after + 2)?;
        at = start + len;
        let kept = match rtype {
            TYPE_CNAME => &mut links,
            t if t == qtype => &mut addresses,
            _ => continue,
        };
        if class == CLASS_IN && *kept < MAX_RECORDS {
            *kept += 1;
            records.push(Record { owner, rtype, ttl, data: (start, at) });
        }
    }
    // Follow the CNAME chain from the name asked.
    let mut current = asked;
    let mut ttl_s = u32::MAX;
    for _ in 0..MAX_CNAMES {
        let Some(link) = records.iter().find(|r| r.rtype == TYPE_CNAME && r.owner.as_bytes() == current.as_bytes())
        else {
            break;
        };
        let (target, _) = read_name(packet, link.data.0)?;
        ttl_s = ttl_s.min(link.ttl);
        current = target;
    }
    if records.iter().any(|r| r.rtype == TYPE_CNAME && r.owner.as_bytes() == current.as_bytes()) {
        return Err(DnsError::Malformed("a CNAME chain longer than 8 links"));
    }
    let mut answer = Answer::default();
    for r in records.iter().filter(|r| r.rtype == qtype && r.owner.as_bytes() == current.as_bytes()) {
        let data = &packet[r.data.0..r.data.1];
        let ip = match (qtype, data.len()) {
            (TYPE_A, 4) => IpAddr::V4(Ipv4Addr::new(data[0], data[1], data[2], data[3])),
            (TYPE_AAAA, 16) => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(data);
                IpAddr::V6(Ipv6Addr::from(octets))
            }
            _ => return Err(DnsError::Malformed("an address record of the wrong length")),
        };
        if !answer.ips.contains(&ip) {
            answer.ips.push(ip);
        }
        ttl_s = ttl_s.min(r.ttl);
    }
    if !answer.ips.is_empty() {
        answer.ttl_s = Some(ttl_s);
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds answers the way a server would, for the tests.
    struct Reply {
        bytes: Vec<u8>,
    }

    impl Reply {
        /// The header and question of an answer to `write_query(id, name, qtype)`.
        fn to(id: u16, name: &str, qtype: u16, rcode: u8, ancount: u16) -> Reply {
            let mut bytes = Vec::new();
            write_query(id, name, qtype, &mut bytes).unwrap();
            bytes[2] = 0x81; // QR, RD
            bytes[3] = 0x80 | rcode; // RA
            bytes[6..8].copy_from_slice(&ancount.to_be_bytes());
            Reply { bytes }
        }

        /// A record whose owner is the question's name (a pointer to offset 12).
        fn record(mut self, rtype: u16, ttl: u32, data: &[u8]) -> Reply {
            self.bytes.extend_from_slice(&[0xC0, 12]);
            self.raw_record(rtype, ttl, data)
        }

        fn raw_record(mut self, rtype: u16, ttl: u32, data: &[u8]) -> Reply {
            self.bytes.extend_from_slice(&rtype.to_be_bytes());
            self.bytes.extend_from_slice(&CLASS_IN.to_be_bytes());
            self.bytes.extend_from_slice(&ttl.to_be_bytes());
            self.bytes.extend_from_slice(&(data.len() as u16).to_be_bytes());
            self.bytes.extend_from_slice(data);
            self
        }
    }

    fn wire_name(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for label in name.split('.') {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out
    }

    fn v4(a: [u8; 4]) -> IpAddr {
        IpAddr::from(a)
    }

    #[test]
    fn a_query_is_a_recursive_question_for_one_name() {
        let mut q = Vec::new();
        write_query(0xBEEF, "api.example.com.", TYPE_AAAA, &mut q).unwrap();
        let mut expected = vec![0xBE, 0xEF, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        expected.extend_from_slice(&wire_name("api.example.com"));
        expected.extend_from_slice(&[0, 28, 0, 1]);
        assert_eq!(q, expected);
        for bad in ["", ".", "a..b", &"a".repeat(64), &["abc"; 70].join(".")] {
            assert_eq!(write_query(1, bad, TYPE_A, &mut q), Err(DnsError::BadName), "{bad:?}");
        }
    }

    /// A valid answer with more records than are kept (a TCP answer can
    /// hold thousands) gives the first ones' addresses, not an error; a
    /// record of another type among them takes no place.
    #[test]
    fn an_answer_with_more_records_than_are_kept_gives_the_first_ones() {
        let mut r = Reply::to(5, "big.test", TYPE_A, 0, 400);
        for i in 0..300u16 {
            r = r.record(TYPE_A, 60, &[10, 0, (i >> 8) as u8, i as u8]);
        }
        for _ in 0..100 {
            r = r.record(TYPE_AAAA, 60, &[0; 16]);
        }
        let answer = parse_answer(&r.bytes, 5, "big.test", TYPE_A).unwrap();
        assert_eq!(answer.ips.len(), MAX_RECORDS);
        assert_eq!(answer.ips[0], v4([10, 0, 0, 0]));
    }

    #[test]
    fn addresses_and_the_shortest_ttl() {
        let r = Reply::to(7, "api.test", TYPE_A, 0, 2).record(TYPE_A, 300, &[10, 0, 0, 1]).record(
            TYPE_A,
            60,
            &[10, 0, 0, 2],
        );
        let answer = parse_answer(&r.bytes, 7, "API.test", TYPE_A).unwrap();
        assert_eq!(answer, Answer { ips: vec![v4([10, 0, 0, 1]), v4([10, 0, 0, 2])], ttl_s: Some(60) });
        let six = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let r = Reply::to(8, "api.test", TYPE_AAAA, 0, 1).record(TYPE_AAAA, 30, &six);
        let answer = parse_answer(&r.bytes, 8, "api.test", TYPE_AAAA).unwrap();
        assert_eq!(answer.ips, vec![IpAddr::from(six)]);
    }

    #[test]
    fn a_cname_chain_is_followed_and_its_ttl_counts() {
        // api.test CNAME edge.test (written out), edge.test A 10.0.0.3.
        let target = wire_name("edge.test");
        let mut r = Reply::to(9, "api.test", TYPE_A, 0, 2).record(TYPE_CNAME, 20, &target);
        r.bytes.extend_from_slice(&target);
        let r = r.raw_record(TYPE_A, 100, &[10, 0, 0, 3]);
        let answer = parse_answer(&r.bytes, 9, "api.test", TYPE_A).unwrap();
        assert_eq!(answer, Answer { ips: vec![v4([10, 0, 0, 3])], ttl_s: Some(20) });
    }

    /// `api.test` CNAME `c0.test` … CNAME `c{links-1}.test`, which has an A record.
    fn chain(links: usize) -> Reply {
        let name = |i: usize| wire_name(&format!("c{i}.test"));
        let mut r = Reply::to(9, "api.test", TYPE_A, 0, links as u16 + 1).record(TYPE_CNAME, 20, &name(0));
        for i in 1..links {
            r.bytes.extend_from_slice(&name(i - 1));
            r = r.raw_record(TYPE_CNAME, 20, &name(i));
        }
        r.bytes.extend_from_slice(&name(links - 1));
        r.raw_record(TYPE_A, 100, &[10, 0, 0, 4])
    }

    #[test]
    fn a_cname_chain_of_at_most_eight_links_is_followed() {
        for links in 1..=MAX_CNAMES {
            let answer = parse_answer(&chain(links).bytes, 9, "api.test", TYPE_A);
            assert_eq!(answer.map(|a| a.ips), Ok(vec![v4([10, 0, 0, 4])]), "{links} links");
        }
        let nine = parse_answer(&chain(MAX_CNAMES + 1).bytes, 9, "api.test", TYPE_A);
        assert_eq!(nine, Err(DnsError::Malformed("a CNAME chain longer than 8 links")));
    }

    #[test]
    fn a_cname_to_itself_is_refused() {
        let r = Reply::to(9, "api.test", TYPE_A, 0, 1).record(TYPE_CNAME, 20, &[0xC0, 12]);
        assert!(matches!(parse_answer(&r.bytes, 9, "api.test", TYPE_A), Err(DnsError::Malformed(_))));
    }

    #[test]
    fn error_codes_truncation_and_other_queries() {
        let r = Reply::to(1, "nowhere.test", TYPE_A, 3, 0);
        assert_eq!(parse_answer(&r.bytes, 1, "nowhere.test", TYPE_A), Err(DnsError::NxDomain));
        let r = Reply::to(1, "api.test", TYPE_A, 2, 0);
        assert_eq!(parse_answer(&r.bytes, 1, "api.test", TYPE_A), Err(DnsError::Rcode(2)));
        let mut r = Reply::to(1, "api.test", TYPE_A, 0, 0);
        r.bytes[2] |= 0x02;
        assert_eq!(parse_answer(&r.bytes, 1, "api.test", TYPE_A), Err(DnsError::Truncated));
        let r = Reply::to(1, "api.test", TYPE_A, 0, 1).record(TYPE_A, 5, &[10, 0, 0, 1]);
        assert_eq!(parse_answer(&r.bytes, 2, "api.test", TYPE_A), Err(DnsError::NotOurs), "another id");
        assert_eq!(parse_answer(&r.bytes, 1, "other.test", TYPE_A), Err(DnsError::NotOurs), "another name");
        assert_eq!(parse_answer(&r.bytes, 1, "api.test", TYPE_AAAA), Err(DnsError::NotOurs), "another type");
        let mut query = Vec::new();
        write_query(1, "api.test", TYPE_A, &mut query).unwrap();
        assert_eq!(parse_answer(&query, 1, "api.test", TYPE_A), Err(DnsError::NotOurs), "a query, not an answer");
    }

    #[test]
    fn a_name_without_addresses_of_the_type_is_an_empty_answer() {
        let r = Reply::to(4, "api.test", TYPE_AAAA, 0, 1).record(TYPE_A, 5, &[10, 0, 0, 1]);
        assert_eq!(parse_answer(&r.bytes, 4, "api.test", TYPE_AAAA), Ok(Answer::default()));
        // Records of other names are not taken for ours.
        let mut r = Reply::to(4, "api.test", TYPE_A, 0, 1);
        r.bytes.extend_from_slice(&wire_name("evil.test"));
        let r = r.raw_record(TYPE_A, 5, &[6, 6, 6, 6]);
        assert_eq!(parse_answer(&r.bytes, 4, "api.test", TYPE_A), Ok(Answer::default()));
    }

    #[test]
    fn compression_loops_end() {
        // The record's owner is a pointer to itself, then two pointing at each other.
        let mut r = Reply::to(5, "api.test", TYPE_A, 0, 1);
        let at = r.bytes.len() as u8;
        r.bytes.extend_from_slice(&[0xC0, at]);
        let r = r.raw_record(TYPE_A, 5, &[10, 0, 0, 1]);
        assert!(matches!(parse_answer(&r.bytes, 5, "api.test", TYPE_A), Err(DnsError::Malformed(_))));
        let mut r = Reply::to(5, "api.test", TYPE_A, 0, 1);
        let at = r.bytes.len() as u8;
        r.bytes.extend_from_slice(&[0xC0, at + 2, 0xC0, at]);
        assert!(matches!(parse_answer(&r.bytes, 5, "api.test", TYPE_A), Err(DnsError::Malformed(_))));
    }

    /// An answer whose A record's owner is `labels` 63-byte labels, each a
    /// pointer on to the one before, the first to the question's name. The
    /// labels sit in the data of a record of another type before it.
    fn chained_owner(labels: usize) -> Vec<u8> {
        let r = Reply::to(5, "api.test", TYPE_A, 0, 2);
        // The first record's data starts after its 2-byte owner and 10 bytes of fields.
        let data_at = r.bytes.len() + 12;
        let mut data = Vec::new();
        let mut prev = 12u8;
        for _ in 0..labels {
            let at = (data_at + data.len()) as u8;
            data.push(63);
            data.extend_from_slice(&[b'x'; 63]);
            data.extend_from_slice(&[0xC0, prev]);
            prev = at;
        }
        let mut r = r.record(99, 5, &data);
        r.bytes.extend_from_slice(&[0xC0, prev]);
        r.raw_record(TYPE_A, 5, &[10, 0, 0, 1]).bytes
    }

    #[test]
    fn an_overlong_name_through_pointers_is_refused() {
        // 3 × 64 bytes + the question's 10 is a legal, if odd, name (not ours).
        assert_eq!(parse_answer(&chained_owner(3), 5, "api.test", TYPE_A), Ok(Answer::default()));
        // 4 × 64 + 10 is over 255.
        assert!(matches!(parse_answer(&chained_owner(4), 5, "api.test", TYPE_A), Err(DnsError::Malformed(_))));
    }

    /// Every prefix of a good answer, and every single-byte change of it,
    /// parses to a result or an error: never a panic, never an address that
    /// was not in the packet.
    #[test]
    fn truncated_and_garbled_packets_never_panic() {
        let good = Reply::to(0x1234, "api.test", TYPE_A, 0, 2)
            .record(TYPE_CNAME, 30, &[0xC0, 12])
            .record(TYPE_A, 30, &[10, 0, 0, 1])
            .bytes;
        for cut in 0..good.len() {
            let r = parse_answer(&good[..cut], 0x1234, "api.test", TYPE_A);
            assert!(r.is_err(), "a packet cut at {cut} parsed: {r:?}");
        }
        let mut packet = good.clone();
        for at in 0..good.len() {
            for value in [0x00, 0x01, 0x3F, 0x40, 0x80, 0xC0, 0xC1, 0xFF, good[at] ^ 0x55] {
                packet[at] = value;
                if let Ok(answer) = parse_answer(&packet, 0x1234, "api.test", TYPE_A) {
                    assert!(answer.ips.iter().all(|ip| packet.windows(4).any(|w| *ip == v4([w[0], w[1], w[2], w[3]]))));
                }
            }
            packet[at] = good[at];
        }
        // Pseudo-random garbage of every length up to a datagram.
        let mut state = 0x9E37_79B9_u32;
        for len in 0..=MAX_UDP_ANSWER {
            let garbage: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                })
                .collect();
            let _ = parse_answer(&garbage, 0x1234, "api.test", TYPE_A);
            let _ = packet_id(&garbage);
        }
    }
}
