//! `outbox relay`: a backlog drained, stopped by SIGTERM with nothing half done and resumed,
//! with progress lines and metrics; a relay frozen mid-batch (SIGSTOP) releases its subjects
//! within seconds.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::time::Duration;

use outbox_testkit::suite::Ctx;
use outbox_testkit::{eventually, free_port, NatsServer, TestDb};
use uuid::Uuid;

use crate::support::{assert_no_secret, db_url, nats_url, relay_args, signal, Running, PATIENCE};

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
    let relay_serving = |metrics: &str| {
        let more = ["--event-type", &event_type, "--batch-size", "100"];
        let metrics = ["--metrics-addr".to_owned(), metrics.to_owned()];
        relay_args(&url, &nats, &more).into_iter().chain(metrics)
    };

    // First run: stopped by SIGTERM while draining.
    let mut relay = Running::spawn(relay_serving(&format!("127.0.0.1:{}", free_port())));
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
    let mut relay = Running::spawn(relay_serving(&metrics_addr));
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

/// The relay's batches idle in their transaction (their row locks held): a batch whose relay
/// stopped answering, waiting for acks.
async fn frozen_batch_locks(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity a \
          where a.state = 'idle in transaction' and a.datname = current_database() \
            and a.backend_xid is not null and a.query like '%outbox_events%'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("read pg_stat_activity")
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
    let more = ["--lanes", "1", "--batch-size", "10000"];
    let mut frozen = Running::spawn(relay_args(&url, &stuck_broker.url(), &more));
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
    // A healthy relay starts beside it: it takes the frozen relay's lease over once it runs out
    // (5 s), and every subject is published within ack_timeout + 10 s, once the server has
    // ended the frozen batch's transaction.
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

/// `--subject`, the old name of `--event-type`, still works for one release, with a warning:
/// here the start-up check it asks for refuses a type no stream captures.
#[tokio::test]
async fn relay_takes_the_deprecated_subject_flag_with_a_warning() {
    let ctx = Ctx::new().await;
    let event_type = ctx.event_type("uncaptured.row.changed");
    let (url, nats) = (db_url(&ctx.db), nats_url());
    let out = crate::support::run(relay_args(&url, &nats, &["--subject", &event_type])).await;
    out.expect_code(2).assert_clean();
    assert!(
        out.stderr.contains(
            "warning: --subject is deprecated and goes in the next release; use --event-type"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("no stream captures") && out.stderr.contains(&event_type),
        "the event types given under the old name are checked:\n{}",
        out.stderr
    );
}

/// `OUTBOX_LOG` with a target below the default level (the operations guide's example,
/// `info,outbox_runtime=debug`) adds that target's debug lines and keeps every info line:
/// the logs' filter used to drop the relay's lines then, its start included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_filter_with_a_debug_target_keeps_the_relays_lines() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (url, nats) = (db_url(&ctx.db), nats_url());
    let mut relay = Running::spawn_with_env(
        relay_args(&url, &nats, &[]),
        &[("OUTBOX_LOG", "info,outbox_runtime=debug")],
    );
    let started = "outbox relay took the lease";
    eventually(PATIENCE, "the relay's start at info", || {
        std::future::ready(relay.stderr().contains(started))
    })
    .await;
    eventually(PATIENCE, "a claim's line at debug", || {
        std::future::ready(
            relay
                .stderr()
                .lines()
                .any(|l| l.contains("DEBUG") && l.contains("outbox claim reads")),
        )
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    let log = relay.stderr();
    assert!(log.contains("relay stopped cleanly"), "{log}");
    assert!(
        !log.contains("DEBUG sqlx"),
        "the other targets stay at info:\n{log}"
    );
    ctx.delete_stream().await;
}

/// Sessions of the test's database holding the relay's notify lock exclusively.
async fn notify_lock_holders(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_locks where locktype = 'advisory' and granted \
            and mode = 'ExclusiveLock' and classid = $1::int8::oid \
            and objid = ($2::int8 & 4294967295)::oid and objsubid = 2 \
            and database = (select oid from pg_database where datname = current_database())",
    )
    .bind(i64::from(outbox_runtime::relay::LOCK_NAMESPACE))
    .bind(i64::from(outbox_runtime::NOTIFY_KEY))
    .fetch_one(&db.pool)
    .await
    .expect("read pg_locks")
}

/// The relay's backends on the test's database (the CLI names its sessions `outbox`; the
/// test's own pool, which may open connections meanwhile, does not).
async fn backends(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity \
          where datname = current_database() and application_name = 'outbox'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("read pg_stat_activity")
}

/// An idle relay frozen without a reset (SIGSTOP, as a paused VM): the server ends its
/// wake-up locks' session within seconds, so emits stop notifying (each notification costs
/// commit throughput), and its `LISTEN` session, so it holds no notification queue back;
/// thawed, it publishes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_frozen_lets_its_notify_lock_and_listener_go_within_seconds() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("frozen.row.changed");
    let url = db_url(&ctx.db);
    let mut relay = Running::spawn(relay_args(&url, &nats_url(), &[]));
    eventually(PATIENCE, "the idle relay holds the notify lock", || async {
        notify_lock_holders(&ctx.db).await == 1
    })
    .await;
    let pid = relay.child.id();
    signal(pid, "STOP");
    let frozen_at = tokio::time::Instant::now();
    // counted once frozen: an idle relay may still open a pooled connection (its sampler, its
    // gauges), and a connection it was opening at the freeze has its session counted within
    // moments or never; from then on only the server can end the relay's sessions
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = backends(&ctx.db).await;
    eventually(
        Duration::from_secs(10),
        "the server ends the frozen relay's notify lock",
        || async { notify_lock_holders(&ctx.db).await == 0 },
    )
    .await;
    let released = frozen_at.elapsed();
    eventually(
        Duration::from_secs(15),
        "the server ends the frozen relay's LISTEN session too",
        || async { backends(&ctx.db).await <= before - 2 },
    )
    .await;
    eprintln!("the notify lock went {released:?} after the freeze");
    // emits notify no more: a listener of the test's hears nothing of them
    let mut heard = sqlx::postgres::PgListener::connect_with(&ctx.db.pool)
        .await
        .unwrap();
    heard.listen(outbox_runtime::NOTIFY_CHANNEL).await.unwrap();
    let insert = |n: i32| {
        let event_type = event_type.clone();
        let pool = ctx.db.pool.clone();
        async move {
            let schemas = outbox_testkit::open_schemas(std::slice::from_ref(&event_type));
            let event = outbox_testkit::raw_event(&event_type, "billing", "s").numbered(n as usize);
            outbox_testkit::emit_committed(&pool, &schemas, event).await
        }
    };
    let id = insert(1).await;
    let note = tokio::time::timeout(Duration::from_millis(500), heard.try_recv()).await;
    assert!(
        note.is_err(),
        "an emit notified while the relay was frozen: {note:?}"
    );
    // thawed, it reconnects and publishes
    signal(pid, "CONT");
    eventually(PATIENCE, "the thawed relay publishes", || async {
        published_ids(&ctx.db).await.contains(&id)
    })
    .await;
    signal(pid, "TERM");
    relay.wait().await;
    ctx.delete_stream().await;
}
