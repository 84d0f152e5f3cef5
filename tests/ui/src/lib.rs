//! The event types the compile-fail cases (`fail/`, `pass/`) are written against.

/// Event types generated from `tests/schemas/v1`: the contract as user code was first written
/// against it.
pub mod contract_v1 {
    include!(concat!(env!("OUT_DIR"), "/contract_v1.rs"));
}

/// Event types generated from `tests/schemas/v2`: the changed contract. The cases compile code
/// written for `v1` against it, and each change must be a compile error at the user's line.
pub mod contract_v2 {
    include!(concat!(env!("OUT_DIR"), "/contract_v2.rs"));
}
