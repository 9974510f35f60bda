//! The `#[distributed_lock]` attribute. Use it through `lock_runtime::distributed_lock`, which
//! documents it; this crate only generates code against `lock_runtime::__private`.
//!
//! Pipeline: `args` (the attribute's arguments) -> `validate` (the function, and the arguments
//! against it, with `key` and `duration` for the two small languages) -> `expand` (infallible).
//! `errors` collects what `args` and `validate` find, so one compilation reports every mistake;
//! `boxed` recognizes the methods `#[async_trait]` has already rewritten.

mod args;
mod boxed;
mod duration;
mod errors;
mod expand;
mod key;
mod validate;

use proc_macro::TokenStream;

/// Runs the function body while holding a distributed lock; see `lock_runtime::distributed_lock`.
#[proc_macro_attribute]
pub fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match validate::validate(attr.into(), item.clone()) {
        Ok(locked) => expand::locked_fn(&locked),
        Err(errors) => expand::with_errors(item, &errors),
    }
    .into()
}
