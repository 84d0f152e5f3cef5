//! `outbox stream ensure`: create, accept, refuse a different stream; a replicated stream on
//! a cluster, and an unsafe one refused.

use std::time::Duration;

use outbox_testkit::suite::Ctx;

use crate::support::{nats_url, run, Output};

/// `outbox stream ensure --event-type <captures>` (or the deprecated `--subject`) for the
/// test's stream, in memory, with a duplicate window of `window` seconds.
async fn ensure(ctx: &Ctx, flag: &str, window: &str) -> Output {
    let captures = format!("{}.>", ctx.prefix);
    let stream = ctx.stream_name();
    run([
        "stream",
        "ensure",
        "--nats-url",
        &nats_url(),
        "--name",
        &stream,
        flag,
        &captures,
        "--memory",
        "--duplicate-window",
        window,
    ])
    .await
}

#[tokio::test]
async fn stream_ensure_creates_accepts_and_refuses_a_different_stream() {
    let ctx = Ctx::new().await;
    let stream = ctx.stream_name();
    let captures = format!("{}.>", ctx.prefix);

    // `stream ensure` creates the stream, accepts it unchanged, and refuses a different one.
    for round in ["creates", "accepts"] {
        let out = ensure(&ctx, "--event-type", "600").await;
        out.expect_code(0).assert_clean();
        assert_eq!(
            out.stdout.trim(),
            format!("stream {stream} ok: subjects {captures}, duplicate window 600s, 1 replica(s), 0 message(s)"),
            "`stream ensure` {round} the stream"
        );
        assert!(
            out.stderr.contains("has one replica") && out.stderr.contains("sync_interval"),
            "a single replica is warned about:\n{}",
            out.stderr
        );
        assert!(!out.stderr.contains("deprecated"), "{}", out.stderr);
    }
    let info = ctx.ensure_stream().await;
    assert_eq!(info.config.subjects, std::slice::from_ref(&captures));
    let out = ensure(&ctx, "--event-type", "60").await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains(&stream) && out.stderr.contains("differs"),
        "a mismatching stream is named and refused:\n{}",
        out.stderr
    );
    ctx.delete_stream().await;
}

/// `--subject`, the old name of `--event-type`, still works for one release, with a warning.
#[tokio::test]
async fn stream_ensure_takes_the_deprecated_subject_flag_with_a_warning() {
    let ctx = Ctx::new().await;
    let out = ensure(&ctx, "--subject", "600").await;
    out.expect_code(0).assert_clean();
    assert!(
        out.stdout.starts_with(&format!(
            "stream {} ok: subjects {}.>,",
            ctx.stream_name(),
            ctx.prefix
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains(
            "warning: --subject is deprecated and goes in the next release; use --event-type"
        ),
        "{}",
        out.stderr
    );
    // neither name: a usage error naming the new one
    let out = run(["stream", "ensure", "--nats-url", &nats_url()]).await;
    out.expect_code(2);
    assert!(out.stderr.contains("--event-type"), "{}", out.stderr);
    ctx.delete_stream().await;
}

#[tokio::test]
async fn stream_ensure_creates_a_replicated_stream_on_a_cluster_and_refuses_an_unsafe_one() {
    let cluster = outbox_testkit::NatsCluster::spawn(3).await;
    let urls = cluster.urls();
    let ensure = |name: &'static str, subject: &'static str| {
        run([
            "stream",
            "ensure",
            "--nats-url",
            urls.as_str(),
            "--name",
            name,
            "--event-type",
            subject,
            "--replicas",
            "3",
        ])
    };
    // the first meta leader may take a moment to be elected
    let mut out = ensure("CLUSTERED", "clustered.>").await;
    for _ in 0..50 {
        if out.code == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        out = ensure("CLUSTERED", "clustered.>").await;
    }
    out.expect_code(0).assert_clean();
    assert!(
        out.stdout.contains("stream CLUSTERED ok") && out.stdout.contains("3 replica(s)"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stderr.contains("one replica"),
        "no warning for R3: {}",
        out.stderr
    );

    let js = async_nats::jetstream::new(cluster.connect().await);
    cluster
        .create_stream(
            &js,
            async_nats::jetstream::stream::Config {
                name: "INTEREST".into(),
                subjects: vec!["interest.>".into()],
                retention: async_nats::jetstream::stream::RetentionPolicy::Interest,
                duplicate_window: Duration::from_secs(600),
                num_replicas: 3,
                ..Default::default()
            },
        )
        .await;
    let out = ensure("INTEREST", "interest.>").await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("INTEREST")
            && out.stderr.contains("retention is interest")
            && out.stderr.contains("limits retention"),
        "the unsafe setting is named with its fix:\n{}",
        out.stderr
    );
}

/// `stream ensure --print-permissions` prints, after its check, the permissions block of the
/// relay's NATS user: `RelayPermissions` for the stream and its event types (tested against a
/// server in the e2e suite, `relay_foreign`).
#[tokio::test]
async fn stream_ensure_prints_the_relays_permissions() {
    let ctx = Ctx::new().await;
    let stream = ctx.stream_name();
    let captures = format!("{}.>", ctx.prefix);
    let out = run([
        "stream",
        "ensure",
        "--nats-url",
        &nats_url(),
        "--name",
        &stream,
        "--event-type",
        &captures,
        "--memory",
        "--print-permissions",
    ])
    .await;
    out.expect_code(0);
    let expected = outbox_runtime::RelayPermissions::new(&stream, [captures.clone()]).to_string();
    assert!(
        out.stdout.contains(&expected),
        "the permissions block:\n{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!("\"{captures}\"")),
        "{}",
        out.stdout
    );
    ctx.delete_stream().await;
}
