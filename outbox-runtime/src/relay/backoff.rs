//! [`SubjectBackoff`]: the subjects one relay leaves out of its claims for a few seconds, and
//! when each may be tried again: subjects the broker could not take (an election) and subjects
//! cut at a row another transaction holds. Failures that count are scheduled in the shared
//! `outbox_retries` table instead (docs/relay.md, *Backoff*).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// One paused subject.
#[derive(Debug, Clone, Copy)]
struct Entry {
    pauses: u32,
    until: Instant,
}

/// A per-subject schedule kept in memory: the n-th consecutive pause of a subject lasts
/// `base * 2^(n-1)`, capped at `max`; a publish of the subject clears it.
#[derive(Debug)]
pub(super) struct SubjectBackoff {
    base: Duration,
    max: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl SubjectBackoff {
    /// A schedule from `base` doubling up to `max`.
    pub(super) fn new(base: Duration, max: Duration) -> Self {
        SubjectBackoff {
            base,
            max,
            entries: Mutex::default(),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The subjects a claim must leave out at `now`. Entries whose time passed more than
    /// `forget` ago are dropped (their next pause starts the schedule afresh).
    pub(super) fn excluded(&self, now: Instant, forget: Duration) -> Vec<String> {
        let mut entries = self.entries();
        entries.retain(|_, e| e.until + forget > now);
        entries
            .iter()
            .filter(|(_, e)| e.until > now)
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// Whether no subject is paused (or remembered).
    /// Ends every pause.
    pub(super) fn clear(&self) {
        self.entries().clear();
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// The earliest end of a pause still ahead of `now`.
    pub(super) fn next_end(&self, now: Instant) -> Option<Instant> {
        self.entries()
            .values()
            .map(|e| e.until)
            .filter(|t| *t > now)
            .min()
    }

    /// `published` subjects are cleared; each of `paused` is paused once more from `now`.
    pub(super) fn settle<'a>(
        &self,
        published: impl IntoIterator<Item = &'a str>,
        paused: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) {
        let mut entries = self.entries();
        if !entries.is_empty() {
            for subject in published {
                entries.remove(subject);
            }
        }
        for subject in paused {
            let entry = entries.entry(subject.to_owned()).or_insert(Entry {
                pauses: 0,
                until: now,
            });
            entry.pauses += 1;
            let factor = 1u32 << (entry.pauses - 1).min(20);
            entry.until = now + self.base.saturating_mul(factor).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> SubjectBackoff {
        SubjectBackoff::new(Duration::from_secs(1), Duration::from_secs(8))
    }

    #[test]
    fn consecutive_pauses_double_up_to_the_cap() {
        let b = backoff();
        let t0 = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..6 {
            b.settle([], ["s"], t0);
            waits.push((b.next_end(t0).unwrap() - t0).as_secs());
        }
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
    }

    #[test]
    fn a_publish_clears_the_subject() {
        let b = backoff();
        let t0 = Instant::now();
        b.settle([], ["a", "b"], t0);
        b.settle(["a"], [], t0);
        assert_eq!(b.excluded(t0, Duration::from_secs(16)), ["b"]);
    }

    #[test]
    fn a_subject_is_left_out_until_its_time_and_forgotten_later() {
        let b = backoff();
        let t0 = Instant::now();
        b.settle([], ["s"], t0); // until t0 + 1 s
        let forget = Duration::from_secs(16);
        assert_eq!(b.excluded(t0, forget), ["s"]);
        let due = t0 + Duration::from_secs(1);
        assert!(b.excluded(due, forget).is_empty(), "due: claimable again");
        assert!(b.next_end(due).is_none());
        b.settle([], ["s"], due);
        assert_eq!(
            b.next_end(due),
            Some(due + Duration::from_secs(2)),
            "the second pause in a row"
        );
        let late = due + Duration::from_secs(2) + forget;
        assert!(b.excluded(late, forget).is_empty());
        b.settle([], ["s"], late);
        assert_eq!(
            b.next_end(late),
            Some(late + Duration::from_secs(1)),
            "a fresh schedule"
        );
    }
}
