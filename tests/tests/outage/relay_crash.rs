//! A relay that dies after publishing and before marking loses nothing: the next relay
//! republishes the same ids and JetStream drops them as duplicates.
//!
//! Order is kept per subject (the row's `subject`, the entity): the three entities' chains are
//! published at once, so how their events interleave in the stream depends on when the acks
//! come back.

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
    let mut stored: Vec<Uuid> = messages.iter().map(|m| m.envelope.id).collect();
    for entity in 0..3 {
        let of = |all: &[Uuid]| -> Vec<Uuid> {
            all.iter()
                .copied()
                .filter(|id| ids.iter().position(|x| x == id).expect("an emitted id") % 3 == entity)
                .collect()
        };
        assert_eq!(of(&stored), of(&ids), "inv-{entity}: stored in emit order");
    }
    stored.sort();
    let mut emitted = ids.clone();
    emitted.sort();
    assert_eq!(stored, emitted, "each event stored once");
    assert!(
        messages.iter().all(|m| types.contains(&m.subject)),
        "published on its type's subject"
    );
    assert!(messages
        .iter()
        .all(|m| m.msg_id == m.envelope.id.to_string()));
    ctx.delete_stream().await;
}
