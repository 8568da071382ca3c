//! `parse_release` must not panic on any body, and an accepted status is a
//! real HTTP status.
//!
//! Input: four bytes moving the wall clock, then the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nthpool::report::parse_release;

/// 2023-11-14: a plausible present, so dates in the body are near it.
const NOW_EPOCH_MS: u64 = 1_700_000_000_000;

fuzz_target!(|input: &[u8]| {
    if input.len() < 4 {
        return;
    }
    let shift = u64::from(u32::from_le_bytes([input[0], input[1], input[2], input[3]]));
    let body = &input[4..];
    if let Ok(Some(outcome)) = parse_release(body, NOW_EPOCH_MS + shift * 1000) {
        if let Some(status) = outcome.status {
            assert!((100..=599).contains(&status), "accepted status {status}");
        }
    }
});
