//! The batch's connection and transaction, with a deadline on every statement: a batch whose
//! relay freezes or loses its network releases its locks within seconds (docs/relay.md,
//! *Failures*).

use std::future::Future;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, PgConnection, PgPool, Postgres};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::table::{Table, OUTBOX_EVENTS};

/// The server-side `statement_timeout` and `lock_timeout` of a batch's statements.
pub(super) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the relay waits for any answer of Postgres before it gives the connection up.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(12);
/// How long a lane's connection may have been idle before its next batch checks it first:
/// longer than a lingering lane's pause (at most 50 ms), shorter than an idle lane's (its
/// sweep, once a second).
const CHECK_IDLE_AFTER: Duration = Duration::from_millis(100);

/// A lane's connection between its batches. The lane's next batch takes it instead of one
/// from the pool: a lane that runs batches back to back neither waits for the pool (which
/// opens a connection, tens of milliseconds, when none is idle) nor pays the pool's checks of
/// the connection (a round trip when it hands a connection out, another when it takes one back)
/// at every batch. A connection idle for [`CHECK_IDLE_AFTER`] or more is checked first, as the
/// pool would, so that one the server ended meanwhile is replaced rather than failing the batch
/// (a check that gets no answer fails the batch, as a statement would). A batch that fails
/// closes its connection, and the next one takes another from the pool; so does a batch whose
/// kept connection has lived the pool's `max_lifetime`. Dropped (the lane's term ended, or the
/// relay stopped), it closes its connection, as a [`Tx`] does: returned to the pool, a
/// connection the server ended meanwhile would be found dead by the pool's check and logged at
/// warn. The second field is when the batch that last used it ended.
#[derive(Debug, Default)]
pub(super) struct Kept(Option<(Tx, Instant)>);

/// How [`Tx::acquire`] came by its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Came {
    /// The lane's kept connection, or one from the pool.
    Fine,
    /// One from the pool, in place of the lane's kept connection, which the server had ended
    /// (it restarted, or ended the session): the marks of the lane's last batches, which
    /// commit asynchronously, may be lost with it.
    Replaced,
}

/// A batch's transaction on a connection of its own. It ends by [`Tx::commit`] or
/// [`Tx::rollback`]; dropped any other way (an error, a timeout, a cancelled batch), the
/// connection is closed rather than returned to the pool, so that the server ends the
/// transaction and its locks, and no connection in an unknown state is reused.
#[derive(Debug)]
pub(super) struct Tx {
    conn: Option<PoolConnection<Postgres>>,
    /// When the connection was taken from the pool, as far as the relay knows.
    since: Instant,
}

impl Tx {
    /// A connection, `kept`'s if it has one (checked first when it has been idle), from `pool`
    /// otherwise, whose transaction the first statement begins (the batch's
    /// [`begin_settings`](super::sql::begin_settings)). Until it ends by [`Tx::commit`] or
    /// [`Tx::rollback`], dropping it closes the connection.
    pub(super) async fn acquire(pool: &PgPool, kept: Option<&mut Kept>) -> Result<(Tx, Came)> {
        let mut came = Came::Fine;
        // a Tx: dropped (cancelled, failed, replaced), it closes the connection
        if let Some((mut tx, used)) = kept.and_then(|k| k.0.take()) {
            let lifetime = pool.options().get_max_lifetime();
            if lifetime.is_none_or(|max| tx.since.elapsed() < max) {
                if used.elapsed() < CHECK_IDLE_AFTER {
                    return Ok((tx, came));
                }
                match tokio::time::timeout(CLIENT_TIMEOUT, tx.conn().ping()).await {
                    Ok(Ok(())) => return Ok((tx, came)),
                    Ok(Err(_)) => came = Came::Replaced,
                    Err(_) => return Err(no_answer()),
                }
            }
        }
        let conn = timed(OUTBOX_EVENTS, pool.acquire()).await?;
        let tx = Tx {
            conn: Some(conn),
            since: Instant::now(),
        };
        Ok((tx, came))
    }

    /// The connection, for a statement of the batch.
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a batch's connection is there until it ends")
    }

    /// Commits; the connection goes to `kept` if given, back to the pool otherwise.
    pub(super) async fn commit(self, kept: Option<&mut Kept>) -> Result<()> {
        self.end("commit", kept).await
    }

    /// Rolls back; the connection goes to `kept` if given, back to the pool otherwise.
    pub(super) async fn rollback(self, kept: Option<&mut Kept>) -> Result<()> {
        self.end("rollback", kept).await
    }

    /// Gives the connection back to the pool, for one on which no transaction was begun.
    pub(super) fn release(mut self) {
        drop(self.conn.take());
    }

    async fn end(mut self, sql: &'static str, kept: Option<&mut Kept>) -> Result<()> {
        timed(OUTBOX_EVENTS, sqlx::query(sql).execute(self.conn())).await?;
        match kept {
            Some(kept) => kept.0 = Some((self, Instant::now())),
            // back to the pool
            None => drop(self.conn.take()),
        }
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// `fut`, a statement on `table`, within [`CLIENT_TIMEOUT`]: past it the answer is taken as
/// lost (a frozen network path, a stopped server) and the batch fails.
pub(super) async fn timed<T>(
    table: Table,
    fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
) -> Result<T> {
    match tokio::time::timeout(CLIENT_TIMEOUT, fut).await {
        Ok(result) => result.map_err(|e| table.error(e)),
        Err(_) => Err(no_answer()),
    }
}

/// The error of a statement that got no answer within [`CLIENT_TIMEOUT`].
fn no_answer() -> Error {
    Error::Database(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "Postgres did not answer within {CLIENT_TIMEOUT:?}; the batch's connection is closed"
        ),
    )))
}
