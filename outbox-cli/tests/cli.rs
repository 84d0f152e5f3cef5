//! The `outbox` command against a real Postgres and nats-server: migrate, relay (backlog,
//! SIGTERM, restart, progress, metrics), status, check, gen, unblock, stream ensure, tail, prune
//! and `--help`.
//!
//! Every test runs the built binary with `--database-url` / `--nats-url` given explicitly, on a
//! fresh database; URLs carry passwords (Postgres trust auth and an open nats-server accept any)
//! so that every test can check that no password is ever printed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, free_port, open_schemas, raw_event, NatsServer, PgServer,
    PgServerConfig, TestCa, TestDb,
};
use serde_json::Value;
use uuid::Uuid;

/// The password put in every Postgres URL given to the command.
const DB_PASSWORD: &str = "pg-s3cret-9f2c";
/// The password put in every NATS URL given to the command.
const NATS_PASSWORD: &str = "nats-s3cret-41ab";

/// How long any wait on the command or the services may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(120);

/// The `outbox` binary with a clean environment: no inherited connection settings.
fn outbox() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox"));
    for var in [
        "DATABASE_URL",
        "NATS_URL",
        "NATS_CREDS",
        "NATS_NKEY",
        "NATS_USER",
        "NATS_PASSWORD",
        "NATS_TOKEN",
        "OUTBOX_LOG",
        "CARGO_MANIFEST_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// What a finished command printed.
#[derive(Debug)]
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Output {
    /// Fails unless the command exited with `code`, showing what it printed.
    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit code {code}\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    /// Fails if a password or a colour code appears in anything the command printed.
    fn assert_clean(&self) -> &Self {
        assert_no_secret(&self.stdout);
        assert_no_secret(&self.stderr);
        self
    }
}

fn assert_no_secret(text: &str) {
    for secret in [DB_PASSWORD, NATS_PASSWORD] {
        assert!(!text.contains(secret), "a password was printed:\n{text}");
    }
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in output that is not a terminal:\n{text:?}"
    );
}

/// Runs `outbox <args>` to completion (on a blocking thread, so the test's runtime keeps going).
async fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = outbox();
    cmd.args(args);
    finish(cmd).await
}

/// Runs `cmd` to completion on a blocking thread and collects what it printed.
async fn finish(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        let out = cmd.output().expect("run the outbox binary");
        Output {
            code: out.status.code(),
            stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
            stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
        }
    })
    .await
    .expect("the command thread")
}

/// `url` with `user:password@` put in front of its host (unless it has credentials already).
fn with_password(url: &str, user: &str, password: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) if !rest.split('/').next().unwrap_or("").contains('@') => {
            format!("{scheme}://{user}:{password}@{rest}")
        }
        _ => url.to_owned(),
    }
}

/// The URL of the test's database, with a password.
fn db_url(db: &TestDb) -> String {
    with_password(&db.url(), "root", DB_PASSWORD)
}

/// The shared NATS server's URL, with a user and password.
fn nats_url() -> String {
    with_password(&outbox_testkit::nats_url(), "outbox", NATS_PASSWORD)
}

/// A running `outbox` process whose stderr is collected line by line.
struct Running {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    closed: Arc<AtomicBool>,
}

impl Running {
    fn spawn(args: &[&str]) -> Running {
        let mut child = outbox()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the outbox binary");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let (lines, eof) = (stderr.clone(), closed.clone());
        let pipe = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                match line {
                    Ok(line) => lines.lock().unwrap().push(line),
                    Err(_) => break,
                }
            }
            eof.store(true, Ordering::SeqCst);
        });
        Running {
            child,
            stderr,
            closed,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Sends SIGTERM to this child only, by its pid.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", self.child.id());
    }

    /// Waits for the exit and returns the exit code (`None` when a signal killed it).
    async fn wait(&mut self) -> Option<i32> {
        let mut code = None;
        eventually(PATIENCE, "the outbox process to exit", || {
            let status = self.child.try_wait().expect("poll the child");
            code = status.map(|s| s.code());
            std::future::ready(status.is_some())
        })
        .await;
        // the reader thread has the last lines once the pipe closes
        eventually(PATIENCE, "the outbox process's stderr to close", || {
            std::future::ready(self.closed.load(Ordering::SeqCst))
        })
        .await;
        code.flatten()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn published_ids(db: &TestDb) -> HashSet<Uuid> {
    sqlx::query_scalar("select id from outbox_events where published_at is not null")
        .fetch_all(&db.pool)
        .await
        .expect("published ids")
        .into_iter()
        .collect()
}

async fn count_published(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from outbox_events where published_at is not null")
        .fetch_one(&db.pool)
        .await
        .expect("count published rows")
}

/// GET /metrics on `addr` with a bare TCP connection; the body, or `None` if nothing answers.
fn scrape(addr: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The sum of a counter's samples over its labels in Prometheus text.
fn counter_total(metrics: &str, name: &str) -> Option<f64> {
    let samples: Vec<f64> = metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

#[tokio::test]
async fn help_works_on_every_subcommand() {
    let top = run(["--help"]).await;
    top.expect_code(0);
    // the subcommands, as the help lists them
    let mut commands: Vec<String> = top
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    for expected in [
        "migrate", "relay", "status", "check", "lock", "gen", "tail", "unblock", "prune", "stream",
    ] {
        assert!(
            commands.iter().any(|c| c == expected),
            "`outbox --help` does not list `{expected}`:\n{}",
            top.stdout
        );
    }
    commands.push("stream ensure".into());
    for command in &commands {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.push("--help");
        let out = run(&args).await;
        out.expect_code(0);
        assert!(
            out.stdout.contains(&format!("Usage: outbox {command}")),
            "`outbox {command} --help` shows no usage:\n{}",
            out.stdout
        );
    }
}

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

/// Inserts `n` unpublished rows of `event_type` over 50 subjects, in transactions of 5,000,
/// each row with its own `created_at`.
async fn fill_backlog(db: &TestDb, event_type: &str, n: i64) {
    let mut from = 1;
    while from <= n {
        let to = (from + 4_999).min(n);
        let mut tx = db.pool.begin().await.expect("begin");
        sqlx::query(
            "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
             select gen_random_uuid(), $1, 'cli-test', 'account-' || (i % 50), now(), \
                    jsonb_build_object('n', i), clock_timestamp() \
               from generate_series($2::bigint, $3::bigint) as i",
        )
        .bind(event_type)
        .bind(from)
        .bind(to)
        .execute(&mut *tx)
        .await
        .expect("insert the backlog");
        tx.commit().await.expect("commit");
        from = to + 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_drains_a_backlog_stops_on_sigterm_with_nothing_half_done_and_resumes() {
    const TOTAL: i64 = 20_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("relay.row.changed");
    fill_backlog(&ctx.db, &event_type, TOTAL).await;
    let url = db_url(&ctx.db);
    let nats = nats_url();
    let relay_args = |metrics: &str| -> Vec<String> {
        [
            "relay",
            "--database-url",
            &url,
            "--nats-url",
            &nats,
            "--subject",
            &event_type,
            "--batch-size",
            "100",
            "--metrics-addr",
            metrics,
        ]
        .map(str::to_owned)
        .to_vec()
    };

    // First run: stopped by SIGTERM while draining.
    let args = relay_args(&format!("127.0.0.1:{}", free_port()));
    let mut relay = Running::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    eventually(PATIENCE, "the relay to publish some rows", || async {
        count_published(&ctx.db).await > 0
    })
    .await;
    relay.terminate();
    let code = relay.wait().await;
    let log = relay.stderr();
    assert_eq!(code, Some(0), "the relay exits 0 on SIGTERM:\n{log}");
    assert_no_secret(&log);
    assert!(
        log.contains("stopping: finishing the batch in progress")
            && log.contains("relay stopped cleanly"),
        "the relay says it stops cleanly:\n{log}"
    );

    let published = published_ids(&ctx.db).await;
    assert!(
        (published.len() as i64) < TOTAL,
        "SIGTERM arrived after the whole backlog was published; the test needs a larger backlog"
    );
    let stream_ids: HashSet<Uuid> = ctx
        .read_stream()
        .await
        .iter()
        .map(|m| m.msg_id.parse().expect("Nats-Msg-Id is a uuid"))
        .collect();
    let missing: Vec<&Uuid> = published.difference(&stream_ids).take(5).collect();
    assert!(
        missing.is_empty(),
        "rows marked published are not in the stream: {missing:?}"
    );
    let unmarked: Vec<&Uuid> = stream_ids.difference(&published).take(5).collect();
    assert!(
        unmarked.is_empty(),
        "the stream holds events whose rows are not marked published (a batch was cut short): {unmarked:?}"
    );

    // Second run: drains the rest, reports progress and serves metrics.
    let remaining = TOTAL - published.len() as i64;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let args = relay_args(&metrics_addr);
    let mut relay = Running::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    eventually(PATIENCE, "the relay to drain the rest", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    let mut scraped = String::new();
    eventually(
        PATIENCE,
        "outbox_events_published_total to count the rows this run published",
        || {
            scraped = scrape(&metrics_addr).unwrap_or_default();
            let total = counter_total(&scraped, "outbox_events_published_total");
            std::future::ready(total == Some(remaining as f64))
        },
    )
    .await;
    assert!(
        scraped.contains(&format!(
            "outbox_events_published_total{{event_type=\"{event_type}\"}} {remaining}"
        )),
        "the counter is labelled with the event type:\n{scraped}"
    );
    // histograms are exported with their buckets (a summary has none), so that
    // histogram_quantile works on them and they aggregate across replicas
    for (name, buckets) in outbox_runtime::metrics::histogram_buckets() {
        let lines: Vec<&str> = scraped
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains("le=\""))
            .collect();
        assert!(
            lines.len() > buckets.len(),
            "histogram `{name}` has {} bucket lines, expected its {} bounds and +Inf:\n{scraped}",
            lines.len(),
            buckets.len()
        );
        assert!(
            lines.iter().any(|l| l.contains("le=\"+Inf\"")),
            "histogram `{name}` has no +Inf bucket:\n{scraped}"
        );
        assert!(
            !scraped.contains(&format!("{name}{{quantile=")),
            "histogram `{name}` is exported as a summary:\n{scraped}"
        );
    }
    assert!(
        scraped.lines().any(|l| l.starts_with(&format!(
            "outbox_publish_lag_seconds_bucket{{event_type=\"{event_type}\","
        ))),
        "the publish lag is labelled with the event type:\n{scraped}"
    );
    // the backlog gauges come from the relay itself, refreshed while it runs
    for gauge in [
        "outbox_unpublished ",
        "outbox_oldest_unpublished_age_seconds ",
        "outbox_rows_at_attempt_cap 0",
    ] {
        assert!(
            scraped.lines().any(|l| l.starts_with(gauge)),
            "gauge `{gauge}` missing from /metrics:\n{scraped}"
        );
    }
    // and the time of their last refresh, which an alert compares with the clock
    let refreshed_at = scraped
        .lines()
        .find_map(|l| l.strip_prefix("outbox_gauges_refreshed_at_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no refresh time in /metrics:\n{scraped}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs_f64();
    assert!(
        (now - 60.0..=now).contains(&refreshed_at),
        "refreshed at {refreshed_at}, now {now}"
    );
    // The progress line is a plain log line every 10 s when stderr is not a terminal; once the
    // backlog is drained, the next one says so.
    let backlog_of = |line: &str| -> Option<i64> {
        line.split("backlog")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let mut progress = String::new();
    eventually(
        PATIENCE,
        "a progress log line with an empty backlog",
        || {
            progress = relay
                .stderr()
                .lines()
                .find(|l| l.contains("published/s") && backlog_of(l) == Some(0))
                .unwrap_or_default()
                .to_owned();
            std::future::ready(!progress.is_empty())
        },
    )
    .await;
    assert!(progress.contains(" INFO "), "a plain log line: {progress}");
    assert!(progress.contains("at cap 0"), "{progress}");
    relay.terminate();
    let code = relay.wait().await;
    let log = relay.stderr();
    assert_eq!(code, Some(0), "the relay exits 0 on SIGTERM:\n{log}");
    assert_no_secret(&log);

    let messages = ctx.read_stream().await;
    let ids: HashSet<Uuid> = messages
        .iter()
        .map(|m| m.msg_id.parse().expect("Nats-Msg-Id is a uuid"))
        .collect();
    assert_eq!(messages.len() as i64, TOTAL, "each row is stored once");
    assert_eq!(ids, published_ids(&ctx.db).await, "every row, by its id");
    ctx.delete_stream().await;
}

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

#[tokio::test]
async fn unreachable_services_exit_2_naming_the_redacted_url_and_the_fix() {
    let port = free_port();
    let url = format!("postgres://app:{DB_PASSWORD}@127.0.0.1:{port}/billing");
    for command in ["status", "migrate", "unblock --all", "prune"] {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.extend(["--database-url", &url]);
        let out = run(&args).await;
        out.expect_code(2).assert_clean();
        assert!(
            out.stderr.contains(&format!(
                "cannot connect to Postgres at postgres://app:***@127.0.0.1:{port}/billing"
            )) && out.stderr.contains("scripts/services"),
            "`outbox {command}` names the redacted URL and the fix:\n{}",
            out.stderr
        );
        assert!(
            out.stderr.contains("refused"),
            "`outbox {command}` says why it cannot connect:\n{}",
            out.stderr
        );
    }

    // The relay: Postgres reachable, NATS not; the NATS password may also come from the
    // environment.
    let db = TestDb::new().await;
    let nats_port = free_port();
    let out = run([
        "relay",
        "--database-url",
        &db_url(&db),
        "--nats-url",
        &format!("nats://outbox:{NATS_PASSWORD}@127.0.0.1:{nats_port}"),
    ])
    .await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains(&format!(
            "cannot connect to NATS at nats://outbox:***@127.0.0.1:{nats_port}"
        )) && out.stderr.contains("scripts/services"),
        "{}",
        out.stderr
    );
    let mut cmd = outbox();
    cmd.args([
        "tail",
        "--nats-url",
        &format!("nats://127.0.0.1:{nats_port}"),
        "a.b.c",
    ])
    .env("NATS_USER", "outbox")
    .env("NATS_PASSWORD", NATS_PASSWORD);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run outbox tail"))
        .await
        .expect("thread");
    let out = Output {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    };
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("cannot connect to NATS"),
        "{}",
        out.stderr
    );
}

/// A folder of event schemas, each problem in its own file.
fn broken_schemas() -> (
    tempfile::TempDir,
    Vec<(&'static str, &'static str, &'static str)>,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let files: [(&str, &str); 5] = [
        (
            "billing.Invoice.paid.schema.json",
            r#"{ "title": "InvoicePaid", "type": "object" }"#,
        ),
        (
            "billing.invoice.sent.schema.json",
            "{\n  \"title\": \"InvoiceSent\",\n  \"type\": \"object\",\n}",
        ),
        (
            "billing.invoice.voided.schema.json",
            r#"{ "type": "object", "properties": { "n": { "type": "integer" } } }"#,
        ),
        (
            "billing.invoice.created.schema.json",
            r#"{ "title": "InvoiceCreated", "type": "object", "x-outbox-subject": "invoice_id",
                 "required": ["id"], "properties": { "id": { "type": "string" } } }"#,
        ),
        (
            "billing.invoice.issued.schema.json",
            r#"{ "title": "InvoiceIssued", "type": "object", "x-outbox-subject": "id",
                 "required": ["id"], "properties": { "id": { "type": "string" } } }"#,
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write a schema");
    }
    // (file, where, what): every problem `check` must report
    let problems = vec![
        (
            "billing.Invoice.paid.schema.json",
            "invalid event type `billing.Invoice.paid` in the file name",
            "rename the file",
        ),
        (
            "billing.invoice.sent.schema.json",
            "at the root: not valid JSON",
            "fix the syntax",
        ),
        (
            "billing.invoice.voided.schema.json",
            "at the root: the schema has no `title`",
            "add one",
        ),
        (
            "billing.invoice.created.schema.json",
            "at /x-outbox-subject: `x-outbox-subject` names `invoice_id`, which is not in `properties`",
            "name an existing property",
        ),
    ];
    (dir, problems)
}

#[tokio::test]
async fn check_lists_every_problem_with_its_file_and_pointer() {
    let (dir, problems) = broken_schemas();
    let out = run([std::ffi::OsStr::new("check"), dir.path().as_os_str()]).await;
    out.expect_code(1);
    let lines: Vec<&str> = out.stdout.lines().collect();
    for (file, at, fix) in &problems {
        let path = dir.path().join(file);
        let prefix = format!("{}: {at}", path.display());
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&prefix) && l.contains(fix)),
            "no line `{prefix} ... {fix}` in\n{}",
            out.stdout
        );
    }
    assert!(
        !out.stdout.contains("billing.invoice.issued"),
        "the valid schema has no problem:\n{}",
        out.stdout
    );
    assert_eq!(
        lines.last().copied(),
        Some(format!("{} problem(s) in {}", problems.len(), dir.path().display()).as_str()),
        "{}",
        out.stdout
    );
    assert_eq!(lines.len(), problems.len() + 1, "{}", out.stdout);

    let schemas = repo_root().join("schemas/events");
    let out = run([std::ffi::OsStr::new("check"), schemas.as_os_str()]).await;
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), format!("{}: ok", schemas.display()));
}

#[tokio::test]
async fn lock_then_check_fails_on_a_breaking_change_until_it_is_allowed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let schemas = dir.path().join("events");
    std::fs::create_dir(&schemas).unwrap();
    let file = schemas.join("billing.invoice.paid.schema.json");
    let write = |required: &str| {
        std::fs::write(
            &file,
            format!(
                r#"{{ "title": "InvoicePaid", "type": "object", "required": [{required}],
                     "properties": {{ "id": {{ "type": "string" }}, "note": {{ "type": "string" }} }} }}"#
            ),
        )
        .unwrap()
    };
    let lock_file = dir.path().join("events.lock");
    let shown = |p: &std::path::Path| p.display().to_string();
    write(r#""id""#);

    let out = run([std::ffi::OsStr::new("lock"), schemas.as_os_str()]).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout,
        format!(
            "billing.invoice.paid: new\nwrote {} (1 event type(s))\n",
            shown(&lock_file)
        )
    );
    let out = run([std::ffi::OsStr::new("lock"), schemas.as_os_str()]).await;
    out.expect_code(0);
    assert!(
        out.stdout.ends_with(&format!(
            "{} is up to date (1 event type(s))\n",
            shown(&lock_file)
        )),
        "{}",
        out.stdout
    );

    // `note` becomes required: events published before may lack it.
    write(r#""id", "note""#);
    let out = run([std::ffi::OsStr::new("check"), schemas.as_os_str()]).await;
    out.expect_code(1);
    for says in [
        "billing.invoice.paid.schema.json: 2 breaking changes to the released event type `billing.invoice.paid`",
        "  - at /required: `note` became required",
        "    required-added (wire): breaks new consumers",
        "rust-field-type-changed (rust)",
        "publish the new shape as the new major type `billing.invoice.paid.v2`",
        "--allow-breaking billing.invoice.paid",
    ] {
        assert!(out.stdout.contains(says), "no `{says}` in\n{}", out.stdout);
    }
    assert!(
        out.stdout
            .ends_with(&format!("1 problem(s) in {}\n", shown(&schemas))),
        "{}",
        out.stdout
    );
    // At the wire level under `forward`, the change breaks nobody.
    let out = run([
        "check",
        &shown(&schemas),
        "--level",
        "wire",
        "--compatibility-for",
        "billing.invoice.paid=forward",
    ])
    .await;
    out.expect_code(0);
    assert!(
        out.stdout
            .starts_with("note: `billing.invoice.paid` changed compatibly (mode `forward`)"),
        "{}",
        out.stdout
    );

    let out = run([std::ffi::OsStr::new("lock"), schemas.as_os_str()]).await;
    out.expect_code(1);
    assert!(
        out.stdout
            .contains("breaking changes to the released event type"),
        "{}",
        out.stdout
    );
    let out = run([
        "lock",
        &shown(&schemas),
        "--allow-breaking",
        "billing.invoice.paid",
    ])
    .await;
    out.expect_code(0);
    assert!(
        out.stdout.starts_with(
            "billing.invoice.paid: changed incompatibly, allowed by --allow-breaking\n"
        ),
        "{}",
        out.stdout
    );
    let out = run([std::ffi::OsStr::new("check"), schemas.as_os_str()]).await;
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), format!("{}: ok", shown(&schemas)));

    let out = run([
        "check",
        &shown(&schemas),
        "--compatibility-for",
        "billing.invoice.paid",
    ])
    .await;
    out.expect_code(2);
    assert!(out.stderr.contains("expected TYPE=MODE"), "{}", out.stderr);
}

#[test]
fn gen_prints_rust_that_compiles() {
    let schemas = repo_root().join("schemas/events");
    let out = outbox()
        .arg("gen")
        .arg(&schemas)
        .args(["--source", "billing"])
        .output()
        .expect("run outbox gen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "outbox gen failed:\n{stderr}");
    let code = String::from_utf8(out.stdout).expect("utf-8 Rust");
    for title in [
        "SubscriptionCreated",
        "SubscriptionCancelled",
        "SubscriptionPlanChanged",
    ] {
        assert!(
            code.contains(&format!("pub struct {title}")),
            "no `{title}` in the output"
        );
    }
    assert!(code.contains("source = \"billing\""), "{code}");

    // The golden case's expected Rust is compiled by the workspace (`outbox_tests::golden`), so
    // `gen` printing exactly that file proves its output compiles.
    let tests = repo_root().join("tests");
    let out = outbox()
        .current_dir(&tests)
        .args(["gen", "golden/kitchen_sink/schemas", "--source", "golden"])
        .args(["--consumes", "payments.>"])
        .output()
        .expect("run outbox gen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "outbox gen failed:\n{stderr}");
    let expected = std::fs::read_to_string(tests.join("golden/kitchen_sink/expected.rs"))
        .expect("read the golden file");
    // `gen` prints absolute schema paths (the output may be pasted anywhere); the golden
    // file holds them relative to tests/.
    let code = String::from_utf8(out.stdout)
        .expect("utf-8 Rust")
        .replace(&format!("{}/", tests.display()), "");
    assert!(
        code == expected,
        "`outbox gen` differs from tests/golden/kitchen_sink/expected.rs (compiled as outbox_tests::golden)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unblock_republishes_a_held_row_with_its_id() {
    let ctx = Ctx::new().await;
    let event_type = ctx.event_type("unblock.row.changed");
    let url = db_url(&ctx.db);
    let nats = nats_url();
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let mut ids = Vec::new();
    for n in 0..2 {
        let id = emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&event_type, "cli-test", "account-1").numbered(n),
        )
        .await;
        ids.push(id);
    }
    let (stuck, behind) = (ids[0], ids[1]);

    // No stream captures the type yet: the relay's start-up check refuses it ...
    let out = run([
        "relay",
        "--database-url",
        &url,
        "--nats-url",
        &nats,
        "--subject",
        &event_type,
    ])
    .await;
    out.expect_code(2).assert_clean();
    assert!(out.stderr.contains(&event_type), "{}", out.stderr);

    // ... and without the check the broker answers "no responders": the first row is held at
    // once, with its reason, and the second waits behind it.
    let mut relay = Running::spawn(&[
        "relay",
        "--database-url",
        &url,
        "--nats-url",
        &nats,
        "--max-attempts",
        "2",
        "--backoff-base",
        "0.05",
        "--backoff-max",
        "0.2",
        "--poll-interval",
        "0.1",
        "--ack-timeout",
        "1",
    ]);
    let attempts = |id: Uuid| {
        let pool = ctx.pool().clone();
        async move {
            sqlx::query_scalar::<_, i32>("select attempts from outbox_events where id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("the row's attempts")
        }
    };
    eventually(PATIENCE, "the relay to log the held row", || {
        std::future::ready(relay.stderr().lines().any(|l| {
            l.contains("outbox event held")
                && l.contains(&stuck.to_string())
                && l.contains("no stream captures")
        }))
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    assert_no_secret(&relay.stderr());
    assert_eq!(
        attempts(stuck).await,
        1,
        "one attempt: the broker's answer, then held"
    );
    assert_eq!(attempts(behind).await, 0, "held behind it, never attempted");

    let out = run([
        "status",
        "--database-url",
        &url,
        "--max-attempts",
        "2",
        "--max-held",
        "0",
        "--json",
    ])
    .await;
    out.expect_code(1);
    let v: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        (
            v["unpublished"].as_i64(),
            v["held_total"].as_i64(),
            v["at_cap"].as_i64()
        ),
        (Some(2), Some(1), Some(0))
    );
    assert_eq!(
        v["held"][0]["id"].as_str(),
        Some(stuck.to_string().as_str())
    );
    let reason = v["held"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no stream captures") && reason.contains(&event_type),
        "{reason}"
    );
    let text = run(["status", "--database-url", &url]).await;
    text.expect_code(0);
    assert!(
        text.stdout.contains(&stuck.to_string()) && text.stdout.contains("no stream captures"),
        "the held row and its reason in the status: {}",
        text.stdout
    );

    // The cause is fixed, then the row is unblocked by its id.
    ctx.ensure_stream().await;
    let unblock = |id: Uuid| {
        run([
            "unblock".to_owned(),
            "--database-url".into(),
            url.clone(),
            "--id".into(),
            id.to_string(),
            "--max-attempts".into(),
            "2".into(),
        ])
    };
    let out = unblock(behind).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout.trim(),
        "0 row(s) will be published again",
        "a row that is not held is not touched"
    );
    let out = unblock(stuck).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        [
            format!("unblocked {stuck}").as_str(),
            "1 row(s) will be published again"
        ]
    );
    assert_eq!(attempts(stuck).await, 0);

    let mut relay = Running::spawn(&[
        "relay",
        "--database-url",
        &url,
        "--nats-url",
        &nats,
        "--subject",
        &event_type,
        "--max-attempts",
        "2",
    ]);
    eventually(PATIENCE, "the relay to publish both rows", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    let messages = ctx.read_stream().await;
    let got: Vec<(String, Uuid)> = messages
        .iter()
        .map(|m| (m.msg_id.clone(), m.envelope.id))
        .collect();
    assert_eq!(
        got,
        [(stuck.to_string(), stuck), (behind.to_string(), behind)],
        "the unblocked row keeps its id, and the one behind it follows"
    );
    ctx.delete_stream().await;

    // Without a selector, unblock is a usage error.
    let out = run(["unblock", "--database-url", &url]).await;
    out.expect_code(2);
    assert!(
        out.stderr.contains("--id") && out.stderr.contains("--all"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn stream_ensure_tail_and_prune_work_from_the_command_line() {
    let ctx = Ctx::new().await;
    let event_type = ctx.event_type("tail.row.changed");
    let url = db_url(&ctx.db);
    let nats = nats_url();
    let stream = ctx.stream_name();
    let captures = format!("{}.>", ctx.prefix);

    // `stream ensure` creates the stream, accepts it unchanged, and refuses a different one.
    let ensure = |window: &'static str| {
        run([
            "stream",
            "ensure",
            "--nats-url",
            &nats,
            "--name",
            &stream,
            "--subject",
            &captures,
            "--memory",
            "--duplicate-window",
            window,
        ])
    };
    for round in ["creates", "accepts"] {
        let out = ensure("600").await;
        out.expect_code(0).assert_clean();
        assert_eq!(
            out.stdout.trim(),
            format!("stream {stream} ok: subjects {captures}, duplicate window 600s, 1 replica(s), 0 message(s)"),
            "`stream ensure` {round} the stream"
        );
        assert!(
            out.stderr.contains("has one replica") && out.stderr.contains("sync_interval"),
            "a single replica is warned about:\n{}",
            out.stderr
        );
    }
    let info = ctx.ensure_stream().await;
    assert_eq!(info.config.subjects, std::slice::from_ref(&captures));
    let out = ensure("60").await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains(&stream) && out.stderr.contains("differs"),
        "a mismatching stream is named and refused:\n{}",
        out.stderr
    );

    // three events of one subject, relayed: they reach the stream in emit order (order across
    // subjects is not promised)
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&event_type, "cli-test", "account-1").numbered(n),
        )
        .await;
        ids.push(id);
    }
    let mut relay = Running::spawn(&[
        "relay",
        "--database-url",
        &url,
        "--nats-url",
        &nats,
        "--subject",
        &event_type,
    ]);
    eventually(PATIENCE, "the relay to publish the events", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());

    // `tail --all --count 3` prints the three envelopes in stream order, then exits.
    let out = run([
        "tail",
        "--nats-url",
        &nats,
        "--all",
        "--count",
        "3",
        &captures,
    ])
    .await;
    out.expect_code(0).assert_clean();
    let headers: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("  "))
        .collect();
    assert_eq!(
        headers.len(),
        3,
        "one header line per event:\n{}",
        out.stdout
    );
    for (line, id) in headers.iter().zip(&ids) {
        for part in [
            event_type.clone(),
            format!("id={id}"),
            "source=cli-test".to_owned(),
            "subject=account-1".to_owned(),
        ] {
            assert!(line.contains(&part), "`{part}` missing from {line:?}");
        }
    }
    let bodies: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(bodies, [r#"  {"n":0}"#, r#"  {"n":1}"#, r#"  {"n":2}"#]);
    assert!(
        out.stderr.contains(&format!("on stream {stream}")),
        "tail finds the stream that captures the subject:\n{}",
        out.stderr
    );

    // `prune`: two rows published two hours ago, one published now, one unpublished and old.
    sqlx::query(
        "update outbox_events set published_at = now() - interval '2 hours' where id = any($1)",
    )
    .bind(&ids[..2])
    .execute(ctx.pool())
    .await
    .expect("age two rows");
    let pending = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "cli-test", "account-9").numbered(9),
    )
    .await;
    sqlx::query("update outbox_events set created_at = now() - interval '3 hours' where id = $1")
        .bind(pending)
        .execute(ctx.pool())
        .await
        .expect("age the unpublished row");
    let remaining = || async {
        let mut ids: Vec<Uuid> = sqlx::query_scalar("select id from outbox_events")
            .fetch_all(ctx.pool())
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
    ctx.delete_stream().await;
}

/// The secrets of the authentication test, each distinct so a leak names itself.
const AUTH_PASSWORD: &str = "auth-pw-77d1";
const AUTH_TOKEN: &str = "auth-token-5e90";

/// `outbox stream ensure` against `server`, with `env` set and `args` added.
async fn ensure_on(server: &NatsServer, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = outbox();
    cmd.args([
        "stream",
        "ensure",
        "--nats-url",
        &server.url(),
        "--name",
        "AUTHCHECK",
        "--subject",
        "authcheck.>",
        "--memory",
    ]);
    cmd.args(args);
    cmd.envs(env.iter().copied());
    finish(cmd).await
}

fn assert_no_auth_secret(out: &Output, seed: &str) {
    for text in [&out.stdout, &out.stderr] {
        for secret in [AUTH_PASSWORD, AUTH_TOKEN, seed] {
            assert!(!text.contains(secret), "a secret was printed:\n{text}");
        }
    }
}

/// `outbox stream ensure` against a private nats-server with TLS (a certificate from a CA made
/// here): the CA given with --nats-tls-ca verifies the server; another CA fails, naming TLS and
/// the flag to check, not "is it running?".
#[tokio::test]
async fn nats_tls_verifies_the_server_against_the_given_ca() {
    let ca = TestCa::new();
    let issued = ca.issue(&["127.0.0.1", "localhost"]);
    let (cert, key) = (
        issued.cert.display().to_string(),
        issued.key.display().to_string(),
    );
    let server = NatsServer::spawn_with(&["--tls", "--tlscert", &cert, "--tlskey", &key]).await;

    let trusted = ca.cert().display().to_string();
    let ok = ensure_on(&server, &[], &["--nats-tls-ca", &trusted]).await;
    ok.expect_code(0);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    let other = TestCa::new();
    let untrusted = other.cert().display().to_string();
    let refused = ensure_on(&server, &[], &["--nats-tls-ca", &untrusted]).await;
    refused.expect_code(2);
    assert!(
        refused.stderr.contains("cannot connect to NATS at")
            && refused.stderr.contains("--nats-tls-ca")
            && !refused.stderr.contains("is nats-server running"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn nats_user_password_nkey_and_token_authenticate_and_a_refusal_is_clear() {
    // a private server that accepts a user/password pair and an nkey user
    let nkey = nkeys::KeyPair::new_user();
    let seed = nkey.seed().expect("the nkey seed");
    let dir = tempfile::tempdir().expect("a config dir");
    let config = dir.path().join("auth.conf");
    std::fs::write(
        &config,
        format!(
            "authorization {{ users = [ {{ user: outbox, password: \"{AUTH_PASSWORD}\" }}, {{ nkey: \"{}\" }} ] }}\n",
            nkey.public_key()
        ),
    )
    .expect("write the server config");
    let server = NatsServer::spawn_with(&["-c", config.to_str().expect("utf-8 path")]).await;

    let ok = ensure_on(
        &server,
        &[("NATS_USER", "outbox"), ("NATS_PASSWORD", AUTH_PASSWORD)],
        &[],
    )
    .await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &seed);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    let ok = ensure_on(&server, &[], &["--nats-nkey", &seed]).await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &seed);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    for (what, env, args) in [
        (
            "a wrong password",
            vec![
                ("NATS_USER", "outbox"),
                ("NATS_PASSWORD", "not-the-password"),
            ],
            vec![],
        ),
        ("no credentials", vec![], vec![]),
        (
            "an nkey the server does not know",
            vec![],
            vec![
                "--nats-nkey".to_owned(),
                nkeys::KeyPair::new_user().seed().unwrap(),
            ],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let refused = ensure_on(&server, &env, &args).await;
        refused.expect_code(2);
        assert_no_auth_secret(&refused, &seed);
        assert!(
            !refused.stderr.contains("not-the-password"),
            "{what}: the password was printed:\n{}",
            refused.stderr
        );
        assert!(
            refused.stderr.contains("cannot connect to NATS at")
                && refused.stderr.contains("authorization violation")
                && refused
                    .stderr
                    .contains("the server refused the credentials"),
            "{what}: the error says the server refused the credentials:\n{}",
            refused.stderr
        );
    }
    drop(server);

    // a private server that wants a token
    let server = NatsServer::spawn_with(&["--auth", AUTH_TOKEN]).await;
    let ok = ensure_on(&server, &[("NATS_TOKEN", AUTH_TOKEN)], &[]).await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &seed);
    let refused = ensure_on(&server, &[("NATS_TOKEN", "wrong-token")], &[]).await;
    refused.expect_code(2);
    assert_no_auth_secret(&refused, &seed);
    assert!(
        refused
            .stderr
            .contains("the server refused the credentials"),
        "{}",
        refused.stderr
    );
    assert!(
        !refused.stderr.contains("wrong-token"),
        "the token was printed:\n{}",
        refused.stderr
    );
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to the process `pid` only.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// The advisory locks of the relay's namespace held by sessions that are idle in a
/// transaction: a batch whose relay stopped answering.
async fn frozen_batch_locks(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid \
          where l.locktype = 'advisory' and l.classid = $1::oid and l.granted \
            and a.state = 'idle in transaction' and a.datname = current_database()",
    )
    .bind(i64::from(outbox_runtime::relay::LOCK_NAMESPACE))
    .fetch_one(&db.pool)
    .await
    .expect("read pg_locks")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_frozen_mid_batch_releases_its_subjects_within_seconds() {
    const EVENTS: i64 = 2_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("frozen.row.changed");
    let url = db_url(&ctx.db);
    // The relay that freezes publishes to a server of its own, which stops answering first: its
    // batch then waits for acks, locks held, and is frozen there (SIGSTOP, as a paused VM).
    let mut stuck_broker = NatsServer::spawn().await;
    let mut frozen = Running::spawn(&[
        "relay",
        "--database-url",
        &url,
        "--nats-url",
        &stuck_broker.url(),
        "--lanes",
        "1",
        "--batch-size",
        "10000",
    ]);
    eventually(PATIENCE, "the relay to listen", || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity where datname = current_database() and query like 'LISTEN%'",
        )
        .fetch_one(ctx.pool())
        .await
        .unwrap()
            > 0
    })
    .await;
    let broker_pid = stuck_broker.pid().expect("the private server runs");
    signal(broker_pid, "STOP");
    let expected: Vec<(Uuid, String)> = sqlx::query_as(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'billing', 's-' || (g % 200), now(), jsonb_build_object('n', g), \
                now() + g * interval '1 microsecond' \
           from generate_series(1, $2) g order by g returning id, subject",
    )
    .bind(&event_type)
    .bind(EVENTS)
    .fetch_all(ctx.pool())
    .await
    .unwrap();
    sqlx::query("select pg_notify('outbox_events', '')")
        .execute(ctx.pool())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(4),
        "the relay to claim the backlog and wait for acks",
        || async { frozen_batch_locks(&ctx.db).await > 0 },
    )
    .await;
    let pid = frozen.child.id();
    signal(pid, "STOP");
    let frozen_at = tokio::time::Instant::now();
    // A healthy relay starts beside it: every subject is published within ack_timeout + 10 s,
    // once the server has ended the frozen batch's transaction.
    let config = outbox_runtime::RelayConfig::default();
    let pool = ctx.db.new_pool(config.pool_size()).await;
    let js = async_nats::jetstream::new(outbox_testkit::connect_nats(&nats_url()).await);
    let healthy = std::sync::Arc::new(
        outbox_runtime::Relay::new(pool, js, config.clone())
            .await
            .unwrap(),
    );
    let (stop, running) = outbox_testkit::run_relay(healthy.clone());
    eventually(
        config.ack_timeout + Duration::from_secs(10),
        "the healthy relay publishes every subject",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    eprintln!(
        "every subject published {:?} after the freeze",
        frozen_at.elapsed()
    );
    assert_eq!(
        frozen_batch_locks(&ctx.db).await,
        0,
        "the frozen batch's locks are gone"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
    signal(pid, "KILL");
    frozen.wait().await;
    signal(broker_pid, "CONT");
    stuck_broker.stop();
    let mut per_subject: HashMap<String, Vec<Uuid>> = HashMap::new();
    for (id, subject) in expected {
        per_subject.entry(subject).or_default().push(id);
    }
    let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in ctx.read_stream().await {
        seen.entry(m.envelope.subject.clone())
            .or_default()
            .push(m.envelope.id);
    }
    assert_eq!(seen, per_subject, "every event once, each subject in order");
    ctx.delete_stream().await;
}

#[tokio::test]
async fn stream_ensure_creates_a_replicated_stream_on_a_cluster_and_refuses_an_unsafe_one() {
    let cluster = outbox_testkit::NatsCluster::spawn(3).await;
    let urls = cluster.urls();
    let ensure = |name: &'static str, subject: &'static str| {
        run([
            "stream",
            "ensure",
            "--nats-url",
            urls.as_str(),
            "--name",
            name,
            "--subject",
            subject,
            "--replicas",
            "3",
        ])
    };
    // the first meta leader may take a moment to be elected
    let mut out = ensure("CLUSTERED", "clustered.>").await;
    for _ in 0..50 {
        if out.code == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        out = ensure("CLUSTERED", "clustered.>").await;
    }
    out.expect_code(0).assert_clean();
    assert!(
        out.stdout.contains("stream CLUSTERED ok") && out.stdout.contains("3 replica(s)"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stderr.contains("one replica"),
        "no warning for R3: {}",
        out.stderr
    );

    let js = async_nats::jetstream::new(cluster.connect().await);
    cluster
        .create_stream(
            &js,
            async_nats::jetstream::stream::Config {
                name: "INTEREST".into(),
                subjects: vec!["interest.>".into()],
                retention: async_nats::jetstream::stream::RetentionPolicy::Interest,
                duplicate_window: Duration::from_secs(600),
                num_replicas: 3,
                ..Default::default()
            },
        )
        .await;
    let out = ensure("INTEREST", "interest.>").await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains("INTEREST")
            && out.stderr.contains("retention is interest")
            && out.stderr.contains("limits retention"),
        "the unsafe setting is named with its fix:\n{}",
        out.stderr
    );
}

/// A NATS JWT (`ed25519-nkey`) with `claims`, issued and signed by `issuer`.
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": chrono::Utc::now().timestamp(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = issuer.sign(signed.as_bytes()).expect("sign the JWT");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// An operator-mode server (an operator, one account with JetStream, its JWTs preloaded) and a
/// `.creds` file for a user of that account, and another for a user of an account the server
/// does not know.
struct CredsServer {
    server: NatsServer,
    creds: std::path::PathBuf,
    foreign_creds: std::path::PathBuf,
    user_seed: String,
    dir: tempfile::TempDir,
}

fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

async fn creds_server() -> CredsServer {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let system = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
    });
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "outbox-test-operator",
        serde_json::json!({
            "system_account": system.public_key(), "type": "operator", "version": 2
        }),
    );
    let system_jwt = nats_jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({ "type": "account", "version": 2 }),
    );
    let account_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        "outbox-test-account",
        serde_json::json!({ "limits": unlimited, "type": "account", "version": 2 }),
    );
    let user_claims = serde_json::json!({
        "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
        "type": "user", "version": 2
    });
    let user_jwt = nats_jwt(&account, &user.public_key(), "outbox", user_claims.clone());
    let stranger = nkeys::KeyPair::new_account();
    let foreign_user = nkeys::KeyPair::new_user();
    let foreign_jwt = nats_jwt(
        &stranger,
        &foreign_user.public_key(),
        "stranger",
        user_claims,
    );

    let dir = tempfile::tempdir().expect("a config dir");
    let config = dir.path().join("operator.conf");
    std::fs::write(
        &config,
        format!(
            "operator: \"{operator_jwt}\"\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {}: \"{account_jwt}\"\n  {}: \"{system_jwt}\"\n}}\n",
            system.public_key(),
            account.public_key(),
            system.public_key()
        ),
    )
    .expect("write the server config");
    let user_seed = user.seed().expect("the user seed");
    let creds = dir.path().join("outbox.creds");
    std::fs::write(&creds, creds_file(&user_jwt, &user_seed)).expect("write the creds");
    let foreign_creds = dir.path().join("stranger.creds");
    std::fs::write(
        &foreign_creds,
        creds_file(&foreign_jwt, &foreign_user.seed().expect("a seed")),
    )
    .expect("write the creds");
    let server = NatsServer::spawn_with(&["-c", config.to_str().expect("utf-8 path")]).await;
    CredsServer {
        server,
        creds,
        foreign_creds,
        user_seed,
        dir,
    }
}

/// `.creds` authentication, as an operator issues it (a user JWT and its nkey seed): the
/// account's user gets in and JetStream works; a user of an account the server does not know
/// is refused, clearly; a file that is not a creds file names the file; the seed is never
/// printed.
#[tokio::test]
async fn a_creds_file_authenticates_and_a_refusal_is_clear() {
    let s = creds_server().await;
    let creds = s.creds.display().to_string();
    let ok = ensure_on(&s.server, &[], &["--nats-creds", &creds]).await;
    ok.expect_code(0);
    assert_no_auth_secret(&ok, &s.user_seed);
    assert!(
        ok.stdout.starts_with("stream AUTHCHECK ok"),
        "{}",
        ok.stdout
    );

    let foreign = s.foreign_creds.display().to_string();
    let refused = ensure_on(&s.server, &[], &["--nats-creds", &foreign]).await;
    refused.expect_code(2);
    assert_no_auth_secret(&refused, &s.user_seed);
    assert!(
        refused.stderr.contains("cannot connect to NATS at")
            && refused.stderr.contains("authorization violation")
            && refused
                .stderr
                .contains("the server refused the credentials"),
        "a user of an unknown account is refused, and the error says so:\n{}",
        refused.stderr
    );

    let none = ensure_on(&s.server, &[], &[]).await;
    none.expect_code(2);
    assert!(
        none.stderr.contains("the server refused the credentials"),
        "{}",
        none.stderr
    );

    let not_creds = s.dir.path().join("operator.conf").display().to_string();
    let unreadable = ensure_on(&s.server, &[], &["--nats-creds", &not_creds]).await;
    unreadable.expect_code(2);
    assert!(
        unreadable
            .stderr
            .contains(&format!("cannot read NATS credentials file {not_creds}")),
        "{}",
        unreadable.stderr
    );
}
