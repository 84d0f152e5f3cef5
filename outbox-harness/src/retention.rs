//! The retention task of a run ([`RetentionPlan`]): `outbox_runtime`'s `Retention`, logged in
//! as the retention role straight to Postgres, one pass after another until the harness stops
//! it. Each pass's failure is recorded with its time, for the checker to hold against the
//! Postgres faults.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::retention::{Retention, RetentionConfig};
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::history::History;
use crate::schedule::RetentionPlan;
use crate::servers::Servers;

/// A running retention task.
#[derive(Debug)]
pub struct RetentionTask {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RetentionTask {
    /// Starts the task `plan` describes.
    pub fn start(servers: &Servers, history: Arc<History>, plan: RetentionPlan) -> RetentionTask {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&servers.retention_url())
            .expect("a retention pool");
        let config = RetentionConfig {
            keep_published: plan.keep,
            keep_dedupe: Some(plan.keep * 2),
            batch_size: plan.batch_size,
            interval: plan.interval,
            busy_percent: plan.busy_percent,
            // the sizing rule is for consumers that need rows back; the harness has none
            redelivery_window: Duration::ZERO,
            max_outage: Duration::ZERO,
            ..RetentionConfig::default()
        };
        let retention = Retention::new(pool, config).expect("the plan's configuration is valid");
        history.retention_started(plan.keep);
        history.note(format!("retention starts: {plan:?}"));
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let pass = tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    pass = retention.run_once() => pass,
                };
                // what it deleted, the ledger has
                if let Err(e) = pass {
                    history.retention(|r| r.failed.push((Utc::now(), e.to_string())));
                }
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(plan.interval) => {}
                }
            }
        });
        RetentionTask { stop, task }
    }

    /// Stops the task (a statement in flight is abandoned; its transaction ends with its
    /// connection or completes) and records a panic, if it had one.
    pub async fn stop(self, history: &History) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            history.retention(|r| r.died = Some((Utc::now(), e.to_string())));
        }
    }
}
