//! `outbox asyncapi`: the example service's checked-in document is what the command writes for
//! its schemas, byte for byte, on every run; a broken folder is an error naming the file.
//! (`scripts/check-asyncapi` parses the document with the official AsyncAPI parser.)

use crate::support::{outbox, repo_root};

/// The command that writes `examples/subscriptions/asyncapi.json`, from the repository's root.
const EXAMPLE: &[&str] = &[
    "asyncapi",
    "schemas/events",
    "--source",
    "billing",
    "--stream",
    "BILLING",
];

fn generate(args: &[&str]) -> Vec<u8> {
    let out = outbox()
        .current_dir(repo_root())
        .args(args)
        .output()
        .expect("run outbox asyncapi");
    assert!(
        out.status.success(),
        "outbox asyncapi failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn the_example_services_document_is_what_the_command_writes() {
    let shipped = std::fs::read(repo_root().join("examples/subscriptions/asyncapi.json"))
        .expect("examples/subscriptions/asyncapi.json");
    let written = generate(EXAMPLE);
    assert!(
        written == shipped,
        "examples/subscriptions/asyncapi.json is not what `outbox {}` writes; regenerate it \
         with `cargo run -p outbox-cli -- {} --output examples/subscriptions/asyncapi.json`",
        EXAMPLE.join(" "),
        EXAMPLE.join(" ")
    );
    assert_eq!(
        generate(EXAMPLE),
        written,
        "the same schemas, the same bytes"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("asyncapi.json");
    let mut args = EXAMPLE.to_vec();
    let path = file.to_str().unwrap();
    args.extend(["--output", path]);
    assert!(
        generate(&args).is_empty(),
        "--output writes nothing to stdout"
    );
    assert_eq!(std::fs::read(&file).unwrap(), written);

    let doc: serde_json::Value = serde_json::from_slice(&written).unwrap();
    let channels: Vec<&String> = doc["channels"].as_object().unwrap().keys().collect();
    assert_eq!(
        channels,
        [
            "billing.subscription.cancelled",
            "billing.subscription.created",
            "billing.subscription.plan_changed"
        ]
    );
}

#[test]
fn asyncapi_on_a_broken_folder_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("billing.invoice.paid.schema.json"),
        r#"{ "title": "InvoicePaid", "type": "object", "properties": { "x": { "$ref": "defs/missing.json" } } }"#,
    )
    .unwrap();
    let out = outbox()
        .arg("asyncapi")
        .arg(dir.path())
        .args(["--stream", "BILLING"])
        .output()
        .expect("run outbox asyncapi");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "no document is written");
    assert!(
        stderr.contains("billing.invoice.paid.schema.json") && stderr.contains("defs/missing.json"),
        "{stderr}"
    );
}
