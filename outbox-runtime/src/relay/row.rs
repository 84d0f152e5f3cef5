//! A claimed row as the relay reads it, and the `tid` codec of its physical address.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{
    PgArgumentBuffer, PgHasArrayType, PgRow, PgTypeInfo, PgValueFormat, PgValueRef,
};
use sqlx::Postgres;
use uuid::Uuid;

/// One claimed row, in [`CLAIM`](super::sql::CLAIM)'s column order.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) id: Uuid,
    pub(super) event_type: String,
    pub(super) source: String,
    pub(super) subject: String,
    pub(super) time: DateTime<Utc>,
    /// Passed through as Postgres rendered it: never parsed, only copied into the envelope.
    pub(super) data: sqlx::types::Json<Box<RawValue>>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) attempts: i32,
    /// Where the row is, for the marks (stable while the claim holds the row's lock).
    pub(super) ctid: Tid,
}

/// Decoded by position: a claim decodes thousands of rows a second, and by name each column
/// would cost a lookup.
impl sqlx::FromRow<'_, PgRow> for Row {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        use sqlx::Row as _;
        Ok(Row {
            id: row.try_get(0)?,
            event_type: row.try_get(1)?,
            source: row.try_get(2)?,
            subject: row.try_get(3)?,
            time: row.try_get(4)?,
            data: row.try_get(5)?,
            created_at: row.try_get(6)?,
            attempts: row.try_get(7)?,
            ctid: row.try_get(8)?,
        })
    }
}

/// A row's physical address (`ctid`: block number and line pointer), exchanged in Postgres's
/// binary form, so that neither side formats or parses it as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tid {
    block: u32,
    line: u16,
}

impl Tid {
    /// The binary form: the block number and the line pointer, big-endian.
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

    /// The text form, `(block,line)`.
    fn from_text(text: &str) -> Result<Tid, BoxDynError> {
        let (block, line) = text
            .strip_prefix('(')
            .and_then(|t| t.strip_suffix(')'))
            .and_then(|t| t.split_once(','))
            .ok_or_else(|| format!("`{text}` is not a tid"))?;
        Ok(Tid {
            block: block.parse()?,
            line: line.parse()?,
        })
    }
}

/// `tid` and `tid[]`: built-in types with fixed OIDs.
impl sqlx::Type<Postgres> for Tid {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(27))
    }
}

impl PgHasArrayType for Tid {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(1010))
    }
}

impl sqlx::Decode<'_, Postgres> for Tid {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        match value.format() {
            PgValueFormat::Binary => Tid::from_binary(value.as_bytes()?),
            PgValueFormat::Text => Tid::from_text(value.as_str()?),
        }
    }
}

impl sqlx::Encode<'_, Postgres> for Tid {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        buf.extend_from_slice(&self.to_binary());
        Ok(IsNull::No)
    }
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
    fn a_tid_reads_its_text_form() {
        assert_eq!(
            Tid::from_text("(12,3)").unwrap(),
            Tid { block: 12, line: 3 }
        );
        assert_eq!(
            Tid::from_text("(4294967295,65535)").unwrap(),
            Tid {
                block: u32::MAX,
                line: u16::MAX
            }
        );
    }

    #[test]
    fn a_malformed_tid_is_an_error_not_a_panic() {
        assert!(Tid::from_binary(&[0, 1, 2])
            .unwrap_err()
            .to_string()
            .contains("6 bytes, not 3"));
        for text in ["", "12,3", "(12;3)", "(x,3)", "(1,70000)", "(-1,2)"] {
            assert!(Tid::from_text(text).is_err(), "{text}");
        }
    }
}
