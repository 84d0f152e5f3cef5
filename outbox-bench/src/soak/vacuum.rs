//! Autovacuum's work, when the server runs without it.
//!
//! A soak measures the table's size over time, which is what vacuum keeps in check: every mark
//! and every delete leaves a dead row version. Test servers often run with `autovacuum = off`
//! (the shared one here does); there the soak does what autovacuum would, with the server's
//! own autovacuum settings: each naptime, a table whose dead rows (or rows inserted since its
//! last vacuum) pass the thresholds is vacuumed, throttled by autovacuum's cost delay and
//! limit, and one whose changes pass the analyze threshold is analyzed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

/// The server's autovacuum settings that decide when and how hard it works.
#[derive(Debug, Clone)]
pub struct Settings {
    on: bool,
    naptime: Duration,
    vacuum_threshold: f64,
    vacuum_scale: f64,
    insert_threshold: f64,
    insert_scale: f64,
    analyze_threshold: f64,
    analyze_scale: f64,
    cost_delay_ms: f64,
    cost_limit: i64,
}

impl Settings {
    /// Reads them from `pg_settings`.
    pub async fn read(conn: &mut PgConnection) -> Settings {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "select name, setting from pg_settings where name like 'autovacuum%' \
                 or name = 'vacuum_cost_limit'",
        )
        .fetch_all(&mut *conn)
        .await
        .expect("read the autovacuum settings");
        let get = |name: &str| {
            rows.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .unwrap_or("")
        };
        let num = |name: &str, default: f64| get(name).parse().unwrap_or(default);
        let limit = num("autovacuum_vacuum_cost_limit", -1.0) as i64;
        Settings {
            on: get("autovacuum") == "on",
            naptime: Duration::from_secs_f64(num("autovacuum_naptime", 60.0)),
            vacuum_threshold: num("autovacuum_vacuum_threshold", 50.0),
            vacuum_scale: num("autovacuum_vacuum_scale_factor", 0.2),
            insert_threshold: num("autovacuum_vacuum_insert_threshold", 1000.0),
            insert_scale: num("autovacuum_vacuum_insert_scale_factor", 0.2),
            analyze_threshold: num("autovacuum_analyze_threshold", 50.0),
            analyze_scale: num("autovacuum_analyze_scale_factor", 0.1),
            cost_delay_ms: num("autovacuum_vacuum_cost_delay", 2.0),
            cost_limit: if limit > 0 {
                limit
            } else {
                num("vacuum_cost_limit", 200.0) as i64
            },
        }
    }

    /// Whether the server's own autovacuum runs.
    pub fn server_runs_it(&self) -> bool {
        self.on
    }

    /// `every 60 s, cost delay 2 ms, limit 200`.
    pub fn describe(&self) -> String {
        format!(
            "every {:.0} s, thresholds {} + {} x rows (dead), {} + {} x rows (inserted), cost delay {} ms, limit {}",
            self.naptime.as_secs_f64(),
            self.vacuum_threshold,
            self.vacuum_scale,
            self.insert_threshold,
            self.insert_scale,
            self.cost_delay_ms,
            self.cost_limit
        )
    }
}

/// Vacuums and analyzes the run's tables as autovacuum would, on `conn`, until `stop`; counts
/// the vacuums in `vacuums`.
pub async fn run(
    mut conn: PgConnection,
    settings: Settings,
    stop: Arc<AtomicBool>,
    vacuums: Arc<AtomicU64>,
) {
    let throttle = format!(
        "set vacuum_cost_delay = '{}ms'; set vacuum_cost_limit = {}",
        settings.cost_delay_ms, settings.cost_limit
    );
    // the text is built from the server's own numeric settings
    sqlx::raw_sql(sqlx::AssertSqlSafe(throttle))
        .execute(&mut conn)
        .await
        .expect("throttle vacuum as autovacuum is");
    let mut next = tokio::time::Instant::now() + settings.naptime;
    while !stop.load(Ordering::Relaxed) {
        if tokio::time::Instant::now() < next {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        next += settings.naptime;
        let tables: Vec<(String, f64, i64, i64, i64)> = sqlx::query_as(
            "select s.relname::text, greatest(c.reltuples, 0)::float8, s.n_dead_tup, \
                    s.n_ins_since_vacuum, s.n_mod_since_analyze \
               from pg_stat_user_tables s join pg_class c on c.oid = s.relid",
        )
        .fetch_all(&mut conn)
        .await
        .expect("read the tables' statistics");
        for (table, rows, dead, inserted, modified) in tables {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let s = &settings;
            let vacuum = dead as f64 > s.vacuum_threshold + s.vacuum_scale * rows
                || inserted as f64 > s.insert_threshold + s.insert_scale * rows;
            let analyze = modified as f64 > s.analyze_threshold + s.analyze_scale * rows;
            let statement = match (vacuum, analyze) {
                (true, true) => "vacuum (analyze)",
                (true, false) => "vacuum",
                (false, true) => "analyze",
                (false, false) => continue,
            };
            // the name comes from the catalog, quoted
            let sql = format!("{statement} \"{}\"", table.replace('"', "\"\""));
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
            {
                println!("  vacuum of {table} failed: {e}");
            } else if vacuum {
                vacuums.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let _ = conn.close().await;
}
