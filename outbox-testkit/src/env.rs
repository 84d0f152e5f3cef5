//! Where the shared services are, and what happens when one is missing.
//!
//! `DATABASE_URL` and `NATS_URL` name the Postgres server and the nats-server the tests use;
//! unset, they default to the local services `scripts/services` starts. A test never skips
//! because a service is missing: it fails, and the message names the URL it tried, why it
//! could not connect, and the command that starts the service.

use std::fmt::Display;

/// The Postgres server used when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://root@127.0.0.1/test";

/// The nats-server used when `NATS_URL` is unset.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// What a failure for a missing service tells the reader to do.
pub const START_SERVICES: &str =
    "start it (in the outbox repository, `scripts/services` starts both services)";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into())
}

/// `NATS_URL`, or [`DEFAULT_NATS_URL`].
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| DEFAULT_NATS_URL.into())
}

/// Fails the test because `service` (as the message names it: `Postgres`, `NATS`) cannot be
/// reached at `url`; `variable` is the environment variable that points elsewhere.
pub(crate) fn service_missing(service: &str, url: &str, error: impl Display, variable: &str) -> ! {
    let redacted = outbox_runtime::redact::url(url);
    let error = outbox_runtime::redact::password_in(&error.to_string(), url);
    panic!(
        "cannot connect to {service} at {redacted}: {error}; {START_SERVICES} (or set {variable})"
    )
}
