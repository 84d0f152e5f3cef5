//! Publishing everything a test has committed, without running the relay in the background.

use std::time::Duration;

use outbox_runtime::{BatchReport, Relay};

/// How long [`drain`] keeps trying while the broker takes nothing (not connected, a stream
/// electing a leader) before it fails the test.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// What [`drain`] published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Batches run, the last one (which claimed nothing) included.
    pub batches: usize,
    /// Events acknowledged by JetStream and marked published (duplicates included).
    pub published: usize,
    /// Of `published`, acknowledgements JetStream flagged as duplicates.
    pub duplicates: usize,
}

/// Runs the relay's batches ([`Relay::run_once`]) until one claims nothing: every committed
/// event that can be published is then acknowledged by JetStream and marked published.
///
/// It fails the test, naming the subjects, event ids and the broker's or the relay's reasons,
/// as soon as a batch fails to publish an event or holds one, and at the end if an event is
/// held from before: a drain that returns has published everything it met and leaves no event
/// held. (A subject backing off from an earlier failure is not claimable until its retry is
/// due, so its events may still wait.) To test a failure itself, call [`Relay::run_once`] and
/// read its [`BatchReport`]. While events wait that no batch can take yet (the broker takes
/// nothing during an election or without a connection, the relay pauses such a subject for a
/// moment, another transaction locks a row), it tries again every 50 ms, and fails the test
/// after [`DRAIN_LIMIT`] without progress.
///
/// It claims from every partition, whatever [`RelayConfig::lanes`](outbox_runtime::RelayConfig)
/// says, and may run beside a relay's [`Relay::run`]: the two take turns per subject.
///
/// ```no_run
/// # async fn example(relay: outbox_runtime::Relay) {
/// let drained = outbox_testkit::drain(&relay).await;
/// assert_eq!(drained.published, 1);
/// # }
/// ```
pub async fn drain(relay: &Relay) -> Drained {
    let mut drained = Drained::default();
    let mut end = tokio::time::Instant::now() + DRAIN_LIMIT;
    loop {
        let report = relay
            .run_once()
            .await
            .unwrap_or_else(|e| panic!("drain: a relay batch failed: {e}"));
        drained.batches += 1;
        drained.published += report.published;
        drained.duplicates += report.duplicates;
        if report.failed > 0 || report.held > 0 {
            panic!("drain: {}; {}", failures(&report), held_list(relay).await);
        }
        if report.published > 0 {
            end = tokio::time::Instant::now() + DRAIN_LIMIT;
            continue;
        }
        if report.claimed == 0 {
            // held before this drain began: not claimable, and not published either
            let held = relay
                .held()
                .await
                .unwrap_or_else(|e| panic!("drain: reading the held events: {e}"));
            if !held.is_empty() {
                panic!("drain: an event is held; {}", held_list(relay).await);
            }
            // rows this claim left out for now: a subject the relay paused for a moment after
            // the broker took nothing, or a row another transaction locks
            let waiting = waiting(relay).await;
            if waiting == 0 {
                return drained;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "drain: gave up after {DRAIN_LIMIT:?}: {waiting} unpublished event(s), none parked, and no batch could take them (locked by another transaction, or the broker took none: is the nats-server reachable?)"
            );
        } else {
            // claimed, but nothing went out
            assert!(
                tokio::time::Instant::now() < end,
                "drain: gave up after {DRAIN_LIMIT:?}: the last batch claimed {} event(s) and published none ({} not attempted: is the nats-server reachable? {} skipped behind an earlier event of their subject)",
                report.claimed,
                report.not_attempted,
                report.skipped
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Unpublished rows whose subject is not parked (no retry schedule): rows a later batch may
/// take.
async fn waiting(relay: &Relay) -> i64 {
    sqlx::query_scalar(
        "select count(*) from outbox_events o where o.published_at is null \
            and not exists (select 1 from outbox_retries r where r.subject = o.subject)",
    )
    .fetch_one(relay.pool())
    .await
    .unwrap_or_else(|e| panic!("drain: counting the unpublished events: {e}"))
}

fn failures(report: &BatchReport) -> String {
    let mut parts = Vec::new();
    if report.failed > 0 {
        parts.push(format!(
            "{} event(s) failed to publish and back off (the relay's warning log has the broker's answer)",
            report.failed
        ));
    }
    if report.held > 0 {
        parts.push(format!("{} event(s) held", report.held));
    }
    parts.join(" and ")
}

/// The held events, with their subjects and reasons, in words.
async fn held_list(relay: &Relay) -> String {
    match relay.held().await {
        Ok(held) if held.is_empty() => "no event is held".into(),
        Ok(held) => held
            .iter()
            .map(|h| {
                format!(
                    "held: event {} of subject `{}` ({}): {}",
                    h.id, h.subject, h.event_type, h.reason
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("(the held events could not be read: {e})"),
    }
}
