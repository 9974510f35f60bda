//! Who holds a lock. Every grant's value carries, after the token, a record of the client that
//! asked: its owner name, host, process id, program, and when it asked. The record rides in the
//! value the grant writes anyway (no extra key, no extra command), and every comparison of a
//! holder with a token stays one equality: the token is the whole value. Inspecting reads the
//! record back, without the token's secret part (Redis strips it in the inspect script; the
//! memory and etcd backends strip it in the process).
//!
//! Record layout, after the 32 hex digits of the secret: `US "o1" US since_ms US pid US name US
//! host US program`, with `US` the ASCII unit separator (0x1F). No field holds a control
//! character: the configured name is refused with one (see [`check_name`]), the host and program
//! have theirs replaced.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who holds a lock, as its grant recorded it ([`LockInfo::owners`](crate::LockInfo::owners)).
/// Never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owner {
    /// The holder's [`LockConfig::owner`](crate::LockConfig::owner), or `host:pid` when it set
    /// none.
    pub name: String,
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// The holder's program (its executable's file name).
    pub program: String,
    /// When the holder asked for the lock, by its own clock: the start of the acquire call that
    /// got it (a holder that waited got it up to its wait later). `None` when the record has no
    /// readable time.
    pub since: Option<SystemTime>,
}

/// The unit separator between the record's fields.
const SEP: char = '\u{1f}';
/// The record's version tag, the first field.
const VERSION: &str = "o1";
/// The longest owner name, host or program kept, in bytes: the record rides in every grant.
const FIELD_MAX: usize = 128;

/// A client's half of every token it makes: everything in the record but the time.
#[derive(Clone)]
pub(crate) struct Identity {
    /// `US pid US name US host US program`.
    tail: Arc<str>,
}

impl Identity {
    /// This process, named `name` (or `host:pid`).
    pub(crate) fn new(name: Option<&str>) -> Identity {
        static PROCESS: LazyLock<(String, u32, String)> = LazyLock::new(|| {
            let host = gethostname::gethostname().to_string_lossy().into_owned();
            let program = std::env::current_exe()
                .ok()
                .and_then(|path| path.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_default();
            (clean(&host), std::process::id(), clean(&program))
        });
        let (host, pid, program) = &*PROCESS;
        let name = match name {
            Some(name) => clean(name),
            None => format!("{host}:{pid}"),
        };
        Identity {
            tail: format!("{SEP}{pid}{SEP}{name}{SEP}{host}{SEP}{program}").into(),
        }
    }

    /// A holder value: `secret`, then the record of a grant asked for at `asked`. One
    /// allocation: the value is written into a buffer this thread keeps, then copied once into
    /// its `Arc` (a `String` made into an `Arc<str>` is two).
    pub(crate) fn value(&self, secret: &str, asked: SystemTime) -> std::sync::Arc<str> {
        use std::fmt::Write as _;
        thread_local! {
            static BUFFER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        BUFFER.with_borrow_mut(|value| {
            value.clear();
            value.push_str(secret);
            // Writing to a String cannot fail.
            let _ = write!(value, "{SEP}{VERSION}{SEP}{}{}", millis(asked), self.tail);
            std::sync::Arc::from(value.as_str())
        })
    }

    /// The owner the record of a grant asked for at `asked` names, as [`parse`] reads it.
    pub(crate) fn owner(&self, asked: SystemTime) -> Owner {
        let since = UNIX_EPOCH + Duration::from_millis(millis(asked));
        let mut fields = self.tail.split(SEP).skip(1);
        let mut next = || fields.next().unwrap_or_default().to_owned();
        let (pid, name, host, program) = (next(), next(), next(), next());
        Owner {
            name,
            host,
            pid: pid.parse().unwrap_or(0),
            program,
            since: Some(since),
        }
    }

    #[cfg(test)]
    fn record(&self) -> String {
        self.value("", SystemTime::now()).to_string()
    }
}

/// `t` in whole milliseconds since the Unix epoch (0 before it).
fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why `name` cannot be an owner name, if it cannot.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("must not be empty")
    } else if name.len() > FIELD_MAX {
        Err("must be at most 128 bytes (it is written with every grant)")
    } else if name.chars().any(char::is_control) {
        Err("must not contain control characters")
    } else {
        Ok(())
    }
}

/// `field` without control characters, at most [`FIELD_MAX`] bytes.
fn clean(field: &str) -> String {
    let mut out: String = field
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if out.len() > FIELD_MAX {
        let mut end = FIELD_MAX;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// Reads a record (what follows the secret in a holder's value). `None` when there is none (a
/// value written without one) or it cannot be read.
pub(crate) fn parse(record: &[u8]) -> Option<Owner> {
    let record = std::str::from_utf8(record).ok()?;
    let mut fields = record.strip_prefix(SEP)?.split(SEP);
    if fields.next()? != VERSION {
        return None;
    }
    let since = fields
        .next()?
        .parse::<u64>()
        .ok()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    let pid = fields.next()?.parse().ok()?;
    let (name, host, program) = (fields.next()?, fields.next()?, fields.next()?);
    Some(Owner {
        name: name.to_owned(),
        host: host.to_owned(),
        pid,
        program: program.to_owned(),
        since,
    })
}

/// Whether a holder value is one of this library's: the secret's 32 hex digits, then a record
/// (`scripts::ANNOUNCED` reads it the same way on the server).
pub(crate) fn is_ours(value: &[u8]) -> bool {
    let start = crate::backend::TOKEN_SECRET_LEN;
    value.get(start..start + RECORD_START.len()) == Some(RECORD_START.as_bytes())
}

/// How a record starts: the separator, the version tag, the separator.
const RECORD_START: &str = "\u{1f}o1\u{1f}";

/// The owner recorded in a whole holder value (the secret's 32 hex digits, then the record).
#[cfg(any(feature = "etcd", test))]
pub(crate) fn of_value(value: &[u8]) -> Option<Owner> {
    parse(value.get(crate::backend::TOKEN_SECRET_LEN..)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_ours_is_told_from_another_librarys() {
        assert_eq!(RECORD_START, format!("{SEP}{VERSION}{SEP}"));
        let identity = Identity::new(Some("billing-7"));
        let ours = identity.value(&"0123456789abcdef".repeat(2), SystemTime::now());
        assert!(is_ours(ours.as_bytes()));
        // redis-py's and node-redlock's values: 32 hex digits, nothing after.
        assert!(!is_ours("0123456789abcdef".repeat(2).as_bytes()));
        assert!(!is_ours(b""));
        assert!(!is_ours(&ours.as_bytes()[1..]), "one digit short");
        // The scripts read the same bytes, as Lua decimal escapes.
        assert!(
            crate::backend::scripts::ANNOUNCED
                .contains(r"string.sub(holder, 33, 36) == '\031o1\031'")
        );
    }

    #[test]
    fn a_record_reads_back_as_its_owner() {
        let identity = Identity::new(Some("billing-7"));
        let before = SystemTime::now();
        let record = identity.record();
        let Some(owner) = parse(record.as_bytes()) else {
            panic!("no owner in {record:?}");
        };
        assert_eq!(owner.name, "billing-7");
        assert_eq!(owner.pid, std::process::id());
        assert!(!owner.host.is_empty());
        let Some(since) = owner.since else {
            panic!("no time in {owner:?}");
        };
        // Milliseconds: the record's time is `before` cut to the millisecond, or later.
        assert!(since + Duration::from_millis(1) > before && since <= SystemTime::now());
    }

    #[test]
    fn the_owner_of_a_value_is_the_one_its_record_reads_back_as() {
        let identity = Identity::new(Some("billing-7"));
        let asked = SystemTime::now();
        let value = identity.value("0123456789abcdef0123456789abcdef", asked);
        assert_eq!(of_value(value.as_bytes()), Some(identity.owner(asked)));
    }

    #[test]
    fn the_default_name_is_host_and_pid() {
        let record = Identity::new(None).record();
        let Some(owner) = parse(record.as_bytes()) else {
            panic!("no owner in {record:?}");
        };
        assert_eq!(owner.name, format!("{}:{}", owner.host, owner.pid));
    }

    #[test]
    fn values_without_a_readable_record_have_no_owner() {
        for bad in [
            "",
            "o1",
            "\u{1f}o2\u{1f}1\u{1f}2\u{1f}n\u{1f}h\u{1f}p",
            "\u{1f}o1\u{1f}1\u{1f}x\u{1f}n\u{1f}h\u{1f}p",
            "\u{1f}o1\u{1f}1\u{1f}2\u{1f}n\u{1f}h",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(of_value(b"0123456789abcdef"), None);
    }

    #[test]
    fn names_with_control_characters_or_too_long_are_refused_and_fields_cleaned() {
        assert!(check_name("a\u{1f}b").is_err());
        assert!(check_name("").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
        assert!(check_name("worker 7 (eu-west)").is_ok());
        assert_eq!(clean("a\nb"), "a?b");
        assert_eq!(clean(&"é".repeat(100)).len(), 128);
    }
}
