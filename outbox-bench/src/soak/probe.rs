//! Readings of the machine and the database: CPU time by process kind (from `/proc`), a
//! process's memory, file descriptors and Postgres connections, and the outbox table's
//! backlog, expired rows and sizes.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;

/// What a process is, for [`CpuMeter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A Postgres backend of this run's database.
    Backends,
    /// A Postgres server process of no database (WAL writer, checkpointer, background writer,
    /// autovacuum launcher): shared with the other databases of the server.
    PgBackground,
    /// An `outbox relay` process of this run.
    Relays,
    /// A nats-server of this run.
    Nats,
    /// This process: the load, the consumer's replicas, the stream reader, retention.
    Bench,
}

/// `utime + stime` of `/proc/<pid>/stat`, its parent and its command name.
fn stat(pid: u32) -> Option<(u64, u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let comm = stat[open + 1..close].to_owned();
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // after the command: state, ppid (field 4 of the line), ..., utime and stime (14 and 15)
    let ppid = field(1)? as u32;
    Some((field(11)? + field(12)?, ppid, comm))
}

/// Clock ticks a second (`/proc` counts CPU time in them; 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time of this run's processes by [`Kind`], summed from `/proc/<pid>/stat`.
///
/// A process's time counts from the first reading that sees it (its whole time, when it
/// started after the first reading) until the last one before it exits; so a backend that
/// lives less than a reading interval, such as `outbox status`'s, is counted only in part.
#[derive(Debug)]
pub struct CpuMeter {
    postmaster: Option<u32>,
    database: String,
    relays: Vec<u32>,
    nats: Vec<u32>,
    seen: HashMap<u32, (u64, Kind)>,
    totals: HashMap<Kind, u64>,
    /// Each backend's time of this database, by pid, also after it exited.
    backends: HashMap<u32, u64>,
    first: bool,
}

impl CpuMeter {
    /// A meter of the Postgres server that `backend_pid` (a backend of `database`) runs in,
    /// when it runs on this machine (`/proc` shows it).
    pub fn new(backend_pid: u32, database: &str) -> CpuMeter {
        let postmaster = stat(backend_pid).map(|(_, ppid, _)| ppid);
        let mut meter = CpuMeter {
            postmaster,
            database: database.to_owned(),
            relays: Vec::new(),
            nats: Vec::new(),
            seen: HashMap::new(),
            totals: HashMap::new(),
            backends: HashMap::new(),
            first: true,
        };
        meter.read();
        meter.first = false;
        meter
    }

    /// Whether the database's server runs on this machine.
    pub fn sees_postgres(&self) -> bool {
        self.postmaster.is_some()
    }

    /// The relays' and nats-servers' pids (the relays change when they restart).
    pub fn watch(&mut self, relays: Vec<u32>, nats: Vec<u32>) {
        self.relays = relays;
        self.nats = nats;
    }

    fn kind(&self, pid: u32, ppid: u32, comm: &str) -> Option<Kind> {
        if pid == std::process::id() {
            return Some(Kind::Bench);
        }
        if self.relays.contains(&pid) {
            return Some(Kind::Relays);
        }
        if self.nats.contains(&pid) {
            return Some(Kind::Nats);
        }
        let postmaster = self.postmaster?;
        if comm != "postgres" || (ppid != postmaster && pid != postmaster) {
            return None;
        }
        // `postgres: <cluster>: <user> <database> <client> <activity>` for a backend
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&title).replace('\0', " ");
        let words: Vec<&str> = title.split_whitespace().collect();
        if words.contains(&self.database.as_str()) {
            Some(Kind::Backends)
        } else if words.iter().any(|w| w.contains('(') || *w == "[local]") {
            // another database's backend
            None
        } else {
            Some(Kind::PgBackground)
        }
    }

    /// Reads `/proc` once, adding what each process used since the last reading.
    pub fn read(&mut self) {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut alive = HashMap::with_capacity(self.seen.len());
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Some((ticks, ppid, comm)) = stat(pid) else {
                continue;
            };
            let known = self.seen.get(&pid).copied();
            let kind = match known {
                Some((_, kind)) => Some(kind),
                None => self.kind(pid, ppid, &comm),
            };
            let Some(kind) = kind else { continue };
            // a process new since the last reading used all its time since then
            let before = match known {
                Some((before, _)) => before,
                None if self.first => ticks,
                None => 0,
            };
            let used = ticks.saturating_sub(before);
            *self.totals.entry(kind).or_default() += used;
            if kind == Kind::Backends {
                *self.backends.entry(pid).or_default() += used;
            }
            alive.insert(pid, (ticks, kind));
        }
        self.seen = alive;
    }

    /// CPU time used by `kind` since the meter started.
    pub fn total(&self, kind: Kind) -> Duration {
        let ticks = self.totals.get(&kind).copied().unwrap_or(0);
        Duration::from_secs_f64(ticks as f64 / TICKS_PER_SECOND)
    }

    /// This database's backends' CPU time so far, by what they work for: their
    /// `application_name` in `apps` (by pid), as [`Work`].
    pub fn backends_by_work(&self, apps: &HashMap<u32, String>) -> [Duration; Work::ALL.len()] {
        let mut ticks = [0u64; Work::ALL.len()];
        for (pid, used) in &self.backends {
            ticks[Work::of(apps.get(pid).map(String::as_str)) as usize] += used;
        }
        ticks.map(|t| Duration::from_secs_f64(t as f64 / TICKS_PER_SECOND))
    }
}

/// What a backend of the run's database works for, by its connection's `application_name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The load: `soak-insert`, `soak-emit`.
    Writing,
    /// `soak-relay-<n>`.
    Relays,
    /// `soak-consumer`: the service's consumer.
    Consumer,
    /// `soak-retention`.
    Retention,
    /// `soak-vacuum`: the stand-in for autovacuum.
    Vacuum,
    /// The run's own readings, `outbox status`, and backends whose name was not read.
    Other,
}

impl Work {
    pub const ALL: [Work; 6] = [
        Work::Writing,
        Work::Relays,
        Work::Consumer,
        Work::Retention,
        Work::Vacuum,
        Work::Other,
    ];

    fn of(application_name: Option<&str>) -> Work {
        match application_name.unwrap_or("") {
            "soak-insert" | "soak-emit" => Work::Writing,
            "soak-consumer" => Work::Consumer,
            "soak-retention" => Work::Retention,
            "soak-vacuum" => Work::Vacuum,
            name if name.starts_with("soak-relay-") => Work::Relays,
            _ => Work::Other,
        }
    }

    /// `emitting`, for the reports.
    pub fn name(self) -> &'static str {
        match self {
            Work::Writing => "emitting",
            Work::Relays => "relays",
            Work::Consumer => "consumer",
            Work::Retention => "retention",
            Work::Vacuum => "vacuum",
            Work::Other => "other",
        }
    }
}

/// The backends of this run's database, by pid, with their `application_name`.
pub async fn backend_names(pool: &PgPool) -> Vec<(i32, String)> {
    sqlx::query_as(
        "select pid, coalesce(application_name, '') from pg_stat_activity \
          where datname = current_database()",
    )
    .fetch_all(pool)
    .await
    .expect("read pg_stat_activity")
}

/// A process's resident memory (kB, `VmRSS`) and open file descriptors.
pub fn memory_and_fds(pid: u32) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status.lines().find_map(|l| {
        l.strip_prefix("VmRSS:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss, fds))
}

/// Connections to this run's database per `application_name`.
pub async fn connections(pool: &PgPool) -> HashMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "select coalesce(application_name, ''), count(*) from pg_stat_activity \
          where datname = current_database() group by 1",
    )
    .fetch_all(pool)
    .await
    .expect("read pg_stat_activity");
    rows.into_iter().collect()
}

/// Rows the relay has not published.
pub async fn backlog(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from outbox_events where published_at is null")
        .fetch_one(pool)
        .await
        .expect("count the backlog")
}

/// The table's state: published rows past their keep that retention has not deleted yet,
/// and the sizes of the outbox and dedupe tables and their indexes.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableState {
    pub expired: i64,
    pub events_bytes: i64,
    pub events_index_bytes: i64,
    pub consumed_bytes: i64,
    pub consumed_index_bytes: i64,
    /// Rows deleted from `outbox_events` since the statistics began (`n_tup_del`).
    pub deleted: i64,
}

/// Reads [`TableState`]; `keep` is retention's keep of published rows.
pub async fn table_state(pool: &PgPool, keep: Duration) -> TableState {
    let (expired, events_bytes, events_index_bytes, consumed_bytes, consumed_index_bytes, deleted): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "select (select count(*) from outbox_events \
                  where published_at is not null \
                    and published_at < now() - $1 * interval '1 microsecond'), \
                pg_table_size('outbox_events'), pg_indexes_size('outbox_events'), \
                pg_table_size('outbox_consumed'), pg_indexes_size('outbox_consumed'), \
                coalesce((select n_tup_del from pg_stat_user_tables \
                           where relname = 'outbox_events'), 0)",
    )
    .bind(keep.as_micros() as i64)
    .fetch_one(pool)
    .await
    .expect("read the table's state");
    TableState {
        expired,
        events_bytes,
        events_index_bytes,
        consumed_bytes,
        consumed_index_bytes,
        deleted,
    }
}

/// `12.3 MB`.
pub fn mb(bytes: i64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_from_proc() {
        let (ticks, ppid, comm) = stat(std::process::id()).expect("/proc/self/stat");
        assert!(ppid > 0 && !comm.is_empty(), "{ticks} {ppid} {comm}");
        let (rss, fds) = memory_and_fds(std::process::id()).expect("/proc/self/status");
        assert!(rss > 0 && fds > 0, "rss {rss} kB, {fds} fds");
    }
}
