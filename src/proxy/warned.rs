//! Warnings about one upstream failing the same way, written at most once
//! a second each: an upstream that fails every request (a name that does
//! not resolve, a refused certificate) would otherwise write one line per
//! request, which costs the log its other lines and a reader of standard
//! error its patience. The line that is written says how many like it
//! were not. Deciding costs a scan of a few entries and no formatting.

use std::io;
use std::time::{Duration, Instant};

/// One warning per (what, upstream, cause) in this long.
const EVERY: Duration = Duration::from_secs(1);
/// Warnings remembered at most: past it the oldest is forgotten.
const REMEMBERED: usize = 32;

/// Why the warning is written, as far as telling two apart goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Said(&'static str),
    Io(io::ErrorKind),
}

struct Entry {
    what: &'static str,
    upstream: String,
    cause: Cause,
    at: Instant,
    unlogged: u64,
}

#[derive(Default)]
pub struct Warned {
    recent: Vec<Entry>,
}

/// How many warnings like a written one were left out since the last
/// (shown as ` (N more since the last such warning)`, or nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unlogged(pub u64);

impl std::fmt::Display for Unlogged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} more since the last such warning)"),
        }
    }
}

impl Warned {
    /// Whether the warning `what` about `upstream` for `cause` is written
    /// now (with how many like it were not), or left out and counted.
    pub fn allow(&mut self, what: &'static str, upstream: &str, cause: Cause) -> Option<Unlogged> {
        self.allow_at(what, upstream, cause, Instant::now())
    }

    fn allow_at(&mut self, what: &'static str, upstream: &str, cause: Cause, now: Instant) -> Option<Unlogged> {
        let found = self.recent.iter_mut().find(|e| e.what == what && e.cause == cause && e.upstream == upstream);
        if let Some(e) = found {
            if now.duration_since(e.at) < EVERY {
                e.unlogged += 1;
                return None;
            }
            e.at = now;
            return Some(Unlogged(std::mem::take(&mut e.unlogged)));
        }
        let entry = Entry { what, upstream: upstream.to_owned(), cause, at: now, unlogged: 0 };
        if self.recent.len() < REMEMBERED {
            self.recent.push(entry);
        } else if let Some(oldest) = self.recent.iter_mut().min_by_key(|e| e.at) {
            *oldest = entry;
        }
        Some(Unlogged(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_warning_is_written_once_a_second_with_the_count_of_those_left_out() {
        let mut w = Warned::default();
        let t0 = Instant::now();
        let cause = Cause::Said("does not resolve");
        assert_eq!(w.allow_at("lookup", "a.test", cause, t0), Some(Unlogged(0)));
        for ms in 1..5 {
            assert_eq!(w.allow_at("lookup", "a.test", cause, t0 + Duration::from_millis(ms)), None);
        }
        // Another upstream, cause or warning is its own.
        assert_eq!(w.allow_at("lookup", "b.test", cause, t0), Some(Unlogged(0)));
        assert_eq!(w.allow_at("lookup", "a.test", Cause::Io(io::ErrorKind::TimedOut), t0), Some(Unlogged(0)));
        assert_eq!(w.allow_at("tls", "a.test", cause, t0), Some(Unlogged(0)));
        assert_eq!(w.allow_at("lookup", "a.test", cause, t0 + EVERY), Some(Unlogged(4)));
        assert_eq!(Unlogged(4).to_string(), " (4 more since the last such warning)");
        assert_eq!(Unlogged(0).to_string(), "");
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let mut w = Warned::default();
        let t0 = Instant::now();
        for i in 0..100u64 {
            let upstream = format!("u{i}.test");
            w.allow_at("lookup", &upstream, Cause::Said("x"), t0 + Duration::from_millis(i));
        }
        assert_eq!(w.recent.len(), REMEMBERED);
        // The newest are kept.
        assert_eq!(w.allow_at("lookup", "u99.test", Cause::Said("x"), t0 + Duration::from_millis(100)), None);
    }
}
