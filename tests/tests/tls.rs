//! TLS to Postgres: a private Postgres (`ssl = on`, a server certificate signed by a CA made in
//! the test) that accepts only TLS connections; `sslmode=verify-full` with that CA connects
//! and the relay starts, a wrong CA or a wrong host name fails naming certificate verification
//! and the fix, a wrong password names the login, and a server without TLS names that; a
//! private nats-server with TLS under a CA the client does not trust makes `Relay::connect`
//! fail with `Error::Tls` for NATS, and with the CA and a token in a `NatsAuth`
//! `Relay::connect_with` gets in. Every server here is the test's own, stopped by its pid
//! when the test ends.

use std::time::Duration;

use outbox_runtime::connect::{self, NatsAuth};
use outbox_runtime::{Error, Relay, RelayConfig};
use outbox_testkit::{
    database_url, nats_url, NatsServer, PgServer, PgServerConfig, TestCa, TestDb,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// A private Postgres with TLS on, accepting only TLS connections from 127.0.0.1: `root`
/// without a password, `app` with the password `app-s3cret`.
struct TlsPostgres {
    server: PgServer,
    ca: TestCa,
}

const APP_PASSWORD: &str = "app-s3cret";

impl TlsPostgres {
    async fn start(names: &[&str]) -> TlsPostgres {
        let ca = TestCa::new();
        let issued = ca.issue(names);
        let server = PgServer::spawn_config(PgServerConfig {
            tls: Some(issued),
            hba: Some(
                "hostssl all root 127.0.0.1/32 trust\n\
                 hostssl all app 127.0.0.1/32 scram-sha-256\n"
                    .to_owned(),
            ),
            ..PgServerConfig::default()
        });
        let tls = TlsPostgres { server, ca };
        // verify-ca: some tests give the server a certificate for another name
        let pool = tls.pool(&tls.url("verify-ca")).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "create role app login password '{APP_PASSWORD}'"
        )))
        .execute(&pool)
        .await
        .expect("create the role app");
        outbox_runtime::migrate(&pool)
            .await
            .expect("the outbox migrations over TLS");
        tls
    }

    /// `root`'s URL with `sslmode` and the test CA as `sslrootcert`.
    fn url(&self, sslmode: &str) -> String {
        self.url_with(sslmode, &self.ca.cert().display().to_string())
    }

    fn url_with(&self, sslmode: &str, root_cert: &str) -> String {
        format!(
            "postgres://root@127.0.0.1:{}/postgres?sslmode={sslmode}&sslrootcert={root_cert}",
            self.server.port
        )
    }

    async fn pool(&self, url: &str) -> PgPool {
        connect::postgres(url, PgPoolOptions::new().max_connections(2))
            .await
            .unwrap_or_else(|e| panic!("connect over TLS: {e}"))
    }
}

async fn is_encrypted(pool: &PgPool) -> bool {
    sqlx::query_scalar("select ssl from pg_stat_ssl where pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("read pg_stat_ssl")
}

#[tokio::test]
async fn verify_full_with_the_servers_ca_connects_encrypted_and_the_relay_starts() {
    let pg = TlsPostgres::start(&["127.0.0.1", "localhost"]).await;
    for url in [
        pg.url("verify-full"),
        pg.url("verify-ca"),
        // the certificate names localhost too
        pg.url("verify-full").replace("127.0.0.1", "localhost"),
        // with TLS built in, `prefer` negotiates it
        pg.url("prefer"),
    ] {
        let pool = pg.pool(&url).await;
        assert!(is_encrypted(&pool).await, "{url} is encrypted");
        pool.close().await;
    }
    let relay = Relay::connect(&pg.url("verify-full"), &nats_url(), RelayConfig::default())
        .await
        .unwrap_or_else(|e| panic!("the relay connects over verify-full: {e}"));
    drop(relay);
}

#[tokio::test]
async fn a_wrong_ca_fails_naming_certificate_verification_and_the_fix() {
    let pg = TlsPostgres::start(&["127.0.0.1"]).await;
    let other = TestCa::new();
    let url = pg.url_with("verify-full", &other.cert().display().to_string());
    for err in [
        connect::postgres(&url, PgPoolOptions::new().max_connections(1))
            .await
            .unwrap_err(),
        Relay::connect(&url, &nats_url(), RelayConfig::default())
            .await
            .unwrap_err(),
    ] {
        let message = err.to_string();
        assert!(
            matches!(
                &err,
                Error::Tls {
                    service: "postgres",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            message.contains("TLS") && message.contains("certificate verification failed"),
            "names TLS and the certificate check: {message}"
        );
        assert!(message.contains("sslrootcert="), "names the fix: {message}");
        assert!(!message.contains("is it running"), "{message}");
    }

    let missing = pg.url_with("verify-full", "/nonexistent/ca.pem");
    let err = connect::postgres(&missing, PgPoolOptions::new().max_connections(1))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        message.contains("sslrootcert") && message.contains("No such file"),
        "names the file parameter and the cause: {message}"
    );
}

#[tokio::test]
async fn a_certificate_for_another_host_fails_verify_full_and_passes_verify_ca() {
    let pg = TlsPostgres::start(&["db.example.internal"]).await;
    let err = connect::postgres(
        &pg.url("verify-full"),
        PgPoolOptions::new().max_connections(1),
    )
    .await
    .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        message.contains("does not name the host") && message.contains("verify-ca"),
        "{message}"
    );
    let pool = pg.pool(&pg.url("verify-ca")).await;
    assert!(is_encrypted(&pool).await);
}

#[tokio::test]
async fn a_wrong_password_names_the_login_not_the_network() {
    let pg = TlsPostgres::start(&["127.0.0.1"]).await;
    let url = format!(
        "postgres://app:not-the-password@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.server.port,
        pg.ca.cert().display()
    );
    let err = connect::postgres(&url, PgPoolOptions::new().max_connections(1))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(&err, Error::Authentication { service: "postgres", target, .. } if target.contains("app:***@")),
        "{err:?}"
    );
    assert!(
        message.contains("refused the login") && message.contains("password"),
        "{message}"
    );
    assert!(!message.contains("not-the-password"), "{message}");

    let right = url.replace("not-the-password", APP_PASSWORD);
    let pool = pg.pool(&right).await;
    assert!(is_encrypted(&pool).await);
}

#[tokio::test]
async fn a_connection_without_tls_is_refused_with_the_sslmode_to_use() {
    let pg = TlsPostgres::start(&["127.0.0.1"]).await;
    let url = format!(
        "postgres://root@127.0.0.1:{}/postgres?sslmode=disable",
        pg.server.port
    );
    let err = connect::postgres(&url, PgPoolOptions::new().max_connections(1))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Authentication { .. }), "{err:?}");
    assert!(message.contains("sslmode=verify-full"), "{message}");
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_says_so() {
    let pg = PgServer::spawn();
    let url = format!(
        "postgres://root@127.0.0.1:{}/postgres?sslmode=require",
        pg.port
    );
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        connect::postgres(&url, PgPoolOptions::new().max_connections(1)),
    )
    .await
    .expect("an answer within 30 s")
    .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        message.contains("does not support TLS") && message.contains("ssl = on"),
        "{message}"
    );
}

#[tokio::test]
async fn the_relay_names_a_nats_tls_failure_and_its_fix() {
    // a private nats-server with TLS whose CA the client does not trust
    let ca = TestCa::new();
    let issued = ca.issue(&["127.0.0.1"]);
    let (cert, key) = (
        issued.cert.display().to_string(),
        issued.key.display().to_string(),
    );
    let server = NatsServer::spawn_with(&["--tls", "--tlscert", &cert, "--tlskey", &key]).await;
    let url = format!("tls://127.0.0.1:{}", server.port());
    let err = Relay::connect(&database_url(), &url, RelayConfig::default())
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(
            &err,
            Error::Tls {
                service: "nats",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        message.starts_with("TLS to nats at") && message.contains("CA"),
        "{message}"
    );
}

#[tokio::test]
async fn the_relay_connects_with_a_nats_auth_and_a_refused_login_names_nats() {
    // a private nats-server with TLS under the test's CA that wants a token
    const TOKEN: &str = "relay-token-3c1e";
    let ca = TestCa::new();
    let issued = ca.issue(&["127.0.0.1"]);
    let (cert, key) = (
        issued.cert.display().to_string(),
        issued.key.display().to_string(),
    );
    let server = NatsServer::spawn_with(&[
        "--tls",
        "--tlscert",
        &cert,
        "--tlskey",
        &key,
        "--auth",
        TOKEN,
    ])
    .await;
    let url = format!("tls://127.0.0.1:{}", server.port());
    let trusted = NatsAuth::new().tls_ca(ca.cert());
    let db = TestDb::new().await;

    let relay = Relay::connect_with(
        &db.url(),
        &url,
        &trusted.clone().token(TOKEN),
        RelayConfig::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("the relay connects with the CA and the token: {e}"));
    drop(relay);

    let err = Relay::connect_with(
        &db.url(),
        &url,
        &trusted.token("not-the-token"),
        RelayConfig::default(),
    )
    .await
    .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(
            &err,
            Error::Authentication {
                service: "nats",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        message.contains("the server refused the credentials")
            && !message.contains("not-the-token"),
        "{message}"
    );
}
