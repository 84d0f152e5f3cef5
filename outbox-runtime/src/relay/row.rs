//! A claimed row as the relay reads it: every column decoded on its own, so that a row whose
//! values cannot be read (an infinite timestamp, text that is not UTF-8, JSON nested deeper than
//! the parser allows) is held with its reason instead of failing the batch or panicking; and
//! the row's physical address.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use sqlx::error::BoxDynError;
use sqlx::postgres::PgRow;
use sqlx::{Row as _, ValueRef as _};
use uuid::Uuid;

use super::position::{Position, Stamp};
use crate::trace::TraceContext;

/// One claimed row, in [`CLAIM`](super::sql::CLAIM)'s column order.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) id: Uuid,
    /// Where the row is, for the marks (stable while the claim holds the row's lock).
    pub(super) ctid: Tid,
    /// `(created_at, id)`: the relay's order.
    pub(super) position: Position,
    /// The subject (lossily decoded if it is not UTF-8: the row is then broken, and the
    /// statements that hold it name it by `id`).
    pub(super) subject: String,
    pub(super) attempts: i32,
    /// What the envelope is made of, or why the row cannot be read.
    pub(super) event: Result<Event, String>,
    /// The trace context the event was emitted in (migration 0007): `None` when the row has
    /// none, the claim did not read it (a table without the columns), or its `traceparent` is
    /// not a W3C one (written by hand: the relay then starts a new trace rather than hold the
    /// row for it).
    pub(super) trace: Option<TraceContext>,
}

/// The columns of a row that go into its message.
#[derive(Debug)]
pub(super) struct Event {
    pub(super) event_type: String,
    pub(super) source: String,
    pub(super) time: DateTime<Utc>,
    /// Passed through as Postgres rendered it: never re-serialized, only copied.
    pub(super) data: Box<RawValue>,
}

impl Row {
    /// The row's event type, or `""` when its columns could not be read.
    pub(super) fn event_type(&self) -> &str {
        self.event.as_ref().map_or("", |e| e.event_type.as_str())
    }

    /// Decodes a row of [`CLAIM`](super::sql::CLAIM) (`id, event_type, source, subject, time,
    /// data, created_at, attempts, tidsend(ctid)`, then `traceparent, tracestate` if the claim
    /// read them). Only `id` and `ctid`, which Postgres always writes in a readable form, fail
    /// the whole row.
    pub(super) fn decode(row: &PgRow) -> sqlx::Result<Row> {
        let trace = if row.len() > 10 {
            let tracestate = optional_text(row, 10);
            optional_text(row, 9).and_then(|tp| TraceContext::parse(&tp, tracestate.as_deref()))
        } else {
            None
        };
        let id: Uuid = row.try_get(0)?;
        let ctid = Tid::from_binary(row.try_get(8)?).map_err(|e| sqlx::Error::ColumnDecode {
            index: "ctid".into(),
            source: e,
        })?;
        let attempts: i32 = row.try_get(7)?;
        let (subject, subject_ok) = text(row, 3);
        let created_at = stamp(row, 6);
        let event = (|| {
            if !subject_ok {
                return Err("its subject is not valid UTF-8".to_owned());
            }
            let created_at = created_at
                .as_ref()
                .map_err(|e| format!("its created_at {e}"))?;
            if !created_at.is_finite() {
                return Err(format!("its created_at is {created_at}"));
            }
            let event_type = utf8(row, 1, "event_type")?;
            let source = utf8(row, 2, "source")?;
            let time = stamp(row, 4).map_err(|e| format!("its time {e}"))?;
            let Some(time) = time.to_chrono() else {
                return Err(format!(
                    "its time is {time}: the envelope needs an instant of years -262143 to 262143"
                ));
            };
            let data: sqlx::types::Json<Box<RawValue>> = row
                .try_get(5)
                .map_err(|e| format!("its data cannot be read: {}", cause(&e)))?;
            Ok(Event {
                event_type,
                source,
                time,
                data: data.0,
            })
        })();
        Ok(Row {
            id,
            ctid,
            position: Position {
                at: created_at.unwrap_or(Stamp::NEG_INFINITY),
                id,
            },
            subject,
            attempts,
            event,
            trace,
        })
    }
}

/// A nullable text column: `None` when null or not UTF-8.
fn optional_text(row: &PgRow, index: usize) -> Option<String> {
    let value = row.try_get_raw(index).ok()?;
    if value.is_null() {
        return None;
    }
    match text(row, index) {
        (s, true) => Some(s),
        (_, false) => None,
    }
}

/// The innermost message of a decode error.
fn cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::ColumnDecode { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

/// A text column as a string, and whether it was valid UTF-8 (lossily converted if not).
fn text(row: &PgRow, index: usize) -> (String, bool) {
    match row
        .try_get_raw(index)
        .ok()
        .and_then(|v| v.as_bytes().ok().map(<[u8]>::to_vec))
    {
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(s) => (s, true),
            Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), false),
        },
        None => (String::new(), false),
    }
}

fn utf8(row: &PgRow, index: usize, column: &str) -> Result<String, String> {
    match text(row, index) {
        (s, true) => Ok(s),
        (_, false) => Err(format!("its {column} is not valid UTF-8")),
    }
}

/// A `timestamptz` column as Postgres stores it, without sqlx's chrono decoder, which panics on
/// values chrono cannot represent (`infinity`).
fn stamp(row: &PgRow, index: usize) -> Result<Stamp, String> {
    row.try_get::<Stamp, _>(index).map_err(|e| cause(&e))
}

/// A row's physical address (`ctid`: block number and line pointer). The claim reads it as the
/// bytes of `tidsend` (Postgres's binary form), the marks send it back as text, `(block,line)`,
/// cast to `tid` by the statement: sqlx does not know the `tid` type, and would look it up with
/// a statement of its own whose unqualified calls another role could overload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tid {
    block: u32,
    line: u16,
}

impl Tid {
    /// The binary form: the block number and the line pointer, big-endian.
    #[cfg(test)]
    fn to_binary(self) -> [u8; 6] {
        let [b0, b1, b2, b3] = self.block.to_be_bytes();
        let [l0, l1] = self.line.to_be_bytes();
        [b0, b1, b2, b3, l0, l1]
    }

    fn from_binary(bytes: &[u8]) -> Result<Tid, BoxDynError> {
        match *bytes {
            [b0, b1, b2, b3, l0, l1] => Ok(Tid {
                block: u32::from_be_bytes([b0, b1, b2, b3]),
                line: u16::from_be_bytes([l0, l1]),
            }),
            ref other => Err(format!("a binary tid has 6 bytes, not {}", other.len()).into()),
        }
    }

    /// The text form, `(block,line)`, as `tid`'s input function reads it.
    pub(super) fn to_text(self) -> String {
        format!("({},{})", self.block, self.line)
    }
}

/// A tid for other modules' tests.
#[cfg(test)]
pub(super) fn tests_tid() -> Tid {
    Tid { block: 0, line: 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tid_round_trips_through_its_binary_form() {
        for tid in [
            Tid { block: 0, line: 1 },
            Tid {
                block: 7,
                line: 300,
            },
            Tid {
                block: u32::MAX,
                line: u16::MAX,
            },
        ] {
            assert_eq!(Tid::from_binary(&tid.to_binary()).unwrap(), tid);
        }
        assert_eq!(
            Tid {
                block: 0x0102_0304,
                line: 0x0506
            }
            .to_binary(),
            [1, 2, 3, 4, 5, 6],
            "big-endian, block first"
        );
    }

    #[test]
    fn a_tid_writes_its_text_form() {
        assert_eq!(Tid { block: 12, line: 3 }.to_text(), "(12,3)");
        assert_eq!(
            Tid {
                block: u32::MAX,
                line: u16::MAX
            }
            .to_text(),
            "(4294967295,65535)"
        );
    }

    #[test]
    fn a_malformed_tid_is_an_error_not_a_panic() {
        assert!(Tid::from_binary(&[0, 1, 2])
            .unwrap_err()
            .to_string()
            .contains("6 bytes, not 3"));
    }
}
