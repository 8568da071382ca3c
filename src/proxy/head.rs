//! The heads of a proxied exchange: the request head the upstream is sent
//! and the response head the client gets. Pure byte work.
//!
//! Toward the upstream: the method, path and query as the client sent them;
//! every header but the client's pool credentials, `X-Nthpool-*`, the
//! hop-by-hop fields (RFC 9110 §7.6.1, and those `Connection` names) and the
//! framing fields; then `Host` of the upstream, this server's `Via` entry, the
//! configured `setHeaders` (replacing client fields of the same name) and
//! framing this server chose.
//! Toward the client: the upstream's status and fields less the hop-by-hop
//! and framing ones, the framing chosen for the client, the governor headers.

use crate::api::proxy::CredentialFields;
use crate::config::upstream::Upstream;
use crate::governor::RateInfo;
use crate::http::request::{parse_content_length, Head};
use crate::http::target::implied_slash;
use crate::http::trim;
use crate::report::ratelimit;

/// Past this many bytes without a complete response head the upstream is answered 502.
pub const MAX_RESPONSE_HEAD: usize = 32 * 1024;
const MAX_RESPONSE_HEADERS: usize = 128;

/// Fields that describe one connection, never forwarded (RFC 9110 §7.6.1),
/// with every `Proxy-*` field (`is_hop_by_hop`): `Proxy-Authorization` and
/// the like are for a proxy on the way, and names such as `Proxy-Client-IP`
/// are trusted by some upstreams, so a client must not set them.
const HOP_BY_HOP: [&str; 6] = ["connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"];

/// This server's `Via` entry (RFC 9110 §7.6.3), by the protocol version
/// the client's request came in.
const VIA_1_1: &[u8] = b"Via: 1.1 nthpool\r\n";
const VIA_1_0: &[u8] = b"Via: 1.0 nthpool\r\n";

/// How the request body goes to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody {
    None,
    Length(u64),
    Chunked,
}

fn is_hop_by_hop(name: &[u8]) -> bool {
    (name.len() > 6 && name[..6].eq_ignore_ascii_case(b"proxy-"))
        || HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// `X-Nthpool-*`: this server's own fields, never passed between client and
/// upstream, in the `_` spelling too (`X_Nthpool_Limit`: a client or an
/// upstream that maps names to variables takes it for the real one).
fn is_nthpool_field(name: &[u8]) -> bool {
    name.len() >= 10 && same_but_dashes(&name[..10], b"x-nthpool-")
}

/// The values of a head's `Connection` fields, gathered once so each other
/// field is checked against them without walking the head again.
struct ConnectionTokens<'h> {
    values: [&'h [u8]; 4],
    len: usize,
    /// More `Connection` fields than `values` holds: ask `fields` again.
    overflow: bool,
}

impl<'h> ConnectionTokens<'h> {
    fn of(fields: impl IntoIterator<Item = (&'h [u8], &'h [u8])>) -> ConnectionTokens<'h> {
        let mut t = ConnectionTokens { values: [&[]; 4], len: 0, overflow: false };
        for (name, value) in fields {
            if name.eq_ignore_ascii_case(b"connection") {
                match t.values.get_mut(t.len) {
                    Some(slot) => {
                        *slot = value;
                        t.len += 1;
                    }
                    None => t.overflow = true,
                }
            }
        }
        t
    }

    /// Whether a `Connection` field lists `name` (`fields` as given to `of`).
    fn lists(&self, name: &[u8], fields: impl IntoIterator<Item = (&'h [u8], &'h [u8])>) -> bool {
        let listed = |value: &[u8]| value.split(|&b| b == b',').any(|token| trim(token).eq_ignore_ascii_case(name));
        if self.overflow {
            return fields.into_iter().any(|(n, v)| n.eq_ignore_ascii_case(b"connection") && listed(v));
        }
        self.values[..self.len].iter().any(|v| listed(v))
    }
}

/// `OPTIONS http://host`, an absolute-form target with neither path nor
/// query, asks about the server as `OPTIONS *` does, and the last proxy
/// sends it on as `*` (RFC 9112 §3.2.4). Only such a target has for its
/// path the scheme's own `/`, just before the authority that is its `host`
/// (`http::target::target_parts`): any other path lies after the authority,
/// or in the request line apart from a `Host` field. Read here, the proxy's
/// path, the lock path pays nothing for it.
fn asks_about_the_server(head: &Head) -> bool {
    head.method_name == "OPTIONS"
        && head.path == b"/"
        && head.host.is_some_and(|host| host.as_ptr() as usize == head.path.as_ptr() as usize + 1)
}

/// Writes the upstream request head for `head`.
pub fn write_request(out: &mut Vec<u8>, head: &Head, upstream: &Upstream, creds: CredentialFields, body: RequestBody) {
    out.extend_from_slice(head.method_name.as_bytes());
    out.push(b' ');
    if asks_about_the_server(head) {
        out.push(b'*');
    } else {
        out.extend_from_slice(implied_slash(head.path));
        out.extend_from_slice(head.path);
    }
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(&upstream.host);
    out.extend_from_slice(b"\r\n");
    let fields = || head.headers.map(|f| (f.name, f.value));
    let connection = ConnectionTokens::of(fields());
    let dropped = |name: &[u8]| {
        is_hop_by_hop(name)
            || name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"expect")
            || is_nthpool_field(name)
            || (creds.authorization && name.eq_ignore_ascii_case(b"authorization"))
            || (creds.api_key && name.eq_ignore_ascii_case(b"x-api-key"))
            || (creds.cf_access && name.eq_ignore_ascii_case(b"cf-access-jwt-assertion"))
            || upstream.set_headers.iter().any(|(n, _)| same_but_dashes(n.as_bytes(), name))
            || connection.lists(name, fields())
    };
    let mut spelled = [0u8; DASHED_MAX];
    let hops = hops_left(head);
    // `Content-Length: 0` has no body to frame, and goes up as sent.
    let mut client_length = false;
    for h in head.headers {
        let name = h.name;
        client_length |= name.eq_ignore_ascii_case(b"content-length");
        if dropped(name) || dashed(name, &mut spelled).is_some_and(dropped) {
            continue;
        }
        if creds.cf_access && name.eq_ignore_ascii_case(b"cookie") {
            push_cookie_without(out, name, h.value, CF_ACCESS_COOKIE);
        } else if let Some(n) = hops.filter(|_| name.eq_ignore_ascii_case(b"max-forwards")) {
            // One hop fewer (RFC 9110 §7.6.2); 0 was answered here, never relayed.
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            crate::http::response::push_u64(out, n - 1);
            out.extend_from_slice(b"\r\n");
        } else {
            push_field(out, name, h.value);
        }
    }
    // A gateway names itself in every request it forwards (RFC 9110 §7.6.3),
    // after any `Via` the client sent: a later field line extends the list.
    // A `setHeaders` entry for `Via` replaces the client's and this one.
    if !upstream.set_headers.iter().any(|(n, _)| same_but_dashes(n.as_bytes(), b"via")) {
        out.extend_from_slice(if head.http11 { VIA_1_1 } else { VIA_1_0 });
    }
    for (name, value) in &upstream.set_headers {
        push_field(out, name.as_bytes(), value.expose().as_bytes());
    }
    match body {
        RequestBody::None if client_length => out.extend_from_slice(b"Content-Length: 0\r\n"),
        RequestBody::None => {}
        RequestBody::Length(n) => {
            out.extend_from_slice(b"Content-Length: ");
            crate::http::response::push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        RequestBody::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// For an `OPTIONS` or `TRACE` request (the methods it applies to), the
/// hops its `Max-Forwards` allows: that field is relayed with one fewer.
fn hops_left(head: &Head) -> Option<u64> {
    let counted = head.method_name.eq_ignore_ascii_case("OPTIONS") || head.method_name.eq_ignore_ascii_case("TRACE");
    counted.then(|| head.max_forwards()).flatten().filter(|&n| n > 0)
}

/// The longest name `dashed` spells out; no field dropped on the way up is
/// longer (a `setHeaders` name past it is matched only as written).
const DASHED_MAX: usize = 128;

/// `name` with each `_` read as `-`, when it holds one: the field an
/// upstream that maps names to CGI-style variables (`HTTP_CONTENT_LENGTH`)
/// takes it for. A field dropped on the way up is dropped in that spelling
/// too (`Content_Length`, `X_Nthpool_Key`, a `setHeaders` name), so no
/// caller can pass one under the other.
fn dashed<'s>(name: &[u8], spelled: &'s mut [u8; DASHED_MAX]) -> Option<&'s [u8]> {
    if !name.contains(&b'_') || name.len() > DASHED_MAX {
        return None;
    }
    let spelled = &mut spelled[..name.len()];
    for (to, &b) in spelled.iter_mut().zip(name) {
        *to = if b == b'_' { b'-' } else { b };
    }
    Some(spelled)
}

/// Whether two field names are one when `_` is read as `-` (and case
/// ignored): a `setHeaders` name written with `_` replaces the client's
/// field in either spelling.
fn same_but_dashes(a: &[u8], b: &[u8]) -> bool {
    let fold = |c: u8| if c == b'_' { b'-' } else { c.to_ascii_lowercase() };
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| fold(x) == fold(y))
}

/// The cookie Cloudflare Access sets beside `Cf-Access-Jwt-Assertion`: the
/// same token, so a pool that checks Access keeps it from the upstream too.
const CF_ACCESS_COOKIE: &[u8] = b"CF_Authorization";

/// A `Cookie` field without the cookies named `drop` (cookie names are
/// case-sensitive, RFC 6265 §4.2.1); nothing at all when none is left.
fn push_cookie_without(out: &mut Vec<u8>, name: &[u8], value: &[u8], drop: &[u8]) {
    let kept = |pair: &&[u8]| {
        let pair = trim(pair);
        !pair.is_empty() && pair.split(|&b| b == b'=').next().map(trim) != Some(drop)
    };
    let mut pairs = value.split(|&b| b == b';').filter(kept).map(trim);
    let Some(first) = pairs.next() else {
        return;
    };
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(first);
    for pair in pairs {
        out.extend_from_slice(b"; ");
        out.extend_from_slice(pair);
    }
    out.extend_from_slice(b"\r\n");
}

fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// How a response body arrives from the upstream (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    None,
    Length(u64),
    Chunked,
    Close,
}

/// What the response head said, once it is complete.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead {
    pub status: u16,
    /// Bytes of the upstream input the head took.
    pub len: usize,
    pub body: ResponseBody,
    /// The upstream keeps the connection after this response.
    pub keep_alive: bool,
    /// The rate-limit fields, parsed as a release report's `headers` are.
    pub rate: RateInfo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseError {
    /// Not a response head this proxy can relay; the sentence says why
    /// (the client's `502` gives it).
    Invalid(&'static str),
}

const HEAD_TOO_LARGE: ResponseError =
    ResponseError::Invalid("The upstream's response head is larger than 32 KiB or has more than 128 fields.");

/// How the client gets the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientBody {
    /// No body (HEAD, 1xx, 204, 304): framing fields pass as they are, but for 1xx and 204.
    None,
    Length(u64),
    Chunked,
    /// To the close (HTTP/1.0 clients of an unframed or chunked body).
    Close,
}

/// What the client side of the exchange is.
#[derive(Debug, Clone, Copy)]
pub struct ClientSide {
    pub http11: bool,
    pub keep_alive: bool,
    pub head_request: bool,
}

/// Parses a response head at the start of `input`. `Ok(None)`: not complete yet.
/// On a final (or interim) head, the client's head is written to `out`
/// with `extra` (the governor headers) and the chosen `ClientBody`.
pub fn take_response(
    input: &[u8],
    client: ClientSide,
    extra: &[u8],
    now_epoch_ms: u64,
    out: &mut Vec<u8>,
) -> Result<Option<(ResponseHead, ClientBody)>, ResponseError> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut storage);
    let len = match resp.parse(input) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_RESPONSE_HEAD => n,
        Ok(httparse::Status::Complete(_)) => return Err(HEAD_TOO_LARGE),
        Ok(httparse::Status::Partial) if input.len() > MAX_RESPONSE_HEAD => return Err(HEAD_TOO_LARGE),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HEAD_TOO_LARGE),
        Err(_) => return Err(ResponseError::Invalid("The upstream's response head is malformed.")),
    };
    let status = resp.code.unwrap_or(0);
    let headers: &[httparse::Header] = resp.headers;
    let framing = FramingFields::read(headers)?;
    if !(100..=599).contains(&status) {
        return Err(ResponseError::Invalid("The upstream's status code is outside 100 to 599."));
    }
    if status == 101 {
        return Err(ResponseError::Invalid("The upstream switched protocols, which the proxy does not relay."));
    }
    let interim = status < 200;
    let body = framing.body(status, client.head_request);
    if framing.other_coding && body != ResponseBody::None && !(framing.chunked && client.http11) {
        // Unframed, or for an HTTP/1.0 client, which takes no transfer coding.
        return Err(ResponseError::Invalid(
            "The upstream's answer has a transfer coding other than chunked, which cannot be relayed to this client.",
        ));
    }
    let to_client = match body {
        ResponseBody::None => ClientBody::None,
        ResponseBody::Length(n) => ClientBody::Length(n),
        ResponseBody::Chunked | ResponseBody::Close if client.http11 => ClientBody::Chunked,
        ResponseBody::Chunked | ResponseBody::Close => ClientBody::Close,
    };
    if interim && !client.http11 {
        // An HTTP/1.0 client is not sent interim answers (RFC 9110 §15.2).
        let head = ResponseHead { status, len, body, keep_alive: true, rate: RateInfo::default() };
        return Ok(Some((head, to_client)));
    }
    // `gzip, chunked` to an HTTP/1.1 client: its `Transfer-Encoding` passes as it came.
    let codings_pass = framing.other_coding && body == ResponseBody::Chunked;
    write_client_head(out, &resp, ToClient { body: to_client, codings_pass, side: client }, extra);
    let rate = if interim {
        RateInfo::default()
    } else {
        let fields = headers.iter().filter_map(|h| Some((h.name, std::str::from_utf8(h.value).ok()?)));
        ratelimit::parse_headers(fields, now_epoch_ms)
    };
    // A head framed two ways (`Content-Length` beside `Transfer-Encoding`, or
    // `chunked` named twice) is relayed by its final coding, but RFC 9112
    // §6.3 calls it a sign of smuggling to be handled as an error: where the
    // upstream thinks its body ends is in doubt, so its connection is not
    // used again. So is an HTTP/1.0 answer with a `Transfer-Encoding`, which
    // that version does not have (RFC 9112 §6.1: its framing is faulty, and
    // the connection closes after it).
    let ambiguous =
        framing.codings > 0 && (framing.length.is_some() || resp.version == Some(0)) || framing.chunked_named > 1;
    // A final answer that has no body but announces one (a `204` or `304`
    // with a `Content-Length` above 0 or a transfer coding; a `HEAD`'s, kept
    // from reuse by the exchange anyway): a broken upstream that sends that
    // body after all, late, would have it read as the next request's answer.
    let announced =
        !interim && body == ResponseBody::None && (framing.length.is_some_and(|n| n > 0) || framing.codings > 0);
    let keep_alive = !framing.close && !ambiguous && !announced && (resp.version == Some(1) || framing.keep);
    Ok(Some((ResponseHead { status, len, body, keep_alive, rate }, to_client)))
}

/// What a response head's framing and connection fields say.
#[derive(Default)]
struct FramingFields {
    /// The last transfer coding is `chunked`.
    chunked: bool,
    /// A transfer coding other than `chunked` is named.
    other_coding: bool,
    /// Transfer codings named, and how many of them are `chunked`.
    codings: usize,
    chunked_named: usize,
    length: Option<u64>,
    /// `Connection: close`, and `keep-alive` (which an HTTP/1.0 upstream needs).
    close: bool,
    keep: bool,
}

impl FramingFields {
    fn read(headers: &[httparse::Header]) -> Result<FramingFields, ResponseError> {
        let mut f = FramingFields::default();
        for h in headers {
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                for coding in h.value.split(|&b| b == b',').map(trim).filter(|c| !c.is_empty()) {
                    // Only a final `chunked` frames the body; anything after it does not.
                    f.chunked = coding.eq_ignore_ascii_case(b"chunked");
                    f.other_coding |= !f.chunked;
                    f.codings += 1;
                    f.chunked_named += usize::from(f.chunked);
                }
            } else if h.name.eq_ignore_ascii_case("content-length") {
                // The rules a request's length is read by: a leading zero the
                // client might read otherwise is refused, not relayed.
                let n = parse_content_length(h.value)
                    .map_err(|_| ResponseError::Invalid("The upstream's Content-Length is not a valid length."))?;
                if f.length.is_some_and(|l| l != n) {
                    return Err(ResponseError::Invalid("The upstream sent two different Content-Lengths."));
                }
                f.length = Some(n);
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in h.value.split(|&b| b == b',').map(trim) {
                    f.close |= token.eq_ignore_ascii_case(b"close");
                    f.keep |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        Ok(f)
    }

    /// How the body of a `status` answer arrives (RFC 9112 §6.3).
    fn body(&self, status: u16, head_request: bool) -> ResponseBody {
        if status < 200 || head_request || status == 204 || status == 304 {
            ResponseBody::None
        } else if self.chunked {
            // Framed by the final `chunked`; codings before it (`gzip, chunked`)
            // are the client's to undo, and are named to it as they came.
            ResponseBody::Chunked
        } else if self.other_coding {
            // A transfer coding this proxy cannot frame by: relayed to the close.
            ResponseBody::Close
        } else {
            match self.length {
                Some(n) => ResponseBody::Length(n),
                None => ResponseBody::Close,
            }
        }
    }
}

/// How the client is sent the body.
struct ToClient {
    body: ClientBody,
    /// The upstream's `Transfer-Encoding` is relayed as it came.
    codings_pass: bool,
    side: ClientSide,
}

/// The client's head of the upstream's answer `resp`: its status and
/// fields less the hop-by-hop ones, `Date` when it had none, the framing
/// chosen for the client and `extra` (the governor headers).
fn write_client_head(out: &mut Vec<u8>, resp: &httparse::Response, to: ToClient, extra: &[u8]) {
    let status = resp.code.unwrap_or(0);
    let interim = status < 200;
    out.extend_from_slice(b"HTTP/1.1 ");
    crate::http::response::push_u64(out, status as u64);
    out.push(b' ');
    out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    // A HEAD or 304 answer names the framing a full answer would have; a 1xx
    // or 204 must name none (RFC 9110 §8.6, RFC 9112 §6.1), whatever the upstream sent.
    let framing_passes = to.body == ClientBody::None && !interim && status != 204;
    let fields = || resp.headers.iter().map(|h| (h.name.as_bytes(), h.value));
    let connection = ConnectionTokens::of(fields());
    let mut dated = false;
    for h in resp.headers.iter() {
        let forwarded = if h.name.eq_ignore_ascii_case("content-length") {
            framing_passes
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // An HTTP/1.0 client is sent no transfer coding (RFC 9112 §6.1):
            // its full answer would have been delimited by the close.
            (framing_passes && to.side.http11) || to.codings_pass
        } else {
            // The governor headers are this server's own: an upstream's are not relayed.
            !is_hop_by_hop(h.name.as_bytes())
                && !is_nthpool_field(h.name.as_bytes())
                && !connection.lists(h.name.as_bytes(), fields())
        };
        if forwarded {
            // Only a `Date` relayed counts: one the upstream's `Connection` names is not.
            dated |= h.name.eq_ignore_ascii_case("date");
            push_field(out, h.name.as_bytes(), h.value);
        }
    }
    if !interim {
        if !dated {
            // A proxy adds the `Date` an upstream left out (RFC 9110 §6.6.1).
            out.extend_from_slice(&crate::http::response::date_line_now());
        }
        match to.body {
            ClientBody::Length(n) => {
                out.extend_from_slice(b"Content-Length: ");
                crate::http::response::push_u64(out, n);
                out.extend_from_slice(b"\r\n");
            }
            ClientBody::Chunked if !to.codings_pass => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
            ClientBody::Chunked | ClientBody::None | ClientBody::Close => {}
        }
        out.extend_from_slice(extra);
        if !to.side.keep_alive || to.body == ClientBody::Close {
            out.extend_from_slice(b"Connection: close\r\n");
        } else if !to.side.http11 {
            // An HTTP/1.0 connection is kept only when the answer says so (RFC 9112 §C.2.2).
            out.extend_from_slice(b"Connection: keep-alive\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::upstream::{Upstream, UpstreamConfig};
    use crate::http::request::{header_storage, parse_head};

    fn upstream(extra: &str) -> Upstream {
        let config: UpstreamConfig =
            serde_json::from_str(&format!(r#"{{"url":"http://127.0.0.1:9000"{extra}}}"#)).unwrap();
        Upstream::build(&config).unwrap()
    }

    fn forward(raw: &[u8], creds: CredentialFields, body: RequestBody) -> String {
        let mut storage = header_storage();
        let head = parse_head(raw, &mut storage).unwrap().unwrap();
        let up = upstream(r#","setHeaders":{"Authorization":"Bearer managed","X-Team":"core"}"#);
        let mut out = Vec::new();
        write_request(&mut out, &head, &up, creds, body);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_request_head_loses_credentials_and_hop_by_hop_fields() {
        let raw = b"PATCH /v1/chat?stream=true&x=%20 HTTP/1.1\r\nHost: acme.local\r\nX-Nthpool-Key: k\r\n\
            x-api-key: k\r\nAuthorization: Bearer k\r\nConnection: keep-alive, X-Secret-Hop\r\nX-Secret-Hop: 1\r\n\
            Keep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\nX-Team: client\r\nAccept: */*\r\n\
            Content-Length: 3\r\nExpect: 100-continue\r\n\r\n";
        let creds = CredentialFields { authorization: true, api_key: true, cf_access: false };
        let sent = forward(raw, creds, RequestBody::Length(3));
        assert!(sent.starts_with("PATCH /v1/chat?stream=true&x=%20 HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n"), "{sent}");
        for gone in [
            "X-Nthpool",
            "x-api-key",
            "Bearer k",
            "X-Secret-Hop",
            "Keep-Alive",
            "TE:",
            "Upgrade",
            "client",
            "Expect",
            "acme",
        ] {
            assert!(!sent.contains(gone), "{gone} in {sent}");
        }
        for kept in
            ["Accept: */*\r\n", "Authorization: Bearer managed\r\n", "X-Team: core\r\n", "Content-Length: 3\r\n"]
        {
            assert!(sent.contains(kept), "{kept} missing from {sent}");
        }
        assert!(sent.ends_with("\r\n\r\n"));
    }

    #[test]
    fn the_access_cookie_is_kept_from_the_upstream_when_the_pool_checks_access() {
        let raw = b"GET / HTTP/1.1\r\nHost: a\r\nCf-Access-Jwt-Assertion: t\r\n\
            Cookie: theme=dark; CF_Authorization=t;session=9\r\nCookie: CF_Authorization=t\r\n\r\n";
        let access = CredentialFields { cf_access: true, ..CredentialFields::default() };
        let sent = forward(raw, access, RequestBody::None);
        assert!(sent.contains("\r\nCookie: theme=dark; session=9\r\n"), "{sent}");
        assert_eq!(sent.matches("Cookie").count(), 1, "a field of only the access cookie is dropped: {sent}");
        assert!(!sent.contains("CF_Authorization") && !sent.contains("Cf-Access"), "{sent}");
        // Without Access on the pool, the cookie is the client's business.
        let sent = forward(raw, CredentialFields::default(), RequestBody::None);
        assert!(sent.contains("Cookie: theme=dark; CF_Authorization=t;session=9\r\n"), "{sent}");
    }

    #[test]
    fn a_dropped_field_spelled_with_underscores_is_dropped_too() {
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\nContent_Length: 99\r\nX_Nthpool_Key: k\r\nx_team: client\r\n\
            X_Org: o\r\nX-Trace_Id: t\r\nContent-Length: 2\r\n\r\n";
        let sent = forward(raw, CredentialFields::default(), RequestBody::Length(2));
        for gone in ["Content_Length", "X_Nthpool_Key", "x_team", "client"] {
            assert!(!sent.contains(gone), "{gone} in {sent}");
        }
        for kept in ["X_Org: o\r\n", "X-Trace_Id: t\r\n", "Content-Length: 2\r\n"] {
            assert!(sent.contains(kept), "{kept} missing from {sent}");
        }
        // A `setHeaders` name written with `_` replaces the client's field in either spelling.
        let mut storage = header_storage();
        let head = parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nX-Org: client\r\nx_org: client\r\n\r\n", &mut storage)
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        write_request(
            &mut out,
            &head,
            &upstream(r#","setHeaders":{"X_Org":"core"}"#),
            CredentialFields::default(),
            RequestBody::None,
        );
        let sent = String::from_utf8(out).unwrap();
        assert!(!sent.contains("client") && sent.contains("X_Org: core\r\n"), "{sent}");
    }

    #[test]
    fn authorization_passes_when_it_is_not_a_pool_credential() {
        let raw = b"GET / HTTP/1.1\r\nHost: a\r\nx-api-key: vendor\r\nTransfer-Encoding: chunked\r\n\r\n";
        let sent = forward(raw, CredentialFields::default(), RequestBody::Chunked);
        assert!(sent.contains("x-api-key: vendor\r\n") && sent.contains("Transfer-Encoding: chunked\r\n"), "{sent}");
    }

    fn respond(raw: &[u8], client: ClientSide) -> (ResponseHead, ClientBody, String) {
        let mut out = Vec::new();
        let (head, body) = take_response(raw, client, b"x-nthpool-limit: 4\r\n", 0, &mut out).unwrap().unwrap();
        (head, body, String::from_utf8(out).unwrap())
    }

    const CLIENT: ClientSide = ClientSide { http11: true, keep_alive: true, head_request: false };

    #[test]
    fn response_framing_is_chosen_for_the_client() {
        let (head, body, text) = respond(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nKeep-Alive: x\r\n\r\nhello", CLIENT);
        assert_eq!(
            (head.body, body, head.len, head.keep_alive),
            (ResponseBody::Length(5), ClientBody::Length(5), 53, true)
        );
        assert!(text.starts_with("HTTP/1.1 200 OK\r\nDate: "), "{text}");
        assert!(text.ends_with(" GMT\r\nContent-Length: 5\r\nx-nthpool-limit: 4\r\n\r\n"), "{text}");
        let (_, _, text) = respond(b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\r\n", CLIENT);
        assert_eq!(text.matches("Date: ").count(), 1, "{text}");
        assert!(text.contains("Date: Tue, 01 Dec 2026 10:00:00 GMT\r\n"), "the upstream's own Date is kept: {text}");
        let (head, body, text) = respond(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", CLIENT);
        assert_eq!((head.body, body, head.keep_alive), (ResponseBody::Close, ClientBody::Chunked, false));
        assert!(text.contains("Transfer-Encoding: chunked\r\n") && !text.contains("close"), "{text}");
        let old = ClientSide { http11: false, keep_alive: false, head_request: false };
        let (_, body, text) = respond(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", old);
        assert_eq!(body, ClientBody::Close);
        assert!(text.contains("Connection: close\r\n") && !text.contains("chunked"), "{text}");
        let head_req = ClientSide { head_request: true, ..CLIENT };
        let (head, body, text) = respond(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", head_req);
        assert_eq!((head.body, body), (ResponseBody::None, ClientBody::None));
        assert!(text.contains("Content-Length: 99\r\n"), "{text}");
    }

    #[test]
    fn a_response_framed_two_ways_is_relayed_by_its_coding_and_its_connection_not_kept() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        ] {
            let (head, body, text) = respond(raw, CLIENT);
            let case = String::from_utf8_lossy(raw);
            assert_eq!(
                (head.body, body, head.keep_alive),
                (ResponseBody::Chunked, ClientBody::Chunked, false),
                "{case}"
            );
            assert!(!text.contains("Content-Length"), "{text}");
        }
        let (head, _, _) = respond(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", CLIENT);
        assert!(head.keep_alive, "one chunked coding alone keeps the connection");
        let raw = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (head, body, _) = respond(raw, CLIENT);
        assert_eq!((head.body, body, head.keep_alive), (ResponseBody::Chunked, ClientBody::Chunked, false), "HTTP/1.0");
    }

    #[test]
    fn a_bodiless_answer_that_announces_a_body_does_not_keep_its_connection() {
        for (raw, kept) in [
            (&b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"[..], false),
            (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", false),
            (b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", false),
            (b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", true),
            (b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", true),
        ] {
            let (head, body, _) = respond(raw, CLIENT);
            let case = String::from_utf8_lossy(raw);
            assert_eq!((head.body, body, head.keep_alive), (ResponseBody::None, ClientBody::None, kept), "{case}");
        }
    }

    #[test]
    fn an_upstreams_own_governor_headers_are_not_relayed() {
        let raw = b"HTTP/1.1 200 OK\r\nX-Nthpool-Effective-Limit: 999\r\nx-nthpool-limit: 7\r\nX-Up: 1\r\n\
            X_Nthpool_Queue_Depth: 555\r\nx_nthpool-limit: 666\r\n\r\n";
        let (_, _, text) = respond(raw, CLIENT);
        assert!(!text.contains("999") && !text.contains(": 7\r\n") && !text.contains("Effective"), "{text}");
        assert!(!text.contains("555") && !text.contains("666"), "the `_` spelling is dropped too: {text}");
        assert!(text.contains("X-Up: 1\r\n") && text.contains("x-nthpool-limit: 4\r\n"), "{text}");
    }

    #[test]
    fn interim_answers_and_rate_headers() {
        let (head, _, text) = respond(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", CLIENT);
        assert_eq!(head.status, 103);
        assert_eq!(text, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n");
        let raw = b"HTTP/1.1 429 Too Many Requests\r\nx-ratelimit-limit-requests: 60\r\n\
            x-ratelimit-remaining-requests: 0\r\nx-ratelimit-reset-requests: 6s\r\nContent-Length: 0\r\n\r\n";
        let (head, _, _) = respond(raw, CLIENT);
        assert_eq!(
            (head.status, head.rate.limit, head.rate.remaining, head.rate.reset_ms),
            (429, Some(60), Some(0), Some(6000))
        );
    }

    #[test]
    fn a_coding_before_the_final_chunked_is_relayed_to_http11_clients() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9\r\n\r\n";
        let (head, body, text) = respond(raw, CLIENT);
        assert_eq!((head.body, body), (ResponseBody::Chunked, ClientBody::Chunked));
        assert_eq!(text.matches("Transfer-Encoding").count(), 1, "{text}");
        assert!(text.contains("Transfer-Encoding: gzip, chunked\r\n") && !text.contains("Content-Length"), "{text}");
        let old = ClientSide { http11: false, keep_alive: false, head_request: false };
        assert!(take_response(raw, old, b"", 0, &mut Vec::new()).is_err(), "HTTP/1.0 takes no transfer coding");
    }

    #[test]
    fn unrelayable_heads_are_errors() {
        let mut out = Vec::new();
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 007\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(take_response(raw, CLIENT, b"", 0, &mut out).is_err(), "{}", String::from_utf8_lossy(raw));
        }
        assert!(take_response(b"HTTP/1.1 200 OK\r\nA: b\r\n", CLIENT, b"", 0, &mut out).unwrap().is_none());
    }
}
