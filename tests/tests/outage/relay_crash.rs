//! A relay that dies after publishing and before marking loses nothing: the next relay
//! republishes the same ids and JetStream drops them as duplicates.

use outbox_runtime::{EmitExt, Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{open_schemas, raw_event};
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn a_relay_killed_between_publish_and_mark_loses_nothing() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = [
        ctx.event_type("billing.invoice.paid"),
        ctx.event_type("billing.invoice.voided"),
    ];
    let schemas = open_schemas(&types);
    let mut ids = Vec::new();
    let mut tx = ctx.pool().begin().await.unwrap();
    for i in 0..12 {
        let event = raw_event(&types[i % 2], "billing", format!("inv-{}", i % 3))
            .data(json!({ "i": i }))
            .build();
        ids.push(tx.emit_raw(&schemas, event).await.unwrap());
    }
    tx.commit().await.unwrap();

    let config = RelayConfig {
        event_types: types.to_vec(),
        ..Default::default()
    };
    let first = Relay::new(ctx.pool().clone(), ctx.js.clone(), config.clone())
        .await
        .unwrap();
    let mut claim = first.claim().await.unwrap();
    assert_eq!(claim.ids(), ids, "claimed in created_at order");
    let report = claim.publish().await;
    assert_eq!(report.published, 12);
    assert_eq!(report.duplicates, 0);
    // The process dies here: its transaction is never committed.
    drop(claim);
    drop(first);

    assert_eq!(ctx.db.unpublished().await, 12, "nothing was marked");
    assert_eq!(ctx.stream_len().await, 12);

    let second = Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
        .await
        .unwrap();
    let report = second.run_once().await.unwrap();
    assert_eq!(report.claimed, 12);
    assert_eq!(report.published, 12);
    assert_eq!(
        report.duplicates, 12,
        "JetStream reports every republish as a duplicate"
    );
    assert_eq!(second.stats().duplicates, 12);
    assert_eq!(ctx.db.unpublished().await, 0);

    let messages = ctx.read_stream().await;
    let stored: Vec<Uuid> = messages.iter().map(|m| m.envelope.id).collect();
    assert_eq!(stored, ids, "each event stored once, in order");
    assert!(messages
        .iter()
        .all(|m| m.msg_id == m.envelope.id.to_string()));
    ctx.delete_stream().await;
}
