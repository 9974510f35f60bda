//! The attribute's arguments: `key = "..."` or `keys = ["...", ..]`, `ttl = "..."`, `wait = "..."`,
//! `max_hold = "..."`, `min_hold = "..."`, `reentrant = bool`, `fencing = bool`, `fair = bool`, `shared = bool`, `permits = N`,
//! `guard = NAME`, `map_err = path`, `crate = "path"`. Each is checked on its own here, then against each other
//! (`key` against `keys`, the lock kinds, `min_hold` against `max_hold` and the kinds); checks against the function live in `validate`.

use crate::duration::{self, Kind};
use crate::errors::Errors;
use lock_rules::{Mode, ModeError};
use proc_macro2::{Span, TokenStream, TokenTree};
use std::time::Duration;
use syn::meta::ParseNestedMeta;
use syn::parse::{ParseStream, Parser as _};
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Path, Result};

const VALID: &str = "`key`, `keys`, `ttl`, `wait`, `max_hold`, `min_hold`, `reentrant`, \
                     `fencing`, `fair`, `shared`, `permits`, `guard`, `map_err` and `crate`";

const KEYS_EXAMPLE: &str = "keys = [\"wallet:<from>\", \"wallet:<to>\"]";

/// The arguments that parsed; every one that didn't has already reported why.
#[derive(Debug, Default)]
pub(crate) struct Args {
    /// The key templates as written, in order: one for `key`, one or more for `keys`, never
    /// duplicated. They are parsed against the function's parameters in `validate`.
    pub(crate) keys: Option<Vec<LitStr>>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    /// `None` when not given: the default, reentrant.
    pub(crate) reentrant: Option<bool>,
    /// `None` when not given: the client's default (`LockConfig::fencing`).
    pub(crate) fencing: Option<bool>,
    /// The lock's kind, from `fair = true`, `shared = true` and `permits = N`.
    pub(crate) mode: Mode,
    pub(crate) guard: Option<Ident>,
    /// `map_err = path`: the `fn(LockError) -> E` that makes the call's error of a lock failure.
    pub(crate) map_err: Option<ExprPath>,
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
    let mut keys = Arg::new("keys");
    let mut ttl = Arg::new("ttl");
    let mut wait = Arg::new("wait");
    let mut max_hold = Arg::new("max_hold");
    let mut min_hold = Arg::new("min_hold");
    let mut reentrant = Arg::new("reentrant");
    let mut fencing = Arg::new("fencing");
    let mut fair = Arg::new("fair");
    let mut shared = Arg::new("shared");
    let mut permits = Arg::new("permits");
    let mut guard = Arg::new("guard");
    let mut map_err = Arg::new("map_err");
    let mut krate = Arg::new("crate");

    // `key` and `keys` both given: the second of them, to be removed.
    let mut both = None;

    let parser = syn::meta::parser(|meta| {
        let name = meta.path.get_ident().map(Ident::to_string);
        let other = match name.as_deref() {
            Some("key") => keys.seen,
            Some("keys") => key.seen,
            _ => false,
        };
        if other && both.is_none() {
            both = Some(meta.path.clone());
        }
        let result = match name.as_deref() {
            Some("key") => {
                key.set_once(&meta, |input| string(input, "key", "\"wallet:<user_id>\""))
            }
            Some("keys") => keys.set_once(&meta, templates),
            Some("ttl") => ttl.set_once(&meta, |input| duration(input, Kind::Ttl)),
            Some("wait") => wait.set_once(&meta, |input| duration(input, Kind::Wait)),
            Some("max_hold") => max_hold.set_once(&meta, |input| duration(input, Kind::MaxHold)),
            Some("min_hold") => min_hold.set_once(&meta, |input| {
                let span = input.span();
                duration(input, Kind::MinHold).map(|d| (d, span))
            }),
            Some("reentrant") => reentrant.set_once(&meta, |input| boolean(input, "reentrant")),
            Some("fencing") => fencing.set_once(&meta, |input| boolean(input, "fencing")),
            Some("fair") => fair.set_once(&meta, |input| spanned_boolean(input, "fair")),
            Some("shared") => shared.set_once(&meta, |input| spanned_boolean(input, "shared")),
            Some("permits") => permits.set_once(&meta, permit_count),
            Some("guard") => guard.set_once(&meta, guard_name),
            Some("map_err") => map_err.set_once(&meta, conversion),
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

    let keys = match (key.seen, keys.seen) {
        (false, false) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                format_args!(
                    "missing `key`; write e.g. `#[distributed_lock(key = \"wallet:<user_id>\")]`, \
                     or `{KEYS_EXAMPLE}` to lock several keys at once"
                ),
            ));
            None
        }
        (true, true) => {
            errors.push(syn::Error::new_spanned(
                both,
                "`key` and `keys` are both given; write `key = \"..\"` for one key or \
                 `keys = [..]` for several, not both",
            ));
            None
        }
        (true, false) => key.value.map(|lit| vec![lit]),
        (false, true) => keys.value,
    };
    let mode = check_kinds(
        &keys,
        fair.value.filter(|f| f.0),
        shared.value.filter(|s| s.0),
        permits.value,
        errors,
    );
    let kind = mode.takes_one_key().then(|| mode.argument());
    check_min_hold(min_hold.value, max_hold.value, kind, errors);
    Args {
        mode,
        keys,
        ttl: ttl.value,
        wait: wait.value,
        max_hold: max_hold.value,
        min_hold: min_hold.value.map(|(d, _)| d),
        reentrant: reentrant.value,
        fencing: fencing.value,
        guard: guard.value,
        map_err: map_err.value,
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

/// `keys = ["wallet:<from>", "wallet:<to>"]`: a non-empty array of distinct string literals. Every
/// bad element is reported, each on its own span.
fn templates(input: ParseStream<'_>) -> Result<Vec<LitStr>> {
    let expr = input.parse::<Expr>()?;
    let Expr::Array(array) = expr else {
        return Err(syn::Error::new_spanned(
            expr,
            format_args!("`keys` takes a list of key templates, like `{KEYS_EXAMPLE}`"),
        ));
    };
    if array.elems.is_empty() {
        return Err(syn::Error::new_spanned(
            array,
            format_args!(
                "`keys` is empty, so there is nothing to lock; list the key templates, like \
                 `{KEYS_EXAMPLE}`"
            ),
        ));
    }
    let mut errors = Errors::default();
    let mut lits: Vec<LitStr> = Vec::new();
    for elem in array.elems {
        match elem {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => {
                if lits.iter().any(|seen| seen.value() == lit.value()) {
                    errors.push(syn::Error::new(
                        lit.span(),
                        format_args!(
                            "duplicate key template {:?} in `keys`; each template is locked once, \
                             remove one",
                            lit.value()
                        ),
                    ));
                }
                lits.push(lit);
            }
            other => errors.push(syn::Error::new_spanned(
                other,
                format_args!(
                    "each element of `keys` is a key template string literal, like \
                     `{KEYS_EXAMPLE}`"
                ),
            )),
        }
    }
    if errors.is_empty() {
        Ok(lits)
    } else {
        Err(errors.into_error())
    }
}

/// `fair`, `shared` and `permits` against each other (by [`Mode::from_flags`], the runtime's rule,
/// with every clash reported at its argument) and against `keys`: a semaphore is already shared,
/// fairness is for exclusive locks, and all three take one key. The mode they make (the default
/// when they clash: an error was reported, so nothing is expanded).
fn check_kinds(
    keys: &Option<Vec<LitStr>>,
    fair: Option<(bool, Span)>,
    shared: Option<(bool, Span)>,
    permits: Option<(u32, Span)>,
    errors: &mut Errors,
) -> Mode {
    if let (Some((_, at)), Some(_)) = (shared, permits) {
        errors.push(syn::Error::new(
            at,
            format_args!(
                "`shared` {}; write `permits = N` for up to N holders, or `shared = true` for a \
                 read lock",
                ModeError::SharedWithPermits
            ),
        ));
    }
    if let Some((_, at)) = fair.filter(|_| shared.is_some() || permits.is_some()) {
        errors.push(syn::Error::new(
            at,
            format_args!("`fair` {}", ModeError::FairWithOthers),
        ));
    }
    let mode = Mode::from_flags(fair.is_some(), shared.is_some(), permits.map(|(n, _)| n))
        .unwrap_or_default();
    let at = match mode {
        Mode::Permits(_) => permits.map(|(_, at)| at),
        Mode::Shared => shared.map(|(_, at)| at),
        Mode::Fair => fair.map(|(_, at)| at),
        Mode::Exclusive => None,
    };
    if let (Some(keys), Some(at)) = (keys, at)
        && keys.len() > 1
    {
        errors.push(syn::Error::new(
            at,
            format_args!(
                "`{}` locks take one key, but `keys` lists {}; lock one key with \
                     `key = \"..\"`",
                mode.argument(),
                keys.len()
            ),
        ));
    }
    mode
}

/// `min_hold` against `max_hold` (it must fit in it) and the lock's kind (`kind`: `fair`,
/// `shared` or `permits` when one of them is asked for): it keeps an exclusive lock. A zero
/// `min_hold` asks for nothing, so it clashes with nothing.
fn check_min_hold(
    min_hold: Option<(Duration, Span)>,
    max_hold: Option<Duration>,
    kind: Option<&str>,
    errors: &mut Errors,
) {
    let Some((min_hold, at)) = min_hold.filter(|(d, _)| !d.is_zero()) else {
        return;
    };
    if let Some(max_hold) = max_hold.filter(|max| *max < min_hold) {
        errors.push(syn::Error::new(
            at,
            format_args!(
                "`min_hold` ({}) is longer than `max_hold` ({}): no call may hold the lock that \
                 long; shorten `min_hold` or lengthen `max_hold`",
                humantime::format_duration(min_hold),
                humantime::format_duration(max_hold)
            ),
        ));
    }
    if let Some(kind) = kind {
        errors.push(syn::Error::new(
            at,
            format_args!(
                "`min_hold` applies to exclusive locks; it cannot be combined with `{kind}`"
            ),
        ));
    }
}

/// `fair = true`: a bool literal, and where it was written.
fn spanned_boolean(input: ParseStream<'_>, name: &str) -> Result<(bool, Span)> {
    let span = input.span();
    boolean(input, name).map(|value| (value, span))
}

/// `permits = 3`: an integer literal of at least 1.
fn permit_count(input: ParseStream<'_>) -> Result<(u32, Span)> {
    let expr = input.parse::<Expr>()?;
    let Expr::Lit(ExprLit {
        lit: Lit::Int(lit), ..
    }) = &expr
    else {
        return Err(syn::Error::new_spanned(
            expr,
            "`permits` takes the number of holders allowed at once, like `permits = 3`",
        ));
    };
    match lit.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            lit.span(),
            "`permits = 0` would let nobody in; it must be at least 1",
        )),
        Ok(n) => Ok((n, lit.span())),
        Err(_) => Err(syn::Error::new(
            lit.span(),
            format_args!("`permits` must be a whole number from 1 to {}", u32::MAX),
        )),
    }
}

/// `reentrant = false`: a bool literal.
fn boolean(input: ParseStream<'_>, name: &str) -> Result<bool> {
    match input.parse::<Expr>()? {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => Ok(lit.value),
        other => Err(syn::Error::new_spanned(
            other,
            format_args!("`{name}` takes `true` or `false`, like `{name} = false`"),
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

/// `map_err = to_status`: the path of a function (or of an associated function, a tuple
/// struct or variant) that takes a `LockError`; its type is checked where the expansion calls it.
fn conversion(input: ParseStream<'_>) -> Result<ExprPath> {
    match input.parse::<Expr>()? {
        Expr::Path(path) => Ok(path),
        other => Err(syn::Error::new_spanned(
            other,
            "`map_err` takes the path of a function `fn(LockError) -> E` that makes your error \
             type of a lock failure, like `map_err = to_status` or `map_err = MyError::Lock`",
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::{Args, parse};
    use crate::errors::Errors;
    use lock_rules::Mode;
    use proc_macro2::TokenStream;
    use quote::quote;
    use std::time::Duration;

    fn args(attr: TokenStream) -> (Args, Vec<String>) {
        let mut errors = Errors::default();
        let args = parse(attr, &mut errors);
        let messages = if errors.is_empty() {
            Vec::new()
        } else {
            errors
                .into_error()
                .into_iter()
                .map(|err| err.to_string())
                .collect()
        };
        (args, messages)
    }

    fn templates(args: &Args) -> Option<Vec<String>> {
        let keys = args.keys.as_ref()?;
        Some(keys.iter().map(syn::LitStr::value).collect())
    }

    #[test]
    fn key_is_one_template_and_keys_keep_their_order() {
        let (parsed, errors) = args(quote!(key = "wallet:<id>"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(templates(&parsed), Some(vec!["wallet:<id>".to_owned()]));

        let (parsed, errors) = args(quote!(keys = ["w:<to>", "w:<from>",]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            templates(&parsed),
            Some(vec!["w:<to>".to_owned(), "w:<from>".to_owned()])
        );
    }

    #[test]
    fn exactly_one_of_key_and_keys() {
        let (parsed, errors) = args(quote!(keys = ["a:<x>"], key = "a:<x>"));
        assert_eq!(templates(&parsed), None);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`key` and `keys` are both given"));

        let (_, errors) = args(quote!(ttl = "1s"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("missing `key`"), "{errors:?}");
        assert!(errors[0].contains("`keys = ["), "{errors:?}");
    }

    #[test]
    fn bad_keys_lists() {
        let (_, errors) = args(quote!(keys = []));
        assert!(errors[0].starts_with("`keys` is empty"), "{errors:?}");
        let (_, errors) = args(quote!(keys = "a:<x>"));
        assert!(errors[0].starts_with("`keys` takes a list"), "{errors:?}");
        // Every bad element is reported, and the arguments after the list are still checked.
        let (parsed, errors) = args(quote!(keys = ["a:<x>", x, "a:<x>", 3], wait = "1s"));
        assert_eq!(templates(&parsed), None);
        assert_eq!(parsed.wait, Some(Duration::from_secs(1)));
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with("each element of `keys`"),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("duplicate key template \"a:<x>\""),
            "{errors:?}"
        );
        assert!(
            errors[2].starts_with("each element of `keys`"),
            "{errors:?}"
        );
    }

    #[test]
    fn reentrant_and_max_hold() {
        let (parsed, errors) = args(quote!(key = "k", reentrant = false, max_hold = "2m"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(parsed.reentrant, Some(false));
        assert_eq!(parsed.max_hold, Some(Duration::from_secs(120)));

        let (parsed, _) = args(quote!(key = "k"));
        assert_eq!((parsed.reentrant, parsed.max_hold), (None, None));

        let (_, errors) = args(quote!(key = "k", reentrant = 1, max_hold = "0s"));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("`reentrant` takes `true` or `false`"));
        assert!(errors[1].starts_with("`max_hold` can't be zero"));
    }

    #[test]
    fn min_hold_fits_in_max_hold_and_keeps_exclusive_locks() {
        let (parsed, errors) = args(quote!(key = "k", min_hold = "30s", max_hold = "1m"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(parsed.min_hold, Some(Duration::from_secs(30)));
        let (_, errors) = args(quote!(key = "k", max_hold = "10s", min_hold = "30s"));
        assert_eq!(
            errors,
            [
                "`min_hold` (30s) is longer than `max_hold` (10s): no call may hold the lock that \
                 long; shorten `min_hold` or lengthen `max_hold`"
            ]
        );
        let (_, errors) = args(quote!(key = "k", min_hold = "1s", fair = true));
        assert_eq!(
            errors,
            ["`min_hold` applies to exclusive locks; it cannot be combined with `fair`"]
        );
        // Zero asks for nothing, and clashes with nothing.
        let (parsed, errors) = args(quote!(
            key = "k",
            min_hold = "0s",
            max_hold = "1s",
            shared = true
        ));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(parsed.min_hold, Some(Duration::ZERO));
    }

    #[test]
    fn map_err_takes_a_path() {
        let (parsed, errors) = args(quote!(key = "k", map_err = errors::to_status));
        assert!(errors.is_empty(), "{errors:?}");
        let path = parsed
            .map_err
            .map(|p| quote::ToTokens::to_token_stream(&p).to_string());
        assert_eq!(path.as_deref(), Some("errors :: to_status"));
        let (parsed, errors) = args(quote!(key = "k", map_err = "to_status"));
        assert!(parsed.map_err.is_none());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("`map_err` takes the path of a function"),
            "{errors:?}"
        );
        let (_, errors) = args(quote!(key = "k", map_err = a, map_err = b));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("duplicate argument `map_err`"),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_argument_lists_the_new_ones() {
        let (_, errors) = args(quote!(key = "k", timeout = "1s"));
        assert_eq!(
            errors,
            [
                "unknown argument `timeout`; the arguments are `key`, `keys`, `ttl`, `wait`, \
              `max_hold`, `min_hold`, `reentrant`, `fencing`, `fair`, `shared`, `permits`, \
              `guard`, `map_err` and `crate`"
            ]
        );
    }

    #[test]
    fn kinds_clash_exactly_when_the_runtime_rule_says_so() {
        for fair in [false, true] {
            for shared in [false, true] {
                for permits in [None, Some(2)] {
                    let mut attr = quote!(key = "k", fair = #fair, shared = #shared);
                    if let Some(n) = permits {
                        attr.extend(quote!(, permits = #n));
                    }
                    let (parsed, errors) = args(attr);
                    match Mode::from_flags(fair, shared, permits) {
                        Ok(mode) => {
                            assert!(errors.is_empty(), "{fair} {shared} {permits:?}: {errors:?}");
                            assert_eq!(parsed.mode, mode);
                        }
                        Err(err) => assert!(
                            errors.iter().any(|e| e.contains(&err.to_string())),
                            "{fair} {shared} {permits:?}: {errors:?} lacks {err}"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn lock_kinds() {
        let (parsed, errors) = args(quote!(key = "k", permits = 3));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(parsed.mode, Mode::Permits(3));
        let (parsed, errors) = args(quote!(key = "k", fair = true, shared = false));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(parsed.mode, Mode::Fair);

        let (_, errors) = args(quote!(key = "k", permits = 0));
        assert!(
            errors[0].starts_with("`permits = 0` would let nobody in"),
            "{errors:?}"
        );
        let (_, errors) = args(quote!(key = "k", permits = "3"));
        assert!(
            errors[0].starts_with("`permits` takes the number"),
            "{errors:?}"
        );
        let (_, errors) = args(quote!(key = "k", shared = true, permits = 2));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`shared` cannot be combined with `permits`"));
        let (_, errors) = args(quote!(key = "k", fair = true, shared = true));
        assert!(
            errors[0].starts_with("`fair` is for exclusive locks"),
            "{errors:?}"
        );
        let (_, errors) = args(quote!(keys = ["a", "b"], shared = true));
        assert!(
            errors[0].starts_with("`shared` locks take one key"),
            "{errors:?}"
        );
        // `false` asks for nothing.
        let (_, errors) = args(quote!(keys = ["a", "b"], fair = false));
        assert!(errors.is_empty(), "{errors:?}");
    }
}
