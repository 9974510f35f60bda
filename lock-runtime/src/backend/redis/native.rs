//! Which of the lock's own commands a server has, so that the release and the renewal can be a
//! native command rather than a script: `DELIFEQ key token` (Valkey >= 9.0), `DELEX key IFEQ
//! token` (Redis >= 8.4, Valkey >= 9.2), `SET key token IFEQ token PX ttl` (Valkey >= 8.1, Redis
//! >= 8.4).
//!
//! Decided from what the server says it has, never from a version string: its answer to
//! [`NativeCommands::QUERY`] (`COMMAND DOCS SET DELIFEQ DELEX`). `COMMAND INFO` would not do:
//! it names `DELIFEQ` and `DELEX` but not `SET`'s arguments, and `IFEQ` is one of them. A
//! command the server lacks, or renamed (`rename-command`), is absent from the answer, and an
//! answer that cannot be read counts as nothing native: the scripts are the fallback. A command
//! the ACL denies is still listed; that refusal (`NOPERM`) can only be seen when it is sent:
//! [`refusal`] then turns the native command off for that server ([`Known`]).

use std::sync::atomic::{AtomicU8, Ordering};

use redis::Value;

use crate::error::FailureKind;

/// The native commands one server has: what a connection to it may send instead of a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NativeCommands {
    /// `DELIFEQ key value`: deletes `key` only when it holds `value`.
    pub(crate) delifeq: bool,
    /// `DELEX key IFEQ value`: the same, as Redis (and Valkey from 9.2) spell it.
    pub(crate) delex_ifeq: bool,
    /// `SET key value IFEQ current ...`: sets (and with `PX`, renews) only when `key` holds
    /// `current`.
    pub(crate) set_ifeq: bool,
}

/// How a release can compare and delete without a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NativeRelease {
    /// `DELEX key IFEQ token`.
    DelexIfeq,
    /// `DELIFEQ key token`.
    Delifeq,
}

impl NativeCommands {
    /// The question whose answer [`from_command_docs`](Self::from_command_docs) reads.
    pub(crate) const QUERY: [&'static str; 5] = ["COMMAND", "DOCS", "SET", "DELIFEQ", "DELEX"];

    /// Reads the answer to [`QUERY`](Self::QUERY), in RESP2 (a flat array of name, docs, ...;
    /// each docs a flat array of field, value, ...) or RESP3 (maps). A command counts only when
    /// its docs name the `IFEQ` argument it is used with (`DELIFEQ` has no such token: its
    /// presence is enough). Whatever cannot be read counts as absent.
    pub(crate) fn from_command_docs(reply: &Value) -> NativeCommands {
        let mut found = NativeCommands::default();
        for (name, docs) in pairs(reply) {
            let Some(name) = text(name) else { continue };
            let arguments = pairs(docs)
                .into_iter()
                .find(|(field, _)| text(field).as_deref() == Some("arguments"))
                .map(|(_, arguments)| arguments);
            let has_ifeq = arguments.is_some_and(|a| has_token(a, "IFEQ"));
            match name.to_ascii_lowercase().as_str() {
                "delifeq" => found.delifeq = true,
                "delex" => found.delex_ifeq = has_ifeq,
                "set" => found.set_ifeq = has_ifeq,
                _ => {}
            }
        }
        found
    }

    /// The native compare-and-delete to release with, if any: `DELEX .. IFEQ` where both are
    /// there (the spelling Redis and Valkey share).
    pub(crate) fn release(self) -> Option<NativeRelease> {
        if self.delex_ifeq {
            Some(NativeRelease::DelexIfeq)
        } else if self.delifeq {
            Some(NativeRelease::Delifeq)
        } else {
            None
        }
    }

    /// Whether a renewal can be `SET key token IFEQ token PX ttl`.
    pub(crate) fn renew(self) -> bool {
        self.set_ifeq
    }
}

/// What one server was found to have, kept per server: unknown until it answered
/// [`NativeCommands::QUERY`], and again after a failure that may mean another server answers now
/// (a restart behind a reconnect, a failover), so a server that changed is asked again.
#[derive(Debug, Default)]
pub(crate) struct Known(AtomicU8);

const KNOWN: u8 = 1;
const DELIFEQ: u8 = 2;
const DELEX_IFEQ: u8 = 4;
const SET_IFEQ: u8 = 8;

impl Known {
    /// What the server has, `None` until it said.
    pub(crate) fn get(&self) -> Option<NativeCommands> {
        let bits = self.0.load(Ordering::Acquire);
        (bits & KNOWN != 0).then_some(NativeCommands {
            delifeq: bits & DELIFEQ != 0,
            delex_ifeq: bits & DELEX_IFEQ != 0,
            set_ifeq: bits & SET_IFEQ != 0,
        })
    }

    pub(crate) fn learn(&self, found: NativeCommands) {
        let bit = |has: bool, bit: u8| if has { bit } else { 0 };
        self.0.store(
            KNOWN
                | bit(found.delifeq, DELIFEQ)
                | bit(found.delex_ifeq, DELEX_IFEQ)
                | bit(found.set_ifeq, SET_IFEQ),
            Ordering::Release,
        );
    }

    /// Ask again at the next chance.
    pub(crate) fn forget(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// The server refused its native release (see [`refusal`]): scripts from now on, until it is
    /// asked again.
    pub(crate) fn refused_release(&self) {
        self.0.fetch_and(!(DELIFEQ | DELEX_IFEQ), Ordering::AcqRel);
    }

    /// The same for the native renewal.
    pub(crate) fn refused_renewal(&self) {
        self.0.fetch_and(!SET_IFEQ, Ordering::AcqRel);
    }
}

/// What an error reply to a native command means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `WRONGTYPE`: the key is not a string (a shared lock or a semaphore lives there); the
    /// script answers this call, and the command stays.
    NotAString,
    /// The server will not run it (`NOPERM`: the ACL; `ERR unknown command` or a syntax error:
    /// renamed, or not what its docs said): the scripts answer from now on.
    Refused,
    /// Any other failure (the connection, a timeout, a busy or demoted server): a failure of the
    /// call, as a script's would be.
    Failed,
}

/// How to take an error reply of kind `kind` (see `NodeFailure::from_redis`) and code `code`.
pub(crate) fn refusal(kind: FailureKind, code: Option<&str>) -> Refusal {
    match (kind, code) {
        (FailureKind::Response, Some("WRONGTYPE")) => Refusal::NotAString,
        (FailureKind::Response | FailureKind::Permission, _) => Refusal::Refused,
        _ => Refusal::Failed,
    }
}

/// The (key, value) pairs of a RESP3 map, or of a RESP2 flat array of alternating keys and
/// values; none for anything else.
fn pairs(value: &Value) -> Vec<(&Value, &Value)> {
    match value {
        Value::Map(entries) => entries.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(items) if items.len() % 2 == 0 => items
            .chunks_exact(2)
            .map(|pair| (&pair[0], &pair[1]))
            .collect(),
        _ => Vec::new(),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// Whether an argument list (each argument a map, or a flat array, of its fields; a `oneof` or
/// `block` nests its own `arguments`) has an argument introduced by `token`, at any depth.
fn has_token(arguments: &Value, token: &str) -> bool {
    let (Value::Array(list) | Value::Set(list)) = arguments else {
        return false;
    };
    list.iter().any(|argument| {
        pairs(argument)
            .into_iter()
            .any(|(field, value)| match text(field).as_deref() {
                Some("token") => text(value).is_some_and(|t| t.eq_ignore_ascii_case(token)),
                Some("arguments") => has_token(value, token),
                _ => false,
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a reply's map from its fields: RESP2 ([`flat`]) or RESP3 ([`map`]).
    type Shape = fn(&[(&str, Value)]) -> Value;

    fn s(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// A RESP2 flat array of fields and values.
    fn flat(fields: &[(&str, Value)]) -> Value {
        Value::Array(fields.iter().flat_map(|(k, v)| [s(k), v.clone()]).collect())
    }

    /// A RESP3 map of the same.
    fn map(fields: &[(&str, Value)]) -> Value {
        Value::Map(fields.iter().map(|(k, v)| (s(k), v.clone())).collect())
    }

    /// An argument as `COMMAND DOCS` describes it, built by `shape` (RESP2 or RESP3).
    fn argument(shape: Shape, name: &str, token: Option<&str>) -> Value {
        let mut fields = vec![("name", s(name)), ("type", s("string"))];
        if let Some(token) = token {
            fields.push(("token", s(token)));
        }
        shape(&fields)
    }

    /// `SET`'s docs: its condition a `oneof` of `NX`, `XX` and, with `ifeq`, `IFEQ` (as Valkey
    /// 9.1 answers), then `PX` in an `expiration` `oneof`.
    fn set_docs(shape: Shape, ifeq: bool) -> Value {
        let mut condition = vec![
            argument(shape, "nx", Some("NX")),
            argument(shape, "xx", Some("XX")),
        ];
        if ifeq {
            condition.push(argument(shape, "comparison-value", Some("IFEQ")));
        }
        let arguments = Value::Array(vec![
            argument(shape, "key", None),
            argument(shape, "value", None),
            shape(&[
                ("name", s("condition")),
                ("type", s("oneof")),
                ("arguments", Value::Array(condition)),
            ]),
            shape(&[
                ("name", s("expiration")),
                ("type", s("oneof")),
                (
                    "arguments",
                    Value::Array(vec![argument(shape, "milliseconds", Some("PX"))]),
                ),
            ]),
        ]);
        shape(&[
            ("summary", s("Sets the string value of a key")),
            ("arguments", arguments),
        ])
    }

    fn delifeq_docs(shape: Shape) -> Value {
        shape(&[
            ("since", s("9.0.0")),
            (
                "arguments",
                Value::Array(vec![
                    argument(shape, "key", None),
                    argument(shape, "value", None),
                ]),
            ),
        ])
    }

    /// `DELEX key [IFEQ v | IFNE v | IFDEQ d | IFDNE d]`, as Redis 8.4 documents it.
    fn delex_docs(shape: Shape) -> Value {
        let condition = Value::Array(
            ["IFEQ", "IFNE", "IFDEQ", "IFDNE"]
                .iter()
                .map(|t| argument(shape, &t.to_ascii_lowercase(), Some(t)))
                .collect(),
        );
        shape(&[(
            "arguments",
            Value::Array(vec![
                argument(shape, "key", None),
                shape(&[
                    ("name", s("condition")),
                    ("type", s("oneof")),
                    ("arguments", condition),
                ]),
            ]),
        )])
    }

    const SHAPES: [Shape; 2] = [flat, map];

    #[test]
    fn valkey_9_1_has_delifeq_and_set_ifeq_not_delex() {
        for shape in SHAPES {
            // Valkey 9.1 leaves DELEX, which it does not have, out of the answer.
            let reply = shape(&[
                ("set", set_docs(shape, true)),
                ("delifeq", delifeq_docs(shape)),
            ]);
            let found = NativeCommands::from_command_docs(&reply);
            assert_eq!(
                found,
                NativeCommands {
                    delifeq: true,
                    delex_ifeq: false,
                    set_ifeq: true
                }
            );
            assert_eq!(found.release(), Some(NativeRelease::Delifeq));
            assert!(found.renew());
        }
    }

    #[test]
    fn redis_8_4_and_valkey_9_2_release_with_delex() {
        for shape in SHAPES {
            let redis = shape(&[("set", set_docs(shape, true)), ("delex", delex_docs(shape))]);
            let found = NativeCommands::from_command_docs(&redis);
            assert_eq!(found.release(), Some(NativeRelease::DelexIfeq));
            assert!(found.renew());
            let valkey = shape(&[
                ("set", set_docs(shape, true)),
                ("delifeq", delifeq_docs(shape)),
                ("delex", delex_docs(shape)),
            ]);
            assert_eq!(
                NativeCommands::from_command_docs(&valkey).release(),
                Some(NativeRelease::DelexIfeq)
            );
        }
    }

    #[test]
    fn redis_7_0_has_none_and_takes_the_scripts() {
        for shape in SHAPES {
            let reply = shape(&[("set", set_docs(shape, false))]);
            let found = NativeCommands::from_command_docs(&reply);
            assert_eq!(found, NativeCommands::default());
            assert_eq!(found.release(), None);
            assert!(!found.renew());
        }
    }

    /// A `DELEX` without `IFEQ` (another command of that name) is no compare-and-delete; a
    /// renamed `DELIFEQ` is listed under its new name, which is not ours.
    #[test]
    fn a_command_without_ifeq_or_renamed_counts_as_absent() {
        for shape in SHAPES {
            let bare_delex = shape(&[(
                "arguments",
                Value::Array(vec![argument(shape, "key", None)]),
            )]);
            let reply = shape(&[
                ("delex", bare_delex),
                ("delifeq-renamed", delifeq_docs(shape)),
            ]);
            assert_eq!(
                NativeCommands::from_command_docs(&reply),
                NativeCommands::default()
            );
        }
    }

    /// Names and tokens in another case still count (a server may answer in upper case).
    #[test]
    fn names_and_tokens_are_matched_without_case() {
        let reply = flat(&[
            ("DELIFEQ", delifeq_docs(flat)),
            ("SET", set_docs(flat, true)),
        ]);
        let found = NativeCommands::from_command_docs(&reply);
        assert!(found.delifeq && found.set_ifeq);
    }

    /// Nothing readable: an empty answer, an odd flat array, `OK`, nil (an error reply is the
    /// caller's: the query failed).
    #[test]
    fn an_unreadable_answer_counts_as_nothing_native() {
        let odd = Value::Array(vec![s("delifeq")]);
        for reply in [
            Value::Array(Vec::new()),
            Value::Map(Vec::new()),
            odd,
            Value::Okay,
            Value::Nil,
        ] {
            assert_eq!(
                NativeCommands::from_command_docs(&reply),
                NativeCommands::default(),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn a_refused_command_turns_off_alone_and_a_failure_forgets_everything() {
        let known = Known::default();
        assert_eq!(known.get(), None, "unknown until asked");
        let all = NativeCommands {
            delifeq: true,
            delex_ifeq: true,
            set_ifeq: true,
        };
        known.learn(all);
        assert_eq!(known.get(), Some(all));
        known.refused_release();
        assert_eq!(
            known.get().map(|left| (left.release(), left.renew())),
            Some((None, true))
        );
        known.refused_renewal();
        assert_eq!(
            known.get(),
            Some(NativeCommands::default()),
            "asked: nothing native"
        );
        known.forget();
        assert_eq!(known.get(), None, "asked again after a failure");
    }

    #[test]
    fn only_a_refusal_turns_the_native_command_off() {
        use FailureKind::{Busy, Io, Permission, Response, Timeout};
        let cases = [
            (Response, Some("WRONGTYPE"), Refusal::NotAString),
            (Permission, Some("NOPERM"), Refusal::Refused),
            (Response, Some("ERR"), Refusal::Refused),
            (Response, None, Refusal::Refused),
            (Busy, Some("READONLY"), Refusal::Failed),
            (Busy, Some("LOADING"), Refusal::Failed),
            (Io, None, Refusal::Failed),
            (Timeout, None, Refusal::Failed),
        ];
        for (kind, code, expected) in cases {
            assert_eq!(refusal(kind, code), expected, "{kind:?} {code:?}");
        }
    }
}
