//! The units of time every layer speaks, and the one place monotonic time
//! becomes wall time.
//!
//! A leaf: it imports nothing from the crate, so the governor, the wheel
//! and the reactor can all name the same units without importing each other.
//! Deadlines are decided on the monotonic clock only; wall time is for
//! showing them (answers, logs, the dashboard) and for slot ids another
//! process reads. [`Epoch::wall`] is the only conversion between the two.

/// Monotonic milliseconds since the server started.
pub type Ms = u64;

/// Whole milliseconds of a duration, in 64-bit arithmetic (`as_millis`
/// divides a 128-bit count, on every request).
pub fn millis(d: std::time::Duration) -> u64 {
    d.as_secs() * 1_000 + u64::from(d.subsec_millis())
}

/// Whole microseconds of a duration, as `millis`.
pub fn micros(d: std::time::Duration) -> u64 {
    d.as_secs() * 1_000_000 + u64::from(d.subsec_micros())
}

/// Unix epoch milliseconds: wall time, never what decides a deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EpochMs(pub u64);

/// The Unix time of monotonic 0, read once when the clock starts: wall-clock
/// steps afterwards move no deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epoch {
    base: u64,
}

impl Epoch {
    /// Monotonic 0 is `base` Unix milliseconds.
    pub const fn at(base: EpochMs) -> Epoch {
        Epoch { base: base.0 }
    }

    /// The wall time of a monotonic instant.
    pub const fn wall(self, at: Ms) -> EpochMs {
        EpochMs(self.base + at)
    }

    /// The monotonic instant of a wall time, if it is not before monotonic 0.
    pub const fn monotonic(self, at: EpochMs) -> Option<Ms> {
        at.0.checked_sub(self.base)
    }
}

/// One reading of the clock: what a reactor turn works with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    /// Monotonic milliseconds: every deadline is decided on these.
    pub ms: Ms,
    pub epoch: Epoch,
}

impl Now {
    /// The wall time of this reading.
    pub const fn wall(self) -> EpochMs {
        self.epoch.wall(self.ms)
    }

    /// The wall time of another monotonic instant (a deadline), on the same epoch.
    pub const fn wall_at(self, at: Ms) -> EpochMs {
        self.epoch.wall(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_millis_and_micros_agree_with_the_128_bit_ones() {
        use std::time::Duration;
        for d in [
            Duration::ZERO,
            Duration::from_nanos(999_999),
            Duration::new(3, 1_999_999),
            Duration::new(86_400 * 365, 999_999_999),
        ] {
            assert_eq!(millis(d), d.as_millis() as u64, "{d:?}");
            assert_eq!(micros(d), d.as_micros() as u64, "{d:?}");
        }
    }

    #[test]
    fn wall_and_monotonic_are_inverse_from_monotonic_zero_on() {
        let epoch = Epoch::at(EpochMs(1_700_000_000_000));
        assert_eq!(epoch.wall(250), EpochMs(1_700_000_000_250));
        assert_eq!(epoch.monotonic(EpochMs(1_700_000_000_250)), Some(250));
        assert_eq!(epoch.monotonic(EpochMs(1_699_999_999_999)), None);
        let now = Now { ms: 10, epoch };
        assert_eq!((now.wall(), now.wall_at(30)), (EpochMs(1_700_000_000_010), EpochMs(1_700_000_000_030)));
    }
}
