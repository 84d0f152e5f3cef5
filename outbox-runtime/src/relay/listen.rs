//! The wake-up: `LISTEN` on the emit channel, forwarded to the lanes (docs/relay.md,
//! *Wake-up*).

use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::watch;

use crate::NOTIFY_CHANNEL;

/// Forwards [`NOTIFY_CHANNEL`] notifications to `wake` until aborted, reconnecting after
/// `retry` when the connection is lost. Each (re)connection also wakes the lanes: rows
/// committed while nobody listened were not announced.
pub(super) async fn listen(pool: PgPool, wake: watch::Sender<()>, retry: Duration) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => match listener.listen(NOTIFY_CHANNEL).await {
                Ok(()) => {
                    wake.send_replace(());
                    loop {
                        match listener.try_recv().await {
                            Ok(_) => {
                                wake.send_replace(());
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "outbox relay lost its LISTEN connection; polling until it is back");
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "outbox relay cannot LISTEN; polling"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay cannot open its LISTEN connection; polling")
            }
        }
        tokio::time::sleep(retry).await;
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
