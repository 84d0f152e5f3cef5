//! The retention task of a run ([`RetentionPlan`]): `outbox_runtime`'s `Retention`, logged in
//! as the retention role to Postgres through a proxy of its own, one pass after another until
//! the harness stops it. The plan's silences freeze that proxy (no close, no reset). Each
//! pass's failure is recorded with its time, and each silence with its start and end, for the
//! checker to hold against the Postgres faults and the silences.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::retention::{Retention, RetentionConfig};
use outbox_testkit::TcpProxy;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::history::History;
use crate::schedule::{RetentionPlan, SILENCE_LONGEST};
use crate::servers::Servers;

/// How much longer dedupe rows are kept beside a consumer: the sizing rule's redelivery
/// window and outage (docs/consumers.md, *Replays and retention*), for the longest a message
/// the consumer applied can come again: a broker node down or frozen for 40 s with its ack,
/// then the ack wait (5 s at most).
pub const DEDUPE_BESIDE_CONSUMER: Duration = Duration::from_secs(60);

/// A running retention task.
#[derive(Debug)]
pub struct RetentionTask {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    silencer: JoinHandle<()>,
    proxy: Arc<TcpProxy>,
}

impl RetentionTask {
    /// Starts the task `plan` describes, and the silences of its path, counted from `start`.
    /// Beside a consumer, dedupe rows are kept [`DEDUPE_BESIDE_CONSUMER`] longer.
    pub async fn start(
        servers: &Servers,
        history: Arc<History>,
        plan: RetentionPlan,
        consumer: bool,
        start: tokio::time::Instant,
    ) -> RetentionTask {
        let proxy = Arc::new(TcpProxy::start(format!("127.0.0.1:{}", servers.pg.port)).await);
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&servers.retention_url(proxy.port()))
            .expect("a retention pool");
        let config = RetentionConfig {
            keep_published: plan.keep,
            keep_dedupe: Some(
                plan.keep * 2
                    + if consumer {
                        DEDUPE_BESIDE_CONSUMER
                    } else {
                        Duration::ZERO
                    },
            ),
            batch_size: plan.batch_size,
            interval: plan.interval,
            busy_percent: plan.busy_percent,
            // the sizing rule's check is of the published rows, which the harness's consumer
            // never reads back (it reads the stream)
            redelivery_window: Duration::ZERO,
            max_outage: Duration::ZERO,
            ..RetentionConfig::default()
        };
        let retention = Retention::new(pool, config).expect("the plan's configuration is valid");
        history.retention_started(plan.keep, plan.interval);
        history.note(format!("retention starts: {plan:?}"));
        let silencer = tokio::spawn({
            let (proxy, history, silences) =
                (proxy.clone(), history.clone(), plan.silences.clone());
            async move {
                for (at, length) in silences {
                    tokio::time::sleep_until(start + at).await;
                    proxy.freeze();
                    history.retention(|r| r.silences.push((Utc::now(), None)));
                    history.note(format!("retention's path silent for {length:?}"));
                    tokio::time::sleep(length).await;
                    proxy.thaw();
                    end_silence(&history);
                    history.note("retention's path carries bytes again");
                }
            }
        });
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let pass = tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    pass = retention.run_once() => pass,
                };
                // what it deleted, the ledger has
                if let Err(e) = pass {
                    history.note(format!("retention pass failed: {e}"));
                    history.retention(|r| r.failed.push((Utc::now(), e.to_string())));
                }
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(plan.interval) => {}
                }
            }
        });
        RetentionTask {
            stop,
            task,
            silencer,
            proxy,
        }
    }

    /// Stops the task once its silences have ended (a statement in flight is abandoned; its
    /// transaction ends with its connection or completes) and records a panic, if it had one.
    pub async fn stop(self, history: &History) {
        // the silences run to their end first (a minute at most), so that a long one is held
        // to the statements' bound; one still running then ends here
        let mut silencer = self.silencer;
        if tokio::time::timeout(SILENCE_LONGEST, &mut silencer)
            .await
            .is_err()
        {
            silencer.abort();
            let _ = silencer.await;
        }
        self.proxy.thaw();
        end_silence(history);
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            history.retention(|r| r.died = Some((Utc::now(), e.to_string())));
        }
    }
}

/// Records the end of the silence under way, if one is (silences come one after another).
fn end_silence(history: &History) {
    history.retention(|r| {
        if let Some(silence) = r.silences.last_mut().filter(|s| s.1.is_none()) {
            silence.1 = Some(Utc::now());
        }
    });
}
