//! Positions in the relay's order, `(created_at, id)`: a total order, so rows emitted in the
//! same instant (a backfill in one transaction, the table's own `default now()`) still have
//! one.
//!
//! A position's instant is kept exactly as Postgres stores a `timestamptz`, microseconds from
//! 2000-01-01 with the infinities at the ends of the range, and bound back in that binary form:
//! every value the column allows (`±infinity`, 4713 BC, the year 294276) round-trips and orders
//! as Postgres orders it. No text, no calendar on the way.

use std::fmt;

use chrono::{DateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueFormat, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};
use uuid::Uuid;

/// A `timestamptz` as Postgres stores it: microseconds from 2000-01-01, `i64::MIN` for
/// `-infinity` and `i64::MAX` for `infinity`. Its order is Postgres's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Stamp(pub(super) i64);

/// Microseconds from the Unix epoch to Postgres's, 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl Stamp {
    pub(super) const NEG_INFINITY: Stamp = Stamp(i64::MIN);
    pub(super) const INFINITY: Stamp = Stamp(i64::MAX);

    /// Whether it is a real instant (not one of the infinities).
    pub(super) fn is_finite(self) -> bool {
        self != Stamp::NEG_INFINITY && self != Stamp::INFINITY
    }

    /// The instant, when it is finite and within chrono's range (±262,143 years).
    pub(super) fn to_chrono(self) -> Option<DateTime<Utc>> {
        if !self.is_finite() {
            return None;
        }
        self.0
            .checked_add(PG_EPOCH_MICROS)
            .and_then(DateTime::from_timestamp_micros)
    }

    /// `micros` microseconds earlier (saturating at `-infinity`; the infinities stay).
    pub(super) fn minus_micros(self, micros: i64) -> Stamp {
        if !self.is_finite() {
            return self;
        }
        Stamp(self.0.saturating_sub(micros).max(i64::MIN + 1))
    }

    /// A `timestamptz` in Postgres's text form (only met with the simple query protocol).
    fn from_pg_text(text: &str) -> Result<Stamp, String> {
        match text {
            "infinity" => Ok(Stamp::INFINITY),
            "-infinity" => Ok(Stamp::NEG_INFINITY),
            _ => DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z")
                .map(|t| Stamp(t.timestamp_micros() - PG_EPOCH_MICROS))
                .map_err(|e| format!("`{text}` cannot be read: {e}")),
        }
    }
}

/// For log lines and reasons: RFC 3339 where chrono can say it, otherwise the microseconds.
impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Stamp::NEG_INFINITY => f.write_str("-infinity"),
            Stamp::INFINITY => f.write_str("infinity"),
            _ => match self.to_chrono() {
                Some(t) => f.write_str(&t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
                None => write!(f, "{} µs from 2000-01-01", self.0),
            },
        }
    }
}

/// `timestamptz` and its array, as sqlx knows them: a type it does not know it looks up in the
/// catalog with a statement of its own, whose unqualified calls another role could overload.
impl Type<Postgres> for Stamp {
    fn type_info() -> PgTypeInfo {
        <chrono::DateTime<chrono::Utc> as Type<Postgres>>::type_info()
    }
}

impl PgHasArrayType for Stamp {
    fn array_type_info() -> PgTypeInfo {
        <chrono::DateTime<chrono::Utc> as PgHasArrayType>::array_type_info()
    }
}

impl Encode<'_, Postgres> for Stamp {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        buf.extend_from_slice(&self.0.to_be_bytes());
        Ok(IsNull::No)
    }
}

impl Decode<'_, Postgres> for Stamp {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        match value.format() {
            PgValueFormat::Binary => {
                let bytes: [u8; 8] = value.as_bytes()?.try_into().map_err(|_| {
                    format!(
                        "a timestamptz of {} bytes",
                        value.as_bytes().map_or(0, <[u8]>::len)
                    )
                })?;
                Ok(Stamp(i64::from_be_bytes(bytes)))
            }
            PgValueFormat::Text => Ok(Stamp::from_pg_text(value.as_str()?)?),
        }
    }
}

/// A row's place in the relay's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Position {
    pub(super) at: Stamp,
    pub(super) id: Uuid,
}

impl Position {
    /// At or before every row.
    pub(super) const START: Position = Position {
        at: Stamp::NEG_INFINITY,
        id: Uuid::nil(),
    };

    /// The first position of instant `at`: at or before every row of that instant.
    pub(super) fn at_start_of(at: Stamp) -> Position {
        Position {
            at,
            id: Uuid::nil(),
        }
    }

    /// The next position after this one: the first that a row after it can have.
    pub(super) fn after(self) -> Position {
        match self.id.as_u128().checked_add(1) {
            Some(next) => Position {
                at: self.at,
                id: Uuid::from_u128(next),
            },
            None if self.at == Stamp::INFINITY => self,
            None => Position::at_start_of(Stamp(self.at.0 + 1)),
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.at, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_order_as_postgres_orders_them_infinities_at_the_ends() {
        let y2k = Stamp(0);
        assert!(Stamp::NEG_INFINITY < Stamp(i64::MIN + 1));
        assert!(Stamp(-1) < y2k && y2k < Stamp(1));
        assert!(Stamp(i64::MAX - 1) < Stamp::INFINITY);
        assert!(!Stamp::INFINITY.is_finite() && !Stamp::NEG_INFINITY.is_finite());
        assert_eq!(
            y2k.to_chrono().unwrap().to_rfc3339(),
            "2000-01-01T00:00:00+00:00"
        );
    }

    #[test]
    fn instants_chrono_cannot_hold_are_still_positions() {
        // near the year 294276, Postgres's last: beyond chrono, still a stamp with an order
        let far = Stamp(i64::MAX - 1);
        assert_eq!(far.to_chrono(), None);
        assert!(far.to_string().contains("µs"), "{far}");
        assert_eq!(Stamp::INFINITY.to_string(), "infinity");
        assert_eq!(Stamp::NEG_INFINITY.minus_micros(5), Stamp::NEG_INFINITY);
        assert_eq!(Stamp(i64::MIN + 3).minus_micros(10), Stamp(i64::MIN + 1));
    }

    #[test]
    fn the_text_form_reads_back() {
        assert_eq!(Stamp::from_pg_text("infinity"), Ok(Stamp::INFINITY));
        assert_eq!(Stamp::from_pg_text("-infinity"), Ok(Stamp::NEG_INFINITY));
        assert_eq!(
            Stamp::from_pg_text("2000-01-01 00:00:01.5+00"),
            Ok(Stamp(1_500_000))
        );
        assert!(Stamp::from_pg_text("yesterday").is_err());
    }

    #[test]
    fn positions_order_by_instant_then_id_and_step_to_the_next() {
        let t = Stamp(42);
        let a = Position {
            at: t,
            id: Uuid::from_u128(1),
        };
        assert!(Position::START < a);
        assert_eq!(
            a.after(),
            Position {
                at: t,
                id: Uuid::from_u128(2)
            }
        );
        let last_of_instant = Position {
            at: t,
            id: Uuid::max(),
        };
        assert_eq!(last_of_instant.after(), Position::at_start_of(Stamp(43)));
        assert!(last_of_instant < last_of_instant.after());
        let end = Position {
            at: Stamp::INFINITY,
            id: Uuid::max(),
        };
        assert_eq!(end.after(), end, "nothing comes after the end");
    }
}
