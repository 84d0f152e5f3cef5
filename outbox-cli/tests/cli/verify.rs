//! `outbox verify` against a real Postgres and nats-server: every row present exits 0,
//! missing rows are listed and exit 1, `--republish` sets them unpublished and says how many,
//! `--json` carries the same, a range reaching past retention exits 1 naming the gap, and an
//! unknown stream exits 2 naming it. URLs carry passwords, and nothing prints them.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{eventually, run_relay};
use serde_json::Value;

use crate::support::{db_url, finish, nats_url, outbox};

/// Runs `outbox verify <args>` on the test's database and the shared NATS server (URLs with
/// passwords, which nothing may print), with the test's stream unless `args` name one; its
/// exit code and output.
async fn verify(ctx: &Ctx, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = outbox();
    cmd.arg("verify")
        .arg("--database-url")
        .arg(db_url(&ctx.db))
        .arg("--nats-url")
        .arg(nats_url())
        .args(args);
    if !args.contains(&"--stream") {
        cmd.arg("--stream").arg(ctx.stream_name());
    }
    let out = finish(cmd).await;
    out.assert_clean();
    (out.code, out.stdout, out.stderr)
}

/// 100 rows over 5 subjects, published by a relay; the `--from` that covers them.
async fn published_rows(ctx: &Ctx) -> String {
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         select gen_random_uuid(), $1, 'cli', 's' || (g % 5), now(), '{}' \
           from generate_series(1, 100) g",
    )
    .bind(ctx.event_type("cli.row.changed"))
    .execute(ctx.pool())
    .await
    .expect("insert rows");
    let relay = Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
        .await
        .expect("relay");
    let (stop, task) = run_relay(Arc::new(relay));
    eventually(Duration::from_secs(60), "every row published", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    drop(stop);
    task.await.expect("relay task");
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select min(published_at) from outbox_events")
            .fetch_one(ctx.pool())
            .await
            .expect("min(published_at)");
    first.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_lists_missing_rows_exits_1_and_republish_says_how_many() {
    let ctx = Ctx::new().await;
    // a 1 s duplicate window, waited out below, so the republished ids can be stored again
    StreamSpec {
        duplicate_window: Duration::from_secs(1),
        ..ctx.stream_spec()
    }
    .ensure(&ctx.js)
    .await
    .expect("stream");
    let from = published_rows(&ctx).await;
    let (code, stdout, stderr) = verify(&ctx, &["--from", &from]).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("100 row(s), 100 present, 0 missing"),
        "{stdout}"
    );
    assert!(stdout.contains("ok: every row"), "{stdout}");

    let messages = ctx.read_stream().await;
    let stream = ctx.js.get_stream(ctx.stream_name()).await.expect("stream");
    let gone = [&messages[10], &messages[77]];
    for m in gone {
        assert!(stream.delete_message(m.seq).await.expect("delete"));
    }
    let (code, stdout, _) = verify(&ctx, &["--from", &from]).await;
    assert_eq!(code, Some(1), "{stdout}");
    for m in gone {
        assert!(
            stdout.contains(&format!("missing {}", m.envelope.id)),
            "{stdout}"
        );
    }
    assert_eq!(stdout.matches("missing ").count(), 2, "{stdout}");
    assert!(stdout.contains("MISSING: 2 published row(s)"), "{stdout}");

    let (code, stdout, _) = verify(&ctx, &["--from", &from, "--json"]).await;
    assert_eq!(code, Some(1));
    let report: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(report["missing"], 2);
    assert_eq!(report["all_present"], false);
    assert_eq!(report["missing_rows"].as_array().map(Vec::len), Some(2));

    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, stdout, _) = verify(&ctx, &["--from", &from, "--republish"]).await;
    assert_eq!(code, Some(1), "missing rows were found: {stdout}");
    assert!(stdout.contains("republished 2 row(s)"), "{stdout}");
    assert_eq!(ctx.db.unpublished().await, 2);
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_a_gap_in_retention_and_an_unknown_stream() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    published_rows(&ctx).await;
    // an hour ago: before the stream's first message and the table's oldest row
    let (code, stdout, _) = verify(&ctx, &["--from", "1h"]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("100 row(s), 100 present, 0 missing"),
        "{stdout}"
    );
    assert!(
        stdout.contains("NOT VERIFIED: the range starts at"),
        "{stdout}"
    );
    assert!(stdout.contains("first message"), "{stdout}");
    assert!(stdout.contains("oldest published row"), "{stdout}");

    let (code, _, stderr) = verify(&ctx, &["--from", "1h", "--stream", "NO_SUCH_STREAM"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("stream `NO_SUCH_STREAM`"), "{stderr}");

    let (code, _, stderr) = verify(&ctx, &["--from", "yesterday"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("RFC 3339"), "{stderr}");
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_shows_progress_on_a_terminal() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let from = published_rows(&ctx).await;
    // `script` gives the command a terminal (util-linux; a missing one fails the test)
    let line = format!(
        "'{}' verify --database-url '{}' --nats-url '{}' --stream '{}' --from '{from}' --page-size 10",
        env!("CARGO_BIN_EXE_outbox"),
        ctx.db.url(),
        outbox_testkit::nats_url(),
        ctx.stream_name(),
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(Stdio::null())
            .output()
            .expect("run `script` (util-linux) to give outbox verify a terminal")
    })
    .await
    .expect("the command thread");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("\rrows 10/100 (10%)"), "{text:?}");
    assert!(text.contains("\rrows 100/100 (100%)"), "{text:?}");
    assert!(text.contains("ok: every row"), "{text}");
    ctx.delete_stream().await;
}
