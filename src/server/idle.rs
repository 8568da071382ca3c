//! How the loop waits for readiness: a short spin before it sleeps.
//!
//! A client that keeps many connections busy sends its next requests a few
//! microseconds after the loop answered the last ones. If the loop is asleep
//! in `epoll_wait` by then, the first arrival has to wake it, and the waking
//! is done by the client's `write`: on loopback the sender's CPU runs the
//! receiving socket's input path, which wakes the sleeping loop with an
//! inter-processor interrupt (in a virtual machine, an exit to the
//! hypervisor). Measured under wrk (PERFORMANCE.md), those wake-ups were the
//! part of the client's CPU per answer that the server decides.
//!
//! So after a turn that served more than one ready socket — concurrent
//! load, where the next arrival is microseconds away — the loop polls
//! without sleeping for up to `idleSpinUs` (50 µs unless configured)
//! before it blocks, and keeps doing so while each spin finds work. A spin that finds nothing ends the streak;
//! a turn with a single event (one sequential client, a timer) sleeps at
//! once, as does an idle server: the spin costs CPU only while several
//! clients are active, and at most `idleSpinUs` per turn; 0 turns it off.

use std::io;
use std::time::{Duration, Instant};

use mio::{Events, Poll};

/// Whether the turn that just ran had concurrent work (two ready sockets or
/// more): then more is likely to arrive within the spin (`idleSpinUs`).
pub fn concurrent(events: &Events) -> bool {
    events.iter().nth(1).is_some()
}

/// Waits for readiness into `events` for at most `timeout` (`None`: until
/// something is ready). With a non-zero `spin`, polls without sleeping
/// first, for up to `spin` (never beyond `timeout`), then blocks for the
/// rest. Returns whether the spin found the readiness (the next wait may
/// spin again).
pub fn wait(poll: &mut Poll, events: &mut Events, timeout: Option<Duration>, spin: Duration) -> io::Result<bool> {
    if !spin.is_zero() && timeout != Some(Duration::ZERO) {
        // The first look reads no clock: under the load a spin is for, it
        // mostly finds the next requests already there.
        poll.poll(events, Some(Duration::ZERO))?;
        if !events.is_empty() {
            return Ok(true);
        }
        let started = Instant::now();
        let spin_for = timeout.map_or(spin, |t| t.min(spin));
        // The clock is read every `LOOKS_PER_READING` looks: a look is a
        // system call, several times longer than a reading, so the spin
        // overshoots by a few looks at most, and an empty look costs little
        // more than its call.
        let mut looks = 0u32;
        loop {
            poll.poll(events, Some(Duration::ZERO))?;
            if !events.is_empty() {
                return Ok(true);
            }
            looks += 1;
            if looks.is_multiple_of(LOOKS_PER_READING) && started.elapsed() >= spin_for {
                break;
            }
            std::hint::spin_loop();
        }
        let timeout = timeout.map(|t| t.saturating_sub(started.elapsed()));
        return poll.poll(events, timeout).map(|()| false);
    }
    poll.poll(events, timeout).map(|()| false)
}

/// How many empty looks of a spin go between two readings of the clock.
const LOOKS_PER_READING: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Token, Waker};

    const WAKE: Token = Token(7);
    /// The default `idleSpinUs`.
    const SPIN: Duration = Duration::from_micros(50);

    #[test]
    fn readiness_that_is_already_there_is_returned_whether_spinning_or_not() {
        for spin in [Duration::ZERO, SPIN] {
            let mut poll = Poll::new().unwrap();
            let waker = Waker::new(poll.registry(), WAKE).unwrap();
            let mut events = Events::with_capacity(8);
            waker.wake().unwrap();
            // A generous bound: a wait that missed the event would block for all of it.
            let found_spinning = wait(&mut poll, &mut events, Some(Duration::from_secs(30)), spin).unwrap();
            assert_eq!(found_spinning, !spin.is_zero(), "a spinning wait finds it on its first poll");
            let tokens: Vec<Token> = events.iter().map(|e| e.token()).collect();
            assert_eq!(tokens, [WAKE], "spin: {spin:?}");
            assert!(!concurrent(&events), "one ready socket is not concurrent work");
        }
    }

    #[test]
    fn readiness_arriving_during_the_spin_is_returned() {
        let mut poll = Poll::new().unwrap();
        let waker = std::sync::Arc::new(Waker::new(poll.registry(), WAKE).unwrap());
        let mut events = Events::with_capacity(8);
        let remote = waker.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            remote.wake().unwrap();
        });
        // Spinning, then blocking: either way the wake arrives well within the bound.
        wait(&mut poll, &mut events, Some(Duration::from_secs(30)), SPIN).unwrap();
        thread.join().unwrap();
        assert_eq!(events.iter().map(|e| e.token()).collect::<Vec<_>>(), [WAKE]);
    }

    #[test]
    fn a_spinning_wait_with_nothing_ready_ends_at_its_timeout() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        for timeout in [Duration::from_micros(10), Duration::from_millis(2)] {
            let found_spinning = wait(&mut poll, &mut events, Some(timeout), SPIN).unwrap();
            assert!(!found_spinning && events.is_empty(), "nothing was registered, so nothing is ready");
        }
    }
}
