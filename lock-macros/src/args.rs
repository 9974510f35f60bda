//! The attribute's arguments: `key = "..."`, `ttl = "..."`, `wait = "..."`, `guard = NAME`,
//! `crate = "path"`. Each is checked on its own here; checks against the function live in `validate`.

use crate::duration::{self, Kind};
use crate::errors::Errors;
use proc_macro2::{Span, TokenStream, TokenTree};
use std::time::Duration;
use syn::meta::ParseNestedMeta;
use syn::parse::{ParseStream, Parser as _};
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Path, Result};

const VALID: &str = "`key`, `ttl`, `wait`, `guard` and `crate`";

/// The arguments that parsed; every one that didn't has already reported why.
#[derive(Debug, Default)]
pub(crate) struct Args {
    /// The template as written; it is parsed against the function's parameters in `validate`.
    pub(crate) key: Option<LitStr>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) guard: Option<Ident>,
    /// `crate = "path"`: where the runtime lives, for re-exports.
    pub(crate) krate: Option<Path>,
}

/// One argument while parsing: whether it was given at all (even if invalid), and its value if valid.
struct Arg<T> {
    name: &'static str,
    seen: bool,
    value: Option<T>,
}

impl<T> Arg<T> {
    fn new(name: &'static str) -> Self {
        Arg {
            name,
            seen: false,
            value: None,
        }
    }

    /// Parses `= value` and stores it, rejecting a second occurrence. The value of a duplicate is still
    /// parsed so its own mistakes are reported too.
    fn set_once(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        parse: impl FnOnce(ParseStream<'_>) -> Result<T>,
    ) -> Result<()> {
        let duplicate = std::mem::replace(&mut self.seen, true);
        let value = parse(meta.value()?)?;
        if duplicate {
            return Err(meta.error(format_args!(
                "duplicate argument `{}`; it is already given earlier in this attribute, remove one",
                self.name
            )));
        }
        self.value = Some(value);
        Ok(())
    }
}

/// Parses the attribute's arguments, reporting every independent mistake into `errors`.
pub(crate) fn parse(attr: TokenStream, errors: &mut Errors) -> Args {
    let mut key = Arg::new("key");
    let mut ttl = Arg::new("ttl");
    let mut wait = Arg::new("wait");
    let mut guard = Arg::new("guard");
    let mut krate = Arg::new("crate");

    let parser = syn::meta::parser(|meta| {
        let name = meta.path.get_ident().map(Ident::to_string);
        let result = match name.as_deref() {
            Some("key") => {
                key.set_once(&meta, |input| string(input, "key", "\"wallet:<user_id>\""))
            }
            Some("ttl") => ttl.set_once(&meta, |input| duration(input, Kind::Ttl)),
            Some("wait") => wait.set_once(&meta, |input| duration(input, Kind::Wait)),
            Some("guard") => guard.set_once(&meta, guard_name),
            Some("crate") => krate.set_once(&meta, |input| {
                let lit = string(input, "crate", "\"my_facade::lock_runtime\"")?;
                lit.parse::<Path>().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        format_args!(
                            "`crate` must name the lock_runtime crate by path, like `crate = \
                             \"my_facade::lock_runtime\"`, not {:?}",
                            lit.value()
                        ),
                    )
                })
            }),
            _ => Err(syn::Error::new_spanned(
                &meta.path,
                format_args!(
                    "unknown argument `{}`; the arguments are {VALID}",
                    quote::ToTokens::to_token_stream(&meta.path)
                        .to_string()
                        .replace(' ', "")
                ),
            )),
        };
        if let Err(err) = result {
            errors.push(err);
            skip_to_next_argument(meta.input)?;
        }
        Ok(())
    });
    if let Err(err) = parser.parse2(attr) {
        errors.push(err);
    }

    if !key.seen {
        errors.push(syn::Error::new(
            Span::call_site(),
            "missing `key`; write e.g. `#[distributed_lock(key = \"wallet:<user_id>\")]`",
        ));
    }
    Args {
        key: key.value,
        ttl: ttl.value,
        wait: wait.value,
        guard: guard.value,
        krate: krate.value,
    }
}

/// A string literal value; anything else names the argument and shows what to write.
fn string(input: ParseStream<'_>, name: &str, example: &str) -> Result<LitStr> {
    match input.parse::<Expr>()? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        other => Err(syn::Error::new_spanned(
            other,
            format_args!("`{name}` takes a string literal, like `{name} = {example}`"),
        )),
    }
}

fn duration(input: ParseStream<'_>, kind: Kind) -> Result<Duration> {
    let lit = string(input, kind.name(), kind.example())?;
    duration::parse(&lit.value(), kind).map_err(|message| syn::Error::new(lit.span(), message))
}

/// `guard = lock`: a plain identifier, not a string or a path.
fn guard_name(input: ParseStream<'_>) -> Result<Ident> {
    let expr = input.parse::<Expr>()?;
    let ident = match &expr {
        Expr::Path(ExprPath {
            qself: None, path, ..
        }) => path.get_ident().filter(|ident| *ident != "self"),
        _ => None,
    };
    ident.cloned().ok_or_else(|| {
        syn::Error::new_spanned(
            &expr,
            "`guard` takes the name to bind the lock guard to, without quotes, like `guard = lock`",
        )
    })
}

/// After a bad argument, drops the rest of it (up to the `,` the meta parser expects) so the arguments
/// after it are still checked.
fn skip_to_next_argument(input: ParseStream<'_>) -> Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(punct) if punct.as_char() == ',') {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    })
}
