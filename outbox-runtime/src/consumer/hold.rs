//! Per-subject order on retry: while an event of subject S waits for its retry, this
//! consumer holds S's later events (they are nak'd, uncounted, to come back after it) and lets
//! other subjects flow.
//!
//! The hold is this process's memory of the events of each subject it saw and has not
//! finished (failed, or held behind an earlier one), by stream sequence. An event is handled
//! only when no earlier sequence of its subject is pending. An entry expires when its message
//! does not come back in time (another replica took it, an operator removed it), so a subject
//! is never held forever.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The pending events of each held subject.
#[derive(Debug, Default)]
pub(super) struct Holds {
    subjects: Mutex<HashMap<String, BTreeMap<u64, Pending>>>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    /// When its message is expected back.
    due: Instant,
    /// After this, the entry is forgotten.
    expires: Instant,
}

impl Holds {
    /// The earliest pending sequence of `subject` before `sequence`, and how long until it is
    /// due back, if there is one (expired entries are dropped on the way).
    pub(super) fn blocked(&self, subject: &str, sequence: u64) -> Option<(u64, Duration)> {
        let mut subjects = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
        let pending = subjects.get_mut(subject)?;
        let now = Instant::now();
        pending.retain(|_, p| p.expires > now);
        let first = pending
            .range(..sequence)
            .next()
            .map(|(seq, p)| (*seq, p.due.saturating_duration_since(now)));
        if pending.is_empty() {
            subjects.remove(subject);
        }
        first
    }

    /// Records that the message at `sequence` of `subject` is not finished and comes back after
    /// `delay`; it is forgotten if it has not come back `grace` later.
    pub(super) fn hold(&self, subject: &str, sequence: u64, delay: Duration, grace: Duration) {
        let now = Instant::now();
        let pending = Pending {
            due: now + delay,
            expires: now + delay + grace,
        };
        self.subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(subject.to_owned())
            .or_default()
            .insert(sequence, pending);
    }

    /// The message at `sequence` of `subject` is finished (applied, duplicate or given up).
    pub(super) fn release(&self, subject: &str, sequence: u64) {
        let mut subjects = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pending) = subjects.get_mut(subject) {
            pending.remove(&sequence);
            if pending.is_empty() {
                subjects.remove(subject);
            }
        }
    }

    /// Forgets every hold (the durable was re-created: sequences may start over).
    pub(super) fn clear(&self) {
        self.subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_pending_event_holds_later_events_of_its_subject_only() {
        let holds = Holds::default();
        holds.hold("s", 10, Duration::from_secs(1), LONG);
        assert_eq!(holds.blocked("s", 11).map(|b| b.0), Some(10));
        assert_eq!(holds.blocked("s", 10), None, "not held by itself");
        assert_eq!(holds.blocked("s", 9), None, "earlier events are not held");
        assert_eq!(holds.blocked("other", 11), None);
        holds.hold("s", 11, Duration::from_secs(1), LONG);
        holds.release("s", 10);
        assert_eq!(holds.blocked("s", 11), None, "11 is now the first");
        assert_eq!(holds.blocked("s", 12).map(|b| b.0), Some(11));
        holds.release("s", 11);
        assert_eq!(holds.blocked("s", 12), None);
        assert!(holds.subjects.lock().unwrap().is_empty());
    }

    #[test]
    fn an_entry_whose_message_never_comes_back_expires() {
        let holds = Holds::default();
        holds.hold("s", 1, Duration::ZERO, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(holds.blocked("s", 2), None);
        assert!(holds.subjects.lock().unwrap().is_empty());
    }
}
