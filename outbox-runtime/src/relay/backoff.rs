//! [`SubjectBackoff`]: the subjects this relay is backing off, and when each may be tried
//! again (docs/relay.md, *Backoff*).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

use super::config::RelayConfig;

/// One backed-off subject.
#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    next_try: Instant,
}

/// The per-subject retry schedule of one relay: the n-th consecutive failure of a subject
/// excludes it from this relay's claims for [`RelayConfig::backoff`]`(n)`; a success clears it.
#[derive(Debug, Default)]
pub(super) struct SubjectBackoff {
    entries: Mutex<HashMap<String, Entry>>,
}

impl SubjectBackoff {
    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The subjects a claim must skip at `now`. Entries whose retry time passed more than
    /// `forget` ago are dropped: another relay may have published the subject meanwhile, and
    /// this one would never hear of it.
    pub(super) fn excluded(&self, now: Instant, forget: std::time::Duration) -> Vec<String> {
        let mut entries = self.entries();
        entries.retain(|_, b| b.next_try + forget > now);
        entries
            .iter()
            .filter(|(_, b)| b.next_try > now)
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// The earliest retry time still ahead of `now`.
    pub(super) fn next_retry(&self, now: Instant) -> Option<Instant> {
        self.entries()
            .values()
            .map(|b| b.next_try)
            .filter(|t| *t > now)
            .min()
    }

    /// The subjects backed off at `now`, with their consecutive failures, sorted.
    pub(super) fn backed_off(&self, now: Instant) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self
            .entries()
            .iter()
            .filter(|(_, b)| b.next_try > now)
            .map(|(s, b)| (s.clone(), b.failures))
            .collect();
        v.sort();
        v
    }

    /// A batch's outcome: `published` subjects are cleared, each of `failed` has one more
    /// consecutive failure and its next try scheduled from `now`.
    pub(super) fn settle<'a>(
        &self,
        published: impl IntoIterator<Item = &'a str>,
        failed: impl IntoIterator<Item = &'a str>,
        now: Instant,
        config: &RelayConfig,
    ) {
        let mut entries = self.entries();
        if !entries.is_empty() {
            for subject in published {
                entries.remove(subject);
            }
        }
        for subject in failed {
            let entry = entries.entry(subject.to_owned()).or_insert(Entry {
                failures: 0,
                next_try: now,
            });
            entry.failures += 1;
            entry.next_try = now + config.backoff(entry.failures);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> RelayConfig {
        RelayConfig {
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(8),
            ..RelayConfig::default()
        }
    }

    #[test]
    fn consecutive_failures_double_the_wait_up_to_the_cap() {
        let b = SubjectBackoff::default();
        let t0 = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..6 {
            b.settle([], ["s"], t0, &config());
            waits.push(b.next_retry(t0).unwrap() - t0);
        }
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 8, 8]);
        assert_eq!(b.backed_off(t0), [("s".to_owned(), 6)]);
    }

    #[test]
    fn a_success_clears_the_subject() {
        let b = SubjectBackoff::default();
        let t0 = Instant::now();
        b.settle([], ["a", "b"], t0, &config());
        b.settle(["a"], [], t0, &config());
        assert_eq!(b.excluded(t0, Duration::from_secs(16)), ["b"]);
    }

    #[test]
    fn a_subject_is_excluded_until_its_retry_time_and_forgotten_later() {
        let b = SubjectBackoff::default();
        let t0 = Instant::now();
        b.settle([], ["s"], t0, &config()); // retry at t0 + 1 s
        let forget = Duration::from_secs(16);
        assert_eq!(b.excluded(t0, forget), ["s"]);
        let due = t0 + Duration::from_secs(1);
        assert!(b.excluded(due, forget).is_empty(), "due: claimable again");
        assert!(b.backed_off(due).is_empty());
        assert!(b.next_retry(due).is_none());
        // still remembered (a failure now would be the second in a row) ...
        b.settle([], ["s"], due, &config());
        assert_eq!(b.backed_off(due), [("s".to_owned(), 2)]);
        // ... until `forget` after its retry time
        let late = due + Duration::from_secs(2) + forget;
        assert!(b.excluded(late, forget).is_empty());
        b.settle([], ["s"], late, &config());
        assert_eq!(
            b.backed_off(late),
            [("s".to_owned(), 1)],
            "a fresh schedule"
        );
    }
}
