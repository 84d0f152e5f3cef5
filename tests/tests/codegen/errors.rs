//! Every codegen error a user can cause, through the public API, with the message checked: it
//! names the file, the JSON pointer, and what to change.

use std::fs;
use std::path::{Path, PathBuf};

use outbox_codegen::{Config, Error};

struct Folder {
    dir: tempfile::TempDir,
}

impl Folder {
    fn new() -> Self {
        Folder {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        path
    }

    /// A valid event schema with `properties` replaced.
    fn event(&self, name: &str, title: &str, properties: &str) -> PathBuf {
        self.write(
            name,
            &format!(
                r#"{{ "title": "{title}", "type": "object", "required": ["id"],
                      "x-outbox-subject": "id",
                      "properties": {{ "id": {{ "type": "string", "format": "uuid" }}{properties} }} }}"#
            ),
        )
    }

    /// The only error of generating this folder, displayed.
    fn error(&self) -> String {
        let err = Config::new()
            .source("svc")
            .generate(self.path())
            .expect_err("generation must fail");
        let list = err.into_list();
        assert_eq!(list.len(), 1, "expected one error, got {list:#?}");
        list[0].to_string()
    }
}

fn assert_says(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "the message\n  {message}\ndoes not say\n  {part}"
        );
    }
}

#[test]
fn malformed_json() {
    let f = Folder::new();
    let file = f.write(
        "a.b.created.schema.json",
        "{\n  \"title\": \"Created\",\n  \"type\": \"object\",\n}",
    );
    assert_says(
        &f.error(),
        &[
            &format!(
                "{}: at the root: not valid JSON: trailing comma",
                file.display()
            ),
            "at line 4, column 1; fix the syntax",
        ],
    );
}

#[test]
fn invalid_json_schema() {
    let f = Folder::new();
    let file = f.event(
        "a.b.created.schema.json",
        "Created",
        r#", "n": { "type": "integer", "minimum": "one" }"#,
    );
    assert_says(
        &f.error(),
        &[
            &format!(
                "{}: at /properties/n/minimum: not a valid JSON Schema (draft 2020-12)",
                file.display()
            ),
            "\"one\" is not of type \"number\"",
        ],
    );

    let f = Folder::new();
    let file = f.write(
        "a.b.created.schema.json",
        r#"{ "$schema": "http://json-schema.org/draft-07/schema#", "title": "Created",
             "type": "object", "properties": { "n": { "type": "integer", "exclusiveMinimum": true } } }"#,
    );
    assert_says(
        &f.error(),
        &[&format!(
            "{}: at /properties/n/exclusiveMinimum: not a valid JSON Schema (draft-07)",
            file.display()
        )],
    );
}

#[test]
fn bad_file_name() {
    let f = Folder::new();
    let file = f.event("billing.Subscription.created.schema.json", "Created", "");
    assert_says(
        &f.error(),
        &[
            &format!(
                "{}: invalid event type `billing.Subscription.created` in the file name",
                file.display()
            ),
            "the entity token `Subscription` has an uppercase letter",
            "rename the file to `<event_type>.schema.json`",
        ],
    );

    let f = Folder::new();
    f.event("billing.subscription.schema.json", "Created", "");
    assert_says(
        &f.error(),
        &["it has 2 tokens; expected `<domain>.<entity>.<action>`"],
    );
}

#[test]
fn duplicate_title() {
    let f = Folder::new();
    let first = f.event("a.b.created.schema.json", "Changed", "");
    let second = f.event("a.b.updated.schema.json", "Changed", "");
    assert_says(
        &f.error(),
        &[
            &format!(
                "{}: at /title: the title `Changed` is already used by {} (`a.b.created`)",
                second.display(),
                first.display()
            ),
            "rename one of them",
        ],
    );
}

#[test]
fn unresolvable_refs() {
    let cases = [
        (
            r#"{ "$ref": "defs/missing.json#/$defs/Money" }"#,
            "`$ref` points to `defs/missing.json`, which does not exist",
        ),
        (
            r#"{ "$ref": "defs/common.json#/$defs/Nope" }"#,
            "has no value at `/$defs/Nope`; fix the pointer or add the definition",
        ),
        (
            r##"{ "$ref": "#/$defs/Nope" }"##,
            "has no value at `/$defs/Nope`",
        ),
        (
            r#"{ "$ref": "../outside.json" }"#,
            "outside the schema folder",
        ),
        (
            r#"{ "$ref": "https://example.com/money.json" }"#,
            "remote reference `https://example.com/money.json` is not supported",
        ),
    ];
    for (reference, says) in cases {
        let f = Folder::new();
        f.write(
            "schemas/defs/common.json",
            r#"{ "$defs": { "Money": { "type": "integer" } } }"#,
        );
        f.write(
            "outside.json",
            r#"{ "title": "Outside", "type": "string" }"#,
        );
        let file = f.event(
            "schemas/a.b.created.schema.json",
            "Created",
            &format!(r#", "price": {reference}"#),
        );
        let err = Config::new()
            .source("svc")
            .generate(f.path().join("schemas"))
            .unwrap_err();
        let list = err.into_list();
        assert_eq!(list.len(), 1, "{list:#?}");
        assert_says(
            &list[0].to_string(),
            &[
                &format!("{}: at /properties/price/$ref: ", file.display()),
                says,
            ],
        );
    }
}

#[test]
fn two_definitions_under_one_name() {
    let f = Folder::new();
    f.write(
        "defs/a.json",
        r#"{ "$defs": { "Money": { "type": "integer" } } }"#,
    );
    f.write(
        "defs/b.json",
        r#"{ "$defs": { "Money": { "type": "string" } } }"#,
    );
    let file = f.event(
        "a.b.created.schema.json",
        "Created",
        r#", "x": { "$ref": "defs/a.json#/$defs/Money" }, "y": { "$ref": "defs/b.json#/$defs/Money" }"#,
    );
    assert_says(
        &f.error(),
        &[
            &format!(
                "{}: at /properties/y/$ref: two different definitions are named `Money`",
                file.display()
            ),
            "rename one of them",
        ],
    );

    // Across schemas: all definitions share one Rust module.
    let f = Folder::new();
    f.write(
        "a.b.created.schema.json",
        r##"{ "title": "Created", "type": "object", "properties": { "p": { "$ref": "#/$defs/Plan" } },
             "$defs": { "Plan": { "type": "string", "enum": ["a"] } } }"##,
    );
    let second = f.write(
        "a.b.updated.schema.json",
        r##"{ "title": "Updated", "type": "object", "properties": { "p": { "$ref": "#/$defs/Plan" } },
             "$defs": { "Plan": { "type": "string", "enum": ["b"] } } }"##,
    );
    assert_says(
        &f.error(),
        &[
            &format!("{}: at /$defs/Plan: ", second.display()),
            "defines a different `Plan`",
            "move the shared definition into a definition file",
        ],
    );
}

#[test]
fn constructs_the_type_generator_cannot_take() {
    let f = Folder::new();
    let file = f.event(
        "a.b.created.schema.json",
        "Created",
        r#", "code": { "type": "string", "if": { "minLength": 3 }, "then": { "pattern": "^A" } }"#,
    );
    assert_says(
        &f.error(),
        &[
            &format!("{}: at /properties/code: the type generator cannot take this schema: not implemented: if/then/else schemas are not supported", file.display()),
            "simplify this construct",
            "or use `{}` to accept any JSON value here",
        ],
    );

    let f = Folder::new();
    let file = f.write(
        "a.b.created.schema.json",
        r##"{ "title": "Created", "type": "object", "properties": { "p": { "$ref": "#/$defs/NotText" } },
             "$defs": { "NotText": { "not": { "type": "string" } } } }"##,
    );
    assert_says(
        &f.error(),
        &[&format!("{}: at /$defs/NotText: the type generator cannot take this schema: not yet implemented: unhandled not schema", file.display())],
    );

    // A reference into a property: valid JSON Schema, but not something typify follows.
    let f = Folder::new();
    let file = f.event(
        "a.b.created.schema.json",
        "Created",
        r##", "other": { "$ref": "#/properties/id" }"##,
    );
    assert_says(
        &f.error(),
        &[
            &format!("{}: at /properties/other/$ref: the reference `#/properties/id` points inside a schema", file.display()),
            "move the target into the root `$defs` and refer to it as `#/$defs/<Name>`",
        ],
    );
}

#[test]
fn root_title_and_subject_rules() {
    let f = Folder::new();
    let file = f.write(
        "a.b.created.schema.json",
        r#"{ "title": "Created", "type": "array" }"#,
    );
    assert_says(
        &f.error(),
        &[&format!("{}: at /type: the root schema has type \"array\"; an event payload is a JSON object: set `\"type\": \"object\"`", file.display())],
    );

    let f = Folder::new();
    f.write(
        "a.b.created.schema.json",
        r#"{ "title": "created", "type": "object" }"#,
    );
    assert_says(
        &f.error(),
        &["at /title: `title` is the Rust type name of the event, and `created` is not one"],
    );

    let f = Folder::new();
    f.write(
        "a.b.created.schema.json",
        r#"{ "title": "HTTPCalled", "type": "object", "properties": { "n": { "type": "integer" } } }"#,
    );
    assert_says(
        &f.error(),
        &["at /title: the generator renamed the type `HTTPCalled` (it became `HttpCalled`)"],
    );

    let f = Folder::new();
    f.write(
        "a.b.created.schema.json",
        r#"{ "title": "Created", "type": "object", "x-outbox-subject": "id",
             "properties": { "id": { "type": "string" } } }"#,
    );
    assert_says(
        &f.error(),
        &[
            "at /x-outbox-subject: the subject property `id` must be required",
            "add \"id\" to `required`",
        ],
    );

    let f = Folder::new();
    f.write(
        "a.b.created.schema.json",
        r#"{ "title": "Created", "type": "object", "x-outbox-subject": "at", "required": ["at"],
             "properties": { "at": { "type": "number" } } }"#,
    );
    assert_says(
        &f.error(),
        &[
            "at /properties/at: the subject property `at` has type \"number\"",
            "or an integer",
        ],
    );
}

#[test]
fn check_reports_every_problem_of_the_folder_at_once() {
    let f = Folder::new();
    f.write("a.b.broken.schema.json", "{");
    f.write(
        "a.B.named.schema.json",
        r#"{ "title": "Named", "type": "object" }"#,
    );
    f.event("a.b.first.schema.json", "Same", "");
    f.event("a.b.second.schema.json", "Same", "");
    f.event("a.b.ok.schema.json", "Fine", "");
    let problems: Vec<String> = outbox_codegen::check(f.path())
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("a.B.named.schema.json: invalid event type")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("a.b.broken.schema.json: at the root: not valid JSON")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p
                .contains("a.b.second.schema.json: at /title: the title `Same` is already used")),
        "{problems:#?}"
    );

    // Error::Many displays one problem a line.
    let many = Config::new().source("svc").generate(f.path()).unwrap_err();
    assert!(matches!(many, Error::Many(_)));
    assert_eq!(many.to_string().lines().count(), 3);

    // A folder without problems has none.
    fs::remove_file(f.path().join("a.b.broken.schema.json")).unwrap();
    fs::remove_file(f.path().join("a.B.named.schema.json")).unwrap();
    fs::remove_file(f.path().join("a.b.second.schema.json")).unwrap();
    assert!(outbox_codegen::check(f.path()).is_empty());
}

#[test]
fn the_example_schemas_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/events");
    assert_eq!(
        outbox_codegen::check(&dir)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        Vec::<String>::new()
    );
    let events = outbox_codegen::load_dir(&dir).unwrap();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "billing.subscription.cancelled",
            "billing.subscription.created",
            "billing.subscription.plan_changed"
        ]
    );
    assert!(events
        .iter()
        .all(|e| e.subject.as_deref() == Some("subscription_id")));
}
