//! Connecting to Postgres and NATS for real deployments, without ever printing a secret.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use outbox_runtime::redact;

use crate::{CliError, Result};

/// Postgres connection (TLS through the URL's `sslmode`, e.g. `?sslmode=verify-full&sslrootcert=ca.pem`).
#[derive(Debug, Args)]
pub struct DbArgs {
    /// Postgres URL of the service's database.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://root@127.0.0.1/test",
        hide_env_values = true
    )]
    pub database_url: String,
}

/// NATS connection and credentials. Every secret may come from the environment.
#[derive(Debug, Args)]
pub struct NatsArgs {
    /// NATS server URL(s), comma separated.
    #[arg(
        long,
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        hide_env_values = true
    )]
    pub nats_url: String,
    /// A `.creds` file (JWT and nkey seed), as issued by an operator.
    #[arg(long, env = "NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// An nkey seed (`SU...`).
    #[arg(long, env = "NATS_NKEY", hide_env_values = true)]
    pub nats_nkey: Option<String>,
    /// User name (with --nats-password).
    #[arg(long, env = "NATS_USER", requires = "nats_password")]
    pub nats_user: Option<String>,
    /// Password (with --nats-user).
    #[arg(
        long,
        env = "NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    pub nats_password: Option<String>,
    /// An authentication token.
    #[arg(long, env = "NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// Require TLS even when the URL is `nats://`.
    #[arg(long, env = "NATS_TLS_REQUIRED")]
    pub nats_tls_required: bool,
    /// CA certificate (PEM) to verify the server.
    #[arg(long, env = "NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), with --nats-tls-key.
    #[arg(long, env = "NATS_TLS_CERT", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// Client key (PEM), with --nats-tls-cert.
    #[arg(long, env = "NATS_TLS_KEY", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
}

/// Connects a small pool; errors name the redacted URL, the cause (unreachable, TLS, the
/// login) and its fix.
pub async fn pool(args: &DbArgs, max: u32) -> Result<PgPool> {
    let options = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5));
    outbox_runtime::connect::postgres(&args.database_url, options)
        .await
        .map_err(|e| {
            let url = redact::url(&args.database_url);
            CliError::msg(match e {
                outbox_runtime::Error::Unreachable { source, .. } => format!(
                    "cannot connect to Postgres at {url}: {source}; is it running, and is the \
                     address right? (`scripts/services` starts a local one)"
                ),
                outbox_runtime::Error::Tls { source, fix, .. } => {
                    format!("cannot connect to Postgres at {url}: TLS failed: {source}; {fix}")
                }
                outbox_runtime::Error::Authentication { source, fix, .. } => format!(
                    "cannot connect to Postgres at {url}: the server refused the login: {source}; {fix}"
                ),
                outbox_runtime::Error::Config(problem) => {
                    format!("cannot connect to Postgres: {problem}")
                }
                other => format!("cannot connect to Postgres at {url}: {other}"),
            })
        })
}

/// Connects to NATS with the given credentials and returns a JetStream context.
pub async fn jetstream(args: &NatsArgs) -> Result<async_nats::jetstream::Context> {
    let mut options = async_nats::ConnectOptions::new()
        .name("outbox")
        .connection_timeout(Duration::from_secs(5));
    if let Some(path) = &args.nats_creds {
        options = options.credentials_file(path).await.map_err(|e| {
            CliError::msg(format!(
                "cannot read NATS credentials file {}: {e}",
                path.display()
            ))
        })?;
    }
    if let Some(seed) = &args.nats_nkey {
        options = options.nkey(seed.clone());
    }
    if let (Some(user), Some(password)) = (&args.nats_user, &args.nats_password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &args.nats_token {
        options = options.token(token.clone());
    }
    if args.nats_tls_required {
        options = options.require_tls(true);
    }
    if let Some(ca) = &args.nats_tls_ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&args.nats_tls_cert, &args.nats_tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    // a cluster is given as a comma-separated list of its servers' URLs
    let urls: Vec<&str> = args.nats_url.split(',').map(str::trim).collect();
    let client = options.connect(urls.as_slice()).await.map_err(|e| {
        // the library's classification (a rejected certificate arrives as an I/O error), with
        // the command's flags as the fix
        let (reason, hint) = match outbox_runtime::connect::nats_error(&args.nats_url, e) {
            outbox_runtime::Error::Authentication { source, .. } => (
                source.to_string(),
                "the server refused the credentials; check --nats-user/--nats-password, \
                 --nats-token, --nats-nkey or --nats-creds (or their NATS_* variables)",
            ),
            outbox_runtime::Error::Tls { source, .. } => (
                format!("TLS failed: {source}"),
                "check --nats-tls-ca (the CA that signed the server's certificate), \
                 --nats-tls-cert/--nats-tls-key and the server's TLS settings",
            ),
            other => (
                match other {
                    outbox_runtime::Error::Unreachable { source, .. } => source.to_string(),
                    other => other.to_string(),
                },
                "is nats-server running with JetStream? (`scripts/services` starts a local one)",
            ),
        };
        CliError::msg(format!(
            "cannot connect to NATS at {}: {reason}; {hint}",
            redact::url(&args.nats_url)
        ))
    })?;
    Ok(async_nats::jetstream::new(client))
}
