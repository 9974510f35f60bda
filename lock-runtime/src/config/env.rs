//! [`LockConfig::from_env`]: the backend chosen by environment variables.

use std::fmt;

use super::{BackendChoice, LockConfig};
use crate::backend::EtcdConfig;
use crate::error::LockError;

/// The environment variable read by [`LockConfig::from_env`].
pub const ENV_URL: &str = "LOCK_REDIS_URL";

/// The environment variable that selects etcd in [`LockConfig::from_env`]: a comma-separated list
/// of endpoints (needs the `etcd` feature).
pub const ENV_ETCD_ENDPOINTS: &str = "LOCK_ETCD_ENDPOINTS";
/// Selects the topology in [`LockConfig::from_env`]: `single`, `redlock`, `cluster` or
/// `sentinel`. Unset: one URL is `single`, a list is `redlock`.
pub const ENV_MODE: &str = "LOCK_REDIS_MODE";

/// The master name for `LOCK_REDIS_MODE=sentinel` in [`LockConfig::from_env`].
pub const ENV_SENTINEL_MASTER: &str = "LOCK_REDIS_SENTINEL_MASTER";

impl LockConfig {
    /// Reads the backend from the environment:
    ///
    /// | `LOCK_REDIS_MODE` | `LOCK_REDIS_URL` | selects |
    /// |---|---|---|
    /// | unset | one URL | [`single`](Self::single) |
    /// | unset | comma-separated URLs | [`redlock`](Self::redlock) |
    /// | `single` | one URL | [`single`](Self::single) |
    /// | `redlock` | URLs | [`redlock`](Self::redlock) |
    /// | `cluster` | seed URLs | [`cluster`](Self::cluster) |
    /// | `sentinel` | sentinel URLs | [`sentinel`](Self::sentinel), master name from `LOCK_REDIS_SENTINEL_MASTER` |
    ///
    /// Or `LOCK_ETCD_ENDPOINTS`: a comma-separated list of etcd endpoints selects
    /// [`etcd`](Self::etcd) (feature `etcd`). When neither `LOCK_REDIS_URL` nor
    /// `LOCK_ETCD_ENDPOINTS` is set, `init` fails with
    /// `LockError::Config { field: "LOCK_REDIS_URL", .. }` (use [`from_env_or`](Self::from_env_or)
    /// to choose a fallback explicitly); when both are, with one naming `LOCK_ETCD_ENDPOINTS`. An
    /// unknown mode fails naming `LOCK_REDIS_MODE`, a sentinel mode without a master name naming
    /// `LOCK_REDIS_SENTINEL_MASTER`.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok();
        Self::from_env_vars(
            var(ENV_ETCD_ENDPOINTS),
            var(ENV_URL),
            var(ENV_MODE).as_deref(),
            var(ENV_SENTINEL_MASTER).as_deref(),
        )
    }

    fn from_env_vars(
        etcd: Option<String>,
        redis: Option<String>,
        mode: Option<&str>,
        master: Option<&str>,
    ) -> Self {
        let set = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        let master = master.filter(|v| !v.trim().is_empty());
        match (set(etcd), set(redis)) {
            (Some(_), Some(_)) => Self::with_problem(EnvProblem::Both),
            (Some(endpoints), None) => Self::with_backend(EtcdConfig {
                endpoints: split_list(&endpoints).map(str::to_owned).collect(),
                field: ENV_ETCD_ENDPOINTS,
            }),
            (None, Some(urls)) => Self::from_vars(&urls, mode, master),
            (None, None) => Self::with_problem(EnvProblem::Missing),
        }
    }

    /// Like [`from_env`](Self::from_env), but uses `fallback` when `LOCK_REDIS_URL` is unset or empty.
    pub fn from_env_or(fallback: LockConfig) -> Self {
        match Self::from_env() {
            LockConfig {
                backend: BackendChoice::Env(EnvProblem::Missing),
                ..
            } => fallback,
            config => config,
        }
    }

    fn from_vars(urls: &str, mode: Option<&str>, master: Option<&str>) -> Self {
        let urls: Vec<&str> = split_list(urls).collect();
        let invalid = |field, reason: &str| {
            Self::with_problem(EnvProblem::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if urls.is_empty() {
            return Self::with_problem(EnvProblem::Missing);
        }
        match mode.map(str::trim) {
            None => match urls.as_slice() {
                [one] => Self::single(*one),
                many => Self::redlock(many.iter().copied()),
            },
            Some("single") => match urls.as_slice() {
                [one] => Self::single(*one),
                _ => invalid(ENV_URL, "must be one URL with LOCK_REDIS_MODE=single"),
            },
            Some("redlock") => Self::redlock(urls),
            Some("cluster") => Self::cluster(urls),
            Some("sentinel") => match master.map(str::trim) {
                Some(master) => Self::sentinel(master, urls),
                None => invalid(
                    ENV_SENTINEL_MASTER,
                    "must name the master with LOCK_REDIS_MODE=sentinel",
                ),
            },
            Some(_) => invalid(
                ENV_MODE,
                "must be one of single, redlock, cluster, sentinel",
            ),
        }
    }

    fn with_problem(problem: EnvProblem) -> Self {
        Self::with_choice(BackendChoice::Env(problem))
    }
}

/// Why [`LockConfig::from_env`] chose no backend: `init` reports it.
#[derive(Clone)]
pub(crate) enum EnvProblem {
    /// Neither `LOCK_REDIS_URL` nor `LOCK_ETCD_ENDPOINTS` names anything.
    Missing,
    /// Both are set.
    Both,
    /// A variable holds a value that cannot be used.
    Invalid { field: &'static str, reason: String },
}

impl EnvProblem {
    pub(super) fn error(&self) -> LockError {
        match self {
            EnvProblem::Missing => LockError::config(
                ENV_URL,
                "is not set (expected one redis:// URL, or a comma-separated list for redlock; \
                 or set LOCK_ETCD_ENDPOINTS for etcd)",
            ),
            EnvProblem::Both => LockError::config(
                ENV_ETCD_ENDPOINTS,
                "is set together with LOCK_REDIS_URL: set only one of them",
            ),
            EnvProblem::Invalid { field, reason } => LockError::config(field, reason.clone()),
        }
    }
}

/// What `Debug` of the config shows.
impl fmt::Display for EnvProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvProblem::Missing => write!(f, "from_env({ENV_URL} unset)"),
            EnvProblem::Both => write!(f, "from_env({ENV_URL} and {ENV_ETCD_ENDPOINTS} both set)"),
            EnvProblem::Invalid { field, .. } => write!(f, "from_env({field} invalid)"),
        }
    }
}

/// The non-empty, trimmed items of a comma-separated list.
fn split_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::tests::field;

    /// The backend as `Debug` shows it.
    fn backend(config: LockConfig) -> String {
        format!("{:?}", config.backend)
    }

    #[test]
    fn invalid_variables_name_their_variable() {
        assert_eq!(
            field(LockConfig::from_vars(" , ", None, None)),
            "LOCK_REDIS_URL"
        );
        assert_eq!(
            field(LockConfig::from_vars("redis://a/", Some("ring"), None)),
            "LOCK_REDIS_MODE"
        );
        assert_eq!(
            field(LockConfig::from_vars("redis://a/", Some("sentinel"), None)),
            "LOCK_REDIS_SENTINEL_MASTER"
        );
        assert_eq!(
            field(LockConfig::from_vars(
                "redis://a/,redis://b/",
                Some("single"),
                None
            )),
            "LOCK_REDIS_URL"
        );
    }

    #[test]
    fn the_mode_variable_picks_cluster_and_sentinel() {
        assert_eq!(
            backend(LockConfig::from_vars(
                "redis://a:1/, redis://b:2/",
                Some("cluster"),
                None
            )),
            "cluster([redis://a:1/, redis://b:2/])"
        );
        assert_eq!(
            backend(LockConfig::from_vars(
                "redis://a:26379/",
                Some("sentinel"),
                Some("locks")
            )),
            "sentinel(locks, [redis://a:26379/])"
        );
        assert_eq!(
            backend(LockConfig::from_vars("redis://a/", Some("redlock"), None)),
            "redlock([redis://a/])"
        );
        assert!(
            LockConfig::cluster(["redis://127.0.0.1:7000/"])
                .min_replicas(1)
                .validate()
                .is_ok()
        );
        let shown = format!(
            "{:?}",
            LockConfig::sentinel("locks", ["redis://:hunter2@127.0.0.1:26379/"])
        );
        assert!(
            !shown.contains("hunter2") && shown.contains("sentinel(locks"),
            "{shown}"
        );
    }

    #[test]
    fn url_lists_pick_the_backend() {
        assert_eq!(
            backend(LockConfig::from_vars("redis://a/", None, None)),
            "single(redis://a/)"
        );
        assert_eq!(
            backend(LockConfig::from_vars(
                "redis://a/, redis://b/,redis://c/",
                None,
                None
            )),
            "redlock([redis://a/, redis://b/, redis://c/])"
        );
    }

    #[test]
    fn etcd_is_selected_by_its_own_variable() {
        assert_eq!(
            backend(LockConfig::from_env_vars(
                Some(" a:1, b:2 ,".into()),
                None,
                None,
                None
            )),
            "etcd([a:1, b:2])"
        );
        assert_eq!(
            backend(LockConfig::from_env_vars(
                Some(" ".into()),
                Some("redis://h/".into()),
                None,
                None
            )),
            "single(redis://h/)"
        );
        assert_eq!(
            field(LockConfig::from_env_vars(
                Some("a:1".into()),
                Some("redis://h/".into()),
                None,
                None
            )),
            ENV_ETCD_ENDPOINTS
        );
        assert_eq!(
            field(LockConfig::from_env_vars(None, None, None, None)),
            ENV_URL
        );
        // Without the feature, and for bad endpoints with it, the error names where they came from.
        assert_eq!(
            field(LockConfig::from_env_vars(
                Some("nope://x".into()),
                None,
                None,
                None
            )),
            ENV_ETCD_ENDPOINTS
        );
        assert_eq!(field(LockConfig::etcd(["nope://x"])), "endpoints");
        assert_eq!(field(LockConfig::etcd(Vec::<String>::new())), "endpoints");
        if !cfg!(feature = "etcd") {
            let msg = LockConfig::etcd(["127.0.0.1:2379"])
                .validate()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(msg.contains("`etcd` feature"), "{msg}");
        }
        let shown = format!(
            "{:?}",
            LockConfig::etcd(["http://u:hunter2@h:2379", "u:hunter2@h2:2379"])
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("http://u:***@h:2379, u:***@h2:2379"),
            "{shown}"
        );
    }
}
