//! `outbox stream ensure`: create the stream, or check that the existing one matches.

use std::process::ExitCode;
use std::time::Duration;

use outbox_runtime::{StorageType, StreamSpec};

use crate::args::{renamed, EnsureArgs};
use crate::connect;
use crate::error::Result;

pub async fn ensure(args: EnsureArgs) -> Result<ExitCode> {
    let event_types = renamed(args.event_types, args.subject, "event-type", "subject");
    let js = connect::jetstream(&args.nats).await?;
    let permissions = args
        .print_permissions
        .then(|| outbox_runtime::RelayPermissions::new(&args.name, event_types.clone()));
    let spec = StreamSpec {
        name: args.name,
        subjects: event_types,
        duplicate_window: Duration::from_secs(args.duplicate_window),
        storage: if args.memory {
            StorageType::Memory
        } else {
            StorageType::File
        },
        replicas: args.replicas,
        ..StreamSpec::default()
    };
    let info = spec.ensure(&js).await?;
    println!(
        "stream {} ok: subjects {}, duplicate window {}s, {} replica(s), {} message(s)",
        info.config.name,
        info.config.subjects.join(", "),
        info.config.duplicate_window.as_secs(),
        info.config.num_replicas.max(1),
        info.state.messages
    );
    if let Some(warning) = outbox_runtime::durability_warning(&info.config) {
        eprintln!("warning: {warning}");
    }
    if let Some(permissions) = permissions {
        println!(
            "# the relay's NATS user: publish into {} and nothing else",
            info.config.name
        );
        println!("{permissions}");
    }
    Ok(ExitCode::SUCCESS)
}
