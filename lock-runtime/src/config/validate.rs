//! Validation: the backend checks its own part (its file in `backend/`), then every setting is
//! checked against it, into a [`ValidConfig`].

use std::time::Duration;

use super::{BackendChoice, LockConfig, Settings};
use crate::LockError;
use crate::backend::ValidBackend;

impl LockConfig {
    /// The config with every value checked, and the backend's URLs parsed.
    pub(crate) fn validate(&self) -> Result<ValidConfig, LockError> {
        let backend = match &self.backend {
            BackendChoice::Backend(backend) => backend.validate()?,
            BackendChoice::Env(problem) => return Err(problem.error()),
        };
        let settings = &self.settings;
        if let Some(n) = settings.min_replicas {
            if !backend.has_replicas() {
                return Err(LockError::config(
                    "min_replicas",
                    "only applies to cluster and sentinel (other backends have no replicas)",
                ));
            }
            if n == 0 {
                return Err(LockError::config("min_replicas", "must be at least 1"));
            }
        }
        if settings.master_auth.is_some() && !backend.takes_master_auth() {
            return Err(LockError::config(
                "master_auth",
                "only applies to sentinel (the other backends take credentials in their URLs)",
            ));
        }
        #[cfg(feature = "testing")]
        if settings.faults.is_some() && backend.kind() != crate::backend::BackendKind::Memory {
            return Err(LockError::config(
                "faults",
                "only applies to in_memory (faults are injected into the in-memory backend)",
            ));
        }
        settings.tls.check(backend.uses_tls())?;
        check_ttl("default_ttl", settings.default_ttl)?;
        positive("retry_delay", settings.retry_delay)?;
        positive("connect_timeout", settings.connect_timeout)?;
        positive("response_timeout", settings.response_timeout)?;
        if let Some(max_hold) = settings.default_max_hold {
            positive("max_hold", max_hold)?;
        }
        if settings.connect_timeout > lock_rules::MAX_TTL {
            return Err(LockError::config(
                "connect_timeout",
                "must be at most 365 days",
            ));
        }
        if !(0.0..=1.0).contains(&settings.retry_jitter) {
            return Err(LockError::config("retry_jitter", "must be between 0 and 1"));
        }
        if !(0.0..0.5).contains(&settings.drift_factor) {
            return Err(LockError::config(
                "drift_factor",
                "must be at least 0 and below 0.5",
            ));
        }
        if settings.response_timeout >= settings.default_ttl {
            return Err(LockError::config(
                "response_timeout",
                format!(
                    "must be shorter than default_ttl ({:?}) or no renewal could ever be confirmed",
                    settings.default_ttl
                ),
            ));
        }
        if let Some(interval) = settings.renew_interval {
            positive("renew_interval", interval)?;
            let ttl = settings.default_ttl;
            let room = ttl
                .saturating_sub(settings.drift(ttl))
                .saturating_sub(settings.renew_margin(ttl));
            if interval >= room {
                return Err(LockError::config(
                    "renew_interval",
                    format!(
                        "must leave room for one request before default_ttl ({:?}) runs out: \
                         below {room:?} (default_ttl - drift - min(response_timeout, \
                         default_ttl / 2)), got {interval:?}",
                        settings.default_ttl
                    ),
                ));
            }
        }
        if let Some(owner) = &settings.owner
            && let Err(reason) = crate::owner::check_name(owner)
        {
            return Err(LockError::config("owner", reason));
        }
        if settings.key_prefix.contains(['{', '}']) {
            return Err(LockError::config(
                "key_prefix",
                "must not contain `{` or `}` (the lock key carries the hash tag)",
            ));
        }
        if let Some(runtime) = &self.runtime
            && runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread
        {
            return Err(LockError::config(
                "runtime",
                "must be a multi-thread runtime (a sync lock call on a current-thread runtime would block the thread that has to answer it)",
            ));
        }
        let fencing_free = backend.fencing_free();
        let fencing = fencing_free || settings.fencing.unwrap_or(false);
        Ok(ValidConfig {
            runtime: self.runtime.clone(),
            backend,
            settings: settings.clone(),
            fencing,
            fencing_free,
        })
    }
}

fn positive(field: &'static str, value: Duration) -> Result<(), LockError> {
    if value.is_zero() {
        Err(LockError::config(field, "must be greater than zero"))
    } else {
        Ok(())
    }
}

/// A validated configuration, ready to build a client from.
pub(crate) struct ValidConfig {
    pub(crate) runtime: Option<tokio::runtime::Handle>,
    pub(crate) backend: Box<dyn ValidBackend>,
    pub(crate) settings: Settings,
    /// [`Settings::fencing`] resolved for the backend.
    pub(crate) fencing: bool,
    /// Whether the backend's token costs nothing, so every lock carries one.
    pub(crate) fencing_free: bool,
}

/// The one rule for a lock's TTL, from the config or from a call site: the bounds the attribute
/// checks at compile time (`lock_rules`), reported on `field`.
pub(crate) fn check_ttl(field: &'static str, ttl: Duration) -> Result<(), LockError> {
    lock_rules::check_ttl(ttl).map_err(|e| LockError::config(field, format!("{e}, got {ttl:?}")))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::config) fn field(config: LockConfig) -> &'static str {
        match config.validate() {
            Err(LockError::Config { field, .. }) => field,
            Err(other) => panic!("expected a config error, got {other:?}"),
            Ok(_) => panic!("expected a config error, got a valid config"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert!(
            LockConfig::single("redis://127.0.0.1:6379/")
                .validate()
                .is_ok()
        );
        assert!(LockConfig::in_memory().validate().is_ok());
        assert!(
            LockConfig::redlock(["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn invalid_values_name_their_field() {
        assert_eq!(field(LockConfig::single("http://127.0.0.1/")), "url");
        assert_eq!(field(LockConfig::single("127.0.0.1:6379")), "url");
        assert_eq!(field(LockConfig::single("redis://127.0.0.1:6379/x")), "url");
        assert_eq!(
            field(LockConfig::in_memory().default_ttl(Duration::ZERO)),
            "default_ttl"
        );
        assert_eq!(
            field(LockConfig::in_memory().renew_interval(Duration::from_secs(30))),
            "renew_interval"
        );
        assert_eq!(
            field(LockConfig::in_memory().retry_delay(Duration::ZERO)),
            "retry_delay"
        );
        assert_eq!(
            field(LockConfig::in_memory().retry_jitter(1.5)),
            "retry_jitter"
        );
        assert_eq!(
            field(LockConfig::in_memory().drift_factor(0.7)),
            "drift_factor"
        );
        assert_eq!(
            field(LockConfig::in_memory().response_timeout(Duration::from_secs(60))),
            "response_timeout"
        );
        assert_eq!(
            field(LockConfig::in_memory().key_prefix("a{b}")),
            "key_prefix"
        );
        for bad in ["", "a\nb", &"x".repeat(129)] {
            assert_eq!(
                field(LockConfig::in_memory().owner(bad)),
                "owner",
                "{bad:?}"
            );
        }
        assert_eq!(field(LockConfig::redlock(Vec::<String>::new())), "urls");
        assert_eq!(
            field(LockConfig::redlock([
                "redis://127.0.0.1:7000/",
                "redis://127.0.0.1:7000/"
            ])),
            "urls"
        );
        assert_eq!(
            field(LockConfig::in_memory().min_replicas(1)),
            "min_replicas"
        );
        assert_eq!(
            field(LockConfig::single("redis://127.0.0.1:6379/").min_replicas(1)),
            "min_replicas"
        );
        assert_eq!(
            field(
                LockConfig::redlock(["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"])
                    .min_replicas(1)
            ),
            "min_replicas"
        );
        assert_eq!(
            field(LockConfig::cluster(["redis://127.0.0.1:7000/"]).min_replicas(0)),
            "min_replicas"
        );
        assert_eq!(
            field(LockConfig::cluster(Vec::<String>::new())),
            "seed_urls"
        );
        assert_eq!(field(LockConfig::cluster(["http://h/"])), "seed_urls");
        assert_eq!(
            field(LockConfig::sentinel("", ["redis://127.0.0.1:26379/"])),
            "master_name"
        );
        assert_eq!(
            field(LockConfig::sentinel("m", Vec::<String>::new())),
            "sentinel_urls"
        );
        // Room for one renewal request: interval + response timeout + drift below the ttl.
        assert_eq!(
            field(
                LockConfig::in_memory()
                    .default_ttl(Duration::from_secs(1))
                    .renew_interval(Duration::from_millis(990))
            ),
            "renew_interval"
        );
        assert_eq!(
            field(LockConfig::in_memory().default_ttl(Duration::from_millis(5))),
            "default_ttl"
        );
        assert_eq!(
            field(LockConfig::in_memory().default_ttl(Duration::from_secs(400 * 24 * 3600))),
            "default_ttl"
        );
        assert_eq!(
            field(LockConfig::in_memory().connect_timeout(Duration::MAX)),
            "connect_timeout"
        );
    }

    #[test]
    fn redlock_over_one_node_is_a_single_node() {
        let kind_and_fencing = |config: LockConfig| match config.validate() {
            Ok(valid) => (valid.backend.kind().label(), valid.fencing),
            Err(err) => panic!("valid config: {err}"),
        };
        let two = ["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"];
        assert_eq!(
            kind_and_fencing(LockConfig::redlock(["redis://127.0.0.1:1/"])),
            ("single", false)
        );
        assert_eq!(
            kind_and_fencing(LockConfig::redlock(two)),
            ("redlock", false)
        );
        assert_eq!(
            kind_and_fencing(LockConfig::redlock(two).fencing(true)),
            ("redlock", true)
        );
        assert_eq!(
            kind_and_fencing(LockConfig::single("redis://127.0.0.1:1/")),
            ("single", false)
        );
        assert_eq!(
            kind_and_fencing(LockConfig::single("redis://127.0.0.1:1/").fencing(true)),
            ("single", true)
        );
        assert_eq!(kind_and_fencing(LockConfig::in_memory()), ("memory", true));
        assert_eq!(
            kind_and_fencing(LockConfig::in_memory().fencing(false)),
            ("memory", true),
            "the in-memory counter costs nothing: always handed out"
        );
    }

    #[test]
    fn huge_waits_and_delays_are_valid() {
        let config = LockConfig::in_memory()
            .default_wait(Duration::MAX)
            .retry_delay(Duration::MAX);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn tls_urls_need_the_feature() {
        let result = LockConfig::single("rediss://:hunter2@127.0.0.1:6380/").validate();
        if cfg!(feature = "tls") {
            assert!(result.is_ok());
        } else {
            let msg = result.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains("`url`") && msg.contains("`tls` feature"),
                "{msg}"
            );
            assert!(!msg.contains("hunter2"), "{msg}");
        }
    }

    #[test]
    fn tls_and_master_auth_settings_name_their_field() {
        let tls = || LockConfig::single("rediss://127.0.0.1:6380/");
        // Without the `tls` feature the `rediss://` URL itself is refused first.
        let on_tls = |name| if cfg!(feature = "tls") { name } else { "url" };
        assert_eq!(
            field(tls().tls_root_ca("not a certificate")),
            on_tls("tls_root_ca")
        );
        assert_eq!(
            field(tls().tls_client_cert("not a certificate", "not a key")),
            on_tls("tls_client_cert")
        );
        // Given for plain URLs only, or for a backend without URLs: it would go unused.
        assert_eq!(
            field(LockConfig::single("redis://127.0.0.1:6379/").tls_root_ca("x")),
            "tls_root_ca"
        );
        assert_eq!(
            field(LockConfig::in_memory().tls_client_cert("x", "y")),
            "tls_client_cert"
        );
        let msg = tls()
            .tls_root_ca("x")
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        if cfg!(feature = "tls") {
            assert!(msg.contains("no certificate"), "{msg}");
        } else {
            assert!(msg.contains("`tls` feature"), "{msg}");
        }
        assert_eq!(
            field(LockConfig::single("redis://127.0.0.1:6379/").master_auth("u", "hunter2")),
            "master_auth"
        );
        let sentinel = LockConfig::sentinel("locks", ["redis://:s3cret@127.0.0.1:26379/"])
            .master_auth("locker", "hunter2");
        assert!(sentinel.validate().is_ok());
        let shown = format!("{:?}", sentinel.tls_client_cert("CERT PEM", "KEY PEM"));
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret") && !shown.contains("KEY PEM"),
            "{shown}"
        );
        assert!(
            shown.contains("master_auth: Some(locker:***)")
                && shown.contains("root_ca: none, client_cert: set"),
            "{shown}"
        );
    }
}
