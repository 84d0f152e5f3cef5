//! What every test of the command shares: the binary with a clean environment, its output,
//! a running process whose stderr is collected, URLs with passwords that must never be
//! printed, and the events a test emits and relays.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, TestDb};
use sqlx::PgPool;
use uuid::Uuid;

/// The password put in every Postgres URL given to the command.
pub const DB_PASSWORD: &str = "pg-s3cret-9f2c";
/// The password put in every NATS URL given to the command.
pub const NATS_PASSWORD: &str = "nats-s3cret-41ab";

/// How long any wait on the command or the services may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// The `outbox` binary with a clean environment: no inherited connection settings.
pub fn outbox() -> Command {
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
        "OUTBOX_LOG_FORMAT",
    ] {
        cmd.env_remove(var);
    }
    // and no OpenTelemetry settings of the machine's
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(var);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Fails unless the command exited with `code`, showing what it printed.
    pub fn expect_code(&self, code: i32) -> &Self {
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
    pub fn assert_clean(&self) -> &Self {
        assert_no_secret(&self.stdout);
        assert_no_secret(&self.stderr);
        self
    }
}

pub fn assert_no_secret(text: &str) {
    for secret in [DB_PASSWORD, NATS_PASSWORD] {
        assert!(!text.contains(secret), "a password was printed:\n{text}");
    }
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in output that is not a terminal:\n{text:?}"
    );
}

/// Runs `outbox <args>` to completion (on a blocking thread, so the test's runtime keeps going).
pub async fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = outbox();
    cmd.args(args);
    finish(cmd).await
}

/// Runs `cmd` to completion on a blocking thread and collects what it printed.
pub async fn finish(mut cmd: Command) -> Output {
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
pub fn with_password(url: &str, user: &str, password: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) if !rest.split('/').next().unwrap_or("").contains('@') => {
            format!("{scheme}://{user}:{password}@{rest}")
        }
        _ => url.to_owned(),
    }
}

/// The URL of the test's database, with a password.
pub fn db_url(db: &TestDb) -> String {
    with_password(&db.url(), "root", DB_PASSWORD)
}

/// The shared NATS server's URL, with a user and password.
pub fn nats_url() -> String {
    with_password(&outbox_testkit::nats_url(), "outbox", NATS_PASSWORD)
}

/// `relay --database-url <url> --nats-url <nats>` and `more`: the arguments of a relay.
pub fn relay_args(url: &str, nats: &str, more: &[&str]) -> Vec<String> {
    ["relay", "--database-url", url, "--nats-url", nats]
        .iter()
        .chain(more)
        .map(|a| a.to_string())
        .collect()
}

/// A running `outbox` process whose stderr is collected line by line.
pub struct Running {
    pub child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    closed: Arc<AtomicBool>,
}

impl Running {
    pub fn spawn<I, S>(args: I) -> Running
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Running::spawn_with_env(args, &[])
    }

    /// [`spawn`](Self::spawn) with the environment variables `env` set.
    pub fn spawn_with_env<I, S>(args: I, env: &[(&str, &str)]) -> Running
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut child = outbox()
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the outbox binary");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let (lines, eof) = (stderr.clone(), closed.clone());
        let pipe = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            // bytes, not `lines()`: a line that is not UTF-8 is kept (lossily), where `lines()`
            // would end the reading there and lose every later line
            for line in BufReader::new(pipe).split(b'\n') {
                match line {
                    Ok(line) => lines
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&line).into_owned()),
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

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Sends SIGTERM to this child only, by its pid.
    pub fn terminate(&self) {
        signal(self.child.id(), "TERM");
    }

    /// Waits for the exit and returns the exit code (`None` when a signal killed it).
    pub async fn wait(&mut self) -> Option<i32> {
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

/// Sends `signal` (`TERM`, `STOP`, `CONT`, `KILL`) to the process `pid` only.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Emits the events numbered `numbers` (`{"n": <number>}`) of `event_type` about `subject`,
/// source `cli-test`, each committed in its own transaction; their ids, in order.
pub async fn emit_numbered(
    pool: &PgPool,
    event_type: &str,
    subject: &str,
    numbers: impl IntoIterator<Item = u64>,
) -> Vec<Uuid> {
    let schemas = open_schemas(&[event_type.to_owned()]);
    let mut ids = Vec::new();
    for n in numbers {
        let event = raw_event(event_type, "cli-test", subject).numbered(n);
        ids.push(emit_committed(pool, &schemas, event).await);
    }
    ids
}

/// Runs `outbox relay` with `more` arguments until the table has no unpublished row, then
/// stops it with SIGTERM; it must exit 0.
pub async fn relay_until_published(ctx: &Ctx, url: &str, nats: &str, more: &[&str]) {
    let mut relay = Running::spawn(relay_args(url, nats, more));
    eventually(PATIENCE, "the relay to publish every row", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}
