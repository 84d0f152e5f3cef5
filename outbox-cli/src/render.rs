//! What the commands print: the status table, the verify report, envelopes, a value from a
//! row, ages and the lock's statuses.

use std::fmt::Write as _;
use std::time::Duration;

use outbox_codegen::LockedStatus;
use outbox_runtime::status::Status;
use outbox_runtime::verify::VerifyReport;

/// An age as the tables show it: seconds, minutes or hours with one decimal, `-` for none.
pub fn age(d: Option<Duration>) -> String {
    match d {
        None => "-".into(),
        Some(d) if d.as_secs() >= 3600 => format!("{:.1}h", d.as_secs_f64() / 3600.0),
        Some(d) if d.as_secs() >= 60 => format!("{:.1}m", d.as_secs_f64() / 60.0),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}

/// A value from the table, cut to fit a line (rows written by hand can hold anything).
pub fn shown(value: &str) -> String {
    const WIDTH: usize = 60;
    let printable: String = value
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if printable.chars().count() <= WIDTH {
        return printable;
    }
    let head: String = printable.chars().take(WIDTH).collect();
    format!("{head}… ({} bytes)", value.len())
}

/// `outbox status`'s table.
pub fn status(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "unpublished          {}", s.unpublished);
    let _ = writeln!(
        out,
        "oldest unpublished   {}",
        age(s.oldest_unpublished_age)
    );
    let _ = writeln!(out, "at attempt cap ({})  {}", s.max_attempts, s.at_cap);
    let _ = writeln!(out, "held                 {}", s.held_total);
    let _ = writeln!(
        out,
        "on held subjects     {} row(s), oldest {}",
        s.held_unpublished,
        age(s.oldest_held_age)
    );
    let _ = writeln!(out, "backing off          {} subject(s)", s.backing_off);
    let attempts: Vec<String> = s.attempts.iter().map(|(a, n)| format!("{a}:{n}")).collect();
    let _ = writeln!(
        out,
        "attempts             {}",
        if attempts.is_empty() {
            "-".into()
        } else {
            attempts.join("  ")
        }
    );
    if !s.by_type.is_empty() {
        let width = s
            .by_type
            .iter()
            .map(|t| shown(&t.event_type).chars().count())
            .max()
            .unwrap_or(10)
            .max(10);
        let _ = writeln!(
            out,
            "\n{:<width$}  {:>11}  {:>8}  {:>6}",
            "event type", "unpublished", "oldest", "at cap"
        );
        for t in &s.by_type {
            let _ = writeln!(
                out,
                "{:<width$}  {:>11}  {:>8}  {:>6}",
                shown(&t.event_type),
                t.unpublished,
                age(t.oldest_unpublished_age),
                t.at_cap
            );
        }
    }
    if !s.held.is_empty() {
        let _ = writeln!(
            out,
            "\nheld (each holds its subject; release with `outbox unblock`):"
        );
        for h in &s.held {
            let _ = writeln!(
                out,
                "{}  {}  subject {}  attempts {}: {}",
                h.id,
                shown(&h.event_type),
                shown(&h.subject),
                h.attempts,
                h.reason
            );
        }
        if s.held_total > s.held.len() as i64 {
            let _ = writeln!(out, "... and {} more", s.held_total - s.held.len() as i64);
        }
    }
    if !s.backing_off_reasons.is_empty() {
        let _ = writeln!(
            out,
            "\nbacking off, by reason (the relay retries them by itself):"
        );
        for r in &s.backing_off_reasons {
            let _ = writeln!(out, "{:>6} subject(s): {}", r.subjects, r.reason);
        }
    }
    if !s.backing_off_subjects.is_empty() {
        let _ = writeln!(out, "\nbacking off:");
        for b in &s.backing_off_subjects {
            let _ = writeln!(
                out,
                "{}  {}  subject {}  attempts {}  retry in {}: {}",
                b.id,
                shown(&b.event_type),
                shown(&b.subject),
                b.attempts,
                age(b.retry_in),
                b.reason
            );
        }
        let listed = s.backing_off_subjects.len() as i64;
        if s.backing_off > listed {
            let _ = writeln!(out, "... and {} more", s.backing_off - listed);
        }
    }
    out
}

/// One message as `outbox tail` prints it: the envelope's header line and its data, or what
/// arrived when it is not an envelope.
pub fn envelope(subject: &str, payload: &[u8]) -> String {
    match serde_json::from_slice::<outbox_runtime::Envelope>(payload) {
        Ok(e) => format!(
            "{} {} id={} source={} subject={}\n  {}",
            e.time.to_rfc3339(),
            e.event_type,
            e.id,
            e.source,
            e.subject,
            serde_json::to_string(&e.data).unwrap_or_default()
        ),
        Err(err) => format!(
            "{subject}: not a CloudEvents envelope ({err}): {}",
            String::from_utf8_lossy(payload)
        ),
    }
}

/// What `outbox lock` did with an event type.
pub fn locked(status: &LockedStatus) -> &'static str {
    match status {
        LockedStatus::New => "new",
        LockedStatus::Unchanged => "unchanged",
        LockedStatus::Compatible => "changed compatibly",
        LockedStatus::BreakingAllowed => "changed incompatibly, allowed by --allow-breaking",
        LockedStatus::Dropped => "gone, dropped from the lock (--allow-breaking)",
        _ => "locked",
    }
}

/// `outbox verify`'s report; `republish` says whether it set missing rows unpublished.
pub fn verify(r: &VerifyReport, republish: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stream {}, rows published from {} to {}: {} row(s), {} present, {} missing",
        r.stream,
        r.from.to_rfc3339(),
        r.to.to_rfc3339(),
        r.rows,
        r.present,
        r.missing
    );
    if r.not_captured > 0 {
        let _ = writeln!(
            out,
            "skipped {} row(s) of event types stream {} does not capture",
            r.not_captured, r.stream
        );
    }
    for gap in r.gaps() {
        let _ = writeln!(out, "NOT VERIFIED: {gap}");
    }
    if republish && r.missing > 0 {
        let _ = writeln!(
            out,
            "republished {} row(s): the relay publishes them again with their original ids",
            r.republished
        );
        if r.deferred > 0 {
            let until = r
                .deferred_until
                .map_or_else(String::new, |t| t.to_rfc3339());
            let _ = writeln!(
                out,
                "left {} row(s) as published: published less than the stream's duplicate \
                 window ago, the stream would drop them as duplicates; run again after {until}",
                r.deferred
            );
        }
    } else if r.missing > 0 {
        let _ = writeln!(
            out,
            "MISSING: {} published row(s) are not in stream {} (`--republish` sets them \
             unpublished so the relay publishes them again)",
            r.missing, r.stream
        );
    }
    if r.all_present() {
        let _ = writeln!(out, "ok: every row of the range is in the stream");
    }
    out
}
