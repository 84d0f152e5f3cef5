//! The wake lock: emits notify only while a relay waits for commits (docs/relay.md,
//! *Wake-up*).
//!
//! A relay whose lane is about to wait for commits holds the advisory lock
//! `(LOCK_NAMESPACE, WAKE_KEY)` exclusively, on a connection of its own. An emit tries to take it
//! shared: when it cannot (a relay holds it, or waits for it), the emit notifies; when it can,
//! it holds it until its transaction ends and does not notify. So a relay's acquisition waits
//! for every emit that did not notify, and the lanes claim once when it is granted: an event is
//! either announced or committed before that claim, whatever the interleaving. While every lane
//! is busy (claiming back to back, which finds new rows by itself) the relay lets the lock go,
//! and emits stop notifying: the notifications, which Postgres serialises at commit across the
//! whole instance, cost nothing while relays drain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, timeout, timeout_at, Instant};

use crate::emit::wake_lock;

/// How long the relay waits for the lock at a time (its connection's `lock_timeout` meanwhile),
/// before it looks again whether a lane still waits for commits. Under a second: sqlx logs a
/// statement that takes a second or more at warn by default, and a relay that waits while
/// another holds the lock (every idle relay but one) would log such a warning every second.
const ACQUIRE_FOR: &str = "set lock_timeout = 900";
/// How long every lane must have been busy before the relay lets the lock go: lanes that
/// finish a batch and find the next one within this keep it.
const RELEASE_AFTER: Duration = Duration::from_millis(200);
/// How often the relay checks, while it holds the lock, that its connection (and so the lock)
/// is still there.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The pause after a failed statement (Postgres down).
const RETRY: Duration = Duration::from_millis(500);

/// The acquisition, and once granted a notification (`granted`; the lanes take any payload but
/// the relays' own as a commit): the emits it waited for may be any relay's, and every relay's lanes claim once more (the grant goes to one of the relays
/// waiting).
const ACQUIRE: &str = concat!(
    "select pg_advisory_lock(",
    wake_lock!(),
    "), pg_notify('",
    crate::emit::notify_channel!(),
    "', 'granted')"
);
const RELEASE: &str = concat!("select pg_advisory_unlock(", wake_lock!(), ")");

/// The lanes waiting for commits.
#[derive(Debug, Default)]
pub(super) struct Sleepers {
    count: AtomicUsize,
    changed: Notify,
}

/// A lane's wait for commits; dropped when it ends.
pub(super) struct Sleeping<'a>(&'a Sleepers);

impl Sleepers {
    /// A lane starts waiting for commits: the relay takes the lock if it does not hold it.
    pub(super) fn enter(&self) -> Sleeping<'_> {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Sleeping(self)
    }

    fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Until a lane waits for commits.
    async fn wanted(&self) {
        loop {
            let changed = self.changed.notified();
            if self.any() {
                return;
            }
            changed.await;
        }
    }

    /// Until no lane has waited for commits for [`RELEASE_AFTER`], checking the connection
    /// every [`CHECK_EVERY`] whatever the lanes do; `false` when the connection is gone.
    async fn unwanted(&self, conn: &mut PoolConnection<Postgres>) -> bool {
        let mut idle_since: Option<Instant> = None;
        let mut next_check = Instant::now() + CHECK_EVERY;
        loop {
            let changed = self.changed.notified();
            let now = Instant::now();
            if now >= next_check {
                next_check = now + CHECK_EVERY;
                let alive = sqlx::query("select 1").execute(&mut **conn);
                if !matches!(timeout(CHECK_EVERY * 5, alive).await, Ok(Ok(_))) {
                    return false;
                }
                continue;
            }
            let until = if self.any() {
                idle_since = None;
                next_check
            } else {
                let since = *idle_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= RELEASE_AFTER {
                    return true;
                }
                (since + RELEASE_AFTER).min(next_check)
            };
            let _ = timeout_at(until, changed).await;
        }
    }
}

impl Drop for Sleeping<'_> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// Holds the wake lock while a lane waits for commits, until aborted; each grant wakes the
/// lanes (`commits`) for the claim that covers the emits it waited for. The lock is taken on a
/// connection kept for it, closed rather than returned to the pool when this task ends, so that
/// the lock never outlives the relay.
pub(super) async fn hold(
    pool: PgPool,
    sleepers: std::sync::Arc<Sleepers>,
    commits: watch::Sender<()>,
) {
    let mut kept: Option<PoolConnection<Postgres>> = None;
    loop {
        sleepers.wanted().await;
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => match connection(&pool).await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "outbox relay could not open a connection for its wake lock");
                    commits.send_replace(());
                    sleep(RETRY).await;
                    continue;
                }
            },
        };
        // wait for the lock 900 ms at a time while a lane still waits for commits
        match acquire(&mut conn, &sleepers, &commits).await {
            Ok(true) => {}
            Ok(false) => {
                kept = Some(conn); // no lane waits any more
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "outbox relay could not take its wake lock");
                // the lanes claim again rather than trust a lock this relay does not hold
                commits.send_replace(());
                sleep(RETRY).await;
                continue;
            }
        }
        commits.send_replace(());
        if !sleepers.unwanted(&mut conn).await {
            // the connection, and with it the lock, is gone: emits do not notify meanwhile
            commits.send_replace(());
            sleep(RETRY).await;
            continue;
        }
        match sqlx::query(RELEASE).execute(&mut *conn).await {
            Ok(_) => kept = Some(conn),
            Err(e) => {
                tracing::debug!(error = %e, "outbox relay could not let its wake lock go; its connection is closed instead")
            }
        }
    }
}

/// A connection of the pool's, closed when dropped, with the lock timeout of [`ACQUIRE_FOR`].
async fn connection(pool: &PgPool) -> sqlx::Result<PoolConnection<Postgres>> {
    let mut conn = pool.acquire().await?;
    conn.close_on_drop();
    sqlx::query(ACQUIRE_FOR).execute(&mut *conn).await?;
    Ok(conn)
}

/// Waits for the lock on `conn` while a lane waits for commits: `true` once granted, `false`
/// when no lane waits any more.
async fn acquire(
    conn: &mut PoolConnection<Postgres>,
    sleepers: &Sleepers,
    commits: &watch::Sender<()>,
) -> sqlx::Result<bool> {
    loop {
        if !sleepers.any() {
            return Ok(false);
        }
        match sqlx::query(ACQUIRE).execute(&mut **conn).await {
            Ok(_) => return Ok(true),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
                // a long transaction holds the lock shared (it emitted and has not ended), or
                // another relay holds it: emits that took it shared before this wait and have
                // committed since are announced by no one, so the lanes claim each time a wait
                // ends, while the wait lasts
                commits.send_replace(());
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_wake_lock_literal_is_the_namespace_and_the_key() {
        assert_eq!(
            crate::emit::wake_lock!(),
            format!(
                "{}, {}",
                crate::relay::LOCK_NAMESPACE,
                crate::emit::WAKE_KEY
            )
        );
    }
}
