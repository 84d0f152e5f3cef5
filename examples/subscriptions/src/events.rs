//! The billing event contract, generated at build time from `schemas/events/*.schema.json`.
include!(concat!(env!("OUT_DIR"), "/outbox_events.rs"));
