//! The end-to-end suites against a real Postgres and nats-server, one module per concept, in
//! one test binary: one link of sqlx and async-nats instead of one per suite.
//!
//! Every test has a database of its own and a subject prefix (or a private nats-server) of its
//! own, so they run side by side. Tests that stop or restart a server are in the `outage`
//! binary; the example service's suite, which installs the process's Prometheus recorder
//! (the consumer suite here installs a debugging one), is `example_service`.

mod broker;
mod consumer;
mod consumer_operator;
mod consumer_order;
mod migrate;
mod operations;
mod relay_basic;
mod relay_cursor;
mod relay_faults;
mod relay_foreign;
mod relay_poison;
mod relay_replicas;
mod relay_startup;
mod relay_streams;
mod relay_wake;
mod retention;
mod retention_passes;
mod roles;
mod testkit;
mod verify;
