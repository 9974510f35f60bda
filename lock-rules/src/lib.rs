//! Rules shared by `lock-macros` (checked while compiling an attribute) and `lock-runtime` (checked
//! when a lock is built at run time), so both reject exactly the same values with the same words.

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

#[cfg(test)]
mod tests {
    extern crate std;

    use super::{MAX_TTL, MIN_TTL, TtlError, check_ttl};
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
}
