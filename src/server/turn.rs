//! A turn's time: how long one turn of the loop serves connections before
//! the rest wait for the next.
//!
//! A connection's budget bounds what one turn does for it (`conn::Budget`),
//! but not how many connections one turn serves: with thousands of clients
//! pipelining, serving each its budget took a turn a second, and nothing
//! outside the turn — a stop signal, a health check, a timer — was looked
//! at until it ended. So a turn also has a time, `TURN_TIME`: once it is up,
//! a connection the turn comes to is postponed, and the next turn, which
//! begins with a poll that does not wait, serves it first (`Server::run`).
//!
//! The clock is read once every `VISITS_PER_READING` connection visits,
//! never per request: a turn of fewer visits, the common one, never reads
//! it beyond its start.

use std::time::{Duration, Instant};

/// How long a turn serves connections before it postpones the rest.
pub const TURN_TIME: Duration = Duration::from_millis(10);
/// Connection visits between two readings of the clock: a visit answers
/// at most a budget's requests (`conn::REQUEST_BUDGET`), so the turn's
/// time is overrun by a few milliseconds at most.
const VISITS_PER_READING: u32 = 64;

/// The current turn's visits and whether its time is up.
#[derive(Debug)]
pub struct TurnTime {
    /// Visits left before the clock is read.
    until_reading: u32,
    up: bool,
}

impl Default for TurnTime {
    fn default() -> TurnTime {
        TurnTime { until_reading: VISITS_PER_READING, up: false }
    }
}

impl TurnTime {
    /// A turn begins: its time starts anew.
    #[inline]
    pub fn begin(&mut self) {
        *self = TurnTime::default();
    }

    /// Counts a visit to a connection in the turn begun at `started`, and
    /// says whether the turn's time is up (then the connection waits for
    /// the next turn).
    #[inline]
    pub fn is_up(&mut self, started: Instant) -> bool {
        if self.until_reading > 0 {
            self.until_reading -= 1;
            return false;
        }
        self.read(started)
    }

    /// Every visit once the time is up, and every `VISITS_PER_READING`th before.
    #[cold]
    #[inline(never)]
    fn read(&mut self, started: Instant) -> bool {
        if !self.up {
            self.up = started.elapsed() >= TURN_TIME;
            if !self.up {
                self.until_reading = VISITS_PER_READING - 1;
            }
        }
        self.up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_read_once_every_visits_per_reading() {
        let mut time = TurnTime::default();
        let long_ago = Instant::now() - 10 * TURN_TIME;
        for visit in 0..VISITS_PER_READING {
            assert!(!time.is_up(long_ago), "visit {visit}: the clock is not read yet");
        }
        assert!(time.is_up(long_ago), "the reading finds the time up");
        assert!(time.is_up(long_ago), "and it stays up for the rest of the turn");
        time.begin();
        assert!(!time.is_up(long_ago), "a new turn has its time");
    }

    #[test]
    fn a_turn_within_its_time_serves_every_visit() {
        let mut time = TurnTime::default();
        // A start in the future: however slowly this runs, the time is never up.
        let started = Instant::now() + Duration::from_secs(3600);
        assert!((0..10 * VISITS_PER_READING).all(|_| !time.is_up(started)));
    }
}
