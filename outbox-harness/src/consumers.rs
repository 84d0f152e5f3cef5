//! The service's consumer in a run ([`ConsumerPlan`]): replicas of `outbox_runtime`'s
//! `Consumer` of [`CONSUMED_TYPE`] under one durable, deduping, logged in as the consumer role,
//! each replica through proxies of its own to Postgres and to every node, which the plan
//! silences now and then. Its handler records each event it applies in `harness_applied`, in
//! the consumer's transaction, and fails some events on purpose, by their id ([`Fate`]): a
//! panic, a transient error, a sleep past the ack wait, or every time, so that they give up
//! into the dead letters. Each replica runs under a supervisor of its own, which kills it when
//! the plan says (its task aborted, the message in hand abandoned), starts it again after its
//! time down, and starts it again a second after a `run` that returned an error at start;
//! everything else that ends a replica is recorded for the checker's `consumers-alive`.

use std::sync::{Arc, Once};
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use outbox_runtime::consumer::{
    Consumer, ConsumerConfig, Delivery, Handler, HandlerError, Transient, Undecodable,
};
use outbox_runtime::Error;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgConnection;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::history::History;
use crate::panic_message;
use crate::proxy::RelayPaths;
use crate::rng::Rng;
use crate::schedule::ConsumerPlan;
use crate::servers::{Servers, STREAM};

/// The event type the consumer consumes: the workload's first, which poison rows are written
/// with and repaired into.
pub const CONSUMED_TYPE: &str = "hx.account.changed";
/// The consumer's durable name.
pub const DURABLE: &str = "hx-apply";
/// The stream of the consumer's dead letters, apart from the relay's streams.
pub const DEAD_LETTERS: &str = "HXDL";
/// The subject the consumer's dead letters go to.
pub const DEAD_LETTER_SUBJECT: &str = "hxdl.apply";
/// How many times the handler may fail an event before it gives up.
pub const MAX_ATTEMPTS: u32 = 3;
/// How long a replica asked to stop may take to finish the message in hand: the slowest
/// handler sleeps past the longest ack wait.
pub const STOP_BOUND: Duration = Duration::from_secs(15);
/// How long the end waits for the consumer while it makes no progress.
pub const STALLED: Duration = Duration::from_secs(30);
/// What a deliberate panic's message starts with (the panic hook keeps these off stderr).
const ON_PURPOSE: &str = "the harness's handler panics on purpose";

/// The consumed event.
#[derive(Debug, Clone, Serialize, Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(
    event_type = "hx.account.changed",
    source = "harness",
    schema = "schemas/hx.account.changed.schema.json",
    consume_only
)]
pub struct AccountChanged {
    /// The writer's label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Set by a repair of a poison row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trimmed: Option<bool>,
}

/// What the handler does with an event, drawn from its id (the same for every delivery and
/// replica, and for the checker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Applied.
    Plain,
    /// The first delivery panics (an attempt spent); a later one applies it.
    Panics,
    /// The first delivery fails transiently (no attempt spent); a later one applies it.
    Transient,
    /// The first delivery sleeps past the ack wait in its transaction: JetStream delivers it
    /// again meanwhile, to this replica or another, whose dedupe insert waits for the first
    /// transaction, which the server ends at the ack wait (the first delivery's write then
    /// fails, and the event is applied by the second).
    Slow,
    /// Every delivery fails: after [`MAX_ATTEMPTS`] the event gives up into the dead letters
    /// and is never applied.
    Doomed,
    /// Each of the first [`MAX_ATTEMPTS`] deliveries is busy in a statement past the ack wait
    /// and then fails; a later delivery applies it. JetStream delivers it again while each
    /// attempt runs, and that delivery waits on the attempt's dedupe row. Deliveries that
    /// spend no attempt (a replica killed, a hold, a transient failure) leave a later one
    /// within the budget, so the event ends either dead-lettered or applied, never both: a
    /// delivery that ran once the last attempt failed but before it was counted would apply it
    /// after it gave up.
    SlowToFail,
}

impl Fate {
    /// The fate of event `id`: 1 in 64 each panicking and transient, 1 in 256 each slow,
    /// doomed and slow to fail. Rare enough that a subject of a burst writer, hundreds of
    /// events each held behind its subject's failing one at the replica that saw the failure,
    /// drains within seconds.
    pub fn of(id: Uuid) -> Fate {
        let bits = id.as_u128();
        let drawn = Rng::new((bits as u64) ^ ((bits >> 64) as u64)).below(256);
        match drawn {
            0 => Fate::Doomed,
            1..=4 => Fate::Panics,
            5..=8 => Fate::Transient,
            9 => Fate::Slow,
            10 => Fate::SlowToFail,
            _ => Fate::Plain,
        }
    }
}

/// The handler of replica `replica`.
struct Apply {
    replica: usize,
    ack_wait: Duration,
}

impl Handler<AccountChanged> for Apply {
    async fn handle(
        &self,
        delivery: &Delivery<AccountChanged>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let first = delivery.delivered == 1;
        match Fate::of(delivery.id()) {
            Fate::Doomed => {
                return Err("the harness's handler refuses this event every time".into())
            }
            Fate::Panics if first => panic!("{ON_PURPOSE}: first delivery of {}", delivery.id()),
            Fate::Transient if first => {
                return Err(Box::new(Transient(
                    "the harness's handler fails a first delivery transiently".into(),
                )))
            }
            Fate::Slow if first => tokio::time::sleep(self.ack_wait + Duration::from_secs(1)).await,
            Fate::SlowToFail if delivery.delivered <= u64::from(MAX_ATTEMPTS) => {
                // busy, not idle: the idle timeout does not end it
                sqlx::query("select pg_sleep($1)")
                    .bind((self.ack_wait + Duration::from_millis(500)).as_secs_f64())
                    .execute(&mut *tx)
                    .await?;
                return Err("the harness's handler fails this event slowly".into());
            }
            _ => {}
        }
        sqlx::query(
            "insert into harness_applied (event_id, subject, stream_sequence, delivered, replica) \
             values ($1, $2, $3, $4, $5)",
        )
        .bind(delivery.id())
        .bind(&delivery.envelope.subject)
        .bind(delivery.stream_sequence as i64)
        .bind(delivery.delivered as i64)
        .bind(self.replica as i32)
        .execute(tx)
        .await?;
        Ok(())
    }
}

/// Keeps the handler's deliberate panics off stderr; every other panic is printed as before.
fn quiet_deliberate_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or_default();
            if !message.starts_with(ON_PURPOSE) {
                previous(info);
            }
        }));
    });
}

/// The consumer's replicas, each under its supervisor and behind proxies of its own.
#[derive(Debug)]
pub struct ConsumerFleet {
    stop: watch::Sender<bool>,
    supervisors: Vec<JoinHandle<()>>,
    /// The kills and the silences.
    faults: Vec<JoinHandle<()>>,
    paths: Vec<Arc<RelayPaths>>,
}

/// What a supervisor needs to start its replica again.
#[derive(Debug, Clone)]
struct Replica {
    n: usize,
    ack_wait: Duration,
    pg_url: String,
    nats_urls: Vec<String>,
    history: Arc<History>,
}

impl ConsumerFleet {
    /// Creates the dead letters' stream and starts `plan`'s replicas and kills, counted from
    /// `start`.
    pub async fn start(
        servers: &Servers,
        history: Arc<History>,
        plan: ConsumerPlan,
        start: tokio::time::Instant,
    ) -> ConsumerFleet {
        quiet_deliberate_panics();
        servers.create_stream(DEAD_LETTERS, "hxdl.>").await;
        history.consumers(|_| {});
        history.note(format!("the consumer starts: {plan:?}"));
        let (stop, stopped) = watch::channel(false);
        let mut kills = Vec::new();
        let mut supervisors = Vec::new();
        let mut paths = Vec::new();
        for n in 0..plan.replicas {
            let path = Arc::new(RelayPaths::start(servers.pg.port, &servers.node_ports).await);
            let (kill, killed) = mpsc::unbounded_channel();
            kills.push(kill);
            let replica = Replica {
                n,
                ack_wait: plan.ack_wait,
                pg_url: servers.consumer_url(path.pg.port()),
                nats_urls: path.nats_url().split(',').map(str::to_owned).collect(),
                history: history.clone(),
            };
            paths.push(path);
            supervisors.push(tokio::spawn(replica.supervise(killed, stopped.clone())));
        }
        let kills_at = plan.kills;
        let killer = tokio::spawn(async move {
            for (at, n, down) in kills_at {
                tokio::time::sleep_until(start + at).await;
                let _ = kills[n].send(down);
            }
        });
        let silences = plan.silences.iter().map(|&(at, n, path, length)| {
            let (paths, history) = (paths[n].clone(), history.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + at).await;
                paths.freeze(path);
                history.consumers(|c| c.silences.push((Utc::now(), n)));
                history.note(format!(
                    "consumer replica {n}'s {path:?} path silent for {length:?}"
                ));
                tokio::time::sleep(length).await;
                paths.thaw(path);
                history.note(format!(
                    "consumer replica {n}'s {path:?} path carries bytes again"
                ));
            })
        });
        let faults = std::iter::once(killer).chain(silences).collect();
        ConsumerFleet {
            stop,
            supervisors,
            faults,
            paths,
        }
    }

    /// Ends the kills and silences still to come or under way (the run's heal).
    pub async fn heal(&mut self) {
        for fault in self.faults.drain(..) {
            fault.abort();
            let _ = fault.await;
        }
        for path in &self.paths {
            path.thaw_everything();
        }
    }

    /// Waits until the durable has nothing pending or unacknowledged, twice a second apart,
    /// or until it has made no progress for [`STALLED`] (a consumer that never gets there is
    /// for the checker to judge). Notes what is left every 10 s.
    pub async fn settle(&self, servers: &Servers, history: &History) {
        let mut quiet = 0;
        let mut last = (None, None);
        let mut progress = tokio::time::Instant::now();
        let mut noted = tokio::time::Instant::now();
        while quiet < 2 && progress.elapsed() < STALLED {
            let ask = async {
                let stream = servers.js.get_stream(STREAM).await.ok()?;
                let info = stream.consumer_info(DURABLE).await.ok()?;
                Some((info.num_pending, info.num_ack_pending))
            };
            let left = tokio::time::timeout(Duration::from_secs(5), ask)
                .await
                .ok()
                .flatten();
            let applied: Option<i64> = sqlx::query_scalar("select count(*) from harness_applied")
                .fetch_one(&servers.admin)
                .await
                .ok();
            quiet = if left == Some((0, 0)) { quiet + 1 } else { 0 };
            if (left, applied) != last {
                last = (left, applied);
                progress = tokio::time::Instant::now();
            }
            if noted.elapsed() >= Duration::from_secs(10) {
                noted = tokio::time::Instant::now();
                history.note(format!(
                    "the consumer settles: (pending, unacknowledged) {left:?}, applied {applied:?}"
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        history.note(format!(
            "the consumer settled: (pending, unacknowledged) {:?}, applied {:?}",
            last.0, last.1
        ));
    }

    /// Ends the faults, then stops every replica (each finishes the message in hand),
    /// recording a replica that did not stop within [`STOP_BOUND`].
    pub async fn stop(mut self) {
        self.heal().await;
        let _ = self.stop.send(true);
        for supervisor in self.supervisors {
            // a supervisor's own panic is the harness's
            supervisor.await.expect("a consumer's supervisor");
        }
    }
}

impl Replica {
    /// Runs the replica until the harness stops it: killed, it comes back after its time
    /// down; its `run` returning an error other than a configuration conflict, a second later.
    async fn supervise(
        self,
        mut kills: mpsc::UnboundedReceiver<Duration>,
        mut stopped: watch::Receiver<bool>,
    ) {
        let n = self.n;
        let history = self.history.clone();
        loop {
            let (shutdown, asked) = watch::channel(false);
            let mut run = tokio::spawn(self.clone().run(asked));
            let pause = tokio::select! {
                ended = &mut run => match ended {
                    Ok(Ok(())) => {
                        self.died("its run returned Ok without being asked to stop".into());
                        return;
                    }
                    Ok(Err(e @ Error::Config(_))) => {
                        self.died(format!("its run returned a configuration error: {e}"));
                        return;
                    }
                    Ok(Err(e)) => {
                        history.note(format!("consumer replica {n} failed at start: {e}; again in 1 s"));
                        Duration::from_secs(1)
                    }
                    Err(e) => {
                        self.died(format!("it panicked: {}", panic_message(e)));
                        return;
                    }
                },
                Some(down) = kills.recv() => {
                    run.abort();
                    let _ = run.await;
                    history.note(format!("consumer replica {n} killed, down for {down:?}"));
                    history.consumers(|c| c.kills.push((Utc::now(), n)));
                    down
                }
                _ = asked_to_stop(&mut stopped) => {
                    let _ = shutdown.send(true);
                    match tokio::time::timeout(STOP_BOUND, &mut run).await {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Ok(Err(e))) => self.died(format!("asked to stop, its run returned an error: {e}")),
                        Ok(Err(e)) => self.died(format!("asked to stop, it panicked: {}", panic_message(e))),
                        Err(_) => {
                            run.abort();
                            history.consumers(|c| c.stopped_late.push((Utc::now(), n)));
                        }
                    }
                    return;
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = asked_to_stop(&mut stopped) => return,
            }
            history.note(format!("consumer replica {n} starts again"));
        }
    }

    /// One life of the replica: its own pool and NATS connection, dropped with it.
    async fn run(self, mut asked: watch::Receiver<bool>) -> outbox_runtime::Result<()> {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&self.pg_url)
            .expect("a consumer pool");
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .connect(self.nats_urls.as_slice())
            .await
            .expect("a client that connects in the background");
        let mut config = ConsumerConfig::new(DURABLE, STREAM);
        config.ack_wait = self.ack_wait;
        config.max_attempts = MAX_ATTEMPTS;
        config.retry_base = Duration::from_millis(200);
        config.retry_max = Duration::from_secs(1);
        config.dead_letter = Some(DEAD_LETTER_SUBJECT.into());
        config.undecodable = Undecodable::DeadLetter {
            subject: DEAD_LETTER_SUBJECT.into(),
        };
        let handler = Apply {
            replica: self.n,
            ack_wait: self.ack_wait,
        };
        let consumer =
            Consumer::<AccountChanged, _>::new(pool, jetstream::new(client), config, handler);
        consumer
            .run(async move { asked_to_stop(&mut asked).await })
            .await
    }

    fn died(&self, why: String) {
        let n = self.n;
        self.history
            .note(format!("consumer replica {n} ended unasked: {why}"));
        self.history
            .consumers(|c| c.died.push((Utc::now(), n, why)));
    }
}

/// Resolves once `stop` says so (or its sender is gone).
async fn asked_to_stop(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use outbox_runtime::OutboxEvent;

    use super::*;
    use crate::schedule::EVENT_TYPES;

    #[test]
    fn the_consumed_type_is_a_type_the_workload_writes() {
        assert_eq!(AccountChanged::EVENT_TYPE, CONSUMED_TYPE);
        assert_eq!(EVENT_TYPES[0], CONSUMED_TYPE);
    }

    #[test]
    fn fates_come_in_their_shares_and_stay_with_the_id() {
        let ids: Vec<Uuid> = (0..64_000u128)
            .map(|n| Uuid::from_u128(n.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)))
            .collect();
        let share = |fate: Fate| ids.iter().filter(|id| Fate::of(**id) == fate).count();
        for (fate, expected) in [
            (Fate::Doomed, 250),
            (Fate::Panics, 1_000),
            (Fate::Transient, 1_000),
            (Fate::Slow, 250),
            (Fate::SlowToFail, 250),
        ] {
            let n = share(fate);
            assert!(n.abs_diff(expected) < expected / 5, "{fate:?}: {n}");
        }
    }
}
