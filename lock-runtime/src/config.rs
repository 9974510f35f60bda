use std::fmt;
use std::time::Duration;

use crate::LockError;

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

/// How the process talks to its locks: which backend, plus the defaults and timeouts every lock uses.
///
/// Constructors never fail; [`init`](crate::init) (or [`LockClient::new`](crate::LockClient::new))
/// validates everything and reports the first invalid value as [`LockError::Config`] naming the
/// field. `Debug` never shows passwords.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockConfig;
///
/// let config = LockConfig::single("redis://:secret@127.0.0.1:6379/0")
///     .key_prefix("billing:lock:")
///     .default_ttl(Duration::from_secs(10))
///     .default_wait(Duration::from_secs(2));
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone)]
pub struct LockConfig {
    pub(crate) backend: BackendConfig,
    pub(crate) settings: Settings,
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

#[derive(Clone)]
pub(crate) enum BackendConfig {
    Single(String),
    Redlock(Vec<String>),
    InMemory,
    /// etcd endpoints, and the field (or variable) they came from.
    Etcd(Vec<String>, &'static str),
    /// `from_env` found nothing usable; `init` reports it.
    EnvMissing,
    /// `from_env` found both `LOCK_REDIS_URL` and `LOCK_ETCD_ENDPOINTS` set.
    EnvBoth,
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        urls: Vec<String>,
    },
    /// `from_env` found a value it cannot use; `init` reports it.
    EnvInvalid {
        field: &'static str,
        reason: String,
    },
}

impl LockConfig {
    fn with_backend(backend: BackendConfig) -> Self {
        LockConfig {
            backend,
            settings: Settings {
                key_prefix: "lock:".to_owned(),
                default_ttl: Duration::from_secs(30),
                default_wait: Duration::ZERO,
                retry_delay: Duration::from_millis(100),
                retry_jitter: 0.5,
                renew_interval: None,
                drift_factor: 0.01,
                connect_timeout: Duration::from_secs(1),
                response_timeout: Duration::from_millis(500),
                fencing: None,
                default_max_hold: None,
                min_replicas: None,
            },
            runtime: None,
        }
    }

    /// One Redis master: `redis://[user:pass@]host[:port][/db]`, or `rediss://` with the `tls` feature.
    pub fn single(url: impl Into<String>) -> Self {
        Self::with_backend(BackendConfig::Single(url.into()))
    }

    /// The Redlock algorithm over independent Redis masters (not replicas of each other, not a
    /// Redis Cluster). A lock is held when a majority (N/2 + 1) of the nodes granted it.
    pub fn redlock<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_backend(BackendConfig::Redlock(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// Redis Cluster, reached through any of `seed_urls` (the client learns the rest of the
    /// topology, follows `MOVED`/`ASK` during resharding and refreshes it after a failover).
    ///
    /// Every key of a lock (its lock key, fence counter and release channel) lives in one slot.
    /// A multi-key lock whose keys share a hash tag (`{user:42}:a`, `{user:42}:b`) is taken in one
    /// script call on that slot's master; otherwise its keys are taken slot by slot in canonical
    /// order, and a refusal gives back what was already taken. Releases wake waiters through
    /// sharded pub/sub (`SPUBLISH`, Redis 7), so only the shard's subscribers hear them, and
    /// renewal sends one pipeline per master.
    ///
    /// The promise is the single-node one, per master: a lock is safe while its master keeps the
    /// key. Replication is asynchronous: a failover can promote a replica that never saw a grant
    /// (see [`min_replicas`](Self::min_replicas)). Credentials, TLS (`rediss://`, `tls`
    /// feature) and the database of the first URL apply to every node.
    pub fn cluster<I, S>(seed_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_backend(BackendConfig::Cluster(
            seed_urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// A master with replicas behind Redis Sentinel: the client asks the sentinels (all of
    /// `sentinel_urls` at once; the address most of them name wins) for the master named
    /// `master_name`, asks again before the next call whenever the master stops answering,
    /// refuses a write (`READONLY`: demoted) or a connection breaks, and at least once a second
    /// while calls are made (a demoted master may keep answering until the sentinels
    /// reconfigure it). After a failover, lock calls reach the new master within: the
    /// sentinels' own failover time (`down-after-milliseconds` plus the election) + 1s +
    /// `connect_timeout` + `response_timeout`, plus the acquire's retry backoff (at most 12 ×
    /// `retry_delay`) for a call already waiting. Waiters subscribed on the old master are
    /// woken to retry when the client moves.
    ///
    /// Each URL is a sentinel's address: `redis://host:port` (`rediss://` for TLS). Its user,
    /// password and database apply to the *master* (as for [`single`](Self::single)); sentinels
    /// are asked without credentials, over the same scheme.
    ///
    /// The promise is the single-node one while the master keeps the key; as with a cluster, a
    /// failover can promote a replica that never saw a grant (see
    /// [`min_replicas`](Self::min_replicas)).
    pub fn sentinel<I, S>(master_name: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_backend(BackendConfig::Sentinel {
            master: master_name.into(),
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
        })
    }

    /// Locks that live in this process only: for tests, demos and single-instance deployments.
    /// Same semantics as Redis (expiry, renewal, fencing, wake-ups), but nothing is shared between
    /// processes.
    pub fn in_memory() -> Self {
        Self::with_backend(BackendConfig::InMemory)
    }

    /// Locks on an etcd v3 cluster (cargo feature `etcd`; without it, `init` fails with a
    /// `Config` error naming `endpoints`). `endpoints` are the members' client URLs:
    /// `http://host:port`, `host:port`, or `https://host:port` (with the `tls` feature too);
    /// `http://user:password@host:port` authenticates as that etcd user (the same user on every
    /// endpoint). The client talks to one member at a time and moves to the next when one fails.
    ///
    /// What etcd adds over Redis: every grant, renewal and release is a linearizable write
    /// committed by a majority of members (raft), so a lock survives the loss of any minority,
    /// including the leader, and no failover can hand it out twice; the fencing token is the key's
    /// create revision, which grows across the whole cluster and across leader changes. A lock
    /// is a key bound to a lease whose TTL is the lock's `ttl` rounded up to whole seconds (etcd
    /// counts leases in seconds and raises short ones to its minimum, 2s with default member
    /// settings): the holder still considers it valid only for `ttl` from its last confirmed
    /// keepalive, but a crashed holder's lock frees when the rounded-up lease expires.
    pub fn etcd<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_backend(BackendConfig::Etcd(
            endpoints.into_iter().map(Into::into).collect(),
            "endpoints",
        ))
    }

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
            (Some(_), Some(_)) => Self::with_backend(BackendConfig::EnvBoth),
            (Some(endpoints), None) => Self::with_backend(BackendConfig::Etcd(
                split_list(&endpoints).map(str::to_owned).collect(),
                ENV_ETCD_ENDPOINTS,
            )),
            (None, Some(urls)) => Self::from_vars(&urls, mode, master),
            (None, None) => Self::with_backend(BackendConfig::EnvMissing),
        }
    }

    /// Like [`from_env`](Self::from_env), but uses `fallback` when `LOCK_REDIS_URL` is unset or empty.
    pub fn from_env_or(fallback: LockConfig) -> Self {
        match Self::from_env() {
            LockConfig {
                backend: BackendConfig::EnvMissing,
                ..
            } => fallback,
            config => config,
        }
    }

    fn from_vars(urls: &str, mode: Option<&str>, master: Option<&str>) -> Self {
        let urls: Vec<&str> = split_list(urls).collect();
        let invalid = |field, reason: &str| {
            Self::with_backend(BackendConfig::EnvInvalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if urls.is_empty() {
            return Self::with_backend(BackendConfig::EnvMissing);
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

    /// Prefix put in front of every lock key in Redis (default `"lock:"`). Lets an ACL user be
    /// limited to `~lock:*`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.key_prefix = prefix.into();
        self
    }

    /// Time to live of a lock when the call site names none (default 30s). The lock is renewed
    /// while held, so this bounds how long a crashed holder blocks others, not how long a body may run.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.settings.default_ttl = ttl;
        self
    }

    /// How long to wait for a held lock when the call site names no `wait` (default 0: one attempt).
    /// `Duration::MAX` waits for as long as it takes.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.settings.default_wait = wait;
        self
    }

    /// Base delay between attempts while waiting when no release notification arrives
    /// (default 100ms). A waiter never sleeps past the holder's remaining TTL.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.settings.retry_delay = delay;
        self
    }

    /// Random spread applied to `retry_delay`, as a fraction in `[0, 1]` (default 0.5: each delay is
    /// drawn from 50%..150% of the base), so that waiters do not retry in lockstep.
    pub fn retry_jitter(mut self, fraction: f64) -> Self {
        self.settings.retry_jitter = fraction;
        self
    }

    /// How often a held lock is renewed (default: a third of its TTL). A renewal is also always
    /// sent early enough to be confirmed before the lock's validity runs out (one
    /// `response_timeout`, at most half the TTL, before), whatever the interval. Must leave room for one request within
    /// `default_ttl`: `renew_interval + response_timeout + drift < default_ttl`.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.settings.renew_interval = Some(interval);
        self
    }

    /// Clock drift allowance as a fraction of the TTL (default 0.01). A lock is considered valid
    /// until `ttl - elapsed - (ttl * drift_factor + 2ms)`; past that without a confirmed renewal it is lost.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.settings.drift_factor = factor;
        self
    }

    /// Timeout for establishing a connection to a node (default 1s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Timeout for one request to a node (default 500ms). In Redlock mode this is the per-node
    /// timeout: a slow node never delays a decision the other nodes already allow.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// The longest any lock may be held when the call site names no `max_hold` (default: no
    /// limit). Past it renewal stops, an async body is cancelled, a sync body runs to its end, and
    /// the call returns [`LockError::MaxHoldExceeded`]; the lock is released when the body ends
    /// (or expires by its TTL, at most one TTL later, if the body does not end).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.settings.default_max_hold = Some(max_hold);
        self
    }

    /// Cluster and Sentinel only: a grant counts only once `n` replicas of the master
    /// acknowledged it (`WAIT n timeout`, sent behind the acquire script on the same connection,
    /// with a timeout of half `response_timeout`). With fewer acknowledgements the grant is
    /// withdrawn and the call fails with [`LockError::Unavailable`] (cause kind
    /// [`FailureKind::Replication`](crate::FailureKind::Replication), retried within `wait`);
    /// each renewal is checked the same way and counts as failed otherwise (the lock is lost if
    /// no renewal is confirmed before its validity runs out).
    ///
    /// This closes the common failover case, a replica promoted before it received the grant.
    /// It does not make replication synchronous: `WAIT` counts replicas that *received* the
    /// write, not ones that persisted it, so a replica that restarts without its data, a
    /// failover to a replica that was not among the acknowledging ones (with more replicas
    /// than `n`), or a partition in which the old master keeps answering a minority can still
    /// lose a lock. Every `WAIT` blocks the shared connection to that master until the
    /// replicas answer, so it costs throughput (see the README's benchmark). Any other backend
    /// rejects it (`LockError::Config` naming `min_replicas`).
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.settings.min_replicas = Some(n);
        self
    }

    /// Whether locks carry a fencing token: a per-key number that grows with every grant, which a
    /// resource can use to reject a superseded holder. Default: on for single-node and in-memory
    /// locks, off for Redlock.
    ///
    /// The counter lives in Redis forever (one small key per lock name); turn fencing off when lock
    /// names are unbounded and nothing checks the token. In Redlock mode the token is the largest
    /// of the granting nodes' counters, written back to a majority before the lock is handed out
    /// (one more round trip per acquire), so every later majority sees it; it is monotonic as long
    /// as no node loses its counters (`appendfsync always`).
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.settings.fencing = Some(enabled);
        self
    }

    /// Runs connections, renewal and lock operations on `runtime` (a multi-thread tokio runtime)
    /// instead of the library's own background runtime.
    ///
    /// By default every lock operation hops to the library's runtime and back, which is what lets
    /// locks work from any runtime, from several runtimes in turn, and from plain sync code. A
    /// service with one long-lived runtime (say `#[tokio::main]`) can pass
    /// `tokio::runtime::Handle::current()` here: calls made on that runtime then stay on it, which
    /// roughly halves the CPU cost per lock (see the README's benchmark). The runtime must live as
    /// long as any lock: once it shuts down, lock calls fail with [`LockError::Runtime`]. Sync lock
    /// calls made on its worker threads use `block_in_place`, so they never starve it.
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The config with every value checked, and the URLs parsed.
    pub(crate) fn validate(&self) -> Result<ValidConfig, LockError> {
        let backend = match &self.backend {
            BackendConfig::Single(url) => ValidBackend::Single(parse_url("url", url)?),
            BackendConfig::Redlock(urls) => {
                if urls.is_empty() {
                    return Err(LockError::config("urls", "must name at least one node"));
                }
                let mut nodes: Vec<NodeAddr> = Vec::with_capacity(urls.len());
                for url in urls {
                    let node = parse_url("urls", url)?;
                    if nodes.iter().any(|n| n.same_node(&node)) {
                        return Err(LockError::config(
                            "urls",
                            format!("names node {} twice", node.name),
                        ));
                    }
                    nodes.push(node);
                }
                ValidBackend::Redlock(nodes)
            }
            BackendConfig::InMemory => ValidBackend::InMemory,
            #[cfg(feature = "etcd")]
            BackendConfig::Etcd(endpoints, field) => {
                ValidBackend::Etcd(crate::backend::EtcdAddrs::parse(field, endpoints)?)
            }
            #[cfg(not(feature = "etcd"))]
            BackendConfig::Etcd(_, field) => {
                return Err(LockError::config(
                    field,
                    "selects etcd, which this build does not include: enable the `etcd` feature of lock-runtime",
                ));
            }
            BackendConfig::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(LockError::config(
                        "seed_urls",
                        "must name at least one node",
                    ));
                }
                ValidBackend::Cluster(
                    urls.iter()
                        .map(|url| parse_url("seed_urls", url))
                        .collect::<Result<_, _>>()?,
                )
            }
            BackendConfig::Sentinel { master, urls } => {
                if master.trim().is_empty() {
                    return Err(LockError::config("master_name", "must not be empty"));
                }
                if urls.is_empty() {
                    return Err(LockError::config(
                        "sentinel_urls",
                        "must name at least one sentinel",
                    ));
                }
                ValidBackend::Sentinel {
                    master: master.clone(),
                    sentinels: urls
                        .iter()
                        .map(|url| parse_url("sentinel_urls", url))
                        .collect::<Result<_, _>>()?,
                }
            }
            BackendConfig::EnvInvalid { field, reason } => {
                return Err(LockError::config(field, reason.clone()));
            }
            BackendConfig::EnvMissing => {
                return Err(LockError::config(
                    "LOCK_REDIS_URL",
                    "is not set (expected one redis:// URL, or a comma-separated list for redlock; \
                     or set LOCK_ETCD_ENDPOINTS for etcd)",
                ));
            }
            BackendConfig::EnvBoth => {
                return Err(LockError::config(
                    "LOCK_ETCD_ENDPOINTS",
                    "is set together with LOCK_REDIS_URL: set only one of them",
                ));
            }
        };
        let settings = &self.settings;
        if let Some(n) = settings.min_replicas {
            if !matches!(
                backend,
                ValidBackend::Cluster(_) | ValidBackend::Sentinel { .. }
            ) {
                return Err(LockError::config(
                    "min_replicas",
                    "only applies to cluster and sentinel (other backends have no replicas)",
                ));
            }
            if n == 0 {
                return Err(LockError::config("min_replicas", "must be at least 1"));
            }
        }
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
        if settings.key_prefix.contains(['{', '}']) {
            return Err(LockError::config(
                "key_prefix",
                "must not contain `{` or `}` (the lock key carries the hash tag)",
            ));
        }
        if let Some(runtime) = &self.runtime {
            if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
                return Err(LockError::config(
                    "runtime",
                    "must be a multi-thread runtime (a sync lock call on a current-thread runtime would block the thread that has to answer it)",
                ));
            }
        }
        let fencing = settings
            .fencing
            .unwrap_or(!matches!(&backend, ValidBackend::Redlock(nodes) if nodes.len() > 1));
        Ok(ValidConfig {
            runtime: self.runtime.clone(),
            backend,
            settings: settings.clone(),
            fencing,
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

impl Default for LockConfig {
    /// Same as [`LockConfig::from_env`].
    fn default() -> Self {
        Self::from_env()
    }
}

impl fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match &self.backend {
            BackendConfig::Single(url) => format!("single({})", redact(url)),
            BackendConfig::Redlock(urls) => format!(
                "redlock([{}])",
                urls.iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            BackendConfig::InMemory => "in_memory".to_owned(),
            BackendConfig::Etcd(endpoints, _) => format!(
                "etcd([{}])",
                endpoints
                    .iter()
                    .map(|e| redact_endpoint(e))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            BackendConfig::Cluster(urls) => format!(
                "cluster([{}])",
                urls.iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            BackendConfig::Sentinel { master, urls } => format!(
                "sentinel({master}, [{}])",
                urls.iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            BackendConfig::EnvMissing => format!("from_env({ENV_URL} unset)"),
            BackendConfig::EnvBoth => {
                format!("from_env({ENV_URL} and {ENV_ETCD_ENDPOINTS} both set)")
            }
            BackendConfig::EnvInvalid { field, .. } => format!("from_env({field} invalid)"),
        };
        f.debug_struct("LockConfig")
            .field("backend", &format_args!("{backend}"))
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
            )
            .finish()
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

/// The non-empty, trimmed items of a comma-separated list.
fn split_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// A validated configuration, ready to build a client from.
pub(crate) struct ValidConfig {
    pub(crate) runtime: Option<tokio::runtime::Handle>,
    pub(crate) backend: ValidBackend,
    pub(crate) settings: Settings,
    /// [`Settings::fencing`] resolved for the backend.
    pub(crate) fencing: bool,
}

#[allow(
    clippy::large_enum_variant,
    reason = "built once per client and consumed at once"
)]
pub(crate) enum ValidBackend {
    Single(NodeAddr),
    Redlock(Vec<NodeAddr>),
    InMemory,
    #[cfg(feature = "etcd")]
    Etcd(crate::backend::EtcdAddrs),
    Cluster(Vec<NodeAddr>),
    Sentinel {
        master: String,
        sentinels: Vec<NodeAddr>,
    },
}

/// One parsed Redis node address.
pub(crate) struct NodeAddr {
    /// `host:port`, for error messages (never with credentials).
    pub(crate) name: String,
    pub(crate) info: redis::ConnectionInfo,
}

impl NodeAddr {
    fn same_node(&self, other: &NodeAddr) -> bool {
        self.name == other.name
            && self.info.redis_settings().db() == other.info.redis_settings().db()
    }
}

/// The knobs every lock operation reads (checked by [`LockConfig::validate`]).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) key_prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: f64,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) drift_factor: f64,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// `None`: on, except for Redlock over more than one node.
    pub(crate) fencing: Option<bool>,
    pub(crate) default_max_hold: Option<Duration>,
    /// Cluster and Sentinel: replicas that must acknowledge each grant and renewal.
    pub(crate) min_replicas: Option<u32>,
}

impl Settings {
    /// The defaults with another `retry_delay`, for unit tests of waiting.
    #[cfg(test)]
    pub(crate) fn with_retry_delay(retry_delay: Duration) -> Self {
        match LockConfig::in_memory().retry_delay(retry_delay).validate() {
            Ok(valid) => valid.settings,
            Err(err) => panic!("valid config: {err}"),
        }
    }

    /// The safety margin subtracted from a TTL for clock drift (Redlock's `ttl * factor + 2ms`).
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// The bound of one request: a reconnect, then the answer.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.connect_timeout.saturating_add(self.response_timeout)
    }

    /// How often a lock with this TTL is renewed.
    pub(crate) fn renew_every(&self, ttl: Duration) -> Duration {
        self.renew_interval.unwrap_or(ttl / 3)
    }

    /// How long from now the renewal of a lock whose validity runs out in `remaining` is due:
    /// after the renew interval, but never later than one request before the validity runs out.
    pub(crate) fn renew_after(&self, ttl: Duration, remaining: Duration) -> Duration {
        self.renew_every(ttl)
            .min(remaining.saturating_sub(self.renew_margin(ttl)))
    }

    /// How long before its validity deadline a lock's renewal is sent at the latest: time for
    /// one request, but at most half the TTL (a short TTL with a long request timeout is renewed
    /// at intervals, not continuously).
    pub(crate) fn renew_margin(&self, ttl: Duration) -> Duration {
        self.response_timeout.min(ttl / 2)
    }
}

/// The one rule for a lock's TTL, from the config or from a call site: the bounds the attribute
/// checks at compile time (`lock_rules`), reported on `field`.
pub(crate) fn check_ttl(field: &'static str, ttl: Duration) -> Result<(), LockError> {
    lock_rules::check_ttl(ttl).map_err(|e| LockError::config(field, format!("{e}, got {ttl:?}")))
}

fn parse_url(field: &'static str, url: &str) -> Result<NodeAddr, LockError> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("redis") => {}
        Some("rediss") if cfg!(feature = "tls") => {}
        Some("rediss") => {
            return Err(LockError::config(
                field,
                format!(
                    "{} uses TLS; enable the `tls` feature of lock-runtime",
                    redact(url)
                ),
            ));
        }
        _ => {
            return Err(LockError::config(
                field,
                format!("{} is not a redis:// or rediss:// URL", redact(url)),
            ));
        }
    }
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
        LockError::config(
            field,
            format!("{} is not a valid redis URL: {}", redact(url), e.category()),
        )
    })?;
    let name = info.addr().to_string();
    Ok(NodeAddr { name, info })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(config: LockConfig) -> &'static str {
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
        assert_eq!(field(LockConfig::redlock(Vec::<String>::new())), "urls");
        assert_eq!(
            field(LockConfig::redlock([
                "redis://127.0.0.1:7000/",
                "redis://127.0.0.1:7000/"
            ])),
            "urls"
        );
        assert_eq!(
            field(LockConfig::from_vars(" , ", None, None)),
            "LOCK_REDIS_URL"
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
    fn huge_waits_and_delays_are_valid() {
        let config = LockConfig::in_memory()
            .default_wait(Duration::MAX)
            .retry_delay(Duration::MAX);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn renewal_is_due_one_request_before_the_deadline() {
        let settings = LockConfig::in_memory().settings;
        let ttl = Duration::from_secs(3);
        // Normally after the interval (ttl / 3)...
        assert_eq!(settings.renew_after(ttl, ttl), Duration::from_secs(1));
        // ...but a slow grant whose validity ends sooner is renewed a request before that.
        let at = settings.renew_after(ttl, Duration::from_millis(700));
        assert_eq!(at, Duration::from_millis(200));
        // Never in the past.
        assert_eq!(settings.renew_after(ttl, Duration::ZERO), Duration::ZERO);
        // A short ttl with a long request timeout: every third of the ttl, not continuously.
        let ttl = Duration::from_millis(300);
        assert_eq!(settings.renew_after(ttl, ttl), Duration::from_millis(100));
        assert_eq!(
            settings.renew_after(ttl, Duration::from_millis(290)),
            Duration::from_millis(100)
        );
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
    fn the_mode_variable_picks_cluster_and_sentinel() {
        assert!(matches!(
            LockConfig::from_vars("redis://a:1/, redis://b:2/", Some("cluster"), None).backend,
            BackendConfig::Cluster(ref urls) if urls.len() == 2
        ));
        assert!(matches!(
            LockConfig::from_vars("redis://a:26379/", Some("sentinel"), Some("locks")).backend,
            BackendConfig::Sentinel { ref master, ref urls } if master == "locks" && urls.len() == 1
        ));
        assert!(matches!(
            LockConfig::from_vars("redis://a/", Some("redlock"), None).backend,
            BackendConfig::Redlock(ref urls) if urls.len() == 1
        ));
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
        assert!(matches!(
            LockConfig::from_vars("redis://a/", None, None).backend,
            BackendConfig::Single(_)
        ));
        assert!(matches!(
            LockConfig::from_vars("redis://a/, redis://b/,redis://c/", None, None).backend,
            BackendConfig::Redlock(ref urls) if urls.len() == 3
        ));
    }

    #[test]
    fn etcd_is_selected_by_its_own_variable() {
        let endpoints = |config: LockConfig| match config.backend {
            BackendConfig::Etcd(endpoints, field) => Some((endpoints, field)),
            _ => None,
        };
        assert_eq!(
            endpoints(LockConfig::from_env_vars(
                Some(" a:1, b:2 ,".into()),
                None,
                None,
                None
            )),
            Some((vec!["a:1".to_owned(), "b:2".to_owned()], ENV_ETCD_ENDPOINTS))
        );
        assert!(matches!(
            LockConfig::from_env_vars(Some(" ".into()), Some("redis://h/".into()), None, None)
                .backend,
            BackendConfig::Single(_)
        ));
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
