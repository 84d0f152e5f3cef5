//! `#[derive(OutboxEvent)]` (placeholder until the derive lands).
use proc_macro::TokenStream;

/// Derives `outbox_runtime::OutboxEvent`.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
