//! Benchmarks. `cargo run -p outbox-bench --release -- <mode> [--quick]`; each mode prints the
//! command that reproduces it first and its figure last, as `name=value`. Figures are medians
//! over several runs, and ratios against baselines run in the same process.

mod claim;
mod codegen;
mod common;
mod emit;
mod latency;
mod relay;
mod retention;
mod soak;

const MODES: &str = "codegen, relay, latency, emit, claim, retention, soak";

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        "codegen" => codegen::run(),
        "relay" => relay::run(),
        "latency" => latency::run(),
        "emit" => emit::run(),
        "claim" => claim::run(),
        "retention" => retention::run(),
        "soak" => soak::run(),
        other => {
            eprintln!("unknown benchmark mode `{other}`; modes: {MODES}");
            std::process::exit(2);
        }
    }
}
