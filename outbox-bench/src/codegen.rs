//! `codegen`: the build-script step for 200 generated event schemas.
//!
//! Writes 200 schemas (enums, formats, a pattern, an optional nested object, a `$ref` to a
//! shared definition file) into a temporary folder, then runs the step a build script runs
//! (load and check every schema, resolve references, typify, decorate, pretty-print, write
//! `outbox_events.rs`) several times and prints the median. Last line: `codegen_200_ms=<x>`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SCHEMAS: usize = 200;
const RUNS: usize = 7;

/// Runs the benchmark and prints its figures.
pub fn run() {
    let dir = scratch_dir();
    let schemas = dir.join("schemas");
    write_schemas(&schemas);
    let out = dir.join("out");

    let mut config = outbox_codegen::Config::new();
    config.source("bench").consumes(["domain3.>"]);
    let mut times: Vec<Duration> = Vec::with_capacity(RUNS);
    let mut bytes = 0;
    for run in 0..RUNS {
        let started = Instant::now();
        let code = config
            .generate(&schemas)
            .unwrap_or_else(|e| panic!("generation failed:\n{e}"));
        write_if_changed(&out.join(outbox_codegen::DEFAULT_OUT_FILE), &code);
        let took = started.elapsed();
        bytes = code.len();
        println!("run {run}: {:.1} ms", ms(took));
        times.push(took);
    }
    times.sort();
    let median = times[RUNS / 2];

    // The share of loading and checking (JSON, meta-schema, references) in the step.
    let mut loads: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            let events = outbox_codegen::load_dir(&schemas).expect("the schemas load");
            assert_eq!(events.len(), SCHEMAS);
            started.elapsed()
        })
        .collect();
    loads.sort();
    println!(
        "of which loading and checking: median {:.1} ms",
        ms(loads[RUNS / 2])
    );
    println!(
        "{SCHEMAS} schemas -> {} KiB of Rust; min {:.1} ms, median {:.1} ms, max {:.1} ms",
        bytes / 1024,
        ms(times[0]),
        ms(median),
        ms(times[RUNS - 1])
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!("codegen_200_ms={:.1}", ms(median));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-bench-codegen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("schemas/defs")).expect("create the scratch folder");
    dir
}

fn write_if_changed(path: &Path, code: &str) {
    if std::fs::read(path).is_ok_and(|old| old == code.as_bytes()) {
        return;
    }
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the output folder");
    std::fs::write(path, code).expect("write the output");
}

fn write_schemas(dir: &Path) {
    let common = serde_json::json!({
        "$defs": {
            "Money": {
                "type": "object",
                "required": ["amount_minor", "currency"],
                "properties": {
                    "amount_minor": { "type": "integer", "minimum": 0 },
                    "currency": { "type": "string", "pattern": "^[A-Z]{3}$" }
                },
                "additionalProperties": false
            }
        }
    });
    write_json(&dir.join("defs/common.json"), &common);
    for i in 0..SCHEMAS {
        let domain = i % 10;
        let entity = i / 10;
        let schema = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": format!("Entity{entity}Changed{domain}"),
            "type": "object",
            "x-outbox-subject": "id",
            "required": ["id", "at", "state", "amount"],
            "properties": {
                "id": { "type": "string", "format": "uuid" },
                "at": { "type": "string", "format": "date-time" },
                "state": { "type": "string", "enum": ["new", "active", "closed"] },
                "amount": { "$ref": "defs/common.json#/$defs/Money" },
                "code": { "type": "string", "pattern": "^[A-Z0-9]{4,12}$" },
                "count": { "type": "integer", "minimum": 1 },
                "detail": {
                    "type": "object",
                    "required": ["note"],
                    "properties": {
                        "note": { "type": "string", "maxLength": 200 },
                        "tags": { "type": "array", "items": { "type": "string" } }
                    }
                }
            },
            "additionalProperties": false
        });
        write_json(
            &dir.join(format!("domain{domain}.entity{entity}.changed.schema.json")),
            &schema,
        );
    }
}

fn write_json(path: &Path, value: &serde_json::Value) {
    let text = serde_json::to_string_pretty(value).expect("a Value serializes");
    std::fs::write(path, text).expect("write a schema");
}
