//! Executing a schedule in real time: the writers, each operation at its time (faults held for
//! their length, then healed), and a monitor that watches the relays and samples the locks a
//! frozen relay's sessions hold. Operations on one server wait for each other, so that a fault
//! that runs late never overlaps the next on the same server.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::history::{Fault, History, LockSample, Time};
use crate::relays::Fleet;
use crate::schedule::{Action, FreezeHow, Intrusion, Node, Schedule};
use crate::servers::{Servers, RELAY_ROLE};
use crate::workload::Workload;

/// The run's parts, shared by its tasks.
#[derive(Debug)]
pub struct Run {
    /// The servers.
    pub servers: Arc<Servers>,
    /// The relays.
    pub fleet: Arc<Fleet>,
    /// The writers.
    pub workload: Arc<Workload>,
    /// The history.
    pub history: Arc<History>,
    /// The schedule's time zero.
    pub start: Instant,
    /// How long a graceful stop may take.
    pub stop_bound: Duration,
    /// Held by a Postgres fault while it lasts.
    pg: Mutex<()>,
    /// Held by a broker fault while it lasts.
    broker: Mutex<()>,
}

impl Run {
    /// A run of these parts.
    pub fn new(
        servers: Arc<Servers>,
        fleet: Arc<Fleet>,
        workload: Arc<Workload>,
        history: Arc<History>,
        start: Instant,
        stop_bound: Duration,
    ) -> Run {
        Run {
            servers,
            fleet,
            workload,
            history,
            start,
            stop_bound,
            pg: Mutex::new(()),
            broker: Mutex::new(()),
        }
    }

    /// Runs `schedule` to its end: every writer done, every operation done and its fault
    /// healed.
    pub async fn execute(self: &Arc<Self>, schedule: &Schedule) {
        // dropped (on a panic of the harness) it aborts every task of the schedule
        let mut tasks = tokio::task::JoinSet::new();
        for (n, writer) in schedule.writers.iter().enumerate() {
            let (run, writer) = (self.clone(), writer.clone());
            tasks.spawn(async move { run.workload.writer(n, &writer).await });
        }
        for op in &schedule.ops {
            tokio::time::sleep_until(self.start + op.at).await;
            let (run, action) = (self.clone(), op.action.clone());
            tasks.spawn(async move { run.perform(action).await });
        }
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
    }

    /// One operation.
    async fn perform(&self, action: Action) {
        self.history.note(action.to_string());
        match action {
            Action::Transaction {
                label,
                events,
                shape,
            } => self.workload.shared(&label, &events, shape).await,
            Action::Poison {
                id,
                kind,
                followers,
            } => self.workload.poison(id, kind, followers).await,
            Action::Repair { poison } => self.workload.repair(poison).await,
            Action::Unblock { poison } => self.workload.unblock(poison).await,
            Action::HeldMany { rows } => self.workload.held_many(rows).await,
            Action::RelayJoin { relay, kind } => self.fleet.join(relay, kind).await,
            Action::RelayLeave { relay } => self.fleet.leave(relay, self.stop_bound).await,
            Action::RelayKill { relay } => self.fleet.kill(relay).await,
            Action::RelayFreeze { relay, how, length } => {
                if let Some(fault) = self.fleet.freeze(relay, how).await {
                    tokio::time::sleep(length).await;
                    self.fleet.thaw(relay, fault).await;
                }
            }
            Action::RelayPathFreeze {
                relay,
                path,
                length,
            } => {
                let fault = self.fleet.freeze_path(relay, path).await;
                tokio::time::sleep(length).await;
                self.fleet.thaw_path(relay, path, fault).await;
            }
            Action::RelayPathCut { relay, path } => self.fleet.cut_path(relay, path).await,
            Action::BrokerKill { node, down } => {
                let _one = self.broker.lock().await;
                let n = self.node(node).await;
                let fault = self.history.fault(Fault::BrokerDown(n));
                self.servers.broker.lock().await.node(n).stop();
                tokio::time::sleep(down).await;
                self.servers.broker.lock().await.node(n).start().await;
                self.history.healed(fault);
            }
            Action::BrokerFreeze { node, how, length } => {
                let _one = self.broker.lock().await;
                let n = self.node(node).await;
                let fault = self.history.fault(Fault::BrokerFrozen(n, how));
                self.freeze_node(n, how, true).await;
                tokio::time::sleep(length).await;
                self.freeze_node(n, how, false).await;
                self.history.healed(fault);
            }
            Action::StepDown => {
                let _one = self.broker.lock().await;
                if self.servers.node_ports.len() < 2 {
                    self.history.note("no cluster: no step-down");
                    return;
                }
                let fault = self.history.fault(Fault::StepDown);
                let answer = self.servers.step_down().await;
                self.history.note(format!("step-down: {answer:?}"));
                // the fault lasts until the stream has a leader again
                let end = Instant::now() + Duration::from_secs(10);
                while self.servers.stream_leader().await.is_none() && Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                self.history.healed(fault);
            }
            Action::PgRestart { immediate, down } => {
                let _one = self.pg.lock().await;
                let fault = self.history.fault(Fault::PgDown(immediate));
                self.servers.pg_stop(immediate).await;
                tokio::time::sleep(down).await;
                self.servers.pg_start().await;
                self.history.healed(fault);
            }
            Action::PgKillConnections => {
                let _one = self.pg.lock().await;
                self.history.instant_fault(Fault::PgKill);
                let killed: Result<i64, _> = sqlx::query_scalar(
                    "select count(pg_terminate_backend(pid)) from pg_stat_activity where usename = $1",
                )
                .bind(RELAY_ROLE)
                .fetch_one(&self.servers.admin)
                .await;
                self.history
                    .note(format!("terminated the relay role's backends: {killed:?}"));
            }
            Action::PgRevokeLocks { length } => {
                // not under the Postgres faults' lock: a restart may come meanwhile
                let fault = self.history.fault(Fault::LocksRevoked);
                let revoke = "revoke select on pg_catalog.pg_locks from public";
                if let Err(e) = sqlx::query(revoke).execute(&self.servers.admin).await {
                    // it may have committed all the same: granted again below whatever
                    self.history.note(format!("pg_locks revoke answered: {e}"));
                }
                tokio::time::sleep(length).await;
                // granted again once Postgres answers (it may be down for a restart)
                let grant = "grant select on pg_catalog.pg_locks to public";
                let mut granted = false;
                for _ in 0..60 {
                    match sqlx::query(grant).execute(&self.servers.admin).await {
                        Ok(_) => {
                            granted = true;
                            break;
                        }
                        Err(e) => {
                            self.history
                                .note(format!("pg_locks not granted again yet: {e}"));
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
                if !granted {
                    self.history
                        .note("pg_locks not granted again within a minute: it stays revoked");
                }
                self.history.healed(fault);
            }
            Action::Intrude { how, length } => {
                // not under the Postgres faults' lock: another role does not wait for them
                let fault = self.history.fault(Fault::Intruder(how));
                let what = intrude(&self.servers.intruder_url(), how, length).await;
                self.history.note(format!("another role, {how:?}: {what}"));
                self.history.healed(fault);
            }
        }
    }

    /// The node a fault hits: the stream's leader, or the one named.
    async fn node(&self, node: Node) -> usize {
        match node {
            Node::Index(n) => n.min(self.servers.node_ports.len() - 1),
            Node::StreamLeader => self.servers.stream_leader().await.unwrap_or(0),
        }
    }

    /// Freezes (or thaws) node `n`: SIGSTOP (SIGCONT), or every relay's proxy to it.
    async fn freeze_node(&self, n: usize, how: FreezeHow, freeze: bool) {
        match how {
            FreezeHow::Signal => {
                let signal = if freeze { "STOP" } else { "CONT" };
                let mut broker = self.servers.broker.lock().await;
                if broker.node(n).pid().is_some() {
                    broker.node(n).signal(signal);
                }
            }
            FreezeHow::Proxies => {
                for slot in &self.fleet.slots {
                    if freeze {
                        slot.paths.freeze_node(n);
                    } else {
                        slot.paths.thaw_node(n);
                    }
                }
            }
        }
    }

    /// Watches the relays every half second and samples frozen relays' locks every second,
    /// until `stop` resolves.
    pub async fn monitor(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut sample = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let history = self.history.clone();
            self.fleet
                .watch(move |since, slot| history.faulty_since(since, slot))
                .await;
            self.look_for_listeners().await;
            sample = !sample;
            if sample {
                self.sample_locks().await;
            }
        }
    }

    /// A process that listens on the notification channel has passed its start-up checks
    /// and runs: it is up.
    async fn look_for_listeners(&self) {
        for (slot, record, ports) in self.fleet.starting().await {
            if ports.is_empty() {
                continue;
            }
            let ports: Vec<i32> = ports.into_iter().map(i32::from).collect();
            let listening: Result<bool, _> = sqlx::query_scalar(
                "select exists (select 1 from pg_stat_activity \
                                 where client_port = any($1) and query ilike 'listen%')",
            )
            .bind(&ports)
            .fetch_one(&self.servers.admin)
            .await;
            if let Ok(true) = listening {
                self.fleet.up(slot, record).await;
            }
        }
    }

    /// Records the locks held by the sessions of relays whose sessions are frozen.
    async fn sample_locks(&self) {
        for (record, since, ports) in self.fleet.frozen_sessions().await {
            if ports.is_empty() {
                continue;
            }
            let ports: Vec<i32> = ports.into_iter().map(i32::from).collect();
            let locks: Result<Vec<(i32, String)>, _> = sqlx::query_as(
                "select l.pid, l.locktype || ' ' || l.mode || coalesce(' on ' || l.relation::regclass::text, '') \
                        || coalesce(' key (' || l.classid || ', ' || l.objid || ', ' || l.objsubid || ')', '') \
                   from pg_locks l join pg_stat_activity a on a.pid = l.pid \
                  where a.client_port = any($1) and l.granted and l.locktype <> 'virtualxid'",
            )
            .bind(&ports)
            .fetch_all(&self.servers.admin)
            .await;
            let Ok(locks) = locks else {
                continue;
            };
            let relay = self.history.relay_name(record);
            let at: Time = Utc::now();
            for (pid, lock) in locks {
                self.history.lock(LockSample {
                    relay: relay.clone(),
                    frozen_since: since,
                    at,
                    pid,
                    lock,
                });
            }
        }
    }
}

/// What a flood of notifications sends, in turn: what `outbox unblock` sends, nothing, a
/// partition at each end of the range, numbers out of it, and words the relay does not know.
const FLOOD: [&str; 7] = ["release", "", "0", "1023", "-1", "4096", "relays please"];

/// Another role interferes with the relays as `how` says for `length`, connected as it is
/// straight to Postgres, and connecting again while Postgres restarts (a lock is taken again);
/// says what it managed.
async fn intrude(url: &str, how: Intrusion, length: Duration) -> String {
    use outbox_runtime::relay::LOCK_NAMESPACE;
    use outbox_runtime::{NOTIFY_CHANNEL, NOTIFY_KEY, WAKE_KEY};
    use sqlx::Connection;

    let end = Instant::now() + length;
    let take = match how {
        Intrusion::NotifyLock => Some(("pg_try_advisory_lock", NOTIFY_KEY)),
        Intrusion::NotifyLockShared => Some(("pg_try_advisory_lock_shared", NOTIFY_KEY)),
        Intrusion::WakeLock => Some(("pg_try_advisory_lock", WAKE_KEY)),
        Intrusion::WakeLockShared => Some(("pg_try_advisory_lock_shared", WAKE_KEY)),
        Intrusion::Flood => None,
    };
    let (mut sent, mut taken, mut errors) = (0u64, 0u32, 0u32);
    let mut conn: Option<sqlx::PgConnection> = None;
    // whether `conn` holds the lock
    let mut holds = false;
    while Instant::now() < end {
        let Some(c) = conn.as_mut() else {
            match sqlx::PgConnection::connect(url).await {
                Ok(c) => conn = Some(c),
                Err(_) => {
                    errors += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            holds = false;
            continue;
        };
        let answer = match take {
            Some((function, key)) if !holds => {
                // the harness's own constants
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {function}($1, $2)")))
                    .bind(LOCK_NAMESPACE)
                    .bind(key)
                    .fetch_one(&mut *c)
                    .await
                    .map(|got: bool| {
                        holds = got;
                        taken += u32::from(got);
                    })
            }
            // held: the session stays, looked at now and then
            Some(_) => sqlx::query("select 1").execute(&mut *c).await.map(drop),
            None => {
                let payload = FLOOD[(sent % FLOOD.len() as u64) as usize];
                sent += 1;
                sqlx::query("select pg_notify($1, $2)")
                    .bind(NOTIFY_CHANNEL)
                    .bind(payload)
                    .execute(&mut *c)
                    .await
                    .map(drop)
            }
        };
        if answer.is_err() {
            errors += 1;
            conn = None;
        }
        match take {
            // about a thousand notifications a second
            None if sent % 4 == 0 => tokio::time::sleep(Duration::from_millis(1)).await,
            None => {}
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    if let Some(c) = conn {
        let _ = c.close().await;
    }
    match take {
        Some(_) => {
            format!("the lock taken {taken} time(s); {errors} failed statement(s) or connection(s)")
        }
        None => format!("{sent} notifications sent; {errors} failed statement(s) or connection(s)"),
    }
}
