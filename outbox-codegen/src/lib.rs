//! JSON Schema event contracts to typed Rust events.
pub mod naming;
