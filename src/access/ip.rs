//! Client addresses: CIDR rules for `ipAllow` / `trustedProxies`, and finding the
//! real client behind trusted proxies (SPEC §8).
//!
//! Pure functions over parsed addresses; this module never reads a socket. Every
//! address and rule is held in one IPv6 space, IPv4 ones as IPv4-mapped
//! (`::ffff:a.b.c.d`), so a dual-stack listener that reports IPv4 peers as mapped
//! IPv6 matches IPv4 rules with no special case. A consequence worth knowing: an
//! IPv6 rule that covers `::ffff:0:0/96` (such as `::/0`) also matches IPv4 peers.
//!
//! Parsing decisions:
//! - A bare address is a host route (`/32` or `/128`).
//! - A prefix is 1–3 ASCII digits, at most 32 for IPv4 and 128 for IPv6.
//! - Host bits below the prefix are accepted and masked off (`10.1.2.3/8` is
//!   `10.0.0.0/8`), as most firewalls and proxies do.
//! - Whitespace, zone ids (`fe80::1%eth0`) and anything else are rejected.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// One CIDR rule, normalised into the IPv6 space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: u128,
    mask: u128,
}

/// A rule that could not be parsed; names the offending text for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrError {
    text: String,
    why: &'static str,
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.text, self.why)
    }
}

impl std::error::Error for CidrError {}

/// Bits an IPv4 prefix length is offset by once placed inside `::ffff:0:0/96`.
const MAPPED_PREFIX: u32 = 96;

fn mask_of(prefix: u32) -> u128 {
    debug_assert!(prefix <= 128);
    // `u128::MAX << 128` would overflow, hence the explicit /0 case.
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    }
}

/// The address in the single IPv6 space every rule lives in.
fn as_v6_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl Cidr {
    /// Parses `addr` or `addr/prefix` (IPv4 or IPv6).
    pub fn parse(text: &str) -> Result<Cidr, CidrError> {
        let fail = |why| CidrError { text: text.to_owned(), why };
        let (addr_text, prefix_text) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr = IpAddr::from_str(addr_text).map_err(|_| fail("not an IP address"))?;
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let prefix = match prefix_text {
            None => max,
            Some(p) => {
                // `u32::from_str` would accept "+8"; a rule is plain digits.
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(fail("the prefix length must be decimal digits"));
                }
                let n: u32 = p.parse().map_err(|_| fail("bad prefix length"))?;
                if n > max {
                    return Err(fail(if max == 32 {
                        "an IPv4 prefix length is at most 32"
                    } else {
                        "an IPv6 prefix length is at most 128"
                    }));
                }
                n
            }
        };
        let prefix = match addr {
            IpAddr::V4(_) => MAPPED_PREFIX + prefix,
            IpAddr::V6(_) => prefix,
        };
        let mask = mask_of(prefix);
        Ok(Cidr { network: as_v6_bits(addr) & mask, mask })
    }

    /// Whether `ip` lies inside this rule.
    pub fn contains(&self, ip: IpAddr) -> bool {
        as_v6_bits(ip) & self.mask == self.network
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        Cidr::parse(s)
    }
}

/// A list of CIDR rules; an address matches if any rule contains it.
///
/// A linear scan: `ipAllow` and `trustedProxies` lists are a handful of entries,
/// where a scan over a contiguous `Vec` beats any tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CidrSet {
    rules: Vec<Cidr>,
}

impl CidrSet {
    /// An empty set, which contains nothing.
    pub fn new() -> CidrSet {
        CidrSet::default()
    }

    /// Parses every rule; the first bad one is the error.
    pub fn parse<I, S>(rules: I) -> Result<CidrSet, CidrError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let rules = rules.into_iter().map(|r| Cidr::parse(r.as_ref())).collect::<Result<Vec<_>, _>>()?;
        Ok(CidrSet { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = as_v6_bits(ip);
        self.rules.iter().any(|r| bits & r.mask == r.network)
    }
}

/// The client of a request whose trusted proxy named no address for it in
/// `X-Forwarded-For` (`unknown`, an obfuscated name, garbage): no socket
/// peer is ever the unspecified address, so it stands for "not known" (logs
/// show `0.0.0.0`) and `ipAllow` refuses it.
pub const UNKNOWN_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// The address the access policies judge: the socket peer, or, when the peer is
/// a trusted proxy, the right-most `X-Forwarded-For` entry that is not itself a
/// trusted proxy.
///
/// `newest_first` is every `X-Forwarded-For` header value, the last one to
/// arrive first; together they form one comma-separated list, newest hop last. Each
/// trusted hop appended the address it saw, so walking from the right and
/// stopping at the first untrusted entry yields the last address a trusted party
/// vouched for; anything further left was written by the client and is ignored.
/// An unparseable entry (`unknown`, garbage, an empty element) stops the walk:
/// the client is then `UNKNOWN_CLIENT`, which no `ipAllow` admits (the proxy
/// that wrote the entry is not the client, and nothing left of it can be
/// trusted). When every entry is a trusted proxy, the left-most one is the answer.
///
/// The result is canonical: an IPv4-mapped IPv6 address comes back as IPv4, so
/// logs show `10.0.0.1`, not `::ffff:10.0.0.1`.
pub fn client_addr<'a>(peer: IpAddr, newest_first: impl Iterator<Item = &'a [u8]>, trusted: &CidrSet) -> IpAddr {
    let mut addr = peer.to_canonical();
    if !trusted.contains(addr) {
        return addr;
    }
    for value in newest_first {
        for entry in value.rsplit(|&b| b == b',') {
            match parse_forwarded_entry(entry) {
                Some(ip) => {
                    addr = ip.to_canonical();
                    if !trusted.contains(addr) {
                        return addr;
                    }
                }
                None => return UNKNOWN_CLIENT,
            }
        }
    }
    addr
}

/// One `X-Forwarded-For` element: an address, optionally with a port
/// (`1.2.3.4:80`, `[::1]:80`) or IPv6 brackets (`[::1]`), as some proxies write.
fn parse_forwarded_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?.trim_matches([' ', '\t']);
    if let Ok(ip) = IpAddr::from_str(text) {
        return Some(ip);
    }
    if let Ok(sock) = SocketAddr::from_str(text) {
        return Some(sock.ip());
    }
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    Ipv6Addr::from_str(inner).ok().map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `client_addr` over header values given in the order they arrived.
    fn client_addr(peer: IpAddr, in_order: &[&[u8]], trusted: &CidrSet) -> IpAddr {
        super::client_addr(peer, in_order.iter().rev().copied(), trusted)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn set(rules: &[&str]) -> CidrSet {
        CidrSet::parse(rules).unwrap()
    }

    #[test]
    fn ipv4_rules() {
        let s = set(&["10.0.0.0/8", "192.168.1.7"]);
        assert!(s.contains(ip("10.0.0.1")));
        assert!(s.contains(ip("10.255.255.255")));
        assert!(!s.contains(ip("11.0.0.0")));
        assert!(s.contains(ip("192.168.1.7")));
        assert!(!s.contains(ip("192.168.1.8")));
        assert!(!s.contains(ip("::1")));
    }

    #[test]
    fn ipv6_rules() {
        let s = set(&["::1/128", "2001:db8::/32"]);
        assert!(s.contains(ip("::1")));
        assert!(!s.contains(ip("::2")));
        assert!(s.contains(ip("2001:db8:ffff::1")));
        assert!(!s.contains(ip("2001:db9::1")));
        assert!(!s.contains(ip("127.0.0.1")));
    }

    #[test]
    fn mapped_peer_matches_ipv4_rules() {
        let s = set(&["10.0.0.0/8"]);
        assert!(s.contains(ip("::ffff:10.1.2.3")));
        assert!(!s.contains(ip("::ffff:11.1.2.3")));
        // A mapped rule also matches a native IPv4 peer.
        let m = set(&["::ffff:10.0.0.0/104"]);
        assert!(m.contains(ip("10.9.9.9")));
        assert!(!m.contains(ip("11.9.9.9")));
    }

    #[test]
    fn zero_prefixes() {
        let any4 = set(&["0.0.0.0/0"]);
        assert!(any4.contains(ip("203.0.113.5")));
        assert!(any4.contains(ip("::ffff:203.0.113.5")));
        assert!(!any4.contains(ip("2001:db8::1")));
        let any6 = set(&["::/0"]);
        assert!(any6.contains(ip("2001:db8::1")));
    }

    #[test]
    fn host_bits_are_masked() {
        assert_eq!(Cidr::parse("10.1.2.3/8").unwrap(), Cidr::parse("10.0.0.0/8").unwrap());
        assert_eq!(Cidr::parse("2001:db8::1/32").unwrap(), Cidr::parse("2001:db8::/32").unwrap());
    }

    #[test]
    fn bad_rules_are_rejected() {
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/0008",
            "10.0.0/8",
            "10.0.0.0 /8",
            " 10.0.0.0/8",
            "fe80::1%eth0",
            "example.com",
            "10.0.0.0/8/8",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        let err = CidrSet::parse(["10.0.0.0/8", "1.2.3.4/40"]).unwrap_err();
        assert!(err.to_string().contains("1.2.3.4/40"));
    }

    #[test]
    fn untrusted_peer_ignores_forged_header() {
        let trusted = set(&["10.0.0.0/8"]);
        let got = client_addr(ip("203.0.113.9"), &[b"1.1.1.1"], &trusted);
        assert_eq!(got, ip("203.0.113.9"));
        // No trusted proxies at all: the header is never read.
        let got = client_addr(ip("10.0.0.2"), &[b"1.1.1.1"], &CidrSet::new());
        assert_eq!(got, ip("10.0.0.2"));
    }

    #[test]
    fn trusted_peer_yields_rightmost_untrusted_entry() {
        let trusted = set(&["10.0.0.0/8", "::1"]);
        // The client forged "6.6.6.6"; the outer proxy appended the real address.
        let got = client_addr(ip("10.0.0.2"), &[b"6.6.6.6, 198.51.100.4, 10.0.0.7"], &trusted);
        assert_eq!(got, ip("198.51.100.4"));
        // The same list split over several header lines, read newest last.
        let got = client_addr(ip("::1"), &[b"6.6.6.6", b"198.51.100.4,10.0.0.7"], &trusted);
        assert_eq!(got, ip("198.51.100.4"));
    }

    #[test]
    fn trusted_peer_without_header_is_the_peer() {
        let trusted = set(&["10.0.0.0/8"]);
        assert_eq!(client_addr(ip("10.0.0.2"), &[], &trusted), ip("10.0.0.2"));
    }

    #[test]
    fn all_trusted_yields_leftmost() {
        let trusted = set(&["10.0.0.0/8"]);
        let got = client_addr(ip("10.0.0.2"), &[b"10.0.0.9, 10.0.0.8"], &trusted);
        assert_eq!(got, ip("10.0.0.9"));
    }

    #[test]
    fn an_unparseable_entry_makes_the_client_unknown() {
        let trusted = set(&["10.0.0.0/8"]);
        for value in
            [&b"1.1.1.1, unknown, 10.0.0.5"[..], b"1.1.1.1,,", b"1.1.1.1, \xff", b"garbage", b"garbage, 10.0.0.5"]
        {
            assert_eq!(client_addr(ip("10.0.0.2"), &[value], &trusted), UNKNOWN_CLIENT, "{value:?}");
        }
        // Left of the first untrusted address nothing is read, parseable or not.
        assert_eq!(client_addr(ip("10.0.0.2"), &[b"unknown, 1.1.1.1, 10.0.0.5"], &trusted), ip("1.1.1.1"));
        // An untrusted peer's header is not read at all.
        assert_eq!(client_addr(ip("1.1.1.1"), &[b"unknown"], &trusted), ip("1.1.1.1"));
    }

    #[test]
    fn forwarded_entries_with_ports_and_brackets() {
        let trusted = set(&["10.0.0.0/8"]);
        let peer = ip("10.0.0.2");
        assert_eq!(client_addr(peer, &[b"198.51.100.4:5555"], &trusted), ip("198.51.100.4"));
        assert_eq!(client_addr(peer, &[b"[2001:db8::7]:443"], &trusted), ip("2001:db8::7"));
        assert_eq!(client_addr(peer, &[b"[2001:db8::7]"], &trusted), ip("2001:db8::7"));
        assert_eq!(client_addr(peer, &[b"\t2001:db8::8 "], &trusted), ip("2001:db8::8"));
    }

    #[test]
    fn mapped_addresses_come_back_canonical() {
        let trusted = set(&["10.0.0.0/8"]);
        assert_eq!(client_addr(ip("::ffff:203.0.113.1"), &[], &trusted), ip("203.0.113.1"));
        // A mapped trusted proxy is recognised, and a mapped entry is reported as IPv4.
        let got = client_addr(ip("::ffff:10.0.0.2"), &[b"::ffff:198.51.100.4"], &trusted);
        assert_eq!(got, ip("198.51.100.4"));
    }
}
