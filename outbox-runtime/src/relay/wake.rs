//! The wake-up locks: emits notify only while a relay waits for commits (docs/relay.md,
//! *Wake-up*).
//!
//! Two advisory locks, neither ever waited for. An emit holds the wake lock
//! `(LOCK_NAMESPACE, WAKE_KEY)` shared until its transaction ends, and then looks whether the
//! notify lock `(LOCK_NAMESPACE, NOTIFY_KEY)` is held: when it is (or when the wake lock could
//! not be taken), the emit notifies. A relay whose lanes are about to wait for commits takes
//! the notify lock exclusively, at once (nothing but another relay holds it): from then on
//! every emit notifies, and its lanes wake on the notifications. Emits that looked before that
//! and did not notify still hold the wake lock: the relay tries to take it exclusively (it
//! never waits for it: no statement of the relay's ends in a lock timeout), and once it has,
//! lets it go and has its lanes claim once more. From then on they may wait for commits as long
//! as the fallback poll: every event is either announced or committed before that claim. Until
//! then (an emit is in flight: a long transaction, a prepared one) the lanes linger, claiming
//! now and then, and wake on every notification meanwhile.
//!
//! While every lane is busy the relay lets the notify lock go, and emits stop notifying: the
//! notifications, which Postgres serialises at commit across the whole instance, cost nothing
//! while the relay keeps up by claiming.
//!
//! The locks' connection tells the server to end it when it is idle for
//! [`IDLE_SESSION_TIMEOUT`] (Postgres 14 and later), and the relay runs a statement on it every
//! second: a relay that is frozen or cut off loses the notify lock within seconds, by the
//! server's hand, and emits stop notifying.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, timeout, Instant};

use crate::emit::{notify_lock, wake_lock};

/// How long every lane must have been busy before the relay lets the notify lock go: lanes
/// that finish a batch and find the next one within this keep it.
const RELEASE_AFTER: Duration = Duration::from_millis(200);
/// How often the relay runs a statement on the locks' connection while it holds the notify
/// lock.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long the server lets the locks' connection be idle before it ends it (and the lock with
/// it): a few checks.
pub(super) const IDLE_SESSION_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon the relay tries the wake lock again while emits hold it; it doubles up to
/// [`CONFIRM_MAX`] (notifications flow meanwhile: only the lanes' long waits wait for it).
const CONFIRM_FIRST: Duration = Duration::from_millis(5);
const CONFIRM_MAX: Duration = Duration::from_millis(100);
/// The pause after a failed statement (Postgres down), or while another relay holds the notify
/// lock.
const RETRY: Duration = Duration::from_millis(500);

/// Takes the notify lock and, when it did, has the server end the session if it stays idle
/// for `$1` milliseconds (Postgres 14 and later: the setting does not exist before).
const TAKE_NOTIFY: &str = concat!(
    "select case when pg_try_advisory_lock(",
    notify_lock!(),
    ") then case when current_setting('server_version_num')::int < 140000 then true",
    " else set_config('idle_session_timeout', $1, false) is not null end else false end"
);
/// Lets the notify lock go, and the session may be idle again (it is kept for the next time).
const LET_NOTIFY_GO: &str = concat!(
    "select pg_advisory_unlock(",
    notify_lock!(),
    "), case when current_setting('server_version_num')::int < 140000 then true",
    " else set_config('idle_session_timeout', '0', false) is not null end"
);
/// Takes the wake lock and lets it go in one statement: whether it could be taken.
const CONFIRM: &str = concat!(
    "select case when pg_try_advisory_lock(",
    wake_lock!(),
    ") then pg_advisory_unlock(",
    wake_lock!(),
    ") else false end"
);

/// What the relay holds: nothing, the notify lock (emits notify), or the notify lock and the
/// knowledge that every emit that did not notify has ended since (lanes may wait long).
const OFF: u8 = 0;
const NOTIFYING: u8 = 1;
const ARMED: u8 = 2;

/// The locks' state, shared by the relay's lanes and the task that holds them.
#[derive(Debug, Default)]
pub(super) struct Waker {
    state: AtomicU8,
    /// Counts every change of state: a lane that saw the same count before its claim and the
    /// relay armed after it may wait for commits.
    epoch: AtomicU64,
    /// Lanes that want the lock: waiting for commits, or lingering until the relay is armed.
    wanting: AtomicUsize,
    /// A lane began or stopped wanting the lock.
    wanted: Notify,
    /// The state changed: lanes claim at once.
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

/// How the relay's hold of the notify lock ended.
enum Ended {
    /// No lane wanted it for a while: let go.
    Unwanted,
    /// The connection, and the lock with it, is gone.
    Lost,
}

impl Waker {
    /// The count to compare after a claim ([`armed_since`](Self::armed_since)).
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether the relay has been armed since `epoch` was read: a claim that began after that
    /// read saw every event an emit did not announce.
    pub(super) fn armed_since(&self, epoch: u64) -> bool {
        self.state.load(Ordering::SeqCst) == ARMED && self.epoch() == epoch
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

    fn set(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
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

    /// Holds the notify lock (taken on `conn`) until no lane has wanted it for
    /// [`RELEASE_AFTER`]: tries the wake lock until it can take it (then the relay is armed),
    /// and runs a statement on `conn` at least every [`CHECK_EVERY`].
    async fn hold(&self, conn: &mut PgConnection) -> Ended {
        let mut idle_since: Option<Instant> = None;
        let mut confirm_every = CONFIRM_FIRST;
        let mut next_statement = Instant::now();
        loop {
            let changed = self.wanted.notified();
            let now = Instant::now();
            if now >= next_statement {
                let armed = self.state.load(Ordering::SeqCst) == ARMED;
                let statement = if armed { "select true" } else { CONFIRM };
                let answer = sqlx::query_scalar::<_, bool>(statement).fetch_one(&mut *conn);
                match timeout(IDLE_SESSION_TIMEOUT, answer).await {
                    Ok(Ok(true)) if !armed => self.set(ARMED),
                    Ok(Ok(_)) => {}
                    _ => return Ended::Lost,
                }
                next_statement = if self.state.load(Ordering::SeqCst) == ARMED {
                    Instant::now() + CHECK_EVERY
                } else {
                    let at = Instant::now() + confirm_every;
                    confirm_every = (confirm_every * 2).min(CONFIRM_MAX);
                    at
                };
                continue;
            }
            let until = if self.any_wants() {
                idle_since = None;
                next_statement
            } else {
                let since = *idle_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= RELEASE_AFTER {
                    return Ended::Unwanted;
                }
                (since + RELEASE_AFTER).min(next_statement)
            };
            let _ = tokio::time::timeout_at(until, changed).await;
        }
    }
}

/// Takes the notify lock while a lane wants it and lets it go when none has for a while,
/// until aborted. The connection is one of its own, closed when this task ends, so the lock
/// never outlives the relay.
pub(super) async fn hold(pool: PgPool, waker: std::sync::Arc<Waker>) {
    let mut kept: Option<PgConnection> = None;
    loop {
        waker.until_wanted().await;
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => match connect(&pool).await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "outbox relay could not open a connection for its wake-up locks; its lanes keep claiming");
                    sleep(RETRY).await;
                    continue;
                }
            },
        };
        let taken = sqlx::query_scalar::<_, bool>(TAKE_NOTIFY)
            .bind(IDLE_SESSION_TIMEOUT.as_millis().to_string())
            .fetch_one(&mut conn);
        match timeout(IDLE_SESSION_TIMEOUT, taken).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                // another relay (or a session of someone else's) holds it: emits notify, and
                // this relay's lanes linger
                kept = Some(conn);
                sleep(RETRY).await;
                continue;
            }
            _ => {
                tracing::debug!(
                    "outbox relay could not take its notify lock; its lanes keep claiming"
                );
                sleep(RETRY).await;
                continue;
            }
        }
        waker.set(NOTIFYING);
        match waker.hold(&mut conn).await {
            Ended::Unwanted => {
                waker.set(OFF);
                let let_go = sqlx::query(LET_NOTIFY_GO).execute(&mut conn);
                match timeout(IDLE_SESSION_TIMEOUT, let_go).await {
                    Ok(Ok(_)) => kept = Some(conn),
                    _ => tracing::debug!("outbox relay could not let its notify lock go; its connection is closed instead"),
                }
            }
            Ended::Lost => {
                // the connection, and with it the lock, is gone: emits stop notifying, and the
                // lanes must claim rather than wait for them
                waker.set(OFF);
                sleep(RETRY).await;
            }
        }
    }
}

/// A connection of its own with the pool's options; while it holds the notify lock, the
/// server ends it when it is idle for [`IDLE_SESSION_TIMEOUT`] ([`TAKE_NOTIFY`]).
pub(super) async fn connect(pool: &PgPool) -> sqlx::Result<PgConnection> {
    let options = pool.connect_options().as_ref().clone();
    timeout(IDLE_SESSION_TIMEOUT, PgConnection::connect_with(&options))
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_literals_are_the_namespace_and_the_keys() {
        let literal = |key: i32| format!("{}, {key}", crate::relay::LOCK_NAMESPACE);
        assert_eq!(wake_lock!(), literal(crate::emit::WAKE_KEY));
        assert_eq!(notify_lock!(), literal(crate::emit::NOTIFY_KEY));
    }

    #[test]
    fn a_lane_may_wait_only_when_the_relay_was_armed_through_its_claim() {
        let w = Waker::default();
        let before = w.epoch();
        assert!(!w.armed_since(before), "nothing held");
        w.set(NOTIFYING);
        let notifying = w.epoch();
        assert!(
            !w.armed_since(notifying),
            "emits in flight may not have notified"
        );
        w.set(ARMED);
        assert!(
            !w.armed_since(notifying),
            "armed during the claim: claim once more"
        );
        let after = w.epoch();
        assert!(w.armed_since(after));
        w.set(OFF);
        w.set(NOTIFYING);
        w.set(ARMED);
        assert!(!w.armed_since(after), "lost and taken again meanwhile");
    }

    #[test]
    fn the_relay_takes_the_notify_lock_and_tries_the_wake_lock_without_waiting() {
        for statement in [TAKE_NOTIFY, CONFIRM] {
            assert!(statement.contains("pg_try_advisory_lock("), "{statement}");
            assert!(!statement.contains("pg_advisory_lock("), "{statement}");
        }
        assert!(CONFIRM.contains(concat!("then pg_advisory_unlock(", wake_lock!(), ")")));
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
