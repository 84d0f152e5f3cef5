//! `outbox migrate` on an empty database, twice.

use outbox_testkit::TestDb;

use crate::support::{db_url, run};

#[tokio::test]
async fn migrate_creates_the_tables_on_an_empty_database_and_can_run_again() {
    let db = TestDb::empty().await;
    let url = db_url(&db);
    let table_exists = |name: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("select to_regclass($1) is not null")
                .bind(name)
                .fetch_one(&pool)
                .await
                .expect("query the catalog")
        }
    };
    assert!(!table_exists("outbox_events").await);

    let expected: Vec<String> = outbox_runtime::MIGRATOR
        .iter()
        .map(|m| format!("applied {:04} {}", m.version, m.description))
        .collect();
    assert!(expected.len() >= 2, "the outbox has its migrations");
    for round in ["first", "second"] {
        let out = run(["migrate", "--database-url", &url]).await;
        out.expect_code(0).assert_clean();
        let printed: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(printed, expected, "the {round} run prints every migration");
        assert!(table_exists("outbox_events").await);
        assert!(table_exists("outbox_consumed").await);
        assert!(table_exists("outbox_events_unpublished_idx").await);
    }
}
