//! `outbox check`: every problem of a folder, with its file and pointer.

use crate::support::{repo_root, run};

/// A folder of event schemas, each problem in its own file.
fn broken_schemas() -> (
    tempfile::TempDir,
    Vec<(&'static str, &'static str, &'static str)>,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let files: [(&str, &str); 5] = [
        (
            "billing.Invoice.paid.schema.json",
            r#"{ "title": "InvoicePaid", "type": "object" }"#,
        ),
        (
            "billing.invoice.sent.schema.json",
            "{\n  \"title\": \"InvoiceSent\",\n  \"type\": \"object\",\n}",
        ),
        (
            "billing.invoice.voided.schema.json",
            r#"{ "type": "object", "properties": { "n": { "type": "integer" } } }"#,
        ),
        (
            "billing.invoice.created.schema.json",
            r#"{ "title": "InvoiceCreated", "type": "object", "x-outbox-subject": "invoice_id",
                 "required": ["id"], "properties": { "id": { "type": "string" } } }"#,
        ),
        (
            "billing.invoice.issued.schema.json",
            r#"{ "title": "InvoiceIssued", "type": "object", "x-outbox-subject": "id",
                 "required": ["id"], "properties": { "id": { "type": "string" } } }"#,
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write a schema");
    }
    // (file, where, what): every problem `check` must report
    let problems = vec![
        (
            "billing.Invoice.paid.schema.json",
            "invalid event type `billing.Invoice.paid` in the file name",
            "rename the file",
        ),
        (
            "billing.invoice.sent.schema.json",
            "at the root: not valid JSON",
            "fix the syntax",
        ),
        (
            "billing.invoice.voided.schema.json",
            "at the root: the schema has no `title`",
            "add one",
        ),
        (
            "billing.invoice.created.schema.json",
            "at /x-outbox-subject: `x-outbox-subject` names `invoice_id`, which is not in `properties`",
            "name an existing property",
        ),
    ];
    (dir, problems)
}

#[tokio::test]
async fn check_lists_every_problem_with_its_file_and_pointer() {
    let (dir, problems) = broken_schemas();
    let out = run([std::ffi::OsStr::new("check"), dir.path().as_os_str()]).await;
    out.expect_code(1);
    let lines: Vec<&str> = out.stdout.lines().collect();
    for (file, at, fix) in &problems {
        let path = dir.path().join(file);
        let prefix = format!("{}: {at}", path.display());
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&prefix) && l.contains(fix)),
            "no line `{prefix} ... {fix}` in\n{}",
            out.stdout
        );
    }
    assert!(
        !out.stdout.contains("billing.invoice.issued"),
        "the valid schema has no problem:\n{}",
        out.stdout
    );
    assert_eq!(
        lines.last().copied(),
        Some(format!("{} problem(s) in {}", problems.len(), dir.path().display()).as_str()),
        "{}",
        out.stdout
    );
    assert_eq!(lines.len(), problems.len() + 1, "{}", out.stdout);

    let schemas = repo_root().join("schemas/events");
    let out = run([std::ffi::OsStr::new("check"), schemas.as_os_str()]).await;
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), format!("{}: ok", schemas.display()));
}
