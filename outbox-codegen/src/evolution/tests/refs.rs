//! The cases of `$ref`: targets changed, replaced and introduced, keywords beside a reference,
//! recursive and unused definitions.

use super::*;

/// A target changed, a reference retargeted, an inline schema moved into a definition.
pub(super) fn targets() -> Vec<Case> {
    vec![
        case(
            "$ref target gained an enum value",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Plan" } }),
                json!({ "Plan": { "type": "string", "enum": ["free", "pro"] } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Plan" } }),
                json!({ "Plan": { "type": "string", "enum": ["free", "pro", "team"] } }),
            ),
            ".xx xxx",
            &["enum-value-added", "rust-variant-added"],
        ),
        case(
            "$ref retargeted to an equal definition",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/A" } }),
                json!({ "A": { "type": "string", "enum": ["x"] } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/B" } }),
                json!({ "B": { "type": "string", "enum": ["x"] } }),
            ),
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "$ref retargeted to a narrower definition",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Wide" } }),
                json!({ "Wide": { "type": "integer", "minimum": 0 }, "Narrow": { "type": "integer", "minimum": 0, "maximum": 9 } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Narrow" } }),
                json!({ "Wide": { "type": "integer", "minimum": 0 }, "Narrow": { "type": "integer", "minimum": 0, "maximum": 9 } }),
            ),
            "x.x xxx",
            &[
                "numeric-bound-tightened",
                "rust-field-type-changed",
                "rust-type-renamed",
            ],
        ),
        case(
            "inline schema moved into a definition",
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Choice" } }),
                json!({ "Choice": { "type": "string", "enum": ["a", "b"] } }),
            ),
            "... xxx",
            &["rust-type-renamed"],
        ),
    ]
}

/// Keywords beside a `$ref`, a recursive definition, a definition nobody uses.
pub(super) fn siblings_and_definitions() -> Vec<Case> {
    vec![
        case(
            "keyword beside $ref added",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Count" } }),
                json!({ "Count": { "type": "integer" } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Count", "maximum": 9 } }),
                json!({ "Count": { "type": "integer" } }),
            ),
            "x.x xxx",
            &["numeric-bound-tightened", "rust-field-type-changed"],
        ),
        case(
            "recursive definition gains a required property",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Node" } }),
                json!({ "Node": { "type": "object", "properties": { "name": s(), "children": { "type": "array", "items": { "$ref": "#/$defs/Node" } } } } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Node" } }),
                json!({ "Node": { "type": "object", "required": ["name"], "properties": { "name": s(), "children": { "type": "array", "items": { "$ref": "#/$defs/Node" } } } } }),
            ),
            "x.x xxx",
            &["required-added", "rust-field-type-changed"],
        ),
        case(
            "definition nobody uses removed",
            with_defs(
                json!({ "id": s() }),
                json!({ "Spare": { "type": "string", "enum": ["x"] } }),
            ),
            event(json!({ "id": s() }), &["id"], json!({})),
            "... xxx",
            &["rust-type-removed"],
        ),
    ]
}
