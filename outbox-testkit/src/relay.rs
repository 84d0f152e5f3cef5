//! Running a relay in the background, as a service's worker task does.

use std::sync::Arc;

use outbox_runtime::Relay;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Runs `relay` in a task until the returned sender fires or is dropped; the task ends when the
/// relay has stopped (its batches in progress committed), and panics if the relay failed.
pub fn run_relay(relay: Arc<Relay>) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the relay runs");
    });
    (stop, running)
}
