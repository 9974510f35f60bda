//! `ttl = "10s"`, `wait = "1m 30s"`, `max_hold = "2m"`, `min_hold = "30s"`: durations in humantime syntax, checked while compiling so a typo
//! never reaches production.

use std::time::Duration;

/// Which argument a duration belongs to; they differ only in what "too short" or "too long" means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// How long the lock lives without renewal, within the bounds of [`lock_rules::check_ttl`], the
    /// rule the runtime applies too.
    Ttl,
    /// How long to wait for a contended lock. Zero means "try once".
    Wait,
    /// The most a call may hold the lock, renewal included; any positive value.
    MaxHold,
    /// The least time the lock is kept after its grant. Zero asks for nothing.
    MinHold,
}

impl Kind {
    /// The argument's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Ttl => "ttl",
            Kind::Wait => "wait",
            Kind::MaxHold => "max_hold",
            Kind::MinHold => "min_hold",
        }
    }

    /// A typical value, as written in the attribute, for "write e.g." hints.
    pub(crate) fn example(self) -> &'static str {
        match self {
            Kind::Ttl => "\"10s\"",
            Kind::Wait => "\"5s\"",
            Kind::MaxHold => "\"2m\"",
            Kind::MinHold => "\"30s\"",
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
    let hint = || {
        format!(
            "write e.g. `{name} = {example}`, or leave `{name}` out to use the configured default",
            example = kind.example()
        )
    };
    match kind {
        Kind::Ttl => {
            lock_rules::check_ttl(duration).map_err(|err| format!("`{name}` {err}; {}", hint()))?;
        }
        Kind::MaxHold if duration.is_zero() => {
            return Err(format!(
                "`{name}` can't be zero: every call would exceed it as soon as it takes the lock; {}",
                hint()
            ));
        }
        Kind::MinHold => {
            lock_rules::check_min_hold(duration)
                .map_err(|err| format!("`{name}` {err}; {}", hint()))?;
        }
        Kind::MaxHold | Kind::Wait => {}
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
        assert_eq!(
            err,
            "`ttl` can't be zero: the lock would expire as soon as it is taken; write e.g. \
             `ttl = \"10s\"`, or leave `ttl` out to use the configured default"
        );
    }

    #[test]
    fn ttl_outside_the_shared_bounds_is_rejected() {
        let err = error("500us", Kind::Ttl);
        assert!(err.starts_with("`ttl` must be at least 10ms"), "{err}");
        let err = error("1ms", Kind::Ttl);
        assert!(err.starts_with("`ttl` must be at least 10ms"), "{err}");
        assert_eq!(parse("10ms", Kind::Ttl), Ok(Duration::from_millis(10)));
        let err = error("400d", Kind::Ttl);
        assert!(err.starts_with("`ttl` must be at most 365 days"), "{err}");
        assert!(
            err.ends_with(
                "write e.g. `ttl = \"10s\"`, or leave `ttl` out to use the configured default"
            ),
            "{err}"
        );
        assert_eq!(
            parse("365d", Kind::Ttl),
            Ok(Duration::from_secs(365 * 24 * 3600))
        );
    }

    #[test]
    fn wait_has_no_ttl_bounds() {
        assert_eq!(parse("1ms", Kind::Wait), Ok(Duration::from_millis(1)));
        assert_eq!(
            parse("400d", Kind::Wait),
            Ok(Duration::from_secs(400 * 24 * 3600))
        );
    }

    #[test]
    fn max_hold_is_any_positive_duration() {
        assert_eq!(parse("2m", Kind::MaxHold), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1ns", Kind::MaxHold), Ok(Duration::from_nanos(1)));
        assert_eq!(
            parse("400d", Kind::MaxHold),
            Ok(Duration::from_secs(400 * 24 * 3600))
        );
        assert_eq!(
            error("0s", Kind::MaxHold),
            "`max_hold` can't be zero: every call would exceed it as soon as it takes the lock; \
             write e.g. `max_hold = \"2m\"`, or leave `max_hold` out to use the configured default"
        );
        let err = error("2 minutes please", Kind::MaxHold);
        assert!(err.starts_with("invalid `max_hold` duration"), "{err}");
    }

    #[test]
    fn min_hold_may_be_zero() {
        assert_eq!(parse("30s", Kind::MinHold), Ok(Duration::from_secs(30)));
        assert_eq!(parse("0s", Kind::MinHold), Ok(Duration::ZERO));
        assert_eq!(parse("365days", Kind::MinHold), Ok(lock_rules::MAX_TTL));
        let err = error("366days", Kind::MinHold);
        assert!(
            err.starts_with("`min_hold` must be at most 365 days"),
            "{err}"
        );
        let err = error("30 secs later", Kind::MinHold);
        assert!(err.starts_with("invalid `min_hold` duration"), "{err}");
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
