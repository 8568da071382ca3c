//! `parse_head` must not panic, and a head must get the same verdict whether
//! it arrives whole or in two reads, with `head_may_be_complete` gating each
//! parse exactly as the connection loop does.
//!
//! Input: two bytes choosing the split point, then the bytes on the wire.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nthpool::http::request::{head_may_be_complete, header_storage, parse_head, HeadError};

/// What the connection acts on, without the borrows of `Head`.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// No head yet: keep reading.
    Incomplete,
    Complete {
        head_len: usize,
        summary: String,
    },
    Malformed,
    TooLarge,
}

fn verdict(buf: &[u8]) -> Verdict {
    let mut storage = header_storage();
    match parse_head(buf, &mut storage) {
        Ok(None) => Verdict::Incomplete,
        Ok(Some(h)) => Verdict::Complete {
            head_len: h.head_len,
            summary: format!(
                "{:?} {} http11={} keep_alive={} {:?} continue={} host={:?} headers={}",
                h.method,
                h.path_str(),
                h.http11,
                h.keep_alive,
                h.framing,
                h.expect_continue,
                h.host,
                h.headers.count()
            ),
        },
        Err(HeadError::Malformed(_) | HeadError::NotImplemented(_) | HeadError::NewerMinorVersion) => {
            Verdict::Malformed
        }
        Err(HeadError::TooLarge) => Verdict::TooLarge,
    }
}

/// The verdict after reads ending at each of `ends`, parsing only when
/// `head_may_be_complete` allows, as `Server::process` does.
fn arrive(data: &[u8], ends: &[usize]) -> Verdict {
    let mut scanned = 0;
    for &end in ends {
        let buf = &data[..end];
        if !head_may_be_complete(buf, scanned) {
            scanned = end;
            continue;
        }
        match verdict(buf) {
            Verdict::Incomplete => scanned = end,
            decided => return decided,
        }
    }
    Verdict::Incomplete
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 {
        return;
    }
    let data = &input[2..];
    let split = usize::from(u16::from_le_bytes([input[0], input[1]])) % (data.len() + 1);

    let whole = verdict(data);
    let prefix = verdict(&data[..split]);

    // The gate may only stay shut while parsing could not produce a head. A
    // head already malformed before its first line end is left to the head
    // timeout (reported, see `tests/fuzz_regressions.rs`), so errors are not
    // held to this.
    if matches!(prefix, Verdict::Complete { .. }) {
        assert!(head_may_be_complete(&data[..split], 0), "gate shut on a complete prefix: {prefix:?}");
    }
    if matches!(whole, Verdict::Complete { .. }) {
        assert!(head_may_be_complete(data, 0), "gate shut on a complete head: {whole:?}");
        if prefix == Verdict::Incomplete {
            assert!(
                head_may_be_complete(data, split),
                "gate shut after a split at {split} on a complete head: {whole:?}"
            );
        }
    }
    // A decided prefix stays decided the same way once more bytes arrive.
    // (Malformed against TooLarge is reported as `bare_lf_wins_over_too_many_headers`
    // in `tests/fuzz_regressions.rs`; both answer and close.)
    let both_errors = matches!(prefix, Verdict::Malformed | Verdict::TooLarge)
        && matches!(whole, Verdict::Malformed | Verdict::TooLarge);
    if prefix != Verdict::Incomplete && !both_errors {
        assert_eq!(prefix, whole, "prefix of {split} bytes decided differently from the whole");
    }
    // Through the gate, arriving in two reads decides a complete head exactly
    // as arriving at once. (An error may be put off until a line end; same
    // report as above.)
    let (split_arrival, whole_arrival) = (arrive(data, &[split, data.len()]), arrive(data, &[data.len()]));
    if matches!(split_arrival, Verdict::Complete { .. }) || matches!(whole_arrival, Verdict::Complete { .. }) {
        assert_eq!(split_arrival, whole_arrival, "arrival split at {split} changed the verdict");
    }
});
