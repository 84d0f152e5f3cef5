//! `outbox lock`, then `outbox check` against the lock: a breaking change fails until allowed.

use crate::support::run;

#[tokio::test]
async fn lock_then_check_fails_on_a_breaking_change_until_it_is_allowed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let schemas = dir.path().join("events");
    std::fs::create_dir(&schemas).unwrap();
    let file = schemas.join("billing.invoice.paid.schema.json");
    let write = |required: &str| {
        std::fs::write(
            &file,
            format!(
                r#"{{ "title": "InvoicePaid", "type": "object", "required": [{required}],
                     "properties": {{ "id": {{ "type": "string" }}, "note": {{ "type": "string" }} }} }}"#
            ),
        )
        .unwrap()
    };
    let lock_file = dir.path().join("events.lock");
    let shown = |p: &std::path::Path| p.display().to_string();
    write(r#""id""#);

    let out = run([std::ffi::OsStr::new("lock"), schemas.as_os_str()]).await;
    out.expect_code(0).assert_clean();
    assert_eq!(
        out.stdout,
        format!(
            "billing.invoice.paid: new\nwrote {} (1 event type(s))\n",
            shown(&lock_file)
        )
    );
    let out = run([std::ffi::OsStr::new("lock"), schemas.as_os_str()]).await;
    out.expect_code(0);
    assert!(
        out.stdout.ends_with(&format!(
            "{} is up to date (1 event type(s))\n",
            shown(&lock_file)
        )),
        "{}",
        out.stdout
    );

    // `note` becomes required: events published before may lack it.
    write(r#""id", "note""#);
    let out = run([std::ffi::OsStr::new("check"), schemas.as_os_str()]).await;
    out.expect_code(1);
    for says in [
        "billing.invoice.paid.schema.json: 2 breaking changes to the released event type `billing.invoice.paid`",
        "  - at /required: `note` became required",
        "    required-added (wire): breaks new consumers",
        "rust-field-type-changed (rust)",
        "publish the new shape as the new major type `billing.invoice.paid.v2`",
        "--allow-breaking billing.invoice.paid",
    ] {
        assert!(out.stdout.contains(says), "no `{says}` in\n{}", out.stdout);
    }
    assert!(
        out.stdout
            .ends_with(&format!("1 problem(s) in {}\n", shown(&schemas))),
        "{}",
        out.stdout
    );
    // At the wire level under `forward`, the change breaks nobody.
    let out = run([
        "check",
        &shown(&schemas),
        "--level",
        "wire",
        "--compatibility-for",
        "billing.invoice.paid=forward",
    ])
    .await;
    out.expect_code(0);
    assert!(
        out.stdout
            .starts_with("note: `billing.invoice.paid` changed compatibly (mode `forward`)"),
        "{}",
        out.stdout
    );

    let out = run([std::ffi::OsStr::new("lock"), schemas.as_os_str()]).await;
    out.expect_code(1);
    assert!(
        out.stdout
            .contains("breaking changes to the released event type"),
        "{}",
        out.stdout
    );
    let out = run([
        "lock",
        &shown(&schemas),
        "--allow-breaking",
        "billing.invoice.paid",
    ])
    .await;
    out.expect_code(0);
    assert!(
        out.stdout.starts_with(
            "billing.invoice.paid: changed incompatibly, allowed by --allow-breaking\n"
        ),
        "{}",
        out.stdout
    );
    let out = run([std::ffi::OsStr::new("check"), schemas.as_os_str()]).await;
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), format!("{}: ok", shown(&schemas)));

    let out = run([
        "check",
        &shown(&schemas),
        "--compatibility-for",
        "billing.invoice.paid",
    ])
    .await;
    out.expect_code(2);
    assert!(out.stderr.contains("expected TYPE=MODE"), "{}", out.stderr);
}
