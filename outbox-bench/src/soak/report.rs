//! What the soak prints: a block of lines each minute, every step's figures at the end, and
//! the summary line of ratios last.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::load::{thousands, Shape, StepResult, Tally};
use super::probe::{self, mb, CpuMeter, Kind, Work};
use super::processes::{Polls, RelayProcess};
use super::readers::{Applied, InFlight, StreamCheck};
use super::stats::Histogram;
use super::{Baseline, OutboxStep};

/// What the steps share with the minute reporter.
#[derive(Debug, Default)]
pub struct Progress {
    /// The step running now.
    pub current: Option<usize>,
    /// Steps that ran during the current minute.
    pub touched: Vec<usize>,
    /// What happened during the current minute (restarts).
    pub events: Vec<String>,
}

/// A minute's readings kept for the summary.
#[derive(Debug, Clone, Default)]
pub struct Minute {
    /// Seconds since the outbox phase started, at the minute's end.
    pub at: f64,
    /// Whether steps ran in it (not only the drain at the end).
    pub loaded: bool,
    pub expired: i64,
    /// Per relay process (pid): its memory in kB, Postgres connections and file descriptors.
    pub relays: Vec<(u32, u64, i64, usize)>,
}

/// `8 conns, 1/tx at 50% (4,000/s)`, or `.. at 1,000/s` with `--rate`.
pub fn step_label(shape: Shape, fraction: f64, rate: f64, fixed: bool) -> String {
    if fixed {
        format!("{} at {}/s", shape.label(), thousands(rate))
    } else {
        format!(
            "{} at {:.0}% ({}/s)",
            shape.label(),
            fraction * 100.0,
            thousands(rate)
        )
    }
}

pub fn p99(h: &Histogram) -> Option<f64> {
    h.percentile_ms(99.0)
}

/// `a / b` to three places, or `n/a`.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "n/a".into(),
    }
}

/// What the minute reporter reads.
pub struct Reporting {
    pub probe: PgPool,
    pub keep: Duration,
    pub minute: Arc<Tally>,
    pub in_flight: Arc<InFlight>,
    pub handled: Arc<AtomicU64>,
    pub stream_check: Arc<Mutex<StreamCheck>>,
    pub relays: Vec<Arc<tokio::sync::Mutex<RelayProcess>>>,
    pub cpu: Arc<Mutex<CpuMeter>>,
    pub polls: Arc<Mutex<Polls>>,
    pub vacuums: Arc<AtomicU64>,
    pub progress: Arc<Mutex<Progress>>,
    pub plan: Arc<Mutex<Vec<OutboxStep>>>,
    pub started: Instant,
}

impl Reporting {
    /// Reads the backlog every 5 s; prints a minute's block at
    /// each minute and a last one (of a part of a minute) at `stop`. Returns the minutes.
    pub async fn run(self, stop: Arc<AtomicBool>) -> Vec<Minute> {
        let mut minutes = Vec::new();
        let mut minute_started = self.started;
        let mut backlog_max = 0;
        let mut last_backlog = Instant::now() - Duration::from_secs(5);
        let mut before = Before::default();
        let mut apps = HashMap::new();
        self.name_backends(&mut apps).await;
        before.cpu = self.cpu_totals();
        before.work = self.cpu.lock().expect("cpu").backends_by_work(&apps);
        before.handled = self.handled.load(Ordering::Relaxed);
        before.read = self.stream_check.lock().expect("stream check").messages;
        before.deleted = probe::table_state(&self.probe, self.keep).await.deleted;
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if last_backlog.elapsed() >= Duration::from_secs(5) {
                last_backlog = Instant::now();
                backlog_max = backlog_max.max(probe::backlog(&self.probe).await);
                self.name_backends(&mut apps).await;
            }
            let elapsed = minute_started.elapsed();
            if elapsed >= Duration::from_secs(60) || stopping {
                if elapsed >= Duration::from_secs(5) {
                    // every backend alive now is named before its time is split by work
                    self.name_backends(&mut apps).await;
                    let number = minutes.len() + 1;
                    minutes.push(
                        self.minute(number, elapsed, backlog_max, &apps, &mut before)
                            .await,
                    );
                }
                minute_started = Instant::now();
                backlog_max = 0;
            }
            if stopping {
                return minutes;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Which backend works for what, by its `application_name`, for the CPU by work. An
    /// exited backend's name is remembered, so its time stays where it was counted.
    async fn name_backends(&self, apps: &mut HashMap<u32, String>) {
        for (pid, name) in probe::backend_names(&self.probe).await {
            apps.insert(pid as u32, name);
        }
    }

    fn cpu_totals(&self) -> [Duration; 5] {
        let cpu = self.cpu.lock().expect("cpu");
        [
            Kind::Backends,
            Kind::PgBackground,
            Kind::Relays,
            Kind::Nats,
            Kind::Bench,
        ]
        .map(|k| cpu.total(k))
    }

    /// Prints the block of the minute that lasted `elapsed`, and keeps its readings.
    async fn minute(
        &self,
        number: usize,
        elapsed: Duration,
        backlog_max: i64,
        apps: &HashMap<u32, String>,
        before: &mut Before,
    ) -> Minute {
        let secs = elapsed.as_secs_f64();
        let counts = self.minute.take();
        let reads = self.in_flight.take_minute();
        let (touched, events) = {
            let mut p = self.progress.lock().expect("progress");
            let mut touched = std::mem::take(&mut p.touched);
            touched.sort_unstable();
            touched.dedup();
            let current = p.current;
            p.touched.extend(current);
            (touched, std::mem::take(&mut p.events))
        };
        let (labels, baseline) = {
            let plan = self.plan.lock().expect("plan");
            let mut baseline = Histogram::default();
            let mut labels = Vec::new();
            for &i in &touched {
                baseline.merge(&plan[i].baseline.latency);
                labels.push(plan[i].label.clone());
            }
            (labels, baseline)
        };
        let backlog = probe::backlog(&self.probe).await;
        let table = probe::table_state(&self.probe, self.keep).await;
        let connections = probe::connections(&self.probe).await;
        let handled = self.handled.load(Ordering::Relaxed);
        let read = self.stream_check.lock().expect("stream check").messages;
        let cpu = self.cpu_totals();
        let work = self.cpu.lock().expect("cpu").backends_by_work(apps);
        let used = |now: Duration, then: Duration| now.saturating_sub(then);
        let cost = |d: Duration| cpu_cost(d, secs, counts.committed);
        let polls = std::mem::take(&mut *self.polls.lock().expect("polls"));
        let mut relay_lines = Vec::new();
        let mut relay_readings = Vec::new();
        let mut warnings = Vec::new();
        for relay in &self.relays {
            let Ok(mut r) = relay.try_lock() else {
                relay_lines.push("restarting".to_owned());
                continue;
            };
            for (n, message) in r.warnings() {
                warnings.push(format!("{} {n}x \"{message}\"", r.name));
            }
            let conns = connections.get(&r.name).copied().unwrap_or(0);
            match r
                .pid()
                .and_then(|pid| Some((pid, probe::memory_and_fds(pid)?)))
            {
                Some((pid, (rss, fds))) => {
                    relay_lines.push(format!(
                        "{} RSS {:.1} MB, {conns} Postgres connections, {fds} fds",
                        r.name,
                        rss as f64 / 1e3
                    ));
                    relay_readings.push((pid, rss, conns, fds));
                }
                None => relay_lines.push(format!("{} not running", r.name)),
            }
        }
        println!(
            "minute {number} ({:.0} s; {}{}):",
            secs,
            if labels.is_empty() {
                "draining".to_owned()
            } else {
                labels.join(", ")
            },
            if events.is_empty() {
                String::new()
            } else {
                "; relays restarted, above".to_owned()
            }
        );
        println!(
            "  commits: offered {}/s, achieved {}/s; emit commit {} (baseline at these loads {})",
            thousands(counts.offered as f64 / secs),
            thousands(counts.committed as f64 / secs),
            counts.latency.summary(),
            baseline.summary()
        );
        println!(
            "  readers: commit to stream {}; commit to consumer {}; consumer handled {}/s, {} behind the stream reader",
            reads.stream.summary(),
            reads.consumer.summary(),
            thousands((handled - before.handled) as f64 / secs),
            thousands(read as f64 - handled as f64),
        );
        println!(
            "  table: unpublished {backlog} (max {backlog_max}), expired not yet deleted {}, deleted {}/s; outbox_events {} + {} indexes, outbox_consumed {} + {} indexes; {} vacuums so far",
            thousands(table.expired as f64),
            thousands((table.deleted - before.deleted) as f64 / secs),
            mb(table.events_bytes),
            mb(table.events_index_bytes),
            mb(table.consumed_bytes),
            mb(table.consumed_index_bytes),
            self.vacuums.load(Ordering::Relaxed)
        );
        println!(
            "  relays: {}; lease held by {}",
            relay_lines.join("; "),
            polls.lease.as_deref().unwrap_or("?")
        );
        if !warnings.is_empty() {
            println!("  relay warnings: {}", warnings.join("; "));
        }
        let by_work: Vec<String> = Work::ALL
            .iter()
            .map(|w| {
                let d = used(work[*w as usize], before.work[*w as usize]);
                format!("{} {}", w.name(), cost(d))
            })
            .collect();
        let postgres = used(cpu[0] + cpu[1], before.cpu[0] + before.cpu[1]);
        println!(
            "  CPU {}: Postgres {}{} (this database's backends: {}; the server's own processes {}); relays {}; nats-server {}; this process {}",
            if counts.committed > 0 {
                "per event committed, in us"
            } else {
                "in cores (no events committed)"
            },
            cost(postgres),
            if counts.committed > 0 {
                format!(", {:.2} cores", postgres.as_secs_f64() / secs)
            } else {
                String::new()
            },
            by_work.join(", "),
            cost(used(cpu[1], before.cpu[1])),
            cost(used(cpu[2], before.cpu[2])),
            cost(used(cpu[3], before.cpu[3])),
            cost(used(cpu[4], before.cpu[4])),
        );
        println!(
            "  polls: outbox status {} ({} failed, slowest {:.0} ms), metrics scrapes {} ({} missed)",
            polls.status,
            polls.status_failed,
            polls.status_slowest.as_secs_f64() * 1e3,
            polls.scrapes,
            polls.scrapes_failed
        );
        before.cpu = cpu;
        before.work = work;
        before.handled = handled;
        before.read = read;
        before.deleted = table.deleted;
        Minute {
            at: self.started.elapsed().as_secs_f64(),
            loaded: !labels.is_empty(),
            expired: table.expired,
            relays: relay_readings,
        }
    }
}

/// The readings at the start of the current minute.
#[derive(Debug, Default)]
struct Before {
    cpu: [Duration; 5],
    work: [Duration; Work::ALL.len()],
    handled: u64,
    read: u64,
    deleted: i64,
}

/// Every step's figures, side by side.
pub fn steps(baselines: &[Baseline], plan: &[OutboxStep], in_flight: &InFlight, fixed: bool) {
    println!("\n== steps (commit latency: arrival to commit returned; readers: commit to them)");
    for b in baselines {
        if let Some(c) = b.capacity {
            println!("{}: insert capacity {}/s", b.shape.label(), thousands(c));
        }
    }
    for (i, step) in plan.iter().enumerate() {
        let Some(result) = &step.result else { continue };
        let reads = in_flight.of_step(i);
        println!(
            "{}: achieved/offered insert {}/{}, emit {}/{}; commit p99 insert {} emit {} ms ({}); stream {}; consumer {}; backlog at the end {}",
            step.label,
            thousands(step.baseline.achieved),
            thousands(step.baseline.offered),
            thousands(result.achieved),
            thousands(result.offered),
            fmt_ms(p99(&step.baseline.latency)),
            fmt_ms(p99(&result.latency)),
            ratio(p99(&result.latency), p99(&step.baseline.latency)),
            reads.stream.summary(),
            reads.consumer.summary(),
            step.backlog_at_end
        );
    }
    if !fixed {
        for b in baselines {
            println!(
                "emit_caught_up_vs_insert_capacity_ratio_{}={}",
                b.shape.key(),
                capacity_ratio(b, plan).map_or("n/a".into(), |r| format!("{r:.3}"))
            );
        }
    }
}

/// Prints the `correctness:` line: what the consumer applied (`applied`, with `pending` still
/// in its durable) and what the stream reader read (`stream`), against what was `written`
/// (events per subject); whether the run passes: nothing lost, applied twice, out of order,
/// skipped or missing in the stream, nothing left unpublished, the relays drained.
pub fn correctness(
    written: &[(uuid::Uuid, u64)],
    applied: Applied,
    pending: u64,
    stream: &StreamCheck,
    backlog_at_end: i64,
    drained: bool,
) -> bool {
    let emitted: u64 = written.iter().map(|(_, n)| n).sum();
    let missing: u64 = written
        .iter()
        .map(|(s, n)| n.saturating_sub(stream.next.get(&s.to_string()).copied().unwrap_or(0)))
        .sum();
    let passed = applied.lost == 0
        && applied.duplicated == 0
        && applied.reordered == 0
        && stream.skipped == 0
        && missing == 0
        && backlog_at_end == 0
        && drained;
    println!(
        "correctness: emitted={emitted} applied={} consumer_pending={pending} lost={} duplicated={} reordered={} stream_messages={} stream_repeated={} stream_skipped={} stream_missing={missing} backlog_at_end={backlog_at_end} drained={drained}: {}",
        applied.rows,
        applied.lost,
        applied.duplicated,
        applied.reordered,
        stream.messages,
        stream.repeated,
        stream.skipped,
        if passed { "passed" } else { "FAILED" }
    );
    passed
}

/// The rate emits achieved when offered the inserts' capacity, against that capacity: at most
/// about 1 (nothing commits faster than it arrives), below when emit cannot keep up with
/// what plain inserts sustain.
fn capacity_ratio(b: &Baseline, plan: &[OutboxStep]) -> Option<f64> {
    let capacity = b.capacity?;
    let full = plan
        .iter()
        .find(|s| s.shape == b.shape && s.fraction >= 1.0)?;
    Some(full.result.as_ref()?.achieved / capacity)
}

/// Microseconds of `used` per event, or the cores it kept busy over `secs` without events.
fn cpu_cost(used: Duration, secs: f64, events: u64) -> String {
    if events == 0 {
        format!("{:.2}", used.as_secs_f64() / secs)
    } else {
        format!("{:.0}", used.as_secs_f64() * 1e6 / events as f64)
    }
}

fn fmt_ms(ms: Option<f64>) -> String {
    ms.map_or("n/a".into(), |v| format!("{v:.2}"))
}

/// The last line: the run's figures as `name=value`.
#[allow(clippy::too_many_arguments)]
pub fn summary(
    baselines: &[Baseline],
    plan: &[OutboxStep],
    minutes: &[Minute],
    in_flight: &InFlight,
    keep: Duration,
    (baseline_us, postgres_cpu): (f64, Duration),
    emitted: u64,
    fixed: bool,
) {
    let done: Vec<(&OutboxStep, &StepResult)> = plan
        .iter()
        .filter_map(|s| s.result.as_ref().map(|r| (s, r)))
        .collect();
    // emit at the inserts' capacity, the worst shape
    let capacity = baselines
        .iter()
        .filter_map(|b| capacity_ratio(b, plan))
        .reduce(f64::min);
    // below capacity (or every step at a fixed rate): the worst p99 ratio and achieved share
    let below: Vec<&(&OutboxStep, &StepResult)> = done
        .iter()
        .filter(|(s, _)| fixed || s.fraction < 1.0)
        .collect();
    let p99_ratio = below
        .iter()
        .filter_map(|(s, r)| Some(p99(&r.latency)? / p99(&s.baseline.latency)?))
        .reduce(f64::max);
    let achieved = below
        .iter()
        .map(|(_, r)| r.achieved / r.offered.max(f64::MIN_POSITIVE))
        .reduce(f64::min);
    let mut stream = Histogram::default();
    let mut consumer = Histogram::default();
    for i in 0..plan.len() {
        let reads = in_flight.of_step(i);
        stream.merge(&reads.stream);
        consumer.merge(&reads.consumer);
    }
    // expired rows left, per minute under load, once retention could have deleted some (its
    // pass a minute after the first rows expired)
    let from = keep.as_secs_f64() + 60.0;
    let points: Vec<(f64, f64)> = minutes
        .iter()
        .filter(|m| m.loaded && m.at >= from)
        .map(|m| (m.at / 60.0, m.expired as f64))
        .collect();
    let growth = slope(&points);
    // each relay process's memory after its first minute
    let mut by_pid: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
    for m in minutes {
        for (pid, rss, _, _) in &m.relays {
            by_pid.entry(*pid).or_default().push(*rss);
        }
    }
    let spread = by_pid
        .values()
        .filter(|v| v.len() >= 3)
        .map(|v| {
            let warm = &v[1..];
            let (lo, hi) = (
                *warm.iter().min().expect("samples") as f64,
                *warm.iter().max().expect("samples") as f64,
            );
            (hi - lo) / lo * 100.0
        })
        .reduce(f64::max);
    let rss_max = minutes
        .iter()
        .flat_map(|m| m.relays.iter().map(|r| r.1))
        .max();
    let conns_max = minutes
        .iter()
        .flat_map(|m| m.relays.iter().map(|r| r.2))
        .max();
    let fds_max = minutes
        .iter()
        .flat_map(|m| m.relays.iter().map(|r| r.3))
        .max();
    let opt = |v: Option<f64>, places: usize| v.map_or("n/a".into(), |v| format!("{v:.places$}"));
    println!(
        "summary: emit_caught_up_vs_insert_capacity_ratio={} emit_commit_p99_vs_insert_ratio={} emit_achieved_vs_offered_min={} latency_p50_ms={} latency_p99_ms={} latency_p999_ms={} consumer_latency_p99_ms={} retention_backlog_growth_rows_per_min={} relay_rss_spread_pct={} relay_rss_mb_max={} relay_connections_max={} relay_fds_max={} postgres_cpu_us_per_event={:.0} postgres_cpu_us_per_event_baseline={baseline_us:.0}",
        opt(capacity, 3),
        opt(p99_ratio, 3),
        opt(achieved, 3),
        opt(stream.percentile_ms(50.0), 2),
        opt(stream.percentile_ms(99.0), 2),
        opt(stream.percentile_ms(99.9), 2),
        opt(consumer.percentile_ms(99.0), 2),
        opt(growth, 0),
        opt(spread, 1),
        opt(rss_max.map(|kb| kb as f64 / 1e3), 1),
        conns_max.map_or("n/a".into(), |c| c.to_string()),
        fds_max.map_or("n/a".into(), |c| c.to_string()),
        postgres_cpu.as_secs_f64() * 1e6 / emitted.max(1) as f64,
    );
}

/// The least-squares slope of `points`, or `None` with fewer than two.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(num, den), (x, y)| {
        (num + (x - mx) * (y - my), den + (x - mx) * (x - mx))
    });
    (den > 0.0).then(|| num / den)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_its_rise_per_step() {
        assert_eq!(slope(&[(1.0, 10.0), (2.0, 30.0), (3.0, 50.0)]), Some(20.0));
        assert_eq!(slope(&[(1.0, 10.0)]), None);
        assert_eq!(slope(&[(1.0, 10.0), (1.0, 20.0)]), None);
    }
}
