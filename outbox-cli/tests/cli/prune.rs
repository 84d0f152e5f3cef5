//! `outbox prune`: the published rows past the keep go, paced; a dry run and refused flags
//! delete nothing; unpublished rows stay however old.

use outbox_testkit::TestDb;
use uuid::Uuid;

use crate::support::{db_url, emit_numbered, run};

#[tokio::test]
async fn prune_deletes_only_old_published_rows() {
    let db = TestDb::new().await;
    let url = db_url(&db);
    let event_type = "prune.row.changed";
    // two rows published two hours ago, one published now, one unpublished and old
    let ids = emit_numbered(&db.pool, event_type, "account-1", 0..3).await;
    sqlx::query("update outbox_events set published_at = now() where id = any($1)")
        .bind(&ids)
        .execute(&db.pool)
        .await
        .expect("publish three rows");
    sqlx::query(
        "update outbox_events set published_at = now() - interval '2 hours' where id = any($1)",
    )
    .bind(&ids[..2])
    .execute(&db.pool)
    .await
    .expect("age two rows");
    let pending = emit_numbered(&db.pool, event_type, "account-9", [9]).await[0];
    sqlx::query("update outbox_events set created_at = now() - interval '3 hours' where id = $1")
        .bind(pending)
        .execute(&db.pool)
        .await
        .expect("age the unpublished row");
    let remaining = || async {
        let mut ids: Vec<Uuid> = sqlx::query_scalar("select id from outbox_events")
            .fetch_all(&db.pool)
            .await
            .expect("ids");
        ids.sort();
        ids
    };
    let mut all = vec![ids[0], ids[1], ids[2], pending];
    all.sort();
    // `outbox prune` keeping an hour of published rows, with `more` arguments
    let prune_keeping_an_hour = |more: &[&str]| {
        let args = ["prune", "--database-url", &url, "--keep-hours", "1"];
        let args: Vec<String> = args.iter().chain(more).map(|a| a.to_string()).collect();
        run(args)
    };

    let out = prune_keeping_an_hour(&["--dry-run"]).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout.trim(),
        "would delete 2 published row(s) older than 1h (dry run)"
    );
    assert_eq!(remaining().await, all, "a dry run deletes nothing");

    // a batch size that would never finish a delete loop, and a busy share outside 1 to 100
    // percent, are refused before connecting
    for (flag, bad) in [
        ("--batch-size", "0"),
        ("--busy-percent", "0"),
        ("--busy-percent", "101"),
    ] {
        let out = run(["prune", "--database-url", &url, flag, bad]).await;
        out.expect_code(2).assert_clean();
        assert!(
            out.stderr.contains(&format!("'{bad}'")) && out.stderr.contains(flag),
            "names the flag and the value:\n{}",
            out.stderr
        );
        assert_eq!(remaining().await, all, "a refused prune deletes nothing");
    }
    // a dedupe keep that is no duration is refused before the published rows are pruned
    let out = prune_keeping_an_hour(&["--keep-dedupe-hours=-1"]).await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr
            .contains("--keep-dedupe-hours must be a non-negative number"),
        "names the flag:\n{}",
        out.stderr
    );
    assert_eq!(remaining().await, all, "a refused prune deletes nothing");

    // one row a statement, paced: the pauses between full batches lose nothing
    let out = prune_keeping_an_hour(&["--batch-size", "1", "--busy-percent", "50"]).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout.trim(),
        "deleted 2 published row(s) older than 1h"
    );
    let mut kept = vec![ids[2], pending];
    kept.sort();
    assert_eq!(
        remaining().await,
        kept,
        "only the old published rows go; the unpublished one stays however old"
    );
}
