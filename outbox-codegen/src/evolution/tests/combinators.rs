//! The cases of combinators: `anyOf`, `oneOf`, `allOf` and `not`.

use super::*;

/// `anyOf` branches added, removed, reordered and narrowed.
pub(super) fn any_of() -> Vec<Case> {
    vec![
        case(
            "anyOf branch added",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [s(), i(), { "type": "boolean" }] })),
            ".xx xxx",
            &["anyof-branch-added", "rust-variant-added"],
        ),
        case(
            "anyOf branch removed",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [s()] })),
            "x.x xxx",
            &["anyof-branch-removed", "rust-field-type-changed"],
        ),
        case(
            "anyOf branches reordered",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [i(), s()] })),
            "... ...",
            &[],
        ),
        case(
            "type made nullable through anyOf",
            req(json!({ "type": "string", "maxLength": 5 })),
            req(json!({ "anyOf": [{ "type": "string", "maxLength": 5 }, { "type": "null" }] })),
            ".xx xxx",
            &["anyof-branch-added", "rust-field-type-changed"],
        ),
        case(
            "anyOf branch narrowed",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [{ "type": "string", "maxLength": 3 }, i()] })),
            "x.x xxx",
            &["length-tightened", "rust-field-type-changed"],
        ),
    ]
}

/// `oneOf` branches added (disjoint or overlapping) and removed; `anyOf` became `oneOf`.
pub(super) fn one_of() -> Vec<Case> {
    vec![
        case(
            "oneOf branch added, disjoint type",
            prop(json!({ "oneOf": [s(), i()] })),
            prop(json!({ "oneOf": [s(), i(), { "type": "boolean" }] })),
            ".xx xxx",
            &["oneof-branch-added", "rust-variant-added"],
        ),
        case(
            "oneOf branch added, may overlap",
            prop(json!({ "oneOf": [{ "type": "object", "properties": { "a": s() } }] })),
            prop(
                json!({ "oneOf": [{ "type": "object", "properties": { "a": s() } }, { "type": "object", "properties": { "b": s() } }] }),
            ),
            "xxx xxx",
            &["oneof-branch-added", "rust-type-changed"],
        ),
        case(
            "oneOf branch added, told apart by a discriminator",
            prop(
                json!({ "oneOf": [{ "type": "object", "required": ["kind"], "properties": { "kind": { "const": "a" } } }] }),
            ),
            prop(
                json!({ "oneOf": [{ "type": "object", "required": ["kind"], "properties": { "kind": { "const": "a" } } }, { "type": "object", "required": ["kind"], "properties": { "kind": { "const": "b" } } }] }),
            ),
            ".xx xxx",
            &[
                "oneof-branch-added",
                "rust-variant-added",
                "rust-variant-removed",
            ],
        ),
        case(
            "oneOf branch removed",
            prop(json!({ "oneOf": [s(), i()] })),
            prop(json!({ "oneOf": [s()] })),
            "x.x xxx",
            &["oneof-branch-removed", "rust-field-type-changed"],
        ),
        case(
            "anyOf became oneOf",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "oneOf": [s(), i()] })),
            "x.x x.x",
            &["combinator-changed"],
        ),
    ]
}

/// `allOf` branches added and removed; `not` added and widened.
pub(super) fn all_of_and_not() -> Vec<Case> {
    vec![
        case(
            "allOf branch added",
            prop(json!({ "allOf": [s()] })),
            prop(json!({ "allOf": [s(), { "maxLength": 3 }] })),
            "x.x xxx",
            &["allof-branch-added", "rust-field-type-changed"],
        ),
        case(
            "allOf branch removed",
            prop(json!({ "allOf": [s(), { "maxLength": 3 }] })),
            prop(json!({ "allOf": [s()] })),
            ".xx xxx",
            &["allof-branch-removed", "rust-field-type-changed"],
        ),
        wire_case(
            "not added",
            prop(s()),
            prop(json!({ "type": "string", "not": { "const": "x" } })),
            "x.x",
            &["not-added"],
        ),
        wire_case(
            "not schema widened",
            prop(json!({ "not": s() })),
            prop(json!({ "not": { "type": ["string", "integer"] } })),
            "x.x",
            &["not-changed"],
        ),
    ]
}
