//! HTTP/1.1 byte work: parsing request heads and chunked bodies, writing
//! responses. Pure: no sockets, no clock, no governor.

pub mod chunked;
pub mod request;
pub mod response;

/// A header value without surrounding optional white space.
pub fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &v[start..end]
}
