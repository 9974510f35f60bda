//! `ttl = "10s"`, `wait = "1m 30s"`: durations in humantime syntax, checked while compiling so a typo
//! never reaches production.

use std::time::Duration;

/// Which argument a duration belongs to; they differ only in what "too short" means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// How long the lock lives without renewal. Zero would protect nothing, and Redis expires keys in
    /// whole milliseconds, so anything under 1ms is rejected.
    Ttl,
    /// How long to wait for a contended lock. Zero means "try once".
    Wait,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ttl => "ttl",
            Kind::Wait => "wait",
        }
    }
}

/// Parses one duration argument; the error is the whole message, ready to be spanned on the literal.
pub(crate) fn parse(text: &str, kind: Kind) -> Result<Duration, String> {
    let name = kind.name();
    let duration = humantime::parse_duration(text).map_err(|err| {
        format!(
            "invalid `{name}` duration {text:?}: {err}; write e.g. \"500ms\", \"10s\" or \"1m 30s\""
        )
    })?;
    if kind == Kind::Ttl {
        if duration.is_zero() {
            return Err(
                "`ttl` can't be zero: the lock would expire as soon as it is taken; write \
                        e.g. `ttl = \"10s\"`, or leave `ttl` out to use the configured default"
                    .to_owned(),
            );
        }
        if duration < Duration::from_millis(1) {
            return Err(format!(
                "`ttl` {text:?} is shorter than 1ms, the smallest expiry Redis supports; write e.g. \
                 `ttl = \"500ms\"`"
            ));
        }
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::{Kind, parse};
    use std::time::Duration;

    fn error(text: &str, kind: Kind) -> String {
        match parse(text, kind) {
            Ok(duration) => panic!("{text:?} parsed as {duration:?}, expected an error"),
            Err(err) => err,
        }
    }

    #[test]
    fn accepts_humantime_syntax() {
        assert_eq!(parse("500ms", Kind::Ttl), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10s", Kind::Ttl), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1m 30s", Kind::Ttl), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h", Kind::Wait), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1500us", Kind::Wait), Ok(Duration::from_micros(1500)));
    }

    #[test]
    fn zero_is_a_valid_wait_but_not_a_valid_ttl() {
        assert_eq!(parse("0s", Kind::Wait), Ok(Duration::ZERO));
        assert_eq!(parse("0ms", Kind::Wait), Ok(Duration::ZERO));
        let err = error("0s", Kind::Ttl);
        assert!(err.starts_with("`ttl` can't be zero"), "{err}");
    }

    #[test]
    fn sub_millisecond_ttl_is_rejected() {
        let err = error("500us", Kind::Ttl);
        assert!(err.contains("shorter than 1ms"), "{err}");
        assert_eq!(parse("1ms", Kind::Ttl), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn errors_name_the_argument_and_the_input() {
        let err = error("10x", Kind::Ttl);
        assert!(
            err.starts_with("invalid `ttl` duration \"10x\": unknown time unit"),
            "{err}"
        );
        let err = error("10", Kind::Wait);
        assert!(
            err.starts_with("invalid `wait` duration \"10\": time unit needed"),
            "{err}"
        );
        let err = error("", Kind::Wait);
        assert!(err.contains("value was empty"), "{err}");
        let err = error("soon", Kind::Wait);
        assert!(err.contains("write e.g. \"500ms\""), "{err}");
    }
}
