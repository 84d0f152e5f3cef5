//! The writers: sequential writers, transactions on shared subjects, poison rows and their
//! repairs, and the held subject with many rows. Every write goes straight to Postgres as the
//! superuser (the service's side, not the relay's), and every outcome goes into the history.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::{EmitExt, RawEvent, Schemas};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use tokio::time::Instant;
use uuid::Uuid;

use crate::history::{EventRecord, History, Outcome, PoisonRecord, Role};
use crate::schedule::{CreatedAt, EventSpec, Insert, PoisonKind, Shape, Writer, EVENT_TYPES};
use crate::servers::Servers;

/// The writer number of poison row `id`'s subject (its head, then its followers, in order).
pub const POISON_WRITER: usize = 1000;
/// The poison id of the held subject with many rows.
pub const HELD_MANY: usize = 999;
/// The held subject with many rows.
pub const HELD_MANY_SUBJECT: &str = "hm";
/// How long a prepared transaction's `COMMIT PREPARED` is retried (Postgres restarting).
const COMMIT_PREPARED_PATIENCE: Duration = Duration::from_secs(120);

/// The event type of poison row `id` when it is an uncaptured type: no stream captures it
/// until a repair creates `UX<id>`.
pub fn uncaptured_type(id: usize) -> String {
    format!("ux{id}.thing.changed")
}

/// The writers of a run.
#[derive(Debug)]
pub struct Workload {
    pool: PgPool,
    schemas: Schemas,
    history: Arc<History>,
    servers: Arc<Servers>,
    start: Instant,
}

impl Workload {
    /// Writers on `servers`' database, recording into `history`; `start` is the schedule's
    /// time zero.
    pub fn new(servers: Arc<Servers>, history: Arc<History>, start: Instant) -> Workload {
        let types: Vec<String> = EVENT_TYPES.iter().map(|t| (*t).to_owned()).collect();
        Workload {
            pool: servers.admin.clone(),
            schemas: outbox_testkit::open_schemas(&types),
            history,
            servers,
            start,
        }
    }

    /// Runs sequential writer `n` to the end of its emits: one transaction at a time, each
    /// after the previous one ended (a failure does not stop it).
    pub async fn writer(&self, n: usize, writer: &Writer) {
        for (seq, emit) in writer.emits.iter().enumerate() {
            tokio::time::sleep_until(self.start + emit.at).await;
            let label = format!("{}#{seq}", writer.name);
            self.transaction(
                &label,
                std::slice::from_ref(&emit.event),
                emit.shape,
                |_| (Role::Healthy, Some((n, seq))),
            )
            .await;
        }
    }

    /// One transaction on shared subjects.
    pub async fn shared(&self, label: &str, events: &[EventSpec], shape: Shape) {
        self.transaction(label, events, shape, |_| (Role::Healthy, None))
            .await;
    }

    /// Writes `events` in one transaction of `shape`, recording each with the role and writer
    /// position `role(i)` gives the `i`th.
    async fn transaction(
        &self,
        label: &str,
        events: &[EventSpec],
        shape: Shape,
        role: impl Fn(usize) -> (Role, Option<(usize, usize)>),
    ) {
        let began = Utc::now();
        let records: Vec<usize> = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (role, writer) = role(i);
                let label = if events.len() > 1 {
                    format!("{label}.{i}")
                } else {
                    label.to_owned()
                };
                self.history.event(EventRecord {
                    label,
                    id: None,
                    subject: e.subject.clone(),
                    event_type: e.event_type.clone(),
                    insert: e.insert,
                    shape,
                    writer,
                    role,
                    began,
                    outcome: Outcome::Pending,
                })
            })
            .collect();
        let outcome = self.run(label, events, shape, &records).await;
        for n in records {
            self.history.outcome(n, outcome.clone());
        }
    }

    async fn run(
        &self,
        label: &str,
        events: &[EventSpec],
        shape: Shape,
        records: &[usize],
    ) -> Outcome {
        let failed = |e: &dyn std::fmt::Display| Outcome::Failed(Utc::now(), e.to_string());
        let mut conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => return failed(&e),
        };
        // a connection whose transaction ended in an unknown state is closed, not given back
        macro_rules! give_up {
            ($outcome:expr) => {{
                conn.close_on_drop();
                return $outcome;
            }};
        }
        if let Err(e) = sqlx::query("begin").execute(&mut *conn).await {
            give_up!(failed(&e));
        }
        if let Shape::SleepBefore(d) = shape {
            // the transaction has begun: the column default `now()` is this instant
            tokio::time::sleep(d).await;
        }
        for (event, &record) in events.iter().zip(records) {
            match self.insert(&mut conn, label, event).await {
                Ok(id) => self.history.event_id(record, id),
                Err(e) => give_up!(failed(&e)),
            }
        }
        match shape {
            Shape::SleepAfter(d) => tokio::time::sleep(d).await,
            Shape::RolledBack => {
                // a rollback that fails (a lost connection) aborts the transaction all the same
                if sqlx::query("rollback").execute(&mut *conn).await.is_err() {
                    conn.close_on_drop();
                }
                return Outcome::RolledBack(Utc::now());
            }
            _ => {}
        }
        if let Shape::Prepared(d) = shape {
            let gid = format!("hx-{label}-{}", Uuid::now_v7().simple());
            let prepare = format!("prepare transaction '{gid}'");
            // the gid is the harness's own
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(prepare))
                .execute(&mut *conn)
                .await
            {
                // refused (an emit that notified cannot be prepared): rolled back
                give_up!(failed(&format!("prepare refused: {e}")));
            }
            drop(conn);
            tokio::time::sleep(d).await;
            return self.commit_prepared(&gid).await;
        }
        match sqlx::query("commit").execute(&mut *conn).await {
            Ok(_) => Outcome::Committed(Utc::now()),
            Err(e) => give_up!(Outcome::Unknown(Utc::now(), e.to_string())),
        }
    }

    /// `COMMIT PREPARED`, again while Postgres restarts; a transaction that is gone after an
    /// unanswered try was committed by it (or not: the table says).
    async fn commit_prepared(&self, gid: &str) -> Outcome {
        let end = Instant::now() + COMMIT_PREPARED_PATIENCE;
        let statement = format!("commit prepared '{gid}'");
        let mut tried = false;
        loop {
            match sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .execute(&self.pool)
                .await
            {
                Ok(_) => return Outcome::Committed(Utc::now()),
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42704") && tried => {
                    return Outcome::Unknown(Utc::now(), e.to_string())
                }
                Err(e) if Instant::now() >= end => {
                    return Outcome::Unknown(Utc::now(), format!("commit prepared: {e}"))
                }
                Err(_) => {
                    tried = true;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Inserts one event on `conn`, in its transaction; its id.
    async fn insert(
        &self,
        conn: &mut PgConnection,
        label: &str,
        event: &EventSpec,
    ) -> Result<Uuid, String> {
        let data = json!({ "label": label });
        let created_at = match event.insert {
            Insert::Emit => {
                let raw = RawEvent {
                    event_type: event.event_type.clone(),
                    source: "harness".into(),
                    subject: event.subject.clone(),
                    time: None,
                    data,
                };
                return conn
                    .emit_raw(&self.schemas, raw)
                    .await
                    .map_err(|e| e.to_string());
            }
            Insert::Raw(created_at) => created_at,
        };
        let id = Uuid::now_v7();
        let value = match created_at {
            CreatedAt::Default => "default".to_owned(),
            CreatedAt::Clock => "clock_timestamp()".to_owned(),
            CreatedAt::Skewed(ms) => format!("clock_timestamp() + interval '{ms} milliseconds'"),
            CreatedAt::Fixed(at) => format!("'{at}'::timestamptz"),
        };
        let sql = format!(
            "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
             values ($1, $2, 'harness', $3, now(), $4, {value})"
        );
        // `value` is one of the schedule's fixed forms
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(&event.event_type)
            .bind(&event.subject)
            .bind(data)
            .execute(conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(id)
    }

    /// Poison row `id` of `kind` on its own subject, then `followers` healthy events behind
    /// it, each committed before the next.
    pub async fn poison(&self, id: usize, kind: PoisonKind, followers: usize) {
        let subject = crate::schedule::Schedule::poison_subject(id);
        // the head is known before the insert: whether it committed, the table says (an
        // insert whose answer was lost may have)
        let head = Uuid::now_v7();
        self.history.poison(PoisonRecord {
            id,
            kind,
            subject: subject.clone(),
            head,
            repaired: None,
            unblocked: Vec::new(),
            rows_behind: 0,
        });
        let (event_type, data, created_at, time, attempts) = poison_row(id, kind);
        let record = self.history.event(EventRecord {
            label: format!("p{id}"),
            id: Some(head),
            subject: subject.clone(),
            event_type: event_type.clone(),
            insert: Insert::Raw(CreatedAt::Clock),
            shape: Shape::Plain,
            writer: Some((POISON_WRITER + id, 0)),
            role: Role::Poison(id),
            began: Utc::now(),
            outcome: Outcome::Pending,
        });
        let sql = format!(
            "insert into outbox_events (id, event_type, source, subject, time, data, created_at, attempts) \
             values ($1, $2, 'harness', $3, {time}, {data}, {created_at}, {attempts})"
        );
        // the expressions are the harness's own, per kind
        let inserted = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(head)
            .bind(&event_type)
            .bind(&subject)
            .execute(&self.pool)
            .await;
        let outcome = match inserted {
            Ok(_) => Outcome::Committed(Utc::now()),
            Err(e) => Outcome::Unknown(Utc::now(), e.to_string()),
        };
        self.history.outcome(record, outcome);
        for n in 0..followers {
            let event = if kind == PoisonKind::Uncaptured {
                EventSpec {
                    subject: subject.clone(),
                    event_type: uncaptured_type(id),
                    insert: Insert::Raw(CreatedAt::Clock),
                }
            } else {
                EventSpec {
                    subject: subject.clone(),
                    event_type: EVENT_TYPES[0].to_owned(),
                    insert: Insert::Emit,
                }
            };
            let label = format!("p{id}.f{}", n + 1);
            self.transaction(&label, &[event], Shape::Plain, |_| {
                (Role::Follower(id), Some((POISON_WRITER + id, n + 1)))
            })
            .await;
        }
    }

    /// Fixes poison row `id`'s cause, then `outbox unblock --id` it.
    pub async fn repair(&self, id: usize) {
        let Some(poison) = self.history.poison_record(id) else {
            return;
        };
        let head = poison.head;
        let fix = match poison.kind {
            PoisonKind::CreatedAtInfinity
            | PoisonKind::CreatedAtYear50000
            | PoisonKind::CreatedAtBc => Some("created_at = now()"),
            PoisonKind::TimeInfinity => Some("time = now()"),
            PoisonKind::DeepJson | PoisonKind::OverMaxPayload | PoisonKind::OverMaxMsgSize => {
                Some("data = '{\"trimmed\": true}'")
            }
            PoisonKind::Wildcard
            | PoisonKind::Dollar
            | PoisonKind::Whitespace
            | PoisonKind::LongType => Some("event_type = 'hx.account.changed'"),
            // the cap is what unblock resets; the type needs a stream
            PoisonKind::AtAttemptCap | PoisonKind::Uncaptured => None,
        };
        if let Some(fix) = fix {
            let sql = format!("update outbox_events set {fix} where id = $1");
            // `fix` is one of the constants above
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(head)
                .execute(&self.pool)
                .await
            {
                self.history
                    .note(format!("p{id}'s repair failed: {e}; not repaired"));
                return;
            }
        }
        if poison.kind == PoisonKind::Uncaptured {
            let name = format!("UX{id}");
            self.servers
                .create_stream(&name, &format!("ux{id}.>"))
                .await;
        }
        if self.unblock_cli(id, &poison.subject).await {
            self.history
                .poison_update(id, |p| p.repaired = Some(Utc::now()));
        }
    }

    /// `outbox unblock --id` poison row `id` without fixing it (for a row at the cap that is
    /// its repair).
    pub async fn unblock(&self, id: usize) {
        let Some(poison) = self.history.poison_record(id) else {
            return;
        };
        if self.unblock_cli(id, &poison.subject).await {
            let now = Utc::now();
            self.history.poison_update(id, |p| {
                p.unblocked.push(now);
                if p.kind == PoisonKind::AtAttemptCap {
                    p.repaired = Some(now);
                }
            });
        }
    }

    /// Runs `outbox unblock --subject <subject>` as the operator, for poison row `id` (its
    /// subject's, which is its own: a follower of a type no stream captures is held in its
    /// place when the head's insert failed); whether it succeeded.
    async fn unblock_cli(&self, id: usize, subject: &str) -> bool {
        let bin = match crate::relays::outbox_binary() {
            Ok(bin) => bin,
            Err(e) => panic!("{e}"),
        };
        let url = self.servers.root_url();
        let args = subject.to_owned();
        let output = tokio::task::spawn_blocking(move || {
            Command::new(bin)
                .args(["unblock", "--subject", &args])
                .env_clear()
                .env("DATABASE_URL", url)
                .env("OUTBOX_LOG", "warn")
                .stdin(Stdio::null())
                .output()
        })
        .await
        .expect("run outbox unblock");
        match output {
            Ok(o) if o.status.success() => {
                let said = String::from_utf8_lossy(&o.stdout);
                self.history.note(format!(
                    "outbox unblock --subject {subject} (p{id}): {}",
                    said.lines().last().unwrap_or("")
                ));
                true
            }
            Ok(o) => {
                self.history.note(format!(
                    "outbox unblock --subject {subject} (p{id}) failed with {}: {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                false
            }
            Err(e) => {
                self.history
                    .note(format!("outbox unblock could not run: {e}"));
                false
            }
        }
    }

    /// The held subject: a head of a type no stream captures, and `rows` rows behind it,
    /// inserted in one statement.
    pub async fn held_many(&self, rows: u64) {
        let head = Uuid::now_v7();
        let event_type = "uxmany.thing.changed";
        self.history.poison(PoisonRecord {
            id: HELD_MANY,
            kind: PoisonKind::Uncaptured,
            subject: HELD_MANY_SUBJECT.into(),
            head,
            repaired: None,
            unblocked: Vec::new(),
            rows_behind: rows,
        });
        let record = self.history.event(EventRecord {
            label: "hm".into(),
            id: Some(head),
            subject: HELD_MANY_SUBJECT.into(),
            event_type: event_type.into(),
            insert: Insert::Raw(CreatedAt::Clock),
            shape: Shape::Plain,
            writer: None,
            role: Role::Poison(HELD_MANY),
            began: Utc::now(),
            outcome: Outcome::Pending,
        });
        let mut tx = match self.pool.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                self.history
                    .outcome(record, Outcome::Failed(Utc::now(), e.to_string()));
                return;
            }
        };
        let head_row = sqlx::query(
            "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
             values ($1, $2, 'harness', $3, now(), '{}', clock_timestamp())",
        )
        .bind(head)
        .bind(event_type)
        .bind(HELD_MANY_SUBJECT)
        .execute(&mut *tx)
        .await;
        let behind = sqlx::query(
            "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
             select gen_random_uuid(), $1, 'harness', $2, now(), jsonb_build_object('n', n), clock_timestamp() \
               from generate_series(1, $3::int8) n",
        )
        .bind(event_type)
        .bind(HELD_MANY_SUBJECT)
        .bind(rows as i64)
        .execute(&mut *tx)
        .await;
        let outcome = match (head_row, behind) {
            (Ok(_), Ok(_)) => match tx.commit().await {
                Ok(()) => Outcome::Committed(Utc::now()),
                Err(e) => Outcome::Unknown(Utc::now(), e.to_string()),
            },
            (Err(e), _) | (_, Err(e)) => Outcome::Failed(Utc::now(), e.to_string()),
        };
        self.history.outcome(record, outcome);
    }
}

/// A poison row of `kind` as SQL: its event type, and the expressions of its `data`,
/// `created_at`, `time` and `attempts`.
fn poison_row(id: usize, kind: PoisonKind) -> (String, String, String, String, String) {
    let mut event_type = EVENT_TYPES[0].to_owned();
    let mut data = "'{}'::jsonb".to_owned();
    let mut created_at = "clock_timestamp()".to_owned();
    let mut time = "now()".to_owned();
    let mut attempts = "0".to_owned();
    match kind {
        PoisonKind::CreatedAtInfinity => created_at = "'infinity'".into(),
        PoisonKind::TimeInfinity => time = "'infinity'".into(),
        PoisonKind::CreatedAtYear50000 => created_at = "'50000-01-01 00:00:00+00'".into(),
        PoisonKind::CreatedAtBc => created_at = "'0044-03-15 00:00:00+00 BC'".into(),
        // serde_json stops at 128 levels
        PoisonKind::DeepJson => data = "(repeat('[', 300) || repeat(']', 300))::jsonb".into(),
        PoisonKind::AtAttemptCap => {
            attempts = outbox_runtime::RelayConfig::default()
                .max_attempts
                .to_string()
        }
        PoisonKind::Wildcard => event_type = "hx.bad.*".into(),
        PoisonKind::Dollar => event_type = "hx.$bad.thing".into(),
        PoisonKind::Whitespace => event_type = "hx.bad thing.changed".into(),
        PoisonKind::LongType => event_type = format!("hx.{}.changed", "a".repeat(260)),
        PoisonKind::OverMaxPayload => {
            data = "jsonb_build_object('blob', repeat('x', 1100000))".into()
        }
        PoisonKind::Uncaptured => event_type = uncaptured_type(id),
        PoisonKind::OverMaxMsgSize => {
            data = "jsonb_build_object('blob', repeat('x', 300000))".into()
        }
    }
    (event_type, data, created_at, time, attempts)
}
