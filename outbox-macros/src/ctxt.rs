//! Error collection across the stages, so one expansion reports every problem at once.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects the errors of one expansion. Every stage keeps going after an error, so the user
/// sees all of them in one build.
///
/// [`Ctxt::check`] consumes the context and returns what was collected; dropping a context
/// without checking it panics (as serde_derive's does), so an error recorded on a path that
/// forgot to report it fails the derive's own tests instead of vanishing.
pub(crate) struct Ctxt {
    /// `None` once checked.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error spanned on `tokens`.
    pub(crate) fn error_spanned_by(&self, tokens: impl ToTokens, msg: impl Display) {
        self.push(syn::Error::new_spanned(tokens.into_token_stream(), msg));
    }

    /// An error at `span`.
    pub(crate) fn error_at(&self, span: Span, msg: impl Display) {
        self.push(syn::Error::new(span, msg));
    }

    /// A parse error, as syn produced it.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.push(err);
    }

    fn push(&self, err: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("only `check` takes the errors, and it consumes the context")
            .push(err);
    }

    /// Whether any error was recorded so far.
    pub(crate) fn has_errors(&self) -> bool {
        self.errors.borrow().as_ref().is_some_and(|e| !e.is_empty())
    }

    /// The errors recorded, in order, combined into one (`to_compile_error` emits each of
    /// them); `Ok` when there were none.
    pub(crate) fn check(self) -> syn::Result<()> {
        let mut errors = self
            .errors
            .borrow_mut()
            .take()
            .expect("a context is checked once")
            .into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for rest in errors {
            combined.combine(rest);
        }
        Err(combined)
    }

    /// The messages recorded, in order (checks the context).
    #[cfg(test)]
    pub(crate) fn messages(self) -> Vec<String> {
        match self.check() {
            Ok(()) => Vec::new(),
            Err(combined) => combined.into_iter().map(|e| e.to_string()).collect(),
        }
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("a `Ctxt` was dropped without `Ctxt::check`");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_returns_every_error_in_order() {
        let cx = Ctxt::new();
        assert!(!cx.has_errors());
        cx.error_at(Span::call_site(), "first");
        cx.error_spanned_by(quote::quote!(x), "second");
        assert!(cx.has_errors());
        let combined = cx.check().unwrap_err();
        let messages: Vec<String> = combined.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages, ["first", "second"]);
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    #[should_panic = "dropped without `Ctxt::check`"]
    fn an_unchecked_context_panics() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "lost");
    }
}
