//! The wake-up: `LISTEN` on the emit channel, forwarded to the lanes, with a heartbeat that
//! tells a silent connection from a quiet one (docs/relay.md, *Wake-up*).

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::timeout;

use crate::metrics as names;
use crate::NOTIFY_CHANNEL;

/// The payload of the relay's heartbeat notification.
pub(super) const HEARTBEAT: &str = "heartbeat";
/// The payload `outbox unblock` sends: held subjects were released, floors go back.
pub(crate) const RELEASE: &str = "release";
/// The payload a relay sends when it joins or leaves `outbox_relays`: the others share the
/// partitions anew at once rather than at their next heartbeat.
pub(super) const MEMBERS: &str = "relays";
/// How often a running relay sends its heartbeat; a listener that hears nothing (not even a
/// heartbeat) for [`SILENCE`] is taken as lost and connected again.
pub(super) const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
const SILENCE: Duration = Duration::from_secs(25);

/// What the listener tells the lanes.
#[derive(Debug, Clone)]
pub(super) struct Signals {
    /// A commit was announced (or notifications may have been missed).
    pub(super) commits: watch::Sender<()>,
    /// Held subjects were released.
    pub(super) releases: watch::Sender<()>,
    /// A relay joined or left the table.
    pub(super) members: watch::Sender<()>,
    /// Whether the `LISTEN` connection is up.
    pub(super) listening: watch::Sender<bool>,
}

/// How long the listener waits before it connects again, at first; it doubles while that
/// fails, up to [`RECONNECT_MAX`] (the lanes' poll keeps rows moving meanwhile).
const RECONNECT_FIRST: Duration = Duration::from_millis(500);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Forwards [`NOTIFY_CHANNEL`] notifications until aborted, reconnecting when the connection is
/// lost or silent. Each (re)connection also wakes the lanes: rows committed while nobody
/// listened were not announced.
pub(super) async fn listen(pool: PgPool, signals: Signals) {
    let mut retry = RECONNECT_FIRST;
    loop {
        // A pool of its own for each connection: sqlx runs `UNLISTEN *` on a dropped listener's
        // connection before it returns it, with no timeout, so a silent connection would hang
        // there and never come back to the relay's pool.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(RECONNECT_MAX)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        match PgListener::connect_with(&own).await {
            Ok(mut listener) => {
                match listener.listen(NOTIFY_CHANNEL).await {
                    Ok(()) => {
                        metrics::gauge!(names::LISTENING).set(1.0);
                        signals.listening.send_replace(true);
                        signals.commits.send_replace(());
                        let why = forward(&mut listener, &signals).await;
                        metrics::gauge!(names::LISTENING).set(0.0);
                        signals.listening.send_replace(false);
                        tracing::warn!("outbox relay lost its LISTEN connection ({why}); polling until it is back");
                    }
                    Err(e) => tracing::warn!(error = %e, "outbox relay cannot LISTEN; polling"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay cannot open its LISTEN connection; polling")
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RECONNECT_MAX);
    }
}

/// Forwards notifications until the connection is lost or stays silent for [`SILENCE`];
/// says which.
async fn forward(listener: &mut PgListener, signals: &Signals) -> String {
    loop {
        match timeout(SILENCE, listener.try_recv()).await {
            Ok(Ok(Some(n))) => match n.payload() {
                HEARTBEAT => {}
                MEMBERS => {
                    signals.members.send_replace(());
                }
                RELEASE => {
                    signals.releases.send_replace(());
                    signals.commits.send_replace(());
                }
                _ => {
                    signals.commits.send_replace(());
                }
            },
            Ok(Ok(None)) => return "the connection closed".into(),
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return format!("not even a heartbeat for {SILENCE:?}"),
        }
    }
}

/// Sends the heartbeat every [`HEARTBEAT_EVERY`] until aborted.
pub(super) async fn heartbeat(pool: PgPool) {
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let beat = sqlx::query("select pg_notify($1, $2)")
            .bind(NOTIFY_CHANNEL)
            .bind(HEARTBEAT)
            .execute(&pool);
        if let Err(e) = timeout(HEARTBEAT_EVERY, beat)
            .await
            .unwrap_or(Ok(Default::default()))
        {
            tracing::debug!(error = %e, "outbox relay heartbeat not sent");
        }
    }
}

/// A spawned task that is aborted when this is dropped.
#[derive(Debug)]
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
