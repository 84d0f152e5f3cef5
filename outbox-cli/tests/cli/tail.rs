//! `outbox tail`: the envelopes of relayed events, in stream order, from the stream that
//! captures the event types given.

use outbox_testkit::suite::Ctx;

use crate::support::{db_url, emit_numbered, nats_url, relay_until_published, run};

#[tokio::test]
async fn tail_prints_the_envelopes_in_stream_order() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("tail.row.changed");
    let (url, nats) = (db_url(&ctx.db), nats_url());
    let stream = ctx.stream_name();
    let captures = format!("{}.>", ctx.prefix);

    // three events of one subject, relayed: they reach the stream in emit order (order across
    // subjects is not promised)
    let ids = emit_numbered(ctx.pool(), &event_type, "account-1", 0..3).await;
    relay_until_published(&ctx, &url, &nats, &["--event-type", &event_type]).await;

    // `tail --all --count 3` prints the three envelopes in stream order, then exits.
    let out = run([
        "tail",
        "--nats-url",
        &nats,
        "--all",
        "--count",
        "3",
        &captures,
    ])
    .await;
    out.expect_code(0).assert_clean();
    let headers: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("  "))
        .collect();
    assert_eq!(
        headers.len(),
        3,
        "one header line per event:\n{}",
        out.stdout
    );
    for (line, id) in headers.iter().zip(&ids) {
        for part in [
            event_type.clone(),
            format!("id={id}"),
            "source=cli-test".to_owned(),
            "subject=account-1".to_owned(),
        ] {
            assert!(line.contains(&part), "`{part}` missing from {line:?}");
        }
    }
    let bodies: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(bodies, [r#"  {"n":0}"#, r#"  {"n":1}"#, r#"  {"n":2}"#]);
    assert!(
        out.stderr.contains(&format!("on stream {stream}")),
        "tail finds the stream that captures the event type:\n{}",
        out.stderr
    );
    ctx.delete_stream().await;
}
