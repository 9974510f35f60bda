//! Code generation. Nothing here can fail: `validate` has checked everything. `P` in the sketches is
//! the runtime's `__private` module (`::lock_runtime::__private`, or `<crate = "path">::__private`).

use crate::boxed::Boxed;
use crate::key::{self, Part, Root};
use crate::validate::{Key, Locked};
use lock_rules::Mode;
use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{ToTokens as _, TokenStreamExt as _, format_ident, quote, quote_spanned};
use std::time::Duration;
use syn::spanned::Spanned as _;
use syn::visit_mut::VisitMut;
use syn::{Expr, Member, ReturnType, Stmt, Type, TypeInfer};

/// Input:  `#[distributed_lock(..)] ATTRS VIS [async] fn f(ARGS) -> R { #![INNER] BODY }`
/// Output: `ATTRS VIS [async] fn f(ARGS) -> R { #![INNER] <locked body> }`
///
/// Only the body changes, and the user's code stays inside it: no sibling function, so `self`,
/// generics and `impl Trait` arguments work as written.
///
/// An `#[async_trait]` method, `fn f(ARGS) -> Pin<Box<dyn Future<Output = R> ..>>`, keeps its
/// shape too: `{ #![INNER] PREFIX Box::pin(async move { <locked body, async, with R> }) }`, where
/// the locked body starts with the destructuring of its pattern parameters (`let PAT = ..;`).
pub(crate) fn locked_fn(locked: &Locked) -> TokenStream {
    let Locked {
        attrs,
        vis,
        sig,
        body,
        boxed,
        ..
    } = locked;
    let locked_body = match boxed {
        Some(boxed) => boxed_future(boxed, locked_body(locked)),
        None => locked_body(locked),
    };
    let mut out = quote!(#(#attrs)* #vis #sig);
    body.brace.surround(&mut out, |tokens| {
        tokens.append_all(&body.inner_attrs);
        tokens.extend(locked_body);
    });
    out
}

/// Input:  `[async] fn f(from: u64, to: u64) -> R { BODY }` with `keys = ["w:<from>", "w:<to>"]`
/// Output, async:
/// ```text
/// let __lock_call = P::Call {
///     keys: ::std::vec![KEY(w:<from>), KEY(w:<to>)],   // in the order written; one for `key`
///     ttl: TTL, wait: WAIT, max_hold: MAX_HOLD, min_hold: MIN_HOLD, reentrant: true,
///     fencing: None,                                 // Some(b) for `fencing = b`
///     mode: P::Mode::Exclusive,                      // the lock's kind
///     name: "w:<from>, w:<to>",                      // the templates: the tracing/metrics label
/// };
/// let __lock_out = match P::acquire(__lock_call).await {
///     Ok(__lock_guard) => {
///         let __lock_out = {
///             let GUARD = &__lock_guard;
///             P::until_lost(&__lock_guard, async move { TOUCH_MUT; FAKE_RETURN_EDGE { BODY } })
///                 .await
///         };
///         P::finish(__lock_guard, { __lock_out }).await     // Result<R, LockError>
///     }
///     Err(__lock_err) => Err(__lock_err),
/// };
/// match __lock_out {
///     Ok(__lock_out) => __lock_out,
///     // `Err(..)`, through the trait that also checks that R is a `Result`:
///     Err(__lock_err) => P::CallResult::failed(P::FromLockError::from_lock_error(__lock_err)),
///     // with `map_err`: Err(MAP_ERR(__lock_err))
/// }
/// ```
/// sync: `P::acquire_blocking(..)`, the body as
/// `P::run_blocking(&__lock_guard, move || { TOUCH_MUT; FAKE_RETURN_EDGE { BODY } })` and
/// `P::finish_blocking(..)`.
///
/// In the `async move` block and the closure `return` and `?` leave the body only, as they would
/// have left the fn, so the guard is always finished. `until_lost` and `run_blocking` run the body
/// inside the guard's reentrancy scope (task-local and thread-local), where a nested locked call on
/// a key it holds joins the hold.
fn locked_body(locked: &Locked) -> TokenStream {
    let is_async = locked.sig.asyncness.is_some() || locked.boxed.is_some();
    let site = Span::mixed_site();
    let private = &locked.private;
    let ret = return_span(locked);
    let [call, guard, out, err] = locals(Span::mixed_site());
    let keys = locked.keys.iter().map(|key| render_key(key, private));
    let ttl = duration(locked.ttl, private);
    let wait = duration(locked.wait, private);
    let max_hold = duration(locked.max_hold, private);
    let min_hold = duration(locked.min_hold, private);
    let reentrant = syn::LitBool::new(locked.reentrant, site);
    let fencing = match locked.fencing {
        Some(on) => {
            let on = syn::LitBool::new(on, site);
            quote_spanned!(site=> ::core::option::Option::Some(#on))
        }
        None => quote_spanned!(site=> ::core::option::Option::None),
    };
    let mode = match locked.mode {
        Mode::Exclusive => quote_spanned!(site=> #private::Mode::Exclusive),
        Mode::Fair => quote_spanned!(site=> #private::Mode::Fair),
        Mode::Shared => quote_spanned!(site=> #private::Mode::Shared),
        Mode::Permits(n) => {
            let n = Literal::u32_suffixed(n);
            quote_spanned!(site=> #private::Mode::Permits(#n))
        }
    };
    // The metrics and tracing label: the templates as written, never rendered keys.
    let templates: Vec<String> = locked.keys.iter().map(|key| key.lit.value()).collect();
    let name = syn::LitStr::new(&templates.join(", "), site);
    let bind_guard = bind_guard(locked);
    let fake_return = fake_return_edge(locked);
    let touch_mutable = touch_mutable(locked);
    let (destructured, stmts) = match &locked.boxed {
        Some(boxed) => {
            let destructured = boxed.destructured.iter().map(|param| &param.local);
            let rebinds = &boxed.rebinds;
            let touch_key = touch_key_params(&locked.keys);
            let stmts = &boxed.stmts;
            (
                quote!(#(#destructured)*),
                quote!(#rebinds #touch_key #stmts),
            )
        }
        None => (TokenStream::new(), locked.body.stmts.clone()),
    };
    // The user's statements keep a block of their own, located at the fn's braces but hygienic,
    // so a body that ends without its value (`do_it();`, `Ok(());`) is reported on the body, with
    // rustc's "remove this semicolon" help, as in a plain async fn. With the fn block's exact span
    // rustc would take this block for the fn's and blame the closure's unwritten return type (at
    // the attribute); with a span it takes as user-written, a one-expression body would trip
    // `unused_braces`.
    let mut stmts = Group::new(Delimiter::Brace, stmts);
    stmts.set_span(site.located_at(locked.body.brace.span.join()));
    let body = quote_spanned!(site=> {
        #touch_mutable
        #fake_return
        #stmts
    });
    // Everything that needs `R: CallResult` or `E: FromLockError` is located on the return type,
    // so a wrong return type is one error there (rustc reports one unsatisfied bound per span),
    // not one per call. rustc blames the argument `R` is inferred from, and ignores hygienic
    // spans for that, hence `{ __lock_out }`: a block located on the return type. A lock failure
    // becomes the call's error in one place, so a conversion that does not fit (`map_err`'s
    // function of the wrong type) is one error too, at the argument.
    let at_ret = private_at(private, ret);
    let [_, guard_at_ret, out_at_ret, err_at_ret] = locals(ret);
    // `Err(..)` through `CallResult`, which also checks that the return type is a `Result`;
    // `map_err`'s plainly, all at the argument, so a function of the wrong type is reported
    // there as such.
    let failed = match &locked.map_err {
        Some(path) => {
            let span = path.span();
            let [.., err_at_path] = locals(span);
            quote_spanned!(span=> ::core::result::Result::Err((#path)(#err_at_path)))
        }
        None => quote_spanned!(ret=>
            #at_ret::CallResult::failed(#at_ret::FromLockError::from_lock_error(#err_at_ret))
        ),
    };
    let (acquire, run, finish) = if is_async {
        (
            quote_spanned!(site=> #private::acquire(#call).await),
            quote_spanned!(site=> #private::until_lost(&#guard, async move #body).await),
            quote_spanned!(ret=> #at_ret::finish(#guard_at_ret, { #out_at_ret }).await),
        )
    } else {
        (
            quote_spanned!(site=> #private::acquire_blocking(#call)),
            quote_spanned!(site=> #private::run_blocking(&#guard, move || #body)),
            quote_spanned!(ret=> #at_ret::finish_blocking(#guard_at_ret, { #out_at_ret })),
        )
    };
    quote_spanned! {site=>
        #destructured
        let #call = #private::Call {
            keys: ::std::vec![#(#keys),*],
            ttl: #ttl,
            wait: #wait,
            max_hold: #max_hold,
            min_hold: #min_hold,
            reentrant: #reentrant,
            fencing: #fencing,
            mode: #mode,
            name: #name,
        };
        let #out = match #acquire {
            ::core::result::Result::Ok(#guard) => {
                let #out = {
                    #bind_guard
                    #run
                };
                #finish
            }
            ::core::result::Result::Err(#err) => ::core::result::Result::Err(#err),
        };
        match #out {
            ::core::result::Result::Ok(#out) => #out,
            ::core::result::Result::Err(#err_at_ret) => #failed,
        }
    }
}

/// `P` with every token at `span`: rustc reports an unsatisfied bound of a generic function on the
/// span of the path that names it, so this is where such errors land.
fn private_at(private: &TokenStream, span: Span) -> TokenStream {
    private
        .clone()
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

/// The generated locals (`__lock_call`, `__lock_guard`, `__lock_out`, `__lock_err`): hygienic, so
/// they can't clash with the user's names, and located at `at` for error messages.
fn locals(at: Span) -> [syn::Ident; 4] {
    let span = Span::mixed_site().located_at(at);
    ["call", "guard", "out", "err"].map(|name| format_ident!("__lock_{}", name, span = span))
}

/// Input:  `fn f(mut a: u8, b: u8, (mut c, d): (u8, u8))`
/// Output: `let _ = &a; let _ = &c;`: see `Locked::mutable` for why.
fn touch_mutable(locked: &Locked) -> TokenStream {
    let mutable = &locked.mutable;
    quote_spanned!(Span::mixed_site()=> #(let _ = &#mutable;)*)
}

/// Input:  `keys = ["a:<x>:<y.id>:<self.z>", "b:<x>"]`
/// Output: `let _ = &x; let _ = &y; let _ = &x;`, after `#[async_trait]`'s `let x = x;`: see
/// [`Boxed::rebinds`].
fn touch_key_params(keys: &[Key]) -> TokenStream {
    let parts = keys.iter().flat_map(|key| &key.parts);
    let params = parts.filter_map(|part| match part {
        Part::Value {
            root: Root::Param(ident),
            ..
        } => Some(ident),
        _ => None,
    });
    quote_spanned!(Span::mixed_site()=> #(let _ = &#params;)*)
}

/// Input:  `guard = lock`
/// Output: `let lock = &__lock_guard;` (nothing without `guard`)
fn bind_guard(locked: &Locked) -> TokenStream {
    let [_, guard, ..] = locals(Span::mixed_site());
    locked
        .guard
        .as_ref()
        .map(|name| quote_spanned!(Span::mixed_site()=> let #name = &#guard;))
        .unwrap_or_default()
}

/// Input:  `"{eu}:wallet:<user_id>:<order.id>"`
/// Output:
/// ```text
/// {
///     let __lock_part0: &dyn P::KeyPart = &user_id;
///     let __lock_part1: &dyn P::KeyPart = &order.id;
///     ::std::format!("{{eu}}:wallet:{}:{}", __lock_part0, __lock_part1)
/// }
/// ```
/// or `::std::string::String::from("...")` without placeholders.
///
/// Parts are borrowed, never moved, and rendered before the body runs. The coercion to
/// `&dyn KeyPart` is the only place that needs `Display`, so a part without it is one error, with
/// `KeyPart`'s message, on the key literal (passing the part to `format!` would be a second one).
///
/// rustc, not this crate, knows the fields, so a misspelt one is rustc's error, on the field's
/// name. Where the compiler gives sub-spans (nightly) that name sits inside the template, and
/// rustc's "a field with a similar name exists" fix edits it there. Elsewhere it is the whole
/// literal, made hygienic: rustc offers its fix and its list of fields only for a span it takes as
/// user-written, and on the literal's own span that fix replaces the whole template with the
/// field's name. A message without them beats a wrong edit.
fn render_key(key: &Key, private: &TokenStream) -> TokenStream {
    let span = key.lit.span();
    let site = Span::mixed_site().located_at(span);
    let private = private_at(private, span);
    let mut format = String::new();
    let mut names = Vec::new();
    let mut parts = Vec::new();
    for part in &key.parts {
        match part {
            Part::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Part::Value { root, fields } => {
                format.push_str("{}");
                let root = match root {
                    Root::SelfValue => quote_spanned!(span=> self),
                    Root::Param(ident) => {
                        let mut ident = ident.clone();
                        ident.set_span(span);
                        ident.into_token_stream()
                    }
                };
                let fields = fields.iter().map(|field| {
                    let at = key::subspan(&key.lit, field.range.clone()).unwrap_or(site);
                    match &field.member {
                        Member::Named(ident) => {
                            let mut ident = ident.clone();
                            ident.set_span(at);
                            quote_spanned!(span=> .#ident)
                        }
                        Member::Unnamed(index) => {
                            let index = syn::Index {
                                index: index.index,
                                span: at,
                            };
                            quote_spanned!(span=> .#index)
                        }
                    }
                });
                names.push(format_ident!("__lock_part{}", names.len(), span = site));
                parts.push(quote_spanned!(span=> &#root #(#fields)*));
            }
        }
    }
    let mut format = Literal::string(&format);
    format.set_span(span);
    if names.is_empty() {
        quote_spanned!(site=> ::std::string::String::from(#format))
    } else {
        quote_spanned! {site=>
            {
                #(let #names: &dyn #private::KeyPart = #parts;)*
                ::std::format!(#format, #(#names),*)
            }
        }
    }
}

/// Input:  `Some(10s)` / `None`
/// Output: `Some(P::Duration::new(10, 0))` / `None` (the runtime's configured default)
fn duration(duration: Option<Duration>, private: &TokenStream) -> TokenStream {
    match duration {
        Some(duration) => {
            let secs = Literal::u64_unsuffixed(duration.as_secs());
            let nanos = Literal::u32_unsuffixed(duration.subsec_nanos());
            quote!(::core::option::Option::Some(#private::Duration::new(#secs, #nanos)))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// Input:  `-> Result<impl Display, E>`
/// Output: `if false { let __lock_fake: Result<_, E> = loop {}; return __lock_fake; }`
///
/// The fake return edge: an unreachable `return` of the declared type, first in the async block or
/// closure, so its type is known before the body is checked. `?` then knows what to convert into,
/// and a mismatch in the body is reported against the return type the user wrote.
fn fake_return_edge(locked: &Locked) -> TokenStream {
    let span = return_span(locked);
    let ty = match &locked.output {
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
            ImplTraitEraser.visit_type_mut(&mut ty);
            ty.into_token_stream()
        }
        ReturnType::Default => quote_spanned!(span=> ()),
    };
    let fake = format_ident!("__lock_fake", span = Span::mixed_site().located_at(span));
    quote_spanned! {span=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #fake: #ty = loop {};
            return #fake;
        }
    }
}

/// Where errors about the return type belong: the type as written (or the name, if there is none).
fn return_span(locked: &Locked) -> Span {
    match &locked.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => locked.sig.ident.span(),
    }
}

/// Input:  `PREFIX Box::pin(async move { STMTS })` (STMTS are already in `locked`), the locked body
/// Output: `PREFIX Box::pin(async move { <locked> })`
fn boxed_future(boxed: &Boxed, locked: TokenStream) -> TokenStream {
    let Boxed {
        prefix,
        pin,
        future,
        ..
    } = boxed;
    let mut future = future.clone();
    future.block.stmts = vec![Stmt::Expr(Expr::Verbatim(locked), None)];
    quote!(#(#prefix)* #pin(#future))
}

/// `impl Trait` can't be written in a `let`; `_` lets inference fill it in.
struct ImplTraitEraser;

impl VisitMut for ImplTraitEraser {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            *ty = Type::Infer(TypeInfer {
                attrs: Vec::new(),
                underscore_token: syn::Token![_](impl_trait.impl_token.span),
            });
        } else {
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
}

/// Input:  the item exactly as written, and every error found in it and in the arguments.
/// Output: `::core::compile_error! { ".." }` per error, then the untouched item, so the function
///         still exists for callers and the IDE: one mistake, one error.
pub(crate) fn with_errors(item: TokenStream, errors: &syn::Error) -> TokenStream {
    let errors = errors.to_compile_error();
    quote!(#errors #item)
}

#[cfg(test)]
mod tests {
    use crate::validate::validate;
    use proc_macro2::TokenStream;
    use quote::quote;

    /// The expansion as text without spaces, for `contains` checks.
    fn expand(attr: TokenStream, item: TokenStream) -> String {
        match validate(attr, item) {
            Ok(locked) => super::locked_fn(&locked).to_string().replace(' ', ""),
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn keys_become_one_call_in_the_order_written() {
        let out = expand(
            quote!(
                keys = ["w:<to>", "w:<from>"],
                wait = "5s",
                max_hold = "2m",
                min_hold = "1m",
                reentrant = false
            ),
            quote!(
                async fn transfer(from: u64, to: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        let call = "let__lock_call=::lock_runtime::__private::Call{keys:::std::vec![";
        assert!(out.contains(call), "{out}");
        assert!(
            out.contains(
                "ttl:::core::option::Option::None,\
                 wait:::core::option::Option::Some(::lock_runtime::__private::Duration::new(5,0)),\
                 max_hold:::core::option::Option::Some(::lock_runtime::__private::Duration::new(120,0)),\
                 min_hold:::core::option::Option::Some(::lock_runtime::__private::Duration::new(60,0)),\
                 reentrant:false,fencing:::core::option::Option::None,\
                 mode:::lock_runtime::__private::Mode::Exclusive,\
                 name:\"w:<to>,w:<from>\",}"
            ),
            "{out}"
        );
        assert!(
            out.contains("::lock_runtime::__private::acquire(__lock_call).await"),
            "{out}"
        );
        assert!(
            out.contains("::lock_runtime::__private::until_lost(&__lock_guard,asyncmove{"),
            "{out}"
        );
        // `to` is rendered before `from`, as written.
        let to = out.find("=&to;");
        assert!(to.is_some() && to < out.find("=&from;"), "{out}");
    }

    /// What `#[async_trait]` makes of
    /// `async fn f(&self, Path((user, amount)): Path<(u64, i64)>) -> Result<i64, E>`.
    fn async_trait_method() -> TokenStream {
        quote!(
            fn f<'life0, 'async_trait>(
                &'life0 self,
                __arg1: Path<(u64, i64)>,
            ) -> ::core::pin::Pin<
                Box<dyn ::core::future::Future<Output = Result<i64, E>> + Send + 'async_trait>,
            > {
                Box::pin(async move {
                    if let ::core::option::Option::Some(__ret) =
                        ::core::option::Option::None::<Result<i64, E>>
                    {
                        return __ret;
                    }
                    let __self = self;
                    let Path((user, amount)) = {
                        let __arg1 = __arg1;
                        __arg1
                    };
                    let __ret: Result<i64, E> = { Ok(amount) };
                    __ret
                })
            }
        )
    }

    #[test]
    fn async_trait_pattern_parameters_are_destructured_before_the_keys() {
        let out = expand(quote!(key = "w:<user>"), async_trait_method());
        let destructured = out.find("letPath((user,amount))={let__arg1=__arg1;__arg1};");
        assert!(
            destructured.is_some() && destructured < out.find("let__lock_call="),
            "{out}"
        );
        // The other rebindings stay in the body, after the lock is taken.
        assert!(
            out.find("let__self=self;") > out.find("until_lost("),
            "{out}"
        );

        let err = validate(quote!(key = "w:<usr>"), async_trait_method())
            .err()
            .map(|err| err.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "unknown name `usr` in key placeholder `<usr>`; did you mean `user`? (the only \
                 parameter is `self`; the names bound by parameter patterns are `user`, `amount`)"
            )
        );
    }

    #[test]
    fn sync_bodies_run_in_the_guards_scope() {
        let out = expand(
            quote!(key = "k:<id>", guard = lock),
            quote!(
                fn f(id: u64) -> Result<u64, E> {
                    Ok(id)
                }
            ),
        );
        assert!(out.contains("keys:::std::vec![{"), "{out}");
        assert!(out.contains("reentrant:true,"), "{out}");
        assert!(
            out.contains(
                "max_hold:::core::option::Option::None,min_hold:::core::option::Option::None,"
            ),
            "{out}"
        );
        assert!(
            out.contains("::lock_runtime::__private::acquire_blocking(__lock_call)"),
            "{out}"
        );
        assert!(
            out.contains("letlock=&__lock_guard;::lock_runtime::__private::run_blocking(&__lock_guard,move||{"),
            "{out}"
        );
        assert!(
            out.contains("finish_blocking(__lock_guard,{__lock_out})"),
            "{out}"
        );
    }
}
