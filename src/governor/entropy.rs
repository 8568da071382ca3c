//! The random bytes in slot ids (and in the stand-in slot secret a
//! governor signs with until it is given the server's), from a source the
//! caller hands in.
//!
//! The governor does no I/O: the server gives it the OS source
//! (`state::os_random`), tests a seeded one, so what a test grants is the
//! same on every run. Bytes are fetched a page at a time, so a grant does
//! not cost a system call.

const PAGE: usize = 4096;

enum Source {
    /// Fills a buffer with random bytes (the OS source).
    Fill(fn(&mut [u8])),
    /// A deterministic SplitMix64 stream from a seed: for tests and benchmarks
    /// only, never for ids a client could be handed.
    Seeded(u64),
}

pub struct Entropy {
    buf: [u8; PAGE],
    pos: usize,
    source: Source,
}

impl Entropy {
    /// Random bytes from `fill` (e.g. `state::os_random`).
    pub fn from_fn(fill: fn(&mut [u8])) -> Entropy {
        Entropy { buf: [0; PAGE], pos: PAGE, source: Source::Fill(fill) }
    }

    /// The same bytes on every run for the same seed.
    pub fn seeded(seed: u64) -> Entropy {
        Entropy { buf: [0; PAGE], pos: PAGE, source: Source::Seeded(seed) }
    }

    pub fn take<const N: usize>(&mut self) -> [u8; N] {
        if self.pos + N > self.buf.len() {
            self.refill();
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        // Never hand the same bytes out twice.
        self.buf[self.pos..self.pos + N].fill(0);
        self.pos += N;
        out
    }

    fn refill(&mut self) {
        match &mut self.source {
            Source::Fill(fill) => fill(&mut self.buf),
            Source::Seeded(state) => {
                for chunk in self.buf.chunks_mut(8) {
                    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = *state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes()[..chunk.len()]);
                }
            }
        }
        self.pos = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_never_repeats_within_a_page() {
        let mut e = Entropy::seeded(1);
        let a = e.take::<8>();
        let b = e.take::<8>();
        assert_ne!(a, b);
        for _ in 0..600 {
            e.take::<8>();
        }
    }

    #[test]
    fn a_seed_gives_the_same_bytes_every_time_and_another_seed_others() {
        let (mut a, mut b, mut c) = (Entropy::seeded(7), Entropy::seeded(7), Entropy::seeded(8));
        let first = a.take::<32>();
        assert_eq!(first, b.take::<32>());
        assert_ne!(first, c.take::<32>());
    }

    #[test]
    fn a_fill_source_is_used_a_page_at_a_time() {
        fn ones(buf: &mut [u8]) {
            buf.fill(1);
        }
        let mut e = Entropy::from_fn(ones);
        assert_eq!(e.take::<4>(), [1; 4]);
    }
}
