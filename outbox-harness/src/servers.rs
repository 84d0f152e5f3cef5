//! The run's own servers: a Postgres (with the outbox migrations, prepared transactions
//! enabled, a relay role and a retention role of least privilege, and a ledger of the rows
//! deleted) and a nats-server or a three-node JetStream cluster, with the run's stream.
//! Nothing here touches the shared services.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use outbox_runtime::{StorageType, StreamSpec};
use outbox_testkit::{nats_server_binary, NatsCluster, NatsServer, PgServer, PgServerConfig};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::schedule::{Topology, STREAM_SUBJECTS};

/// The run's database.
pub const DATABASE: &str = "harness";
/// The role the relays log in as: no superuser, no `pg_read_all_stats`.
pub const RELAY_ROLE: &str = "outbox_relay";
/// The role the retention task logs in as.
pub const RETENTION_ROLE: &str = "outbox_retention";
/// The role the consumer's replicas log in as.
pub const CONSUMER_ROLE: &str = "outbox_consumer";
/// The role of another user of the database: nothing but `CONNECT` and `USAGE` on `public`
/// (every role has both by default; it interferes with the
/// relays: [`Intrusion`](crate::schedule::Intrusion)).
pub const INTRUDER_ROLE: &str = "harness_intruder";
/// The run's main stream, capturing [`STREAM_SUBJECTS`].
pub const STREAM: &str = "HX";
/// The main stream's `max_msg_size`, so that a row can be refused by the stream for good
/// while it fits the server's `max_payload` (1 MiB).
pub const MAX_MSG_SIZE: i32 = 256 * 1024;

/// What the relay role is granted, table by table: the relay's lines of
/// `ops/postgres/grants.sql`, and nothing on the consumer tables or the migrations' own. A
/// table a later migration drops is skipped; a table the relay comes to need shows as a relay
/// that refuses to start or dies with "permission denied", which names it.
pub const RELAY_GRANTS: [(&str, &str); 3] = [
    // it reads unpublished rows and marks them published or failed; it never inserts or
    // deletes an event
    ("outbox_events", "select, update (published_at, attempts)"),
    // its retry schedule and held rows
    ("outbox_retries", "select, insert, update, delete"),
    // the relay lease
    ("outbox_relay_lease", "select, insert, update"),
];

/// What the retention role is granted: the retention lines of `ops/postgres/grants.sql`.
pub const RETENTION_GRANTS: [(&str, &str); 3] = [
    // it deletes spent rows, locked `for update skip locked`, which needs an update right
    ("outbox_events", "select, delete, update (tracestate)"),
    ("outbox_consumed", "select, delete, update (consumed_at)"),
    // the dedupe horizon it records before pruning dedupe rows
    ("outbox_dedupe_horizon", "select, insert, update"),
];

/// What the consumer role is granted: the consumer lines of `ops/postgres/grants.sql` (its
/// handler's own table, `harness_applied`, is granted on its own in [`APPLIED_LEDGER`]).
pub const CONSUMER_GRANTS: [(&str, &str); 6] = [
    // its dedupe rows: a failed attempt deletes the one it inserted
    (
        "outbox_consumed",
        "select (consumer, event_id), insert, delete",
    ),
    ("outbox_consumer_attempts", "select, insert, update, delete"),
    ("outbox_consumer_names", "select, insert, update"),
    ("outbox_dedupe_horizon", "select"),
    ("outbox_subject_positions", "select, insert, update"),
    ("outbox_subject_sequences", "select, insert, update"),
];

/// What the consumer's handler writes, one row each time it applies an event, in the
/// consumer's transaction: no key, so an event applied twice shows as two rows.
pub const APPLIED_LEDGER: [&str; 2] = [
    "create table harness_applied (event_id uuid not null, subject text not null, \
       stream_sequence bigint not null, delivered bigint not null, replica int not null, \
       applied_at timestamptz not null default clock_timestamp())",
    "grant insert on harness_applied to outbox_consumer",
];

/// A ledger of every row deleted from `outbox_events`, written by a trigger in the deleting
/// transaction (so that a row retention deleted is still a committed row to the checker, with
/// its last `published_at` and `attempts`, when and by whom it was deleted). The harness's
/// own; the function runs as its owner, so the deleting role needs no right on the ledger.
/// With it, the table is vacuumed after 50 dead rows whatever its size (the held subject's
/// rows would otherwise put it off for tens of thousands of deletes).
const PRUNE_LEDGER: [&str; 4] = [
    "create table harness_pruned (id uuid primary key, subject text not null, \
       created_at text not null, published_at timestamptz, attempts int not null, \
       pruned_at timestamptz not null default clock_timestamp(), \
       pruned_by text not null default session_user)",
    "create function harness_record_prune() returns trigger language plpgsql \
       security definer set search_path = public as $$ begin \
       insert into harness_pruned (id, subject, created_at, published_at, attempts) \
       values (old.id, old.subject, old.created_at::text, old.published_at, old.attempts); \
       return old; end $$",
    "create trigger harness_record_prune after delete on outbox_events \
       for each row execute function harness_record_prune()",
    "alter table outbox_events set \
       (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 50)",
];

/// Fails, naming how to install them, when the binaries a run needs are missing.
pub fn preflight() -> Result<(), String> {
    let postgres = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|v| v.ok())
        .any(|v| v.path().join("bin/initdb").exists() && v.path().join("bin/pg_ctl").exists());
    if !postgres {
        return Err(
            "the harness runs a Postgres of its own and needs initdb and pg_ctl under \
             /usr/lib/postgresql/*/bin: run `scripts/services` (it installs them), or install \
             the `postgresql` package"
                .into(),
        );
    }
    let nats = nats_server_binary();
    let runs = std::process::Command::new(&nats)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !runs {
        return Err(format!(
            "the harness runs nats-servers of its own and cannot run {}: run `scripts/services` \
             (it installs nats-server), or set NATS_SERVER_BIN",
            nats.display()
        ));
    }
    Ok(())
}

/// The nats-server binary the runs use, and its version, in words.
pub fn nats_server_version() -> String {
    let bin = nats_server_binary();
    let version = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{} ({version})", bin.display())
}

/// The broker: one server or a cluster.
#[derive(Debug)]
pub enum Broker {
    /// One nats-server.
    Single(NatsServer),
    /// Three nodes.
    Cluster(NatsCluster),
}

impl Broker {
    /// The server of node `n`.
    pub fn node(&mut self, n: usize) -> &mut NatsServer {
        match self {
            Broker::Single(s) => s,
            Broker::Cluster(c) => &mut c.nodes[n].server,
        }
    }
}

/// The run's servers.
#[derive(Debug)]
pub struct Servers {
    /// The Postgres server.
    pub pg: Arc<PgServer>,
    /// A superuser's pool on the run's database (the writers', the checker's, the operator's).
    pub admin: PgPool,
    /// The broker, locked by whoever stops or starts a node.
    pub broker: tokio::sync::Mutex<Broker>,
    /// The nodes' client ports, in node order.
    pub node_ports: Vec<u16>,
    /// The nodes' names, in node order.
    pub node_names: Vec<String>,
    /// A client of the harness's own, straight to the broker.
    pub client: async_nats::Client,
    /// JetStream on it.
    pub js: jetstream::Context,
    /// The topology.
    pub topology: Topology,
}

impl Servers {
    /// Starts Postgres and the broker, migrates, creates the relay role and the stream.
    pub async fn start(topology: Topology) -> Servers {
        let pg = tokio::task::spawn_blocking(|| {
            PgServer::spawn_config(PgServerConfig {
                settings: vec![
                    ("max_prepared_transactions".into(), "32".into()),
                    ("max_connections".into(), "200".into()),
                    // vacuum soon after retention deletes, so new rows reuse the freed slots
                    // (and `ctid`s) while relays claim and mark by `ctid`
                    ("autovacuum_naptime".into(), "1".into()),
                ],
                ..PgServerConfig::default()
            })
        })
        .await
        .expect("start Postgres");
        let pg = Arc::new(pg);
        let server = PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg.url())
            .await
            .expect("connect to the run's Postgres");
        sqlx::query(sqlx::AssertSqlSafe(format!("create database {DATABASE}")))
            .execute(&server)
            .await
            .expect("create the run's database");
        server.close().await;
        let admin = PgPoolOptions::new()
            .max_connections(60)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&root_url(pg.port))
            .await
            .expect("connect to the run's database");
        outbox_runtime::migrate(&admin)
            .await
            .expect("apply the outbox migrations");
        create_role(&admin, RELAY_ROLE, &RELAY_GRANTS).await;
        create_role(&admin, RETENTION_ROLE, &RETENTION_GRANTS).await;
        create_role(&admin, CONSUMER_ROLE, &CONSUMER_GRANTS).await;
        create_role(&admin, INTRUDER_ROLE, &[]).await;
        for statement in PRUNE_LEDGER.iter().chain(&APPLIED_LEDGER) {
            sqlx::query(*statement)
                .execute(&admin)
                .await
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }

        let (broker, node_ports, node_names, client) = match topology {
            Topology::Single => {
                let server = NatsServer::spawn().await;
                let client = outbox_testkit::connect_nats(&server.url()).await;
                let (port, name) = (server.port(), server.name().to_owned());
                (Broker::Single(server), vec![port], vec![name], client)
            }
            Topology::Cluster => {
                // clients reach the nodes only through the addresses they were given (the
                // relays' proxies), not at the ones a cluster announces
                let cluster = NatsCluster::spawn_with(3, &["--no_advertise"]).await;
                let client = cluster.connect().await;
                let ports = cluster.nodes.iter().map(|n| n.server.port()).collect();
                let names = cluster
                    .nodes
                    .iter()
                    .map(|n| n.server.name().to_owned())
                    .collect();
                (Broker::Cluster(cluster), ports, names, client)
            }
        };
        let js = jetstream::new(client.clone());
        let servers = Servers {
            pg,
            admin,
            broker: tokio::sync::Mutex::new(broker),
            node_ports,
            node_names,
            client,
            js,
            topology,
        };
        servers.create_stream(STREAM, STREAM_SUBJECTS).await;
        servers
    }

    /// The superuser's URL of the run's database (straight to Postgres).
    pub fn root_url(&self) -> String {
        root_url(self.pg.port)
    }

    /// The retention role's URL of the run's database through the proxy on `port`.
    pub fn retention_url(&self, port: u16) -> String {
        format!("postgres://{RETENTION_ROLE}@127.0.0.1:{port}/{DATABASE}")
    }

    /// The consumer role's URL of the run's database through the proxy on `port`.
    pub fn consumer_url(&self, port: u16) -> String {
        format!("postgres://{CONSUMER_ROLE}@127.0.0.1:{port}/{DATABASE}")
    }

    /// The intruder role's URL of the run's database (straight to Postgres).
    pub fn intruder_url(&self) -> String {
        format!(
            "postgres://{INTRUDER_ROLE}@127.0.0.1:{}/{DATABASE}",
            self.pg.port
        )
    }

    /// The relay role's URL of the run's database through the proxy on `port`.
    pub fn relay_url(&self, port: u16) -> String {
        format!("postgres://{RELAY_ROLE}@127.0.0.1:{port}/{DATABASE}")
    }

    /// Creates (or finds) stream `name` capturing `subjects`: file storage, one replica per
    /// node, [`MAX_MSG_SIZE`].
    pub async fn create_stream(&self, name: &str, subjects: &str) {
        let spec = StreamSpec {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            storage: StorageType::File,
            replicas: self.node_ports.len(),
            ..StreamSpec::default()
        };
        let config = jetstream::stream::Config {
            max_message_size: MAX_MSG_SIZE,
            ..spec.to_config()
        };
        // a stream created during a fault (a node down, an election) may take a few tries
        let mut last = String::new();
        for _ in 0..150 {
            match self.js.get_or_create_stream(config.clone()).await {
                Ok(_) => return,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("stream {name} not created within 30 s: {last}");
    }

    /// The node leading the stream now, if one does and says so within a few seconds.
    pub async fn stream_leader(&self) -> Option<usize> {
        let ask = async {
            let mut stream = self.js.get_stream(STREAM).await.ok()?;
            let info = stream.info().await.ok()?;
            let leader = info.cluster.as_ref()?.leader.clone()?;
            self.node_names.iter().position(|n| *n == leader)
        };
        tokio::time::timeout(Duration::from_secs(5), ask)
            .await
            .ok()
            .flatten()
    }

    /// Asks the stream's leader to step down; the API's answer, or why there was none.
    pub async fn step_down(&self) -> Result<String, String> {
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}");
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            self.client.request(subject, "".into()),
        )
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
        .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&answer.payload).into_owned())
    }

    /// Stops Postgres (fast, or immediate: a crash).
    pub async fn pg_stop(&self, immediate: bool) {
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || if immediate { pg.crash() } else { pg.stop() })
            .await
            .expect("stop Postgres");
    }

    /// Starts Postgres again and waits until it accepts connections.
    pub async fn pg_start(&self) {
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || pg.start())
            .await
            .expect("start Postgres");
    }
}

fn root_url(port: u16) -> String {
    format!("postgres://root@127.0.0.1:{port}/{DATABASE}")
}

/// Creates login role `role` with `grants` on the tables that exist.
async fn create_role(admin: &PgPool, role: &str, grants: &[(&str, &str)]) {
    let mut statements = vec![
        format!("create role {role} login"),
        format!("grant connect on database {DATABASE} to {role}"),
        format!("grant usage on schema public to {role}"),
    ];
    for (table, privileges) in grants {
        let exists: bool = sqlx::query_scalar("select to_regclass($1) is not null")
            .bind(table)
            .fetch_one(admin)
            .await
            .expect("look the table up");
        if exists {
            statements.push(format!("grant {privileges} on {table} to {role}"));
        }
    }
    for statement in statements {
        // the statements are the harness's own constants
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(admin)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness's roles hold exactly their lines of `ops/postgres/grants.sql`, so that a
    /// grant the relay, retention or the consumer comes to need fails the harness as it fails
    /// a deployment.
    #[test]
    fn the_roles_are_granted_their_lines_of_the_grants_file() {
        let file = include_str!("../../ops/postgres/grants.sql");
        for (role, grants) in [
            ("relay_role", &RELAY_GRANTS[..]),
            ("retention_role", &RETENTION_GRANTS[..]),
            ("consumer_role", &CONSUMER_GRANTS[..]),
        ] {
            let suffix = format!(" to :\"{role}\";");
            let lines: Vec<&str> = file
                .lines()
                .filter(|l| l.starts_with("grant ") && l.ends_with(&suffix))
                .collect();
            let ours: Vec<String> = grants
                .iter()
                .map(|(table, privileges)| format!("grant {privileges} on {table}{suffix}"))
                .collect();
            assert_eq!(ours, lines, "{role}");
        }
    }
}
