//! The project's own conveniences, the way this repository's suites use the general helpers:
//! not part of what a service's tests would build on.

use async_nats::jetstream;
use outbox_runtime::{StorageType, StreamSpec};
use sqlx::PgPool;

use crate::db::TestDb;
use crate::env::nats_url;
use crate::nats::connect_nats;
use crate::stream::{read_stream, stream_len, Delivered};
use crate::unique::unique_token;

/// A test's database, NATS connection and unique subject prefix.
///
/// Every event type of the test starts with the prefix, and the test's stream captures
/// `<prefix>.>`, so tests sharing one nats-server never see each other's messages.
#[derive(Debug)]
pub struct Ctx {
    /// The test database (migrated).
    pub db: TestDb,
    /// The NATS client.
    pub client: async_nats::Client,
    /// JetStream on `client`.
    pub js: jetstream::Context,
    /// The test's first subject token: every event type of the test starts with it.
    pub prefix: String,
}

impl Ctx {
    /// A fresh database and the shared NATS server.
    pub async fn new() -> Ctx {
        Ctx::with_nats(&nats_url()).await
    }

    /// A fresh database and the NATS server at `url`.
    pub async fn with_nats(url: &str) -> Ctx {
        let db = TestDb::new().await;
        let client = connect_nats(url).await;
        let js = jetstream::new(client.clone());
        Ctx {
            db,
            client,
            js,
            prefix: unique_token(),
        }
    }

    /// The pool on the test database.
    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// `<prefix>.<rest>`: an event type (and subject) private to this test.
    pub fn event_type(&self, rest: &str) -> String {
        format!("{}.{rest}", self.prefix)
    }

    /// The name of the test's stream.
    pub fn stream_name(&self) -> String {
        self.prefix.to_uppercase()
    }

    /// The spec of the test's stream: memory storage, capturing `<prefix>.>`.
    pub fn stream_spec(&self) -> StreamSpec {
        StreamSpec {
            name: self.stream_name(),
            subjects: vec![format!("{}.>", self.prefix)],
            storage: StorageType::Memory,
            ..Default::default()
        }
    }

    /// Creates the test's stream.
    pub async fn ensure_stream(&self) -> jetstream::stream::Info {
        self.stream_spec()
            .ensure(&self.js)
            .await
            .expect("create the test stream")
    }

    /// Messages in the test's stream.
    pub async fn stream_len(&self) -> u64 {
        stream_len(&self.js, &self.stream_name()).await
    }

    /// Every message of the test's stream, in stream order, read by an ordered consumer.
    pub async fn read_stream(&self) -> Vec<Delivered> {
        read_stream(&self.js, &self.stream_name()).await
    }

    /// Deletes the test's stream (the shared server keeps no leftovers).
    pub async fn delete_stream(&self) {
        let _ = self.js.delete_stream(self.stream_name()).await;
    }
}
