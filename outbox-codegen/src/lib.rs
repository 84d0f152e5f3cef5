//! JSON Schema event contracts to typed Rust events.
mod codegen;
pub mod error;
pub mod naming;
pub mod schema;

pub use codegen::{check, compile, Config, DEFAULT_OUT_FILE};
pub use error::{Error, Result};
pub use schema::{load_dir, load_event, EventSchema};
