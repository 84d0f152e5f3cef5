//! The batch's connection and transaction, with a deadline on every statement: a batch whose
//! relay freezes or loses its network releases its locks within seconds (docs/relay.md,
//! *Failures*).

use std::future::Future;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::error::{Error, Result};
use crate::table::{Table, OUTBOX_EVENTS};

/// The server-side `statement_timeout` and `lock_timeout` of a batch's statements.
pub(super) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the relay waits for any answer of Postgres before it gives the connection up.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(12);

/// A batch's transaction on a connection of its own. It ends by [`Tx::commit`] or
/// [`Tx::rollback`]; dropped any other way (an error, a timeout, a cancelled batch), the
/// connection is closed rather than returned to the pool, so that the server ends the
/// transaction and its locks, and no connection in an unknown state is reused.
#[derive(Debug)]
pub(super) struct Tx(Option<PoolConnection<Postgres>>);

impl Tx {
    /// A connection from `pool`, whose transaction the first statement begins (the batch's
    /// [`begin_settings`](super::sql::begin_settings)). Until it ends by [`Tx::commit`] or
    /// [`Tx::rollback`], dropping it closes the connection.
    pub(super) async fn acquire(pool: &PgPool) -> Result<Tx> {
        let conn = timed(OUTBOX_EVENTS, pool.acquire()).await?;
        Ok(Tx(Some(conn)))
    }

    /// The connection, for a statement of the batch.
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        self.0
            .as_mut()
            .expect("a batch's connection is there until it ends")
    }

    async fn execute(&mut self, sql: &'static str) -> Result<()> {
        timed(OUTBOX_EVENTS, sqlx::query(sql).execute(self.conn())).await?;
        Ok(())
    }

    /// Commits, and returns the connection to the pool.
    pub(super) async fn commit(mut self) -> Result<()> {
        self.execute("commit").await?;
        drop(self.0.take());
        Ok(())
    }

    /// Rolls back, and returns the connection to the pool.
    pub(super) async fn rollback(mut self) -> Result<()> {
        self.execute("rollback").await?;
        drop(self.0.take());
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
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
        Err(_) => Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("Postgres did not answer within {CLIENT_TIMEOUT:?}; the batch's connection is closed"),
        )))),
    }
}
