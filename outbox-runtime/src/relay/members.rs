//! Several relays on one table: each holds a row in `outbox_relays` with a heartbeat, and the
//! live relays share the subject partitions out between them in slots, one per lane, so that
//! their claims do not meet each other's locks (docs/relay.md, *Several relays*).
//!
//! The slots only spread the work: the partition's advisory lock still orders each subject, so
//! two relays that briefly disagree on the slots (one joined or left a moment ago, one is
//! frozen) compete for a partition, as any two transactions do, and publish nothing out of
//! order.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::timeout;
use uuid::Uuid;

use super::lanes::Lane;
use super::listen::Signals;
use super::sql;
use crate::error::Result;
use crate::table::OUTBOX_RELAYS;

/// How often a running relay refreshes its row and reads the others'.
pub(super) const BEAT: Duration = Duration::from_secs(1);
/// How long a relay whose row was not refreshed counts as running: after that its slots go to
/// the others (its batch in progress, if it is frozen, keeps its partitions' locks until
/// Postgres ends the transaction).
pub(super) const LEASE: Duration = Duration::from_secs(5);

/// One running relay, as its row says.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct Member {
    pub(super) id: Uuid,
    pub(super) partitions: i32,
    pub(super) lanes: i32,
}

/// This relay's slots among all the running relays' slots: its lane `i` (for `i < own`)
/// claims the partitions of slot `first + i` of `slots`, a contiguous range ([`Lane::range`]).
///
/// Each relay takes `max(1, lanes / relays)` slots, so that the relays together run about as
/// many lanes as one of them would alone: every lane's claim walks the index entries of every
/// slot to find its own, so more slots cost more reading, and beside other relays a relay's
/// own lanes add little overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Share {
    pub(super) first: i32,
    pub(super) own: i32,
    pub(super) slots: i32,
}

impl Share {
    /// A relay alone: its lanes split every partition.
    pub(super) fn alone(lanes: usize) -> Share {
        let lanes = lanes as i32;
        Share {
            first: 0,
            own: lanes,
            slots: lanes,
        }
    }

    /// `me`'s slots among `members` (`me` among them), in the order of their ids.
    pub(super) fn of(me: Uuid, members: &[Member], lanes: usize) -> Share {
        let mut sorted: Vec<&Member> = members.iter().collect();
        sorted.sort_by_key(|m| m.id);
        sorted.dedup_by_key(|m| m.id);
        let relays = sorted.len().max(1) as i32;
        let mut first = 0i32;
        let mut found = None;
        for m in &sorted {
            let own = (m.lanes / relays).max(1);
            if m.id == me {
                found = Some((first, own));
            }
            first = first.saturating_add(own);
        }
        match found {
            Some((at, own)) => Share {
                first: at,
                own,
                slots: first,
            },
            None => Share::alone(lanes),
        }
    }

    /// The partitions lane `lane` claims, or `None` when it has no slot: the relay has fewer
    /// slots than lanes, or there are more slots than partitions and its slot's range is
    /// empty (the lane rests until the slots change).
    pub(super) fn lane(self, lane: usize, partitions: i32) -> Option<Lane> {
        let index = self.first + lane as i32;
        let slot = Lane {
            index,
            count: self.slots,
        };
        let (from, to) = slot.range(partitions);
        ((lane as i32) < self.own && index < self.slots && from < to).then_some(slot)
    }
}

/// Refreshes `me`'s row and reads the running relays: one statement. The first (`joining`)
/// also tells the others, which share the partitions anew at once.
pub(super) async fn beat(
    pool: &PgPool,
    me: Uuid,
    partitions: i32,
    lanes: usize,
    joining: bool,
) -> Result<Vec<Member>> {
    let statement = if joining { sql::JOIN } else { sql::BEAT };
    sqlx::query_as::<_, Member>(statement)
        .bind(me)
        .bind(partitions)
        .bind(lanes as i32)
        .bind(LEASE.as_secs_f64())
        .fetch_all(pool)
        .await
        .map_err(|e| OUTBOX_RELAYS.error(e))
}

/// Deletes `me`'s row and tells the others, which take its slots at once.
pub(super) async fn leave(pool: &PgPool, me: Uuid) {
    let gone = sqlx::query(sql::LEAVE).bind(me).execute(pool);
    if let Err(e) = timeout(BEAT * 5, gone)
        .await
        .unwrap_or(Ok(Default::default()))
    {
        tracing::debug!(error = %e, "outbox relay could not delete its row in outbox_relays; the others take its partitions within 5 s");
    }
}

/// Sends `me`'s heartbeat every [`BEAT`] and publishes its share in `share`, until `stop`
/// turns true (between two heartbeats, so that none lands after [`leave`]). While the
/// heartbeat fails (Postgres down) the last share stays: the others may take this relay's
/// slots meanwhile, which the advisory locks make safe.
pub(super) async fn keep(
    pool: PgPool,
    me: Uuid,
    partitions: i32,
    lanes: usize,
    share: watch::Sender<Share>,
    signals: Signals,
    mut stop: watch::Receiver<bool>,
) {
    let mut joined_or_left = signals.members.subscribe();
    let commits = signals.commits;
    let mut tick = tokio::time::interval(BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first heartbeat was the relay's start
    let mut warned_mismatch = false;
    loop {
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return,
            _ = tick.tick() => {}
            _ = joined_or_left.changed() => {}
        }
        match timeout(LEASE, beat(&pool, me, partitions, lanes, false)).await {
            Ok(Ok(members)) => {
                metrics::gauge!(crate::metrics::RELAYS).set(members.len() as f64);
                let others: Vec<i32> = members
                    .iter()
                    .filter(|m| m.partitions != partitions)
                    .map(|m| m.partitions)
                    .collect();
                if !others.is_empty() && !warned_mismatch {
                    warned_mismatch = true;
                    tracing::error!(partitions, others = ?others, "outbox relays on this table run with different RelayConfig::partitions: their advisory locks do not meet, so events of one subject can be published out of order (each relay now claims every partition, so that none goes unclaimed); give every relay the same value");
                }
                let next = if others.is_empty() {
                    Share::of(me, &members, lanes)
                } else {
                    // relays of another partition count do not share slots with this one:
                    // each claims every partition (their locks do not meet, but no partition
                    // goes unclaimed)
                    Share::alone(lanes)
                };
                let changed = share.send_if_modified(|s| {
                    let changed = *s != next;
                    if changed {
                        tracing::info!(
                            relays = members.len(),
                            first_slot = next.first,
                            slots = next.slots,
                            "outbox relay shares the partitions anew"
                        );
                    }
                    *s = next;
                    changed
                });
                if changed {
                    // sleeping lanes claim their new partitions at once: rows there may have
                    // been announced while another relay owned them
                    commits.send_replace(());
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "outbox relay heartbeat in outbox_relays failed")
            }
            Err(_) => tracing::debug!("outbox relay heartbeat in outbox_relays did not answer"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(n: u128, lanes: i32) -> Member {
        Member {
            id: Uuid::from_u128(n),
            partitions: 1024,
            lanes,
        }
    }

    /// Every partition is claimed by exactly one lane of one relay.
    fn owners(members: &[Member], partitions: i32) -> Vec<usize> {
        let mut owners = vec![0usize; partitions as usize];
        for m in members {
            let share = Share::of(m.id, members, m.lanes as usize);
            for lane in 0..m.lanes as usize {
                if let Some(l) = share.lane(lane, partitions) {
                    for (p, owner) in owners.iter_mut().enumerate() {
                        let (from, to) = l.range(partitions);
                        if (from..to).contains(&(p as i32)) {
                            *owner += 1;
                        }
                    }
                }
            }
        }
        owners
    }

    #[test]
    fn a_relay_alone_splits_every_partition_between_its_lanes() {
        let me = member(7, 2);
        let share = Share::of(me.id, std::slice::from_ref(&me), 2);
        assert_eq!(share, Share::alone(2));
        assert_eq!(share.lane(0, 1024), Some(Lane { index: 0, count: 2 }));
        assert_eq!(share.lane(1, 1024), Some(Lane { index: 1, count: 2 }));
    }

    #[test]
    fn relays_with_any_lane_counts_cover_each_partition_once() {
        for members in [
            vec![member(1, 2), member(2, 2), member(3, 2), member(4, 2)],
            vec![member(9, 1), member(3, 4), member(5, 2)],
            vec![member(1, 64), member(2, 64)],
        ] {
            for partitions in [1024, 7, 128] {
                // with more slots than partitions, the slots whose range is empty rest
                let owners = owners(&members, partitions);
                assert!(
                    owners.iter().all(|&o| o == 1),
                    "{members:?} over {partitions}"
                );
            }
        }
    }

    #[test]
    fn slots_follow_the_ids_not_the_order_rows_come_in() {
        let a = [member(3, 2), member(1, 2)];
        let b = [member(1, 2), member(3, 2)];
        assert_eq!(Share::of(a[0].id, &a, 2), Share::of(a[0].id, &b, 2));
        assert_eq!(
            Share::of(Uuid::from_u128(3), &a, 2),
            Share {
                first: 1,
                own: 1,
                slots: 2
            }
        );
    }

    #[test]
    fn the_relays_together_run_about_as_many_lanes_as_one() {
        let four: Vec<Member> = (1..=4).map(|n| member(n, 2)).collect();
        for m in &four {
            let share = Share::of(m.id, &four, 2);
            assert_eq!((share.own, share.slots), (1, 4));
            assert!(share.lane(1, 1024).is_none(), "the second lane rests");
        }
        let two = [member(1, 8), member(2, 8)];
        assert_eq!(Share::of(two[1].id, &two, 8).own, 4);
        // lanes / relays, at least one each, whatever the others' lanes
        let mixed = [member(1, 1), member(2, 8)];
        assert_eq!(Share::of(mixed[0].id, &mixed, 1).own, 1);
        assert_eq!(Share::of(mixed[1].id, &mixed, 8).own, 4);
    }

    #[test]
    fn a_relay_missing_from_the_rows_claims_everything() {
        let others = [member(1, 2)];
        assert_eq!(Share::of(Uuid::from_u128(2), &others, 2), Share::alone(2));
    }
}
