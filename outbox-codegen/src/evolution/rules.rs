//! The rules of the gate: one id per kind of change, its level, and which consumers it breaks
//! when it applies. `docs/schema-evolution.md` has the same table with an example per rule (a
//! test checks every id is there).

use std::fmt;

/// The level of a rule, like buf's categories: `wire` rules protect consumers of the JSON,
/// whatever their language; `rust` rules protect Rust code generated from the schema.
///
/// [`Level::Rust`] checks both levels; [`Level::Wire`] only the wire rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Level {
    /// Can an old consumer read a new event, can a new consumer read an old one.
    Wire,
    /// Also: does Rust code written against the released generated types still compile and
    /// mean the same (type names, fields, field types, enum variants, the subject property).
    #[default]
    Rust,
}

impl Level {
    /// `wire` or `rust`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Wire => "wire",
            Level::Rust => "rust",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wire" => Ok(Level::Wire),
            "rust" => Ok(Level::Rust),
            _ => Err(format!(
                "unknown compatibility level `{s}`; use `wire` or `rust`"
            )),
        }
    }
}

macro_rules! rules {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $level:ident, $whom:literal; )*) => {
        /// The kind of a change between a released schema and the current one.
        ///
        /// Each rule has a stable id (used in messages and in `docs/schema-evolution.md`) and a
        /// level. Whether a change breaks old consumers, new consumers or both is decided per
        /// change ([`Breaks`](super::Breaks)); the rule's documentation says what it usually is.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum Rule {
            $( $(#[$doc])* $variant, )*
        }

        impl Rule {
            /// Every rule, in the order of the documentation's table.
            pub const ALL: &'static [Rule] = &[$(Rule::$variant),*];

            /// The rule's id, like `required-added`.
            pub fn id(self) -> &'static str {
                match self { $(Rule::$variant => $id,)* }
            }

            /// The rule's level.
            pub fn level(self) -> Level {
                match self { $(Rule::$variant => Level::$level,)* }
            }

            /// Whom a change of this kind usually breaks, in the words of the documentation.
            pub fn usually_breaks(self) -> &'static str {
                match self { $(Rule::$variant => $whom,)* }
            }
        }
    };
}

rules! {
    /// `type` narrowed (a type no longer allowed) or widened (a type added); both when changed.
    TypeChanged = "type-changed", Wire, "narrowed: new consumers; widened: old consumers";
    /// `const` added, changed or removed.
    ConstChanged = "const-changed", Wire, "added: new consumers; removed: old consumers; changed: both";
    /// An `enum` value removed.
    EnumValueRemoved = "enum-value-removed", Wire, "new consumers";
    /// An `enum` value added.
    EnumValueAdded = "enum-value-added", Wire, "old consumers";
    /// An `enum` where there was none.
    EnumAdded = "enum-added", Wire, "new consumers";
    /// The `enum` removed.
    EnumRemoved = "enum-removed", Wire, "old consumers";
    /// A property became required (also `dependentRequired`).
    RequiredAdded = "required-added", Wire, "new consumers";
    /// A property is no longer required.
    RequiredRemoved = "required-removed", Wire, "old consumers";
    /// A property declared where the object allowed any other property (open content model).
    PropertyAddedOpen = "property-added-open", Wire, "new consumers";
    /// A property declared where the object allowed no other property (closed content model).
    PropertyAddedClosed = "property-added-closed", Wire, "old consumers";
    /// A property declared where `additionalProperties` or `patternProperties` gave its name a
    /// schema (partially open content model): compared with that schema.
    PropertyAddedPartial = "property-added-partial", Wire, "as the two schemas differ";
    /// A property no longer declared in an open content model.
    PropertyRemovedOpen = "property-removed-open", Wire, "old consumers";
    /// A property no longer declared in a closed content model.
    PropertyRemovedClosed = "property-removed-closed", Wire, "new consumers";
    /// A property no longer declared where `additionalProperties` or `patternProperties` now
    /// give its name a schema: compared with that schema.
    PropertyRemovedPartial = "property-removed-partial", Wire, "as the two schemas differ";
    /// `additionalProperties` narrowed (for example from absent to `false`).
    AdditionalPropertiesNarrowed = "additional-properties-narrowed", Wire, "new consumers";
    /// `additionalProperties` widened (for example from `false` to absent).
    AdditionalPropertiesWidened = "additional-properties-widened", Wire, "old consumers";
    /// A `patternProperties` entry added: names it matches were governed by
    /// `additionalProperties`.
    PatternPropertyAdded = "pattern-property-added", Wire, "as the two schemas differ";
    /// A `patternProperties` entry removed: names it matched fall to `additionalProperties`.
    PatternPropertyRemoved = "pattern-property-removed", Wire, "as the two schemas differ";
    /// `minProperties` raised or `maxProperties` lowered.
    PropertyCountTightened = "property-count-tightened", Wire, "new consumers";
    /// `minProperties` lowered or `maxProperties` raised.
    PropertyCountRelaxed = "property-count-relaxed", Wire, "old consumers";
    /// A `pattern` where there was none.
    PatternAdded = "pattern-added", Wire, "new consumers";
    /// The `pattern` changed (regular expressions are not compared: both directions).
    PatternChanged = "pattern-changed", Wire, "old and new consumers";
    /// The `pattern` removed.
    PatternRemoved = "pattern-removed", Wire, "old consumers";
    /// A `format` where there was none.
    FormatAdded = "format-added", Wire, "new consumers";
    /// The `format` changed.
    FormatChanged = "format-changed", Wire, "old and new consumers";
    /// The `format` removed.
    FormatRemoved = "format-removed", Wire, "old consumers";
    /// `minLength` raised or `maxLength` lowered (or added).
    LengthTightened = "length-tightened", Wire, "new consumers";
    /// `minLength` lowered or `maxLength` raised (or removed).
    LengthRelaxed = "length-relaxed", Wire, "old consumers";
    /// `minimum`/`exclusiveMinimum` raised or `maximum`/`exclusiveMaximum` lowered (or added).
    NumericBoundTightened = "numeric-bound-tightened", Wire, "new consumers";
    /// `minimum`/`exclusiveMinimum` lowered or `maximum`/`exclusiveMaximum` raised (or
    /// removed).
    NumericBoundRelaxed = "numeric-bound-relaxed", Wire, "old consumers";
    /// `multipleOf` added, or changed to a value the old one is not a multiple of.
    MultipleOfTightened = "multiple-of-tightened", Wire, "new consumers";
    /// `multipleOf` removed, or changed to a value that is not a multiple of the old one.
    MultipleOfRelaxed = "multiple-of-relaxed", Wire, "old consumers";
    /// `minItems`/`minContains` raised or `maxItems`/`maxContains` lowered (or added).
    ItemBoundTightened = "item-bound-tightened", Wire, "new consumers";
    /// `minItems`/`minContains` lowered or `maxItems`/`maxContains` raised (or removed).
    ItemBoundRelaxed = "item-bound-relaxed", Wire, "old consumers";
    /// `uniqueItems: true` where items could repeat.
    UniqueItemsAdded = "unique-items-added", Wire, "new consumers";
    /// `uniqueItems: true` removed.
    UniqueItemsRemoved = "unique-items-removed", Wire, "old consumers";
    /// A `contains` where there was none.
    ContainsAdded = "contains-added", Wire, "new consumers";
    /// The `contains` removed.
    ContainsRemoved = "contains-removed", Wire, "old consumers";
    /// An `allOf` branch added (one more schema every value must match).
    AllOfBranchAdded = "allof-branch-added", Wire, "new consumers";
    /// An `allOf` branch removed.
    AllOfBranchRemoved = "allof-branch-removed", Wire, "old consumers";
    /// An `anyOf` branch added that no old branch covers.
    AnyOfBranchAdded = "anyof-branch-added", Wire, "old consumers";
    /// An `anyOf` branch removed that no new branch covers.
    AnyOfBranchRemoved = "anyof-branch-removed", Wire, "new consumers";
    /// A `oneOf` branch added that no old branch covers; also new consumers when it may overlap
    /// another branch (a value matching two branches fails `oneOf`).
    OneOfBranchAdded = "oneof-branch-added", Wire, "old consumers (and new ones when branches overlap)";
    /// A `oneOf` branch removed that no new branch covers; also old consumers when it may
    /// have overlapped another branch (a value matching both, rejected before, now passes).
    OneOfBranchRemoved = "oneof-branch-removed", Wire, "new consumers (and old ones when branches overlapped)";
    /// `anyOf` became `oneOf` (narrower: overlapping values fail) or the other way round.
    CombinatorChanged = "combinator-changed", Wire, "anyOf to oneOf: new consumers; oneOf to anyOf: old consumers";
    /// A `not` added.
    NotAdded = "not-added", Wire, "new consumers";
    /// The `not` removed.
    NotRemoved = "not-removed", Wire, "old consumers";
    /// The schema under `not` changed: its narrowing widens the schema, and the other way round.
    NotChanged = "not-changed", Wire, "the reverse of the change under `not`";
    /// A keyword the check does not understand changed (or is new, or is gone).
    UnknownKeyword = "unknown-keyword", Wire, "treated as breaking both";
    /// A released event type has no schema any more.
    EventTypeRemoved = "event-type-removed", Wire, "old and new consumers";
    /// Documentation only (`title` of an inner schema, `description`, `examples`, `default`,
    /// `$comment`, ...): never breaking on the wire.
    AnnotationChanged = "annotation-changed", Wire, "nobody";
    /// A generated Rust type has another name (the event's `title`, a definition's name, an
    /// inner `title`, or a property whose inline type is named after it).
    RustTypeRenamed = "rust-type-renamed", Rust, "Rust code";
    /// A generated Rust type is gone (a definition removed).
    RustTypeRemoved = "rust-type-removed", Rust, "Rust code";
    /// A generated Rust type is of another kind (struct, enum, newtype).
    RustTypeChanged = "rust-type-changed", Rust, "Rust code";
    /// A struct field is gone (the property removed or renamed).
    RustFieldRemoved = "rust-field-removed", Rust, "Rust code";
    /// A struct field, newtype or variant holds another Rust type (for example `String` to
    /// `uuid::Uuid`, `T` to `Option<T>`, `u64` to `NonZeroU64`).
    RustFieldTypeChanged = "rust-field-type-changed", Rust, "Rust code";
    /// An enum variant is gone.
    RustVariantRemoved = "rust-variant-removed", Rust, "Rust code";
    /// An enum gained a variant: an exhaustive `match` no longer compiles.
    RustVariantAdded = "rust-variant-added", Rust, "Rust code";
    /// `x-outbox-subject` names another property, or none: the event's `SUBJECT_PROPERTY` and
    /// the envelope's `subject` change meaning.
    RustSubjectChanged = "rust-subject-changed", Rust, "Rust code";
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_kebab_case_and_prefixed_by_level() {
        let mut seen = HashSet::new();
        for rule in Rule::ALL {
            let id = rule.id();
            assert!(seen.insert(id), "{id} twice");
            assert!(
                id.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
                "{id}"
            );
            assert_eq!(id.starts_with("rust-"), rule.level() == Level::Rust, "{id}");
        }
    }

    #[test]
    fn levels_parse() {
        assert_eq!("wire".parse::<Level>(), Ok(Level::Wire));
        assert_eq!("rust".parse::<Level>(), Ok(Level::Rust));
        assert!("all"
            .parse::<Level>()
            .unwrap_err()
            .contains("`wire` or `rust`"));
        assert_eq!(Level::default(), Level::Rust);
    }
}
