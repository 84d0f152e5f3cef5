//! Verifying the stream against the table: is every row the table calls published in the
//! stream?
//!
//! [`verify`] walks the published rows of a time range (by `published_at`) and looks for each
//! one's id among the `Nats-Msg-Id` headers of the stream's messages; a row whose id is not
//! there is *missing*: acknowledged once, gone since (a lost write on the broker, a deleted
//! message, a stream recreated empty). With [`VerifyOptions::republish`] it sets those rows
//! unpublished again, so the relay publishes them again under their original ids.
//!
//! # The algorithm, and why it is sound
//!
//! The relay marks a row (`published_at = clock_timestamp()`) only after the stream has stored
//! its message and acknowledged it, so the message's stream timestamp `T` is at most the row's
//! `published_at` `P` (give or take the difference between the NATS and Postgres clocks, the
//! `clock_skew`). It is usually milliseconds earlier: one batch's publish and mark. It can be
//! much earlier in one case: a publish whose ack or mark was lost is republished, and the stream
//! answers "duplicate" for an id it stored within its duplicate window `D`, so the row is marked
//! up to `D` after its message was stored. Hence every present row has a message with
//! `P - D - lag - skew <= T <= P + skew`.
//!
//! 1. **Rows pass.** The rows of the range, ordered by `(published_at, id)`, are read in pages
//!    of [`VerifyOptions::page_size`] from a cursor. For a page whose rows span `[P1, Pn]`, the
//!    stream's messages from `P1 - lag - skew` until the first one stored after `Pn + skew` are
//!    read (an ordered, headers-only consumer started *by start time*), and every id seen is
//!    struck off. The rows left are *suspects*, kept in a temporary table on the server.
//! 2. **Suspects pass.** The suspects, in pages of the same size, are looked for again over the
//!    wider span `[P1 - D - lag - skew, Pn + lag + skew]`. The ones still not seen are missing.
//!
//! The first pass's `lag` only decides how many rows the second pass sees: a row found late is
//! still found, so a short lag costs reading, never a false report. Every row of the cursor
//! was marked before the run began, so its message was stored before any consumer of the run
//! was created: a consumer with nothing left pending has delivered all there is to see.
//!
//! # Memory
//!
//! The client holds one page of rows (id and time, about 60 bytes each in the page's hash map)
//! and the ids and times of the messages read last, up to eight pages' worth (about 36 bytes
//! each), so that consecutive pages' overlapping spans are read once; nothing grows with the
//! range. 1,000,000 rows are 100 pages of 10,000, in about 4 MB. The ordered result is
//! materialized on the server (a `with hold` cursor, spilled to a temporary file past
//! `work_mem`), which ends the snapshot at once instead of holding one open for the whole run;
//! suspects and missing ids are temporary tables. When the stream stores more than eight pages
//! per `lag + 2 * skew`, the overlap no longer fits and each page reads its span again: choose
//! a larger page for such a stream.
//!
//! # What cannot be verified
//!
//! A row published before the stream's first message is counted in
//! [`VerifyReport::before_stream`], not checked: the stream's limits (or a purge) removed its
//! message, and nothing tells that from a loss. A range that starts before the stream's first
//! message, or before the table's oldest published row (rows pruned), is partly outside
//! retention: [`VerifyReport::gaps`] says so and [`VerifyReport::all_present`] is false.
//! Rows whose event type the stream does not capture are counted in
//! [`VerifyReport::not_captured`] and skipped (another stream holds them).

mod read;
mod session;

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{Error, Result};
use read::StreamReader;
use session::Session;

/// What [`verify`] checks, and how.
///
/// ```
/// use chrono::{Duration, Utc};
/// use outbox_runtime::verify::VerifyOptions;
///
/// let to = Utc::now();
/// let options = VerifyOptions::new("OUTBOX", to - Duration::hours(1), to);
/// assert_eq!(options.page_size, 10_000);
/// assert!(!options.republish);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// The stream to compare with.
    pub stream: String,
    /// Rows published at or after this time are checked.
    pub from: DateTime<Utc>,
    /// Rows published before this time are checked.
    pub to: DateTime<Utc>,
    /// Set the missing rows unpublished again (`published_at = null`, `attempts = 0`), in one
    /// transaction, so that the relay publishes them again with their original ids. Rows
    /// whose ids the stream may still remember (published less than its duplicate window
    /// ago) are left and counted in [`VerifyReport::deferred`]: the stream would drop their
    /// republished message as a duplicate.
    pub republish: bool,
    /// Rows per page, and suspects per page of the second pass (default 10,000).
    pub page_size: usize,
    /// How long after storing a message the relay usually marks its row (default 2 s: one
    /// batch's acks and mark, usually milliseconds). Rows not found within it are looked for
    /// again over the stream's duplicate window, so this decides only how much is read.
    pub lag: Duration,
    /// The largest difference between the NATS servers' clocks and Postgres's (default 2 s).
    pub clock_skew: Duration,
    /// How many missing rows [`VerifyReport::missing_rows`] keeps (default 100); every one is
    /// passed to the callback.
    pub listed: usize,
}

impl VerifyOptions {
    /// Options for the rows of `stream` published in `[from, to)`, with the defaults.
    pub fn new(stream: impl Into<String>, from: DateTime<Utc>, to: DateTime<Utc>) -> Self {
        Self {
            stream: stream.into(),
            from,
            to,
            republish: false,
            page_size: 10_000,
            lag: Duration::from_secs(2),
            clock_skew: Duration::from_secs(2),
            listed: 100,
        }
    }

    fn check(&self) -> Result<()> {
        if self.from >= self.to {
            return Err(Error::Config(format!(
                "verify: the range is empty: from ({}) is not before to ({})",
                self.from, self.to
            )));
        }
        if self.page_size == 0 {
            return Err(Error::Config("verify: page_size must be at least 1".into()));
        }
        Ok(())
    }
}

/// A published row whose message is not in the stream.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct MissingRow {
    /// The event id (the message's `Nats-Msg-Id`).
    pub id: Uuid,
    /// Its event type (the subject it was published on).
    pub event_type: String,
    /// Its subject column.
    pub subject: String,
    /// When it was inserted.
    pub created_at: DateTime<Utc>,
    /// When the relay marked it published.
    pub published_at: DateTime<Utc>,
}

/// Which pass [`Progress`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// The rows of the range, page by page.
    Rows,
    /// The rows not found near their publish time, looked for over the duplicate window.
    Suspects,
}

/// How far [`verify`] is, after each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// The pass.
    pub phase: Phase,
    /// Rows (or suspects) done in this pass.
    pub done: u64,
    /// Rows (or suspects) this pass has in all.
    pub total: u64,
    /// Stream messages read so far, both passes.
    pub messages_read: u64,
    /// Missing rows found so far.
    pub missing: u64,
}

/// What [`verify`] tells its callback as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyEvent<'a> {
    /// A page is done.
    Progress(Progress),
    /// A row is missing from the stream (each is passed once).
    Missing(&'a MissingRow),
}

/// The outcome of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The stream compared with.
    pub stream: String,
    /// The range, as asked.
    pub from: DateTime<Utc>,
    /// The end of the range (excluded).
    pub to: DateTime<Utc>,
    /// Published rows in the range whose type the stream captures.
    pub rows: u64,
    /// Those found in the stream.
    pub present: u64,
    /// Those not found in the stream.
    pub missing: u64,
    /// The first [`VerifyOptions::listed`] missing rows, by `published_at`.
    pub missing_rows: Vec<MissingRow>,
    /// Rows published before the stream's first message: not verified.
    pub before_stream: u64,
    /// Rows in the range whose event type the stream does not capture: skipped.
    pub not_captured: u64,
    /// When the stream's first message was stored (`None`: the stream is empty).
    pub stream_first: Option<DateTime<Utc>>,
    /// The oldest `published_at` in the table (`None`: no published row).
    pub table_first: Option<DateTime<Utc>>,
    /// Missing rows set unpublished again ([`VerifyOptions::republish`]).
    pub republished: u64,
    /// Missing rows not set unpublished: published within the stream's duplicate window, whose
    /// ids the stream may still remember. Run again after [`VerifyReport::deferred_until`].
    pub deferred: u64,
    /// When the last deferred row's id leaves the duplicate window.
    pub deferred_until: Option<DateTime<Utc>>,
    /// Stream messages read, both passes.
    pub messages_read: u64,
}

impl VerifyReport {
    /// The parts of the range outside retention, in words (empty when the whole range is
    /// inside both the stream's and the table's retention).
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        match self.stream_first {
            None => gaps.push(format!(
                "stream `{}` holds no message: no row of the range can be verified",
                self.stream
            )),
            Some(first) if first > self.from => gaps.push(format!(
                "the range starts at {}, before stream `{}`'s first message ({first}): {} row(s) \
                 published before it are not verified (the stream's limits or a purge removed \
                 their messages)",
                self.from, self.stream, self.before_stream
            )),
            Some(_) => {}
        }
        match self.table_first {
            Some(first) if first > self.from => gaps.push(format!(
                "the range starts at {}, before the table's oldest published row ({first}): \
                 rows published before it were pruned (or never existed) and cannot be verified",
                self.from
            )),
            None => gaps.push(
                "the table has no published row: nothing could be verified (pruned, or none yet)"
                    .into(),
            ),
            Some(_) => {}
        }
        gaps
    }

    /// Every row of the range was verified and found: no missing row, no gap.
    pub fn all_present(&self) -> bool {
        self.missing == 0 && self.gaps().is_empty()
    }
}

/// Compares the rows of `pool`'s outbox table published in `[options.from, options.to)` with
/// the messages of stream `options.stream`, by event id and `Nats-Msg-Id`, in bounded memory;
/// see the [module documentation](self) for the algorithm. `on_event` is called after every
/// page and with every missing row.
///
/// It opens one connection of its own (a cursor and two temporary tables live on it) and
/// reads the stream with ephemeral ordered consumers, headers only.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool, jetstream: async_nats::jetstream::Context) -> outbox_runtime::Result<()> {
/// use chrono::{Duration, Utc};
/// use outbox_runtime::verify::{verify, VerifyEvent, VerifyOptions};
///
/// let to = Utc::now();
/// let options = VerifyOptions::new("OUTBOX", to - Duration::hours(24), to);
/// let report = verify(&pool, &jetstream, &options, |event| {
///     if let VerifyEvent::Missing(row) = event {
///         eprintln!("missing from the stream: {} ({})", row.id, row.event_type);
///     }
/// })
/// .await?;
/// if !report.all_present() {
///     eprintln!("{} missing; not verified: {:?}", report.missing, report.gaps());
/// }
/// # Ok(()) }
/// ```
pub async fn verify(
    pool: &PgPool,
    jetstream: &jetstream::Context,
    options: &VerifyOptions,
    mut on_event: impl FnMut(VerifyEvent<'_>),
) -> Result<VerifyReport> {
    options.check()?;
    let mut reader =
        StreamReader::open(jetstream, &options.stream, RECENT * options.page_size).await?;
    let mut session = Session::open(pool, options.from, options.to).await?;
    let mut report = VerifyReport {
        stream: options.stream.clone(),
        from: options.from,
        to: options.to,
        rows: 0,
        present: 0,
        missing: 0,
        missing_rows: Vec::new(),
        before_stream: 0,
        not_captured: 0,
        stream_first: reader.first_time(),
        table_first: session.table_first().await?,
        republished: 0,
        deferred: 0,
        deferred_until: None,
        messages_read: 0,
    };
    rows_pass(
        &mut session,
        &mut reader,
        options,
        &mut report,
        &mut on_event,
    )
    .await?;
    suspects_pass(
        &mut session,
        &mut reader,
        options,
        &mut report,
        &mut on_event,
    )
    .await?;
    report.messages_read = reader.messages_read();
    if options.republish && report.missing > 0 {
        let window = reader.duplicate_window() + options.clock_skew;
        let done = session.republish(window).await?;
        report.republished = done.republished;
        report.deferred = done.deferred;
        report.deferred_until = done.deferred_until;
    }
    session.close().await;
    Ok(report)
}

/// How many message ids the stream reader keeps, per row of a page, so that consecutive
/// pages' overlapping spans are read once.
const RECENT: usize = 8;

/// `t - d`, or the earliest time when that underflows.
fn before(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `t + d`, or the latest time when that overflows.
fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Pass 1: every page of rows against the stream near its publish times; what is not seen
/// becomes a suspect.
async fn rows_pass(
    session: &mut Session,
    reader: &mut StreamReader,
    options: &VerifyOptions,
    report: &mut VerifyReport,
    on_event: &mut impl FnMut(VerifyEvent<'_>),
) -> Result<()> {
    let total = session.rows_total();
    let mut done = 0u64;
    loop {
        let page = session.next_rows(options.page_size).await?;
        if page.is_empty() {
            return Ok(());
        }
        done += page.len() as u64;
        let mut pending: HashMap<Uuid, DateTime<Utc>> = HashMap::with_capacity(page.len());
        for (id, event_type, published_at) in page {
            if !reader.captures(&event_type) {
                report.not_captured += 1;
            } else if report.stream_first.is_none_or(|first| published_at < first) {
                report.rows += 1;
                report.before_stream += 1;
            } else {
                report.rows += 1;
                pending.insert(id, published_at);
            }
        }
        let checked = pending.len() as u64;
        if let Some((start, end)) = span(&pending) {
            let start = before(start, options.lag + options.clock_skew);
            let end = after(end, options.clock_skew);
            reader
                .read(start, end, |id| _ = pending.remove(&id))
                .await?;
        }
        report.present += checked - pending.len() as u64;
        session.add_suspects(&pending).await?;
        on_event(VerifyEvent::Progress(Progress {
            phase: Phase::Rows,
            done,
            total,
            messages_read: reader.messages_read(),
            missing: 0,
        }));
    }
}

/// The earliest and latest time of `rows`.
fn span(rows: &HashMap<Uuid, DateTime<Utc>>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let first = rows.values().min()?;
    let last = rows.values().max()?;
    Some((*first, *last))
}

/// Pass 2: every page of suspects against the stream over the duplicate window before their
/// publish times; what is still not seen is missing.
async fn suspects_pass(
    session: &mut Session,
    reader: &mut StreamReader,
    options: &VerifyOptions,
    report: &mut VerifyReport,
    on_event: &mut impl FnMut(VerifyEvent<'_>),
) -> Result<()> {
    let total = session.suspects_total().await?;
    let window = reader.duplicate_window() + options.lag + options.clock_skew;
    let mut done = 0u64;
    let mut last = None;
    loop {
        let page = session.next_suspects(last, options.page_size).await?;
        let Some(&(last_id, last_time)) = page.last() else {
            return Ok(());
        };
        last = Some((last_time, last_id));
        let page_len = page.len() as u64;
        done += page_len;
        let mut pending: HashMap<Uuid, DateTime<Utc>> = page.into_iter().collect();
        if let Some((start, end)) = span(&pending) {
            let start = before(start, window);
            let end = after(end, options.lag + options.clock_skew);
            reader
                .read(start, end, |id| _ = pending.remove(&id))
                .await?;
        }
        let found = page_len - pending.len() as u64;
        report.present += found;
        let missing = session.add_missing(&pending).await?;
        for row in &missing {
            on_event(VerifyEvent::Missing(row));
        }
        report.missing += missing.len() as u64;
        let room = options.listed.saturating_sub(report.missing_rows.len());
        report.missing_rows.extend(missing.into_iter().take(room));
        on_event(VerifyEvent::Progress(Progress {
            phase: Phase::Suspects,
            done,
            total,
            messages_read: reader.messages_read(),
            missing: report.missing,
        }));
    }
}
