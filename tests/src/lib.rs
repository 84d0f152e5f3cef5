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

/// The code generator's golden outputs (`golden/<case>/expected.rs`, checked in), compiled with
/// this crate so `cargo build -p outbox-tests` proves they compile. `tests/codegen/golden.rs`
/// checks they are what the generator produces today.
pub mod golden {
    /// `golden/kitchen_sink`: references, enums, formats, patterns, a consumed type.
    pub mod kitchen_sink {
        include!("../golden/kitchen_sink/expected.rs");
    }

    /// `golden/minimal`: one event without a subject property.
    pub mod minimal {
        include!("../golden/minimal/expected.rs");
    }
}
