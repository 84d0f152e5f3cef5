//! What the soak counts with: latency histograms that merge and never grow, and the random
//! numbers of its arrivals.

use std::time::Duration;

/// Each bucket is this much wider than the one before: quantiles read within 1%.
const GROWTH: f64 = 1.01;
/// Buckets from 1 µs up to about 1,000 s (`GROWTH` to the power of this is 1e9 µs).
const BUCKETS: usize = 2_100;

/// Latencies in logarithmic buckets (1% wide, 1 µs to about 1,000 s): a fixed 17 kB however
/// many samples, so a 30-minute run keeps one per minute, per step and for the whole run.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max_us: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max_us: 0.0,
        }
    }
}

impl Histogram {
    /// Counts one latency.
    pub fn record(&mut self, latency: Duration) {
        let us = latency.as_secs_f64() * 1e6;
        let bucket = if us <= 1.0 {
            0
        } else {
            ((us.ln() / GROWTH.ln()).ceil() as usize).min(BUCKETS - 1)
        };
        self.counts[bucket] += 1;
        self.total += 1;
        self.max_us = self.max_us.max(us);
    }

    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// The `p`-th percentile (0 to 100) in milliseconds, nearest rank: the upper edge of its
    /// bucket, never above the largest sample; `None` without samples.
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((p / 100.0) * self.total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let upper = GROWTH.powi(bucket as i32);
                return Some(upper.min(self.max_us) / 1e3);
            }
        }
        Some(self.max_us / 1e3)
    }

    /// `p50 x p99 y p99.9 z` in ms, or `none` without samples.
    pub fn summary(&self) -> String {
        match (
            self.percentile_ms(50.0),
            self.percentile_ms(99.0),
            self.percentile_ms(99.9),
        ) {
            (Some(p50), Some(p99), Some(p999)) => {
                format!("p50 {p50:.2} p99 {p99:.2} p99.9 {p999:.2} ms")
            }
            _ => "none".into(),
        }
    }
}

/// A small, fast generator (splitmix64) for arrival times and choices; its quality is more
/// than a load generator needs, and it keeps the benchmark off another dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock.
    pub fn from_clock() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng(nanos ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// The wait until the next arrival of a Poisson process of `per_second` arrivals a second
    /// (exponentially distributed, mean `1 / per_second`).
    pub fn exponential(&mut self, per_second: f64) -> Duration {
        Duration::from_secs_f64(-self.unit().ln() / per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_read_within_one_percent() {
        let mut h = Histogram::default();
        for ms in 1..=1_000 {
            h.record(Duration::from_millis(ms));
        }
        for (p, want) in [(50.0, 500.0), (99.0, 990.0), (99.9, 999.0)] {
            let got = h.percentile_ms(p).expect("samples");
            assert!(
                (got - want).abs() <= want * 0.01,
                "p{p}: {got} ms, want {want} ms within 1%"
            );
        }
        assert_eq!(h.percentile_ms(100.0), Some(1_000.0));
        assert_eq!(Histogram::default().percentile_ms(50.0), None);
    }

    #[test]
    fn merged_histograms_count_both() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(Duration::from_millis(1));
        b.record(Duration::from_millis(100));
        a.merge(&b);
        assert_eq!(a.total, 2);
        assert_eq!(a.percentile_ms(100.0), Some(100.0));
    }

    #[test]
    fn poisson_waits_average_the_rate() {
        let mut rng = Rng(42);
        let n = 100_000;
        let total: f64 = (0..n).map(|_| rng.exponential(1_000.0).as_secs_f64()).sum();
        let mean_ms = total / n as f64 * 1e3;
        assert!((mean_ms - 1.0).abs() < 0.02, "mean wait {mean_ms} ms");
    }
}
