//! The consumer's loop: pull, process, and survive a broker restart, a deleted durable or a
//! deleted stream at a bounded rate.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, PullConsumer};
use futures::StreamExt;

use super::{Consumer, Handler, Outcome};
use crate::error::{Error, Result};
use crate::OutboxEvent;

/// The first pause after a failure to open or pull; doubles per failure up to [`PAUSE_MAX`].
const PAUSE_MIN: Duration = Duration::from_millis(100);
const PAUSE_MAX: Duration = Duration::from_secs(5);
/// Idle heartbeat of the pull: a deleted durable whose deletion notice is lost is noticed
/// within two of them.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Why consuming one subscription stopped.
enum Stop {
    Shutdown,
    Broken,
}

impl<E: OutboxEvent, H: Handler<E>> Consumer<E, H> {
    /// Consumes until `shutdown` resolves. The message in hand is finished (committed and
    /// acked, or rolled back and nak'd) before it returns.
    ///
    /// The durable is opened first ([`Consumer::durable`]); an error there (no stream, a
    /// durable whose configuration differs, the name registered to another type, a role
    /// without the rights of `ops/postgres/grants.sql`) is returned. After that, a broker
    /// restart, a deleted durable or a deleted stream is logged (one line per try) and retried
    /// with a pause of 100 ms doubling to 5 s, and the durable is opened again once its stream
    /// exists; only an [`Error::Config`] found then (any of those above) stops it.
    /// Transient database errors pause the loop too (the pause grows while they last), so an
    /// outage of the consumer's database does not spin through the pending messages.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<()> {
        crate::metrics::register_consumer(&self.name);
        let mut durable = Some(self.durable().await?);
        tokio::pin!(shutdown);
        let mut pause = PAUSE_MIN;
        loop {
            let consumer = match durable.take() {
                Some(consumer) => consumer,
                None => {
                    let opened = tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        opened = self.durable() => opened,
                    };
                    match opened {
                        Ok(consumer) => {
                            tracing::info!(consumer = %self.name, "durable consumer open again");
                            consumer
                        }
                        Err(e @ Error::Config(_)) => return Err(e),
                        Err(e) => {
                            tracing::warn!(consumer = %self.name, error = %e, retry_in = ?pause,
                                "cannot open the durable consumer; retrying");
                            if sleep_or_shutdown(pause, shutdown.as_mut()).await {
                                return Ok(());
                            }
                            pause = (pause * 2).min(PAUSE_MAX);
                            continue;
                        }
                    }
                }
            };
            match self.consume(&consumer, shutdown.as_mut(), &mut pause).await {
                Stop::Shutdown => return Ok(()),
                Stop::Broken => {}
            }
            if sleep_or_shutdown(pause, shutdown.as_mut()).await {
                return Ok(());
            }
            pause = (pause * 2).min(PAUSE_MAX);
        }
    }

    /// Pulls and processes messages until the subscription breaks or `shutdown` resolves.
    /// `pause` is reset once a message arrives.
    async fn consume(
        &self,
        consumer: &PullConsumer,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
        pause: &mut Duration,
    ) -> Stop {
        let pulled = tokio::select! {
            _ = &mut shutdown => return Stop::Shutdown,
            pulled = subscribe(consumer) => pulled,
        };
        let mut messages = match pulled {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(consumer = %self.name, error = %e, retry_in = ?pause, "cannot pull; retrying");
                return Stop::Broken;
            }
        };
        loop {
            let next = tokio::select! {
                _ = &mut shutdown => return Stop::Shutdown,
                next = messages.next() => next,
            };
            match next {
                Some(Ok(message)) => {
                    *pause = PAUSE_MIN;
                    match self.process(message).await {
                        Ok(Outcome::Transient { delay, .. }) => {
                            if sleep_or_shutdown(delay, shutdown.as_mut()).await {
                                return Stop::Shutdown;
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(consumer = %self.name, error = %e, "message not finished; it will be redelivered");
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(consumer = %self.name, error = %e, retry_in = ?pause,
                        "pull stream error; opening the durable again");
                    return Stop::Broken;
                }
                None => return Stop::Broken,
            }
        }
    }
}

async fn subscribe(
    consumer: &PullConsumer,
) -> std::result::Result<pull::Stream, async_nats::jetstream::consumer::StreamError> {
    consumer.stream().heartbeat(HEARTBEAT).messages().await
}

/// Sleeps `pause`; `true` if `shutdown` resolved first.
async fn sleep_or_shutdown(pause: Duration, shutdown: Pin<&mut impl Future<Output = ()>>) -> bool {
    tokio::select! {
        _ = shutdown => true,
        _ = tokio::time::sleep(pause) => false,
    }
}
