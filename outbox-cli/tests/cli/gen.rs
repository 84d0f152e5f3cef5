//! `outbox gen`: the Rust a build script would generate, which compiles.

use crate::support::{outbox, repo_root};

#[test]
fn gen_prints_rust_that_compiles() {
    let schemas = repo_root().join("schemas/events");
    let out = outbox()
        .arg("gen")
        .arg(&schemas)
        .args(["--source", "billing"])
        .output()
        .expect("run outbox gen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "outbox gen failed:\n{stderr}");
    let code = String::from_utf8(out.stdout).expect("utf-8 Rust");
    for title in [
        "SubscriptionCreated",
        "SubscriptionCancelled",
        "SubscriptionPlanChanged",
    ] {
        assert!(
            code.contains(&format!("pub struct {title}")),
            "no `{title}` in the output"
        );
    }
    assert!(code.contains("source = \"billing\""), "{code}");

    // The golden case's expected Rust is compiled by the workspace (`outbox_tests::golden`), so
    // `gen` printing exactly that file proves its output compiles.
    let tests = repo_root().join("tests");
    let out = outbox()
        .current_dir(&tests)
        .args(["gen", "golden/kitchen_sink/schemas", "--source", "golden"])
        .args(["--consumes", "payments.>"])
        .output()
        .expect("run outbox gen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "outbox gen failed:\n{stderr}");
    let expected = std::fs::read_to_string(tests.join("golden/kitchen_sink/expected.rs"))
        .expect("read the golden file");
    // `gen` prints absolute schema paths (the output may be pasted anywhere); the golden
    // file holds them relative to tests/.
    let code = String::from_utf8(out.stdout)
        .expect("utf-8 Rust")
        .replace(&format!("{}/", tests.display()), "");
    assert!(
        code == expected,
        "`outbox gen` differs from tests/golden/kitchen_sink/expected.rs (compiled as outbox_tests::golden)"
    );
}
