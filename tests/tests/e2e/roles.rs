//! Least privilege: ops/postgres/roles.sql and grants.sql give each component's role exactly
//! what its statements need. On a private Postgres with the roles the files create, every
//! component runs as its role (the relay as it is, a service emitting, a consumer, retention,
//! the operator's status, unblock and verify, `outbox migrate`); each role holds exactly the
//! file's rights and is refused what it must not do; and each right of every role but the
//! relay's is taken away in turn, which must make its component fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use outbox_runtime::consumer::{
    Consumer, ConsumerConfig, Delivery, Handler, HandlerError, Outcome,
};
use outbox_runtime::status::{self, Unblock};
use outbox_runtime::{
    order, retention, verify, EmitExt, Envelope, OutboxEvent, Relay, RelayConfig, Schemas,
    StorageType, StreamSpec, VerifyOptions,
};
use outbox_testkit::{connect_nats, eventually, open_schemas, raw_event, run_relay, NatsServer};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::consumer::AccountOpened;
use crate::migrate::Private;

/// The stream of the emitted events, and of the consumer's.
const EVENTS: &str = "ROLES";
const EVENT_TYPE: &str = "roles.row.changed";
/// A type no stream captures: the relay holds its rows.
const ORPHAN_TYPE: &str = "orphans.row.changed";
const ACCOUNTS: &str = "ACCOUNTS";
const CONSUMER: &str = "roles";

/// The variable of each component's role in the files, and the component, for messages.
const COMPONENTS: [(&str, &str); 6] = [
    ("migrator_role", "outbox migrate"),
    ("relay_role", "the relay"),
    ("emitter_role", "an emitting service"),
    ("consumer_role", "a consumer"),
    ("retention_role", "retention"),
    ("operator_role", "outbox status, unblock and verify"),
];

fn ops_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ops/postgres")
        .join(name)
}

/// The role names the files default to: their `\set <variable> <name>` lines.
fn default_names() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(ops_file("roles.sql")).expect("read roles.sql");
    let names: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split("\\set ").nth(1))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect();
    for (variable, _) in COMPONENTS {
        assert!(
            names.contains_key(variable),
            "roles.sql names no {variable}"
        );
    }
    names
}

/// One `grant` line of grants.sql: its privileges, table and role variable.
#[derive(Debug, Clone)]
struct Grant {
    line: String,
    privileges: Vec<String>,
    table: String,
    variable: String,
}

impl Grant {
    /// The line as the test runs it, with the role named.
    fn sql(&self, names: &BTreeMap<String, String>) -> String {
        self.line.replace(
            &format!(":\"{}\"", self.variable),
            &quoted(&names[&self.variable]),
        )
    }

    /// Each right the line grants, alone: a table privilege, or one column's.
    fn rights(&self) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        for privilege in &self.privileges {
            match privilege.split_once('(') {
                Some((name, columns)) => {
                    for column in columns.trim_end_matches(')').split(',') {
                        out.push((name.trim().to_owned(), Some(column.trim().to_owned())));
                    }
                }
                None => out.push((privilege.clone(), None)),
            }
        }
        out
    }
}

/// Every `grant ... on <table> to :"<variable>";` line of grants.sql.
fn grants() -> Vec<Grant> {
    let text = std::fs::read_to_string(ops_file("grants.sql")).expect("read grants.sql");
    let grants: Vec<Grant> = text
        .lines()
        .filter(|l| l.starts_with("grant "))
        .map(|line| {
            let body = line
                .strip_prefix("grant ")
                .and_then(|l| l.strip_suffix(';'))
                .unwrap_or_else(|| panic!("grants.sql: `{line}` is not one statement a line"));
            let (privileges, rest) = body
                .split_once(" on ")
                .unwrap_or_else(|| panic!("grants.sql: `{line}` names no table"));
            let (table, role) = rest
                .split_once(" to ")
                .unwrap_or_else(|| panic!("grants.sql: `{line}` names no role"));
            let variable = role
                .strip_prefix(":\"")
                .and_then(|r| r.strip_suffix('"'))
                .unwrap_or_else(|| panic!("grants.sql: `{line}` names its role by a variable"));
            Grant {
                line: line.to_owned(),
                privileges: split_top_level(privileges),
                table: table.trim().to_owned(),
                variable: variable.to_owned(),
            }
        })
        .collect();
    assert!(
        grants.len() >= 10,
        "grants.sql: only {} grants read",
        grants.len()
    );
    grants
}

/// `text` split at the commas outside parentheses.
fn split_top_level(text: &str) -> Vec<String> {
    let (mut out, mut current, mut depth) = (Vec::new(), String::new(), 0);
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(current.trim().to_owned());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current.trim().to_owned());
    out
}

fn quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// psql, from the Postgres server binaries or the PATH.
fn psql() -> PathBuf {
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|versions| {
            versions
                .filter_map(|v| v.ok().map(|v| v.path().join("bin/psql")))
                .filter(|p| p.exists())
                .max()
        });
    installed.unwrap_or_else(|| PathBuf::from("psql"))
}

/// Runs `file` of ops/postgres with psql at `url`, as an operator does.
fn run_file(url: &str, file: &str) {
    let output = std::process::Command::new(psql())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f"])
        .arg(ops_file(file))
        .output()
        .unwrap_or_else(|e| {
            panic!("run psql ({e}): the roles test runs the files with it; install Debian's postgresql-client (scripts/services installs Postgres with it)")
        });
    assert!(
        output.status.success(),
        "psql -f {file} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The private server, a pool per role, the broker.
struct World {
    private: Private,
    names: BTreeMap<String, String>,
    pools: BTreeMap<String, PgPool>,
    js: jetstream::Context,
    _nats: NatsServer,
    schemas: Schemas,
    /// Makes each run's rows its own.
    runs: AtomicU64,
}

impl World {
    async fn new() -> World {
        let names = default_names();
        let owner = &names["migrator_role"];
        // the database belongs to the superuser, not to any of the roles
        let private = Private::spawn().await;
        private
            .admin("postgres")
            .await
            .execute_all(&["create database outbox"])
            .await;
        run_file(&private.url("root", "outbox"), "roles.sql");
        let mut admin = private.admin("outbox").await;
        for (variable, _) in COMPONENTS {
            admin
                .execute_all(&[&format!("alter role {} login", quoted(&names[variable]))])
                .await;
        }
        let migrator = private.pool(owner, 2).await;
        outbox_runtime::migrate(&migrator)
            .await
            .expect("outbox migrate as the migration role");
        run_file(&private.url(owner, "outbox"), "grants.sql");
        let mut pools = BTreeMap::new();
        for (variable, _) in COMPONENTS {
            let pool = private.pool(&names[variable], 8).await;
            pools.insert(variable.to_owned(), pool);
        }
        let nats = NatsServer::spawn().await;
        let js = jetstream::new(connect_nats(&nats.url()).await);
        for (name, subjects) in [(EVENTS, "roles.>"), (ACCOUNTS, "accounts.>")] {
            StreamSpec {
                name: name.into(),
                subjects: vec![subjects.into()],
                storage: StorageType::Memory,
                ..Default::default()
            }
            .ensure(&js)
            .await
            .expect("create the stream");
        }
        World {
            private,
            names,
            pools,
            js,
            _nats: nats,
            schemas: open_schemas(&[EVENT_TYPE.to_owned(), ORPHAN_TYPE.to_owned()]),
            runs: AtomicU64::new(0),
        }
    }

    fn pool(&self, variable: &str) -> &PgPool {
        &self.pools[variable]
    }

    /// The tables' owner, who sets the scene for a component.
    fn owner(&self) -> &PgPool {
        self.pool("migrator_role")
    }

    fn run(&self) -> u64 {
        self.runs.fetch_add(1, Ordering::Relaxed)
    }

    async fn as_owner(&self, statement: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
            .execute(self.owner())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    /// Runs the component of `variable` as its role.
    async fn component(&self, variable: &str) -> Result<(), String> {
        match variable {
            "emitter_role" => self.emit(EVENT_TYPE).await.map(drop),
            "consumer_role" => self.consume().await,
            "retention_role" => self.retain().await,
            "operator_role" => self.operate().await,
            other => panic!("no component runs as {other} alone"),
        }
    }

    /// A service emits an event of `event_type` and commits.
    async fn emit(&self, event_type: &str) -> Result<Uuid, String> {
        let mut tx = self.pool("emitter_role").begin().await.map_err(text)?;
        let event = raw_event(event_type, "roles", format!("s{}", self.run()));
        let id = tx
            .emit_raw(&self.schemas, event.build())
            .await
            .map_err(text)?;
        tx.commit().await.map_err(text)?;
        Ok(id)
    }

    /// A consumer opens its durable (gone since its last run: created again, from the dedupe
    /// horizon), and handles an event that fails twice, then applies with both kinds of
    /// freshness.
    async fn consume(&self) -> Result<(), String> {
        // its name registered, its durable made before and deleted since
        self.as_owner(&format!(
            "insert into outbox_consumer_names (consumer, event_type, stream, durable_created_at) \
             values ('{CONSUMER}', '{}', '{ACCOUNTS}', now()) on conflict do nothing",
            AccountOpened::EVENT_TYPE
        ))
        .await;
        let stream = self.js.get_stream(ACCOUNTS).await.expect("the stream");
        let _ = stream.delete_consumer(CONSUMER).await;

        let mut config = ConsumerConfig::new(CONSUMER, ACCOUNTS);
        config.max_attempts = 5;
        let consumer = Consumer::new(
            self.pool("consumer_role").clone(),
            self.js.clone(),
            config,
            FailsTwice::default(),
        );
        consumer.durable().await.map_err(text)?;
        let account_id = Uuid::now_v7();
        let envelope = Envelope::new(
            Uuid::now_v7(),
            AccountOpened::EVENT_TYPE,
            "roles",
            account_id.to_string(),
            Utc::now(),
            AccountOpened {
                account_id,
                owner: "roles".into(),
                n: 1,
            },
        );
        for delivered in 1..=3 {
            let delivery = consumer.delivery(envelope.clone(), delivered, delivered, None);
            let outcome = consumer.apply(&delivery).await.map_err(text)?;
            let expected = if delivered < 3 {
                matches!(outcome, Outcome::Retry { .. })
            } else {
                outcome == Outcome::Handled
            };
            if !expected {
                return Err(format!("delivery {delivered}: {outcome:?}"));
            }
        }
        Ok(())
    }

    /// Retention counts and prunes published rows and dedupe rows a month old.
    async fn retain(&self) -> Result<(), String> {
        self.as_owner(
            "delete from outbox_events where published_at < now() - interval '7 days'; \
             delete from outbox_consumed where consumed_at < now() - interval '7 days'; \
             insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
             select gen_random_uuid(), 'roles.row.changed', 'roles', 'old', now(), '{}', \
                    now() - interval '30 days', now() - interval '30 days' \
               from generate_series(1, 10); \
             insert into outbox_consumed (consumer, event_id, consumed_at) \
             select 'old', gen_random_uuid(), now() - interval '30 days' from generate_series(1, 10)",
        )
        .await;
        let pool = self.pool("retention_role");
        let keep = Duration::from_secs(7 * 24 * 3600);
        let counted = retention::count_prunable(pool, keep).await.map_err(text)?;
        let published = retention::prune_published(pool, keep, 100)
            .await
            .map_err(text)?;
        let dedupe = retention::prune_dedupe(pool, keep, 100)
            .await
            .map_err(text)?;
        if (counted, published, dedupe) != (10, 10, 10) {
            return Err(format!(
                "counted {counted}, pruned {published} published and {dedupe} dedupe rows, not 10 each"
            ));
        }
        Ok(())
    }

    /// The operator reads the status and releases a held row.
    async fn operate(&self) -> Result<(), String> {
        let id = Uuid::now_v7();
        let subject = format!("held-{}", self.run());
        self.as_owner(&format!(
            "insert into outbox_events (id, event_type, source, subject, time, data, attempts) \
             values ('{id}', '{EVENT_TYPE}', 'roles', '{subject}', now(), '{{}}', 20); \
             insert into outbox_retries (subject, event_id, retry_at, reason) \
             values ('{subject}', '{id}', null, 'it is at the attempt cap (20 of 20)')"
        ))
        .await;
        let pool = self.pool("operator_role");
        let s = status::status(pool, 20).await.map_err(text)?;
        if s.held_total < 1 {
            return Err(format!("status shows no held row: {s:?}"));
        }
        let released = status::unblock(pool, &Unblock::Ids(vec![id]), 20)
            .await
            .map_err(text)?;
        if released != [id] {
            return Err(format!("unblock released {released:?}"));
        }
        // gone, published or not: the next run holds a row of its own
        self.as_owner(&format!("delete from outbox_events where id = '{id}'"))
            .await;
        Ok(())
    }

    /// Whether `statement`, run as the role of `variable`, is refused for want of a right.
    async fn refused(&self, variable: &str, statement: &str) -> bool {
        let result = sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
            .execute(self.pool(variable))
            .await;
        match result {
            Err(e) => is_permission(&e.to_string()),
            Ok(_) => false,
        }
    }

    /// The rights the role of `variable` holds on the tables of `public`, as the catalog has
    /// them: `(table, privilege, column)`.
    async fn held_rights(&self, variable: &str) -> BTreeSet<(String, String, Option<String>)> {
        let role = &self.names[variable];
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "select c.relname::text, lower(a.privilege_type), null::text \
               from pg_class c, aclexplode(c.relacl) a \
              where c.relnamespace = 'public'::regnamespace and a.grantee = $1::regrole \
             union all \
             select c.relname::text, lower(a.privilege_type), att.attname::text \
               from pg_attribute att join pg_class c on c.oid = att.attrelid, \
                    aclexplode(att.attacl) a \
              where c.relnamespace = 'public'::regnamespace and a.grantee = $1::regrole",
        )
        .bind(role)
        .fetch_all(self.owner())
        .await
        .expect("read the catalog's rights");
        rows.into_iter().collect()
    }
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn is_permission(message: &str) -> bool {
    message.contains("permission denied")
}

/// Fails its first two calls; then applies with both kinds of freshness.
#[derive(Default)]
struct FailsTwice {
    calls: Arc<AtomicU32>,
}

impl Handler<AccountOpened> for FailsTwice {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err("not yet".into());
        }
        delivery.freshness(tx).await?;
        order::advance(
            tx,
            delivery.consumer(),
            &delivery.envelope.subject,
            delivery.envelope.time,
        )
        .await?;
        Ok(())
    }
}

/// What each role must be refused (besides what the catalog check rules out).
const FORBIDDEN: [(&str, &str); 15] = [
    (
        "emitter_role",
        "insert into outbox_events (id, event_type, source, subject, time, data, published_at) \
         values (gen_random_uuid(), 'roles.row.changed', 'x', 'x', now(), '{}', now())",
    ),
    (
        "emitter_role",
        "update outbox_events set published_at = now()",
    ),
    ("emitter_role", "update outbox_retries set retry_at = null"),
    (
        "emitter_role",
        "insert into outbox_retries (subject, event_id, reason) values ('x', gen_random_uuid(), 'x')",
    ),
    ("emitter_role", "delete from outbox_relay_lease"),
    (
        "emitter_role",
        "insert into outbox_relay_lease (name, holder, expires_at) values ('relay', gen_random_uuid(), 'infinity')",
    ),
    ("emitter_role", "select count(*) from outbox_events"),
    ("consumer_role", "select count(*) from outbox_events"),
    ("consumer_role", "delete from outbox_retries"),
    ("retention_role", "update outbox_events set published_at = now()"),
    ("operator_role", "update outbox_events set published_at = now()"),
    ("operator_role", "delete from outbox_events"),
    (
        "relay_role",
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         values (gen_random_uuid(), 'roles.row.changed', 'x', 'x', now(), '{}')",
    ),
    ("relay_role", "delete from outbox_events"),
    (
        "relay_role",
        "insert into outbox_consumed (consumer, event_id) values ('x', gen_random_uuid())",
    ),
];

#[tokio::test]
async fn each_component_works_as_its_role_with_exactly_the_grants_of_ops_postgres() {
    let warnings = outbox_tests::warnings::Warnings::default();
    // a current-thread runtime: the recorder hears the relay's tasks too
    let _recording = warnings.record();
    let w = World::new().await;
    let grants = grants();
    // A right given by hand goes at the file's next run (after the next migrate, say).
    w.as_owner(&format!(
        "grant all on outbox_retries, outbox_consumed to {}",
        quoted(&w.names["emitter_role"])
    ))
    .await;
    run_file(
        &w.private.url(&w.names["migrator_role"], "outbox"),
        "grants.sql",
    );

    // Each role holds exactly the file's rights (nothing through PUBLIC, nothing on other tables).
    for (variable, component) in COMPONENTS.iter().skip(1) {
        let expected: BTreeSet<(String, String, Option<String>)> = grants
            .iter()
            .filter(|g| g.variable == *variable)
            .flat_map(|g| {
                g.rights()
                    .into_iter()
                    .map(|(privilege, column)| (g.table.clone(), privilege, column))
            })
            .collect();
        assert!(!expected.is_empty(), "grants.sql gives {component} nothing");
        assert_eq!(
            w.held_rights(variable).await,
            expected,
            "the rights of {component}'s role"
        );
    }
    for (variable, statement) in FORBIDDEN {
        assert!(
            w.refused(variable, statement).await,
            "{variable} may run `{statement}`"
        );
    }
    for (variable, _) in COMPONENTS.iter().skip(1) {
        assert!(
            w.refused(variable, "truncate outbox_events").await
                && w.refused(variable, "create table outbox_mine (id int)")
                    .await,
            "{variable} may truncate or create tables"
        );
    }

    // The relay, as it runs today, publishes what the service emits and holds what no stream
    // takes, with its role's rights.
    let relay = Arc::new(
        Relay::new(
            w.pool("relay_role").clone(),
            w.js.clone(),
            RelayConfig::default(),
        )
        .await
        .expect("a relay as its role"),
    );
    let (stop, running) = run_relay(relay.clone());
    let mut emitted = Vec::new();
    for _ in 0..20 {
        emitted.push(w.emit(EVENT_TYPE).await.expect("emit as the emitting role"));
    }
    let orphan = w
        .emit(ORPHAN_TYPE)
        .await
        .expect("emit as the emitting role");
    eventually(
        Duration::from_secs(30),
        "the relay publishes the events and holds the orphan",
        || async {
            let (published, held): (i64, i64) = sqlx::query_as(
                "select count(*) filter (where published_at is not null and id = any($1)), \
                        (select count(*) from outbox_retries where event_id = $2 and retry_at is null) \
                   from outbox_events",
            )
            .bind(&emitted)
            .bind(orphan)
            .fetch_one(w.owner())
            .await
            .expect("read the table");
            published == emitted.len() as i64 && held == 1
        },
    )
    .await;
    let leases: i64 =
        sqlx::query_scalar("select count(*) from outbox_relay_lease where expires_at > now()")
            .fetch_one(w.owner())
            .await
            .expect("read the lease");
    assert_eq!(leases, 1, "the relay holds the lease");

    // Every other component works as its role, the relay running beside them.
    for (variable, component) in COMPONENTS.iter().skip(2) {
        w.component(variable)
            .await
            .unwrap_or_else(|e| panic!("{component}, as its role: {e}"));
    }
    let report = verify(
        w.pool("operator_role"),
        &w.js,
        &VerifyOptions::new(EVENTS, Utc::now() - chrono::TimeDelta::hours(1), Utc::now()),
        |_| {},
    )
    .await
    .expect("outbox verify as the operator's role");
    // (the range starts before the stream's first message, so it is not all verified)
    assert!(report.missing == 0 && report.present >= 20, "{report:?}");
    drop(stop);
    running.await.expect("relay task");
    let denied: Vec<String> = warnings
        .messages()
        .into_iter()
        .filter(|m| is_permission(m))
        .collect();
    assert!(
        denied.is_empty(),
        "the relay's role lacks a right: {denied:?}"
    );

    // Each right but the relay's is needed: without it, its component fails.
    let (mut unneeded, mut checked) = (Vec::new(), 0);
    for grant in grants.iter().filter(|g| g.variable != "relay_role") {
        let role = quoted(&w.names[&grant.variable]);
        for (privilege, column) in grant.rights() {
            let right = match &column {
                Some(column) => format!("{privilege} ({column})"),
                None => privilege.clone(),
            };
            w.as_owner(&format!("revoke {right} on {} from {role}", grant.table))
                .await;
            let without = w.component(&grant.variable).await;
            checked += 1;
            w.as_owner(&grant.sql(&w.names)).await;
            match without {
                Err(e) if is_permission(&e) => {}
                other => unneeded.push(format!(
                    "{} works without {right} on {} ({other:?})",
                    grant.variable, grant.table
                )),
            }
        }
    }
    eprintln!("{checked} rights taken away in turn");
    assert!(
        unneeded.is_empty(),
        "grants.sql gives rights their components do not need:\n{}",
        unneeded.join("\n")
    );
    // and each still works with every right back
    for (variable, component) in COMPONENTS.iter().skip(2) {
        w.component(variable)
            .await
            .unwrap_or_else(|e| panic!("{component}, its rights back: {e}"));
    }
}
