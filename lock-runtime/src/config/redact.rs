//! What a configuration shows of itself: `Debug` for [`LockConfig`], and URLs and endpoints
//! with their passwords replaced.

use std::fmt;

use super::{BackendChoice, LockConfig};

impl fmt::Debug for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendChoice::Backend(backend) => backend.fmt_redacted(f),
            BackendChoice::Env(problem) => fmt::Display::fmt(problem, f),
        }
    }
}

impl fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = f.debug_struct("LockConfig");
        shown
            .field("backend", &self.backend)
            .field("key_prefix", &self.settings.key_prefix)
            .field("default_ttl", &self.settings.default_ttl)
            .field("default_wait", &self.settings.default_wait)
            .field("retry_delay", &self.settings.retry_delay)
            .field("retry_jitter", &self.settings.retry_jitter)
            .field("renew_interval", &self.settings.renew_interval)
            .field("drift_factor", &self.settings.drift_factor)
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("response_timeout", &self.settings.response_timeout)
            .field("max_hold", &self.settings.default_max_hold)
            .field("min_replicas", &self.settings.min_replicas)
            .field("master_auth", &self.settings.master_auth)
            .field("owner", &self.settings.owner)
            .field("tls", &self.settings.tls)
            .field(
                "fencing",
                &format_args!(
                    "{}",
                    match self.settings.fencing {
                        Some(true) => "on",
                        Some(false) => "off",
                        None => "default (on; off for redlock over several nodes)",
                    }
                ),
            )
            .field(
                "runtime",
                &format_args!(
                    "{}",
                    if self.runtime.is_some() {
                        "caller's"
                    } else {
                        "library's own"
                    }
                ),
            );
        #[cfg(feature = "testing")]
        if let Some(faults) = &self.settings.faults {
            shown.field("faults", faults);
        }
        shown.finish()
    }
}

/// A URL with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a url>".to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// URLs with their passwords replaced, separated by commas.
pub(crate) fn redact_all(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An etcd endpoint with any password replaced by `***` (it may come without a scheme).
pub(crate) fn redact_endpoint(endpoint: &str) -> String {
    if endpoint.contains("://") {
        redact(endpoint)
    } else {
        redact(&format!("http://{endpoint}"))
            .trim_start_matches("http://")
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::tests::field;

    #[test]
    fn passwords_never_show() {
        let config =
            LockConfig::redlock(["redis://user:hunter2@h1:6379/0", "redis://:hunter2@h2/"]);
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("user:***@h1:6379/0"), "{shown}");
        let err = field(LockConfig::single("http://u:hunter2@h/"));
        assert_eq!(err, "url");
        let msg = LockConfig::single("http://u:hunter2@h/")
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!msg.contains("hunter2") && msg.contains("`url`"), "{msg}");
    }
}
