//! Postgres: a fresh database per test on the shared server, and private servers a test may
//! stop and restart.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::env::{database_url, service_missing};
use crate::unique::{free_port, unique_token};

/// A database of its own for one test; dropped (with its connections) when this is dropped.
///
/// Created on the server of `DATABASE_URL` unless [`TestDbBuilder::server`] says otherwise.
#[derive(Debug)]
pub struct TestDb {
    /// A pool on the test database.
    pub pool: PgPool,
    /// The database name.
    pub name: String,
    /// Connection options of the test database.
    pub options: PgConnectOptions,
    admin: PgConnectOptions,
    server: String,
}

/// How to create a [`TestDb`]: on which server, under which name, migrated or not, with how
/// large a pool.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `create` is called"]
pub struct TestDbBuilder {
    server: Option<String>,
    name: Option<String>,
    migrate: bool,
    max_connections: u32,
}

impl TestDb {
    /// A fresh database with the outbox migrations applied.
    pub async fn new() -> TestDb {
        TestDb::builder().create().await
    }

    /// A fresh database without any table.
    pub async fn empty() -> TestDb {
        TestDb::builder().migrate(false).create().await
    }

    /// The settings of [`new`](Self::new), to change before [`TestDbBuilder::create`].
    pub fn builder() -> TestDbBuilder {
        TestDbBuilder {
            server: None,
            name: None,
            migrate: true,
            max_connections: 8,
        }
    }

    /// Another pool on the test database, of `max_connections` (a relay's own, as in a
    /// separate process).
    pub async fn new_pool(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(self.options.clone())
            .await
            .expect("connect to the test database")
    }

    /// The URL of the test database: the server's URL with the database name in its path (and
    /// its query, such as `sslmode`, kept), for code that connects by URL.
    pub fn url(&self) -> String {
        with_database(&self.server, &self.name)
    }

    /// Number of rows in `outbox_events` still unpublished.
    pub async fn unpublished(&self) -> i64 {
        sqlx::query_scalar("select count(*) from outbox_events where published_at is null")
            .fetch_one(&self.pool)
            .await
            .expect("count unpublished rows")
    }
}

impl TestDbBuilder {
    /// The server to create the database on, as a URL (its database part names the database
    /// to connect to for `create database`); default `DATABASE_URL`.
    pub fn server(mut self, url: impl Into<String>) -> TestDbBuilder {
        self.server = Some(url.into());
        self
    }

    /// The database name; default `outbox_<token>`, unique to the test.
    pub fn name(mut self, name: impl Into<String>) -> TestDbBuilder {
        self.name = Some(name.into());
        self
    }

    /// Whether to apply the outbox migrations; default yes.
    pub fn migrate(mut self, migrate: bool) -> TestDbBuilder {
        self.migrate = migrate;
        self
    }

    /// The size of [`TestDb::pool`]; default 8.
    pub fn max_connections(mut self, max_connections: u32) -> TestDbBuilder {
        self.max_connections = max_connections;
        self
    }

    /// Creates the database, connects its pool and migrates it if asked to.
    pub async fn create(self) -> TestDb {
        let url = self.server.unwrap_or_else(database_url);
        let admin = PgConnectOptions::from_str(&url).unwrap_or_else(|e| {
            let redacted = outbox_runtime::redact::url(&url);
            panic!("{redacted} is not a postgres URL: {e}")
        });
        let mut conn = admin
            .connect()
            .await
            .unwrap_or_else(|e| service_missing("Postgres", &url, e, "DATABASE_URL"));
        let name = self
            .name
            .unwrap_or_else(|| format!("outbox_{}", unique_token()));
        // the name is the kit's own token (or the caller's, in a test)
        sqlx::query(sqlx::AssertSqlSafe(format!("create database {name}")))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .connect_with(options.clone())
            .await
            .expect("connect to the test database");
        let db = TestDb {
            pool,
            name,
            options,
            admin,
            server: url,
        };
        if self.migrate {
            outbox_runtime::migrate(&db.pool)
                .await
                .expect("apply the outbox migrations");
        }
        db
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
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "drop database if exists {name} with (force)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// `url` with its path (the database name) replaced by `/<name>`.
fn with_database(url: &str, name: &str) -> String {
    let (head, query) = url.split_once('?').map_or((url, ""), |(h, q)| (h, q));
    let authority = head.find("://").map_or(0, |i| i + 3);
    let base = head[authority..]
        .find('/')
        .map_or(head, |i| &head[..authority + i]);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!("{base}/{name}{query}")
}

/// A private Postgres cluster (`initdb` + `pg_ctl` from `/usr/lib/postgresql/*/bin`) on a free
/// port in a temporary directory, for tests that stop and restart the database, or need a
/// server configured their way ([`PgServerConfig`]: TLS, `pg_hba.conf`). The superuser is
/// `root` with trust auth on 127.0.0.1 unless the configuration says otherwise. When the tests
/// run as root, the server runs as the `postgres` user (Postgres refuses to run as root).
#[derive(Debug)]
pub struct PgServer {
    /// The port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    run_as: Option<String>,
    settings: Vec<String>,
}

/// How to configure a [`PgServer`]; every field has a default.
#[derive(Debug, Clone, Default)]
pub struct PgServerConfig {
    /// A server certificate and its key (for example from [`TestCa::issue`](crate::TestCa::issue)):
    /// the server runs with `ssl = on` and them. Default: no TLS.
    pub tls: Option<crate::tls::Issued>,
    /// The whole of `pg_hba.conf` (for example `hostssl all all 127.0.0.1/32 trust` to accept
    /// only TLS connections). Default: initdb's, trust for every local connection.
    pub hba: Option<String>,
    /// Further settings, passed as `-c name=value`.
    pub settings: Vec<(String, String)>,
}

impl PgServer {
    /// Creates the cluster and starts it.
    pub fn spawn() -> PgServer {
        PgServer::spawn_config(PgServerConfig::default())
    }

    /// Creates a cluster configured as `config` says and starts it.
    pub fn spawn_config(config: PgServerConfig) -> PgServer {
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
        let mut server = PgServer {
            port: free_port(),
            dir,
            bin,
            run_as,
            settings: Vec::new(),
        };
        server.run(
            "initdb",
            &["-A", "trust", "-U", "root", "--no-sync", "-D"],
            true,
        );
        if let Some(tls) = &config.tls {
            // Postgres reads the key only when it is private to the server's user
            for (from, name) in [(&tls.cert, "server.pem"), (&tls.key, "server.key")] {
                let to = server.data().join(name);
                std::fs::copy(from, &to)
                    .unwrap_or_else(|e| panic!("copy {} into the cluster: {e}", from.display()));
                server.own(&to);
            }
            server.settings.extend(
                [
                    "ssl=on",
                    "ssl_cert_file=server.pem",
                    "ssl_key_file=server.key",
                ]
                .map(String::from),
            );
        }
        if let Some(hba) = &config.hba {
            let path = server.data().join("pg_hba.conf");
            std::fs::write(&path, hba).expect("write pg_hba.conf");
            server.own(&path);
        }
        server
            .settings
            .extend(config.settings.iter().map(|(k, v)| format!("{k}={v}")));
        server.start();
        server
    }

    /// `path` owned by the server's user, readable by it alone.
    fn own(&self, path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
        if let Some(user) = &self.run_as {
            let status = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(path)
                .status()
                .expect("chown");
            assert!(status.success(), "chown {} to {user}", path.display());
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `tool` of the server's binaries, run as the server's user.
    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        }
    }

    fn run(&self, tool: &str, args: &[&str], with_data: bool) {
        let mut command = self.command(tool);
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
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
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

    /// Stops the server and starts it again as a standby with no primary to follow
    /// (`standby.signal`): it stays in recovery, answering reads and refusing writes, as a
    /// replica does.
    pub fn restart_as_standby(&self) {
        self.stop();
        let signal = self.data().join("standby.signal");
        std::fs::write(&signal, "").expect("write standby.signal");
        self.own(&signal);
        self.start();
    }

    /// The server's log so far (`pg_ctl -l`), for tests that read what it logged.
    ///
    /// ```no_run
    /// let pg = outbox_testkit::PgServer::spawn();
    /// assert!(!pg.log().contains("ERROR:"));
    /// ```
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Stops the server as a crash would (`pg_ctl -m immediate`: no shutdown checkpoint, open
    /// connections cut); the next [`start`](Self::start) recovers from the WAL. Prepared
    /// transactions survive it; unlogged tables come back empty.
    pub fn crash(&self) {
        self.run("pg_ctl", &["-w", "-m", "immediate", "stop", "-D"], true);
    }

    /// `postgres://root@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://root@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-w", "-m", "immediate", "stop", "-D"])
            .arg(self.data())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_name_replaces_the_urls_path_and_keeps_its_query() {
        for (url, expected) in [
            (
                "postgres://root@127.0.0.1/test",
                "postgres://root@127.0.0.1/t1",
            ),
            ("postgres://root@127.0.0.1", "postgres://root@127.0.0.1/t1"),
            (
                "postgres://u:p@db:5433/test?sslmode=require",
                "postgres://u:p@db:5433/t1?sslmode=require",
            ),
            (
                "postgres://db?sslmode=disable",
                "postgres://db/t1?sslmode=disable",
            ),
        ] {
            assert_eq!(with_database(url, "t1"), expected, "{url}");
        }
    }
}
