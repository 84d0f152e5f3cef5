//! Connecting to Postgres, and saying why a connection failed: the server cannot be reached,
//! TLS failed (and which part of it), or the server refused the login; each with its fix.
//!
//! The library ([`Relay::connect`](crate::Relay::connect)) and the `outbox` command connect
//! through [`postgres`], so a failure reads the same in both; [`nats_error`] does the same for
//! NATS.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::error::{Error, Result};
use crate::redact;

/// Connects `options` (a pool's settings) to `database_url`, and on failure says why, without
/// the URL's secrets: [`Error::Unreachable`] (nothing answers), [`Error::Tls`] (the handshake
/// or the certificate check failed, or this build has no TLS), [`Error::Authentication`] (the
/// server refused the user or password), [`Error::Config`] (the URL does not parse, or a
/// certificate file it names cannot be read), or [`Error::Database`] for anything else.
///
/// A refused connection makes sqlx's pool retry until its acquire timeout and then report only
/// the timeout; one direct attempt then gives the reason.
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// use sqlx::postgres::PgPoolOptions;
///
/// let url = "postgres://app@db.internal/billing?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem";
/// let pool = outbox_runtime::connect::postgres(url, PgPoolOptions::new().max_connections(4)).await?;
/// # Ok(()) }
/// ```
pub async fn postgres(database_url: &str, options: PgPoolOptions) -> Result<PgPool> {
    let connect: PgConnectOptions = database_url.parse().map_err(|e: sqlx::Error| {
        Error::Config(format!(
            "the database URL `{}` is not a Postgres URL: {}",
            redact::url(database_url),
            redact::password_in(&e.to_string(), database_url)
        ))
    })?;
    match options.connect_with(connect.clone()).await {
        Ok(pool) => Ok(pool),
        Err(sqlx::Error::PoolTimedOut) => {
            let reason = match tokio::time::timeout(Duration::from_secs(5), connect.connect()).await
            {
                Ok(Err(e)) => e,
                Ok(Ok(_)) | Err(_) => sqlx::Error::PoolTimedOut,
            };
            Err(postgres_error(database_url, reason))
        }
        Err(e) => Err(postgres_error(database_url, e)),
    }
}

/// What a failed attempt to connect to Postgres at `database_url` means (see [`postgres`]).
/// Errors that are not about connecting come back as [`Error::Database`].
pub fn postgres_error(database_url: &str, error: sqlx::Error) -> Error {
    let target = redact::url(database_url);
    let reason = || redact::password_in(&error.to_string(), database_url);
    match &error {
        // rustls reports a certificate it rejects during the handshake as an I/O error
        sqlx::Error::Tls(_) | sqlx::Error::Io(_) if is_tls_failure(&error) => {
            let reason = reason();
            Error::Tls {
                service: "postgres",
                target,
                fix: tls_fix(&reason),
                source: reason.into(),
            }
        }
        sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("28")) => {
            let fix = if db.message().contains("no encryption") {
                "the server accepts this user only over TLS: set sslmode=verify-full (with \
                 sslrootcert=<the server's CA>) or sslmode=require in the URL"
            } else {
                "check the user and password in the URL (or PGPASSWORD, ~/.pgpass) and the \
                 server's pg_hba.conf rule for this user, database and address"
            };
            Error::Authentication {
                service: "postgres",
                target,
                fix: fix.to_owned(),
                source: reason().into(),
            }
        }
        // a certificate or key file named by the URL (or PGSSLROOTCERT, ...) is missing
        sqlx::Error::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            Error::Config(format!(
                "cannot read a TLS file that the database URL {target} names (sslrootcert, \
                 sslcert or sslkey; or PGSSLROOTCERT, PGSSLCERT, PGSSLKEY): {}; give the path of \
                 a readable PEM file",
                reason()
            ))
        }
        sqlx::Error::Configuration(_) => Error::Config(format!(
            "the database URL `{target}` is not usable: {}",
            reason()
        )),
        e if crate::relay::is_connection_error(e) => {
            Error::unreachable("postgres", target, reason())
        }
        _ => Error::Database(error),
    }
}

/// Whether `error` is TLS failing rather than the network: sqlx's TLS errors, and the I/O
/// errors rustls raises when it rejects the server's certificate mid-handshake.
fn is_tls_failure(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(e) => mentions_tls(&e.to_string()),
        _ => false,
    }
}

/// Whether an I/O error's words are about TLS (a certificate rejected mid-handshake).
fn mentions_tls(text: &str) -> bool {
    let text = text.to_lowercase();
    ["certificate", "tls", "ssl"]
        .iter()
        .any(|word| text.contains(word))
}

/// What a failed connection to NATS at `nats_url` means: [`Error::Authentication`] (the server
/// refused the credentials), [`Error::Tls`] (the handshake or the certificate check failed), or
/// [`Error::Unreachable`].
pub fn nats_error(nats_url: &str, error: async_nats::ConnectError) -> Error {
    use async_nats::ConnectErrorKind as Kind;
    let target = redact::url(nats_url);
    let reason = redact::password_in(&error.to_string(), nats_url);
    let kind = match error.kind() {
        Kind::Io if mentions_tls(&reason) => Kind::Tls,
        kind => kind,
    };
    match kind {
        Kind::Authentication | Kind::AuthorizationViolation => Error::Authentication {
            service: "nats",
            target,
            fix: "check the credentials: the URL's user and password or token, the nkey seed or \
                  the .creds file, and the server's accounts"
                .to_owned(),
            source: reason.into(),
        },
        // rustls's rejection of the server's certificate arrives as an I/O error
        Kind::Tls => Error::Tls {
            service: "nats",
            target,
            fix: "check the CA the client trusts (`add_root_certificates`, --nats-tls-ca), the \
                  client certificate if the server wants one, and the server's tls block"
                .to_owned(),
            source: reason.into(),
        },
        _ => Error::unreachable("nats", target, reason),
    }
}

/// The fix for a failed TLS connection to Postgres, from sqlx's words for it.
fn tls_fix(reason: &str) -> String {
    let reason = reason.to_lowercase();
    let fix = if reason.contains("without tls support") {
        "this build has no TLS: enable the `tls-rustls` (default) or `tls-native-tls` feature of \
         outbox-runtime (outbox-cli has the same features)"
    } else if reason.contains("does not support tls") {
        "the server does not offer TLS: turn it on (`ssl = on` with ssl_cert_file and \
         ssl_key_file in postgresql.conf), or use sslmode=prefer or disable on a network you trust"
    } else if reason.contains("notvalidforname")
        || reason.contains("not valid for name")
        || reason.contains("hostname mismatch")
    {
        "certificate verification failed: the server's certificate does not name the host of the \
         URL; connect by a name (or IP address) the certificate lists, or use sslmode=verify-ca, \
         which checks the CA but not the name"
    } else if reason.contains("certificate")
        || reason.contains("unknownissuer")
        || reason.contains("verify failed")
    {
        "certificate verification failed: the server's certificate is not signed by a CA this \
         client trusts; give the CA certificate (PEM) that signed it as `sslrootcert=<file>` in \
         the URL (or PGSSLROOTCERT); sslmode=require encrypts without verifying"
    } else {
        "check sslmode, sslrootcert, sslcert and sslkey in the URL and the server's TLS settings"
    };
    fix.to_owned()
}

#[cfg(test)]
mod tests {
    use super::tls_fix;

    #[test]
    fn each_tls_failure_gets_its_own_fix() {
        for (reason, expected) in [
            (
                "TLS upgrade required by connect options but SQLx was built without TLS support enabled",
                "tls-rustls",
            ),
            ("server does not support TLS", "ssl = on"),
            (
                "invalid peer certificate: NotValidForName",
                "does not name the host",
            ),
            (
                "invalid peer certificate: certificate not valid for name \"127.0.0.1\"",
                "does not name the host",
            ),
            ("invalid peer certificate: UnknownIssuer", "sslrootcert=<file>"),
            (
                "error:0A000086:SSL routines:tls_post_process_server_certificate:certificate verify failed",
                "sslrootcert=<file>",
            ),
            ("handshake eof", "check sslmode"),
        ] {
            assert!(tls_fix(reason).contains(expected), "{reason}: {}", tls_fix(reason));
        }
    }
}
