//! When an upstream's request windows open, for one that says what is left
//! of its budget (`remaining`) but never when the window resets.
//!
//! Within a window `remaining` only goes down from call to call. A call
//! that finds clearly more left than the latest one granted before it is in
//! a new window, which opened somewhere between the two grants (the span).
//! Say a window of 60 opens every 6 s and the pool grants a call every
//! 100 ms: the call granted at 11 950 ms finds 2 left, the one at 12 050 ms
//! finds 59: a window opened in (11 950, 12 050]. The middles of such spans,
//! counted in windows, give the windows' length; the last opening gives
//! their phase, taken at the grant that found it (the span's end, so the
//! next end is not put early by the span). `Learning` takes the end of the
//! window a call was granted in as the reset the upstream did not say, and
//! paces the window's grants up to it, so the next opening is found within
//! a grant's spacing.
//!
//! A length is only measured between openings found closely (a span under
//! a quarter of the interval): an opening found after an idle stretch may
//! lie anywhere in it. Nor is a `limit` raised by the upstream an opening.
//!
//! Pure arithmetic on instants and grant counts; O(1) per report. Not
//! saved: a restarted pool learns the openings again.
use crate::time::Ms;

/// One report's view of the window: the lease's grant count and grant
/// instant, what it found left, and the limit it was told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    seq: u64,
    at: Ms,
    left: u64,
    limit: Option<u64>,
}

/// The openings of an upstream's windows seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Openings {
    /// The report of the latest grant seen: later grants are compared with it.
    latest: Option<Seen>,
    /// The latest grant seen before the last opening: the start of that
    /// opening's span.
    before: Seen,
    /// The last opening: the grant that found it, and its grant count.
    last: Ms,
    last_seq: u64,
    /// The opening the length is measured from (its grant, its span), and
    /// the windows counted from it to the last opening.
    anchor: Option<(Ms, Ms)>,
    windows: u64,
    /// The windows' length (0: not known yet).
    window_ms: Ms,
}

impl Openings {
    /// A report of the lease granted `seq`th, at `granted_at`, that found
    /// `remaining` left of a window's `limit` (`None`: not said). More left
    /// than the latest grant found, by more than calls reordered on their
    /// way to the upstream can explain (a quarter of the limit, from 1 to
    /// 8 calls), marks an opening, unless the report tells a higher limit.
    /// Reports come back out of order: one of an earlier grant that finds
    /// the last opening's window moves that opening to its grant; any other
    /// of an earlier grant says nothing.
    pub fn on_report(&mut self, seq: u64, granted_at: Ms, remaining: u64, limit: Option<u64>) {
        let seen = Seen { seq, at: granted_at, left: remaining, limit };
        let jump = limit.map_or(4, |l| (l / 4).clamp(1, 8));
        let Some(latest) = self.latest else {
            self.latest = Some(seen);
            return;
        };
        if seq > latest.seq {
            let raised = matches!((limit, latest.limit), (Some(now), Some(then)) if now > then);
            if remaining >= latest.left.saturating_add(jump) && !raised {
                self.before = latest;
                self.open(granted_at, seq, granted_at.saturating_sub(latest.at));
            }
            self.latest = Some(seen);
        } else if seq > self.before.seq && seq < self.last_seq && remaining >= self.before.left.saturating_add(jump) {
            let span = granted_at.saturating_sub(self.before.at);
            if let Some((at, known)) = self.anchor.filter(|&(at, _)| at == self.last) {
                self.anchor = Some((at.min(granted_at), known.min(span)));
            }
            (self.last, self.last_seq) = (self.last.min(granted_at), seq);
        }
    }

    /// An opening found at `at` by the grant counted `seq`, `span` after
    /// the grant before it.
    fn open(&mut self, at: Ms, seq: u64, span: Ms) {
        let Some((anchor, anchor_span)) = self.anchor.filter(|_| at > self.last) else {
            if self.anchor.is_none() {
                (self.anchor, self.last, self.last_seq) = (Some((at, span)), at, seq);
            }
            return;
        };
        let interval = at - self.last;
        (self.last, self.last_seq) = (at, seq);
        let w = self.window_ms;
        if w == 0 {
            // The first length: both openings found closely, or none is
            // measured and the newer one becomes the anchor.
            if span.max(anchor_span) <= interval / 4 {
                self.windows = 1;
                self.window_ms = (at - span / 2).saturating_sub(anchor - anchor_span / 2);
            }
            if self.window_ms == 0 || span < anchor_span {
                (self.anchor, self.windows) = (Some((at, span)), 0);
            }
            return;
        }
        // Openings after a quiet stretch span several windows. One a
        // quarter of a window or more before where the length puts it says
        // the length was wrong (or the upstream changed it): learn it again
        // from here.
        let windows = (interval + w / 2) / w;
        if windows == 0 || interval + w / 4 <= windows * w {
            (self.anchor, self.windows, self.window_ms) = (Some((at, span)), 0, 0);
            return;
        }
        self.windows += windows;
        // From the middle of one span to the middle of the other; a span
        // wider than the anchor's (a probe that waited for the calls out)
        // measures nothing.
        if span <= (w / 16).max(anchor_span) {
            let (from, to) = (anchor - anchor_span / 2, at - span / 2);
            self.window_ms = to.saturating_sub(from) / self.windows;
        }
        // A closer opening measures the length from now on (the length
        // found so far is kept until the next one).
        if span < anchor_span {
            (self.anchor, self.windows) = (Some((at, span)), 0);
        }
    }

    /// The windows' length, once two openings found closely gave it.
    pub fn window_ms(&self) -> Option<Ms> {
        (self.window_ms > 0).then_some(self.window_ms)
    }

    /// The end of the window a call granted at `granted_at` was in, when
    /// that window is the one the last opening began and the length is
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
            window(&mut o, &mut seq, from, 60, 60);
        }
        assert_eq!((o.window_ms(), o.opened().0), (Some(6000), 30_000), "three windows counted, none measured");
        // The upstream's windows became 2 s long.
        window(&mut o, &mut seq, 36_000, 20, 60);
        window(&mut o, &mut seq, 38_000, 20, 60);
        assert_eq!((o.anchor, o.window_ms()), (Some((38_000, 100)), None));
        window(&mut o, &mut seq, 40_000, 20, 60);
        assert_eq!(o.window_ms(), Some(2000));
    }

    /// An opening found after an idle stretch may lie anywhere in it: no
    /// length is measured from it (a pool would otherwise take ten minutes
    /// for one window and pace itself to a call a minute).
    #[test]
    fn no_length_is_measured_from_an_opening_found_after_an_idle_stretch() {
        let mut o = Openings::default();
        let mut seq = 0;
        for from in [0, 600_000, 606_000] {
            window(&mut o, &mut seq, from, 10, 60);
        }
        assert_eq!((o.window_ms(), o.anchor), (None, Some((606_000, 5100))));
        // Calls all through the windows find them closely (the first such
        // window's opening was still found after a stretch with none).
        for from in [612_000, 618_000, 624_000] {
            window(&mut o, &mut seq, from, 60, 60);
        }
        assert_eq!(o.window_ms(), Some(6000));
    }

    #[test]
    fn a_limit_the_upstream_raises_is_no_opening() {
        let mut o = Openings::default();
        o.on_report(1, 100, 20, Some(60));
        o.on_report(2, 200, 79, Some(120));
        assert_eq!(o.anchor, None);
        o.on_report(3, 6000, 119, Some(120));
        assert_eq!(o.opened(), (6000, 3));
    }
}
