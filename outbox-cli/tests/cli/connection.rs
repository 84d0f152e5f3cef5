//! Connecting: a server that does not answer, TLS to a private nats-server under a CA given
//! with --nats-tls-ca, and NATS user, nkey, token and `.creds` logins (the last against an
//! operator-mode server with JWTs the test signs); each failure names its cause, never a
//! secret.

use outbox_testkit::{eventually, free_port, NatsServer, RefusedPort, TestCa, TestDb};

use crate::support::{
    assert_no_secret, db_url, finish, outbox, relay_args, run, Output, Running, DB_PASSWORD,
    NATS_PASSWORD, PATIENCE,
};

#[tokio::test]
async fn unreachable_services_are_named_with_the_redacted_url_and_the_fix() {
    // held to the end of the loop: no other test's listener can take the port meanwhile
    let refused = RefusedPort::bind();
    let port = refused.port();
    let url = format!("postgres://app:{DB_PASSWORD}@127.0.0.1:{port}/billing");
    for command in ["status", "migrate", "unblock --all", "prune"] {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.extend(["--database-url", &url]);
        let out = run(&args).await;
        out.expect_code(2).assert_clean();
        assert!(
            out.stderr.contains(&format!(
                "cannot connect to Postgres at postgres://app:***@127.0.0.1:{port}/billing"
            )) && out.stderr.contains("scripts/services"),
            "`outbox {command}` names the redacted URL and the fix:\n{}",
            out.stderr
        );
        assert!(
            out.stderr.contains("refused"),
            "`outbox {command}` says why it cannot connect:\n{}",
            out.stderr
        );
    }
    drop(refused);

    // The relay: Postgres reachable, NATS not; the NATS password may also come from the
    // environment. A relay waits for a server that does not answer (it may be starting, or
    // down for a while): it warns at each attempt, naming the redacted URL, and SIGTERM ends
    // the wait.
    let db = TestDb::new().await;
    let nats_port = free_port();
    let mut relay = Running::spawn(relay_args(
        &db_url(&db),
        &format!("nats://outbox:{NATS_PASSWORD}@127.0.0.1:{nats_port}"),
        &[],
    ));
    let warning = format!("cannot connect to NATS at nats://outbox:***@127.0.0.1:{nats_port}");
    eventually(PATIENCE, "two failed start attempts", || {
        std::future::ready(relay.stderr().matches(&warning).count() >= 2)
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    let stderr = relay.stderr();
    assert_no_secret(&stderr);
    assert!(
        stderr.contains("scripts/services") && stderr.contains("retry_in"),
        "each attempt says what to check and when the next one is:\n{stderr}"
    );
    assert!(
        stderr.contains("stopped before the relay started"),
        "{stderr}"
    );
    // a URL that cannot work is not waited for
    let out = run(relay_args(&db_url(&db), "nats://127.0.0.1:99999", &[])).await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr
            .contains("the NATS URL `nats://127.0.0.1:99999` is not usable"),
        "{}",
        out.stderr
    );
    let mut cmd = outbox();
    cmd.args([
        "tail",
        "--nats-url",
        &format!("nats://127.0.0.1:{nats_port}"),
        "a.b.c",
    ])
    .env("NATS_USER", "outbox")
    .env("NATS_PASSWORD", NATS_PASSWORD);
    let out = finish(cmd).await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("cannot connect to NATS"),
        "{}",
        out.stderr
    );
}

/// The secrets of the authentication test, each distinct so a leak names itself.
const AUTH_PASSWORD: &str = "auth-pw-77d1";
const AUTH_TOKEN: &str = "auth-token-5e90";

/// `outbox stream ensure` against `server`, with `env` set and `args` added.
async fn ensure_on(server: &NatsServer, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = outbox();
    cmd.args([
        "stream",
        "ensure",
        "--nats-url",
        &server.url(),
        "--name",
        "AUTHCHECK",
        "--event-type",
        "authcheck.>",
        "--memory",
    ]);
    cmd.args(args);
    cmd.envs(env.iter().copied());
    finish(cmd).await
}

fn assert_no_auth_secret(out: &Output, seed: &str) {
    for text in [&out.stdout, &out.stderr] {
        for secret in [AUTH_PASSWORD, AUTH_TOKEN, seed] {
            assert!(!text.contains(secret), "a secret was printed:\n{text}");
        }
    }
}

/// `outbox stream ensure` against a private nats-server with TLS (a certificate from a CA made
/// here): the CA given with --nats-tls-ca verifies the server; another CA fails, naming TLS and

#[tokio::test]
async fn nats_tls_verifies_the_server_against_the_given_ca() {
    let ca = TestCa::new();
    let issued = ca.issue(&["127.0.0.1", "localhost"]);
    let (cert, key) = (
        issued.cert.display().to_string(),
        issued.key.display().to_string(),
    );
    let server = NatsServer::spawn_with(&["--tls", "--tlscert", &cert, "--tlskey", &key]).await;

    let trusted = ca.cert().display().to_string();
    let ok = ensure_on(&server, &[], &["--nats-tls-ca", &trusted]).await;
    ok.expect_code(0);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    let other = TestCa::new();
    let untrusted = other.cert().display().to_string();
    let refused = ensure_on(&server, &[], &["--nats-tls-ca", &untrusted]).await;
    refused.expect_code(2);
    assert!(
        refused.stderr.contains("cannot connect to NATS at")
            && refused.stderr.contains("--nats-tls-ca")
            && !refused.stderr.contains("is nats-server running"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn nats_user_password_nkey_and_token_authenticate_and_a_refusal_is_clear() {
    // a private server that accepts a user/password pair and an nkey user
    let nkey = nkeys::KeyPair::new_user();
    let seed = nkey.seed().expect("the nkey seed");
    let dir = tempfile::tempdir().expect("a config dir");
    let config = dir.path().join("auth.conf");
    std::fs::write(
        &config,
        format!(
            "authorization {{ users = [ {{ user: outbox, password: \"{AUTH_PASSWORD}\" }}, {{ nkey: \"{}\" }} ] }}\n",
            nkey.public_key()
        ),
    )
    .expect("write the server config");
    let server = NatsServer::spawn_with(&["-c", config.to_str().expect("utf-8 path")]).await;

    let ok = ensure_on(
        &server,
        &[("NATS_USER", "outbox"), ("NATS_PASSWORD", AUTH_PASSWORD)],
        &[],
    )
    .await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &seed);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    let ok = ensure_on(&server, &[], &["--nats-nkey", &seed]).await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &seed);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    for (what, env, args) in [
        (
            "a wrong password",
            vec![
                ("NATS_USER", "outbox"),
                ("NATS_PASSWORD", "not-the-password"),
            ],
            vec![],
        ),
        ("no credentials", vec![], vec![]),
        (
            "an nkey the server does not know",
            vec![],
            vec![
                "--nats-nkey".to_owned(),
                nkeys::KeyPair::new_user().seed().unwrap(),
            ],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let refused = ensure_on(&server, &env, &args).await;
        refused.expect_code(2);
        assert_no_auth_secret(&refused, &seed);
        assert!(
            !refused.stderr.contains("not-the-password"),
            "{what}: the password was printed:\n{}",
            refused.stderr
        );
        assert!(
            refused.stderr.contains("cannot connect to NATS at")
                && refused.stderr.contains("authorization violation")
                && refused
                    .stderr
                    .contains("the server refused the credentials"),
            "{what}: the error says the server refused the credentials:\n{}",
            refused.stderr
        );
    }
    drop(server);

    // a private server that wants a token
    let server = NatsServer::spawn_with(&["--auth", AUTH_TOKEN]).await;
    let ok = ensure_on(&server, &[("NATS_TOKEN", AUTH_TOKEN)], &[]).await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &seed);
    let refused = ensure_on(&server, &[("NATS_TOKEN", "wrong-token")], &[]).await;
    refused.expect_code(2);
    assert_no_auth_secret(&refused, &seed);
    assert!(
        refused
            .stderr
            .contains("the server refused the credentials"),
        "{}",
        refused.stderr
    );
    assert!(
        !refused.stderr.contains("wrong-token"),
        "the token was printed:\n{}",
        refused.stderr
    );
}

/// A NATS JWT (`ed25519-nkey`) with `claims`, issued and signed by `issuer`.
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": chrono::Utc::now().timestamp(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = issuer.sign(signed.as_bytes()).expect("sign the JWT");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// An operator-mode server (an operator, one account with JetStream, its JWTs preloaded) and a
/// `.creds` file for a user of that account, and another for a user of an account the server
/// does not know.
struct CredsServer {
    server: NatsServer,
    creds: std::path::PathBuf,
    foreign_creds: std::path::PathBuf,
    user_seed: String,
    dir: tempfile::TempDir,
}

fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

async fn creds_server() -> CredsServer {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let system = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
    });
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "outbox-test-operator",
        serde_json::json!({
            "system_account": system.public_key(), "type": "operator", "version": 2
        }),
    );
    let system_jwt = nats_jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({ "type": "account", "version": 2 }),
    );
    let account_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        "outbox-test-account",
        serde_json::json!({ "limits": unlimited, "type": "account", "version": 2 }),
    );
    let user_claims = serde_json::json!({
        "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
        "type": "user", "version": 2
    });
    let user_jwt = nats_jwt(&account, &user.public_key(), "outbox", user_claims.clone());
    let stranger = nkeys::KeyPair::new_account();
    let foreign_user = nkeys::KeyPair::new_user();
    let foreign_jwt = nats_jwt(
        &stranger,
        &foreign_user.public_key(),
        "stranger",
        user_claims,
    );

    let dir = tempfile::tempdir().expect("a config dir");
    let config = dir.path().join("operator.conf");
    std::fs::write(
        &config,
        format!(
            "operator: \"{operator_jwt}\"\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {}: \"{account_jwt}\"\n  {}: \"{system_jwt}\"\n}}\n",
            system.public_key(),
            account.public_key(),
            system.public_key()
        ),
    )
    .expect("write the server config");
    let user_seed = user.seed().expect("the user seed");
    let creds = dir.path().join("outbox.creds");
    std::fs::write(&creds, creds_file(&user_jwt, &user_seed)).expect("write the creds");
    let foreign_creds = dir.path().join("stranger.creds");
    std::fs::write(
        &foreign_creds,
        creds_file(&foreign_jwt, &foreign_user.seed().expect("a seed")),
    )
    .expect("write the creds");
    let server = NatsServer::spawn_with(&["-c", config.to_str().expect("utf-8 path")]).await;
    CredsServer {
        server,
        creds,
        foreign_creds,
        user_seed,
        dir,
    }
}

/// `.creds` authentication, as an operator issues it (a user JWT and its nkey seed): the
/// account's user gets in and JetStream works; a user of an account the server does not know
/// is refused, clearly; a file that is not a creds file names the file; the seed is never
/// printed.
#[tokio::test]
async fn a_creds_file_authenticates_and_a_refusal_is_clear() {
    let s = creds_server().await;
    let creds = s.creds.display().to_string();
    let ok = ensure_on(&s.server, &[], &["--nats-creds", &creds]).await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &s.user_seed);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    let foreign = s.foreign_creds.display().to_string();
    let refused = ensure_on(&s.server, &[], &["--nats-creds", &foreign]).await;
    refused.expect_code(2);
    assert_no_auth_secret(&refused, &s.user_seed);
    assert!(
        refused.stderr.contains("cannot connect to NATS at")
            && refused.stderr.contains("authorization violation")
            && refused
                .stderr
                .contains("the server refused the credentials"),
        "a user of an unknown account is refused, and the error says so:\n{}",
        refused.stderr
    );

    let none = ensure_on(&s.server, &[], &[]).await;
    none.expect_code(2);
    assert!(
        none.stderr.contains("the server refused the credentials"),
        "{}",
        none.stderr
    );

    let not_creds = s.dir.path().join("operator.conf").display().to_string();
    let unreadable = ensure_on(&s.server, &[], &["--nats-creds", &not_creds]).await;
    unreadable.expect_code(2);
    assert!(
        unreadable
            .stderr
            .contains(&format!("cannot read NATS credentials file {not_creds}")),
        "{}",
        unreadable.stderr
    );
}
