//! The command's error: what went wrong, for a human, with the error that caused it kept as
//! its source (secrets already redacted by the runtime).

use std::net::SocketAddr;

use outbox_runtime::{redact, BoxError, Error};

/// Everything that makes a command exit 2.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// Connecting to Postgres or NATS failed. The runtime's error says why and what to fix; the
    /// command names the service and the address it was given (redacted), and where a local
    /// server comes from when nothing answered.
    #[error(
        "cannot connect to {service} at {url}: {}{source}{}",
        lead(source),
        local_servers(source)
    )]
    Connect {
        /// `Postgres` or `NATS`.
        service: &'static str,
        /// The URL given, without its secrets.
        url: String,
        /// The runtime's error: unreachable, TLS, a refused login, a configuration problem.
        #[source]
        source: Box<Error>,
    },
    /// Anything else the runtime refused or could not do.
    #[error(transparent)]
    Runtime(Box<Error>),
    /// The codegen could not generate the schemas folder's Rust.
    #[error(transparent)]
    Codegen(#[from] outbox_codegen::Error),
    /// A statement of the command's own failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A report could not be written as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The OpenTelemetry export could not be set up as the `OTEL_*` variables ask.
    #[error("{0}")]
    Telemetry(String),
    /// The metrics and probes listener could not be set up.
    #[error("cannot serve metrics and probes on {addr}: {source}")]
    Listen {
        /// The address of --metrics-addr.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file the command writes could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A flag that must be a duration is not one.
    #[error("--{flag} must be a non-negative number of {unit}, got {value}")]
    NotADuration {
        /// The flag, without its dashes.
        flag: &'static str,
        /// `seconds` or `hours`.
        unit: &'static str,
        /// What it was given.
        value: f64,
    },
    /// The Prometheus exporter could not be set up or could not listen.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// The address of --metrics-addr.
        addr: SocketAddr,
        /// The exporter's error.
        #[source]
        source: metrics_exporter_prometheus::BuildError,
    },
    /// `outbox tail` found no stream that captures the first event type.
    #[error(
        "no stream captures `{event_type}` ({source}); pass --stream or create one with `outbox stream ensure`"
    )]
    NoStream {
        /// The first event type given.
        event_type: String,
        /// JetStream's answer.
        #[source]
        source: BoxError,
    },
    /// Reading the stream failed (`outbox tail`).
    #[error("{action}: {source}")]
    Stream {
        /// What was being done, e.g. "cannot follow `BILLING`".
        action: String,
        /// async-nats's error.
        #[source]
        source: BoxError,
    },
}

impl From<Error> for CliError {
    fn from(e: Error) -> Self {
        CliError::Runtime(Box::new(e))
    }
}

impl CliError {
    /// A failure to connect to Postgres at `database_url`.
    pub fn postgres(database_url: &str, source: Error) -> CliError {
        CliError::Connect {
            service: "Postgres",
            url: redact::url(database_url),
            source: Box::new(source),
        }
    }

    /// A failure to connect to NATS at `nats_url`.
    pub fn nats(nats_url: &str, source: Error) -> CliError {
        CliError::Connect {
            service: "NATS",
            url: redact::url(nats_url),
            source: Box::new(source),
        }
    }

    /// An error of [`Relay::connect_with`](outbox_runtime::Relay::connect_with), which
    /// connects to both: a failure to connect names the service it is about.
    pub fn relay_start(database_url: &str, nats_url: &str, source: Error) -> CliError {
        let service = match &source {
            Error::Unreachable { service, .. }
            | Error::Tls { service, .. }
            | Error::Authentication { service, .. } => *service,
            _ => return source.into(),
        };
        if service == "nats" {
            CliError::nats(nats_url, source)
        } else {
            CliError::postgres(database_url, source)
        }
    }

    /// Reading the stream failed while doing `action`.
    pub fn stream(action: impl Into<String>, source: impl Into<BoxError>) -> CliError {
        CliError::Stream {
            action: action.into(),
            source: source.into(),
        }
    }
}

/// What the command says before the runtime's words: that TLS is what failed.
fn lead(error: &Error) -> &'static str {
    match error {
        Error::Tls { .. } => "TLS failed: ",
        _ => "",
    }
}

/// Where local servers come from, after a server that did not answer.
fn local_servers(error: &Error) -> &'static str {
    match error {
        Error::Unreachable { .. } => " (`scripts/services` starts local ones)",
        _ => "",
    }
}

/// `Result` with the command's error.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
