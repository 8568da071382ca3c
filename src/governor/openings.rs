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
//! lie anywhere in it, and takes its place from the length instead. Calls
//! granted within `REORDER_MS` of each other may reach the upstream in
//! either order, so more left found by the later one is no opening; nor is
//! a `limit` raised by the upstream. An opening found closely but not where
//! the length puts it (more than an eighth of a window off the last one
//! found closely, in whole windows), or found a quarter of a window early,
//! says the length is wrong: it is learned again.
//!
//! Pure arithmetic on instants and grant counts; O(1) per report. Not
//! saved: a restarted pool learns the openings again.
use crate::time::Ms;

/// The furthest ahead a learned budget window may reach.
pub const MAX_BUDGET_WINDOW_MS: u64 = 3_600_000;
/// Calls granted this close together may reach the upstream in either
/// order (they leave through different connections and threads), so a
/// report's `remaining` may already count them, and a later one may find
/// more left than an earlier one.
pub const REORDER_MS: Ms = 50;

/// One report's view of the window: the lease's grant count and grant
/// instant, what it found left, and the limit it was told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    seq: u64,
    at: Ms,
    left: u64,
    limit: Option<u64>,
}

/// An opening: the grant that found its window, and how long after the
/// grant before it (the window opened somewhere in that span).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Found {
    at: Ms,
    span: Ms,
}

impl Found {
    /// The middle of its span: where the window most likely opened.
    fn middle(self) -> Ms {
        self.at - self.span / 2
    }
}

/// The openings of an upstream's windows seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Openings {
    /// The report of the latest grant seen: later grants are compared with it.
    latest: Option<Seen>,
    /// The latest grant seen before the last opening: the start of that
    /// opening's span.
    before: Seen,
    /// Where the last window opened, as far as is known, and the grant
    /// count of the grant that found it.
    last: Ms,
    last_seq: u64,
    /// The opening the length is measured from: the most closely found one.
    anchor: Option<Found>,
    /// The last opening found closely: where the length puts the next ones.
    base: Ms,
    /// The windows' length (0: not known yet).
    window_ms: Ms,
}

impl Openings {
    /// A report of the lease granted `seq`th, at `granted_at`, that found
    /// `remaining` left of a window's `limit` (`None`: not said). More left
    /// than the latest grant found, by more than calls reordered on their
    /// way to the upstream can explain (a quarter of the limit, from 1 to
    /// 8 calls, and granted at least `REORDER_MS` later), marks an opening,
    /// unless the report tells a higher limit. Reports come back out of
    /// order: one of an earlier grant that finds the last opening's window
    /// moves that opening to its grant; any other of an earlier grant says
    /// nothing.
    pub fn on_report(&mut self, seq: u64, granted_at: Ms, remaining: u64, limit: Option<u64>) {
        let seen = Seen { seq, at: granted_at, left: remaining, limit };
        let jump = limit.map_or(4, |l| (l / 4).clamp(1, 8));
        let Some(latest) = self.latest else {
            self.latest = Some(seen);
            return;
        };
        if seq > latest.seq {
            let raised = matches!((limit, latest.limit), (Some(now), Some(then)) if now > then);
            let span = granted_at.saturating_sub(latest.at);
            if remaining >= latest.left.saturating_add(jump) && !raised && span >= REORDER_MS {
                self.before = latest;
                self.open(Found { at: granted_at, span }, seq);
            }
            self.latest = Some(seen);
        } else if seq > self.before.seq && seq < self.last_seq && remaining >= self.before.left.saturating_add(jump) {
            let span = granted_at.saturating_sub(self.before.at);
            if span < REORDER_MS {
                return;
            }
            if let Some(anchor) = self.anchor.filter(|a| a.at == self.last) {
                self.anchor = Some(Found { at: anchor.at.min(granted_at), span: anchor.span.min(span) });
            }
            (self.last, self.last_seq) = (self.last.min(granted_at), seq);
        }
    }

    /// An opening `found` by the grant counted `seq`.
    fn open(&mut self, found: Found, seq: u64) {
        let Some(anchor) = self.anchor.filter(|_| found.at > self.last) else {
            if self.anchor.is_none() {
                self.restart(found, seq);
            }
            return;
        };
        let w = self.window_ms;
        if w == 0 {
            // The first length, between two openings in a row: both found
            // closely, or none is measured and the newer one is the anchor.
            if found.span.max(anchor.span) <= (found.at - anchor.at) / 4 {
                self.window_ms = found.middle().saturating_sub(anchor.middle()).min(MAX_BUDGET_WINDOW_MS);
                (self.last, self.last_seq, self.base) = (found.at, seq, found.at);
                if found.span < anchor.span {
                    self.anchor = Some(found);
                }
            } else {
                self.restart(found, seq);
            }
            return;
        }
        // Where the length puts this opening: whole windows (counted to the
        // middle of its span) after the last one found closely.
        let windows = (found.middle().saturating_sub(self.base) + w / 2) / w;
        let expected = self.base + windows * w;
        let close = found.span <= w / 16;
        if windows == 0 {
            // Half a window after an opening: no new window.
            return;
        }
        if found.at + w / 4 <= expected || close && found.at.abs_diff(expected) > w / 8 {
            // Open before the length says, or found closely away from it:
            // the length is wrong (or the upstream changed it). Learned
            // again from here.
            self.restart(found, seq);
            return;
        }
        // The window opened by the grant that found it (maybe earlier, after
        // a stretch without calls: the next window's grants, paced, find
        // the next opening closely).
        (self.last, self.last_seq) = (found.at, seq);
        if close {
            self.base = found.at;
        }
        // Measured from the middle of the anchor's span to this one's,
        // unless this span is wider (a probe that waited for the calls out).
        if close || found.span <= anchor.span {
            let since = (found.at - anchor.at + w / 2) / w;
            if let Some(w) = found.middle().saturating_sub(anchor.middle()).checked_div(since) {
                self.window_ms = w.min(MAX_BUDGET_WINDOW_MS);
            }
        }
        // A closer opening measures the length from now on.
        if found.span < anchor.span {
            self.anchor = Some(found);
        }
    }

    /// Learns the length again, from the opening `found`.
    fn restart(&mut self, found: Found, seq: u64) {
        (self.anchor, self.window_ms) = (Some(found), 0);
        (self.last, self.last_seq, self.base) = (found.at, seq, found.at);
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
        assert_eq!((o.anchor, o.window_ms(), o.end_of(6500)), (Some(Found { at: 6000, span: 100 }), None, None));
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
        assert_eq!((o.opened(), o.anchor), ((6000, 5), Some(Found { at: 6000, span: 5890 })));
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
        o.on_report(7, 23_950, 0, Some(60));
        o.on_report(8, 24_000, 59, Some(60));
        assert_eq!(o.window_ms(), Some(5997));
        // A wider span than the anchor's measures nothing; the window is
        // taken to open at the grant that found it (late, never early).
        o.on_report(9, 29_000, 0, Some(60));
        o.on_report(10, 30_900, 59, Some(60));
        assert_eq!(o.window_ms(), Some(5997));
        assert_eq!(o.opened(), (30_900, 10));
    }

    #[test]
    fn a_quiet_stretch_counts_its_windows_and_an_early_opening_starts_again() {
        let mut o = Openings::default();
        let mut seq = 0;
        for from in [0, 6000, 12_000, 30_000] {
            window(&mut o, &mut seq, from, 60, 60);
        }
        assert_eq!((o.window_ms(), o.opened().0), (Some(6000), 30_000), "three windows counted, none measured");
        // The upstream's windows became 2 s long: an opening a third of a
        // window after the last says nothing yet, the next one is early.
        for from in [36_000, 38_000, 40_000] {
            window(&mut o, &mut seq, from, 20, 60);
        }
        assert_eq!((o.anchor, o.window_ms()), (Some(Found { at: 40_000, span: 100 }), None));
        window(&mut o, &mut seq, 42_000, 20, 60);
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
        assert_eq!((o.window_ms(), o.anchor), (None, Some(Found { at: 606_000, span: 5100 })));
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

    /// Calls granted together reach the upstream in either order: the
    /// later one finding more left is no opening (review: a burst's swap
    /// made a span-0 anchor that fixed a third of the real length for good).
    #[test]
    fn calls_granted_together_open_nothing_whatever_they_find() {
        let mut o = Openings::default();
        o.on_report(1, 5402, 0, Some(60));
        o.on_report(2, 6419, 59, Some(60));
        o.on_report(3, 6901, 40, Some(60));
        o.on_report(4, 6901, 49, Some(60));
        assert_eq!(o.opened(), (6419, 2));
        o.on_report(5, 10_977, 0, Some(60));
        o.on_report(6, 11_986, 59, Some(60));
        let mut seq = 6;
        for from in (1..18).map(|w| 12_000 + w * 6000) {
            window(&mut o, &mut seq, from, 60, 60);
        }
        assert_eq!(o.window_ms(), Some(6000));
    }

    /// A known length survives a stretch without calls: the opening found
    /// late after it takes its place from the length, and the next one,
    /// found closely, is where the length puts it (review: it looked early
    /// and the length was dropped).
    #[test]
    fn a_stretch_without_calls_keeps_the_length_and_the_phase() {
        let mut o = Openings::default();
        let mut seq = 0;
        for from in [0, 6000, 12_000, 18_000] {
            window(&mut o, &mut seq, from, 60, 60);
        }
        assert_eq!(o.window_ms(), Some(6000));
        // Found late, at the first call after the stretch: that window's end
        // is put late (never early), and its paced calls find the next
        // opening where it is.
        window(&mut o, &mut seq, 26_500, 30, 60);
        assert_eq!((o.window_ms(), o.end_of(26_500)), (Some(6000), Some(32_500)));
        window(&mut o, &mut seq, 30_000, 60, 60);
        assert_eq!((o.window_ms(), o.opened().0), (Some(6000), 30_000));
    }

    /// A length that is a fraction of the real one (the openings still fall
    /// near its multiples) is caught by an opening found closely more than
    /// an eighth of a window from where it puts it.
    #[test]
    fn a_closely_found_opening_away_from_the_length_drops_it() {
        let mut o = Openings::default();
        let mut seq = 0;
        for from in [0, 1600] {
            window(&mut o, &mut seq, from, 16, 60);
        }
        window(&mut o, &mut seq, 3200, 60, 60);
        assert_eq!(o.window_ms(), Some(1600));
        // The real windows are 6 s: the next opens 3.75 of those later.
        window(&mut o, &mut seq, 9200, 60, 60);
        assert_eq!((o.window_ms(), o.opened().0), (None, 9200));
    }
}
