//! The annotated item, and every check that needs both it and the arguments. Produces a [`Locked`]
//! from which `expand` generates code without ever failing.

use crate::args::{self, Args};
use crate::boxed::{self, Boxed};
use crate::errors::Errors;
use crate::key::{self, Part, Scope};
use lock_rules::Mode;
use proc_macro2::TokenStream;
use quote::quote;
use std::time::Duration;
use syn::parse::{Parse, ParseStream};
use syn::{
    Attribute, FnArg, Ident, LitStr, Pat, PatIdent, Receiver, ReturnType, Signature, Token, Type,
    Visibility, braced, token,
};

/// A function with its body kept as tokens: the body is the user's code, and it only has to be
/// syntactically a block, not something this crate understands.
#[derive(Debug)]
pub(crate) struct Func {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// `None` for a declaration without body (`fn f(&self);` in a trait).
    pub(crate) body: Option<Body>,
}

#[derive(Debug)]
pub(crate) struct Body {
    pub(crate) brace: token::Brace,
    /// `#![...]` at the top of the body; they stay at the top of the generated body.
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) stmts: TokenStream,
}

impl Parse for Func {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        if input.fork().parse::<Signature>().is_err() {
            let found = input
                .cursor()
                .token_tree()
                .map_or_else(String::new, |(tt, _)| format!(", not on `{tt}`"));
            return Err(input.error(format_args!(
                "#[distributed_lock] goes on a function (`fn` or `async fn`){found}"
            )));
        }
        let sig: Signature = input.parse()?;
        let body = if input.parse::<Option<Token![;]>>()?.is_some() {
            None
        } else {
            let content;
            let brace = braced!(content in input);
            Some(Body {
                brace,
                inner_attrs: content.call(Attribute::parse_inner)?,
                stmts: content.parse()?,
            })
        };
        Ok(Func {
            attrs,
            vis,
            sig,
            body,
        })
    }
}

/// Everything `expand` needs, all of it checked.
#[derive(Debug)]
pub(crate) struct Locked {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) body: Body,
    /// The result type the body produces: the declared return type, or `R` of an
    /// `#[async_trait]` method's `Pin<Box<dyn Future<Output = R>>>`.
    pub(crate) output: ReturnType,
    /// An `#[async_trait]` method: the lock goes inside its `Box::pin(async move { .. })`, and
    /// `body` is the fn's body around it.
    pub(crate) boxed: Option<Boxed>,
    /// One per template, in the order written (the runtime sorts and dedupes the rendered keys).
    pub(crate) keys: Vec<Key>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) reentrant: bool,
    /// `fencing = ..`: `None` for the client's default.
    pub(crate) fencing: Option<bool>,
    pub(crate) mode: Mode,
    pub(crate) guard: Option<Ident>,
    /// `map_err = path`: the conversion of a lock failure into the call's error type (else
    /// `FromLockError`, that is `From<LockError>`).
    pub(crate) map_err: Option<syn::ExprPath>,
    /// Parameters bound with `mut`. The body reads them from inside a `move` closure or async block,
    /// where a parameter overwritten before it is read would warn "value captured by `x` is never
    /// read", a warning the plain function never had; `expand` reads each one first.
    pub(crate) mutable: Vec<Ident>,
    /// The path to the runtime's `__private` module.
    pub(crate) private: TokenStream,
}

#[derive(Debug)]
pub(crate) struct Key {
    /// The template literal; generated key code is spanned here so its errors point at the key.
    pub(crate) lit: LitStr,
    pub(crate) parts: Vec<Part>,
}

/// Parses and checks the attribute and the item together.
pub(crate) fn validate(attr: TokenStream, item: TokenStream) -> syn::Result<Locked> {
    let mut errors = Errors::default();
    let Args {
        keys,
        ttl,
        wait,
        max_hold,
        min_hold,
        reentrant,
        fencing,
        mode,
        guard,
        map_err,
        krate,
    } = args::parse(attr, &mut errors);
    let Some(func) = errors.ok(syn::parse2::<Func>(item)) else {
        return Err(errors.into_error());
    };
    let Func {
        attrs,
        vis,
        sig,
        body,
    } = func;

    let (output, boxed) = match boxed::future_output(&sig) {
        Some(ty) => {
            let output = ReturnType::Type(Default::default(), Box::new(ty.clone()));
            let boxed = body
                .as_ref()
                .and_then(|body| errors.ok(boxed::split(&sig, &body.stmts)));
            (output, boxed)
        }
        None => (sig.output.clone(), None),
    };
    check_signature(&sig, &output, body.is_some(), &mut errors);
    let params = params(&sig, boxed.as_ref());
    let scope = scope(&params);
    let mutable = mutable_bindings(&params);
    let keys = keys.and_then(|lits| {
        // Every template is parsed, so each reports its own mistakes.
        let keys: Vec<Option<Key>> = lits
            .into_iter()
            .map(|lit| match key::parse(&lit.value(), &scope) {
                Ok(parts) => Some(Key { lit, parts }),
                Err(problems) => {
                    for problem in problems {
                        let span = key::subspan(&lit, problem.range).unwrap_or_else(|| lit.span());
                        errors.push(syn::Error::new(span, problem.message));
                    }
                    None
                }
            })
            .collect();
        keys.into_iter().collect::<Option<Vec<Key>>>()
    });
    let shadowed = guard.as_ref().and_then(|guard| {
        let param = scope.params.iter().find(|param| *param == guard);
        let bound = scope.pattern_bindings.iter().find(|bound| *bound == guard);
        param
            .map(|param| ("parameter", param))
            .or(bound.map(|bound| ("pattern binding", bound)))
            .map(|(what, name)| (guard, what, name))
    });
    if let Some((guard, what, name)) = shadowed {
        errors.push(syn::Error::new(
            guard.span(),
            format_args!(
                "`guard = {guard}` would hide the {what} `{name}` inside the body; pick \
                 another name, like `guard = lock`"
            ),
        ));
    }

    let private = match krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::lock_runtime::__private),
    };
    match (keys, body) {
        (Some(keys), Some(body)) if errors.is_empty() => Ok(Locked {
            attrs,
            vis,
            sig,
            body,
            output,
            boxed,
            keys,
            ttl,
            wait,
            max_hold,
            min_hold,
            reentrant: reentrant.unwrap_or(true),
            fencing,
            mode,
            guard,
            map_err,
            mutable,
            private,
        }),
        _ => Err(errors.into_error()),
    }
}

/// The function-level rules: something must be able to run at run time and return the lock's errors.
fn check_signature(sig: &Signature, output: &ReturnType, has_body: bool, errors: &mut Errors) {
    let name = &sig.ident;
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            format_args!(
                "#[distributed_lock] can't be used on a `const fn`: taking a lock is I/O at run \
                 time; remove `const` from `{name}`"
            ),
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new_spanned(
            variadic.dots,
            format_args!(
                "#[distributed_lock] can't be used on a variadic function; remove the `...` from \
                 `{name}`"
            ),
        ));
    }
    if !has_body {
        errors.push(syn::Error::new(
            name.span(),
            format_args!(
                "#[distributed_lock] needs a function body to run under the lock, and `{name}` is \
                 only declared; put the attribute on the implementation (the `impl` block's \
                 `fn {name}`) instead"
            ),
        ));
    }
    let unit = match output {
        ReturnType::Default => Some(name.span()),
        ReturnType::Type(_, ty) => match &**ty {
            Type::Tuple(tuple) if tuple.elems.is_empty() => Some(tuple.paren_token.span.join()),
            _ => None,
        },
    };
    if let Some(span) = unit {
        errors.push(syn::Error::new(
            span,
            format_args!(
                "`{name}` must return a `Result` whose error type implements \
                 `From<lock_runtime::LockError>`, because taking the lock can fail; return e.g. \
                 `Result<(), lock_runtime::LockError>`"
            ),
        ));
    }
}

/// A parameter as the body binds it.
enum Param<'a> {
    Receiver(&'a Receiver),
    Pat(&'a Pat),
}

/// The signature's parameters, except that an `#[async_trait]` method's `__argN` is the pattern
/// it stands for (see [`Boxed::destructured`]).
fn params<'a>(sig: &'a Signature, boxed: Option<&'a Boxed>) -> Vec<Param<'a>> {
    let destructured = boxed.map_or(&[][..], |boxed| &boxed.destructured);
    sig.inputs
        .iter()
        .map(|input| match input {
            FnArg::Receiver(receiver) => Param::Receiver(receiver),
            FnArg::Typed(typed) => {
                let pat = match &*typed.pat {
                    Pat::Ident(arg) => destructured
                        .iter()
                        .find(|param| param.arg == arg.ident)
                        .map(|param| &param.local.pat),
                    _ => None,
                };
                Param::Pat(pat.unwrap_or(&typed.pat))
            }
        })
        .collect()
}

/// The names a key template may use: each parameter's name, and every name its pattern binds
/// (`State(app)` binds `app`, `all @ (a, b)` is the parameter `all` and binds `a` and `b`).
fn scope(params: &[Param<'_>]) -> Scope {
    let mut scope = Scope::default();
    for param in params {
        match param {
            Param::Receiver(_) => scope.receiver = true,
            Param::Pat(pat) => {
                let mut bound = Vec::new();
                bindings(pat, &mut bound);
                let mut bound = bound.into_iter().map(|pat| pat.ident.clone());
                if let Pat::Ident(_) = pat {
                    scope.params.extend(bound.next());
                }
                scope.pattern_bindings.extend(bound);
            }
        }
    }
    scope
}

/// The parameters bound with `mut` (`mut x`, `mut self`, `(mut a, b)`), see [`Locked::mutable`].
fn mutable_bindings(params: &[Param<'_>]) -> Vec<Ident> {
    let mut bound = Vec::new();
    let mut mutable = Vec::new();
    for param in params {
        match param {
            Param::Receiver(receiver) => {
                if receiver.mutability.is_some() {
                    mutable.push(Ident::new("self", receiver.self_token.span));
                }
            }
            Param::Pat(pat) => bindings(pat, &mut bound),
        }
    }
    mutable.extend(
        bound
            .into_iter()
            .filter(|pat| pat.mutability.is_some() && pat.by_ref.is_none())
            .map(|pat| pat.ident.clone()),
    );
    mutable
}

/// The names bound by a parameter's pattern.
fn bindings<'a>(pat: &'a Pat, out: &mut Vec<&'a PatIdent>) {
    match pat {
        Pat::Ident(pat) => {
            out.push(pat);
            if let Some((_, sub)) = &pat.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(pat) => pat.elems.iter().for_each(|elem| bindings(elem, out)),
        Pat::TupleStruct(pat) => pat.elems.iter().for_each(|elem| bindings(elem, out)),
        Pat::Slice(pat) => pat.elems.iter().for_each(|elem| bindings(elem, out)),
        Pat::Struct(pat) => pat
            .fields
            .iter()
            .for_each(|field| bindings(&field.pat, out)),
        Pat::Reference(pat) => bindings(&pat.pat, out),
        Pat::Paren(pat) => bindings(&pat.pat, out),
        Pat::Type(pat) => bindings(&pat.pat, out),
        _ => {}
    }
}
