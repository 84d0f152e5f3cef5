//! What `json-schema-diff`'s changes mean here: each mirrored (the same change seen from the
//! other side) and described by the gate's [`Rule`], keyword and words.

use json_schema_diff::{ChangeKind, JsonSchemaType, Range};

use super::{number_text, short};
use crate::evolution::rules::Rule;
use crate::evolution::Breaks;

/// The same change seen from the other side: what `diff(new, old)` reports for a change that
/// `diff(old, new)` reports as `kind`.
pub(super) fn mirror(kind: &ChangeKind) -> ChangeKind {
    use ChangeKind as K;
    let mirrored = match kind {
        K::TypeAdd { .. }
        | K::TypeRemove { .. }
        | K::ConstAdd { .. }
        | K::ConstRemove { .. }
        | K::PropertyAdd { .. }
        | K::PropertyRemove { .. }
        | K::TupleToArray { .. }
        | K::ArrayToTuple { .. }
        | K::TupleChange { .. }
        | K::RequiredRemove { .. }
        | K::RequiredAdd { .. }
        | K::EnumAdd { .. }
        | K::EnumRemove { .. } => mirror_shape(kind),
        K::RangeAdd { .. }
        | K::RangeRemove { .. }
        | K::RangeChange { .. }
        | K::FormatAdd { .. }
        | K::FormatRemove { .. }
        | K::FormatChange { .. }
        | K::PatternAdd { .. }
        | K::PatternRemove { .. }
        | K::PatternChange { .. }
        | K::MinLengthAdd { .. }
        | K::MinLengthRemove { .. }
        | K::MinLengthChange { .. }
        | K::MaxLengthAdd { .. }
        | K::MaxLengthRemove { .. }
        | K::MaxLengthChange { .. } => mirror_constraint(kind),
    };
    mirrored.expect("each kind is mirrored by its family")
}

/// [`mirror`] of a change of types, `const`, `enum`, `required`, properties or tuples.
fn mirror_shape(kind: &ChangeKind) -> Option<ChangeKind> {
    use ChangeKind as K;
    Some(match kind {
        K::TypeAdd { added } => K::TypeRemove {
            removed: added.clone(),
        },
        K::TypeRemove { removed } => K::TypeAdd {
            added: removed.clone(),
        },
        K::ConstAdd { added } => K::ConstRemove {
            removed: added.clone(),
        },
        K::ConstRemove { removed } => K::ConstAdd {
            added: removed.clone(),
        },
        K::PropertyAdd {
            lhs_additional_properties,
            added,
        } => K::PropertyRemove {
            lhs_additional_properties: *lhs_additional_properties,
            removed: added.clone(),
        },
        K::PropertyRemove {
            lhs_additional_properties,
            removed,
        } => K::PropertyAdd {
            lhs_additional_properties: *lhs_additional_properties,
            added: removed.clone(),
        },
        K::TupleToArray { old_length } => K::ArrayToTuple {
            new_length: *old_length,
        },
        K::ArrayToTuple { new_length } => K::TupleToArray {
            old_length: *new_length,
        },
        K::TupleChange { new_length } => K::TupleChange {
            new_length: *new_length,
        },
        K::RequiredRemove { property } => K::RequiredAdd {
            property: property.clone(),
        },
        K::RequiredAdd { property } => K::RequiredRemove {
            property: property.clone(),
        },
        K::EnumAdd {
            added,
            lhs_has_no_enum,
        } => K::EnumRemove {
            removed: added.clone(),
            rhs_has_no_enum: *lhs_has_no_enum,
        },
        K::EnumRemove {
            removed,
            rhs_has_no_enum,
        } => K::EnumAdd {
            added: removed.clone(),
            lhs_has_no_enum: *rhs_has_no_enum,
        },
        _ => return None,
    })
}

/// [`mirror`] of a change of a range, a format, a pattern or a length.
fn mirror_constraint(kind: &ChangeKind) -> Option<ChangeKind> {
    use ChangeKind as K;
    Some(match kind {
        K::RangeAdd { added } => K::RangeRemove {
            removed: added.clone(),
        },
        K::RangeRemove { removed } => K::RangeAdd {
            added: removed.clone(),
        },
        K::RangeChange {
            old_value,
            new_value,
        } => K::RangeChange {
            old_value: new_value.clone(),
            new_value: old_value.clone(),
        },
        K::FormatAdd { added } => K::FormatRemove {
            removed: added.clone(),
        },
        K::FormatRemove { removed } => K::FormatAdd {
            added: removed.clone(),
        },
        K::FormatChange {
            old_format,
            new_format,
        } => K::FormatChange {
            old_format: new_format.clone(),
            new_format: old_format.clone(),
        },
        K::PatternAdd { added } => K::PatternRemove {
            removed: added.clone(),
        },
        K::PatternRemove { removed } => K::PatternAdd {
            added: removed.clone(),
        },
        K::PatternChange {
            old_pattern,
            new_pattern,
        } => K::PatternChange {
            old_pattern: new_pattern.clone(),
            new_pattern: old_pattern.clone(),
        },
        K::MinLengthAdd { added } => K::MinLengthRemove { removed: *added },
        K::MinLengthRemove { removed } => K::MinLengthAdd { added: *removed },
        K::MinLengthChange {
            old_value,
            new_value,
        } => K::MinLengthChange {
            old_value: *new_value,
            new_value: *old_value,
        },
        K::MaxLengthAdd { added } => K::MaxLengthRemove { removed: *added },
        K::MaxLengthRemove { removed } => K::MaxLengthAdd { added: *removed },
        K::MaxLengthChange {
            old_value,
            new_value,
        } => K::MaxLengthChange {
            old_value: *new_value,
            new_value: *old_value,
        },
        _ => return None,
    })
}

/// The rule, keyword and words of a change (in old-to-new terms); `None` for the kinds a cut
/// down node cannot produce (properties and tuples are the walker's).
pub(super) fn describe(kind: &ChangeKind, breaks: Breaks) -> Option<(Rule, &'static str, String)> {
    use ChangeKind as K;
    let tightened = breaks.new_consumers;
    match kind {
        K::TypeAdd { .. }
        | K::TypeRemove { .. }
        | K::ConstAdd { .. }
        | K::ConstRemove { .. }
        | K::EnumAdd { .. }
        | K::EnumRemove { .. }
        | K::RequiredAdd { .. }
        | K::RequiredRemove { .. } => describe_value(kind),
        K::FormatAdd { .. }
        | K::FormatRemove { .. }
        | K::FormatChange { .. }
        | K::PatternAdd { .. }
        | K::PatternRemove { .. }
        | K::PatternChange { .. } => describe_string(kind),
        K::MinLengthAdd { .. }
        | K::MinLengthRemove { .. }
        | K::MinLengthChange { .. }
        | K::MaxLengthAdd { .. }
        | K::MaxLengthRemove { .. }
        | K::MaxLengthChange { .. }
        | K::RangeAdd { .. }
        | K::RangeRemove { .. }
        | K::RangeChange { .. } => describe_bound(kind, tightened),
        K::PropertyAdd { .. }
        | K::PropertyRemove { .. }
        | K::TupleToArray { .. }
        | K::ArrayToTuple { .. }
        | K::TupleChange { .. } => None,
    }
}

/// [`describe`] for types, `const`, `enum` and `required`.
fn describe_value(kind: &ChangeKind) -> Option<(Rule, &'static str, String)> {
    use ChangeKind as K;
    Some(match kind {
        K::TypeAdd { added } => (
            Rule::TypeChanged,
            "type",
            format!("type `{}` now allowed", type_text(added)),
        ),
        K::TypeRemove { removed } => (
            Rule::TypeChanged,
            "type",
            format!("type `{}` no longer allowed", type_text(removed)),
        ),
        K::ConstAdd { added } => (
            Rule::ConstChanged,
            "const",
            format!("`const` {} now allowed", short(added)),
        ),
        K::ConstRemove { removed } => (
            Rule::ConstChanged,
            "const",
            format!("`const` {} no longer allowed", short(removed)),
        ),
        K::EnumAdd {
            added,
            lhs_has_no_enum: false,
        } => (
            Rule::EnumValueAdded,
            "enum",
            format!("value {} added", short(added)),
        ),
        K::EnumAdd {
            added,
            lhs_has_no_enum: true,
        } => (
            Rule::EnumAdded,
            "enum",
            format!(
                "an `enum` now restricts the values (to {} ...)",
                short(added)
            ),
        ),
        K::EnumRemove {
            removed,
            rhs_has_no_enum: false,
        } => (
            Rule::EnumValueRemoved,
            "enum",
            format!("value {} removed", short(removed)),
        ),
        K::EnumRemove {
            removed,
            rhs_has_no_enum: true,
        } => (
            Rule::EnumRemoved,
            "enum",
            format!(
                "the `enum` no longer restricts the values (it had {} ...)",
                short(removed)
            ),
        ),
        K::RequiredAdd { property } => (
            Rule::RequiredAdded,
            "required",
            format!("`{property}` became required"),
        ),
        K::RequiredRemove { property } => (
            Rule::RequiredRemoved,
            "required",
            format!("`{property}` is no longer required"),
        ),
        _ => return None,
    })
}

/// [`describe`] for formats and patterns.
fn describe_string(kind: &ChangeKind) -> Option<(Rule, &'static str, String)> {
    use ChangeKind as K;
    Some(match kind {
        K::FormatAdd { added } => (
            Rule::FormatAdded,
            "format",
            format!("format `{added}` added"),
        ),
        K::FormatRemove { removed } => (
            Rule::FormatRemoved,
            "format",
            format!("format `{removed}` removed"),
        ),
        K::FormatChange {
            old_format,
            new_format,
        } => (
            Rule::FormatChanged,
            "format",
            format!("format `{old_format}` became `{new_format}`"),
        ),
        K::PatternAdd { added } => (
            Rule::PatternAdded,
            "pattern",
            format!("pattern `{added}` added"),
        ),
        K::PatternRemove { removed } => (
            Rule::PatternRemoved,
            "pattern",
            format!("pattern `{removed}` removed"),
        ),
        K::PatternChange {
            old_pattern,
            new_pattern,
        } => (
            Rule::PatternChanged,
            "pattern",
            format!("pattern `{old_pattern}` became `{new_pattern}`"),
        ),
        _ => return None,
    })
}

/// [`describe`] for lengths and numeric ranges: tightened or relaxed as `tightened` says.
fn describe_bound(kind: &ChangeKind, tightened: bool) -> Option<(Rule, &'static str, String)> {
    use ChangeKind as K;
    Some(match kind {
        K::MinLengthAdd { added } => {
            length(tightened, "minLength", format!("minLength {added} added"))
        }
        K::MinLengthRemove { removed } => length(
            tightened,
            "minLength",
            format!("minLength {removed} removed"),
        ),
        K::MinLengthChange {
            old_value,
            new_value,
        } => length(
            tightened,
            "minLength",
            format!("minLength {old_value} became {new_value}"),
        ),
        K::MaxLengthAdd { added } => {
            length(tightened, "maxLength", format!("maxLength {added} added"))
        }
        K::MaxLengthRemove { removed } => length(
            tightened,
            "maxLength",
            format!("maxLength {removed} removed"),
        ),
        K::MaxLengthChange {
            old_value,
            new_value,
        } => length(
            tightened,
            "maxLength",
            format!("maxLength {old_value} became {new_value}"),
        ),
        K::RangeAdd { added } => range(tightened, added, format!("{} added", range_text(added))),
        K::RangeRemove { removed } => range(
            tightened,
            removed,
            format!("{} removed", range_text(removed)),
        ),
        K::RangeChange {
            old_value,
            new_value,
        } => range(
            tightened,
            new_value,
            format!("{} became {}", range_text(old_value), range_text(new_value)),
        ),
        _ => return None,
    })
}
fn length(tightened: bool, keyword: &'static str, message: String) -> (Rule, &'static str, String) {
    let rule = if tightened {
        Rule::LengthTightened
    } else {
        Rule::LengthRelaxed
    };
    (rule, keyword, message)
}

fn range(tightened: bool, bound: &Range, message: String) -> (Rule, &'static str, String) {
    let rule = if tightened {
        Rule::NumericBoundTightened
    } else {
        Rule::NumericBoundRelaxed
    };
    let keyword = match bound {
        Range::Minimum(_) => "minimum",
        Range::Maximum(_) => "maximum",
        Range::ExclusiveMinimum(_) => "exclusiveMinimum",
        Range::ExclusiveMaximum(_) => "exclusiveMaximum",
    };
    (rule, keyword, message)
}

fn range_text(bound: &Range) -> String {
    let (name, value) = match bound {
        Range::Minimum(v) => ("minimum", v),
        Range::Maximum(v) => ("maximum", v),
        Range::ExclusiveMinimum(v) => ("exclusiveMinimum", v),
        Range::ExclusiveMaximum(v) => ("exclusiveMaximum", v),
    };
    format!("{name} {}", number_text(*value))
}

fn type_text(t: &JsonSchemaType) -> &'static str {
    match t {
        JsonSchemaType::String => "string",
        JsonSchemaType::Number => "number",
        JsonSchemaType::Integer => "integer",
        JsonSchemaType::Object => "object",
        JsonSchemaType::Array => "array",
        JsonSchemaType::Boolean => "boolean",
        JsonSchemaType::Null => "null",
    }
}
