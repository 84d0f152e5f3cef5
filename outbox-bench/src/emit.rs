//! `emit`: the cost of `emit` against a raw sqlx insert of the same row.
//!
//! Variants, each `begin; <events>; commit` on one connection:
//!
//! - **insert**: `insert into outbox_events (id, event_type, source, subject, time, data,
//!   created_at) values (.., clock_timestamp())`, the struct serialized with `serde_json`;
//! - **insert+notify**: the same insert carrying the `pg_notify` that emit adds (emit's own
//!   statement shape: the notification rides in the insert statement);
//! - **emit**: `tx.emit(OrderPlaced { .. })`, a `#[derive(OutboxEvent)]` struct validated
//!   against `schemas/events/bench.order.placed.schema.json` before the insert.
//!
//! Each runs with 1 and with 10 events per transaction, interleaved in rounds (order rotated
//! each round), and the figures are medians of the per-event times. The NOTIFY is also measured
//! with 8 connections committing concurrently, since Postgres serialises the commits of
//! notifying transactions (a database-wide lock taken at commit). Last line:
//! `emit_vs_insert_ratio=<median emit / median insert, one event per transaction>`.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outbox_runtime::{EmitExt, OutboxEvent};
use outbox_testkit::TestDb;
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::common;

/// The benchmark's typed event.
#[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
#[outbox(
    event_type = "bench.order.placed",
    source = "bench",
    schema = "schemas/events/bench.order.placed.schema.json"
)]
struct OrderPlaced {
    order_id: Uuid,
    customer_id: Uuid,
    amount_cents: u64,
    currency: String,
    lines: Vec<Line>,
    placed_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
    price_cents: u64,
}

const INSERT: &str =
    "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
     values ($1, $2, $3, $4, $5, $6, clock_timestamp())";

const INSERT_NOTIFY: &str = "with inserted as ( \
       insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
       values ($1, $2, $3, $4, $5, $6, clock_timestamp()) returning 1) \
     select pg_notify('outbox_events', '') from inserted";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Insert,
    InsertNotify,
    Emit,
}

const VARIANTS: [Variant; 3] = [Variant::Insert, Variant::InsertNotify, Variant::Emit];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Insert => "insert",
            Variant::InsertNotify => "insert+notify",
            Variant::Emit => "emit",
        }
    }
}

fn event(i: u64) -> OrderPlaced {
    OrderPlaced {
        order_id: Uuid::now_v7(),
        customer_id: Uuid::now_v7(),
        amount_cents: (i * 37) % 100_000 + 2449,
        currency: "EUR".into(),
        lines: vec![
            Line {
                sku: format!("SKU-{}", i % 1000),
                qty: 1 + (i % 5) as u32,
                price_cents: 1999,
            },
            Line {
                sku: format!("SKU-{}", i % 777),
                qty: 1,
                price_cents: 450,
            },
        ],
        placed_at: Utc::now(),
        note: Some("leave it at the front desk and ring twice".into()),
    }
}

async fn insert(conn: &mut PgConnection, sql: &'static str, e: OrderPlaced) {
    let data = serde_json::to_value(&e).expect("serialize");
    sqlx::query(sql)
        .bind(Uuid::now_v7())
        .bind(OrderPlaced::EVENT_TYPE)
        .bind(OrderPlaced::SOURCE)
        .bind(e.order_id.to_string())
        .bind(Utc::now())
        .bind(sqlx::types::Json(&data))
        .execute(conn)
        .await
        .expect("insert");
}

/// `transactions` transactions of `per_tx` events; returns the time per event.
async fn run_variant(
    conn: &mut PgConnection,
    variant: Variant,
    transactions: u64,
    per_tx: u64,
) -> Duration {
    let started = Instant::now();
    for t in 0..transactions {
        let mut tx = conn.begin().await.expect("begin");
        for k in 0..per_tx {
            let e = event(t * per_tx + k);
            match variant {
                Variant::Insert => insert(&mut tx, INSERT, e).await,
                Variant::InsertNotify => insert(&mut tx, INSERT_NOTIFY, e).await,
                Variant::Emit => {
                    tx.emit(e).await.expect("emit");
                }
            }
        }
        tx.commit().await.expect("commit");
    }
    started.elapsed() / (transactions * per_tx) as u32
}

/// Runs the benchmark and prints its figures.
pub fn run() {
    common::print_command();
    common::runtime().block_on(bench(common::quick()));
}

async fn bench(quick: bool) {
    let rounds = if quick { 3 } else { 9 };
    let single: u64 = if quick { 200 } else { 1_000 };
    let batched: u64 = if quick { 40 } else { 200 };
    let concurrent: u64 = if quick { 400 } else { 2_000 };
    let db = common::database().await;
    println!(
        "{rounds} rounds; per round and variant: {single} transactions of 1 event, {batched} of 10 events (one connection), {concurrent} transactions of 1 event over 8 connections"
    );
    let mut conn = PgConnection::connect_with(&db.options)
        .await
        .expect("connect");
    // warm up: prepared statements, validator, caches
    for v in VARIANTS {
        run_variant(&mut conn, v, 50, 1).await;
    }

    let mut one: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut ten: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut par: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for round in 0..rounds {
        common::truncate(&db).await;
        for k in 0..3 {
            let idx = (k + round) % 3;
            let v = VARIANTS[idx];
            one[idx].push(run_variant(&mut conn, v, single, 1).await.as_secs_f64() * 1e6);
            ten[idx].push(run_variant(&mut conn, v, batched, 10).await.as_secs_f64() * 1e6);
            par[idx].push(concurrently(&db, v, concurrent).await);
        }
        println!(
            "round {}: per event (us) 1/tx insert {:.0} notify {:.0} emit {:.0}; 10/tx insert {:.0} notify {:.0} emit {:.0}; 8 conns (events/s) insert {:.0} notify {:.0} emit {:.0}",
            round + 1,
            one[0][round],
            one[1][round],
            one[2][round],
            ten[0][round],
            ten[1][round],
            ten[2][round],
            par[0][round],
            par[1][round],
            par[2][round]
        );
    }
    let m =
        |v: &mut Vec<Vec<f64>>| -> Vec<f64> { v.iter_mut().map(|s| common::median(s)).collect() };
    let (one, ten, par) = (m(&mut one), m(&mut ten), m(&mut par));
    drop(conn);
    drop(db);
    for (i, v) in VARIANTS.iter().enumerate() {
        println!(
            "{:<14} 1/tx {:>6.0} us/event   10/tx {:>6.0} us/event   8 connections {:>6.0} events/s",
            v.name(),
            one[i],
            ten[i],
            par[i]
        );
    }
    println!(
        "notify_cost_1_per_tx_us={:.0} (insert+notify {:.0} us vs insert {:.0} us, ratio {:.3})",
        one[1] - one[0],
        one[1],
        one[0],
        one[1] / one[0]
    );
    println!(
        "notify_cost_10_per_tx_us_per_event={:.1} (ratio {:.3})",
        ten[1] - ten[0],
        ten[1] / ten[0]
    );
    println!(
        "notify_8_connections_throughput_ratio={:.3} (insert+notify {:.0}/s vs insert {:.0}/s)",
        par[1] / par[0],
        par[1],
        par[0]
    );
    println!("emit_vs_insert_ratio_10_per_tx={:.3}", ten[2] / ten[0]);
    println!("emit_vs_insert_ratio={:.3}", one[2] / one[0]);
}

/// `transactions` one-event transactions spread over 8 connections; returns events per second.
async fn concurrently(db: &TestDb, variant: Variant, transactions: u64) -> f64 {
    const CONNECTIONS: u64 = 8;
    let mut conns = Vec::with_capacity(CONNECTIONS as usize);
    for _ in 0..CONNECTIONS {
        let mut c = PgConnection::connect_with(&db.options)
            .await
            .expect("connect");
        run_variant(&mut c, variant, 5, 1).await;
        conns.push(c);
    }
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                run_variant(&mut c, variant, transactions / CONNECTIONS, 1).await;
                c
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("emitter task");
    }
    transactions as f64 / started.elapsed().as_secs_f64()
}
