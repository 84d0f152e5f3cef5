//! The connection flags every command that reaches Postgres or NATS shares.

use std::path::PathBuf;

use clap::Args;

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
