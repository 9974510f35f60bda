//! `#[async_trait]` methods. That attribute runs first and turns `async fn f(..) -> R { BODY }` into
//! `fn f(..) -> Pin<Box<dyn Future<Output = R> + Send + 'async_trait>> { Box::pin(async move { .. }) }`,
//! so the lock belongs inside that async block, with `R` as the result type (tracing-attributes
//! instruments the same block the same way).

use proc_macro2::TokenStream;
use quote::{ToTokens as _, quote};
use syn::parse::Parser as _;
use syn::{
    Block, Expr, ExprAsync, ExprCall, GenericArgument, Ident, Local, Pat, PathArguments,
    ReturnType, Signature, Stmt, Type, TypeParamBound,
};

/// A body ending in `Box::pin(async move { STMTS })`.
#[derive(Debug)]
pub(crate) struct Boxed {
    /// Statements before `Box::pin(..)`. They run when the fn is called, before the future exists,
    /// so they stay where they are, outside the lock.
    pub(crate) prefix: Vec<Stmt>,
    /// `Box::pin` as written.
    pub(crate) pin: Expr,
    /// The async block, emptied: `expand` puts the locked body back in.
    pub(crate) future: ExprAsync,
    /// The async block's leading `let x = x;` / `let __self = self;`: `#[async_trait]` moves the
    /// parameters into the block this way. A parameter used only by the key is then an unused
    /// rebinding, so `expand` reads each key parameter after these.
    pub(crate) rebinds: TokenStream,
    /// The pattern parameters, which `#[async_trait]` renames `__argN` in the signature and
    /// destructures among the rebindings. `expand` runs these before the keys are rendered, since
    /// a key may name what they bind.
    pub(crate) destructured: Vec<Destructured>,
    /// The rest of the async block's statements: the body that runs under the lock.
    pub(crate) stmts: TokenStream,
}

/// `let PAT = { let __argN = __argN; __argN };`
#[derive(Debug)]
pub(crate) struct Destructured {
    /// `__argN`: the parameter's name in the signature.
    pub(crate) arg: Ident,
    /// The statement, whose pattern is the parameter's as the user wrote it.
    pub(crate) local: Local,
}

/// `R` when a sync fn returns `Pin<Box<dyn Future<Output = R> ..>>` (by any path to `Pin`, `Box`
/// and `Future`).
pub(crate) fn future_output(sig: &Signature) -> Option<&Type> {
    if sig.asyncness.is_some() {
        return None;
    }
    let ReturnType::Type(_, ty) = &sig.output else {
        return None;
    };
    let boxed = only_type_argument(ty, "Pin")?;
    let Type::TraitObject(object) = peel(only_type_argument(boxed, "Box")?) else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound
            .path
            .segments
            .last()
            .filter(|seg| seg.ident == "Future")?;
        let PathArguments::AngleBracketed(args) = &future.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// Splits a boxed-future fn's body; anything but `Box::pin(async { .. })` last is an error that
/// says what is supported.
pub(crate) fn split(sig: &Signature, body: &TokenStream) -> syn::Result<Boxed> {
    let mut stmts = Block::parse_within.parse2(body.clone())?;
    // On a mismatch, the tokens to point at: the last expression, or the fn's name without one.
    let last = match stmts.pop() {
        Some(Stmt::Expr(expr, None)) => Ok(expr),
        Some(stmt) => Err(stmt.into_token_stream()),
        None => Err(sig.ident.to_token_stream()),
    };
    let found = match last {
        Ok(Expr::Call(ExprCall { func, args, .. })) if is_box_pin(&func) && args.len() == 1 => {
            match args.into_iter().next() {
                Some(Expr::Async(future)) => Ok((*func, future)),
                Some(arg) => Err(arg.into_token_stream()),
                None => Err(func.into_token_stream()),
            }
        }
        Ok(expr) => Err(expr.into_token_stream()),
        Err(tokens) => Err(tokens),
    };
    match found {
        Ok((pin, mut future)) => {
            let mut inner = std::mem::take(&mut future.block.stmts);
            let rest = inner.split_off(rebinds_end(&inner));
            let mut rebinds = Vec::new();
            let mut destructured = Vec::new();
            for stmt in inner {
                let arg = match &stmt {
                    Stmt::Local(local) => destructured_arg(local).cloned(),
                    _ => None,
                };
                match (arg, stmt) {
                    (Some(arg), Stmt::Local(local)) => {
                        destructured.push(Destructured { arg, local });
                    }
                    (_, stmt) => rebinds.push(stmt),
                }
            }
            Ok(Boxed {
                prefix: stmts,
                pin,
                future,
                rebinds: quote!(#(#rebinds)*),
                destructured,
                stmts: quote!(#(#rest)*),
            })
        }
        Err(tokens) => Err(unsupported(sig, tokens)),
    }
}

fn unsupported(sig: &Signature, tokens: TokenStream) -> syn::Error {
    let name = &sig.ident;
    syn::Error::new_spanned(
        tokens,
        format_args!(
            "`{name}` returns a boxed future that is not built by `Box::pin(async move {{ .. }})` \
             as its last expression, so #[distributed_lock] can't put the lock inside it; write \
             `async fn {name}` (native, or under #[async_trait], which generates that shape), or \
             end the body with `Box::pin(async move {{ .. }})`"
        ),
    )
}

/// Where the leading rebinding statements end, past `#[async_trait]`'s own fake return edge
/// (`if let Some(__ret) = None::<R> { return __ret; }`), which comes first.
fn rebinds_end(stmts: &[Stmt]) -> usize {
    let start = usize::from(matches!(stmts.first(), Some(Stmt::Expr(Expr::If(_), None))));
    let rebinds = stmts[start..]
        .iter()
        .take_while(|stmt| is_rebind(stmt))
        .count();
    if rebinds == 0 { 0 } else { start + rebinds }
}

/// A rebinding or a destructuring of a parameter, see [`Boxed`].
fn is_rebind(stmt: &Stmt) -> bool {
    let Stmt::Local(local) = stmt else {
        return false;
    };
    rebound(local).is_some() || destructured_arg(local).is_some()
}

/// `__argN` of `let PAT = { let __argN = __argN; __argN };`
fn destructured_arg(local: &Local) -> Option<&Ident> {
    let init = local.init.as_ref().filter(|init| init.diverge.is_none())?;
    let Expr::Block(block) = &*init.expr else {
        return None;
    };
    let [Stmt::Local(rebind), Stmt::Expr(Expr::Path(value), None)] = block.block.stmts.as_slice()
    else {
        return None;
    };
    let arg = rebound(rebind)?;
    (value.qself.is_none() && value.path.get_ident() == Some(arg)).then_some(arg)
}

/// `x` of `let [mut] x = x;` or `__self` of `let [mut] __self = self;`
fn rebound(local: &Local) -> Option<&Ident> {
    let (Pat::Ident(pat), Some(init)) = (&local.pat, &local.init) else {
        return None;
    };
    let Expr::Path(value) = &*init.expr else {
        return None;
    };
    let rebinds = init.diverge.is_none()
        && pat.subpat.is_none()
        && pat.by_ref.is_none()
        && value.qself.is_none()
        && value
            .path
            .get_ident()
            .is_some_and(|value| *value == pat.ident || (pat.ident == "__self" && value == "self"));
    rebinds.then_some(&pat.ident)
}

/// `Box::pin`, `std::boxed::Box::pin`, ...
fn is_box_pin(func: &Expr) -> bool {
    let Expr::Path(path) = func else {
        return false;
    };
    let mut segments = path.path.segments.iter().rev();
    matches!(
        (segments.next(), segments.next()),
        (Some(pin), Some(boxed)) if pin.ident == "pin" && boxed.ident == "Box"
    )
}

/// `T` of `Name<T>`.
fn only_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let last = path.path.segments.last().filter(|seg| seg.ident == name)?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut args = args.args.iter();
    match (args.next(), args.next()) {
        (Some(GenericArgument::Type(ty)), None) => Some(ty),
        _ => None,
    }
}

/// `(T)` and invisible groups (types passed through `macro_rules!`) are `T`.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Paren(inner) => peel(&inner.elem),
        Type::Group(inner) => peel(&inner.elem),
        ty => ty,
    }
}
