//! The cases of everything else: keywords the check does not know, annotations, titles and the
//! subject property.

use super::*;

/// Unknown keywords, descriptions, titles, the subject property.
pub(super) fn cases() -> Vec<Case> {
    vec![
        case(
            "unknown keyword added",
            prop(s()),
            prop(json!({ "type": "string", "x-unit": "cents" })),
            "xxx xxx",
            &["unknown-keyword"],
        ),
        case(
            "description changed",
            prop(json!({ "type": "string", "description": "a" })),
            prop(json!({ "type": "string", "description": "b" })),
            "... ...",
            &[],
        ),
        case(
            "inner title changed",
            prop(json!({ "type": "object", "title": "Inner", "properties": { "a": s() } })),
            prop(json!({ "type": "object", "title": "Outer", "properties": { "a": s() } })),
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "event title changed",
            prop(s()),
            {
                let mut e = prop(s());
                e["title"] = "Renamed".into();
                e
            },
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "subject property changed",
            event(
                json!({ "id": s(), "other": s() }),
                &["id", "other"],
                json!({ "x-outbox-subject": "id" }),
            ),
            event(
                json!({ "id": s(), "other": s() }),
                &["id", "other"],
                json!({ "x-outbox-subject": "other" }),
            ),
            "... xxx",
            &["rust-subject-changed"],
        ),
    ]
}

#[test]
fn documentation_does_not_need_the_rust_level() {
    let a = json!({ "description": "a", "properties": { "description": { "type": "string", "examples": ["x"] } } });
    let docs = json!({ "description": "b", "properties": { "description": { "type": "string" } } });
    assert!(same_but_docs(&a, &docs), "only documentation differs");
    // A property named `description` is a property, and `enum` values are data.
    let renamed = json!({ "description": "a", "properties": { "summary": { "type": "string" } } });
    assert!(!same_but_docs(&a, &renamed));
    let data = |v: &str| json!({ "enum": [{ "description": v }] });
    assert!(!same_but_docs(&data("x"), &data("y")));
    assert!(
        !same_but_docs(&json!({ "title": "A" }), &json!({ "title": "B" })),
        "a title names a type"
    );
}
