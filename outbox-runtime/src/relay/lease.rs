//! The lease: of the relays running on one table, one publishes, the one holding the lease
//! (docs/relay.md, *Several relays*).
//!
//! The lease is a row of `outbox_relay_lease` (migration 0011) with its holder and its end, on
//! the database's clock. The holder renews it every second, for [`LEASE`], but only while it
//! reaches both Postgres and the NATS server (a message to itself through the server came back
//! within [`NATS_SILENT`]); the others try to take it every second, and get it once it has run
//! out. So a relay that stops, is killed, freezes or loses its path to either server gives its
//! place up within [`LEASE`] (at once when it stops or sees NATS go silent), and one that
//! reaches both takes it. A holder counts its term to end a second before the database does,
//! and its lanes claim only within the term.
//!
//! Nothing else rests on the lease: order holds with any number of relays publishing at once
//! (a batch publishes a subject's rows only while it holds every unpublished row of the subject
//! before them), so a holder that overruns its term by a batch costs nothing but the skipped
//! rows of the other's first batches.

use std::time::Duration;

use async_nats::connection::State;
use futures::StreamExt;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};
use uuid::Uuid;

use super::sql;

/// How long a renewal holds the lease, on the database's clock.
pub(super) const LEASE: Duration = Duration::from_secs(5);
/// How often the lease is renewed, or tried for.
const EVERY: Duration = Duration::from_secs(1);
/// How much sooner than the database the holder counts its term to end.
const MARGIN: Duration = Duration::from_secs(1);
/// How long the NATS server may stay silent before the holder gives the lease up.
pub(super) const NATS_SILENT: Duration = Duration::from_secs(3);
/// The longest wait for one statement or one round trip.
const ANSWER: Duration = Duration::from_secs(2);

/// A term of this relay's holding the lease: its number (a new one each time the relay takes
/// the lease) and when it ends, by this relay's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Term {
    pub(super) number: u64,
    pub(super) until: Instant,
}

impl Term {
    /// Whether the term still runs at `now`.
    pub(super) fn runs(&self, now: Instant) -> bool {
        now < self.until
    }
}

/// Round trips through the NATS server: a message to a subject of this relay's own, which the
/// server sends back.
struct Echo {
    client: async_nats::Client,
    subject: async_nats::Subject,
    subscriber: Option<async_nats::Subscriber>,
    last: Option<Instant>,
}

impl Echo {
    fn new(client: async_nats::Client) -> Echo {
        let subject = async_nats::Subject::from(format!(
            "{}.{}",
            crate::permissions::ECHO_PREFIX,
            Uuid::new_v4().simple()
        ));
        Echo {
            client,
            subject,
            subscriber: None,
            last: None,
        }
    }

    /// Sends one message to itself and waits for it (at most [`ANSWER`]); whether a round
    /// trip came back within [`NATS_SILENT`] of `now`.
    async fn healthy(&mut self, now: Instant) -> bool {
        if self.client.connection_state() != State::Connected {
            return false;
        }
        let round_trip = async {
            if self.subscriber.is_none() {
                self.subscriber = Some(self.client.subscribe(self.subject.clone()).await.ok()?);
            }
            let token = Uuid::new_v4().to_string();
            self.client
                .publish(self.subject.clone(), token.clone().into())
                .await
                .ok()?;
            let subscriber = self.subscriber.as_mut()?;
            while let Some(message) = subscriber.next().await {
                if message.payload.as_ref() == token.as_bytes() {
                    return Some(());
                }
            }
            None
        };
        if let Ok(Some(())) = timeout(ANSWER, round_trip).await {
            self.last = Some(Instant::now());
        }
        self.last
            .is_some_and(|last| now.saturating_duration_since(last) < NATS_SILENT)
    }
}

/// Holds, renews and gives up the lease for relay `me` until `stop` turns true; publishes each
/// term on `terms` (`None` while it does not hold it). Gives it up when it stops.
pub(super) async fn keep(
    pool: PgPool,
    client: async_nats::Client,
    me: Uuid,
    terms: watch::Sender<Option<Term>>,
    health: std::sync::Arc<super::stats::Health>,
    mut stop: watch::Receiver<bool>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut echo = Echo::new(client);
    let mut number = 0u64;
    // the error of the renewals failing since the last one that worked, once Postgres answered
    // with it: warned once, and once more when it changes
    let mut refused: Option<String> = None;
    let mut next = Instant::now();
    loop {
        let now = Instant::now();
        let held = terms.borrow().filter(|t| t.runs(now));
        let nats = echo.healthy(now).await;
        health.nats.store(nats, Relaxed);
        if nats {
            let renewed = renew(&pool, me).await;
            health.postgres.store(renewed.is_ok(), Relaxed);
            if renewed.is_ok() {
                if let Some(error) = refused.take() {
                    tracing::info!(relay = %me, %error, "outbox relay renews its lease again");
                }
            }
            match renewed {
                Ok(Some(left)) => {
                    let until = now + left.saturating_sub(MARGIN);
                    let term = match held {
                        Some(t) => Term { until, ..t },
                        None => {
                            number += 1;
                            tracing::info!(relay = %me, "outbox relay took the lease: it publishes");
                            Term { number, until }
                        }
                    };
                    metrics::gauge!(crate::metrics::LEASE_HELD).set(1.0);
                    terms.send_replace(Some(term));
                }
                Ok(None) => {
                    if held.is_some() {
                        tracing::warn!(relay = %me, "outbox relay lost the lease to another relay");
                    }
                    metrics::gauge!(crate::metrics::LEASE_HELD).set(0.0);
                    terms.send_replace(None);
                }
                // the term runs out by itself unless a later renewal works
                Err(Failed::Unanswered(error)) => {
                    tracing::debug!(%error, "outbox relay could not renew its lease")
                }
                // Postgres answers, and refuses the statement (a revoked grant, a trigger, a
                // table moved away): nothing else would say why the relay stopped publishing
                Err(Failed::Refused(error)) => {
                    if refused.as_deref() != Some(error.as_str()) {
                        tracing::warn!(relay = %me, %error, "outbox relay could not renew its lease, and stops publishing when its term runs out: Postgres refused the statement");
                        refused = Some(error);
                    }
                }
            }
        } else {
            if held.is_some() {
                tracing::warn!(relay = %me, silent = ?NATS_SILENT, "outbox relay gives the lease up: the NATS server did not answer");
                metrics::gauge!(crate::metrics::LEASE_HELD).set(0.0);
                terms.send_replace(None);
            }
            // the lease's statement, as a probe of Postgres: given up when held, or a no-op
            health.postgres.store(resign(&pool, me).await, Relaxed);
        }
        let holding = terms.borrow().is_some_and(|t| t.runs(Instant::now()));
        health.holds_lease.store(holding, Relaxed);
        next += EVERY;
        if next < Instant::now() {
            next = Instant::now() + EVERY;
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = sleep_until(next) => {}
        }
    }
    if terms.borrow().is_some() {
        resign(&pool, me).await;
    }
    metrics::gauge!(crate::metrics::LEASE_HELD).set(0.0);
    health.holds_lease.store(false, Relaxed);
    terms.send_replace(None);
}

/// [`LEASE`](sql::LEASE): how long the lease is held from now, or `None` when another relay
/// holds it.
async fn renew(pool: &PgPool, me: Uuid) -> Result<Option<Duration>, Failed> {
    let query = sqlx::query_scalar::<_, f64>(sql::LEASE)
        .bind(me)
        .bind(LEASE.as_millis() as f64)
        .fetch_optional(pool);
    match timeout(ANSWER, query).await {
        Ok(Ok(left)) => Ok(left.map(|s| Duration::from_secs_f64(s.max(0.0)))),
        Ok(Err(sqlx::Error::Database(db))) if refusal(db.code().as_deref()) => {
            Err(Failed::Refused(db.to_string()))
        }
        Ok(Err(e)) => Err(Failed::Unanswered(e.to_string())),
        Err(_) => Err(Failed::Unanswered("Postgres did not answer".into())),
    }
}

/// Whether an error with SQLSTATE `code` is Postgres refusing the statement itself (a
/// privilege, a missing table, a trigger's exception), not a connection ended by a restart or
/// an operator (class 57), a connection failure (08), a transaction rolled back (40) or a lack
/// of resources (53), which pass by themselves.
pub(super) fn refusal(code: Option<&str>) -> bool {
    !matches!(
        code.map(|c| c.get(..2)),
        Some(Some("57" | "08" | "40" | "53"))
    )
}

/// Why a renewal failed.
enum Failed {
    /// Postgres answered with an error.
    Refused(String),
    /// No answer: a connection that failed or a server that did not answer in time (an outage,
    /// which the lanes' failures report).
    Unanswered(String),
}

/// [`RESIGN`](sql::RESIGN), best effort: unanswered, the lease runs out by itself. Whether
/// Postgres answered.
async fn resign(pool: &PgPool, me: Uuid) -> bool {
    let query = sqlx::query(sql::RESIGN).bind(me).execute(pool);
    let error = match timeout(ANSWER, query).await {
        Ok(Ok(_)) => return true,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "Postgres did not answer".to_owned(),
    };
    tracing::debug!(%error, "outbox relay could not give its lease up; it runs out by itself");
    false
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn a_refusal_is_an_error_of_the_statement_not_of_its_connection() {
        for code in ["42501", "42P01", "P0001", "23505"] {
            assert!(refusal(Some(code)), "{code}");
        }
        for code in ["57P01", "57014", "08006", "40001", "53300"] {
            assert!(!refusal(Some(code)), "{code}");
        }
        assert!(refusal(None), "an error without a code, from the server");
    }
}
