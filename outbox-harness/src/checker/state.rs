//! The final state of a run: the table (with the rows retention deleted, from the harness's
//! ledger), the retry schedule and every stream, read once the relays have stopped.

use std::collections::HashMap;

use futures::TryStreamExt;
use uuid::Uuid;

use crate::consumers::DEAD_LETTERS;
use crate::history::Time;
use crate::servers::Servers;

/// A row of `outbox_events` at the end.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its subject.
    pub subject: String,
    /// `created_at` as text (it may be no real instant).
    pub created_at: String,
    /// When it was marked published.
    pub published_at: Option<Time>,
    /// Its attempts.
    pub attempts: i32,
    /// When it was deleted, and by which role: `published_at` and `attempts` are then what
    /// they were at the delete.
    pub pruned: Option<(Time, String)>,
}

/// A row of `outbox_retries` at the end.
#[derive(Debug, Clone)]
pub struct Retry {
    /// The parked subject.
    pub subject: String,
    /// Its head.
    pub event_id: Uuid,
    /// When it is tried again; `None`: held.
    pub retry_at: Option<Time>,
    /// Why.
    pub reason: String,
}

/// A message of a stream.
#[derive(Debug, Clone)]
pub struct Message {
    /// The stream.
    pub stream: String,
    /// Its sequence there.
    pub seq: u64,
    /// Its `Nats-Msg-Id`.
    pub msg_id: String,
    /// The envelope's id.
    pub id: Uuid,
    /// The envelope's subject (the entity).
    pub subject: String,
    /// The envelope's event type.
    pub event_type: String,
    /// When the stream stored it.
    pub stored_at: Time,
}

/// The final state: read once the relays have stopped.
#[derive(Debug, Clone)]
pub struct Final {
    /// Every row, by id.
    pub rows: HashMap<Uuid, Row>,
    /// The retry schedule.
    pub retries: Vec<Retry>,
    /// Every stream's messages, but the consumer's dead letters.
    pub messages: Vec<Message>,
    /// How many times the consumer's handler applied each event (`harness_applied`).
    pub applied: HashMap<Uuid, usize>,
    /// How many dead letters the consumer's stream holds for each event.
    pub dead_letters: HashMap<Uuid, usize>,
    /// When it was read.
    pub at: Time,
}

impl Final {
    /// Reads the table, the retry schedule, every stream and what the consumer did.
    pub async fn read(servers: &Servers) -> Final {
        type RowTuple = (
            Uuid,
            String,
            String,
            Option<Time>,
            i32,
            Option<Time>,
            Option<String>,
        );
        let rows: Vec<RowTuple> = sqlx::query_as(
            "select id, subject, created_at::text, published_at, attempts, null, null \
               from outbox_events \
             union all \
             select id, subject, created_at, published_at, attempts, pruned_at, pruned_by \
               from harness_pruned",
        )
        .fetch_all(&servers.admin)
        .await
        .expect("read outbox_events");
        let retries: Vec<(String, Uuid, Option<Time>, String)> =
            sqlx::query_as("select subject, event_id, retry_at, reason from outbox_retries")
                .fetch_all(&servers.admin)
                .await
                .expect("read outbox_retries");
        let names: Vec<String> = servers
            .js
            .stream_names()
            .try_collect()
            .await
            .expect("list the streams");
        let applied: Vec<Uuid> = sqlx::query_scalar("select event_id from harness_applied")
            .fetch_all(&servers.admin)
            .await
            .expect("read harness_applied");
        let mut messages = Vec::new();
        let mut dead_letters = HashMap::new();
        for name in names {
            if name == DEAD_LETTERS {
                for d in outbox_testkit::read_stream(&servers.js, &name).await {
                    *dead_letters.entry(d.envelope.id).or_default() += 1;
                }
                continue;
            }
            for d in outbox_testkit::read_stream(&servers.js, &name).await {
                messages.push(Message {
                    stream: name.clone(),
                    seq: d.seq,
                    msg_id: d.msg_id,
                    id: d.envelope.id,
                    subject: d.envelope.subject,
                    event_type: d.envelope.event_type,
                    stored_at: d.stored_at,
                });
            }
        }
        Final {
            rows: rows
                .into_iter()
                .map(
                    |(id, subject, created_at, published_at, attempts, pruned_at, by)| {
                        let row = Row {
                            subject,
                            created_at,
                            published_at,
                            attempts,
                            pruned: pruned_at.zip(by),
                        };
                        (id, row)
                    },
                )
                .collect(),
            retries: retries
                .into_iter()
                .map(|(subject, event_id, retry_at, reason)| Retry {
                    subject,
                    event_id,
                    retry_at,
                    reason,
                })
                .collect(),
            messages,
            applied: applied.into_iter().fold(HashMap::new(), |mut counts, id| {
                *counts.entry(id).or_default() += 1;
                counts
            }),
            dead_letters,
            at: chrono::Utc::now(),
        }
    }
}
