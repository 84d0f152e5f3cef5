//! The wake lock: emits notify only while a relay waits for commits (docs/relay.md,
//! *Wake-up*).
//!
//! A relay whose lanes are about to wait for commits takes the advisory lock
//! `(LOCK_NAMESPACE, WAKE_KEY)` exclusively, on a connection of its own, with
//! `pg_try_advisory_lock`: it never waits for it. An emit tries to take it shared for its
//! transaction: when it cannot (the relay holds it), the emit notifies; when it can, it holds
//! it until its transaction ends and does not notify. So the relay's lock is granted only when
//! no emit that did not notify is still running, and the lanes claim once more after it is
//! granted: every event is either announced or committed before that claim. Until the lock is
//! granted (an emit is in flight, which is what steady traffic looks like), the lanes linger:
//! they claim again after a short pause that grows while their claims come back empty, and find
//! new rows by themselves. While every lane is busy the relay lets the lock go, and emits stop
//! notifying: the notifications, which Postgres serialises at commit across the whole
//! instance, cost nothing while the relay keeps up by claiming.
//!
//! The lock's connection tells the server to end it when it is idle for
//! [`IDLE_SESSION_TIMEOUT`] (Postgres 14 and later), and the relay runs a statement on it every
//! second: a relay that is frozen or cut off loses the lock within seconds, by the server's
//! hand, and emits stop notifying.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, timeout, Instant};

use crate::emit::wake_lock;

/// How long every lane must have been busy before the relay lets the lock go: lanes that
/// finish a batch and find the next one within this keep it.
const RELEASE_AFTER: Duration = Duration::from_millis(200);
/// How often the relay runs a statement on the lock's connection while it holds the lock.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long the server lets the lock's connection be idle before it ends it (and the lock with
/// it): a few checks.
pub(super) const IDLE_SESSION_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon the relay tries the lock again after emits held it.
const TRY_AGAIN: Duration = Duration::from_millis(5);
/// The pause after a failed statement (Postgres down).
const RETRY: Duration = Duration::from_millis(500);

const TRY: &str = concat!("select pg_try_advisory_lock(", wake_lock!(), ")");
const RELEASE: &str = concat!("select pg_advisory_unlock(", wake_lock!(), ")");

/// The lock's state, shared by the relay's lanes and the task that holds it.
#[derive(Debug, Default)]
pub(super) struct Waker {
    /// Whether the relay holds the lock: emits notify.
    armed: AtomicBool,
    /// Counts every grant and every loss of the lock: a lane that saw the same count before its
    /// claim and the lock held after it may wait for commits.
    epoch: AtomicU64,
    /// Lanes that want the lock: waiting for commits, or lingering until it is granted.
    wanting: AtomicUsize,
    /// A lane began or stopped wanting the lock.
    wanted: Notify,
    /// The lock was granted or lost: lanes claim at once.
    pub(super) changed: watch::Sender<u64>,
}

/// A lane's want of the lock; dropped when the lane is busy again.
pub(super) struct Want<'a>(&'a Waker);

impl Drop for Want<'_> {
    fn drop(&mut self) {
        self.0.wanting.fetch_sub(1, Ordering::SeqCst);
        self.0.wanted.notify_waiters();
    }
}

impl Waker {
    /// The count to compare after a claim ([`armed_since`](Self::armed_since)).
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether the lock has been held since `epoch` was read: a claim that began after that
    /// read saw every event an emit did not announce.
    pub(super) fn armed_since(&self, epoch: u64) -> bool {
        self.armed.load(Ordering::SeqCst) && self.epoch() == epoch
    }

    /// A lane wants the lock until the returned guard is dropped.
    pub(super) fn want(&self) -> Want<'_> {
        self.wanting.fetch_add(1, Ordering::SeqCst);
        self.wanted.notify_waiters();
        Want(self)
    }

    fn any_wants(&self) -> bool {
        self.wanting.load(Ordering::SeqCst) > 0
    }

    fn set(&self, armed: bool) {
        self.armed.store(armed, Ordering::SeqCst);
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.changed.send_replace(epoch);
    }

    /// Until a lane wants the lock.
    async fn until_wanted(&self) {
        loop {
            let changed = self.wanted.notified();
            if self.any_wants() {
                return;
            }
            changed.await;
        }
    }

    /// Until no lane has wanted the lock for [`RELEASE_AFTER`], running a statement on `conn`
    /// every [`CHECK_EVERY`]; `false` when the connection is gone.
    async fn until_unwanted(&self, conn: &mut PgConnection) -> bool {
        let mut idle_since: Option<Instant> = None;
        let mut next_check = Instant::now() + CHECK_EVERY;
        loop {
            let changed = self.wanted.notified();
            let now = Instant::now();
            if now >= next_check {
                next_check = now + CHECK_EVERY;
                let alive = sqlx::query("select 1").execute(&mut *conn);
                if !matches!(timeout(IDLE_SESSION_TIMEOUT, alive).await, Ok(Ok(_))) {
                    return false;
                }
                continue;
            }
            let until = if self.any_wants() {
                idle_since = None;
                next_check
            } else {
                let since = *idle_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= RELEASE_AFTER {
                    return true;
                }
                (since + RELEASE_AFTER).min(next_check)
            };
            let _ = tokio::time::timeout_at(until, changed).await;
        }
    }
}

/// Takes the lock while a lane wants it and lets it go when none has for a while, until
/// aborted. The connection is one of its own, closed when this task ends, so the lock never
/// outlives the relay.
pub(super) async fn hold(pool: PgPool, waker: std::sync::Arc<Waker>) {
    let mut kept: Option<PgConnection> = None;
    loop {
        waker.until_wanted().await;
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => match connect(&pool).await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "outbox relay could not open a connection for its wake lock; its lanes keep claiming");
                    sleep(RETRY).await;
                    continue;
                }
            },
        };
        let granted = loop {
            if !waker.any_wants() {
                break Ok(false);
            }
            match timeout(
                IDLE_SESSION_TIMEOUT,
                sqlx::query_scalar::<_, bool>(TRY).fetch_one(&mut conn),
            )
            .await
            {
                Ok(Ok(true)) => break Ok(true),
                // an emit holds it shared (or another relay holds it): the lanes linger
                Ok(Ok(false)) => sleep(TRY_AGAIN).await,
                Ok(Err(e)) => break Err(e.to_string()),
                Err(_) => break Err("Postgres did not answer".into()),
            }
        };
        match granted {
            Ok(true) => {}
            Ok(false) => {
                kept = Some(conn);
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "outbox relay could not take its wake lock; its lanes keep claiming");
                sleep(RETRY).await;
                continue;
            }
        }
        waker.set(true);
        if !waker.until_unwanted(&mut conn).await {
            // the connection, and with it the lock, is gone: emits stop notifying, and the
            // lanes must claim rather than wait for them
            waker.set(false);
            sleep(RETRY).await;
            continue;
        }
        waker.set(false);
        match timeout(
            IDLE_SESSION_TIMEOUT,
            sqlx::query(RELEASE).execute(&mut conn),
        )
        .await
        {
            Ok(Ok(_)) => kept = Some(conn),
            _ => tracing::debug!(
                "outbox relay could not let its wake lock go; its connection is closed instead"
            ),
        }
    }
}

/// A connection of its own with the pool's options, which the server ends when it is idle for
/// [`IDLE_SESSION_TIMEOUT`] (where the server has the setting: Postgres 14 and later).
pub(super) async fn connect(pool: &PgPool) -> sqlx::Result<PgConnection> {
    let options = pool.connect_options().as_ref().clone();
    let mut conn = timeout(IDLE_SESSION_TIMEOUT, PgConnection::connect_with(&options))
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    let idle = IDLE_SESSION_TIMEOUT.as_millis().to_string();
    sqlx::query(
        "select set_config('idle_session_timeout', $1, false) \
          where current_setting('server_version_num')::int >= 140000",
    )
    .bind(idle)
    .execute(&mut conn)
    .await?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_lane_may_wait_only_when_the_lock_was_held_through_its_claim() {
        let w = Waker::default();
        let before = w.epoch();
        assert!(!w.armed_since(before), "not held");
        w.set(true);
        assert!(
            !w.armed_since(before),
            "granted during the claim: claim once more"
        );
        let after = w.epoch();
        assert!(w.armed_since(after));
        w.set(false);
        w.set(true);
        assert!(!w.armed_since(after), "lost and taken again meanwhile");
    }

    #[test]
    fn wants_are_counted_until_dropped() {
        let w = Waker::default();
        assert!(!w.any_wants());
        let a = w.want();
        let b = w.want();
        drop(a);
        assert!(w.any_wants());
        drop(b);
        assert!(!w.any_wants());
    }
}
