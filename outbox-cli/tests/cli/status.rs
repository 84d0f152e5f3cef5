//! `outbox status`: the table's figures as JSON and as a table, the thresholds, and TLS to a
//! private Postgres with each of its failures named.

use std::collections::BTreeMap;
use std::path::Path;

use outbox_testkit::{PgServer, PgServerConfig, TestCa, TestDb};
use serde_json::Value;
use uuid::Uuid;

use crate::support::{db_url, run, DB_PASSWORD};

/// Inserts a row of `event_type` in a known state, created `age_secs` ago.
async fn insert_row(db: &TestDb, event_type: &str, attempts: i32, published: bool, age_secs: f64) {
    sqlx::query(
        "insert into outbox_events \
           (id, event_type, source, subject, time, data, created_at, published_at, attempts) \
         values ($1, $2, 'cli-test', 'platform', now(), '{}'::jsonb, \
                 now() - make_interval(secs => $3), \
                 case when $4 then now() end, $5)",
    )
    .bind(Uuid::now_v7())
    .bind(event_type)
    .bind(age_secs)
    .bind(published)
    .bind(attempts)
    .execute(&db.pool)
    .await
    .expect("insert a row");
}

#[tokio::test]
async fn status_reports_the_table_and_exits_by_its_thresholds() {
    let db = TestDb::new().await;
    // a.one.created: 3 new, 2 retried once, 1 at the cap (5), 4 published
    for _ in 0..3 {
        insert_row(&db, "a.one.created", 0, false, 5.0).await;
    }
    for _ in 0..2 {
        insert_row(&db, "a.one.created", 1, false, 5.0).await;
    }
    insert_row(&db, "a.one.created", 5, false, 7_200.0).await;
    for _ in 0..4 {
        insert_row(&db, "a.one.created", 0, true, 9_000.0).await;
    }
    // b.two.created: 2 retried twice, 1 past the cap, 1 published
    for _ in 0..2 {
        insert_row(&db, "b.two.created", 2, false, 60.0).await;
    }
    insert_row(&db, "b.two.created", 7, false, 600.0).await;
    insert_row(&db, "b.two.created", 9, true, 9_000.0).await;
    let url = db_url(&db);
    let status = |extra: &[&str]| {
        let mut args = vec![
            "status".to_owned(),
            "--database-url".into(),
            url.clone(),
            "--max-attempts".into(),
            "5".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        run(args)
    };

    let out = status(&["--json"]).await;
    out.expect_code(0).assert_clean();
    let v: Value = serde_json::from_str(&out.stdout).expect("status --json prints JSON");
    assert_eq!(v["unpublished"], 9, "{v:#}");
    assert_eq!(v["at_cap"], 2, "{v:#}");
    assert_eq!(v["max_attempts"], 5, "{v:#}");
    assert_eq!(
        v["attempts"],
        serde_json::json!([[0, 3], [1, 2], [2, 2], [5, 1], [7, 1]]),
        "{v:#}"
    );
    assert_eq!(v["thresholds_crossed"], serde_json::json!([]), "{v:#}");
    let oldest = v["oldest_unpublished_age"].as_f64().expect("an age");
    assert!((7_200.0..86_400.0).contains(&oldest), "{v:#}");
    let by_type: BTreeMap<&str, (i64, i64, f64)> = v["by_type"]
        .as_array()
        .expect("by_type")
        .iter()
        .map(|t| {
            (
                t["event_type"].as_str().expect("event_type"),
                (
                    t["unpublished"].as_i64().expect("unpublished"),
                    t["at_cap"].as_i64().expect("at_cap"),
                    t["oldest_unpublished_age"].as_f64().expect("age"),
                ),
            )
        })
        .collect();
    assert_eq!(by_type.len(), 2, "{v:#}");
    assert_eq!(by_type["a.one.created"].0, 6);
    assert_eq!(by_type["a.one.created"].1, 1);
    assert!(by_type["a.one.created"].2 >= 7_200.0);
    assert_eq!(by_type["b.two.created"].0, 3);
    assert_eq!(by_type["b.two.created"].1, 1);
    assert!((600.0..7_200.0).contains(&by_type["b.two.created"].2));

    // The table shows the same figures.
    let out = status(&[]).await;
    out.expect_code(0).assert_clean();
    let table: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let row = |first: &str| -> Vec<&str> {
        table
            .iter()
            .find(|cells| cells.first() == Some(&first))
            .unwrap_or_else(|| panic!("no `{first}` line in\n{}", out.stdout))
            .clone()
    };
    assert_eq!(row("unpublished"), ["unpublished", "9"]);
    assert_eq!(row("at"), ["at", "attempt", "cap", "(5)", "2"]);
    assert_eq!(
        row("attempts"),
        ["attempts", "0:3", "1:2", "2:2", "5:1", "7:1"]
    );
    assert_eq!(row("oldest")[..2], ["oldest", "unpublished"]);
    assert!(row("oldest")[2].ends_with('h'), "{}", out.stdout);
    let a = row("a.one.created");
    assert_eq!((a[1], a[3]), ("6", "1"), "{}", out.stdout);
    let b = row("b.two.created");
    assert_eq!((b[1], b[3]), ("3", "1"), "{}", out.stdout);
    assert!(!out.stdout.contains("THRESHOLD"), "{}", out.stdout);

    // Thresholds: crossing exits 1 and names it; reaching exactly does not.
    let crossed: [(&[&str], &str); 3] = [
        (&["--max-backlog", "8"], "9 unpublished (max 8)"),
        (
            &["--max-at-cap", "1"],
            "2 row(s) at the attempt cap (max 1)",
        ),
        (&["--max-age", "3600"], "(max 3600s)"),
    ];
    for (flags, says) in crossed {
        let out = status(flags).await;
        out.expect_code(1).assert_clean();
        assert!(
            out.stdout.contains("THRESHOLD: ") && out.stdout.contains(says),
            "{flags:?} names the crossed threshold `{says}`:\n{}",
            out.stdout
        );
        let mut json_flags = flags.to_vec();
        json_flags.push("--json");
        let out = status(&json_flags).await;
        out.expect_code(1);
        let v: Value = serde_json::from_str(&out.stdout).expect("JSON");
        let list = v["thresholds_crossed"].as_array().expect("a list");
        assert_eq!(list.len(), 1, "{v:#}");
        assert!(list[0].as_str().unwrap().contains(says), "{v:#}");
    }
    let all_crossed = status(&["--max-backlog", "0", "--max-at-cap", "0", "--max-age", "1"]).await;
    all_crossed.expect_code(1);
    assert_eq!(
        all_crossed.stdout.matches("THRESHOLD: ").count(),
        3,
        "every crossed threshold is named:\n{}",
        all_crossed.stdout
    );
    let within = status(&[
        "--max-backlog",
        "9",
        "--max-at-cap",
        "2",
        "--max-age",
        "86400",
    ])
    .await;
    within.expect_code(0);
    assert!(!within.stdout.contains("THRESHOLD"), "{}", within.stdout);
}

/// Every subject backing off shows its reason, in the table (grouped by reason, and the
/// subjects listed) and as JSON; a held row shows its cause beside its reason.
#[tokio::test]
async fn status_says_why_each_subject_backs_off() {
    let db = TestDb::new().await;
    // three subjects backing off, two for one reason; one held because no stream captures its
    // type; written as the relay writes its schedule
    let rows = [
        (
            "s-1",
            Some(30),
            "publish failed: maximum messages exceeded (code 503, error code 10077)",
            None,
        ),
        (
            "s-2",
            Some(60),
            "publish failed: maximum messages exceeded (code 503, error code 10077)",
            None,
        ),
        ("s-3", Some(90), "no ack before the batch deadline", None),
        (
            "s-4",
            None,
            "no stream captures `a.one.created`: create one",
            Some("no_stream"),
        ),
    ];
    for (subject, retry_in, reason, cause) in rows {
        sqlx::query(
            "with e as (insert into outbox_events (id, event_type, source, subject, time, data, attempts) \
                        values (gen_random_uuid(), 'a.one.created', 'cli-test', $1, now(), '{}'::jsonb, 1) \
                        returning id) \
             insert into outbox_retries (subject, event_id, retry_at, reason, cause) \
             select $1, e.id, now() + make_interval(secs => $2), $3, $4 from e",
        )
        .bind(subject)
        .bind(retry_in.map(f64::from))
        .bind(reason)
        .bind(cause)
        .execute(&db.pool)
        .await
        .expect("insert a schedule");
    }
    let url = db_url(&db);
    let status = |extra: &[&str]| {
        let mut args = vec!["status".to_owned(), "--database-url".into(), url.clone()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        run(args)
    };

    let out = status(&["--json"]).await;
    out.expect_code(0).assert_clean();
    let v: Value = serde_json::from_str(&out.stdout).expect("status --json prints JSON");
    assert_eq!(v["backing_off"], 3, "{v:#}");
    assert_eq!(
        v["backing_off_reasons"],
        serde_json::json!([
            { "reason": "publish failed: maximum messages exceeded (code 503, error code 10077)", "subjects": 2 },
            { "reason": "no ack before the batch deadline", "subjects": 1 },
        ]),
        "{v:#}"
    );
    let listed: Vec<(&str, &str)> = v["backing_off_subjects"]
        .as_array()
        .expect("the subjects backing off")
        .iter()
        .map(|b| {
            let retry_in = b["retry_in"].as_f64().expect("retry_in");
            assert!((0.0..=90.0).contains(&retry_in), "{b}");
            (
                b["subject"].as_str().expect("subject"),
                b["reason"].as_str().expect("reason"),
            )
        })
        .collect();
    assert_eq!(listed.len(), 3, "{v:#}");
    assert!(
        listed.contains(&("s-3", "no ack before the batch deadline")),
        "{v:#}"
    );
    assert_eq!(v["held"][0]["cause"], "no_stream", "{v:#}");

    let out = status(&[]).await;
    out.expect_code(0).assert_clean();
    for line in [
        "     2 subject(s): publish failed: maximum messages exceeded (code 503, error code 10077)",
        "     1 subject(s): no ack before the batch deadline",
    ] {
        assert!(out.stdout.contains(line), "`{line}` in\n{}", out.stdout);
    }
    for subject in ["s-1", "s-2", "s-3"] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.contains(&format!("subject {subject} ")) && l.contains("retry in")),
            "{subject} listed with its retry in\n{}",
            out.stdout
        );
    }
}

/// `outbox status` over TLS to a private Postgres that accepts only TLS (`ssl = on`, a
/// certificate from a CA made here): `sslmode=verify-full` with the CA works; a wrong CA, a
/// wrong password and a connection without TLS each exit 2 naming their own cause and fix, never
/// "is it running?".
#[tokio::test]
async fn status_over_tls_verifies_the_server_and_names_each_failure() {
    let ca = TestCa::new();
    let pg = PgServer::spawn_config(PgServerConfig {
        tls: Some(ca.issue(&["127.0.0.1"])),
        hba: Some(
            "hostssl all root 127.0.0.1/32 trust\nhostssl all app 127.0.0.1/32 scram-sha-256\n"
                .to_owned(),
        ),
        ..PgServerConfig::default()
    });
    let url = |user: &str, sslmode: &str, root: &Path| {
        format!(
            "postgres://{user}@127.0.0.1:{}/postgres?sslmode={sslmode}&sslrootcert={}",
            pg.port,
            root.display()
        )
    };
    let good = url("root", "verify-full", &ca.cert());
    run(["migrate", "--database-url", &good])
        .await
        .expect_code(0)
        .assert_clean();
    run(["status", "--database-url", &good])
        .await
        .expect_code(0)
        .assert_clean();

    let other = TestCa::new();
    let out = run([
        "status",
        "--database-url",
        &url("root", "verify-full", &other.cert()),
    ])
    .await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("TLS failed")
            && out.stderr.contains("certificate verification failed")
            && out.stderr.contains("sslrootcert=<file>")
            && !out.stderr.contains("is it running"),
        "{}",
        out.stderr
    );

    let out = run([
        "status",
        "--database-url",
        &url(&format!("app:{DB_PASSWORD}"), "verify-full", &ca.cert()),
    ])
    .await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("refused the login")
            && out.stderr.contains("app:***@")
            && !out.stderr.contains("is it running"),
        "{}",
        out.stderr
    );

    let out = run([
        "status",
        "--database-url",
        &url("root", "disable", &ca.cert()),
    ])
    .await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("no encryption") && out.stderr.contains("sslmode=verify-full"),
        "{}",
        out.stderr
    );
}
