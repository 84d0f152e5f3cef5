//! Positions in the relay's order, `(created_at, id)`: a total order, so rows emitted in the
//! same instant (a backfill in one transaction, the table's own `default now()`) still have
//! one. `created_at` may be `±infinity` in a hand-written row, so a position's instant can be
//! too.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A `timestamptz` value, infinities included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stamp {
    NegInfinity,
    At(DateTime<Utc>),
    Infinity,
}

/// Microseconds from the Unix epoch to Postgres's, 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl Stamp {
    /// A `timestamptz` in Postgres's binary form: microseconds since 2000-01-01, with
    /// `i64::MAX` and `i64::MIN` for the infinities. A value chrono cannot represent is an error.
    pub(super) fn from_pg_micros(micros: i64) -> Result<Stamp, String> {
        match micros {
            i64::MAX => Ok(Stamp::Infinity),
            i64::MIN => Ok(Stamp::NegInfinity),
            _ => micros
                .checked_add(PG_EPOCH_MICROS)
                .and_then(DateTime::from_timestamp_micros)
                .map(Stamp::At)
                .ok_or_else(|| format!("({micros} µs from 2000-01-01) is out of range")),
        }
    }

    /// A `timestamptz` in Postgres's text form.
    pub(super) fn from_pg_text(text: &str) -> Result<Stamp, String> {
        match text {
            "infinity" => Ok(Stamp::Infinity),
            "-infinity" => Ok(Stamp::NegInfinity),
            _ => DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z")
                .map(|t| Stamp::At(t.with_timezone(&Utc)))
                .map_err(|e| format!("`{text}` cannot be read: {e}")),
        }
    }
}

/// As Postgres reads it back (`'-infinity'::timestamptz`, RFC 3339 otherwise): the form the
/// statements bind.
impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stamp::NegInfinity => f.write_str("-infinity"),
            Stamp::At(t) => write!(
                f,
                "{}",
                t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            ),
            Stamp::Infinity => f.write_str("infinity"),
        }
    }
}

/// A row's place in the relay's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Position {
    pub(super) at: Stamp,
    pub(super) id: Uuid,
}

impl Position {
    /// Before every row.
    pub(super) const START: Position = Position {
        at: Stamp::NegInfinity,
        id: Uuid::nil(),
    };

    /// A position just before this one: every row at its instant comes after it.
    pub(super) fn before(self) -> Position {
        Position {
            at: self.at,
            id: Uuid::nil(),
        }
    }

    /// The instant as the statements bind it (`$n::timestamptz`).
    pub(super) fn at_text(&self) -> String {
        self.at.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_micros_map_to_instants_and_infinities() {
        assert_eq!(Stamp::from_pg_micros(i64::MAX), Ok(Stamp::Infinity));
        assert_eq!(Stamp::from_pg_micros(i64::MIN), Ok(Stamp::NegInfinity));
        let y2k = DateTime::parse_from_rfc3339("2000-01-01T00:00:00Z").unwrap();
        assert_eq!(
            Stamp::from_pg_micros(0),
            Ok(Stamp::At(y2k.with_timezone(&Utc)))
        );
        assert_eq!(
            Stamp::from_pg_micros(1_500_000).unwrap().to_string(),
            "2000-01-01T00:00:01.500000Z"
        );
        assert!(
            Stamp::from_pg_micros(i64::MAX - 1).is_err(),
            "beyond chrono: an error, not a panic"
        );
        assert!(Stamp::from_pg_micros(i64::MIN + 1).is_err());
    }

    #[test]
    fn the_text_form_reads_back() {
        assert_eq!(Stamp::from_pg_text("infinity"), Ok(Stamp::Infinity));
        assert_eq!(Stamp::from_pg_text("-infinity"), Ok(Stamp::NegInfinity));
        assert_eq!(
            Stamp::from_pg_text("2026-12-01 10:00:00.25+00")
                .unwrap()
                .to_string(),
            "2026-12-01T10:00:00.250000Z"
        );
        assert!(Stamp::from_pg_text("yesterday").is_err());
    }

    #[test]
    fn positions_order_by_instant_then_id() {
        let t = Stamp::At(Utc::now());
        let a = Position {
            at: t,
            id: Uuid::from_u128(1),
        };
        let b = Position {
            at: t,
            id: Uuid::from_u128(2),
        };
        let later = Position {
            at: Stamp::Infinity,
            id: Uuid::nil(),
        };
        assert!(Position::START < a && a < b && b < later);
        assert_eq!(Position::START.at_text(), "-infinity");
    }
}
