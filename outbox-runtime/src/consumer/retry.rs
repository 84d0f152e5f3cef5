//! The retry policy: which failures are the handler's (counted against
//! [`ConsumerConfig::max_attempts`](super::ConsumerConfig::max_attempts) in the consumer's
//! database) and which are transient (retried without spending the budget).

use std::error::Error as StdError;

use uuid::Uuid;

use crate::error::Error;
use crate::table::CONSUMER_ATTEMPTS;

/// Marks a handler error as transient: the message is retried without counting an attempt.
/// For failures of the handler's own dependencies that say nothing about the event (a service
/// answering 503). Database errors need no marking: the consumer recognises the transient
/// ones (see [`is_transient`]).
///
/// ```
/// use outbox_runtime::consumer::{HandlerError, Transient};
///
/// let error: HandlerError = Box::new(Transient("rates service unavailable".into()));
/// assert!(outbox_runtime::consumer::is_transient(&*error));
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Transient(pub Box<dyn StdError + Send + Sync>);

/// Whether `error` (or an error in its `source` chain) is transient: a [`Transient`], or a
/// database error that says nothing about the event: the connection or pool failed, or
/// Postgres aborted the transaction for concurrency or resource reasons (SQLSTATE class `08`
/// connection exception, class `40` transaction rollback, `40001` serialization failure and
/// `40P01` deadlock among them, `25P03` idle-in-transaction timeout, `55P03` lock not
/// available, `57014` statement timeout or cancel, `57P01`-`57P03` server shutting down or
/// starting, class `53` insufficient resources).
pub fn is_transient(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<Transient>() {
            return true;
        }
        if let Some(sqlx) = e.downcast_ref::<sqlx::Error>() {
            return sqlx_is_transient(sqlx);
        }
        if let Some(Error::Database(sqlx)) = e.downcast_ref::<Error>() {
            return sqlx_is_transient(sqlx);
        }
        current = e.source();
    }
    false
}

fn sqlx_is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_transient(&c)),
        _ => false,
    }
}

fn sqlstate_is_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("40")
        || code.starts_with("53")
        // 25P03: the message's transaction sat idle past the ack wait and the server ended
        // it (a frozen replica, or a handler slower than its ack wait)
        || matches!(
            code,
            "25P03" | "55P03" | "57014" | "57P01" | "57P02" | "57P03"
        )
}

/// Counts one handler failure of `event_id` and deletes its dedupe row, through `conn`: in
/// the transaction that inserted the row, after the handler's writes were rolled back to a
/// savepoint, so that the count commits as the row goes. Returns the attempts so far. An
/// error here is the database's, so the caller treats it as transient.
pub(super) async fn count_attempt(
    conn: &mut sqlx::PgConnection,
    consumer: &str,
    event_id: Uuid,
    error: &str,
) -> crate::Result<u32> {
    let (attempts, deleted): (i32, i64) = sqlx::query_as(
        "with unrecorded as ( \
           delete from outbox_consumed where consumer = $1 and event_id = $2 returning 1) \
         insert into outbox_consumer_attempts as a (consumer, event_id, attempts, last_error) \
         values ($1, $2, 1, $3) \
         on conflict (consumer, event_id) do update \
           set attempts = a.attempts + 1, last_error = excluded.last_error, updated_at = now() \
         returning attempts, (select count(*) from unrecorded)",
    )
    .bind(consumer)
    .bind(event_id)
    .bind(error)
    .fetch_one(conn)
    .await
    .map_err(|e| CONSUMER_ATTEMPTS.error(e))?;
    // Committed with its dedupe row, the failed attempt would record the event as consumed
    // (a row-level security policy that hides the row from the delete, say): never.
    if deleted != 1 {
        return Err(Error::Config(format!(
            "the dedupe row of {event_id} in outbox_consumed could not be deleted as its failed \
             attempt was counted ({deleted} rows): is a row-level security policy hiding it from \
             the consumer's role?"
        )));
    }
    Ok(u32::try_from(attempts).unwrap_or(0))
}

/// The handler attempts recorded for `event_id`, and the last error, through `conn`.
pub(super) async fn recorded_attempts(
    conn: &mut sqlx::PgConnection,
    consumer: &str,
    event_id: Uuid,
) -> crate::Result<Option<(u32, String)>> {
    let row: Option<(i32, String)> = sqlx::query_as(
        "select attempts, last_error from outbox_consumer_attempts \
         where consumer = $1 and event_id = $2",
    )
    .bind(consumer)
    .bind(event_id)
    .fetch_optional(conn)
    .await
    .map_err(|e| CONSUMER_ATTEMPTS.error(e))?;
    Ok(row.map(|(n, e)| (u32::try_from(n).unwrap_or(0), e)))
}

/// Forgets the attempts of `event_id` (it was applied), through `conn`.
pub(super) async fn forget_attempts(
    conn: &mut sqlx::PgConnection,
    consumer: &str,
    event_id: Uuid,
) -> crate::Result<()> {
    sqlx::query("delete from outbox_consumer_attempts where consumer = $1 and event_id = $2")
        .bind(consumer)
        .bind(event_id)
        .execute(conn)
        .await
        .map_err(|e| CONSUMER_ATTEMPTS.error(e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_concurrency_and_resource_states_are_transient_others_are_not() {
        for code in [
            "08006", "40001", "40P01", "25P03", "55P03", "57014", "57P01", "53300",
        ] {
            assert!(sqlstate_is_transient(code), "{code}");
        }
        for code in ["23505", "23503", "42P01", "22P02", "P0001"] {
            assert!(!sqlstate_is_transient(code), "{code}");
        }
    }

    #[test]
    fn pool_and_io_errors_are_transient_through_the_source_chain() {
        let pool: Box<dyn StdError + Send + Sync> = Box::new(sqlx::Error::PoolTimedOut);
        assert!(is_transient(&*pool));
        let wrapped = Error::Database(sqlx::Error::PoolClosed);
        assert!(is_transient(&wrapped));
        let row = sqlx::Error::RowNotFound;
        assert!(!is_transient(&row));
        let plain: Box<dyn StdError + Send + Sync> = "the plan does not exist".into();
        assert!(!is_transient(&*plain));
        let marked = Transient("503 from the rates service".into());
        assert!(is_transient(&marked));
    }
}
