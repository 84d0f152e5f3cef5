//! Lanes: the batch loops of one relay, each on its share of the subject partitions, and the
//! decision each makes after a batch (docs/relay.md, *Lanes* and *Wake-up*).

use std::time::Duration;

use super::config::RelayConfig;

/// The share of the subject partitions one batch loop claims from: slot `index` of `count`,
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

    /// The partitions `[from, to)` of this slot out of `partitions`, as the statements'
    /// `in_lane!` computes them: `index * partitions / count` to the next slot's start.
    pub(super) fn range(self, partitions: i32) -> (i32, i32) {
        let start = |i: i32| (i64::from(i) * i64::from(partitions) / i64::from(self.count)) as i32;
        (start(self.index), start(self.index + 1))
    }
}

/// Whether rows a batch could not take are waiting ([`WAITING`](super::sql::WAITING)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    /// No unpublished row of the lane is claimable but for other transactions' locks.
    Nothing,
    /// Some are: held by another transaction (row lock, partition lock, or an older row of
    /// their subject), or committed after the claim's snapshot.
    Elsewhere,
}

/// What a lane's batch came to, as far as the lane's next step is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It published or held something: progress.
    Published,
    /// It published nothing and some publishes failed (the broker refuses them).
    Failed,
    /// It published and failed nothing, and some rows were not attempted: the broker could not
    /// take them (`connected` says whether the NATS connection is up: an election if it is).
    NotAttempted { connected: bool },
    /// It published and failed nothing; `Waiting` says whether rows it could not take wait.
    Empty(Waiting),
    /// The batch itself failed (Postgres, or the start of the transaction).
    Error,
}

/// A lane's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Claim again at once.
    Again,
    /// Other transactions hold the rows this lane could publish (another relay): run one lane
    /// for a while, and claim again after the pause or at the next announced commit.
    Contended(Duration),
    /// The broker or Postgres is failing: claim again after the pause, whatever commits.
    Backoff(Duration),
    /// The NATS connection is down: claim again as soon as it is back, or after the pause.
    Reconnect(Duration),
    /// Nothing to do: wait for a commit, the fallback poll or a subject's retry time.
    Idle,
}

/// How soon a lane claims again after a batch in which other transactions held every row it
/// could have published; it doubles while that lasts, up to [`CONTENDED_MAX`] (or the poll
/// interval, if shorter): the holder may be a relay that froze, whose locks go within seconds.
const CONTENDED_RETRY: Duration = Duration::from_millis(10);
const CONTENDED_MAX: Duration = Duration::from_secs(1);
/// How soon a lane claims again after a batch the broker could not take (an election); it
/// doubles while that lasts, up to [`LOOP_BACKOFF_MAX`](super::config::LOOP_BACKOFF_MAX).
const ELECTION_RETRY: Duration = Duration::from_millis(250);

/// The consecutive failures and contended batches of one lane.
#[derive(Debug, Default)]
pub(super) struct LaneState {
    failures: u32,
    elections: u32,
    contended: u32,
}

impl LaneState {
    /// The step after a batch with `outcome`; `commit_seen` says whether a commit was
    /// announced while it ran (the waiting rows may then be that commit's).
    pub(super) fn next(
        &mut self,
        outcome: Outcome,
        commit_seen: bool,
        config: &RelayConfig,
    ) -> Next {
        match outcome {
            Outcome::Published => {
                self.failures = 0;
                self.elections = 0;
                self.contended = 0;
                Next::Again
            }
            Outcome::Failed | Outcome::Error => {
                self.failures = self.failures.saturating_add(1);
                Next::Backoff(config.loop_backoff(self.failures))
            }
            Outcome::NotAttempted { connected } => {
                let wait = ELECTION_RETRY.saturating_mul(1 << self.elections.min(16));
                self.elections = self.elections.saturating_add(1);
                let wait = wait.min(super::config::LOOP_BACKOFF_MAX);
                if connected {
                    Next::Backoff(wait)
                } else {
                    Next::Reconnect(super::config::LOOP_BACKOFF_MAX)
                }
            }
            Outcome::Empty(Waiting::Elsewhere) if commit_seen => Next::Again,
            Outcome::Empty(Waiting::Elsewhere) => {
                let wait = CONTENDED_RETRY.saturating_mul(1 << self.contended.min(16));
                self.contended = self.contended.saturating_add(1);
                Next::Contended(wait.min(CONTENDED_MAX).min(config.poll_interval))
            }
            Outcome::Empty(Waiting::Nothing) => {
                self.contended = 0;
                Next::Idle
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
            poll_interval: Duration::from_secs(5),
            ..RelayConfig::default()
        }
    }

    fn run(steps: &[(Outcome, bool)]) -> Vec<Next> {
        let mut state = LaneState::default();
        steps
            .iter()
            .map(|&(o, seen)| state.next(o, seen, &config()))
            .collect()
    }

    const ELSEWHERE: Outcome = Outcome::Empty(Waiting::Elsewhere);
    const NOTHING: Outcome = Outcome::Empty(Waiting::Nothing);
    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    const fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_batch_that_published_claims_again_at_once() {
        assert_eq!(run(&[(Outcome::Published, false)]), [Next::Again]);
        assert_eq!(run(&[(Outcome::Published, true)]), [Next::Again]);
    }

    #[test]
    fn failures_back_off_on_the_schedule_and_a_publish_resets_it() {
        use Outcome::*;
        assert_eq!(
            run(&[
                (Failed, false),
                (Error, true),
                (Failed, false),
                (Error, false),
                (Error, false),
                (Published, false),
                (Failed, false)
            ]),
            [
                Next::Backoff(s(1)),
                Next::Backoff(s(2)),
                Next::Backoff(s(4)),
                Next::Backoff(s(4)),
                Next::Backoff(s(4)),
                Next::Again,
                Next::Backoff(s(1))
            ]
        );
    }

    #[test]
    fn rows_held_elsewhere_are_retried_soon_doubling_up_to_a_second() {
        let steps = [(ELSEWHERE, false); 12];
        let nexts = run(&steps);
        assert_eq!(
            &nexts[..4],
            [
                Next::Contended(ms(10)),
                Next::Contended(ms(20)),
                Next::Contended(ms(40)),
                Next::Contended(ms(80))
            ]
        );
        assert_eq!(nexts[6], Next::Contended(ms(640)));
        assert_eq!(nexts[7], Next::Contended(s(1)), "at most a second");
        assert_eq!(nexts[11], Next::Contended(s(1)));
    }

    #[test]
    fn rows_waiting_after_an_announced_commit_are_claimed_at_once() {
        assert_eq!(
            run(&[(ELSEWHERE, false), (ELSEWHERE, true), (ELSEWHERE, false)]),
            [
                Next::Contended(ms(10)),
                Next::Again,
                Next::Contended(ms(20))
            ],
            "a commit seen does not reset the contention"
        );
    }

    #[test]
    fn an_empty_lane_is_idle_and_resets_the_contention() {
        assert_eq!(
            run(&[
                (ELSEWHERE, false),
                (ELSEWHERE, false),
                (NOTHING, false),
                (ELSEWHERE, false),
                (NOTHING, true)
            ]),
            [
                Next::Contended(ms(10)),
                Next::Contended(ms(20)),
                Next::Idle,
                Next::Contended(ms(10)),
                Next::Idle
            ]
        );
    }

    #[test]
    fn a_failure_does_not_reset_the_contention_and_contention_does_not_reset_failures() {
        use Outcome::*;
        assert_eq!(
            run(&[
                (ELSEWHERE, false),
                (Failed, false),
                (ELSEWHERE, false),
                (Failed, false)
            ]),
            [
                Next::Contended(ms(10)),
                Next::Backoff(s(1)),
                Next::Contended(ms(20)),
                Next::Backoff(s(2))
            ]
        );
    }

    #[test]
    fn a_batch_the_broker_could_not_take_waits_briefly_or_for_the_connection() {
        let nexts = run(&[
            (Outcome::NotAttempted { connected: true }, false),
            (Outcome::NotAttempted { connected: true }, false),
            (Outcome::NotAttempted { connected: false }, false),
            (Outcome::Published, false),
            (Outcome::NotAttempted { connected: true }, false),
        ]);
        assert_eq!(
            nexts,
            [
                Next::Backoff(ms(250)),
                Next::Backoff(ms(500)),
                Next::Reconnect(s(5)),
                Next::Again,
                Next::Backoff(ms(250))
            ]
        );
    }

    #[test]
    fn an_outage_never_pauses_a_lane_longer_than_a_few_seconds() {
        let config = RelayConfig::default(); // backoff_max 5 min
        let mut state = LaneState::default();
        let waits: Vec<Next> = (0..12)
            .map(|_| state.next(Outcome::Error, false, &config))
            .collect();
        assert_eq!(waits[0], Next::Backoff(s(1)));
        assert_eq!(waits[11], Next::Backoff(s(5)));
    }
}
