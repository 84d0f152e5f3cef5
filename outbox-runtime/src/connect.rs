//! Connecting to Postgres and NATS, and saying why a connection failed: the server cannot be
//! reached, TLS failed (and which part of it), or the server refused the login; each with its
//! fix.
//!
//! The library ([`Relay::connect`](crate::Relay::connect),
//! [`Relay::connect_with`](crate::Relay::connect_with)) and the `outbox` command connect
//! through [`postgres`] and [`nats`] (with a [`NatsAuth`] for NATS logins and TLS), so a failure
//! reads the same in both.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::error::{Error, Result};
use crate::redact;

/// The `application_name` of the sessions [`postgres`] opens, unless the URL names one: a DBA
/// finds the relay's and the CLI's sessions in `pg_stat_activity` by it.
pub const APPLICATION_NAME: &str = "outbox";

/// Connects `options` (a pool's settings) to `database_url`, and on failure says why, without
/// the URL's secrets: [`Error::Unreachable`] (nothing answers, or the connection closes
/// before Postgres answers), [`Error::Tls`] (the handshake
/// or the certificate check failed, or this build has no TLS), [`Error::Authentication`] (the
/// server refused the user or password), [`Error::Config`] (the URL does not parse, or a
/// certificate file it names cannot be read), or [`Error::Database`] for anything else.
///
/// A refused connection makes sqlx's pool retry until its acquire timeout and then report only
/// the timeout; one direct attempt then gives the reason.
///
/// The sessions show as `application_name` [`APPLICATION_NAME`] in `pg_stat_activity`, unless
/// the URL names another (`?application_name=billing-relay`).
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
    let mut connect: PgConnectOptions = database_url.parse().map_err(|e: sqlx::Error| {
        Error::Config(format!(
            "the database URL `{}` is not a Postgres URL: {}",
            redact::url(database_url),
            redact::password_in(&e.to_string(), database_url)
        ))
    })?;
    if connect.get_application_name().is_none() {
        connect = connect.application_name(APPLICATION_NAME);
    }
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
        // the Unix socket of a server that is down is missing
        sqlx::Error::Io(e)
            if e.kind() == std::io::ErrorKind::NotFound && connects_by_socket(database_url) =>
        {
            Error::unreachable("postgres", target, reason())
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
        // the server asks for a login this client cannot give (gss, sspi, a SASL mechanism
        // other than SCRAM)
        sqlx::Error::Protocol(text) if text.starts_with("unsupported") => Error::Authentication {
            service: "postgres",
            target,
            fix: "the server's pg_hba.conf asks this user for an authentication method the \
                      client does not support: give the user scram-sha-256, md5, password, \
                      trust or cert there"
                .to_owned(),
            source: reason().into(),
        },
        // the connection closed before Postgres answered, or what answered is not Postgres: a
        // proxy (pgbouncer, a load balancer, a Kubernetes Service) in front of a server that
        // is down, or another service on that port
        sqlx::Error::Protocol(_) => Error::unreachable(
            "postgres",
            target,
            format!(
                "{}: the connection closed before Postgres answered, or what answered does not \
                 speak Postgres's protocol (a proxy in front of a server that is down, or \
                 another service on that port)",
                reason()
            ),
        ),
        e if crate::relay::is_connection_error(e) => {
            Error::unreachable("postgres", target, reason())
        }
        _ => Error::Database(error),
    }
}

/// Whether `database_url` connects through a Unix socket (its host is a directory).
fn connects_by_socket(database_url: &str) -> bool {
    database_url
        .parse::<PgConnectOptions>()
        .is_ok_and(|o| o.get_socket().is_some())
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

/// How to log in to NATS, and the TLS to use: what [`nats`] and
/// [`Relay::connect_with`](crate::Relay::connect_with) add to a connection. It has every login
/// the `outbox` command has (a user and password, a token, an nkey seed, a `.creds` file as an
/// operator issues it) and TLS with a CA of your own and a client certificate; any of them
/// may be combined, as the server's configuration asks. The default adds nothing: the URL's
/// own user and password or token, and TLS only for a `tls://` URL or a server that wants it.
///
/// `Debug` shows what is set, never a password, token or seed.
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// use outbox_runtime::connect::{self, NatsAuth};
/// use outbox_runtime::{Relay, RelayConfig};
///
/// // a user of an operator-mode account, over TLS under the company's CA
/// let auth = NatsAuth::new()
///     .creds_file("/etc/billing/nats.creds")
///     .tls_ca("/etc/billing/nats-ca.pem");
/// let relay = Relay::connect_with(
///     "postgres://billing@db.internal/billing?sslmode=verify-full&sslrootcert=/etc/billing/db-ca.pem",
///     "tls://nats-1.internal:4222,tls://nats-2.internal:4222",
///     &auth,
///     RelayConfig::default(),
/// )
/// .await?;
///
/// // or a client of its own, e.g. for a consumer: user and password, a client certificate
/// let auth = NatsAuth::new()
///     .user_and_password("billing", std::env::var("NATS_PASSWORD").unwrap_or_default())
///     .tls_ca("/etc/billing/nats-ca.pem")
///     .tls_client_cert("/etc/billing/nats-client.pem", "/etc/billing/nats-client-key.pem");
/// let client = connect::nats("nats://nats.internal:4222", &auth, async_nats::ConnectOptions::new()).await?;
/// let js = async_nats::jetstream::new(client);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct NatsAuth {
    user_password: Option<(String, String)>,
    token: Option<String>,
    nkey_seed: Option<String>,
    creds_file: Option<PathBuf>,
    tls_required: bool,
    tls_ca: Option<PathBuf>,
    tls_client_cert: Option<(PathBuf, PathBuf)>,
}

impl NatsAuth {
    /// No login and no TLS settings beyond the URL's.
    pub fn new() -> NatsAuth {
        NatsAuth::default()
    }

    /// Log in with a user name and password.
    pub fn user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.user_password = Some((user.into(), password.into()));
        self
    }

    /// Log in with an authentication token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Log in with an nkey: the user's seed (`SU...`).
    pub fn nkey(mut self, seed: impl Into<String>) -> Self {
        self.nkey_seed = Some(seed.into());
        self
    }

    /// Log in with a `.creds` file (a user JWT and its nkey seed, as an operator issues it),
    /// read when connecting.
    pub fn creds_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.creds_file = Some(path.into());
        self
    }

    /// Use TLS even when the URL is `nats://`.
    pub fn require_tls(mut self, required: bool) -> Self {
        self.tls_required = required;
        self
    }

    /// Verify the server against this CA certificate (PEM) too, beside the system's roots.
    pub fn tls_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(path.into());
        self
    }

    /// Present this client certificate and key (PEM) to a server that asks for one.
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_client_cert = Some((cert.into(), key.into()));
        self
    }

    /// `options` with this login and TLS added; a `.creds` file that cannot be read is an
    /// [`Error::Config`] naming it.
    async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions> {
        if let Some(path) = &self.creds_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| creds_error(path, e))?;
        }
        if let Some(seed) = &self.nkey_seed {
            options = options.nkey(seed.clone());
        }
        if let Some((user, password)) = &self.user_password {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if self.tls_required {
            options = options.require_tls(true);
        }
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls_client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options)
    }
}

impl fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = |set: bool| if set { Some("***") } else { None };
        f.debug_struct("NatsAuth")
            .field("user", &self.user_password.as_ref().map(|(user, _)| user))
            .field("password", &secret(self.user_password.is_some()))
            .field("token", &secret(self.token.is_some()))
            .field("nkey", &secret(self.nkey_seed.is_some()))
            .field("creds_file", &self.creds_file)
            .field("tls_required", &self.tls_required)
            .field("tls_ca", &self.tls_ca)
            .field("tls_client_cert", &self.tls_client_cert)
            .finish()
    }
}

/// A `.creds` file that cannot be read or is not one.
fn creds_error(path: &Path, error: std::io::Error) -> Error {
    Error::Config(format!(
        "cannot read NATS credentials file {}: {error}; give a .creds file as the account's \
         operator issues it (a user JWT and its nkey seed)",
        path.display()
    ))
}

/// Connects to the NATS server(s) at `nats_url` (a comma-separated list for a cluster's
/// servers) with `options` (name, timeouts, ...) and `auth`'s login and TLS added; a failure
/// says why, without the URL's secrets, as [`nats_error`] classifies it, or is an
/// [`Error::Config`] for a `.creds` file that cannot be read. See [`NatsAuth`] for an example.
pub async fn nats(
    nats_url: &str,
    auth: &NatsAuth,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client> {
    let options = auth.apply(options).await?;
    let urls: Vec<&str> = nats_url.split(',').map(str::trim).collect();
    options
        .connect(urls.as_slice())
        .await
        .map_err(|e| nats_error(nats_url, e))
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
            fix: "the server refused the credentials given (the URL's user and password or \
                  token, or the `NatsAuth`'s: the `outbox` command's --nats-user and \
                  --nats-password, --nats-token, --nats-nkey, --nats-creds or their NATS_* \
                  variables); check them and the server's accounts"
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
        Kind::ServerParse => Error::Config(format!(
            "the NATS URL `{target}` is not usable: {reason}; give nats://, tls://, ws:// or \
             wss:// addresses with a port from 1 to 65535, comma separated"
        )),
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
    use super::{nats, tls_fix, NatsAuth};
    use crate::Error;

    #[test]
    fn nats_auth_debug_shows_what_is_set_and_no_secret() {
        let auth = NatsAuth::new()
            .user_and_password("billing", "pw-s3cret")
            .token("tok-s3cret")
            .nkey("SU-s3cret")
            .tls_ca("/etc/ca.pem");
        let shown = format!("{auth:?}");
        for secret in ["pw-s3cret", "tok-s3cret", "SU-s3cret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains("\"billing\"") && shown.contains("/etc/ca.pem"),
            "{shown}"
        );
        assert!(format!("{:?}", NatsAuth::new()).contains("token: None"));
    }

    #[tokio::test]
    async fn a_creds_file_that_cannot_be_read_is_named_before_connecting() {
        let auth = NatsAuth::new().creds_file("/nonexistent/outbox.creds");
        // nothing listens on port 1: the file is read before any connection is tried
        let err = nats(
            "nats://127.0.0.1:1",
            &auth,
            async_nats::ConnectOptions::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("cannot read NATS credentials file /nonexistent/outbox.creds"),
            "{err}"
        );
    }

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
