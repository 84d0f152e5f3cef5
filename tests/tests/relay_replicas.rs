//! Four relays on one table: every committed event reaches the stream once, and each subject's
//! events arrive in created_at order.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, open_schemas, Ctx};
use outbox_runtime::{EmitExt, RawEvent, Relay, RelayConfig};
use serde_json::json;
use uuid::Uuid;

const EVENTS: usize = 20_000;
const SUBJECTS: usize = 500;
const RELAYS: usize = 4;
const PER_TX: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_relays_publish_every_event_once_in_order_per_subject() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = [
        ctx.event_type("billing.subscription.created"),
        ctx.event_type("billing.subscription.renewed"),
        ctx.event_type("billing.subscription.cancelled"),
    ];
    let schemas = open_schemas(&types);
    let config = RelayConfig {
        subjects: types.to_vec(),
        ..Default::default()
    };

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        let relay = Arc::new(
            Relay::new(ctx.pool().clone(), ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        let mut stopped = stopped.clone();
        let running = relay.clone();
        relays.push((
            relay,
            tokio::spawn(async move {
                running
                    .run(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            }),
        ));
    }

    // Emit while the relays run: one writer, so created_at order is commit order.
    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    for chunk in 0..EVENTS / PER_TX {
        let mut tx = ctx.pool().begin().await.unwrap();
        for j in 0..PER_TX {
            let n = chunk * PER_TX + j;
            let subject = format!("sub-{}", (n * 7919) % SUBJECTS);
            let event = RawEvent {
                event_type: types[n % types.len()].clone(),
                source: "billing".into(),
                subject: subject.clone(),
                time: None,
                data: json!({ "n": n }),
            };
            let id = tx.emit_raw(&schemas, event).await.unwrap();
            expected.entry(subject).or_default().push(id);
        }
        tx.commit().await.unwrap();
    }

    eventually(
        Duration::from_secs(300),
        "every event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    stop.send(true).unwrap();
    let mut published_by = Vec::new();
    for (relay, running) in relays {
        running.await.unwrap().unwrap();
        published_by.push(relay.stats().published);
    }
    eprintln!("published per relay: {published_by:?}");
    assert_eq!(published_by.iter().sum::<u64>(), EVENTS as u64);
    assert!(
        published_by.iter().filter(|&&n| n > 0).count() > 1,
        "the relays shared the work: {published_by:?}"
    );

    let messages = ctx.read_stream().await;
    assert_eq!(messages.len(), EVENTS, "one message per committed event");
    let distinct: HashSet<Uuid> = messages.iter().map(|m| m.envelope.id).collect();
    assert_eq!(distinct.len(), EVENTS, "no event stored twice");
    let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in &messages {
        assert_eq!(m.msg_id, m.envelope.id.to_string());
        seen.entry(m.envelope.subject.clone())
            .or_default()
            .push(m.envelope.id);
    }
    assert_eq!(seen.len(), SUBJECTS);
    for (subject, ids) in &expected {
        assert_eq!(
            seen.get(subject),
            Some(ids),
            "subject {subject} arrives in created_at order"
        );
    }
    ctx.delete_stream().await;
}
