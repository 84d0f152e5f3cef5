//! The cases of a node's own keywords: `type`, `const`, `enum`, `required`, strings and numbers.

use super::*;

/// Types narrowed, widened, changed, added.
pub(super) fn types() -> Vec<Case> {
    vec![
        case(
            "type narrowed",
            prop(json!({ "type": ["string", "integer"] })),
            prop(s()),
            "x.x xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type widened: integer to number",
            prop(i()),
            prop(json!({ "type": "number" })),
            ".xx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type changed",
            prop(s()),
            prop(i()),
            "xxx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "null allowed on a required property",
            req(s()),
            req(json!({ "type": ["string", "null"] })),
            ".xx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type added where any value was allowed",
            prop(json!({})),
            prop(s()),
            "x.x xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type the enum implies, written out",
            prop(json!({ "enum": ["a", "b"] })),
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            "... ...",
            &[],
        ),
    ]
}

/// `const` and `enum` values.
pub(super) fn consts_and_enums() -> Vec<Case> {
    vec![
        case(
            "const changed",
            prop(json!({ "const": "a" })),
            prop(json!({ "const": "b" })),
            "xxx xxx",
            &["const-changed"],
        ),
        case(
            "const added",
            prop(s()),
            prop(json!({ "type": "string", "const": "a" })),
            "x.x x.x",
            &["const-changed"],
        ),
        case(
            "const removed",
            prop(json!({ "type": "string", "const": "a" })),
            prop(s()),
            ".xx .xx",
            &["const-changed"],
        ),
        case(
            "enum value removed",
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            prop(json!({ "type": "string", "enum": ["a"] })),
            "x.x xxx",
            &["enum-value-removed", "rust-variant-removed"],
        ),
        case(
            "enum value added",
            prop(json!({ "type": "string", "enum": ["a"] })),
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            ".xx xxx",
            &["enum-value-added", "rust-variant-added"],
        ),
        case(
            "enum added",
            prop(s()),
            prop(json!({ "type": "string", "enum": ["a"] })),
            "x.x xxx",
            &["enum-added", "rust-field-type-changed"],
        ),
        case(
            "enum removed",
            prop(json!({ "type": "string", "enum": ["a"] })),
            prop(s()),
            ".xx xxx",
            &["enum-removed", "rust-field-type-changed"],
        ),
        case(
            "enum reordered",
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            prop(json!({ "type": "string", "enum": ["b", "a"] })),
            "... ...",
            &[],
        ),
    ]
}

/// `required` and `dependentRequired`.
pub(super) fn required() -> Vec<Case> {
    vec![
        case(
            "required added",
            prop(s()),
            req(s()),
            "x.x xxx",
            &["required-added", "rust-field-type-changed"],
        ),
        case(
            "required removed",
            req(s()),
            prop(s()),
            ".xx xxx",
            &["required-removed", "rust-field-type-changed"],
        ),
        case(
            "required added with a default keeps the Rust type",
            prop(json!({ "type": "string", "default": "x" })),
            req(json!({ "type": "string", "default": "x" })),
            "x.x x.x",
            &["required-added"],
        ),
        case(
            "dependentRequired added",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "dependentRequired": { "p": ["id"] } }),
            ),
            "x.x x.x",
            &["required-added"],
        ),
    ]
}

/// `pattern`, `format` and lengths.
pub(super) fn strings() -> Vec<Case> {
    vec![
        case(
            "pattern added",
            prop(s()),
            prop(json!({ "type": "string", "pattern": "^[a-z]+$" })),
            "x.x xxx",
            &["pattern-added", "rust-field-type-changed"],
        ),
        case(
            "pattern changed",
            prop(json!({ "type": "string", "pattern": "^[a-z]+$" })),
            prop(json!({ "type": "string", "pattern": "^[a-z0-9]+$" })),
            "xxx xxx",
            &["pattern-changed"],
        ),
        case(
            "pattern removed",
            prop(json!({ "type": "string", "pattern": "^[a-z]+$" })),
            prop(s()),
            ".xx xxx",
            &["pattern-removed", "rust-field-type-changed"],
        ),
        case(
            "format added",
            prop(s()),
            prop(json!({ "type": "string", "format": "uuid" })),
            "x.x xxx",
            &["format-added", "rust-field-type-changed"],
        ),
        case(
            "format changed",
            prop(json!({ "type": "string", "format": "date-time" })),
            prop(json!({ "type": "string", "format": "date" })),
            "xxx xxx",
            &["format-changed", "rust-field-type-changed"],
        ),
        case(
            "format removed",
            prop(json!({ "type": "string", "format": "uuid" })),
            prop(s()),
            ".xx xxx",
            &["format-removed", "rust-field-type-changed"],
        ),
        case(
            "maxLength lowered",
            prop(json!({ "type": "string", "maxLength": 10 })),
            prop(json!({ "type": "string", "maxLength": 5 })),
            "x.x x.x",
            &["length-tightened"],
        ),
        case(
            "minLength lowered",
            prop(json!({ "type": "string", "minLength": 3 })),
            prop(json!({ "type": "string", "minLength": 1 })),
            ".xx .xx",
            &["length-relaxed"],
        ),
        case(
            "maxLength added",
            prop(s()),
            prop(json!({ "type": "string", "maxLength": 5 })),
            "x.x xxx",
            &["length-tightened", "rust-field-type-changed"],
        ),
    ]
}

/// Numeric bounds and `multipleOf`.
pub(super) fn numbers() -> Vec<Case> {
    vec![
        case(
            "minimum raised from 0 to 1",
            prop(json!({ "type": "integer", "minimum": 0 })),
            prop(json!({ "type": "integer", "minimum": 1 })),
            "x.x xxx",
            &["numeric-bound-tightened", "rust-field-type-changed"],
        ),
        case(
            "minimum raised from 1 to 5",
            prop(json!({ "type": "integer", "minimum": 1 })),
            prop(json!({ "type": "integer", "minimum": 5 })),
            "x.x xxx",
            &["numeric-bound-tightened", "rust-field-type-changed"],
        ),
        case(
            "maximum raised",
            prop(json!({ "type": "integer", "maximum": 10 })),
            prop(json!({ "type": "integer", "maximum": 20 })),
            ".xx .xx",
            &["numeric-bound-relaxed"],
        ),
        case(
            "exclusiveMaximum added",
            prop(json!({ "type": "number" })),
            prop(json!({ "type": "number", "exclusiveMaximum": 1 })),
            "x.x x.x",
            &["numeric-bound-tightened"],
        ),
        case(
            "exclusiveMinimum to the same minimum",
            prop(json!({ "type": "number", "exclusiveMinimum": 0 })),
            prop(json!({ "type": "number", "minimum": 0 })),
            ".xx .xx",
            &["numeric-bound-relaxed"],
        ),
        case(
            "multipleOf added",
            prop(i()),
            prop(json!({ "type": "integer", "multipleOf": 5 })),
            "x.x x.x",
            &["multiple-of-tightened"],
        ),
        case(
            "multipleOf 2 to 4",
            prop(json!({ "type": "integer", "multipleOf": 2 })),
            prop(json!({ "type": "integer", "multipleOf": 4 })),
            "x.x x.x",
            &["multiple-of-tightened"],
        ),
        case(
            "multipleOf 4 to 2",
            prop(json!({ "type": "integer", "multipleOf": 4 })),
            prop(json!({ "type": "integer", "multipleOf": 2 })),
            ".xx .xx",
            &["multiple-of-relaxed"],
        ),
        case(
            "multipleOf 2 to 3",
            prop(json!({ "type": "integer", "multipleOf": 2 })),
            prop(json!({ "type": "integer", "multipleOf": 3 })),
            "xxx xxx",
            &["multiple-of-relaxed", "multiple-of-tightened"],
        ),
    ]
}
