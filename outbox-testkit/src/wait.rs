//! Waiting for a condition instead of sleeping for a guessed time.

use std::future::Future;
use std::time::Duration;

/// How often [`eventually`] checks its condition.
const POLL: Duration = Duration::from_millis(50);

/// Waits until `check` returns true, polling every 50 ms; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "gave up after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}
