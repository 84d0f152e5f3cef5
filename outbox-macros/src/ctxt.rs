//! Error collection across the stages, so one expansion reports every problem at once.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects the errors of one expansion. Every stage keeps going after an error, so the user
/// sees all of them in one build.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    /// An error spanned on `tokens`.
    pub(crate) fn error_spanned_by(&self, tokens: impl ToTokens, msg: impl Display) {
        self.errors
            .borrow_mut()
            .push(syn::Error::new_spanned(tokens.into_token_stream(), msg));
    }

    /// An error at `span`.
    pub(crate) fn error_at(&self, span: Span, msg: impl Display) {
        self.errors.borrow_mut().push(syn::Error::new(span, msg));
    }

    /// A parse error, as syn produced it.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// Whether any error was recorded so far.
    pub(crate) fn has_errors(&self) -> bool {
        !self.errors.borrow().is_empty()
    }

    /// The errors recorded, in order.
    pub(crate) fn into_errors(self) -> Vec<syn::Error> {
        self.errors.into_inner()
    }
}
