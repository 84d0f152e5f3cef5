//! `outbox lock`: record a folder's schemas as released.

use std::process::ExitCode;

use super::check::{gate, problems};
use crate::args::LockArgs;
use crate::render;

pub fn run(args: &LockArgs) -> ExitCode {
    let locked = match gate(&args.gate).write_lock(&args.dir, &args.allow_breaking) {
        Ok(locked) => locked,
        Err(e) => return problems(&args.dir, &e.into_list()).expect("an error is a problem"),
    };
    for (event_type, status) in &locked.types {
        println!("{event_type}: {}", render::locked(status));
    }
    let n = locked.types.len();
    if locked.written {
        println!("wrote {} ({n} event type(s))", locked.lock_file.display());
    } else {
        println!(
            "{} is up to date ({n} event type(s))",
            locked.lock_file.display()
        );
    }
    ExitCode::SUCCESS
}
