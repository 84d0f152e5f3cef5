//! `codegen`: the build-script step for 200 generated event schemas, and what the schema
//! evolution gate adds to it.
//!
//! Writes 200 schemas (enums, formats, a pattern, an optional nested object, a `$ref` to a
//! shared definition file) into a temporary folder, then runs the step a build script runs
//! (load and check every schema, resolve references, compare with the lock, typify, decorate,
//! pretty-print, write `outbox_events.rs`) in three states of the lock, alternating run by run:
//!
//! - no lock file: the gate has nothing to compare (the baseline);
//! - locked, unchanged: what most builds see (the lock is read and every schema found equal);
//! - locked, every schema changed compatibly (an optional property added to each, the types
//!   locked under `backward`): every schema is walked and, for the rust level, its released
//!   version is run through typify too. The worst a build sees.
//!
//! What the gate adds is the median of the differences between a run and the baseline run
//! next to it. Last lines: `gate_unchanged_ms=<x>`, `gate_all_changed_ms=<x>`, then
//! `codegen_200_ms=<x>` (the step with an unchanged lock).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use outbox_codegen::evolution::{Mode, Status};
use outbox_codegen::Config;

const SCHEMAS: usize = 200;
const RUNS: usize = 11;

/// Runs the benchmark and prints its figures.
pub fn run() {
    println!("command: cargo run -p outbox-bench --release -- codegen");
    let dir = scratch_dir();
    let unchanged = dir.join("unchanged/schemas");
    let changed = dir.join("changed/schemas");
    write_schemas(&unchanged, false);
    write_schemas(&changed, false);

    let mut config = Config::new();
    config.source("bench").consumes(["domain3.>"]);
    let mut backward = config.clone();
    backward.compatibility(Mode::Backward);
    for folder in [&unchanged, &changed] {
        backward
            .write_lock(folder, &[])
            .unwrap_or_else(|e| panic!("locking failed:\n{e}"));
    }
    write_schemas(&changed, true);
    let report = config
        .evolution(&changed)
        .expect("the changed schemas load");
    assert!(
        report.passes(),
        "an optional property added passes under backward"
    );
    let n = report
        .types
        .iter()
        .filter(|t| t.status == Status::Changed)
        .count();
    assert_eq!(n, SCHEMAS);
    let mut without_lock = config.clone();
    without_lock.lock_file(dir.join("no.lock"));

    // Each state of the lock against the same folder without one, run next to it.
    let scenarios: [(&str, &Config, &Path); 4] = [
        ("unchanged schemas, no lock file", &without_lock, &unchanged),
        ("unchanged schemas, locked", &config, &unchanged),
        ("changed schemas, no lock file", &without_lock, &changed),
        ("changed schemas, locked", &config, &changed),
    ];
    let mut times: [Vec<Duration>; 4] = Default::default();
    let mut bytes = [0; 4];
    for _ in 0..RUNS {
        for (i, (_, config, schemas)) in scenarios.iter().enumerate() {
            let out = schemas.with_file_name("out");
            let (took, len) = step(config, schemas, &out);
            times[i].push(took);
            bytes[i] = len;
        }
    }
    for (i, (label, _, _)) in scenarios.iter().enumerate() {
        let mut sorted = times[i].clone();
        sorted.sort();
        println!(
            "{label}: min {:.1} ms, median {:.1} ms, max {:.1} ms ({} KiB of Rust)",
            ms(sorted[0]),
            ms(sorted[RUNS / 2]),
            ms(sorted[RUNS - 1]),
            bytes[i] / 1024
        );
    }
    // The median (and quartiles) of `with - without`, run by run.
    let added = |with: usize, without: usize| -> (f64, f64, f64) {
        let mut d: Vec<f64> = (0..RUNS)
            .map(|r| ms(times[with][r]) - ms(times[without][r]))
            .collect();
        d.sort_by(f64::total_cmp);
        (d[RUNS / 2], d[RUNS / 4], d[3 * RUNS / 4])
    };

    // The share of loading and checking (JSON, meta-schema, references) in the step.
    let mut loads: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            let events = outbox_codegen::load_dir(&unchanged).expect("the schemas load");
            assert_eq!(events.len(), SCHEMAS);
            started.elapsed()
        })
        .collect();
    loads.sort();
    println!(
        "of which loading and checking: median {:.1} ms",
        ms(loads[RUNS / 2])
    );
    let _ = std::fs::remove_dir_all(&dir);
    let (u, u_lo, u_hi) = added(1, 0);
    let (c, c_lo, c_hi) = added(3, 2);
    println!("the gate adds, against the baseline run beside it (median, quartiles):");
    println!("  unchanged {u:.1} ms ({u_lo:.1} to {u_hi:.1}); every schema changed {c:.1} ms ({c_lo:.1} to {c_hi:.1})");
    let mut base = times[1].clone();
    base.sort();
    println!("gate_unchanged_ms={u:.1}");
    println!("gate_all_changed_ms={c:.1}");
    println!("codegen_200_ms={:.1}", ms(base[RUNS / 2]));
}

/// One build step: its time and the size of the code.
fn step(config: &Config, schemas: &Path, out: &Path) -> (Duration, usize) {
    let started = Instant::now();
    let code = config
        .generate(schemas)
        .unwrap_or_else(|e| panic!("generation failed:\n{e}"));
    write_if_changed(&out.join(outbox_codegen::DEFAULT_OUT_FILE), &code);
    (started.elapsed(), code.len())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-bench-codegen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the scratch folder");
    dir
}

fn write_if_changed(path: &Path, code: &str) {
    if std::fs::read(path).is_ok_and(|old| old == code.as_bytes()) {
        return;
    }
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the output folder");
    std::fs::write(path, code).expect("write the output");
}

/// The 200 schemas; with `changed`, each has one more optional property.
fn write_schemas(dir: &Path, changed: bool) {
    std::fs::create_dir_all(dir.join("defs")).expect("create the schema folder");
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
        let mut schema = schema;
        if changed {
            schema["properties"]["note"] = serde_json::json!({ "type": "string", "maxLength": 80 });
        }
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
