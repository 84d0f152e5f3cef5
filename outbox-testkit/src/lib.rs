//! Test helpers for the outbox against a real Postgres and a real nats-server.
//!
//! General helpers, one module per concept (a later release makes these public for services'
//! own tests; they name nothing of this repository's suites):
//!
//! - [`env`]: `DATABASE_URL` and `NATS_URL` with their local defaults; a missing service fails
//!   the test, naming the command that starts it.
//! - [`db`]: [`TestDb`], a fresh database per test, dropped with it; [`PgServer`], a private
//!   Postgres cluster a test may stop and restart, or configure ([`PgServerConfig`]: TLS,
//!   `pg_hba.conf`).
//! - [`tls`]: [`TestCa`], a certificate authority of the test's own (made with `openssl`) that
//!   issues server certificates.
//! - [`nats`]: [`NatsServer`], a private `nats-server` with JetStream a test may stop and
//!   restart; [`connect_nats`].
//! - [`cluster`]: [`NatsCluster`], a private three-node JetStream cluster a test may step
//!   down, kill and freeze node by node.
//! - [`stream`]: reading a stream back ([`read_stream`], [`Delivered`]).
//! - [`relay`]: running a relay in the background ([`run_relay`]).
//! - [`wait`]: waiting for a condition ([`eventually`]).
//! - [`event`]: [`RawEventBuilder`], the one way to write a [`RawEvent`](outbox_runtime::RawEvent)
//!   by hand; [`open_schemas`] and [`emit_committed`] for the untyped path.
//! - [`unique`]: names unique to a test and free ports.
//!
//! The project's own conveniences live apart, in [`suite`]: [`suite::Ctx`] bundles a test's
//! database, NATS connection and unique subject prefix the way this repository's suites use them.
//! They are not re-exported at the crate root.
//!
//! ```no_run
//! use std::time::Duration;
//! use outbox_testkit::{eventually, TestDb};
//!
//! # async fn example() {
//! let db = TestDb::new().await; // a fresh database with the outbox migrations
//! eventually(Duration::from_secs(5), "the table is empty", || async {
//!     db.unpublished().await == 0
//! })
//! .await;
//! # }
//! ```

pub mod cluster;
pub mod db;
pub mod env;
pub mod event;
pub mod nats;
pub mod relay;
pub mod stream;
pub mod suite;
pub mod tls;
pub mod unique;
pub mod wait;

pub use cluster::NatsCluster;
pub use db::{PgServer, PgServerConfig, TestDb, TestDbBuilder};
pub use env::{database_url, nats_url};
pub use event::{emit_committed, open_schemas, raw_event, RawEventBuilder};
pub use nats::{connect_nats, nats_server_binary, NatsServer, NatsServerConfig};
pub use relay::run_relay;
pub use stream::{read_stream, stream_len, Delivered};
pub use tls::{Issued, TestCa};
pub use unique::{free_port, unique_name, unique_token};
pub use wait::eventually;
