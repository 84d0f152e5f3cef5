//! Outages: tests that stop, restart or kill a server or a relay under a running relay, in a
//! binary of their own so the timing they observe (backoff, reconnects) is not shared with the
//! `e2e` suites' load. Each stops only servers it started itself (a private nats-server or
//! Postgres cluster), by their pid.

mod consumer_pg_restart;
mod operations;
mod relay_crash;
mod relay_findings;
mod relay_listen;
mod relay_outage;
mod relay_pg_restart;
