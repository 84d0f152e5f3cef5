//! `outbox relay` as a process an orchestrator runs: `/healthz` and `/readyz` answer curl,
//! and `/readyz` turns unready while its private nats-server is down and ready again after;
//! SIGTERM with a batch waiting for acks ends the process within its stated bound, and nothing
//! is lost; a relay started while its Postgres is down waits for it. (`otlp` has the exporters
//! and the JSON log lines.)

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use outbox_testkit::suite::Ctx;
use outbox_testkit::{eventually, free_port, unique_token, NatsServer, PgServer};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::support::{db_url, emit_numbered, nats_url, relay_args, signal, Running, PATIENCE};

/// `curl -s -w '\n%{http_code}' http://<addr><path>`: the status code and the body.
async fn curl(addr: &str, path: &str) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}", &url])
        .output()
        .await
        .expect("run curl (Debian: apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "000"));
    (code.parse().unwrap_or(0), body.to_owned())
}

/// The ids of the events in the test's stream, in stream order.
async fn stored_ids(ctx: &Ctx) -> Vec<Uuid> {
    ctx.read_stream()
        .await
        .iter()
        .map(|m| m.envelope.id)
        .collect()
}

/// Asks `/readyz` until it answers `want`; what it answered last.
async fn readyz_until(addr: &str, want: u16, what: &str) -> (u16, String) {
    let last = Mutex::new((0, String::new()));
    eventually(PATIENCE, what, || async {
        let answer = curl(addr, "/readyz").await;
        let done = answer.0 == want;
        *last.lock().unwrap() = answer;
        done
    })
    .await;
    last.into_inner().unwrap()
}

#[tokio::test]
async fn readyz_turns_unready_while_the_broker_is_down_and_ready_after_while_healthz_stays_up() {
    let ctx = Ctx::new().await;
    let mut broker = NatsServer::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let url = db_url(&ctx.db);
    let relay = Running::spawn(relay_args(&url, &broker.url(), &["--metrics-addr", &addr]));
    let (_, body) = readyz_until(&addr, 200, "/readyz to answer 200").await;
    let ready: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["nats_reachable"], true);
    assert_eq!(ready["postgres_reachable"], true);
    assert_eq!(
        ready["holds_lease"], true,
        "the only relay of its table publishes"
    );
    let (code, alive) = curl(&addr, "/healthz").await;
    assert_eq!(code, 200, "{alive}");
    assert!(alive.contains("\"status\":\"alive\""), "{alive}");
    let (code, metrics) = curl(&addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("outbox_relay_lease_held"), "{metrics}");
    assert_eq!(curl(&addr, "/nothing").await.0, 404);

    broker.stop();
    let (_, body) = readyz_until(&addr, 503, "/readyz to answer 503 with the broker down").await;
    let down: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert_eq!(down["status"], "not ready");
    assert_eq!(down["nats_reachable"], false, "{down}");
    assert_eq!(down["running"], true, "{down}");
    let (code, alive) = curl(&addr, "/healthz").await;
    assert_eq!(code, 200, "an outage is no reason to restart: {alive}");

    broker.start().await;
    let (_, body) = readyz_until(&addr, 200, "/readyz to answer 200 once the broker is back").await;
    assert!(body.contains("\"nats_reachable\":true"), "{body}");
    drop(relay);
}

/// Whether a session of the test's database is idle in a transaction holding row locks on
/// `outbox_events`: the relay's batch, its rows claimed, waiting for their acks.
async fn batch_in_flight(ctx: &Ctx) -> bool {
    sqlx::query_scalar::<_, i64>(
        "select count(*) from pg_stat_activity a join pg_locks l on l.pid = a.pid \
          where a.datname = current_database() and a.state = 'idle in transaction' \
            and l.relation = 'outbox_events'::regclass and l.mode = 'RowShareLock'",
    )
    .fetch_one(ctx.pool())
    .await
    .expect("read pg_locks")
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_batch_in_flight_ends_within_the_bound_and_loses_nothing() {
    const EVENTS: i64 = 1_000;
    const ACK_TIMEOUT: u64 = 2;
    // the documented bound: ack_timeout + 20 s for the relay, 5 s for the exporters
    let bound = Duration::from_secs(ACK_TIMEOUT + 25);
    let mut broker = NatsServer::spawn().await;
    let ctx = Ctx::with_nats(&broker.url()).await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("stopping.row.changed");
    let url = db_url(&ctx.db);
    let ack = ACK_TIMEOUT.to_string();
    let more = [
        "--lanes",
        "1",
        "--batch-size",
        "5000",
        "--ack-timeout",
        &ack,
    ];
    let mut relay = Running::spawn(relay_args(&url, &broker.url(), &more));
    eventually(PATIENCE, "the relay to take the lease", || async {
        sqlx::query_scalar::<_, i64>("select count(*) from outbox_relay_lease")
            .fetch_one(ctx.pool())
            .await
            .unwrap()
            > 0
    })
    .await;
    // The broker stops answering (frozen, so its connections stay open): the batch that
    // claims the rows sends them and waits for acks that do not come.
    let broker_pid = broker.pid().expect("the private server runs");
    signal(broker_pid, "STOP");
    let expected: Vec<(Uuid, String)> = sqlx::query_as(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'cli-test', 's-' || (g % 20), now(), \
                jsonb_build_object('n', g), now() + g * interval '1 microsecond' \
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
    let claimed = tokio::time::Instant::now() + Duration::from_secs(30);
    while !batch_in_flight(&ctx).await {
        assert!(
            tokio::time::Instant::now() < claimed,
            "no batch waits for its acks after 30 s:\n{}",
            relay.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let signalled = tokio::time::Instant::now();
    relay.terminate();
    let code = relay.wait().await;
    let took = signalled.elapsed();
    let log = relay.stderr();
    eprintln!("SIGTERM to exit with a batch in flight: {took:?} (bound {bound:?})");
    assert_eq!(
        code,
        Some(0),
        "the relay finished its batch and exits 0:\n{log}"
    );
    assert!(
        took <= bound,
        "the relay took {took:?} to stop, over its bound of {bound:?}:\n{log}"
    );
    assert!(!batch_in_flight(&ctx).await, "the batch's locks are gone");
    signal(broker_pid, "CONT");

    // Nothing lost: every row marked published is in the stream, and a relay started again
    // publishes the rest; each event is stored once, each subject in order.
    let marked: HashSet<Uuid> =
        sqlx::query_scalar("select id from outbox_events where published_at is not null")
            .fetch_all(ctx.pool())
            .await
            .unwrap()
            .into_iter()
            .collect();
    let stored: HashSet<Uuid> = stored_ids(&ctx).await.into_iter().collect();
    assert!(
        marked.is_subset(&stored),
        "rows marked published are missing from the stream"
    );
    crate::support::relay_until_published(&ctx, &url, &broker.url(), &[]).await;
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
    broker.stop();
}

/// A relay started while its Postgres is down (a host rebooting, or a deploy that starts both)
/// waits for it rather than exiting: each attempt is a warning, `/healthz` answers 200 and
/// `/readyz` 503 meanwhile, and once Postgres accepts connections the relay starts and
/// publishes what was committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_while_postgres_is_down_waits_for_it_then_publishes() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("waiting.row.changed");
    let pg = PgServer::spawn();
    let connect = || async {
        PgPoolOptions::new()
            .max_connections(2)
            .connect(&pg.url())
            .await
            .expect("connect to the private Postgres")
    };
    let pool = connect().await;
    outbox_runtime::migrate(&pool).await.expect("migrate");
    pool.close().await;
    pg.stop();

    let addr = format!("127.0.0.1:{}", free_port());
    let mut relay = Running::spawn(relay_args(
        &pg.url(),
        &nats_url(),
        &["--metrics-addr", &addr],
    ));
    let warning = format!("cannot connect to Postgres at {}", pg.url());
    eventually(PATIENCE, "two failed start attempts", || {
        std::future::ready(relay.stderr().matches(&warning).count() >= 2)
    })
    .await;
    let (code, alive) = curl(&addr, "/healthz").await;
    assert_eq!((code, alive.trim()), (200, r#"{"status":"starting"}"#));
    let (code, ready) = curl(&addr, "/readyz").await;
    assert_eq!((code, ready.trim()), (503, r#"{"status":"starting"}"#));

    pg.start();
    let pool = connect().await;
    let ids = emit_numbered(&pool, &event_type, "s-1", 1..=3).await;
    readyz_until(&addr, 200, "/readyz to answer 200 once Postgres is up").await;
    eventually(
        PATIENCE,
        "the relay to publish the three events",
        || async { ctx.stream_len().await == 3 },
    )
    .await;
    let stored = stored_ids(&ctx).await;
    assert_eq!(stored, ids, "each event once, in order");
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    ctx.delete_stream().await;
}

/// A lease statement that Postgres refuses while it answers everything else (a revoked grant,
/// a trigger, here the lease table renamed away): the relay says so at warn, once, with
/// Postgres's error, turns unready and stops publishing; once the statement works again it
/// says that too, takes the lease and publishes what was committed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_renewal_is_warned_once_and_the_relay_resumes_when_it_works_again() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("leased.row.changed");
    let url = db_url(&ctx.db);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut relay = Running::spawn(relay_args(&url, &nats_url(), &["--metrics-addr", &addr]));
    readyz_until(&addr, 200, "/readyz to answer 200").await;
    let first = emit_numbered(ctx.pool(), &event_type, "s-1", 1..=2).await;
    eventually(PATIENCE, "the first events published", || async {
        ctx.stream_len().await == 2
    })
    .await;

    sqlx::query("alter table outbox_relay_lease rename to outbox_relay_lease_away")
        .execute(ctx.pool())
        .await
        .unwrap();
    let warning = "could not renew its lease, and stops publishing when its term runs out";
    eventually(PATIENCE, "the refused renewal warned", || {
        std::future::ready(relay.stderr().contains(warning))
    })
    .await;
    readyz_until(&addr, 503, "/readyz to answer 503 while renewals fail").await;
    // the lease runs out (5 s), and nothing is published meanwhile
    tokio::time::sleep(Duration::from_secs(6)).await;
    let held = emit_numbered(ctx.pool(), &event_type, "s-1", 3..=4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ctx.stream_len().await, 2, "no lease, nothing published");
    let log = relay.stderr();
    assert_eq!(log.matches(warning).count(), 1, "warned once:\n{log}");
    assert!(
        log.contains("outbox_relay_lease") && log.contains("does not exist"),
        "the warning carries Postgres's error:\n{log}"
    );

    sqlx::query("alter table outbox_relay_lease_away rename to outbox_relay_lease")
        .execute(ctx.pool())
        .await
        .unwrap();
    eventually(PATIENCE, "the held events published", || async {
        ctx.stream_len().await == 4
    })
    .await;
    readyz_until(&addr, 200, "/readyz to answer 200 again").await;
    let log = relay.stderr();
    assert!(log.contains("renews its lease again"), "{log}");
    let stored = stored_ids(&ctx).await;
    assert_eq!(stored, [first, held].concat(), "each event once, in order");
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    ctx.delete_stream().await;
}

/// A relay whose role cannot read `pg_locks` (revoked from `public` in its database) cannot
/// sample the running transactions for its horizon. Its batches do not depend on the sample:
/// it publishes every event, in order, with no batch failing; it warns once, naming Postgres's
/// error; it asks again every 10 s, not at every batch (each refusal is an error in the
/// server's log); and it says when sampling works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_cannot_sample_the_running_transactions_publishes_and_warns_once() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("sampled.row.changed");
    let role = format!("relay_{}", unique_token().to_lowercase());
    let grant_locks = |verb: &str| {
        let to = if verb == "grant" { "to" } else { "from" };
        format!("{verb} select on pg_catalog.pg_locks {to} public")
    };
    for statement in [
        format!("create role {role} login"),
        format!("grant all on all tables in schema public to {role}"),
        grant_locks("revoke"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(ctx.pool())
            .await
            .unwrap();
    }
    // the test database's URL with the role as its user (in place of any user it names)
    let url = ctx.db.url();
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let authority = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..authority].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let url = format!("{scheme}://{role}@{rest}");
    // each later refusal is a debug line of the horizon's module
    let mut relay = Running::spawn_with_env(
        relay_args(&url, &nats_url(), &[]),
        &[("OUTBOX_LOG", "info,outbox_runtime::relay::horizon=debug")],
    );
    let first = emit_numbered(ctx.pool(), &event_type, "s-1", 1..=3).await;
    eventually(
        PATIENCE,
        "the events published without a sample",
        || async { ctx.stream_len().await == 3 },
    )
    .await;
    let warning = "could not sample the running transactions";
    eventually(PATIENCE, "the refused sample warned", || {
        std::future::ready(relay.stderr().contains(warning))
    })
    .await;
    // the lanes ask for a sample at every batch (at most every 200 ms; without a horizon,
    // their cursors have nothing to sweep, so an idle lane's batches come at its polls);
    // refused, the relay asks again 10 s later at the soonest
    let again = "was refused again";
    eventually(PATIENCE, "a second refusal", || {
        std::future::ready(relay.stderr().contains(again))
    })
    .await;
    let refusals = |log: &str| log.matches(again).count();
    let seen = refusals(&relay.stderr());
    let since = std::time::Instant::now();
    let more = emit_numbered(ctx.pool(), &event_type, "s-1", 4..=6).await;
    eventually(PATIENCE, "the events emitted since published", || async {
        ctx.stream_len().await == 6
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = relay.stderr();
    // one more every 10 s at most (and one for the lag of the log behind the ask); every
    // 200 ms, there would be a dozen at least
    let allowed = seen + 2 + (since.elapsed().as_secs() / 10) as usize;
    assert!(
        refusals(&log) <= allowed,
        "the refused samples were asked for again more often than every 10 s:\n{log}"
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(warning))
        .collect();
    assert_eq!(warnings.len(), 1, "warned once:\n{log}");
    assert!(
        warnings[0].contains("permission denied for view pg_locks"),
        "the warning carries Postgres's error:\n{log}"
    );
    assert!(!log.contains("batch failed"), "no batch failed:\n{log}");

    sqlx::query(sqlx::AssertSqlSafe(grant_locks("grant")))
        .execute(ctx.pool())
        .await
        .unwrap();
    let later = emit_numbered(ctx.pool(), &event_type, "s-1", 7..=8).await;
    eventually(PATIENCE, "the later events published", || async {
        ctx.stream_len().await == 8
    })
    .await;
    eventually(PATIENCE, "sampling said to work again", || {
        std::future::ready(
            relay
                .stderr()
                .contains("samples the running transactions again"),
        )
    })
    .await;
    assert_eq!(
        stored_ids(&ctx).await,
        [first, more, later].concat(),
        "each event once, in order"
    );
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
    for statement in [format!("drop owned by {role}"), format!("drop role {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(ctx.pool())
            .await
            .unwrap();
    }
    ctx.delete_stream().await;
}
