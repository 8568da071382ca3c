//! The framing attacks of SPEC §4 as a table, shared by the lock API's wire
//! tests and the proxy's smuggling test.

/// The `error` code of a `FRAMING` case's status.
pub fn code_of(status: u16) -> &'static str {
    match status {
        413 => "payload_too_large",
        501 => "not_implemented",
        505 => "http_version_not_supported",
        _ => "bad_request",
    }
}

/// The framing attacks of SPEC §4, with the status each must get. The pool
/// allows bodies of 1 KiB so a chunk size beyond the limit is short to write.
pub const FRAMING: &[(&str, &[u8], u16)] = &[
    (
        "CL.TE",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    (
        "TE.CL",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        400,
    ),
    ("TE chunked, gzip", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
    ("TE gzip", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    ("TE identity", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", 400),
    ("TE xchunked", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", 400),
    (
        "TE with space before colon",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    (
        "TE twice",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    (
        "TE folded onto the line before",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nX-A: b\r\n Transfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    ("TE on HTTP/1.0", b"POST /pools/p/lock/acquire HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (
        "two different Content-Lengths",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ",
        400,
    ),
    ("Content-Length list", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 3\r\n\r\n{} ", 400),
    ("Content-Length +5", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n{}   ", 400),
    ("Content-Length -1", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
    ("Content-Length hex", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 0x2\r\n\r\n{}", 400),
    ("Content-Length leading zero", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 02\r\n\r\n{}", 400),
    (
        "two different Content-Types",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        400,
    ),
    ("bare LF line endings", b"POST /pools/p/lock/acquire HTTP/1.1\nHost: a\nContent-Length: 0\n\n", 400),
    ("bare LF ending the head", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\n", 400),
    ("CR inside a header line", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", 400),
    ("bare CR line ending", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\rContent-Length: 0\r\n\r\n", 400),
    ("NUL in a header value", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n", 400),
    ("missing Host on HTTP/1.1", b"POST /pools/p/lock/acquire HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
    ("duplicate Host", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
    ("two different Hosts", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 400),
    ("fragment in the target", b"POST /pools/p/lock/acquire#x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 400),
    ("non-ASCII target", b"POST /pools/p/lock/acquire?\xc3\xa9 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 400),
    ("empty Host", b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: \r\nContent-Length: 0\r\n\r\n", 400),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    (
        "chunked trailer line without a colon",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nbadtrailer\r\n\r\n",
        400,
    ),
    (
        "folded chunked trailer line",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX: a\r\n b\r\n\r\n",
        400,
    ),
    (
        "bad chunk size line",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        400,
    ),
    (
        "chunk size with 0x",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunk size line with bare LF",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunk data longer than its size",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}X\r\n0\r\n\r\n",
        400,
    ),
    // A chunk larger than the body limit makes the body too large: 413, as
    // the lock API answers a body over the limit (and closes, like the rest).
    (
        "chunk size over the body limit",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n401\r\n",
        413,
    ),
    (
        "largest chunk size",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
        413,
    ),
    // A chunk size past 64 bits is no size at all (RFC 9112 §7.1: guard
    // against overflow), as a Content-Length past 64 bits is no length.
    (
        "chunk size past 64 bits",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n",
        400,
    ),
    (
        "Content-Length past 64 bits",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        400,
    ),
    (
        "TE chunked, chunked",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    (
        "TE with an empty member",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunk extension without a name",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunk extension with a bad value",
        b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;a=b c\r\n{}\r\n0\r\n\r\n",
        400,
    ),
];
