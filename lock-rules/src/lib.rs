//! Rules shared by `lock-macros` (checked while compiling an attribute) and `lock-runtime` (checked
//! when a lock is built at run time), so both reject exactly the same values with the same words;
//! and the lock-name patterns that `lock-runtime`'s test faults and `lockctl` both match.

#![no_std]

use core::fmt;
use core::time::Duration;

/// The shortest ttl: shorter locks expire before a renewal can reach the server.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest ttl: a lock that outlives its holder's crash for longer blocks everyone.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a ttl was rejected by [`check_ttl`]. The `Display` text completes "`ttl` ...".
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlError {
    /// The ttl is zero.
    Zero,
    /// The ttl is shorter than [`MIN_TTL`].
    TooShort,
    /// The ttl is longer than [`MAX_TTL`].
    TooLong,
}

impl fmt::Display for TtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TtlError::Zero => {
                f.write_str("can't be zero: the lock would expire as soon as it is taken")
            }
            TtlError::TooShort => f.write_str(
                "must be at least 10ms: shorter locks expire before a renewal can reach the server",
            ),
            TtlError::TooLong => f.write_str(
                "must be at most 365 days (a lock that outlives its holder's crash for longer \
                 blocks everyone)",
            ),
        }
    }
}

/// Checks that a lock's ttl is within [`MIN_TTL`]`..=`[`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<(), TtlError> {
    if ttl.is_zero() {
        Err(TtlError::Zero)
    } else if ttl < MIN_TTL {
        Err(TtlError::TooShort)
    } else if ttl > MAX_TTL {
        Err(TtlError::TooLong)
    } else {
        Ok(())
    }
}

/// Why a `min_hold` was rejected by [`check_min_hold`]. The `Display` text completes
/// "`min_hold` ...".
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinHoldError {
    /// Longer than [`MAX_TTL`].
    TooLong,
}

impl fmt::Display for MinHoldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MinHoldError::TooLong => f.write_str(
                "must be at most 365 days, as a ttl (the key stays that long after the call, \
                 whatever becomes of its holder)",
            ),
        }
    }
}

/// Checks that a `min_hold` is at most [`MAX_TTL`] (zero asks for nothing, so it is fine): the
/// key outlives the call by that much, as it outlives a crashed holder by its ttl.
pub fn check_min_hold(min_hold: Duration) -> Result<(), MinHoldError> {
    if min_hold > MAX_TTL {
        Err(MinHoldError::TooLong)
    } else {
        Ok(())
    }
}

/// What kind of hold a lock is, from its `fair`, `shared` and `permits` arguments (the same
/// in the attribute and in `Lock`'s builder): the one type that travels from the macro's call to
/// the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// One holder (the default; the writer of a read/write lock).
    #[default]
    Exclusive,
    /// One holder; waiters are granted the lock in the order they arrived.
    Fair,
    /// One of any number of shared holders (readers); never together with an exclusive holder.
    Shared,
    /// One of at most this many holders (a semaphore); at least 1.
    Permits(u32),
}

impl Mode {
    /// The mode `fair`, `shared` and `permits` ask for together, or why they cannot go together
    /// (the first reason, in the order of [`ModeError`]'s variants).
    pub fn from_flags(fair: bool, shared: bool, permits: Option<u32>) -> Result<Mode, ModeError> {
        match (fair, shared, permits) {
            (_, _, Some(0)) => Err(ModeError::ZeroPermits),
            (_, true, Some(_)) => Err(ModeError::SharedWithPermits),
            (true, true, _) | (true, _, Some(_)) => Err(ModeError::FairWithOthers),
            (true, false, None) => Ok(Mode::Fair),
            (false, true, None) => Ok(Mode::Shared),
            (false, false, Some(n)) => Ok(Mode::Permits(n)),
            (false, false, None) => Ok(Mode::Exclusive),
        }
    }

    /// Whether the mode takes exactly one key (every mode but [`Mode::Exclusive`]).
    pub fn takes_one_key(self) -> bool {
        self != Mode::Exclusive
    }

    /// The argument that asks for this mode, which an error about it names. An exclusive lock
    /// only ever clashes with a semaphore on the same key, so its errors name `permits`.
    pub fn argument(self) -> &'static str {
        match self {
            Mode::Fair => "fair",
            Mode::Shared => "shared",
            Mode::Permits(_) | Mode::Exclusive => "permits",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::Fair => f.write_str("fair"),
            Mode::Shared => f.write_str("shared"),
            Mode::Permits(n) => write!(f, "permits = {n}"),
        }
    }
}

/// Why `fair`, `shared` and `permits` were rejected by [`Mode::from_flags`]. The `Display` text
/// completes "`ARGUMENT` ..." where the argument is [`argument`](ModeError::argument).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeError {
    /// `permits = 0`.
    ZeroPermits,
    /// `shared` together with `permits`.
    SharedWithPermits,
    /// `fair` together with `shared` or `permits`.
    FairWithOthers,
}

impl ModeError {
    /// The argument the error is about.
    pub fn argument(self) -> &'static str {
        match self {
            ModeError::ZeroPermits => "permits",
            ModeError::SharedWithPermits => "shared",
            ModeError::FairWithOthers => "fair",
        }
    }
}

impl fmt::Display for ModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModeError::ZeroPermits => "must be at least 1: `permits = 0` would let nobody in",
            ModeError::SharedWithPermits => {
                "cannot be combined with `permits`: a semaphore's holders already share the key"
            }
            ModeError::FairWithOthers => {
                "is for exclusive locks; it cannot be combined with `shared` or `permits`"
            }
        })
    }
}

/// Whether lock name `name` matches `pattern`, where `*` matches any run of characters (also
/// none) and `?` exactly one; every other character matches itself (no classes, no escapes, so no
/// pattern is invalid). The patterns of `lockctl list` and `watch`, and of
/// `lock_runtime::testing::Faults::unavailable`.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    // Byte offsets into each, always on character boundaries.
    let (mut p, mut n) = (0, 0);
    // The last `*` seen, and the name offset it is tried against.
    let mut star: Option<(usize, usize)> = None;
    while let Some(c) = name[n..].chars().next() {
        match pattern[p..].chars().next() {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(want) if want == '?' || want == c => {
                p += want.len_utf8();
                n += c.len_utf8();
            }
            _ => match star {
                // Let the last `*` take one more character, and try again after it.
                Some((sp, sn)) => {
                    let taken = name[sn..].chars().next().map_or(1, char::len_utf8);
                    star = Some((sp, sn + taken));
                    p = sp + 1;
                    n = sn + taken;
                }
                None => return false,
            },
        }
    }
    pattern[p..].chars().all(|c| c == '*')
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::{MAX_TTL, MIN_TTL, Mode, ModeError, TtlError, check_ttl, name_matches};
    use core::time::Duration;
    use std::string::ToString as _;

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(check_ttl(MIN_TTL), Ok(()));
        assert_eq!(check_ttl(MAX_TTL), Ok(()));
        assert_eq!(check_ttl(Duration::from_secs(30)), Ok(()));
    }

    #[test]
    fn outside_the_bounds_is_rejected() {
        assert_eq!(check_ttl(Duration::ZERO), Err(TtlError::Zero));
        assert_eq!(check_ttl(Duration::from_nanos(1)), Err(TtlError::TooShort));
        assert_eq!(check_ttl(Duration::from_millis(1)), Err(TtlError::TooShort));
        assert_eq!(
            check_ttl(MIN_TTL - Duration::from_nanos(1)),
            Err(TtlError::TooShort)
        );
        assert_eq!(
            check_ttl(MAX_TTL + Duration::from_nanos(1)),
            Err(TtlError::TooLong)
        );
        assert_eq!(check_ttl(Duration::MAX), Err(TtlError::TooLong));
    }

    #[test]
    fn messages_are_lowercase_name_the_bound_and_have_no_trailing_period() {
        let cases = [
            (TtlError::Zero, "zero"),
            (TtlError::TooShort, "10ms"),
            (TtlError::TooLong, "365 days"),
        ];
        // The messages spell the bounds out; keep them in step with the constants.
        assert_eq!(MIN_TTL.as_millis(), 10);
        assert_eq!(MAX_TTL.as_secs(), 365 * 24 * 3600);
        for (err, bound) in cases {
            let message = err.to_string();
            assert!(message.contains(bound), "{message}");
            assert!(message.starts_with(char::is_lowercase), "{message}");
            assert!(!message.ends_with('.'), "{message}");
        }
    }
    #[test]
    fn stars_match_any_run_and_question_marks_one_character() {
        let matches = [
            ("wallet:*", "wallet:42"),
            ("wallet:*", "wallet:"),
            ("*", ""),
            ("*", "wallet:42"),
            ("*:42", "wallet:42"),
            ("w*t:*2", "wallet:42"),
            ("wallet:?2", "wallet:42"),
            ("a*b*c", "aXbYbZc"),
            ("*a*a*", "banana"),
            ("{user:7}*", "{user:7}=a"),
            ("50%", "50%"),
            ("é?:*", "éü:ß"),
            ("*ß", "straße ß"),
            ("exact", "exact"),
        ];
        for (pattern, name) in matches {
            assert!(name_matches(pattern, name), "{pattern} matches {name}");
        }
        let misses = [
            ("wallet:*", "order:1"),
            ("wallet:?", "wallet:42"),
            ("wallet", "wallet:42"),
            ("*:43", "wallet:42"),
            ("?", ""),
            ("", "a"),
            ("a*b", "aXc"),
            ("a*b", "ab c"),
            ("é?", "é"),
        ];
        for (pattern, name) in misses {
            assert!(
                !name_matches(pattern, name),
                "{pattern} does not match {name}"
            );
        }
    }

    #[test]
    fn modes_from_flags() {
        assert_eq!(Mode::from_flags(false, false, None), Ok(Mode::Exclusive));
        assert_eq!(Mode::from_flags(true, false, None), Ok(Mode::Fair));
        assert_eq!(Mode::from_flags(false, true, None), Ok(Mode::Shared));
        assert_eq!(
            Mode::from_flags(false, false, Some(3)),
            Ok(Mode::Permits(3))
        );
        assert_eq!(
            Mode::from_flags(false, false, Some(0)),
            Err(ModeError::ZeroPermits)
        );
        assert_eq!(
            Mode::from_flags(false, true, Some(2)),
            Err(ModeError::SharedWithPermits)
        );
        assert_eq!(
            Mode::from_flags(true, true, None),
            Err(ModeError::FairWithOthers)
        );
        assert_eq!(
            Mode::from_flags(true, false, Some(2)),
            Err(ModeError::FairWithOthers)
        );
        assert_eq!(ModeError::SharedWithPermits.argument(), "shared");
        assert!(!Mode::Exclusive.takes_one_key() && Mode::Permits(2).takes_one_key());
        assert_eq!(Mode::Permits(2).to_string(), "permits = 2");
    }
}
