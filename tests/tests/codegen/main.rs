//! The code generator through its public API, in one test binary: the golden outputs
//! (`golden`) and every error a user can cause (`errors`). No service is needed.

mod errors;
mod golden;
