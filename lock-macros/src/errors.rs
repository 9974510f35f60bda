//! The error accumulator shared by argument parsing and validation.

use proc_macro2::Span;

/// Collects independent errors so one compilation reports all of them (serde's `Ctxt`, in small).
#[derive(Debug, Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    /// The value, or `None` after recording the error.
    pub(crate) fn ok<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|err| self.push(err)).ok()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Everything recorded, as one error. Every `None` on the way here reported its error; the
    /// fallback message only guards that invariant.
    pub(crate) fn into_error(self) -> syn::Error {
        self.0.unwrap_or_else(|| {
            syn::Error::new(Span::call_site(), "invalid #[distributed_lock] usage")
        })
    }
}
