//! What operators see and do beside retention (in `retention` and `retention_passes`): an
//! invalid index a failed concurrent build left, rebuilt by migrate, and the backlog gauges.

use outbox_testkit::suite::Ctx;
use uuid::Uuid;

/// Emits and commits an event of `event_type` from `ops` about `subject`, payload `{"n": n}`.

#[tokio::test]
async fn migrate_builds_again_a_published_index_a_failed_concurrent_build_left_invalid() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    let valid = || async {
        sqlx::query_scalar::<_, Option<bool>>(
            "select i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid \
              where c.relname = 'outbox_events_published_idx'",
        )
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten()
    };
    assert_eq!(valid().await, Some(true), "0009 builds the index");

    for recorded in [false, true] {
        sqlx::query("drop index outbox_events_published_idx")
            .execute(pool)
            .await
            .unwrap();
        if !recorded {
            // the build failed, so sqlx did not record 0009
            sqlx::query("delete from _sqlx_migrations where version = 9")
                .execute(pool)
                .await
                .unwrap();
        }
        // a concurrent build that fails: it waits for an older snapshot and times out
        let mut old = pool.begin().await.unwrap();
        sqlx::query("set transaction isolation level repeatable read")
            .execute(&mut *old)
            .await
            .unwrap();
        sqlx::query("select count(*) from outbox_events")
            .execute(&mut *old)
            .await
            .unwrap();
        let mut build = pool.acquire().await.unwrap();
        sqlx::query("set statement_timeout = '500ms'")
            .execute(&mut *build)
            .await
            .unwrap();
        let failed = sqlx::raw_sql(
            "create index concurrently outbox_events_published_idx on outbox_events (published_at) \
             where published_at is not null",
        )
        .execute(&mut *build)
        .await;
        assert!(failed.is_err(), "the build times out");
        sqlx::query("reset statement_timeout")
            .execute(&mut *build)
            .await
            .unwrap();
        drop(build);
        old.rollback().await.unwrap();
        assert_eq!(
            valid().await,
            Some(false),
            "the failed build left it invalid"
        );

        outbox_runtime::migrate(pool).await.unwrap();
        assert_eq!(
            valid().await,
            Some(true),
            "migrate built it again (0009 recorded before: {recorded})"
        );
    }
}

/// Inserts an unpublished row about `subject`, created `age_secs` ago, with `attempts`.
async fn unpublished_row(pool: &sqlx::PgPool, subject: &str, attempts: i32, age_secs: f64) -> Uuid {
    let id = Uuid::now_v7();
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, attempts) \
         values ($1, 'ops.row.changed', 'ops', $2, now(), '{}'::jsonb, \
                 now() - make_interval(secs => $3), $4)",
    )
    .bind(id)
    .bind(subject)
    .bind(age_secs)
    .bind(attempts)
    .execute(pool)
    .await
    .expect("insert a row");
    id
}

#[tokio::test]
async fn the_oldest_unpublished_age_leaves_held_subjects_out_and_their_rows_have_a_gauge_of_their_own(
) {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use outbox_runtime::metrics as m;
    use outbox_runtime::status;

    let db = outbox_testkit::TestDb::new().await;
    let pool = &db.pool;
    // subject `held`: its head at the cap, two hours old, and a row behind it; subject
    // `backing`: a row retried in a minute, ten minutes old; subject `fresh`: a new row
    let head = unpublished_row(pool, "held", 20, 7_200.0).await;
    unpublished_row(pool, "held", 0, 3_600.0).await;
    let backing = unpublished_row(pool, "backing", 2, 600.0).await;
    unpublished_row(pool, "fresh", 0, 5.0).await;
    // the relay's schedules for them, as it writes them
    sqlx::query(
        "insert into outbox_retries (subject, event_id, retry_at, reason) values \
           ('held', $1, null, 'it is at the attempt cap (20 of 20)'), \
           ('backing', $2, now() + interval '1 minute', 'maximum messages exceeded')",
    )
    .bind(head)
    .bind(backing)
    .execute(pool)
    .await
    .expect("schedules");

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let s = {
        // this test's thread only: other tests' relays refresh the process's gauges
        let _local = metrics::set_default_local_recorder(&recorder);
        status::record_gauges(pool, 20).await.expect("gauges")
    };
    let gauges: std::collections::HashMap<String, f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(v) => Some((key.key().name().to_owned(), v.into_inner())),
            _ => None,
        })
        .collect();

    assert_eq!(
        (
            s.unpublished,
            s.held_unpublished,
            s.held_total,
            s.backing_off
        ),
        (4, 2, 1, 1),
        "{s:?}"
    );
    let oldest = s
        .oldest_unpublished_age
        .expect("rows to publish")
        .as_secs_f64();
    assert!(
        (600.0..700.0).contains(&oldest),
        "the backing-off row is the oldest the relay should publish, not the held one: {s:?}"
    );
    let held = s.oldest_held_age.expect("held rows").as_secs_f64();
    assert!((7_200.0..7_300.0).contains(&held), "{s:?}");
    assert_eq!(s.by_type.len(), 1);
    assert_eq!(s.by_type[0].unpublished, 4);
    assert_eq!(
        s.by_type[0].oldest_unpublished_age,
        s.oldest_unpublished_age
    );
    assert!(
        (600.0..700.0).contains(&gauges[m::OLDEST_UNPUBLISHED_AGE]),
        "{gauges:?}"
    );
    assert_eq!(gauges[m::UNPUBLISHED], 4.0);
    assert_eq!(gauges[m::UNPUBLISHED_HELD], 2.0);
    assert_eq!(gauges[m::ROWS_HELD], 1.0);
    assert_eq!(gauges[m::ROWS_AT_CAP], 1.0);

    // Only the held subject left: nothing for the relay to publish, however old the held rows.
    sqlx::query("delete from outbox_events where subject <> 'held'")
        .execute(pool)
        .await
        .expect("publish the others");
    let s = status::status(pool, 20).await.expect("status");
    assert_eq!((s.unpublished, s.held_unpublished), (2, 2));
    assert_eq!(s.oldest_unpublished_age, None, "{s:?}");
}
