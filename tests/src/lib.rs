//! Shared code of the end-to-end suites and the compile-fail ui suite.

/// Event types generated from `schemas/v1`: the contract as user code was first written
/// against it.
pub mod contract_v1 {
    include!(concat!(env!("OUT_DIR"), "/contract_v1.rs"));
}

/// Event types generated from `schemas/v2`: the changed contract. The ui suite compiles code
/// written for `v1` against it, and each change must be a compile error at the user's line.
pub mod contract_v2 {
    include!(concat!(env!("OUT_DIR"), "/contract_v2.rs"));
}
