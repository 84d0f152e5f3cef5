//! `outbox migrate`: apply the outbox's migrations and list them.

use std::process::ExitCode;

use crate::args::DbArgs;
use crate::connect;
use crate::error::Result;

pub async fn run(db: DbArgs) -> Result<ExitCode> {
    let pool = connect::pool(&db, 1).await?;
    outbox_runtime::migrate(&pool).await?;
    // the outbox's own entries: the table may also hold the service's migrations
    let ours: Vec<i64> = outbox_runtime::MIGRATOR.iter().map(|m| m.version).collect();
    let applied: Vec<(i64, String)> = sqlx::query_as(
        "select version, description from _sqlx_migrations \
          where version = any($1) order by version",
    )
    .bind(&ours)
    .fetch_all(&pool)
    .await?;
    for (version, description) in applied {
        println!("applied {version:04} {description}");
    }
    Ok(ExitCode::SUCCESS)
}
