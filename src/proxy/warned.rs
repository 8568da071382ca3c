//! Warnings about one upstream failing the same way, written at most once
//! a second each: an upstream that fails every request (a name that does
//! not resolve, a refused certificate) would otherwise write one line per
//! request, which costs the log its other lines and a reader of standard
//! error its patience. The line that is written says how many like it
//! were not; so does a line of its own once a second has passed with none
//! like them (the reactor's `Wake::Warnings`), and the stop's: a burst that
//! ends is counted whole in the log, and one that goes on writes no more.
//! Deciding costs a scan of a few entries and no formatting.

use std::io;
use std::time::{Duration, Instant};

use log::warn;

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
    /// When the last one left out was.
    last: Instant,
}

#[derive(Default)]
pub struct Warned {
    recent: Vec<Entry>,
    /// When `write_trailing` may have a line to write: a second after the
    /// earliest warning left out and not yet counted.
    due: Option<Instant>,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Said(why) => f.write_str(why.trim_end_matches('.')),
            Cause::Io(kind) => write!(f, "{kind}"),
        }
    }
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
                e.last = now;
                self.due = Some(self.due.unwrap_or(now + EVERY));
                return None;
            }
            e.at = now;
            return Some(Unlogged(std::mem::take(&mut e.unlogged)));
        }
        let entry = Entry { what, upstream: upstream.to_owned(), cause, at: now, unlogged: 0, last: now };
        if self.recent.len() < REMEMBERED {
            self.recent.push(entry);
        } else if let Some(oldest) = self.recent.iter_mut().min_by_key(|e| e.at) {
            // Forgotten, its count is written now rather than lost.
            if oldest.unlogged > 0 {
                trailing_line(oldest.what, &oldest.upstream, oldest.cause, oldest.unlogged);
            }
            *oldest = entry;
        }
        Some(Unlogged(0))
    }

    /// When `write_trailing` next has a line to write, if ever.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Writes, for each warning left out with none like it for a second
    /// since (every one, when `all`: at the stop), how many were left out.
    pub fn write_trailing(&mut self, all: bool) {
        self.trailing_at(Instant::now(), all, trailing_line);
    }

    fn trailing_at(&mut self, now: Instant, all: bool, mut write: impl FnMut(&'static str, &str, Cause, u64)) {
        self.due = None;
        for e in self.recent.iter_mut().filter(|e| e.unlogged > 0) {
            if all || now.duration_since(e.last) >= EVERY {
                write(e.what, &e.upstream, e.cause, std::mem::take(&mut e.unlogged));
            } else {
                let end = e.last + EVERY;
                self.due = Some(self.due.map_or(end, |due| due.min(end)));
            }
        }
    }
}

/// The line that counts warnings left out when none like them followed.
fn trailing_line(what: &str, upstream: &str, cause: Cause, unlogged: u64) {
    warn!("upstream {upstream}: `{what}` warnings ({cause}) have stopped{}", Unlogged(unlogged));
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

    /// A burst that ends is counted whole: the warnings left out after the
    /// last one written are counted in a line of their own once a second
    /// has passed with none like them (or at the stop), once; a burst that
    /// goes on is counted by its next warning written, as before.
    #[test]
    fn the_warnings_left_out_after_the_last_written_are_counted_once_they_stop() {
        let mut w = Warned::default();
        let t0 = Instant::now();
        let cause = Cause::Said("does not resolve");
        let ms = |n| t0 + Duration::from_millis(n);
        let mut lines = Vec::new();
        let mut trailing = |w: &mut Warned, at, all| {
            lines.clear();
            w.trailing_at(at, all, |what, up, c, n| lines.push((what, up.to_string(), c, n)));
            lines.clone()
        };
        assert_eq!(w.allow_at("lookup", "a.test", cause, t0), Some(Unlogged(0)));
        assert_eq!(w.due(), None, "nothing left out yet");
        for n in 1..4 {
            assert_eq!(w.allow_at("lookup", "a.test", cause, ms(n)), None);
        }
        assert_eq!(w.allow_at("tls", "b.test", cause, ms(500)), Some(Unlogged(0)));
        assert_eq!(w.allow_at("tls", "b.test", cause, ms(600)), None);
        assert_eq!(w.due(), Some(ms(1001)), "a second after the first left out");
        assert_eq!(trailing(&mut w, ms(1000), false), [], "a.test's last was 999 ms ago");
        assert_eq!(w.due(), Some(ms(1003)));
        assert_eq!(trailing(&mut w, ms(1003), false), [("lookup", "a.test".to_string(), cause, 3)]);
        assert_eq!(w.due(), Some(ms(1600)), "b.test's still to come");
        // Counted once; the next like it is written, counting none.
        assert_eq!(trailing(&mut w, ms(1500), false), []);
        assert_eq!(w.allow_at("lookup", "a.test", cause, ms(1501)), Some(Unlogged(0)));
        // A burst that goes on: its next warning written counts those left
        // out, and the line of their own has nothing more to say.
        assert_eq!(w.allow_at("tls", "b.test", cause, ms(1550)), Some(Unlogged(1)));
        assert_eq!(trailing(&mut w, ms(1600), false), []);
        assert_eq!(w.allow_at("lookup", "a.test", cause, ms(1700)), None);
        assert_eq!(trailing(&mut w, ms(1800), true), [("lookup", "a.test".to_string(), cause, 1)], "at the stop");
        assert_eq!(w.due(), None, "all counted at the stop");
        assert_eq!(trailing(&mut w, ms(5000), true), [], "nothing counted twice");
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
