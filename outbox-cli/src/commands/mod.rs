//! The subcommands' work, one file each; `crate::run` picks one.

pub mod asyncapi;
pub mod check;
pub mod gen;
pub mod lock;
pub mod migrate;
pub mod prune;
pub mod relay;
pub mod status;
pub mod stream;
pub mod tail;
pub mod unblock;
pub mod verify;
