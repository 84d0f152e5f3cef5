//! The default draw of a schedule: every kind of operation, at random, each concern from a
//! generator of its own.

use std::time::Duration;

use super::{
    Action, ConsumerPlan, CreatedAt, Emit, EventSpec, FreezeHow, Insert, Intrusion, Node, Op, Path,
    PoisonKind, RelayKind, RelayMode, RetentionPlan, Schedule, Settings, Shape, Topology, Writer,
    EVENT_TYPES, FUTURE, PAST, RELAY_SLOTS,
};
use crate::rng::Rng;

/// A schedule being drawn.
pub(super) struct Draft {
    pub(super) seed: u64,
    pub(super) root: Rng,
    pub(super) settings: Settings,
    pub(super) topology: Topology,
    pub(super) lanes: usize,
    pub(super) writers: Vec<Writer>,
    pub(super) ops: Vec<Op>,
    pub(super) duration: Duration,
    pub(super) poisons: usize,
    pub(super) transactions: usize,
}

impl Draft {
    pub(super) fn push(&mut self, at: Duration, action: Action) {
        self.ops.push(Op { at, action });
    }

    pub(super) fn finish(
        mut self,
        retention: Option<RetentionPlan>,
        consumers: Option<ConsumerPlan>,
    ) -> Schedule {
        // stable: operations drawn for the same instant keep their order
        self.ops.sort_by_key(|op| op.at);
        Schedule {
            seed: self.seed,
            topology: self.topology,
            lanes: self.lanes,
            writers: self.writers,
            ops: self.ops,
            duration: self.duration,
            retention,
            consumers,
        }
    }

    pub(super) fn relay_kind(&self, rng: &mut Rng) -> RelayKind {
        match self.settings.relays {
            RelayMode::Task => RelayKind::Task,
            RelayMode::Process => RelayKind::Process,
            RelayMode::Mixed => {
                if rng.chance(0.5) {
                    RelayKind::Task
                } else {
                    RelayKind::Process
                }
            }
        }
    }

    /// The default draw: every kind of operation, at random.
    pub(super) fn everything(&mut self) {
        self.relays();
        self.broker();
        self.postgres();
        self.catalog();
        self.intruder();
        let count = self.root.fork("writers").between(2, 4) as usize;
        let mut rng = self.root.fork("writers");
        for n in 0..count {
            let subjects = rng.between(1, 3) as usize;
            let skew = rng
                .chance(0.25)
                .then(|| rng.pick(&[-90_000, -20_000, -3_000, 2_000, 30_000]));
            let interval = rng.millis(Duration::from_millis(300), Duration::from_millis(1500));
            self.writer(&mut rng, n, subjects, skew, interval, true);
        }
        let mut bursts = self.root.fork("bursts");
        if bursts.chance(0.5) {
            self.burst_writer(&mut bursts, count);
        }
        self.shared_transactions();
        self.poison_rows();
    }

    /// Relays joining, leaving, failing and coming back, slot by slot.
    fn relays(&mut self) {
        let mut rng = self.root.fork("relays");
        let initial = rng.between(1, RELAY_SLOTS as u64) as usize;
        // per slot: its relay's kind while one runs, and when the slot is free for another op
        let mut running: Vec<Option<RelayKind>> = vec![None; RELAY_SLOTS];
        let mut free_at = [Duration::ZERO; RELAY_SLOTS];
        for (relay, slot) in running.iter_mut().enumerate().take(initial) {
            let kind = self.relay_kind(&mut rng);
            *slot = Some(kind);
            self.push(
                Duration::from_millis(300 * relay as u64),
                Action::RelayJoin { relay, kind },
            );
        }
        let mut t = rng.secs(3, 8);
        let end = self.duration.saturating_sub(Duration::from_secs(5));
        while t < end {
            let relay = rng.index(RELAY_SLOTS);
            if free_at[relay] > t {
                t += rng.secs(1, 4);
                continue;
            }
            let Some(kind) = running[relay] else {
                let kind = self.relay_kind(&mut rng);
                running[relay] = Some(kind);
                self.push(t, Action::RelayJoin { relay, kind });
                free_at[relay] = t + Duration::from_secs(3);
                t += rng.secs(3, 12);
                continue;
            };
            #[derive(Clone, Copy)]
            enum Pick {
                Freeze,
                NatsFreeze,
                PgFreeze,
                Cut,
                Kill,
                Leave,
            }
            let pick = rng.weighted(&[
                (Pick::Freeze, 3),
                (Pick::NatsFreeze, 3),
                (Pick::PgFreeze, 2),
                (Pick::Cut, 2),
                (Pick::Kill, 2),
                (Pick::Leave, 2),
            ]);
            let busy = match pick {
                Pick::Freeze => {
                    let how = match kind {
                        RelayKind::Process if rng.chance(0.6) => FreezeHow::Signal,
                        _ => FreezeHow::Proxies,
                    };
                    let length = rng.secs(5, 45);
                    self.push(t, Action::RelayFreeze { relay, how, length });
                    length
                }
                Pick::NatsFreeze | Pick::PgFreeze => {
                    let path = if matches!(pick, Pick::NatsFreeze) {
                        Path::Nats
                    } else {
                        Path::Postgres
                    };
                    let length = rng.secs(5, 50);
                    self.push(
                        t,
                        Action::RelayPathFreeze {
                            relay,
                            path,
                            length,
                        },
                    );
                    length
                }
                Pick::Cut => {
                    let path = rng.pick(&[Path::Nats, Path::Postgres]);
                    self.push(t, Action::RelayPathCut { relay, path });
                    Duration::from_secs(1)
                }
                Pick::Kill | Pick::Leave => {
                    let action = if matches!(pick, Pick::Kill) {
                        Action::RelayKill { relay }
                    } else {
                        Action::RelayLeave { relay }
                    };
                    self.push(t, action);
                    running[relay] = None;
                    // most slots get a relay again a little later
                    if rng.chance(0.8) {
                        let back = t + rng.secs(2, 15);
                        let kind = self.relay_kind(&mut rng);
                        running[relay] = Some(kind);
                        self.push(back, Action::RelayJoin { relay, kind });
                        back + Duration::from_secs(3) - t
                    } else {
                        Duration::from_secs(3)
                    }
                }
            };
            free_at[relay] = t + busy;
            t += rng.secs(4, 15);
        }
    }

    /// Broker kills, freezes and step-downs, one at a time.
    fn broker(&mut self) {
        let mut rng = self.root.fork("broker");
        let mut t = rng.secs(3, 10);
        let end = self.duration.saturating_sub(Duration::from_secs(5));
        let cluster = self.topology == Topology::Cluster;
        while t < end {
            let node = if cluster && rng.chance(0.5) {
                Node::StreamLeader
            } else if cluster {
                Node::Index(rng.index(3))
            } else {
                Node::Index(0)
            };
            #[derive(Clone, Copy)]
            enum Pick {
                Kill,
                Signal,
                Proxies,
                StepDown,
            }
            let pick = rng.weighted(&[
                (Pick::Kill, 3),
                (Pick::Signal, 2),
                (Pick::Proxies, 2),
                (Pick::StepDown, if cluster { 3 } else { 0 }),
            ]);
            let busy = match pick {
                Pick::Kill => {
                    let down = rng.secs(3, 40);
                    self.push(t, Action::BrokerKill { node, down });
                    down
                }
                Pick::Signal | Pick::Proxies => {
                    let how = if matches!(pick, Pick::Signal) {
                        FreezeHow::Signal
                    } else {
                        FreezeHow::Proxies
                    };
                    let length = rng.secs(3, 35);
                    self.push(t, Action::BrokerFreeze { node, how, length });
                    length
                }
                Pick::StepDown => {
                    let count = rng.between(1, 3);
                    for n in 0..count {
                        self.push(t + Duration::from_secs(3 * n), Action::StepDown);
                    }
                    Duration::from_secs(3 * count)
                }
            };
            t += busy + rng.secs(5, 25);
        }
    }

    /// Postgres restarts and connection kills.
    fn postgres(&mut self) {
        let mut rng = self.root.fork("postgres");
        let mut t = rng.secs(5, 20);
        let end = self.duration.saturating_sub(Duration::from_secs(5));
        while t < end {
            let action = match rng.below(3) {
                0 => Action::PgKillConnections,
                n => Action::PgRestart {
                    immediate: n == 2,
                    down: rng.secs(1, 6),
                },
            };
            self.push(t, action);
            t += rng.secs(10, 35);
        }
    }

    /// In half the runs, `pg_locks` revoked from `public` once, for 2-20 s, in the first half
    /// of the run (a generator of its own: the other draws of a seed are as before).
    fn catalog(&mut self) {
        let mut rng = self.root.fork("catalog");
        if rng.chance(0.5) {
            let half = (self.duration.as_secs() / 2).max(4);
            let at = rng.secs(3, half);
            let length = rng.secs(2, 20);
            self.push(at, Action::PgRevokeLocks { length });
        }
    }

    /// In half the runs, another role (no rights on the tables) interferes with the relays 1-3
    /// times, for 3-25 s each, at any time of the run (a generator of its own). The windows may
    /// overlap: each has a connection of its own.
    fn intruder(&mut self) {
        let mut rng = self.root.fork("intruder");
        if rng.chance(0.5) {
            let end = self.duration.as_secs().saturating_sub(5).max(3);
            for _ in 0..rng.between(1, 3) {
                let at = rng.secs(2, end);
                let how = rng.pick(&Intrusion::ALL);
                let length = rng.secs(3, 25);
                self.push(at, Action::Intrude { how, length });
            }
        }
    }

    /// A sequential writer `w<n>` with `subjects` subjects, emitting about every `interval`
    /// from the start to the end of the schedule; `long` lets it draw long, prepared and
    /// rolled-back transactions.
    pub(super) fn writer(
        &mut self,
        rng: &mut Rng,
        n: usize,
        subjects: usize,
        skew: Option<i64>,
        interval: Duration,
        long: bool,
    ) {
        let name = format!("w{n}");
        let subjects: Vec<String> = (0..subjects).map(|s| format!("{name}s{s}")).collect();
        let types: Vec<&str> = subjects.iter().map(|_| rng.pick(&EVENT_TYPES)).collect();
        let mut emits = Vec::new();
        let mut t = rng.millis(Duration::from_millis(200), Duration::from_secs(1));
        while t < self.duration {
            let s = rng.index(subjects.len());
            let insert = match skew {
                Some(ms) => Insert::Raw(CreatedAt::Skewed(ms)),
                None => rng.weighted(&[
                    (Insert::Emit, 2),
                    (Insert::Raw(CreatedAt::Default), 1),
                    (Insert::Raw(CreatedAt::Clock), 1),
                ]),
            };
            let shape = if long { draw_shape(rng) } else { Shape::Plain };
            emits.push(Emit {
                at: t,
                event: EventSpec {
                    subject: subjects[s].clone(),
                    event_type: types[s].to_owned(),
                    insert,
                },
                shape,
            });
            let jitter = rng.millis(interval / 2, interval * 3 / 2);
            t += shape.held_open() + jitter;
        }
        self.writers.push(Writer {
            name,
            subjects,
            emits,
        });
    }

    /// A sequential writer `w<n>` that emits in bursts: every 3-8 s, 200-800 events back to
    /// back, each in a transaction of its own, over 4-12 subjects. A burst keeps the relay's
    /// lanes busy past the 200 ms after which it lets the notify lock go (emits stop
    /// notifying), and the quiet after it has them wait for commits again: the wake-up's
    /// transitions under load, which one event a second never reaches.
    fn burst_writer(&mut self, rng: &mut Rng, n: usize) {
        let name = format!("w{n}");
        let count = rng.between(4, 12) as usize;
        let subjects: Vec<String> = (0..count).map(|s| format!("{name}s{s}")).collect();
        let types: Vec<&str> = subjects.iter().map(|_| rng.pick(&EVENT_TYPES)).collect();
        let mut emits = Vec::new();
        let mut t = rng.secs(1, 4);
        while t < self.duration {
            for _ in 0..rng.between(200, 800) {
                let s = rng.index(subjects.len());
                emits.push(Emit {
                    at: t,
                    event: EventSpec {
                        subject: subjects[s].clone(),
                        event_type: types[s].to_owned(),
                        insert: rng.weighted(&[
                            (Insert::Emit, 2),
                            (Insert::Raw(CreatedAt::Default), 1),
                            (Insert::Raw(CreatedAt::Clock), 1),
                        ]),
                    },
                    shape: Shape::Plain,
                });
            }
            t += rng.secs(3, 8);
        }
        self.writers.push(Writer {
            name,
            subjects,
            emits,
        });
    }

    /// Transactions of one to three events on shared subjects, with any `created_at`.
    fn shared_transactions(&mut self) {
        let mut rng = self.root.fork("shared");
        let subjects: Vec<String> = (0..6).map(|n| format!("c{n}")).collect();
        let mut t = rng.millis(Duration::from_millis(500), Duration::from_secs(2));
        while t < self.duration {
            let count = rng.between(1, 3);
            let events = (0..count)
                .map(|_| EventSpec {
                    subject: subjects[rng.index(subjects.len())].clone(),
                    event_type: rng.pick(&EVENT_TYPES).to_owned(),
                    insert: rng.weighted(&[
                        (Insert::Emit, 3),
                        (Insert::Raw(CreatedAt::Default), 1),
                        (Insert::Raw(CreatedAt::Clock), 1),
                        (Insert::Raw(CreatedAt::Fixed(PAST[0])), 1),
                        (Insert::Raw(CreatedAt::Fixed(PAST[1])), 1),
                        (Insert::Raw(CreatedAt::Fixed(FUTURE)), 1),
                    ]),
                })
                .collect();
            let shape = draw_shape(&mut rng);
            let label = format!("t{}", self.transactions);
            self.transactions += 1;
            self.push(
                t,
                Action::Transaction {
                    label,
                    events,
                    shape,
                },
            );
            t += rng.millis(Duration::from_millis(500), Duration::from_secs(3));
        }
    }

    /// One to four poison rows, some repaired later, some unblocked without a repair.
    fn poison_rows(&mut self) {
        let mut rng = self.root.fork("poison");
        let count = rng.between(1, 4);
        let latest = (self.duration.as_secs() * 6 / 10).max(2);
        for _ in 0..count {
            let at = rng.secs(1, latest);
            let kind = rng.pick(&PoisonKind::ALL);
            self.poison(&mut rng, at, kind, true);
        }
    }

    /// Poison row `kind` at `at`; `repairs` lets it draw a repair or an unblock.
    pub(super) fn poison(
        &mut self,
        rng: &mut Rng,
        at: Duration,
        kind: PoisonKind,
        repairs: bool,
    ) -> usize {
        let id = self.poisons;
        self.poisons += 1;
        let followers = if kind.in_created_at() {
            0
        } else {
            rng.between(0, 3) as usize
        };
        self.push(
            at,
            Action::Poison {
                id,
                kind,
                followers,
            },
        );
        if repairs && rng.chance(0.45) {
            let later = at + rng.secs(5, 25);
            self.push(later, Action::Repair { poison: id });
        } else if repairs && rng.chance(0.3) {
            let later = at + rng.secs(5, 20);
            self.push(later, Action::Unblock { poison: id });
        }
        id
    }
}

/// A transaction's shape: mostly plain, sometimes long, prepared or rolled back.
fn draw_shape(rng: &mut Rng) -> Shape {
    match rng.weighted(&[(0, 80), (1, 5), (2, 5), (3, 5), (4, 5)]) {
        0 => Shape::Plain,
        1 => Shape::SleepBefore(rng.secs(2, 20)),
        2 => Shape::SleepAfter(rng.secs(2, 20)),
        3 => Shape::Prepared(rng.secs(2, 25)),
        _ => Shape::RolledBack,
    }
}
