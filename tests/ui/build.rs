//! Generates the two contracts the cases compile against.

use std::path::Path;

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // the end-to-end suites' schema folders, one level up
    let schemas = Path::new(&manifest_dir).join("../schemas");

    // `v1` is the shape user code was written against, `v2` the changed one. The `payments.*`
    // types are only read by this service.
    for (version, file) in [("v1", "contract_v1.rs"), ("v2", "contract_v2.rs")] {
        if let Err(e) = outbox_codegen::Config::new()
            .source("billing")
            .consumes(["payments.>"])
            .out_file(file)
            .compile(schemas.join(version))
        {
            panic!("generating the {version} contract failed:\n{e}");
        }
    }
}
