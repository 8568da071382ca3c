//! `ChunkedDecoder` must not panic, must decode the same way however the body
//! is split across reads (every split point in the first 64 bytes), and must
//! never hand out more than its limit.
//!
//! Input: two bytes for the limit, then the body on the wire.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nthpool::http::chunked::{ChunkError, ChunkedDecoder};

#[derive(Debug, PartialEq, Eq)]
struct Run {
    result: Result<(usize, bool), ChunkError>,
    out: Vec<u8>,
}

/// Feeds `data` in pieces ending at `ends`, stopping at an error or at the end
/// of the body, as the connection does; `consumed` is the total taken.
fn feed(limit: usize, data: &[u8], ends: &[usize]) -> Run {
    let mut decoder = ChunkedDecoder::new(limit);
    let mut out = Vec::new();
    let mut start = 0;
    for &end in ends {
        match decoder.feed(&data[start..end], &mut out) {
            Ok((n, done)) => {
                start += n;
                if done {
                    return Run { result: Ok((start, true)), out };
                }
                assert_eq!(start, end, "an unfinished body leaves input unconsumed");
            }
            Err(e) => return Run { result: Err(e), out },
        }
    }
    Run { result: Ok((start, false)), out }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 {
        return;
    }
    let limit = usize::from(u16::from_le_bytes([input[0], input[1]]));
    let data = &input[2..];
    let whole = feed(limit, data, &[data.len()]);
    assert!(whole.out.len() <= limit, "decoded {} bytes past the limit {limit}", whole.out.len());
    if let Ok((consumed, _)) = whole.result {
        assert!(consumed <= data.len());
    }
    for split in 0..=data.len().min(64) {
        let parts = feed(limit, data, &[split, data.len()]);
        // On an error the bytes decoded before it may differ with the split;
        // the verdict may not.
        match (&whole.result, &parts.result) {
            (Err(a), Err(b)) => assert_eq!(a, b, "split at {split} changed the error"),
            _ => assert_eq!(whole, parts, "split at {split} changed the outcome"),
        }
    }
    // Byte by byte over the first 64 bytes, then the rest at once.
    let mut ends: Vec<usize> = (1..=data.len().min(64)).collect();
    ends.push(data.len());
    let trickle = feed(limit, data, &ends);
    match (&whole.result, &trickle.result) {
        (Err(a), Err(b)) => assert_eq!(a, b, "byte-by-byte feeding changed the error"),
        _ => assert_eq!(whole, trickle, "byte-by-byte feeding changed the outcome"),
    }
});
