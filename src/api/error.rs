//! The one table from "what went wrong" to status, `error` code and message.

use super::route::BadEscape;
use crate::access::AccessError;
use crate::http::request::HeadError;
use crate::http::response::{error_body, push_u64, Status, Writer};

/// Every error answer a client can get, one variant each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiError {
    /// Bad framing or a bad body; the sentence says which.
    BadRequest(&'static str),
    /// Missing or wrong key, unknown pool, failed signature/token, nonce replay.
    Unauthorized(&'static str),
    /// The client address is outside the pool's `ipAllow`, or cannot be
    /// told; the sentence says which.
    Forbidden(&'static str),
    NotFound,
    /// A path that is no route here; the sentence says what is wrong with
    /// it where that can be told (`ApiError::NO_ROUTE` otherwise).
    RouteNotFound(&'static str),
    MethodNotAllowed,
    Capped,
    /// The body is over the limit, in bytes, of where it was sent
    /// (`maxBodyBytes`, a proxied pool's `upstream.maxRequestBytes`): the
    /// sentence names it.
    PayloadTooLarge(u64),
    HeadTooLarge,
    TooManyFields,
    TargetTooLong,
    /// A transfer coding (or other framing feature) the server does not implement.
    NotImplemented(&'static str),
    /// `Expect` named something other than `100-continue`.
    ExpectationFailed,
    /// A retry with the same `Idempotency-Key` took this queued acquire's place.
    Superseded,
    /// More was pipelined behind a queued acquire than the connection's
    /// input buffer (this many bytes) holds: its close could not be seen.
    PipelinedPastBuffer(u64),
    /// Overloaded or shutting down; retry after the given seconds.
    Unavailable(&'static str, u64),
    /// The pool's `Idempotency-Key` store holds this many live keys, its
    /// `idempotencyKeys`.
    KeysFull(u64),
    /// The pool's `hmac` policy remembers this many live nonces, its
    /// `nonceCapacity`; the first expires in the given seconds.
    NoncesFull(u64, u64),
    /// A connection over its listener's cap (`maxConnections` as applied,
    /// or the admin listener's own budget), this many connections: the
    /// sentence names it.
    OverCapacity(u64),
    /// Proxy mode: the upstream could not be reached or gave no usable answer.
    BadGateway,
    /// Proxy mode: the upstream cannot be used for the reason the sentence
    /// gives (its TLS certificate was refused, its name does not resolve).
    BadGatewayBecause(&'static str),
    /// Proxy mode: the upstream's TLS handshake ran past its
    /// `tlsHandshakeTimeoutMs`, this many milliseconds (named in the
    /// message), on the last address of its name.
    HandshakeTimeout(u64),
    /// Proxy mode: no response head within the upstream's `timeoutMs`, this
    /// many milliseconds (named in the message).
    UpstreamTimeout(u64),
    /// Proxy mode: the client's request body stalled for the upstream's
    /// `timeoutMs` (named in the message); the upstream had taken all that
    /// came of it and waited for the rest.
    BodyTimeout(u64),
    /// Proxy mode: the request reached `requestTimeoutMs` (ms) before the response head.
    RequestCapped(u64),
    /// A request line of an HTTP major version other than 1.
    VersionNotSupported,
    /// The router in front (`X-Nthpool-Pool`) placed this request by
    /// another pool than the one it reaches here: its host map is older
    /// than this instance's configuration.
    Misdirected,
}

impl ApiError {
    /// The `404` of a path that is no route, when nothing more can be said.
    pub const NO_ROUTE: ApiError = ApiError::RouteNotFound("No such route.");
    /// The `404` of a lock route asked for on a host other than `publicHost`.
    pub const OFF_PUBLIC_HOST: ApiError = ApiError::RouteNotFound("The lock API is not served on this host.");
    /// The `404` of a renew or release path without its slot id.
    pub const NO_SLOT_ID: ApiError = ApiError::RouteNotFound(
        "The path has no slot id: renew and release are /pools/{pool}/lock/{slotId}/renew and .../release.",
    );

    pub fn status(self) -> Status {
        match self {
            ApiError::BadRequest(_) | ApiError::PipelinedPastBuffer(_) => Status::BadRequest,
            ApiError::Unauthorized(_) => Status::Unauthorized,
            ApiError::Forbidden(_) => Status::Forbidden,
            ApiError::NotFound | ApiError::RouteNotFound(_) => Status::NotFound,
            ApiError::MethodNotAllowed => Status::MethodNotAllowed,
            ApiError::Capped | ApiError::Superseded => Status::Conflict,
            ApiError::PayloadTooLarge(_) => Status::PayloadTooLarge,
            ApiError::HeadTooLarge | ApiError::TooManyFields => Status::HeaderFieldsTooLarge,
            ApiError::TargetTooLong => Status::UriTooLong,
            ApiError::NotImplemented(_) => Status::NotImplemented,
            ApiError::ExpectationFailed => Status::ExpectationFailed,
            ApiError::Unavailable(..)
            | ApiError::KeysFull(_)
            | ApiError::NoncesFull(..)
            | ApiError::OverCapacity(_) => Status::ServiceUnavailable,
            ApiError::BadGateway | ApiError::BadGatewayBecause(_) | ApiError::HandshakeTimeout(_) => Status::BadGateway,
            ApiError::UpstreamTimeout(_) | ApiError::RequestCapped(_) => Status::GatewayTimeout,
            ApiError::BodyTimeout(_) => Status::RequestTimeout,
            ApiError::VersionNotSupported => Status::VersionNotSupported,
            ApiError::Misdirected => Status::MisdirectedRequest,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            ApiError::BadRequest(_) | ApiError::PipelinedPastBuffer(_) => "bad_request",
            ApiError::Unauthorized(_) | ApiError::Forbidden(_) => "unauthorized",
            ApiError::NotFound | ApiError::RouteNotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Capped => "capped",
            ApiError::Superseded => "superseded",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::HeadTooLarge | ApiError::TooManyFields => "request_header_fields_too_large",
            ApiError::TargetTooLong => "uri_too_long",
            ApiError::NotImplemented(_) => "not_implemented",
            ApiError::ExpectationFailed => "expectation_failed",
            ApiError::Unavailable(..)
            | ApiError::KeysFull(_)
            | ApiError::NoncesFull(..)
            | ApiError::OverCapacity(_) => "unavailable",
            ApiError::BadGateway | ApiError::BadGatewayBecause(_) | ApiError::HandshakeTimeout(_) => "bad_gateway",
            ApiError::UpstreamTimeout(_) => "upstream_timeout",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::RequestCapped(_) => "request_capped",
            ApiError::VersionNotSupported => "http_version_not_supported",
            ApiError::Misdirected => "misdirected_request",
        }
    }

    /// The one human sentence, or for a limit the configuration sets, the
    /// sentence up to its number (`number` gives the number and the rest).
    fn message(self) -> &'static str {
        match self {
            ApiError::BadRequest(why)
            | ApiError::Unauthorized(why)
            | ApiError::Forbidden(why)
            | ApiError::NotImplemented(why)
            | ApiError::BadGatewayBecause(why)
            | ApiError::RouteNotFound(why)
            | ApiError::Unavailable(why, _) => why,
            ApiError::NotFound => "The slot was already released or reclaimed.",
            ApiError::MethodNotAllowed => "Lock routes accept POST only.",
            ApiError::Capped => "The slot reached its request deadline and cannot be renewed; release it.",
            ApiError::Superseded => "A retry with the same Idempotency-Key took this acquire's place in the queue.",
            ApiError::PipelinedPastBuffer(_) => "More than the ",
            ApiError::PayloadTooLarge(_) => "The request body is larger than the ",
            ApiError::OverCapacity(_) => "The server already has the ",
            ApiError::ExpectationFailed => "Only the 100-continue expectation is supported.",
            ApiError::KeysFull(_) => "The pool holds as many live Idempotency-Keys as its idempotencyKeys, ",
            ApiError::NoncesFull(..) => "The pool's hmac policy remembers as many live nonces as its nonceCapacity, ",
            ApiError::HeadTooLarge => "The request head is larger than 16 KiB.",
            ApiError::TooManyFields => "The request head has more than 64 fields.",
            ApiError::TargetTooLong => "The request target is longer than 16 KiB.",
            ApiError::BadGateway => "The upstream could not be reached or did not answer usably.",
            ApiError::HandshakeTimeout(_) => {
                "The TLS handshake with the upstream did not finish within its tlsHandshakeTimeoutMs, "
            }
            ApiError::UpstreamTimeout(_) => "The upstream sent no response head within its timeoutMs, ",
            ApiError::BodyTimeout(_) => "The request body did not arrive within the upstream's timeoutMs, ",
            ApiError::RequestCapped(_) => "The request reached its pool's requestTimeoutMs, ",
            ApiError::VersionNotSupported => "Only HTTP/1.0 and HTTP/1.1 are served.",
            ApiError::Misdirected => {
                "The router placed this request by another pool than the one it names here; \
                 its host map is older than this instance's configuration."
            }
        }
    }

    /// Errors after which the connection cannot be trusted to stay in sync.
    pub fn closes(self) -> bool {
        matches!(
            self,
            ApiError::BadRequest(_)
                | ApiError::PipelinedPastBuffer(_)
                | ApiError::PayloadTooLarge(_)
                | ApiError::HeadTooLarge
                | ApiError::TooManyFields
                | ApiError::TargetTooLong
                | ApiError::NotImplemented(_)
                | ApiError::ExpectationFailed
                | ApiError::VersionNotSupported
                | ApiError::BodyTimeout(_)
                | ApiError::RequestCapped(_)
                | ApiError::Misdirected
        )
    }

    /// A limit the configuration sets, named in the sentence: its number
    /// and the sentence's rest after it.
    fn number(self) -> Option<(u64, &'static str)> {
        match self {
            ApiError::PayloadTooLarge(bytes) => Some((bytes, " bytes this server accepts.")),
            ApiError::OverCapacity(connections) => Some((connections, " open connections it accepts; retry shortly.")),
            ApiError::UpstreamTimeout(ms) | ApiError::BodyTimeout(ms) | ApiError::HandshakeTimeout(ms) => {
                Some((ms, " ms."))
            }
            ApiError::RequestCapped(ms) => Some((ms, " ms, before the upstream answered.")),
            ApiError::KeysFull(keys) => Some((keys, "; retry once slots are released.")),
            ApiError::NoncesFull(nonces, _) => Some((nonces, "; retry when the first expires (Retry-After).")),
            ApiError::PipelinedPastBuffer(bytes) => {
                Some((bytes, " bytes a connection buffers were pipelined behind an acquire waiting in the queue."))
            }
            _ => None,
        }
    }

    /// The JSON body.
    fn body(self, out: &mut Vec<u8>) {
        let Some((number, rest)) = self.number() else {
            return error_body(out, self.code(), self.message());
        };
        out.extend_from_slice(b"{\"error\":\"");
        out.extend_from_slice(self.code().as_bytes());
        out.extend_from_slice(b"\",\"message\":\"");
        out.extend_from_slice(self.message().as_bytes());
        push_u64(out, number);
        out.extend_from_slice(rest.as_bytes());
        out.extend_from_slice(b"\"}");
    }

    pub fn write(self, out: &mut Vec<u8>, scratch: &mut Vec<u8>, close: bool) {
        self.write_with(out, scratch, close, b"");
    }

    /// `write`, with `headers` (whole header lines) after the status line:
    /// the admin listener's security headers, a proxied exchange's governor
    /// headers.
    pub fn write_with(self, out: &mut Vec<u8>, scratch: &mut Vec<u8>, close: bool, headers: &[u8]) {
        scratch.clear();
        self.body(scratch);
        let mut w = Writer::start(out, self.status());
        w.raw(headers);
        match self {
            ApiError::MethodNotAllowed => {
                w.header(b"Allow", b"POST");
            }
            // RFC 9110 §15.5.2: a 401 names a scheme. Bearer is the one the
            // seed documents beside `X-Nthpool-Key`; the challenge is the same
            // for every pool, so it tells nothing of a pool or its policies.
            ApiError::Unauthorized(_) => {
                w.header(b"WWW-Authenticate", b"Bearer realm=\"nthpool\"");
            }
            ApiError::Unavailable(_, retry_after_s) | ApiError::NoncesFull(_, retry_after_s) => {
                w.header_u64(b"Retry-After", retry_after_s.max(1));
            }
            ApiError::KeysFull(_) | ApiError::OverCapacity(_) => {
                w.header_u64(b"Retry-After", 1);
            }
            _ => {}
        }
        w.finish_json(scratch, close || self.closes());
    }
}

impl From<HeadError> for ApiError {
    fn from(e: HeadError) -> ApiError {
        match e {
            HeadError::TooLarge => ApiError::HeadTooLarge,
            HeadError::TooManyFields => ApiError::TooManyFields,
            HeadError::TargetTooLong => ApiError::TargetTooLong,
            HeadError::Malformed(why) => ApiError::BadRequest(why),
            HeadError::NotImplemented(why) => ApiError::NotImplemented(why),
            HeadError::ExpectationFailed => ApiError::ExpectationFailed,
            HeadError::NewerMinorVersion => ApiError::BadRequest("Only HTTP/1.x is served."),
            HeadError::OtherMajorVersion => ApiError::VersionNotSupported,
        }
    }
}

impl From<AccessError> for ApiError {
    fn from(e: AccessError) -> ApiError {
        match e {
            AccessError::Forbidden(why) => ApiError::Forbidden(why),
            AccessError::Denied(d) => ApiError::Unauthorized(d.reason()),
            AccessError::Busy { capacity, retry_after_s } => ApiError::NoncesFull(capacity, retry_after_s),
            AccessError::Twice(why) => ApiError::BadRequest(why),
        }
    }
}

impl From<BadEscape> for ApiError {
    fn from(e: BadEscape) -> ApiError {
        ApiError::BadRequest(e.message())
    }
}
