//! The cases of the content model: properties added and removed in open, closed and partially
//! open objects, `additionalProperties`, `patternProperties`, property counts and names.

use super::*;

/// Properties added to and removed from an open object.
pub(super) fn open_content_model() -> Vec<Case> {
    vec![
        case(
            "property added to an open object",
            event(json!({ "id": s() }), &["id"], json!({})),
            prop(s()),
            "x.x x.x",
            &["property-added-open"],
        ),
        case(
            "property of any value added to an open object",
            event(json!({ "id": s() }), &["id"], json!({})),
            prop(json!({})),
            "... ...",
            &[],
        ),
        case(
            "property removed from an open object",
            prop(s()),
            event(json!({ "id": s() }), &["id"], json!({})),
            ".xx xxx",
            &["property-removed-open", "rust-field-removed"],
        ),
        case(
            "nested: property added to an open inner object",
            prop(json!({ "type": "object", "properties": { "a": s() } })),
            prop(json!({ "type": "object", "properties": { "a": s(), "b": i() } })),
            "x.x x.x",
            &["property-added-open"],
        ),
    ]
}

/// Properties added to, removed from and renamed in a closed object.
pub(super) fn closed_content_model() -> Vec<Case> {
    vec![
        case(
            "property added to a closed object",
            closed(json!({ "id": s() })),
            closed(json!({ "id": s(), "p": s() })),
            ".xx .xx",
            &["property-added-closed"],
        ),
        case(
            "required property added to a closed object",
            closed(json!({ "id": s() })),
            event(
                json!({ "id": s(), "p": s() }),
                &["id", "p"],
                json!({ "additionalProperties": false }),
            ),
            "xxx xxx",
            &["property-added-closed", "required-added"],
        ),
        case(
            "property removed from a closed object",
            closed(json!({ "id": s(), "p": s() })),
            closed(json!({ "id": s() })),
            "x.x xxx",
            &["property-removed-closed", "rust-field-removed"],
        ),
        case(
            "property renamed in a closed object",
            closed(json!({ "id": s(), "a": s() })),
            closed(json!({ "id": s(), "b": s() })),
            "xxx xxx",
            &[
                "property-added-closed",
                "property-removed-closed",
                "rust-field-removed",
            ],
        ),
        case(
            "nested: property removed from a closed inner object",
            prop(
                json!({ "type": "object", "properties": { "a": s(), "b": s() }, "additionalProperties": false }),
            ),
            prop(
                json!({ "type": "object", "properties": { "a": s() }, "additionalProperties": false }),
            ),
            "x.x xxx",
            &["property-removed-closed", "rust-field-removed"],
        ),
    ]
}

/// `additionalProperties` narrowed and widened.
pub(super) fn additional_properties() -> Vec<Case> {
    vec![
        case(
            "additionalProperties narrowed: absent to false",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "additionalProperties": false }),
            ),
            "x.x x.x",
            &["additional-properties-narrowed"],
        ),
        case(
            "additionalProperties widened: false to absent",
            closed(json!({ "id": s() })),
            event(json!({ "id": s() }), &["id"], json!({})),
            ".xx .xx",
            &["additional-properties-widened"],
        ),
        case(
            "additionalProperties narrowed: any to a schema",
            event(json!({ "id": s() }), &["id"], json!({})),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "x.x x.x",
            &["additional-properties-narrowed"],
        ),
        case(
            "additionalProperties schema widened",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": { "type": ["string", "integer"] } }),
            ),
            ".xx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
    ]
}

/// Properties added under `additionalProperties` or `patternProperties`.
pub(super) fn added_partially_open() -> Vec<Case> {
    vec![
        case(
            "property added under additionalProperties, same schema",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "... ...",
            &[],
        ),
        case(
            "property added under additionalProperties, other type",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s(), "p": i() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "xxx xxx",
            &["property-added-partial"],
        ),
        case(
            "property added under patternProperties, narrower",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s(), "x_a": { "type": "string", "maxLength": 3 } }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            "x.x x.x",
            &["property-added-partial"],
        ),
        case(
            "property added not matching patternProperties of a closed object",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s(), "y": i() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            ".xx .xx",
            &["property-added-closed"],
        ),
    ]
}

/// Properties removed under `additionalProperties` or `patternProperties`.
pub(super) fn removed_partially_open() -> Vec<Case> {
    vec![
        case(
            "property removed under patternProperties, wider",
            event(
                json!({ "id": s(), "x_a": { "type": "string", "maxLength": 3 } }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            ".xx xxx",
            &["property-removed-partial", "rust-field-removed"],
        ),
        case(
            "property removed under additionalProperties, same schema",
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "... xxx",
            &["rust-field-removed"],
        ),
    ]
}

/// `patternProperties` added, removed and narrowed.
pub(super) fn pattern_properties() -> Vec<Case> {
    vec![
        case(
            "patternProperties added to a closed object",
            closed(json!({ "id": s() })),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            ".xx .xx",
            &["pattern-property-added"],
        ),
        case(
            "patternProperties removed from a closed object",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            closed(json!({ "id": s() })),
            "x.x x.x",
            &["pattern-property-removed"],
        ),
        case(
            "patternProperties schema narrowed",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "patternProperties": { "^x_": { "type": "string", "maxLength": 3 } } }),
            ),
            "x.x x.x",
            &["length-tightened"],
        ),
    ]
}

/// `minProperties`, `maxProperties` and `propertyNames`.
pub(super) fn property_counts_and_names() -> Vec<Case> {
    vec![
        case(
            "minProperties added",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "minProperties": 2 }),
            ),
            "x.x x.x",
            &["property-count-tightened"],
        ),
        case(
            "maxProperties raised",
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "maxProperties": 2 }),
            ),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "maxProperties": 5 }),
            ),
            ".xx .xx",
            &["property-count-relaxed"],
        ),
        case(
            "propertyNames pattern added",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "propertyNames": { "pattern": "^[a-z]+$" } }),
            ),
            "x.x x.x",
            &["pattern-added"],
        ),
    ]
}
