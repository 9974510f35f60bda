//! The key template language.
//!
//! - `<name>` interpolates the parameter `name` by `Display`; `<name.field.0>` a field path below it;
//!   `<self>` and `<self.field>` the receiver of a method.
//! - Everything else is literal text, including `{` and `}` (Redis Cluster hash tags: `{wallet}:<id>`).
//! - `<<` and `>>` write a literal `<` and `>`. A lone `>` is an error rather than text: it is almost
//!   always a forgotten `<` (`"wallet:user_id>"`), and a silently wrong key is a silently broken lock.
//! - `<name>` may also be a name bound inside a parameter's pattern, as `#[instrument]` records them:
//!   `Path((user, amount)): Path<(u64, i64)>` binds `user` and `amount`, `Point { x, y: why }` binds
//!   `x` and `why`. What `..` or `_` leaves unbound is not a name, so it is not found.
//!
//! Parsing needs the function's parameters ([`Scope`]) so that every message can list them, and
//! name the one a misspelt placeholder most likely meant.

use proc_macro2::{Ident, Span};
use std::ops::Range;
use syn::ext::IdentExt as _;
use syn::parse::Parser as _;
use syn::{LitStr, Member};

/// The names a template may refer to.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    /// Parameters bound to a plain name, in declaration order.
    pub(crate) params: Vec<Ident>,
    /// Names bound inside pattern parameters (`user` of `Path((user, amount))`), in declaration
    /// order. Templates use them as they use parameters; messages list them apart.
    pub(crate) pattern_bindings: Vec<Ident>,
    /// Whether the function is a method with a `self` receiver.
    pub(crate) receiver: bool,
}

/// One piece of a parsed template.
#[derive(Debug)]
pub(crate) enum Part {
    /// Literal text, unescaped (`<<` already turned into `<`).
    Text(String),
    /// `<root.fields..>`, rendered by `Display`.
    Value { root: Root, fields: Vec<Field> },
}

/// One `.field` of a placeholder.
#[derive(Debug)]
pub(crate) struct Field {
    pub(crate) member: Member,
    /// The bytes of its name in the template: rustc checks fields, not this crate, and its errors
    /// (no such field, private field) belong on the name.
    pub(crate) range: Range<usize>,
}

#[derive(Debug)]
pub(crate) enum Root {
    SelfValue,
    /// A parameter, or a name bound by a parameter's pattern: its identifier as declared.
    Param(Ident),
}

/// A problem in the template: the byte range of the offending text in the template, and the message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Error {
    pub(crate) range: Range<usize>,
    pub(crate) message: String,
}

/// Parses `template`, resolving placeholders against `scope`. Reports every problem, not just the first.
pub(crate) fn parse(template: &str, scope: &Scope) -> Result<Vec<Part>, Vec<Error>> {
    if template.is_empty() {
        return Err(vec![Error {
            range: 0..0,
            message: "the key template is empty; write e.g. `key = \"wallet:<user_id>\"`".into(),
        }]);
    }
    let mut parts = Vec::new();
    let mut errors = Vec::new();
    let mut text = String::new();
    let mut rest = template.char_indices().peekable();
    while let Some((start, ch)) = rest.next() {
        match ch {
            '<' if rest.next_if(|&(_, next)| next == '<').is_some() => text.push('<'),
            '>' if rest.next_if(|&(_, next)| next == '>').is_some() => text.push('>'),
            '>' => errors.push(Error {
                range: start..start + 1,
                message: "unmatched `>` in the key; placeholders look like `<user_id>`, and a \
                          literal `>` is written `>>`"
                    .into(),
            }),
            '<' => {
                // The placeholder ends at the next `>`; a `<` or the end of the string first means
                // it was never closed.
                let mut end = None;
                while let Some(&(index, next)) = rest.peek() {
                    if next == '<' {
                        break;
                    }
                    rest.next();
                    if next == '>' {
                        end = Some(index);
                        break;
                    }
                }
                let Some(end) = end else {
                    let stop = rest.peek().map_or(template.len(), |&(index, _)| index);
                    errors.push(Error {
                        range: start..stop,
                        message: format!(
                            "unterminated placeholder `{}` in the key; close it with `>`, or write \
                             `<<` for a literal `<`",
                            &template[start..stop],
                        ),
                    });
                    continue;
                };
                let range = start..end + 1;
                match placeholder(&template[start + 1..end], start + 1, scope) {
                    Ok(part) => {
                        if !text.is_empty() {
                            parts.push(Part::Text(std::mem::take(&mut text)));
                        }
                        parts.push(part);
                    }
                    Err(message) => errors.push(Error { range, message }),
                }
            }
            _ => text.push(ch),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    if errors.is_empty() {
        Ok(parts)
    } else {
        Err(errors)
    }
}

/// Resolves the inside of `<...>`, which starts at byte `offset` of the template.
fn placeholder(inner: &str, offset: usize, scope: &Scope) -> Result<Part, String> {
    let written = format!("<{inner}>");
    if inner.is_empty() {
        return Err(format!(
            "empty placeholder `<>` in the key; write a parameter name inside, like `<{}>` ({})",
            example_name(scope),
            describe_scope(scope),
        ));
    }
    let mut segments = inner.split('.');
    let root = segments.next().unwrap_or_default();
    let root_ident = Ident::parse_any.parse_str(root);
    let mut end = offset + root.len();
    let fields: Option<Vec<Field>> = segments
        .map(|segment| {
            let start = end + 1;
            end = start + segment.len();
            let member = syn::parse_str::<Member>(segment).ok()?;
            let name = start + (segment.len() - segment.trim_start().len());
            Some(Field {
                member,
                range: name..name + segment.trim().len(),
            })
        })
        .collect();
    let (Ok(root_ident), Some(fields)) = (root_ident, fields) else {
        if inner.contains('(') {
            return Err(format!(
                "invalid placeholder `{written}` in the key; placeholders read parameters and \
                 their fields but can't call methods; pass the value as a parameter, or add a \
                 field ({})",
                describe_scope(scope),
            ));
        }
        return Err(format!(
            "invalid placeholder `{written}` in the key; write a parameter name, optionally \
             followed by `.field`s, like `<{name}>` or `<{name}.id>` ({})",
            describe_scope(scope),
            name = example_name(scope),
        ));
    };
    let root = if root_ident == "self" {
        if !scope.receiver {
            return Err(format!(
                "`{written}` in the key, but this function has no `self` receiver; `<self>` and \
                 `<self.field>` work in methods taking `self`, `&self` or `&mut self` ({})",
                describe_scope(scope),
            ));
        }
        Root::SelfValue
    } else {
        let wanted = root_ident.unraw();
        let found = scope
            .params
            .iter()
            .chain(&scope.pattern_bindings)
            .find(|param| param.unraw() == wanted);
        match found {
            Some(param) => Root::Param(param.clone()),
            None => {
                let what = if scope.pattern_bindings.is_empty() {
                    "parameter"
                } else {
                    "name"
                };
                let hint = nearest(&wanted.to_string(), scope)
                    .map(|name| format!("; did you mean `{name}`?"))
                    .unwrap_or_default();
                return Err(format!(
                    "unknown {what} `{wanted}` in key placeholder `{written}`{hint} ({})",
                    describe_scope(scope),
                ));
            }
        }
    };
    Ok(Part::Value { root, fields })
}

/// The name in `scope` that `wanted` most likely misspells, as rustc picks one for its "a local
/// variable with a similar name exists": the same name in another case, else the closest within
/// a third of its length in edits. Never one that shares nothing with it (`x` for `y`).
fn nearest(wanted: &str, scope: &Scope) -> Option<String> {
    let names: Vec<String> = scope
        .receiver
        .then(|| "self".to_owned())
        .into_iter()
        .chain(
            scope
                .params
                .iter()
                .chain(&scope.pattern_bindings)
                .map(|ident| ident.unraw().to_string()),
        )
        .collect();
    if let Some(name) = names.iter().find(|name| name.eq_ignore_ascii_case(wanted)) {
        return Some(name.clone());
    }
    let len = wanted.chars().count();
    let limit = (len.max(3) / 3).min(len.saturating_sub(1));
    names
        .into_iter()
        .map(|name| (distance(wanted, &name), name))
        .filter(|(edits, _)| *edits <= limit)
        .min_by_key(|(edits, _)| *edits)
        .map(|(_, name)| name)
}

/// Edits (insert, delete, replace, or swap two neighbours) from `a` to `b`: the optimal string
/// alignment distance, rustc's measure for similar names.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // `rows[i][j]`: the distance from `a[..i]` to `b[..j]`.
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let replace = rows[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1]);
            let mut edits = replace.min(rows[i - 1][j] + 1).min(rows[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                edits = edits.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = edits;
        }
    }
    rows[a.len()][b.len()]
}

/// The span of `range` (bytes of the template) inside `lit`, where the compiler can say (nightly).
/// Only plain literals without escapes map byte-for-byte.
pub(crate) fn subspan(lit: &LitStr, range: Range<usize>) -> Option<Span> {
    let token = lit.token();
    let source = token.to_string();
    let offset = source.find('"')?;
    let raw = source.starts_with('r');
    if !raw && source.contains('\\') {
        return None;
    }
    let start = offset + 1 + range.start;
    let end = (offset + 1 + range.end).max(start + 1);
    token.subspan(start..end)
}

/// "the parameters are `self`, `user_id`, `amount`", then "the names bound by parameter patterns
/// are `user`, `amount`" when there are any, for the end of every message.
fn describe_scope(scope: &Scope) -> String {
    let quoted = |idents: &[Ident]| -> Vec<String> {
        idents
            .iter()
            .map(|ident| format!("`{}`", ident.unraw()))
            .collect()
    };
    let params: Vec<String> = scope
        .receiver
        .then(|| "`self`".to_owned())
        .into_iter()
        .chain(quoted(&scope.params))
        .collect();
    let params = listed(&params, "the only parameter is", "the parameters are");
    let bound = listed(
        &quoted(&scope.pattern_bindings),
        "the only name bound by a parameter pattern is",
        "the names bound by parameter patterns are",
    );
    match (params, bound) {
        (None, None) => "this function has no parameters a key can use".to_owned(),
        (Some(one), None) | (None, Some(one)) => one,
        (Some(params), Some(bound)) => format!("{params}; {bound}"),
    }
}

/// "{one} `a`" or "{many} `a`, `b`"; `None` without names.
fn listed(names: &[String], one: &str, many: &str) -> Option<String> {
    match names {
        [] => None,
        [name] => Some(format!("{one} {name}")),
        _ => Some(format!("{many} {}", names.join(", "))),
    }
}

/// A name from `scope` to show in examples: the first parameter, else the first pattern-bound
/// name, else `self`.
fn example_name(scope: &Scope) -> String {
    match scope.params.first().or(scope.pattern_bindings.first()) {
        Some(param) => param.unraw().to_string(),
        None if scope.receiver => "self".to_owned(),
        None => "user_id".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, Part, Root, Scope, parse};
    use proc_macro2::{Ident, Span};

    fn ident(name: &str) -> Ident {
        match name.strip_prefix("r#") {
            Some(raw) => Ident::new_raw(raw, Span::call_site()),
            None => Ident::new(name, Span::call_site()),
        }
    }

    fn scope(params: &[&str], receiver: bool) -> Scope {
        Scope {
            params: params.iter().map(|name| ident(name)).collect(),
            pattern_bindings: Vec::new(),
            receiver,
        }
    }

    /// `scope` plus names bound inside pattern parameters.
    fn with_patterns(mut scope: Scope, bound: &[&str]) -> Scope {
        scope.pattern_bindings = bound.iter().map(|name| ident(name)).collect();
        scope
    }

    /// Renders parts back to a canonical form: text as-is, values as `{root.field}`.
    fn render(template: &str, scope: &Scope) -> String {
        match parse(template, scope) {
            Ok(parts) => parts
                .iter()
                .map(|part| match part {
                    Part::Text(text) => format!("[{text}]"),
                    Part::Value { root, fields } => {
                        let root = match root {
                            Root::SelfValue => "self".to_owned(),
                            Root::Param(ident) => ident.to_string(),
                        };
                        let fields: String = fields
                            .iter()
                            .map(|field| match &field.member {
                                syn::Member::Named(ident) => format!(".{ident}"),
                                syn::Member::Unnamed(index) => format!(".{}", index.index),
                            })
                            .collect();
                        format!("{{{root}{fields}}}")
                    }
                })
                .collect(),
            Err(errors) => panic!("{template:?} failed: {errors:?}"),
        }
    }

    fn errors(template: &str, scope: &Scope) -> Vec<Error> {
        match parse(template, scope) {
            Ok(parts) => panic!("{template:?} parsed as {parts:?}, expected errors"),
            Err(errors) => errors,
        }
    }

    fn error(template: &str, scope: &Scope) -> Error {
        let mut errors = errors(template, scope);
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors.remove(0)
    }

    #[test]
    fn text_and_placeholders() {
        let s = scope(&["user_id", "order"], false);
        assert_eq!(render("wallet:<user_id>", &s), "[wallet:]{user_id}");
        assert_eq!(render("<user_id>", &s), "{user_id}");
        assert_eq!(
            render("o:<order.customer.id>:<order.0>!", &s),
            "[o:]{order.customer.id}[:]{order.0}[!]"
        );
        assert_eq!(render("<user_id><order>", &s), "{user_id}{order}");
        assert_eq!(render("static", &s), "[static]");
    }

    #[test]
    fn braces_pass_through_as_text() {
        let s = scope(&["user_id"], false);
        assert_eq!(render("{wallet}:<user_id>", &s), "[{wallet}:]{user_id}");
        assert_eq!(render("{<user_id>}", &s), "[{]{user_id}[}]");
    }

    #[test]
    fn doubled_angle_brackets_are_literal() {
        let s = scope(&["x"], false);
        assert_eq!(render("a<<b>>c", &s), "[a<b>c]");
        assert_eq!(render("<<<x>>>", &s), "[<]{x}[>]");
    }

    #[test]
    fn self_needs_a_receiver() {
        let method = scope(&["id"], true);
        assert_eq!(
            render("<self.shop.id>:<id>", &method),
            "{self.shop.id}[:]{id}"
        );
        assert_eq!(render("<self>", &method), "{self}");

        let free = scope(&["id"], false);
        let err = error("k:<self.shop>", &free);
        assert_eq!(err.range, 2..13);
        assert_eq!(
            err.message,
            "`<self.shop>` in the key, but this function has no `self` receiver; `<self>` and \
             `<self.field>` work in methods taking `self`, `&self` or `&mut self` (the only \
             parameter is `id`)"
        );
    }

    #[test]
    fn unknown_parameter_lists_the_parameters() {
        let err = error("wallet:<usr_id.name>", &scope(&["user_id", "amount"], true));
        assert_eq!(err.range, 7..20);
        assert_eq!(
            err.message,
            "unknown parameter `usr_id` in key placeholder `<usr_id.name>`; did you mean \
             `user_id`? (the parameters are `self`, `user_id`, `amount`)"
        );
        let err = error("<x>", &scope(&[], false));
        assert!(
            err.message
                .ends_with("(this function has no parameters a key can use)"),
            "{err:?}"
        );
    }

    #[test]
    fn unknown_names_suggest_the_nearest() {
        let hint = |template: &str, s: &Scope| {
            let message = error(template, s).message;
            let (_, rest) = message.split_once("did you mean `")?;
            rest.split_once('`').map(|(name, _)| name.to_owned())
        };
        let s = with_patterns(scope(&["user_id", "shard", "r#type"], true), &["amount"]);
        assert_eq!(hint("<usr_id>", &s).as_deref(), Some("user_id"));
        // A swap of neighbours is one edit, as for rustc.
        assert_eq!(hint("<shrad>", &s).as_deref(), Some("shard"));
        assert_eq!(hint("<User_Id>", &s).as_deref(), Some("user_id"));
        assert_eq!(hint("<slf.id>", &s).as_deref(), Some("self"));
        assert_eq!(hint("<amout>", &s).as_deref(), Some("amount"));
        assert_eq!(hint("<typ>", &s).as_deref(), Some("type"));
        // Too far, or nothing in common: no guess.
        assert_eq!(hint("<uid>", &s), None);
        assert_eq!(hint("<y>", &scope(&["x"], false)), None);
        assert_eq!(hint("<x>", &scope(&[], false)), None);
    }

    #[test]
    fn field_ranges_locate_each_name() {
        let template = "o:<order.customer.0>:<self. id>";
        let parts = match parse(template, &scope(&["order"], true)) {
            Ok(parts) => parts,
            Err(errors) => panic!("{errors:?}"),
        };
        let names: Vec<&str> = parts
            .iter()
            .flat_map(|part| match part {
                Part::Value { fields, .. } => fields.as_slice(),
                Part::Text(_) => &[],
            })
            .map(|field| &template[field.range.clone()])
            .collect();
        assert_eq!(names, ["customer", "0", "id"]);
    }

    #[test]
    fn pattern_bindings_are_names_too() {
        let s = with_patterns(scope(&["id"], true), &["app", "user", "r#ref"]);
        assert_eq!(
            render("w:<app.tenant>:<user>:<ref>:<id>:<self.0>", &s),
            "[w:]{app.tenant}[:]{user}[:]{r#ref}[:]{id}[:]{self.0}"
        );
        let err = error("w:<amount>", &s);
        assert_eq!(err.range, 2..10);
        assert_eq!(
            err.message,
            "unknown name `amount` in key placeholder `<amount>` (the parameters are `self`, \
             `id`; the names bound by parameter patterns are `app`, `user`, `ref`)"
        );
    }

    #[test]
    fn pattern_bindings_alone() {
        let s = with_patterns(scope(&[], false), &["user"]);
        assert_eq!(
            error("<>", &s).message,
            "empty placeholder `<>` in the key; write a parameter name inside, like `<user>` (the \
             only name bound by a parameter pattern is `user`)"
        );
        assert_eq!(
            error("<y>", &s).message,
            "unknown name `y` in key placeholder `<y>` (the only name bound by a parameter \
             pattern is `user`)"
        );
    }

    #[test]
    fn raw_identifiers_match_either_way() {
        let s = scope(&["r#type"], false);
        assert_eq!(render("<type>", &s), "{r#type}");
        assert_eq!(render("<r#type>", &s), "{r#type}");
    }

    #[test]
    fn empty_placeholder() {
        let err = error("a<>b", &scope(&["user_id"], false));
        assert_eq!(err.range, 1..3);
        assert_eq!(
            err.message,
            "empty placeholder `<>` in the key; write a parameter name inside, like `<user_id>` \
             (the only parameter is `user_id`)"
        );
    }

    #[test]
    fn unterminated_placeholder() {
        let s = scope(&["user_id"], false);
        let err = error("wallet:<user_id", &s);
        assert_eq!(err.range, 7..15);
        assert_eq!(
            err.message,
            "unterminated placeholder `<user_id` in the key; close it with `>`, or write `<<` for \
             a literal `<`"
        );
        // A `<` before the `>` ends the broken placeholder; the next one still parses.
        let err = error("<user_id:<user_id>", &s);
        assert_eq!(err.range, 0..9);
    }

    #[test]
    fn stray_closing_bracket() {
        let err = error("wallet:user_id>", &scope(&["user_id"], false));
        assert_eq!(err.range, 14..15);
        assert!(err.message.starts_with("unmatched `>` in the key"));
    }

    #[test]
    fn invalid_placeholder_syntax() {
        let s = scope(&["user_id"], false);
        for bad in [
            "<user id>",
            "<user_id.>",
            "<.x>",
            "<0>",
            "<a-b>",
            "<user_id..x>",
            "<user_id.type>",
        ] {
            let err = error(bad, &s);
            assert!(
                err.message.starts_with("invalid placeholder"),
                "{bad}: {err:?}"
            );
            assert_eq!(err.range, 0..bad.len());
        }
    }

    #[test]
    fn reports_every_problem() {
        let errs = errors("<>:<nope>:x>:<ok", &scope(&["ok"], false));
        let ranges: Vec<_> = errs.iter().map(|err| err.range.clone()).collect();
        assert_eq!(ranges, [0..2, 3..9, 11..12, 13..16]);
    }

    #[test]
    fn empty_template() {
        let err = error("", &scope(&["x"], false));
        assert!(err.message.starts_with("the key template is empty"));
    }

    #[test]
    fn non_ascii_text_keeps_byte_ranges() {
        let s = scope(&["id"], false);
        assert_eq!(render("clé:<id>", &s), "[clé:]{id}");
        assert_eq!(error("clé:<idx>", &s).range, 5..10);
    }
}
