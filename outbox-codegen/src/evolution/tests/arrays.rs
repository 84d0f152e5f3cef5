//! The cases of arrays: items, item bounds, `uniqueItems`, `contains` and tuples.

use super::*;

/// Items, item bounds, `uniqueItems` and `contains`.
pub(super) fn items() -> Vec<Case> {
    vec![
        case(
            "minItems added",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": s(), "minItems": 1 })),
            "x.x x.x",
            &["item-bound-tightened"],
        ),
        case(
            "maxItems raised",
            prop(json!({ "type": "array", "items": s(), "maxItems": 3 })),
            prop(json!({ "type": "array", "items": s(), "maxItems": 9 })),
            ".xx .xx",
            &["item-bound-relaxed"],
        ),
        case(
            "uniqueItems added",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": s(), "uniqueItems": true })),
            "x.x xxx",
            &["rust-field-type-changed", "unique-items-added"],
        ),
        case(
            "uniqueItems removed",
            prop(json!({ "type": "array", "items": s(), "uniqueItems": true })),
            prop(json!({ "type": "array", "items": s() })),
            ".xx xxx",
            &["rust-field-type-changed", "unique-items-removed"],
        ),
        case(
            "items type changed",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": i() })),
            "xxx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "nested: required added in array items",
            prop(
                json!({ "type": "array", "items": { "type": "object", "properties": { "a": s() } } }),
            ),
            prop(
                json!({ "type": "array", "items": { "type": "object", "properties": { "a": s() }, "required": ["a"] } }),
            ),
            "x.x xxx",
            &["required-added", "rust-field-type-changed"],
        ),
        wire_case(
            "contains added",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": s(), "contains": { "const": "x" } })),
            "x.x",
            &["contains-added"],
        ),
    ]
}

/// Tuples of draft-07 (array `items`, `additionalItems`).
pub(super) fn draft7_tuples() -> Vec<Case> {
    vec![
        wire_case(
            "draft-07 tuple position changed",
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s(), i()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s(), s()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            "xxx",
            &["type-changed"],
        ),
        wire_case(
            "draft-07 tuple position added",
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s(), i()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            ".xx",
            &["type-changed"],
        ),
    ]
}

#[test]
fn tuples_of_draft_2020_12() {
    let tuple =
        |items: Value| prop(json!({ "type": "array", "prefixItems": items, "items": false }));
    assert_eq!(
        wire(
            tuple(json!([{ "type": "string" }, { "type": "integer" }])),
            tuple(json!([{ "type": "string" }, { "type": "string" }]))
        ),
        [(
            "type-changed",
            "/properties/p/prefixItems/1/type".to_owned(),
            true,
            true
        )]
    );
    // A position added where no item was allowed: old consumers reject the longer arrays.
    assert_eq!(
        wire(
            tuple(json!([{ "type": "string" }])),
            tuple(json!([{ "type": "string" }, { "type": "integer" }]))
        ),
        [(
            "type-changed",
            "/properties/p/prefixItems/1".to_owned(),
            true,
            false
        )]
    );
}
