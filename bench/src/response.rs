//! Framing of HTTP/1.1 responses read by the load tool, and the one field of a
//! grant it needs (`slotId`); and, for the `--redis` comparison, framing of
//! the few RESP replies a semaphore script and `ZREM` give.
//!
//! Pure functions over a byte slice: no I/O, no allocation, so the event loop can
//! call them on every readable event and the tests can feed split and pipelined
//! bytes directly. Only what a client needs to find the end of a response is
//! checked; semantic validation of bodies is the server tests' job.

use std::ops::Range;

/// Heads larger than this are treated as a broken server rather than buffered.
pub const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 48;

/// A complete response at the start of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Body bytes as sent; for a chunked body this still includes the chunk
    /// framing, which is harmless for the byte search done on it.
    pub body: Range<usize>,
    /// Bytes this response occupies; the next pipelined one starts here.
    pub len: usize,
    /// The server will close the connection after this response.
    pub close: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Complete(Response),
    /// More bytes are needed.
    Partial,
    /// Neither length nor chunking: the body runs until the server closes.
    UntilClose {
        status: u16,
        body_start: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    Head,
    HeadTooLarge,
    ContentLength,
    Chunk,
    Resp,
}

/// Finds the first response in `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, ParseError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let head_len = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(ParseError::HeadTooLarge),
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(_) => return Err(ParseError::Head),
    };
    let status = res.code.ok_or(ParseError::Head)?;
    let mut close = res.version == Some(0);
    let mut length: Option<usize> = None;
    let mut chunked = false;
    for h in res.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = decimal(h.value).ok_or(ParseError::ContentLength)?;
            if length.is_some_and(|m| m != n) {
                return Err(ParseError::ContentLength);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = has_token(h.value, b"chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            if has_token(h.value, b"close") {
                close = true;
            } else if has_token(h.value, b"keep-alive") {
                close = false;
            }
        }
    }
    // 1xx, 204 and 304 never carry a body, whatever the headers say.
    if status < 200 || status == 204 || status == 304 {
        return Ok(complete(status, head_len, head_len, close));
    }
    if chunked {
        return match chunked_end(buf, head_len)? {
            Some(end) => Ok(complete(status, head_len, end, close)),
            None => Ok(Parsed::Partial),
        };
    }
    match length {
        Some(n) if buf.len() - head_len >= n => Ok(complete(status, head_len, head_len + n, close)),
        Some(_) => Ok(Parsed::Partial),
        None => Ok(Parsed::UntilClose { status, body_start: head_len }),
    }
}

fn complete(status: u16, body_start: usize, end: usize, close: bool) -> Parsed {
    Parsed::Complete(Response { status, body: body_start..end, len: end, close })
}

fn decimal(v: &[u8]) -> Option<usize> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 15 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + usize::from(d - b'0')))
}

fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// End offset of a chunked body starting at `at`, `None` while incomplete.
fn chunked_end(buf: &[u8], mut at: usize) -> Result<Option<usize>, ParseError> {
    loop {
        let Some(eol) = find(&buf[at..], b"\r\n") else {
            return Ok(None);
        };
        let line = &buf[at..at + eol];
        let digits = line.split(|&b| b == b';').next().unwrap_or(line).trim_ascii();
        if digits.is_empty() || digits.len() > 12 {
            return Err(ParseError::Chunk);
        }
        let mut size = 0usize;
        for &d in digits {
            let v = (d as char).to_digit(16).ok_or(ParseError::Chunk)?;
            size = size * 16 + v as usize;
        }
        at += eol + 2;
        if size == 0 {
            // Trailer fields, then an empty line.
            loop {
                let Some(eol) = find(&buf[at..], b"\r\n") else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some(at));
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(ParseError::Chunk);
        }
        at += size + 2;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Frames one RESP reply and maps it onto the HTTP status the rest of the tool
/// counts: an integer or string is a grant or a done release (200, the body
/// being the value, so a holder id reads like a slot id), a nil is "the
/// semaphore is full" (429), an error is 500. Arrays are never asked for.
pub fn parse_resp(buf: &[u8]) -> Result<Parsed, ParseError> {
    let Some(eol) = find(buf, b"\r\n") else {
        return if buf.len() > MAX_HEAD { Err(ParseError::Resp) } else { Ok(Parsed::Partial) };
    };
    let line = 1..eol;
    let reply = |status, body: Range<usize>, len| Ok(complete_range(status, body, len));
    match buf.first() {
        Some(b':') | Some(b'+') => reply(200, line, eol + 2),
        Some(b'-') => reply(500, line, eol + 2),
        Some(b'_') => reply(429, eol..eol, eol + 2),
        Some(b'$') if &buf[line.clone()] == b"-1" => reply(429, eol..eol, eol + 2),
        Some(b'$') => {
            let n = decimal(&buf[line]).ok_or(ParseError::Resp)?;
            let start = eol + 2;
            if buf.len() < start + n + 2 {
                return Ok(Parsed::Partial);
            }
            if &buf[start + n..start + n + 2] != b"\r\n" {
                return Err(ParseError::Resp);
            }
            reply(200, start..start + n, start + n + 2)
        }
        _ => Err(ParseError::Resp),
    }
}

fn complete_range(status: u16, body: Range<usize>, len: usize) -> Parsed {
    Parsed::Complete(Response { status, body, len, close: false })
}

/// A Redis holder id used as the slot id: the reply's value as it came.
pub fn redis_id(body: &[u8]) -> Option<&[u8]> {
    let url_safe = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':');
    (!body.is_empty() && body.iter().all(url_safe)).then_some(body)
}

/// The value of `"slotId"` in a grant body. A byte search instead of a JSON
/// parse keeps the acquire path allocation-free; slot ids are URL-safe by
/// contract, so they never contain an escaped quote.
pub fn slot_id(body: &[u8]) -> Option<&[u8]> {
    const NAME: &[u8] = b"\"slotId\"";
    let after = find(body, NAME)? + NAME.len();
    let rest = body[after..].trim_ascii_start();
    let rest = rest.strip_prefix(b":")?.trim_ascii_start();
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let id = &rest[..end];
    let url_safe = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
    (!id.is_empty() && id.iter().all(url_safe)).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRANT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 93\r\n\r\n{\"slotId\":\"abc\",\"leaseDeadline\":1,\"requestDeadline\":2,\"termMs\":30000,\"renewIntervalMs\":10000}";

    fn done(buf: &[u8]) -> Response {
        match parse(buf) {
            Ok(Parsed::Complete(r)) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn grant_with_length() {
        let r = done(GRANT);
        assert_eq!(r.status, 200);
        assert_eq!(r.len, GRANT.len());
        assert!(!r.close);
        assert_eq!(slot_id(&GRANT[r.body]), Some(&b"abc"[..]));
    }

    #[test]
    fn every_split_point_is_partial_until_the_last_byte() {
        for cut in 0..GRANT.len() {
            assert_eq!(parse(&GRANT[..cut]), Ok(Parsed::Partial), "cut at {cut}");
        }
    }

    #[test]
    fn pipelined_responses_are_framed_one_at_a_time() {
        let mut two = GRANT.to_vec();
        two.extend_from_slice(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}");
        let first = done(&two);
        assert_eq!(first.len, GRANT.len());
        let second = done(&two[first.len..]);
        assert_eq!(second.status, 429);
        assert_eq!(second.len, two.len() - GRANT.len());
    }

    #[test]
    fn connection_close_and_http10() {
        assert!(done(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").close);
        assert!(done(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").close);
        let kept = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n";
        assert!(!done(kept).close);
    }

    #[test]
    fn chunked_body() {
        let buf = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\n{\"slo\r\n9\r\ntId\":\"ab\"\r\n1\r\n}\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let r = done(buf);
        assert_eq!(r.len, buf.len() - 4);
        assert_eq!(parse(&buf[..buf.len() - 7]), Ok(Parsed::Partial));
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), Err(ParseError::Chunk));
    }

    #[test]
    fn bodiless_statuses_and_until_close() {
        let r = done(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(r.body.len(), 0);
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\n\r\nabc"), Ok(Parsed::UntilClose { status: 200, body_start: 19 }));
    }

    #[test]
    fn broken_framing_is_an_error() {
        assert_eq!(parse(b"HTTP/1.1 2x0 OK\r\n\r\n"), Err(ParseError::Head));
        assert_eq!(parse(b"garbage\r\n\r\n"), Err(ParseError::Head));
        let two_lengths = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(parse(two_lengths), Err(ParseError::ContentLength));
        let bad = b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n";
        assert_eq!(parse(bad), Err(ParseError::ContentLength));
        let mut huge = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        huge.resize(MAX_HEAD + 1, b'a');
        assert_eq!(parse(&huge), Err(ParseError::HeadTooLarge));
    }

    #[test]
    fn resp_replies() {
        let done = |buf: &[u8]| match parse_resp(buf) {
            Ok(Parsed::Complete(r)) => (r.status, buf[r.body].to_vec(), r.len),
            other => panic!("{other:?}"),
        };
        assert_eq!(done(b":42\r\n:1\r\n"), (200, b"42".to_vec(), 5));
        assert_eq!(done(b"$-1\r\n"), (429, Vec::new(), 5));
        assert_eq!(done(b"_\r\n"), (429, Vec::new(), 3));
        assert_eq!(done(b"$3\r\nabc\r\n"), (200, b"abc".to_vec(), 9));
        assert_eq!(done(b"-NOSCRIPT No matching script\r\n").0, 500);
        for cut in 0..9 {
            assert_eq!(parse_resp(&b"$3\r\nabc\r\n"[..cut]), Ok(Parsed::Partial), "cut at {cut}");
        }
        assert_eq!(parse_resp(b"*1\r\n"), Err(ParseError::Resp));
        assert_eq!(parse_resp(b"$3\r\nabcd\r\n"), Err(ParseError::Resp));
        assert_eq!(redis_id(b"17"), Some(&b"17"[..]));
        assert_eq!(redis_id(b""), None);
    }

    #[test]
    fn slot_id_search() {
        assert_eq!(slot_id(b"{ \"slotId\" : \"A-b_9\" }"), Some(&b"A-b_9"[..]));
        assert_eq!(slot_id(b"{\"termMs\":1,\"slotId\":\"x\"}"), Some(&b"x"[..]));
        assert_eq!(slot_id(b"{\"slotId\":\"\"}"), None);
        assert_eq!(slot_id(b"{\"slotId\":12}"), None);
        assert_eq!(slot_id(b"{\"slotId\":\"a/b\"}"), None);
        assert_eq!(slot_id(b"{\"slotId\":\"abc"), None);
        assert_eq!(slot_id(b"{\"error\":\"too_many_requests\"}"), None);
    }
}
