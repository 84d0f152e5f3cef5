//! The seeded generator every draw of a schedule comes from: SplitMix64, small, fast, and the
//! same on every platform, so that a seed names one schedule for good.

use std::time::Duration;

/// A SplitMix64 generator. [`fork`](Self::fork) gives an independent generator per concern
/// (the writers, the faults, the poison rows), derived from the seed and a label, so that a
/// change in how one concern draws leaves the others' draws as they were.
#[derive(Debug, Clone)]
pub struct Rng {
    seed: u64,
    state: u64,
}

/// FNV-1a of `label`, to derive a fork's seed.
fn fnv(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Rng {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { seed, state: seed }
    }

    /// An independent generator for the concern `label`, whatever this one has drawn.
    pub fn fork(&self, label: &str) -> Rng {
        let mut mix = Rng::new(self.seed ^ fnv(label));
        Rng::new(mix.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`), by Lemire's multiply-shift (the bias is below 2^-32 for
    /// the small ranges a schedule draws from).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "an empty range");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "an empty range {lo}..={hi}");
        lo + self.below(hi - lo + 1)
    }

    /// An index into a collection of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    /// One of `items`, each with its weight.
    pub fn weighted<T: Copy>(&mut self, items: &[(T, u32)]) -> T {
        let total: u64 = items.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut n = self.below(total);
        for (item, w) in items {
            if n < u64::from(*w) {
                return *item;
            }
            n -= u64::from(*w);
        }
        unreachable!("the draw is below the total weight")
    }

    /// A duration in `lo..=hi`, to the millisecond.
    pub fn millis(&mut self, lo: Duration, hi: Duration) -> Duration {
        Duration::from_millis(self.between(lo.as_millis() as u64, hi.as_millis() as u64))
    }

    /// A duration in `lo..=hi` seconds, to the millisecond.
    pub fn secs(&mut self, lo: u64, hi: u64) -> Duration {
        self.millis(Duration::from_secs(lo), Duration::from_secs(hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_numbers_and_forks_are_independent_of_what_was_drawn() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let drawn: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(drawn, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        // the reference values of SplitMix64 for seed 1234567
        let mut r = Rng::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        let fresh = Rng::new(42).fork("writers").next_u64();
        assert_eq!(a.fork("writers").next_u64(), fresh);
        assert_ne!(fresh, Rng::new(42).fork("faults").next_u64());
        assert_ne!(fresh, Rng::new(43).fork("writers").next_u64());
    }

    #[test]
    fn draws_stay_in_their_ranges_and_reach_both_ends() {
        let mut r = Rng::new(7);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let n = r.between(3, 6);
            assert!((3..=6).contains(&n));
            seen[(n - 3) as usize] = true;
            let d = r.secs(2, 3);
            assert!(d >= Duration::from_secs(2) && d <= Duration::from_secs(3));
        }
        assert_eq!(seen, [true; 4]);
        let heavy = (0..1000)
            .filter(|_| r.weighted(&[(true, 9), (false, 1)]))
            .count();
        assert!((800..=980).contains(&heavy), "{heavy}");
    }
}
