//! `emit`: the cost of `emit` against a raw sqlx insert of the same row.
//!
//! Variants, each `begin; <events>; commit` on one connection:
//!
//! - **insert**: `insert into outbox_events (id, event_type, source, subject, time, data,
//!   created_at) values (.., clock_timestamp())`, the struct serialized with `serde_json`;
//! - **insert+notify**: the same insert carrying the `pg_notify` that emit adds (emit's own
//!   statement shape: the notification rides in the insert statement);
//! - **emit**: `tx.emit(OrderPlaced { .. })`, a `#[derive(OutboxEvent)]` struct validated
//!   against `schemas/events/bench.order.placed.schema.json` before the insert, while no relay
//!   waits for commits (the wake lock is free: the emit takes it shared and sends no
//!   notification, as while relays drain);
//!
//! - **emit, relay waiting**: the same while the wake lock is held, as by a relay with a lane
//!   waiting for commits (every emit notifies).
//!
//! Each runs with 1 and with 10 events per transaction on one connection, interleaved in rounds
//! (order rotated each round), and the figures are medians of the per-event times. Commit
//! throughput is also measured with 8 and with 32 connections committing concurrently (1 and
//! 10 events per transaction), since Postgres serialises the commits of notifying transactions
//! (a database-wide lock taken at commit): `emit_8_connections_vs_insert_ratio=` and
//! `emit_32_connections_vs_insert_ratio=` (one event per transaction; `_10_per_tx` for ten)
//! compare emit with the plain insert, `emit_relay_waiting_...` the emit that notifies. Last
//! line: `emit_vs_insert_ratio=<median emit / median insert, one event per transaction>`.

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
    EmitRelayWaiting,
}

const VARIANTS: [Variant; 4] = [
    Variant::Insert,
    Variant::InsertNotify,
    Variant::Emit,
    Variant::EmitRelayWaiting,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Insert => "insert",
            Variant::InsertNotify => "insert+notify",
            Variant::Emit => "emit",
            Variant::EmitRelayWaiting => "emit, relay waiting",
        }
    }
}

/// Holds the wake lock as a relay with a waiting lane does, for [`Variant::EmitRelayWaiting`].
struct WaitingRelay(Option<PgConnection>);

impl WaitingRelay {
    async fn new(db: &TestDb, variant: Variant) -> WaitingRelay {
        if variant != Variant::EmitRelayWaiting {
            return WaitingRelay(None);
        }
        let mut conn = PgConnection::connect_with(&db.options)
            .await
            .expect("connect");
        sqlx::query("select pg_advisory_lock($1, $2)")
            .bind(outbox_runtime::relay::LOCK_NAMESPACE)
            .bind(outbox_runtime::WAKE_KEY)
            .execute(&mut conn)
            .await
            .expect("take the wake lock");
        WaitingRelay(Some(conn))
    }

    async fn done(self) {
        if let Some(conn) = self.0 {
            conn.close()
                .await
                .expect("close the wake lock's connection");
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
                Variant::Emit | Variant::EmitRelayWaiting => {
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
    let concurrent: u64 = if quick { 640 } else { 3_200 };
    let n = VARIANTS.len();
    let db = common::database().await;
    println!(
        "{rounds} rounds; per round and variant: {single} transactions of 1 event, {batched} of 10 events (one connection), {concurrent} transactions of 1 event and {} of 10 over 8 and over 32 connections",
        concurrent / 10
    );
    let mut conn = PgConnection::connect_with(&db.options)
        .await
        .expect("connect");
    // warm up: prepared statements, validator, caches
    for v in VARIANTS {
        run_variant(&mut conn, v, 50, 1).await;
    }

    let samples = || vec![Vec::<f64>::new(); n];
    let (mut one, mut ten) = (samples(), samples());
    // events per second, per shape (connections, events per transaction) and variant
    let shapes: [(u64, u64); 4] = [(8, 1), (8, 10), (32, 1), (32, 10)];
    let mut par: Vec<Vec<Vec<f64>>> = shapes.iter().map(|_| samples()).collect();
    for round in 0..rounds {
        common::truncate(&db).await;
        for k in 0..n {
            let idx = (k + round) % n;
            let v = VARIANTS[idx];
            let waiting = WaitingRelay::new(&db, v).await;
            one[idx].push(run_variant(&mut conn, v, single, 1).await.as_secs_f64() * 1e6);
            ten[idx].push(run_variant(&mut conn, v, batched, 10).await.as_secs_f64() * 1e6);
            for (s, &(connections, per_tx)) in shapes.iter().enumerate() {
                let transactions = concurrent / per_tx;
                par[s][idx].push(concurrently(&db, v, connections, transactions, per_tx).await);
            }
            waiting.done().await;
        }
        println!(
            "round {}: per event (us) 1/tx insert {:.0} notify {:.0} emit {:.0} waiting {:.0}; 8 conns (events/s) insert {:.0} notify {:.0} emit {:.0} waiting {:.0}; 32 conns insert {:.0} emit {:.0} waiting {:.0}",
            round + 1,
            one[0][round],
            one[1][round],
            one[2][round],
            one[3][round],
            par[0][0][round],
            par[0][1][round],
            par[0][2][round],
            par[0][3][round],
            par[2][0][round],
            par[2][2][round],
            par[2][3][round]
        );
    }
    let m =
        |v: &mut Vec<Vec<f64>>| -> Vec<f64> { v.iter_mut().map(|s| common::median(s)).collect() };
    let (one, ten) = (m(&mut one), m(&mut ten));
    let par: Vec<Vec<f64>> = par.iter_mut().map(m).collect();
    drop(conn);
    drop(db);
    for (i, v) in VARIANTS.iter().enumerate() {
        println!(
            "{:<20} 1/tx {:>5.0} us/event  10/tx {:>5.0} us/event  events/s: 8 conns {:>6.0} (10/tx {:>6.0})  32 conns {:>6.0} (10/tx {:>6.0})",
            v.name(),
            one[i],
            ten[i],
            par[0][i],
            par[1][i],
            par[2][i],
            par[3][i]
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
        par[0][1] / par[0][0],
        par[0][1],
        par[0][0]
    );
    for (s, &(connections, per_tx)) in shapes.iter().enumerate() {
        let suffix = if per_tx == 1 { "" } else { "_10_per_tx" };
        println!(
            "emit_{connections}_connections_vs_insert_ratio{suffix}={:.3}",
            par[s][2] / par[s][0]
        );
        println!(
            "emit_relay_waiting_{connections}_connections_vs_insert_ratio{suffix}={:.3}",
            par[s][3] / par[s][0]
        );
    }
    println!("emit_relay_waiting_vs_insert_ratio={:.3}", one[3] / one[0]);
    println!("emit_vs_insert_ratio_10_per_tx={:.3}", ten[2] / ten[0]);
    println!("emit_vs_insert_ratio={:.3}", one[2] / one[0]);
}

/// `transactions` transactions of `per_tx` events spread over `connections` connections;
/// returns events per second.
async fn concurrently(
    db: &TestDb,
    variant: Variant,
    connections: u64,
    transactions: u64,
    per_tx: u64,
) -> f64 {
    let mut conns = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let mut c = PgConnection::connect_with(&db.options)
            .await
            .expect("connect");
        run_variant(&mut c, variant, 2, 1).await;
        conns.push(c);
    }
    let each = transactions / connections;
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                run_variant(&mut c, variant, each, per_tx).await;
                c
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("emitter task");
    }
    (each * connections * per_tx) as f64 / started.elapsed().as_secs_f64()
}
