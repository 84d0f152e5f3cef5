//! Schedules biased towards the findings of issue 30 and 31 (`--focus`): the operation that
//! exposes each, drawn around it from the seed.

use std::time::Duration;

use super::{
    Action, CreatedAt, Emit, EventSpec, FreezeHow, Insert, Node, Path, PoisonKind, RelayKind,
    Shape, Topology, Writer, EVENT_TYPES,
};
use crate::rng::Rng;

use super::draw::Draft;

/// How a late writer writes: the insert, and its transaction for a given length.
type LateShape = (Insert, fn(Duration) -> Shape);

impl Draft {
    pub(super) fn join(&mut self, rng: &mut Rng, relays: usize) {
        for relay in 0..relays {
            let kind = self.relay_kind(rng);
            self.push(
                Duration::from_millis(300 * relay as u64),
                Action::RelayJoin { relay, kind },
            );
        }
    }

    /// Issue 30's reorder: one lane, one relay, one held row (an uncaptured type), the broker
    /// down for 40-60 s while sequential writers emit one event per subject every 5-15 s.
    pub(super) fn reorder(&mut self) {
        let mut rng = self.root.fork("focus");
        self.topology = self.settings.topology.unwrap_or(Topology::Single);
        self.lanes = 1;
        self.join(&mut rng, 1);
        self.poison(
            &mut rng,
            Duration::from_secs(1),
            PoisonKind::Uncaptured,
            false,
        );
        let down = rng.secs(40, 60);
        let at = Duration::from_secs(8);
        self.push(
            at,
            Action::BrokerKill {
                node: Node::Index(0),
                down,
            },
        );
        self.duration = self.duration.max(at + down + Duration::from_secs(15));
        let mut writers = self.root.fork("writers");
        for n in 0..2 {
            let subjects = writers.between(2, 4) as usize;
            let interval = writers.secs(2, 5);
            self.writer(&mut writers, n, subjects, None, interval, false);
        }
    }

    /// Issue 30's stopped lane: rows in year 50000 and before Christ among healthy writers.
    pub(super) fn lane(&mut self) {
        let mut rng = self.root.fork("focus");
        let relays = rng.between(1, 2) as usize;
        self.join(&mut rng, relays);
        self.poison(
            &mut rng,
            Duration::from_secs(3),
            PoisonKind::CreatedAtYear50000,
            false,
        );
        let bc = rng.secs(10, 20);
        self.poison(&mut rng, bc, PoisonKind::CreatedAtBc, false);
        let mut writers = self.root.fork("writers");
        for n in 0..3 {
            let subjects = writers.between(2, 4) as usize;
            let interval = writers.millis(Duration::from_millis(300), Duration::from_secs(1));
            self.writer(&mut writers, n, subjects, None, interval, false);
        }
    }

    /// Issue 30's late rows: a held row elsewhere, and writers whose rows commit long after
    /// their `created_at` (a default-now() transaction that sleeps before its insert, prepared
    /// transactions, transactions that sleep after their emit), beside a steady writer.
    pub(super) fn late(&mut self) {
        let mut rng = self.root.fork("focus");
        // one lane: the held row parks a subject of the lane the late rows land in
        self.lanes = 1;
        self.join(&mut rng, 1);
        self.poison(
            &mut rng,
            Duration::from_secs(1),
            PoisonKind::Uncaptured,
            false,
        );
        let mut writers = self.root.fork("writers");
        let interval = writers.millis(Duration::from_millis(300), Duration::from_secs(1));
        self.writer(&mut writers, 0, 3, None, interval, false);
        // w1 draws every late shape (an emit that notified cannot be prepared: those fail);
        // w2 prepares every transaction
        let shapes: [&[LateShape]; 2] = [
            &[
                (Insert::Raw(CreatedAt::Default), Shape::SleepBefore),
                (Insert::Raw(CreatedAt::Clock), Shape::Prepared),
                (Insert::Emit, Shape::Prepared),
                (Insert::Emit, Shape::SleepAfter),
            ],
            &[(Insert::Raw(CreatedAt::Clock), Shape::Prepared)],
        ];
        for (n, (event_type, shapes)) in EVENT_TYPES[1..].iter().zip(shapes).enumerate() {
            let name = format!("w{}", n + 1);
            let subject = format!("{name}s0");
            let mut emits = Vec::new();
            let mut t = writers.secs(2, 4);
            while t < self.duration {
                let long = writers.secs(10, 20);
                let (insert, shape) = writers.pick(shapes);
                emits.push(Emit {
                    at: t,
                    event: EventSpec {
                        subject: subject.clone(),
                        event_type: (*event_type).to_owned(),
                        insert,
                    },
                    shape: shape(long),
                });
                t += long + writers.secs(1, 3);
            }
            self.writers.push(Writer {
                name,
                subjects: vec![subject],
                emits,
            });
        }
    }

    /// Issue 30's silent NATS path: two relays, many subjects emitting steadily, and relay 0's
    /// path to the broker silent for 35-50 s.
    pub(super) fn freeze(&mut self) {
        let mut rng = self.root.fork("focus");
        self.lanes = 2;
        self.join(&mut rng, 2);
        let length = rng.secs(35, 50);
        let at = Duration::from_secs(10);
        self.push(
            at,
            Action::RelayPathFreeze {
                relay: 0,
                path: Path::Nats,
                length,
            },
        );
        self.duration = self.duration.max(at + length + Duration::from_secs(10));
        let mut writers = self.root.fork("writers");
        for n in 0..4 {
            let interval = writers.millis(Duration::from_millis(200), Duration::from_millis(500));
            self.writer(&mut writers, n, 6, None, interval, false);
        }
    }

    /// Issue 31's frozen idle relay: two relays wait for commits, and each is frozen in turn
    /// for 35-45 s while writers emit now and then.
    pub(super) fn idle(&mut self) {
        let mut rng = self.root.fork("focus");
        let kinds = [self.relay_kind(&mut rng), self.relay_kind(&mut rng)];
        for (relay, kind) in kinds.into_iter().enumerate() {
            self.push(
                Duration::from_millis(300 * relay as u64),
                Action::RelayJoin { relay, kind },
            );
        }
        let mut at = Duration::from_secs(10);
        for (relay, kind) in kinds.into_iter().enumerate() {
            let how = match kind {
                RelayKind::Process if rng.chance(0.5) => FreezeHow::Signal,
                _ => FreezeHow::Proxies,
            };
            let length = rng.secs(35, 45);
            self.push(at, Action::RelayFreeze { relay, how, length });
            at += length + Duration::from_secs(10);
        }
        self.duration = self.duration.max(at);
        let mut writers = self.root.fork("writers");
        let interval = writers.secs(2, 4);
        self.writer(&mut writers, 0, 2, None, interval, false);
    }
}
