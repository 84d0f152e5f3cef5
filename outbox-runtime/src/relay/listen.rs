//! The wake-up: `LISTEN` on the emit channel, forwarded to the lane whose partition each
//! notification names (docs/relay.md, *Wake-up*).

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::timeout;

use crate::metrics as names;
use crate::NOTIFY_CHANNEL;

/// How often the relay runs a statement on its `LISTEN` connection, and how long it waits for
/// the answer before it takes the connection as lost.
const PING_EVERY: Duration = Duration::from_secs(2);
const PING_ANSWER: Duration = Duration::from_secs(5);
/// How long the server lets the `LISTEN` connection be idle before it ends it (Postgres 14
/// and later): a relay that froze stops reading its notifications, and would hold back the
/// server's notification queue for as long as it stays frozen.
const IDLE_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// What the listener tells the lanes.
#[derive(Debug, Clone)]
pub(super) struct Signals {
    /// Per lane: a commit of one of its partitions was announced (or notifications may have
    /// been missed).
    pub(super) commits: Vec<watch::Sender<()>>,
    /// The relay's partitions: a notification names the partition of 1024 of the emitted
    /// event's subject, which a lane owns when the relay runs 1024 partitions.
    pub(super) partitions: i32,
    /// Whether the `LISTEN` connection is up.
    pub(super) listening: watch::Sender<bool>,
}

impl Signals {
    /// Signals for `lanes` lanes over `partitions`.
    pub(super) fn new(lanes: usize, partitions: i32) -> Signals {
        Signals {
            commits: (0..lanes).map(|_| watch::channel(()).0).collect(),
            partitions,
            listening: watch::channel(false).0,
        }
    }

    /// Every lane claims.
    pub(super) fn wake_all(&self) {
        for lane in &self.commits {
            lane.send_replace(());
        }
    }

    /// A notification with `payload` arrived: the lane of the partition it names claims, or
    /// every lane when it names none this relay can place (an emit of another version, a
    /// relay with another number of partitions).
    fn announced(&self, payload: &str) {
        let lanes = self.commits.len() as i64;
        match payload.parse::<i64>() {
            Ok(p) if self.partitions == 1024 && (0..1024).contains(&p) => {
                // lane l owns [l * 1024 / lanes, (l + 1) * 1024 / lanes)
                let lane = ((p + 1) * lanes - 1) / 1024;
                self.commits[lane as usize].send_replace(());
            }
            _ => self.wake_all(),
        }
    }
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
                match start(&mut listener).await {
                    Ok(()) => {
                        retry = RECONNECT_FIRST;
                        metrics::gauge!(names::LISTENING).set(1.0);
                        signals.listening.send_replace(true);
                        signals.wake_all();
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

/// `LISTEN`, with the server told to end the session if the relay stops talking to it.
async fn start(listener: &mut PgListener) -> sqlx::Result<()> {
    sqlx::query(
        "select set_config('idle_session_timeout', $1, false) \
          where current_setting('server_version_num')::int >= 140000",
    )
    .bind(IDLE_SESSION_TIMEOUT.as_millis().to_string())
    .execute(&mut *listener)
    .await?;
    listener.listen(NOTIFY_CHANNEL).await
}

/// Forwards notifications until the connection is lost or a statement on it goes unanswered
/// for [`PING_ANSWER`]; says which. The statement goes every [`PING_EVERY`] whatever arrives
/// (a notification the server sends is no statement of the client's: the session would count
/// as idle).
async fn forward(listener: &mut PgListener, signals: &Signals) -> String {
    let mut next_ping = tokio::time::Instant::now() + PING_EVERY;
    loop {
        match tokio::time::timeout_at(next_ping, listener.try_recv()).await {
            Ok(Ok(Some(n))) => {
                signals.announced(n.payload());
                continue;
            }
            Ok(Ok(None)) => return "the connection closed".into(),
            Ok(Err(e)) => return e.to_string(),
            Err(_) => {}
        }
        let ping = sqlx::query("select 1").execute(&mut *listener);
        match timeout(PING_ANSWER, ping).await {
            Ok(Ok(_)) => next_ping = tokio::time::Instant::now() + PING_EVERY,
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return format!("no answer within {PING_ANSWER:?}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(signals: &Signals, receivers: &mut [watch::Receiver<()>]) -> Vec<bool> {
        let _ = signals;
        receivers
            .iter_mut()
            .map(|r| {
                let changed = r.has_changed().unwrap();
                r.borrow_and_update();
                changed
            })
            .collect()
    }

    #[test]
    fn a_notification_wakes_the_lane_of_its_partition_and_any_other_payload_every_lane() {
        let signals = Signals::new(3, 1024);
        let mut rx: Vec<_> = signals.commits.iter().map(|s| s.subscribe()).collect();
        for (payload, lane) in [
            ("0", 0),
            ("340", 0),
            ("341", 1),
            ("681", 1),
            ("682", 2),
            ("1023", 2),
        ] {
            signals.announced(payload);
            let mut expected = vec![false; 3];
            expected[lane] = true;
            assert_eq!(woken(&signals, &mut rx), expected, "{payload}");
        }
        for payload in ["", "1024", "-1", "granted"] {
            signals.announced(payload);
            assert_eq!(woken(&signals, &mut rx), [true, true, true], "{payload}");
        }
        let other = Signals::new(2, 64);
        let mut rx: Vec<_> = other.commits.iter().map(|s| s.subscribe()).collect();
        other.announced("5");
        assert_eq!(
            woken(&other, &mut rx),
            [true, true],
            "another number of partitions"
        );
    }

    #[test]
    fn the_lane_of_a_partition_is_the_one_whose_range_holds_it() {
        for lanes in 1..=64i64 {
            for p in 0..1024i64 {
                let lane = ((p + 1) * lanes - 1) / 1024;
                let (from, to) = (lane * 1024 / lanes, (lane + 1) * 1024 / lanes);
                assert!(
                    from <= p && p < to,
                    "partition {p} with {lanes} lanes: lane {lane}"
                );
            }
        }
    }
}
