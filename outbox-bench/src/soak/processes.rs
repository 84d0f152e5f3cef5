//! The processes the soak runs beside itself: `outbox relay` (the command a service deploys),
//! and `outbox status` polled as a monitoring system would; and reading the relays' metrics
//! endpoints as Prometheus does.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::report::Progress;

/// How often `outbox status` and the metrics endpoints are polled (Prometheus's default).
const POLL_EVERY: Duration = Duration::from_secs(15);

/// The `outbox` binary: `--outbox-bin=PATH` when given; otherwise the one cargo builds next to
/// this benchmark's binary. Run through cargo (`CARGO` set), it is built first with `cargo build
/// -p outbox-cli` in this binary's profile and target directory, so that the relays run the
/// code this benchmark was built from; a binary there already is used as it is otherwise.
pub fn outbox_binary(given: Option<PathBuf>) -> PathBuf {
    if let Some(bin) = given {
        assert!(
            bin.is_file(),
            "--outbox-bin: {} is not a file",
            bin.display()
        );
        return bin;
    }
    let me = std::env::current_exe().expect("this binary's path");
    let dir = me.parent().expect("this binary's directory");
    let bin = dir.join("outbox");
    let cargo = std::env::var_os("CARGO");
    if cargo.is_some() || !bin.is_file() {
        build_outbox(dir, cargo.map_or_else(|| "cargo".into(), PathBuf::from));
    }
    assert!(
        bin.is_file(),
        "no `outbox` binary at {}: build it with `cargo build --release -p outbox-cli`, or give --outbox-bin=PATH",
        bin.display()
    );
    bin
}

/// `cargo build -p outbox-cli` into the target directory and profile of `dir`
/// (`<target>/release` or `<target>/debug`).
fn build_outbox(dir: &Path, cargo: PathBuf) {
    let profile = dir.file_name().and_then(|p| p.to_str()).unwrap_or("debug");
    let target = dir.parent().expect("a target directory");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(workspace)
        .env("CARGO_TARGET_DIR", target)
        .args(["build", "-p", "outbox-cli"]);
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    println!(
        "building the relays' binary: {} build -p outbox-cli ({profile}, {})",
        cargo.display(),
        target.display()
    );
    let status = cmd.status().expect("run cargo");
    assert!(
        status.success(),
        "cargo build -p outbox-cli failed: {status}"
    );
}

/// `url` with `application_name` set, so that `pg_stat_activity` tells its connections apart.
pub fn with_application_name(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// One `outbox relay` process: its name (also its connections' `application_name`), its
/// metrics port, its log file.
#[derive(Debug)]
pub struct RelayProcess {
    pub name: String,
    pub metrics_port: u16,
    child: Option<Child>,
    command: Vec<String>,
    bin: PathBuf,
    log: PathBuf,
    /// How far [`warnings`](Self::warnings) has read the log.
    log_read: usize,
}

impl RelayProcess {
    /// Starts `outbox relay` on `database_url` and `nats_url` for `event_type`, logging to
    /// `<log_dir>/<name>.log`.
    pub fn start(
        bin: &Path,
        name: &str,
        database_url: &str,
        nats_url: &str,
        event_type: &str,
        log_dir: &Path,
    ) -> RelayProcess {
        let metrics_port = outbox_testkit::free_port();
        let command = vec![
            "relay".to_owned(),
            "--database-url".to_owned(),
            with_application_name(database_url, name),
            "--nats-url".to_owned(),
            nats_url.to_owned(),
            "--event-type".to_owned(),
            event_type.to_owned(),
            "--metrics-addr".to_owned(),
            format!("127.0.0.1:{metrics_port}"),
        ];
        let mut relay = RelayProcess {
            name: name.to_owned(),
            metrics_port,
            child: None,
            command,
            bin: bin.to_owned(),
            log: log_dir.join(format!("{name}.log")),
            log_read: 0,
        };
        relay.spawn();
        relay
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the relay's log file");
        let child = Command::new(&self.bin)
            .args(&self.command)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {} relay: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Panics, with the end of its log, if the process has exited.
    pub fn assert_running(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{} exited by itself ({status}); the end of its log ({}):\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
    }

    /// The warnings and errors it logged since the last call, by message ([`count_warnings`]).
    pub fn warnings(&mut self) -> Vec<(usize, String)> {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let new = String::from_utf8_lossy(&text[self.log_read.min(text.len())..]).into_owned();
        self.log_read = text.len();
        count_warnings(&new)
    }

    /// The last 20 lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Sends SIGTERM, as a deploy does, and waits for the exit (SIGKILL after 30 s); returns
    /// how long it took to exit and whether it exited by itself.
    pub async fn stop(&mut self) -> (Duration, bool) {
        let Some(mut child) = self.child.take() else {
            return (Duration::ZERO, true);
        };
        let started = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = child.try_wait() {
                return (started.elapsed(), true);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        (started.elapsed(), false)
    }

    /// Starts it again (after [`stop`](Self::stop)), with the same command line.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop {} first", self.name);
        self.spawn();
    }

    /// Waits until its metrics say it runs (`outbox_relay_lease_held` is exported once the
    /// relay's loop started, holding the lease or standing by), at most `within`.
    pub async fn wait_running(&mut self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            self.assert_running();
            if let Some(metrics) = scrape(self.metrics_port).await {
                if gauge(&metrics, "outbox_relay_lease_held").is_some() {
                    return started.elapsed();
                }
            }
            assert!(
                started.elapsed() < within,
                "{} did not start within {within:?}; the end of its log:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `WARN` and `ERROR` lines of a log, counted by message (its text up to the first colon
/// or parenthesis, at most 80 bytes), most frequent first.
fn count_warnings(log: &str) -> Vec<(usize, String)> {
    let mut counts: Vec<(usize, String)> = Vec::new();
    for line in log.lines() {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
            continue;
        };
        // `<time>  WARN <target>: <message>`
        let rest = &line[at..];
        let message = rest.split_once(": ").map_or(rest, |(_, m)| m);
        let end = message.find([':', '(']).unwrap_or(message.len()).min(80);
        let message = message[..message.floor_char_boundary(end)]
            .trim()
            .to_owned();
        match counts.iter_mut().find(|(_, m)| *m == message) {
            Some((n, _)) => *n += 1,
            None => counts.push((1, message)),
        }
    }
    counts.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    counts
}

/// `GET /metrics` on `127.0.0.1:<port>`, as Prometheus scrapes it: the body, or `None` when
/// nothing answers within 5 s.
pub async fn scrape(port: u16) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        let timeout = Duration::from_secs(5);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
        stream.set_read_timeout(Some(timeout)).ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200")
            .then(|| body.to_owned())
            .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
    })
    .await
    .ok()
    .flatten()
}

/// The value of an unlabelled metric `name` in a scrape.
pub fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// Runs `outbox status --json` on `database_url` once: how long it took, and the backlog it
/// reported (`None` when it failed).
pub async fn poll_status(bin: PathBuf, database_url: String) -> (Duration, Option<i64>) {
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(bin)
            .args(["status", "--json", "--database-url", &database_url])
            .stdin(Stdio::null())
            .output()
    })
    .await
    .expect("the status poll's thread");
    let took = started.elapsed();
    let unpublished = output.ok().and_then(|out| {
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        json["unpublished"].as_i64()
    });
    (took, unpublished)
}

/// The relays restarted one after the other at `at`, as a deploy does: SIGTERM, wait for the
/// exit, start, wait until it runs, then 5 s before the next.
pub async fn rolling_restart(
    relays: Vec<Arc<tokio::sync::Mutex<RelayProcess>>>,
    since: Instant,
    at: Instant,
    progress: Arc<Mutex<Progress>>,
    pids: Arc<Mutex<Vec<u32>>>,
) {
    tokio::time::sleep_until(at).await;
    for (i, relay) in relays.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let mut relay = relay.lock().await;
        let held = lease_held(relay.metrics_port).await;
        let (stopped, clean) = relay.stop().await;
        relay.restart();
        pids.lock().expect("relay pids").extend(relay.pid());
        let running = relay.wait_running(Duration::from_secs(60)).await;
        let event = format!(
            "{} restarted ({}): stopped in {:.2} s{}, running again {:.2} s later",
            relay.name,
            if held == Some(true) {
                "it held the lease"
            } else {
                "standing by"
            },
            stopped.as_secs_f64(),
            if clean { "" } else { " (killed after 30 s)" },
            running.as_secs_f64()
        );
        println!("  [{:.0} s] {event}", since.elapsed().as_secs_f64());
        progress.lock().expect("progress").events.push(event);
    }
}

/// Whether the relay behind `port` holds the lease, by its metrics.
async fn lease_held(port: u16) -> Option<bool> {
    let metrics = scrape(port).await?;
    gauge(&metrics, "outbox_relay_lease_held").map(|v| v > 0.5)
}

/// What the 15-second polls saw since the last minute.
#[derive(Debug, Default, Clone)]
pub struct Polls {
    pub status: u32,
    pub status_failed: u32,
    pub status_slowest: Duration,
    pub scrapes: u32,
    pub scrapes_failed: u32,
    /// The relay that held the lease at the last poll.
    pub lease: Option<String>,
}

/// Every [`POLL_EVERY`]: `outbox status --json`, and each relay's metrics endpoint.
pub async fn poll(
    bin: PathBuf,
    database_url: String,
    relays: Vec<Arc<tokio::sync::Mutex<RelayProcess>>>,
    polls: Arc<Mutex<Polls>>,
    stop: Arc<AtomicBool>,
) {
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        next += POLL_EVERY;
        let (took, unpublished) = poll_status(bin.clone(), database_url.clone()).await;
        let mut holders = Vec::new();
        let mut scraped = (0, 0);
        for relay in &relays {
            // a relay being restarted is skipped, as Prometheus misses a target that is down
            let (port, name) = match relay.try_lock() {
                Ok(r) => (r.metrics_port, r.name.clone()),
                Err(_) => {
                    scraped.1 += 1;
                    continue;
                }
            };
            match lease_held(port).await {
                Some(held) => {
                    scraped.0 += 1;
                    if held {
                        holders.push(name);
                    }
                }
                None => scraped.1 += 1,
            }
        }
        let mut p = polls.lock().expect("polls");
        p.status += 1;
        p.status_failed += u32::from(unpublished.is_none());
        p.status_slowest = p.status_slowest.max(took);
        p.scrapes += scraped.0;
        p.scrapes_failed += scraped.1;
        p.lease = Some(if holders.is_empty() {
            "none".into()
        } else {
            holders.join(" and ")
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_is_read_by_its_exact_name() {
        let metrics = "# TYPE outbox_relay_lease_held gauge\noutbox_relay_lease_held 1\noutbox_relay_lease_held_x 5\n";
        assert_eq!(gauge(metrics, "outbox_relay_lease_held"), Some(1.0));
        assert_eq!(gauge(metrics, "outbox_relay_lease"), None);
    }

    #[test]
    fn warnings_are_counted_by_message() {
        let log = "\
2026-12-06T07:25:14Z  INFO outbox_runtime::relay::lease: outbox relay took the lease
2026-12-06T07:25:25Z  WARN outbox_runtime::relay::listen: outbox relay lost its LISTEN connection (the connection closed); polling
2026-12-06T07:25:45Z  WARN outbox_runtime::relay::listen: outbox relay lost its LISTEN connection (error returned); polling
2026-12-06T07:25:46Z ERROR outbox_runtime::relay::run: a batch failed: timeout
";
        assert_eq!(
            count_warnings(log),
            [
                (2, "outbox relay lost its LISTEN connection".to_owned()),
                (1, "a batch failed".to_owned())
            ]
        );
    }

    #[test]
    fn the_application_name_joins_the_query() {
        assert_eq!(
            with_application_name("postgres://root@h/db", "r1"),
            "postgres://root@h/db?application_name=r1"
        );
        assert_eq!(
            with_application_name("postgres://root@h/db?sslmode=disable", "r1"),
            "postgres://root@h/db?sslmode=disable&application_name=r1"
        );
    }
}
