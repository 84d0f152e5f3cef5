//! `outbox unblock`: a held row, released by its id, publishes with its id and the row behind
//! it follows.

use outbox_testkit::eventually;
use outbox_testkit::suite::Ctx;
use serde_json::Value;
use uuid::Uuid;

use crate::support::{
    assert_no_secret, db_url, emit_numbered, nats_url, relay_args, relay_until_published, run,
    Running, PATIENCE,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unblock_republishes_a_held_row_with_its_id() {
    let ctx = Ctx::new().await;
    let event_type = ctx.event_type("unblock.row.changed");
    let url = db_url(&ctx.db);
    let nats = nats_url();
    let ids = emit_numbered(ctx.pool(), &event_type, "account-1", 0..2).await;
    let (stuck, behind) = (ids[0], ids[1]);

    // No stream captures the type yet: the relay's start-up check refuses it ...
    let out = run(relay_args(&url, &nats, &["--event-type", &event_type])).await;
    out.expect_code(2).assert_clean();
    assert!(out.stderr.contains(&event_type), "{}", out.stderr);

    // ... and without the check the broker answers "no responders": the first row is held at
    // once, with its reason, and the second waits behind it.
    let mut relay = Running::spawn(relay_args(
        &url,
        &nats,
        &[
            "--max-attempts",
            "2",
            "--backoff-base",
            "0.05",
            "--backoff-max",
            "0.2",
            "--poll-interval",
            "0.1",
            "--ack-timeout",
            "1",
        ],
    ));
    let attempts = |id: Uuid| {
        let pool = ctx.pool().clone();
        async move {
            sqlx::query_scalar::<_, i32>("select attempts from outbox_events where id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("the row's attempts")
        }
    };
    eventually(PATIENCE, "the relay to log the held row", || {
        std::future::ready(relay.stderr().lines().any(|l| {
            l.contains("outbox event held")
                && l.contains(&stuck.to_string())
                && l.contains("no stream captures")
        }))
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    assert_no_secret(&relay.stderr());
    assert_eq!(
        attempts(stuck).await,
        1,
        "one attempt: the broker's answer, then held"
    );
    assert_eq!(attempts(behind).await, 0, "held behind it, never attempted");

    let out = run([
        "status",
        "--database-url",
        &url,
        "--max-attempts",
        "2",
        "--max-held",
        "0",
        "--json",
    ])
    .await;
    out.expect_code(1);
    let v: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        (
            v["unpublished"].as_i64(),
            v["held_total"].as_i64(),
            v["at_cap"].as_i64()
        ),
        (Some(2), Some(1), Some(0))
    );
    assert_eq!(
        v["held"][0]["id"].as_str(),
        Some(stuck.to_string().as_str())
    );
    let reason = v["held"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no stream captures") && reason.contains(&event_type),
        "{reason}"
    );
    let text = run(["status", "--database-url", &url]).await;
    text.expect_code(0);
    assert!(
        text.stdout.contains(&stuck.to_string()) && text.stdout.contains("no stream captures"),
        "the held row and its reason in the status: {}",
        text.stdout
    );

    // The cause is fixed, then the row is unblocked by its id.
    ctx.ensure_stream().await;
    let unblock = |id: Uuid| {
        run([
            "unblock".to_owned(),
            "--database-url".into(),
            url.clone(),
            "--id".into(),
            id.to_string(),
            "--max-attempts".into(),
            "2".into(),
        ])
    };
    let out = unblock(behind).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout.trim(),
        "0 row(s) will be published again",
        "a row that is not held is not touched"
    );
    let out = unblock(stuck).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        [
            format!("unblocked {stuck}").as_str(),
            "1 row(s) will be published again"
        ]
    );
    assert_eq!(attempts(stuck).await, 0);

    let relay = ["--event-type", &event_type, "--max-attempts", "2"];
    relay_until_published(&ctx, &url, &nats, &relay).await;
    let messages = ctx.read_stream().await;
    let got: Vec<(String, Uuid)> = messages
        .iter()
        .map(|m| (m.msg_id.clone(), m.envelope.id))
        .collect();
    assert_eq!(
        got,
        [(stuck.to_string(), stuck), (behind.to_string(), behind)],
        "the unblocked row keeps its id, and the one behind it follows"
    );
    ctx.delete_stream().await;

    // Without a selector, unblock is a usage error.
    let out = run(["unblock", "--database-url", &url]).await;
    out.expect_code(2);
    assert!(
        out.stderr.contains("--id") && out.stderr.contains("--all"),
        "{}",
        out.stderr
    );
}
