//! The subscriptions service: `POST /v1/subscriptions` and friends, with the outbox relay and a
//! welcome consumer running as worker tasks. See the crate docs of `subscriptions` (src/lib.rs).

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();
    let config = match subscriptions::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = async {
        subscriptions::shutdown_signal().await;
        tracing::info!("shutting down: draining requests, finishing the relay batch");
    };
    match subscriptions::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
