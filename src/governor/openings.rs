//! When an upstream's request windows open, for one that says what is left
//! of its budget (`remaining`) but never when the window resets.
//!
//! Within a window `remaining` only goes down from call to call; a call that
//! finds clearly more left than one granted before it found is in a new
//! window, which opened between the two grants. The middles of those spans,
//! counted in windows, give the window's length; the later grant of the
//! last one gives the phase, never early: the end of the window a call was
//! granted in, which `Learning` takes as the reset the upstream did not
//! say. A pool whose grants run through the opening (paced over the
//! window) finds it within a grant's spacing.
//!
//! Pure arithmetic on instants and grant counts; O(1) per report. Not
//! saved: a restarted pool learns the openings again.
use crate::time::Ms;

/// The openings of an upstream's windows seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Openings {
    /// The report of the latest grant seen: its grant count, its grant's
    /// instant and what it found left.
    latest: Option<(u64, Ms, u64)>,
    /// The same of the latest grant seen before the last opening: a report
    /// of a grant between it and the opening's that finds much more left
    /// found the opening first.
    before: (u64, Ms, u64),
    /// The last opening (the first grant seen to find its window) and its
    /// grant count.
    last: Ms,
    last_seq: u64,
    /// The opening the window's length is measured from: the one found
    /// closest after the grant before it (the span), as a window found
    /// by a probe a second after the one before may have opened anywhere
    /// in that second; and the windows counted from it to the last.
    anchor: Option<(Ms, Ms)>,
    windows: u64,
    /// The window's length (0: not known yet).
    window_ms: Ms,
}

impl Openings {
    /// A report of the lease granted `seq`th, at `granted_at`, that found
    /// `remaining` left of a window's `limit` (`None`: not said). More left
    /// than the latest grant found, by more than calls reordered on their
    /// way to the upstream can explain (a quarter of the limit, from 1 to
    /// 8 calls), marks an opening. Reports come back out of order: one of
    /// an earlier grant that finds the last opening's window moves that
    /// opening to its grant; any other of an earlier grant says nothing.
    pub fn on_report(&mut self, seq: u64, granted_at: Ms, remaining: u64, limit: Option<u64>) {
        let jump = limit.map_or(4, |l| (l / 4).clamp(1, 8));
        let Some(latest) = self.latest else {
            self.latest = Some((seq, granted_at, remaining));
            return;
        };
        let (before_seq, before_at, before_left) = self.before;
        if seq > latest.0 {
            if remaining >= latest.2.saturating_add(jump) {
                self.before = latest;
                self.open(granted_at, seq, granted_at.saturating_sub(latest.1));
            }
            self.latest = Some((seq, granted_at, remaining));
        } else if seq > before_seq && seq < self.last_seq && remaining >= before_left.saturating_add(jump) {
            let span = granted_at.saturating_sub(before_at);
            if self.anchor.is_some_and(|(at, _)| at == self.last) {
                self.anchor = self.anchor.map(|(at, known)| (at.min(granted_at), known.min(span)));
            }
            (self.last, self.last_seq) = (self.last.min(granted_at), seq);
        }
    }

    /// An opening found at `at` by the grant counted `seq`, `span` after
    /// the grant before it.
    fn open(&mut self, at: Ms, seq: u64, span: Ms) {
        let Some((anchor, anchor_span)) = self.anchor else {
            (self.anchor, self.last, self.last_seq) = (Some((at, span)), at, seq);
            return;
        };
        if at <= self.last {
            return;
        }
        // Openings after a quiet stretch span several windows. One a
        // quarter of a window or more before where the length puts it says
        // the length was wrong (taken from two windows that looked like
        // one, or the upstream changed it): learn it again from here.
        let interval = at - self.last;
        let w = self.window_ms;
        let (windows, early) = match w {
            0 => (1, false),
            w => ((interval + w / 2) / w, interval + w / 4 <= (interval + w / 2) / w * w),
        };
        (self.last, self.last_seq) = (at, seq);
        if windows == 0 || early || anchor > at || span / 2 > at {
            (self.anchor, self.windows, self.window_ms) = (Some((at, span)), 0, 0);
            return;
        }
        self.windows += windows;
        // From the middle of one span to the middle of the other; a span
        // wider than the anchor's (a probe that waited for the calls out)
        // measures nothing once a length is known.
        if w == 0 || span <= (w / 16).max(anchor_span) {
            let (from, to) = (anchor - anchor_span / 2, at - span / 2);
            self.window_ms = to.saturating_sub(from) / self.windows;
        }
        // A closer opening measures the length from now on (the length
        // found so far is kept until the next one).
        if span < anchor_span {
            (self.anchor, self.windows) = (Some((at, span)), 0);
        }
    }

    /// The window's length, once two openings were found.
    pub fn window_ms(&self) -> Option<Ms> {
        (self.window_ms > 0).then_some(self.window_ms)
    }

    /// The end of the window a call granted at `granted_at` was in, when
    /// that window is the one the last opening began and its length is
    /// known. A call granted past that window's end is in one whose opening
    /// is still to be seen, which may come later than the length says:
    /// `None`.
    pub fn end_of(&self, granted_at: Ms) -> Option<Ms> {
        if granted_at < self.last {
            return None;
        }
        let end = self.last + self.window_ms()?;
        (granted_at < end).then_some(end)
    }

    /// The last opening and its grant count: the start, as far as the pool
    /// knows, of the window `end_of` ends.
    pub fn opened(&self) -> (Ms, u64) {
        (self.last, self.last_seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reports, in grant order, of `calls` calls granted every 100 ms from
    /// `from`, each finding one fewer left, from `limit - 1` at the first.
    fn window(o: &mut Openings, seq: &mut u64, from: Ms, calls: u64, limit: u64) {
        for i in 0..calls {
            *seq += 1;
            o.on_report(*seq, from + i * 100, limit - 1 - i, Some(limit));
        }
    }

    #[test]
    fn a_jump_in_what_is_left_is_an_opening_and_two_give_the_windows_end() {
        let mut o = Openings::default();
        let mut seq = 0;
        window(&mut o, &mut seq, 0, 60, 60);
        assert_eq!(o.anchor, None, "the first call opens nothing: nothing was seen before it");
        window(&mut o, &mut seq, 6000, 60, 60);
        assert_eq!((o.anchor, o.window_ms(), o.end_of(6500)), (Some((6000, 100)), None, None));
        window(&mut o, &mut seq, 12_000, 30, 60);
        assert_eq!(o.window_ms(), Some(6000));
        assert_eq!(o.opened(), (12_000, 121));
        assert_eq!(o.end_of(12_000), Some(18_000));
        assert_eq!(o.end_of(17_999), Some(18_000));
        assert_eq!(o.end_of(18_000), None, "the next window: its opening is still to be seen");
        assert_eq!(o.end_of(11_999), None, "an earlier window");
    }

    #[test]
    fn reordered_calls_and_older_views_open_nothing() {
        let mut o = Openings::default();
        o.on_report(2, 100, 40, Some(60));
        // A call granted later that reached the upstream first: a little more left.
        o.on_report(3, 110, 42, Some(60));
        // A slow call granted earlier reports late, with much more left.
        o.on_report(1, 90, 58, Some(60));
        assert_eq!(o.anchor, None);
        o.on_report(6, 6100, 57, Some(60));
        assert_eq!(o.opened(), (6100, 6));
        // Calls granted before it report late: one found the same window, one
        // the old one.
        o.on_report(5, 6000, 58, Some(60));
        o.on_report(4, 5900, 0, Some(60));
        assert_eq!((o.opened(), o.anchor), ((6000, 5), Some((6000, 5890))));
    }

    #[test]
    fn the_length_is_measured_from_the_closest_found_opening() {
        let mut o = Openings::default();
        // Windows of 6 s opening at whole multiples; a probe a second after
        // the one before finds the first one 700 ms late.
        o.on_report(1, 5700, 0, Some(60));
        o.on_report(2, 6700, 59, Some(60));
        o.on_report(3, 11_950, 0, Some(60));
        o.on_report(4, 12_010, 59, Some(60));
        assert_eq!(o.window_ms(), Some(5780), "measured from the late one's middle");
        o.on_report(5, 17_950, 0, Some(60));
        o.on_report(6, 18_020, 59, Some(60));
        assert_eq!(o.window_ms(), Some(6005), "from the close one at 12 010");
        o.on_report(7, 23_990, 0, Some(60));
        o.on_report(8, 24_000, 59, Some(60));
        assert_eq!(o.window_ms(), Some(6007));
        // A wider span than the anchor's measures nothing.
        o.on_report(9, 29_000, 0, Some(60));
        o.on_report(10, 30_900, 59, Some(60));
        assert_eq!(o.window_ms(), Some(6007));
        assert_eq!(o.opened(), (30_900, 10), "but the window opened by then");
    }

    #[test]
    fn a_quiet_stretch_counts_its_windows_and_an_early_opening_starts_again() {
        let mut o = Openings::default();
        let mut seq = 0;
        for from in [0, 6000, 12_000, 30_000] {
            window(&mut o, &mut seq, from, 10, 60);
        }
        assert_eq!(o.window_ms(), Some(6000));
        // The upstream's windows became 2 s long.
        window(&mut o, &mut seq, 32_000, 10, 60);
        assert_eq!((o.anchor, o.window_ms()), (Some((32_000, 1100)), None));
        window(&mut o, &mut seq, 34_000, 10, 60);
        assert_eq!(o.window_ms(), Some(2000));
    }
}
