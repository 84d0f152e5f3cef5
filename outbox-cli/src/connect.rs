//! The connection flags, mapped to the runtime's ways of connecting ([`connect::postgres`],
//! [`connect::nats`] and its [`NatsAuth`]), which say why a connection failed.

use std::time::Duration;

use outbox_runtime::connect::{self, NatsAuth};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::args::{DbArgs, NatsArgs};
use crate::error::{CliError, Result};

/// How long a command waits for a server before it says it cannot connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of at most `max` connections to the database of `args`.
pub async fn pool(args: &DbArgs, max: u32) -> Result<PgPool> {
    let options = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(CONNECT_TIMEOUT);
    connect::postgres(&args.database_url, options)
        .await
        .map_err(|e| CliError::postgres(&args.database_url, e))
}

/// A JetStream context on the NATS server(s) of `args`, logged in as they say.
pub async fn jetstream(args: &NatsArgs) -> Result<async_nats::jetstream::Context> {
    let options = async_nats::ConnectOptions::new()
        .name("outbox")
        .connection_timeout(CONNECT_TIMEOUT);
    let client = connect::nats(&args.nats_url, &nats_auth(args), options)
        .await
        .map_err(|e| CliError::nats(&args.nats_url, e))?;
    Ok(async_nats::jetstream::new(client))
}

/// The login and TLS the flags (or their `NATS_*` variables) give.
pub fn nats_auth(args: &NatsArgs) -> NatsAuth {
    let mut auth = NatsAuth::new().require_tls(args.nats_tls_required);
    if let Some(path) = &args.nats_creds {
        auth = auth.creds_file(path);
    }
    if let Some(seed) = &args.nats_nkey {
        auth = auth.nkey(seed);
    }
    if let (Some(user), Some(password)) = (&args.nats_user, &args.nats_password) {
        auth = auth.user_and_password(user, password);
    }
    if let Some(token) = &args.nats_token {
        auth = auth.token(token);
    }
    if let Some(ca) = &args.nats_tls_ca {
        auth = auth.tls_ca(ca);
    }
    if let (Some(cert), Some(key)) = (&args.nats_tls_cert, &args.nats_tls_key) {
        auth = auth.tls_client_cert(cert, key);
    }
    auth
}
