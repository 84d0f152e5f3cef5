//! The `outbox` command against a real Postgres and nats-server, one file a command: migrate,
//! relay (backlog, SIGTERM, restart, progress, metrics, a frozen relay), the relay as a process
//! (`process`: the probes, the shutdown bound; `otlp`: spans and metrics over OTLP, JSON logs),
//! asyncapi, status (and TLS to
//! Postgres), check, lock, gen, unblock, stream ensure, tail, prune, verify and `--help`;
//! `connection` has what every command shares when it connects (servers that do not answer,
//! NATS TLS and logins). `support` is what the tests share.
//!
//! Every test runs the built binary with `--database-url` / `--nats-url` given explicitly, on a
//! fresh database; URLs carry passwords (Postgres trust auth and an open nats-server accept any)
//! so that every test can check that no password is ever printed.

mod support;

mod asyncapi;
mod check;
mod connection;
mod gen;
mod help;
mod lock;
mod migrate;
#[cfg(feature = "opentelemetry")]
mod otlp;
mod process;
mod prune;
mod relay;
mod status;
mod stream;
mod tail;
mod unblock;
mod verify;
