fn main() {
    // The service's event contract lives at the repository root, shared with the tests.
    if let Err(e) = outbox_codegen::Config::new()
        .source("billing")
        .compile("../../schemas/events")
    {
        panic!("\n{e}\n");
    }
}
