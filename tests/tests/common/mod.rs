//! Shared helpers for the end-to-end suites.
//!
//! - [`TestDb`]: a fresh database per test (created on the server of `DATABASE_URL`, migrations
//!   applied), dropped when the value is dropped.
//! - [`Ctx`]: a database plus a NATS connection and a subject prefix unique to the test, with
//!   helpers to create the test's stream and read it back.
//! - [`NatsServer`]: a private `nats-server` (JetStream, free port, temporary store) that the
//!   test may stop and restart; it is killed when dropped.
//!
//! Defaults: `DATABASE_URL=postgres://root@127.0.0.1/test`, `NATS_URL=nats://127.0.0.1:4222`.
//! A missing service fails the test with the command that starts it (`scripts/services`).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures::StreamExt;
use outbox_runtime::{EmitExt, Envelope, RawEvent, Schemas, StorageType, StreamSpec};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

const START_SERVICES: &str = "start it with `scripts/services`";

/// `DATABASE_URL`, or the local default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://root@127.0.0.1/test".into())
}

/// `NATS_URL`, or the local default.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A name unique to this test: `t` and 12 lowercase hex digits (a valid subject token).
pub fn unique_token() -> String {
    // the last 12 hex digits of a UUIDv7 are random
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("t{}", &id[id.len() - 12..])
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A database of its own for one test; dropped (with its connections) when this is dropped.
pub struct TestDb {
    /// A pool on the test database.
    pub pool: PgPool,
    /// The database name.
    pub name: String,
    /// Connection options of the test database.
    pub options: PgConnectOptions,
    admin: PgConnectOptions,
}

impl TestDb {
    /// A fresh database with the outbox migrations applied.
    pub async fn new() -> TestDb {
        let db = TestDb::empty().await;
        outbox_runtime::migrate(&db.pool)
            .await
            .expect("apply the outbox migrations");
        db
    }

    /// A fresh database without any table.
    pub async fn empty() -> TestDb {
        let url = database_url();
        let admin = PgConnectOptions::from_str(&url).expect("DATABASE_URL is a postgres URL");
        let mut conn = admin.connect().await.unwrap_or_else(|e| {
            panic!(
                "cannot connect to Postgres at {url}: {e}; {START_SERVICES} (or set DATABASE_URL)"
            )
        });
        let name = format!("outbox_{}", unique_token());
        sqlx::query(&format!("create database {name}"))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
            .await
            .expect("connect to the test database");
        TestDb {
            pool,
            name,
            options,
            admin,
        }
    }

    /// Number of rows in `outbox_events` still unpublished.
    pub async fn unpublished(&self) -> i64 {
        sqlx::query_scalar("select count(*) from outbox_events where published_at is null")
            .fetch_one(&self.pool)
            .await
            .expect("count unpublished rows")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime: use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                if let Ok(mut conn) = admin.connect().await {
                    let _ = sqlx::query(&format!("drop database if exists {name} with (force)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Connects to NATS at `url`, failing with the command that starts it.
pub async fn connect_nats(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot connect to NATS at {url}: {e}; {START_SERVICES} (or set NATS_URL)")
        })
}

/// One message read back from a stream.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The stream sequence.
    pub seq: u64,
    /// The NATS subject it was published on.
    pub subject: String,
    /// Its `Nats-Msg-Id` header.
    pub msg_id: String,
    /// Its `Content-Type` header.
    pub content_type: String,
    /// The decoded body.
    pub envelope: Envelope,
}

/// A test's database, NATS connection and unique subject prefix.
pub struct Ctx {
    /// The test database (migrated).
    pub db: TestDb,
    /// The NATS client.
    pub client: async_nats::Client,
    /// JetStream on `client`.
    pub js: jetstream::Context,
    /// The test's first subject token: every event type of the test starts with it.
    pub prefix: String,
}

impl Ctx {
    /// A fresh database and the shared NATS server.
    pub async fn new() -> Ctx {
        Ctx::with_nats(&nats_url()).await
    }

    /// A fresh database and the NATS server at `url`.
    pub async fn with_nats(url: &str) -> Ctx {
        let db = TestDb::new().await;
        let client = connect_nats(url).await;
        let js = jetstream::new(client.clone());
        Ctx {
            db,
            client,
            js,
            prefix: unique_token(),
        }
    }

    /// The pool on the test database.
    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// `<prefix>.<rest>`: an event type (and subject) private to this test.
    pub fn event_type(&self, rest: &str) -> String {
        format!("{}.{rest}", self.prefix)
    }

    /// The name of the test's stream.
    pub fn stream_name(&self) -> String {
        self.prefix.to_uppercase()
    }

    /// The spec of the test's stream: memory storage, capturing `<prefix>.>`.
    pub fn stream_spec(&self) -> StreamSpec {
        StreamSpec {
            name: self.stream_name(),
            subjects: vec![format!("{}.>", self.prefix)],
            storage: StorageType::Memory,
            ..Default::default()
        }
    }

    /// Creates the test's stream.
    pub async fn ensure_stream(&self) -> jetstream::stream::Info {
        self.stream_spec()
            .ensure(&self.js)
            .await
            .expect("create the test stream")
    }

    /// Messages in the test's stream.
    pub async fn stream_len(&self) -> u64 {
        let mut stream = self
            .js
            .get_stream(self.stream_name())
            .await
            .expect("the test stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// Every message of the test's stream, in stream order, read by an ordered consumer.
    pub async fn read_stream(&self) -> Vec<Delivered> {
        read_stream(&self.js, &self.stream_name()).await
    }

    /// Deletes the test's stream (the shared server keeps no leftovers).
    pub async fn delete_stream(&self) {
        let _ = self.js.delete_stream(self.stream_name()).await;
    }
}

/// Every message of stream `name`, in stream order.
pub async fn read_stream(js: &jetstream::Context, name: &str) -> Vec<Delivered> {
    let mut stream = js.get_stream(name).await.expect("the stream exists");
    let total = stream.info().await.expect("stream info").state.messages as usize;
    if total == 0 {
        return Vec::new();
    }
    let consumer = stream
        .create_consumer(OrderedConfig::default())
        .await
        .expect("create an ordered consumer");
    let mut messages = consumer.messages().await.expect("consume");
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let msg = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .expect("the stream delivers its messages")
            .expect("the consumer does not end")
            .expect("a message");
        let seq = msg.info().expect("jetstream metadata").stream_sequence;
        let header = |name: &str| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        out.push(Delivered {
            seq,
            subject: msg.subject.to_string(),
            msg_id: header("Nats-Msg-Id"),
            content_type: header("Content-Type"),
            envelope: serde_json::from_slice(&msg.payload).expect("a CloudEvents envelope"),
        });
    }
    out
}

/// Emits `event` through the untyped path in a transaction of its own, commits, and returns
/// the event id.
pub async fn emit_committed(pool: &PgPool, schemas: &Schemas, event: RawEvent) -> uuid::Uuid {
    let mut tx = pool.begin().await.expect("begin");
    let id = tx.emit_raw(schemas, event).await.expect("emit");
    tx.commit().await.expect("commit");
    id
}

/// Runs `relay` in a task until the returned sender fires or is dropped; the task ends when the
/// relay has stopped (its batches in progress committed).
pub fn run_relay(
    relay: std::sync::Arc<outbox_runtime::Relay>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the relay runs");
    });
    (stop, running)
}

/// `Schemas` with one permissive object schema per event type.
pub fn open_schemas(event_types: &[String]) -> Schemas {
    const SCHEMA: &str = r#"{"type":"object"}"#;
    Schemas::from_pairs(event_types.iter().map(|t| (t.as_str(), SCHEMA))).expect("schemas")
}

/// Waits until `check` returns true, polling every 50 ms; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "gave up after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A private `nats-server` with JetStream on a free port and a temporary store directory.
///
/// [`stop`](Self::stop) kills it (the store survives), [`start`](Self::start) starts it again on
/// the same port and store; dropping it kills it.
pub struct NatsServer {
    child: Option<Child>,
    /// The port it listens on.
    pub port: u16,
    name: String,
    started_once: bool,
    store: tempfile::TempDir,
    binary: PathBuf,
    extra: Vec<String>,
}

impl NatsServer {
    /// Spawns a server and waits until it accepts connections.
    pub async fn spawn() -> NatsServer {
        NatsServer::spawn_with(&[]).await
    }

    /// Spawns a server with extra command-line arguments (for example `--user u --pass p`).
    pub async fn spawn_with(extra: &[&str]) -> NatsServer {
        let binary = std::env::var_os("NATS_SERVER_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/sbin/nats-server"));
        let mut server = NatsServer {
            child: None,
            port: free_port(),
            name: format!("outbox-test-{}", unique_token()),
            started_once: false,
            store: tempfile::tempdir().expect("a temporary store"),
            binary,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        server.start().await;
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) and waits until it answers as itself.
    ///
    /// The port was free when it was chosen, but another test's server may take it in between,
    /// so readiness is not "something accepts on the port": the server must greet with its own
    /// name. On the first start a lost port is replaced by another; on a restart it is an error,
    /// since the test needs the same address.
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let first_start = !self.started_once;
        for _ in 0..5 {
            match self.try_start().await {
                Ok(()) => {
                    self.started_once = true;
                    return;
                }
                Err(why) if first_start => {
                    self.stop();
                    self.port = free_port();
                    eprintln!("nats-server: {why}; trying port {}", self.port);
                }
                Err(why) => panic!("{why}"),
            }
        }
        panic!(
            "nats-server did not start on any of five ports; its log: {}",
            self.log_tail()
        );
    }

    async fn try_start(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.log_path()).expect("create the server's log file");
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-n", &self.name])
            .arg("-sd")
            .arg(self.store.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {}: {e}; install nats-server (`scripts/services` does) or set NATS_SERVER_BIN",
                    self.binary.display()
                )
            });
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        let own_name = format!("\"server_name\":\"{}\"", self.name);
        for _ in 0..200 {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "the server on {addr} exited ({status}): {}",
                    self.log_tail()
                ));
            }
            if let Some(greeting) = greeting(&addr).await {
                if greeting.contains(&own_name) {
                    return Ok(());
                }
                return Err(format!("another server answers on {addr}: {greeting}"));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!(
            "nats-server did not answer on {addr} within 5 s: {}",
            self.log_tail()
        ))
    }

    fn log_path(&self) -> PathBuf {
        self.store.path().join("server.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Kills the server (this child only, by its pid) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The first line a NATS server sends on a new connection (its `INFO`), or `None` if nothing
/// answers within half a second.
async fn greeting(addr: &str) -> Option<String> {
    use tokio::io::AsyncBufReadExt;
    let read = async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut line = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut line)
            .await
            .ok()?;
        line.starts_with("INFO ").then_some(line)
    };
    tokio::time::timeout(Duration::from_millis(500), read)
        .await
        .ok()
        .flatten()
}

/// A private Postgres cluster (`initdb` + `pg_ctl` from `/usr/lib/postgresql/*/bin`) on a free
/// port in a temporary directory, for tests that stop and restart the database. The superuser
/// is `root` with trust auth on 127.0.0.1. When the tests run as root, the server runs as the
/// `postgres` user (Postgres refuses to run as root).
pub struct PgServer {
    /// The port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    run_as: Option<String>,
}

impl PgServer {
    /// Creates the cluster and starts it.
    pub fn spawn() -> PgServer {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| {
                versions
                    .filter_map(|v| v.ok().map(|v| v.path().join("bin")))
                    .filter(|b| b.join("initdb").exists())
                    .max()
            })
            .expect("Postgres server binaries under /usr/lib/postgresql/*/bin; `scripts/services` installs them");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let is_root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        let run_as = is_root.then(|| "postgres".to_owned());
        if run_as.is_some() {
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown the cluster directory to postgres");
        }
        let server = PgServer {
            port: free_port(),
            dir,
            bin,
            run_as,
        };
        server.run(
            "initdb",
            &["-A", "trust", "-U", "root", "--no-sync", "-D"],
            true,
        );
        server.start();
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str], with_data: bool) {
        let program = self.bin.join(tool);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        command.args(args);
        if with_data {
            command.arg(self.data());
        }
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        assert!(
            output.status.success(),
            "{tool} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        let log = log.to_string_lossy().into_owned();
        self.run(
            "pg_ctl",
            &["-w", "-l", &log, "-o", &options, "start", "-D"],
            true,
        );
    }

    /// Stops the server (fast shutdown: open connections are cut).
    pub fn stop(&self) {
        self.run("pg_ctl", &["-w", "-m", "fast", "stop", "-D"], true);
    }

    /// `postgres://root@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://root@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let program = self.bin.join("pg_ctl");
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        let _ = command
            .args(["-w", "-m", "immediate", "stop", "-D"])
            .arg(self.data())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
