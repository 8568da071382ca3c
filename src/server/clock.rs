//! The only clock: monotonic milliseconds since start for every deadline,
//! and the wall clock to show them as Unix time. Wall-clock steps never move
//! a lease: only the monotonic clock decides. The Unix time of monotonic 0
//! (`Epoch`) is read at start and compared with the wall clock again once a
//! second; when they disagree by more than [`STEP_MS`] (NTP stepped the
//! clock, the machine resumed from suspend, which the monotonic clock does
//! not count, or the server started before the clock was set) the epoch
//! follows the wall clock, so `Date`, the access log, signature and token
//! times and the Unix deadlines shown from then on are the wall clock's.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::time::{Epoch, EpochMs, Ms, Now};

/// A disagreement larger than this is a step of the wall clock; a smaller
/// one is the two clocks read a moment apart, and moves nothing.
pub const STEP_MS: u64 = 100;
/// How often, in monotonic ms, the wall clock is read again.
pub const CHECK_EVERY_MS: Ms = 1000;

pub struct Clock {
    start: Instant,
    epoch: Epoch,
    /// The monotonic instant of the next wall-clock reading.
    next_check: Ms,
    /// Unix milliseconds now (the system's wall clock, or a test's).
    wall: fn() -> u64,
}

fn system_wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(crate::time::millis).unwrap_or(0)
}

impl Clock {
    pub fn start() -> Clock {
        Clock::with_wall(system_wall_ms)
    }

    fn with_wall(wall: fn() -> u64) -> Clock {
        Clock { start: Instant::now(), epoch: Epoch::at(EpochMs(wall())), next_check: CHECK_EVERY_MS, wall }
    }

    pub fn now_ms(&self) -> Ms {
        self.ms_at(Instant::now())
    }

    /// The monotonic milliseconds of an instant already read.
    pub fn ms_at(&self, at: Instant) -> Ms {
        crate::time::millis(at.saturating_duration_since(self.start))
    }

    /// The reading of an instant already read, with the wall time it maps to.
    /// Once a second of it, the wall clock is read again (see the module).
    pub fn at(&mut self, at: Instant) -> Now {
        let ms = self.ms_at(at);
        if ms >= self.next_check {
            self.follow_wall(ms);
        }
        Now { ms, epoch: self.epoch }
    }

    fn follow_wall(&mut self, ms: Ms) {
        self.next_check = ms + CHECK_EVERY_MS;
        let wall = (self.wall)();
        if wall.abs_diff(self.epoch.wall(ms).0) > STEP_MS {
            self.epoch = Epoch::at(EpochMs(wall.saturating_sub(ms)));
        }
    }

    /// The Unix time of monotonic 0.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    static WALL: AtomicU64 = AtomicU64::new(1_700_000_000_000);

    fn test_wall() -> u64 {
        WALL.load(Ordering::SeqCst)
    }

    #[test]
    fn the_wall_time_follows_a_step_of_the_wall_clock_within_a_second() {
        const T0: u64 = 1_700_000_000_000;
        WALL.store(T0, Ordering::SeqCst);
        let mut clock = Clock::with_wall(test_wall);
        let at = |clock: &mut Clock, ms: u64| clock.at(clock.start + Duration::from_millis(ms));
        assert_eq!(at(&mut clock, 500).wall(), EpochMs(T0 + 500));
        // NTP steps the clock an hour forward (or the machine slept an hour).
        WALL.store(T0 + 1_200 + 3_600_000, Ordering::SeqCst);
        let now = at(&mut clock, 1_200);
        assert_eq!((now.ms, now.wall()), (1_200, EpochMs(T0 + 1_200 + 3_600_000)));
        assert_eq!(at(&mut clock, 1_700).wall(), EpochMs(T0 + 1_700 + 3_600_000), "until the next reading");
        // Then back two hours: shown within a second, the monotonic time untouched.
        WALL.store(T0 + 2_300 - 3_600_000, Ordering::SeqCst);
        assert_eq!(at(&mut clock, 2_000).wall(), EpochMs(T0 + 2_000 + 3_600_000), "read once a second");
        let now = at(&mut clock, 2_300);
        assert_eq!((now.ms, now.wall()), (2_300, EpochMs(T0 + 2_300 - 3_600_000)));
        // A reading a few ms off (the two clocks read a moment apart) moves nothing.
        WALL.store(T0 + 3_400 - 3_600_000 + STEP_MS, Ordering::SeqCst);
        assert_eq!(at(&mut clock, 3_400).wall(), EpochMs(T0 + 3_400 - 3_600_000));
        assert_eq!(clock.epoch(), Epoch::at(EpochMs(T0 - 3_600_000)));
    }
}
