fn main() {
    if let Err(e) = outbox_codegen::Config::new()
        .source("shop")
        .compile("schemas/events")
    {
        panic!("\n{e}\n");
    }
}
