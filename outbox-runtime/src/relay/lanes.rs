//! Lanes: the batch loops of the relay that holds the lease, each on its share of the subject
//! partitions, and the decision each makes after a batch (docs/relay.md, *Lanes* and
//! *Wake-up*).

use std::time::Duration;

use super::config::RelayConfig;

/// The share of the subject partitions one batch loop claims from: lane `index` of `count`,
/// the contiguous range of partitions [`Lane::range`] (contiguous, so that the unpublished
/// index's partition column can bound it: migration 0010).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lane {
    pub(super) index: i32,
    pub(super) count: i32,
}

impl Lane {
    /// Every partition.
    pub(super) const ALL: Lane = Lane { index: 0, count: 1 };

    /// The partitions `[from, to)` of this lane out of `partitions`, as the statements'
    /// `in_lane!` computes them: `index * partitions / count` to the next lane's start.
    #[cfg(test)]
    pub(super) fn range(self, partitions: i32) -> (i32, i32) {
        let start = |i: i32| (i64::from(i) * i64::from(partitions) / i64::from(self.count)) as i32;
        (start(self.index), start(self.index + 1))
    }
}

/// What a lane's batch came to, as far as the lane's next step is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchOutcome {
    /// It published or held something: progress.
    Published,
    /// It published nothing and some publishes failed (the broker refuses them).
    Failed,
    /// It published and failed nothing, and some rows were not attempted: the broker could not
    /// take them (`connected` says whether the NATS connection is up: an election if it is).
    NotAttempted { connected: bool },
    /// It published nothing, and the place the next claim reads from moved on past a full
    /// window of rows it could not claim (a held subject's, or rows another transaction
    /// locks): there may be claimable rows after them, so the next claim goes at once.
    Moved,
    /// It claimed nothing it could publish.
    Empty,
    /// The batch itself failed (Postgres, or the start of the transaction).
    Error,
}

/// A lane's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LaneStep {
    /// Claim again at once.
    Again,
    /// The broker or Postgres is failing: claim again after the pause, whatever commits.
    Backoff(Duration),
    /// The NATS connection is down: claim again as soon as it is back, or after the pause.
    Reconnect(Duration),
    /// Nothing to do: wait for commits if the wake lock was held through the claim, otherwise
    /// claim again after the pause (lingering, while emits are in flight).
    Wait { linger: Duration },
}

/// How soon a lane claims again after an empty claim while the wake lock is not held (an emit
/// is in flight): it doubles while its claims stay empty, up to [`LINGER_MAX`].
const LINGER_FIRST: Duration = Duration::from_millis(1);
const LINGER_MAX: Duration = Duration::from_millis(50);
/// How soon a lane claims again after a batch the broker could not take (an election); it
/// doubles while that lasts, up to [`LOOP_BACKOFF_MAX`](super::config::LOOP_BACKOFF_MAX).
const ELECTION_RETRY: Duration = Duration::from_millis(250);

/// The consecutive failures and empty claims of one lane.
#[derive(Debug, Default)]
pub(super) struct LaneState {
    failures: u32,
    elections: u32,
    empty: u32,
}

impl LaneState {
    /// The step after a batch with `outcome`.
    pub(super) fn next(&mut self, outcome: BatchOutcome, config: &RelayConfig) -> LaneStep {
        match outcome {
            BatchOutcome::Published => {
                self.failures = 0;
                self.elections = 0;
                self.empty = 0;
                LaneStep::Again
            }
            BatchOutcome::Moved => LaneStep::Again,
            BatchOutcome::Failed | BatchOutcome::Error => {
                self.failures = self.failures.saturating_add(1);
                LaneStep::Backoff(config.loop_backoff(self.failures))
            }
            BatchOutcome::NotAttempted { connected } => {
                let wait = ELECTION_RETRY.saturating_mul(1 << self.elections.min(16));
                self.elections = self.elections.saturating_add(1);
                let wait = wait.min(super::config::LOOP_BACKOFF_MAX);
                if connected {
                    LaneStep::Backoff(wait)
                } else {
                    LaneStep::Reconnect(super::config::LOOP_BACKOFF_MAX)
                }
            }
            BatchOutcome::Empty => {
                let linger = LINGER_FIRST.saturating_mul(1 << self.empty.min(16));
                self.empty = self.empty.saturating_add(1);
                LaneStep::Wait {
                    linger: linger.min(LINGER_MAX),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RelayConfig {
        RelayConfig {
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(4),
            ..RelayConfig::default()
        }
    }

    fn run(steps: &[BatchOutcome]) -> Vec<LaneStep> {
        let mut state = LaneState::default();
        steps.iter().map(|&o| state.next(o, &config())).collect()
    }

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    const fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_batch_that_published_claims_again_at_once() {
        assert_eq!(run(&[BatchOutcome::Published]), [LaneStep::Again]);
    }

    #[test]
    fn a_batch_that_moved_past_rows_it_could_not_claim_reads_on_at_once() {
        use BatchOutcome::*;
        // a held subject's rows, window after window, then the claimable rows after them
        assert_eq!(
            run(&[Empty, Moved, Moved, Published]),
            [
                LaneStep::Wait { linger: ms(1) },
                LaneStep::Again,
                LaneStep::Again,
                LaneStep::Again
            ]
        );
    }

    #[test]
    fn failures_back_off_on_the_schedule_and_a_publish_resets_it() {
        use BatchOutcome::*;
        assert_eq!(
            run(&[Failed, Error, Failed, Error, Error, Published, Failed]),
            [
                LaneStep::Backoff(s(1)),
                LaneStep::Backoff(s(2)),
                LaneStep::Backoff(s(4)),
                LaneStep::Backoff(s(4)),
                LaneStep::Backoff(s(4)),
                LaneStep::Again,
                LaneStep::Backoff(s(1))
            ]
        );
    }

    #[test]
    fn empty_claims_linger_longer_each_time_up_to_a_bound_and_a_publish_resets_it() {
        use BatchOutcome::*;
        let steps = run(&[
            Empty, Empty, Empty, Empty, Empty, Empty, Empty, Empty, Published, Empty,
        ]);
        let lingers: Vec<Duration> = steps
            .iter()
            .filter_map(|s| match s {
                LaneStep::Wait { linger } => Some(*linger),
                _ => None,
            })
            .collect();
        assert_eq!(
            lingers,
            [
                ms(1),
                ms(2),
                ms(4),
                ms(8),
                ms(16),
                ms(32),
                ms(50),
                ms(50),
                ms(1)
            ]
        );
    }

    #[test]
    fn a_batch_the_broker_could_not_take_waits_briefly_or_for_the_connection() {
        use BatchOutcome::*;
        let nexts = run(&[
            NotAttempted { connected: true },
            NotAttempted { connected: true },
            NotAttempted { connected: false },
            Published,
            NotAttempted { connected: true },
        ]);
        assert_eq!(
            nexts,
            [
                LaneStep::Backoff(ms(250)),
                LaneStep::Backoff(ms(500)),
                LaneStep::Reconnect(s(5)),
                LaneStep::Again,
                LaneStep::Backoff(ms(250))
            ]
        );
    }

    #[test]
    fn an_outage_never_pauses_a_lane_longer_than_a_few_seconds() {
        let config = RelayConfig::default(); // backoff_max 5 min
        let mut state = LaneState::default();
        let waits: Vec<LaneStep> = (0..12)
            .map(|_| state.next(BatchOutcome::Error, &config))
            .collect();
        assert_eq!(waits[0], LaneStep::Backoff(s(1)));
        assert_eq!(waits[11], LaneStep::Backoff(s(5)));
    }

    #[test]
    fn lanes_split_the_partitions_into_contiguous_ranges() {
        let lanes: Vec<(i32, i32)> = (0..3)
            .map(|i| Lane { index: i, count: 3 }.range(1024))
            .collect();
        assert_eq!(lanes, [(0, 341), (341, 682), (682, 1024)]);
        assert_eq!(Lane::ALL.range(1024), (0, 1024));
    }
}
