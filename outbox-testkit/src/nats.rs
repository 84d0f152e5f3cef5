//! NATS: connecting to the shared server, and private `nats-server` processes a test owns.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::env::service_missing;
use crate::unique::{free_port, unique_token};

/// Connects to NATS at `url` (or any of a comma-separated list of URLs, a cluster's),
/// failing with the command that starts it.
pub async fn connect_nats(url: &str) -> async_nats::Client {
    let urls: Vec<&str> = url.split(',').map(str::trim).collect();
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(urls.as_slice())
        .await
        .unwrap_or_else(|e| service_missing("NATS", url, e, "NATS_URL"))
}

/// The nats-server binary private servers run: `NATS_SERVER_BIN` when set; else the current
/// release `scripts/services` installs into the repository's `.venv-nats`; else `nats-server`
/// on `PATH`; else Debian's `/usr/sbin/nats-server`.
pub fn nats_server_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("NATS_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-nats/bin/nats-server");
    if venv.is_file() {
        return venv;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|bin| bin.is_file())
    });
    on_path.unwrap_or_else(|| PathBuf::from("/usr/sbin/nats-server"))
}

/// How to run a private nats-server; every field has a default.
///
/// The server always runs with JetStream (`-js`) on 127.0.0.1, logs to a file the failure
/// messages quote, and must greet with its own name to count as started.
#[derive(Debug, Clone, Default)]
pub struct NatsServerConfig {
    /// The server's name (`-n`); default `outbox-test-<token>`, unique to the test.
    pub name: Option<String>,
    /// The client port (`-p`); default a free one, replaced by another free one if something
    /// takes it before the first start. A given port is never replaced.
    pub port: Option<u16>,
    /// The JetStream store directory (`-sd`); default a temporary directory removed when the
    /// server is dropped.
    pub store_dir: Option<PathBuf>,
    /// Further command-line arguments: credentials (`--user u --pass p`), a config file
    /// (`-c file`), cluster options.
    pub args: Vec<String>,
    /// The binary; default [`nats_server_binary`].
    pub binary: Option<PathBuf>,
}

/// A private `nats-server` with JetStream on a free port and a temporary store directory.
///
/// [`stop`](Self::stop) kills it (the store survives), [`start`](Self::start) starts it again on
/// the same port and store; dropping it kills it.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    port_given: bool,
    name: String,
    started_once: bool,
    /// Holds the log, and the store unless the configuration names one.
    dir: tempfile::TempDir,
    store_dir: Option<PathBuf>,
    binary: PathBuf,
    args: Vec<String>,
}

impl NatsServer {
    /// Spawns a server with the default configuration and waits until it answers.
    pub async fn spawn() -> NatsServer {
        NatsServer::spawn_config(NatsServerConfig::default()).await
    }

    /// Spawns a server with extra command-line arguments (for example `--user u --pass p`).
    pub async fn spawn_with(args: &[&str]) -> NatsServer {
        NatsServer::spawn_config(NatsServerConfig {
            args: args.iter().map(|a| a.to_string()).collect(),
            ..NatsServerConfig::default()
        })
        .await
    }

    /// Spawns a server as `config` says and waits until it answers.
    pub async fn spawn_config(config: NatsServerConfig) -> NatsServer {
        let binary = config.binary.unwrap_or_else(nats_server_binary);
        let mut server = NatsServer {
            child: None,
            port: config.port.unwrap_or_else(free_port),
            port_given: config.port.is_some(),
            name: config
                .name
                .unwrap_or_else(|| format!("outbox-test-{}", unique_token())),
            started_once: false,
            dir: tempfile::tempdir().expect("a temporary directory for the server"),
            store_dir: config.store_dir,
            binary,
            args: config.args,
        };
        server.start().await;
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's name, as it greets clients.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> &Path {
        self.store_dir.as_deref().unwrap_or(self.dir.path())
    }

    /// Starts the server (again) and waits until it answers as itself.
    ///
    /// The port was free when it was chosen, but another test's server may take it in between,
    /// so readiness is not "something accepts on the port": the server must greet with its own
    /// name. On the first start a lost port is replaced by another (unless the configuration
    /// gave it); on a restart it is an error, since the test needs the same address.
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let first_start = !self.started_once;
        for _ in 0..5 {
            match self.try_start().await {
                Ok(()) => {
                    self.started_once = true;
                    return;
                }
                Err(why) if first_start && !self.port_given => {
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
            .arg(self.store_dir())
            .args(&self.args)
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
        self.dir.path().join("server.log")
    }

    /// The last five lines of the server's log, joined with ` | `.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// The server's process id while it runs, for a test that signals it (`kill -STOP` to
    /// freeze it without closing its connections).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (a name `kill` knows: `STOP`, `CONT`, `KILL`, `TERM`) to the server,
    /// by its pid; panics when it is not running or the signal cannot be sent.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server is not running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
    }

    /// The binary the server runs.
    pub fn binary(&self) -> &Path {
        &self.binary
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
