//! JSON Schema event contracts to typed Rust events.
pub mod error;
pub mod naming;
pub mod schema;

pub use error::{Error, Result};
pub use schema::{load_dir, load_event, EventSchema};
