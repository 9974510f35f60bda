//! The configuration of a client: [`LockConfig`], its constructors and builder methods, and the
//! [`Settings`] every lock operation reads. Each constructor stores its backend's own config
//! (defined, validated and shown by the backend's file in `backend/`). Reading the environment
//! is in `env.rs`, validation in `validate.rs`, the PEM given for TLS in `tls.rs`, and what
//! `Debug` shows in `redact.rs`.

mod env;
mod redact;
mod tls;
mod validate;

use std::fmt;
use std::time::Duration;

pub use self::env::{ENV_ETCD_ENDPOINTS, ENV_MODE, ENV_SENTINEL_MASTER, ENV_URL};
pub(crate) use self::redact::{redact, redact_all, redact_endpoint};
pub(crate) use self::tls::Tls;
pub(crate) use self::validate::check_ttl;

use self::env::EnvProblem;
use crate::backend::{
    BackendConfig, ClusterConfig, EtcdConfig, InMemory, NodeSource, RedlockConfig, SentinelConfig,
    SingleConfig,
};

/// How the process talks to its locks: which backend, plus the defaults and timeouts every lock uses.
///
/// Constructors never fail; [`init`](crate::init) (or [`LockClient::new`](crate::LockClient::new))
/// validates everything and reports the first invalid value as [`LockError::Config`] naming the
/// field. `Debug` never shows passwords.
///
/// [`LockError::Config`]: crate::LockError::Config
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
    pub(crate) backend: BackendChoice,
    pub(crate) settings: Settings,
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

/// The backend a config names, or why `from_env` could not name one.
#[derive(Clone)]
pub(crate) enum BackendChoice {
    Backend(Box<dyn BackendConfig>),
    /// `from_env` could not choose; `init` reports why.
    Env(EnvProblem),
}

impl LockConfig {
    fn with_backend(backend: impl BackendConfig) -> Self {
        Self::with_choice(BackendChoice::Backend(Box::new(backend)))
    }

    fn with_choice(backend: BackendChoice) -> Self {
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
                tls: Tls::default(),
                master_auth: None,
                owner: None,
                #[cfg(feature = "testing")]
                faults: None,
            },
            runtime: None,
        }
    }

    /// One Redis master: `redis://[user:pass@]host[:port][/db]`, or `rediss://` with the `tls` feature.
    pub fn single(url: impl Into<String>) -> Self {
        Self::with_backend(SingleConfig {
            node: NodeSource::Url(url.into()),
            field: "url",
        })
    }

    /// One Redis master, reached as your own `redis::Client` reaches it: its address, ACL user
    /// and password, database, RESP version and TLS settings (`rediss://`, with the `tls`
    /// feature; a client built with `redis::Client::build_with_tls` keeps its certificates), set
    /// once where you configure the client. Name it `lock_runtime::redis::Client` (the redis-rs
    /// 1.x this crate is built with, re-exported), or pin a `redis` dependency of your own to
    /// 1.x: a client of another major version is another type. The library opens connections of its own from it
    /// (per runtime, as for [`single`](Self::single)); the client itself is not used or kept.
    /// A client that connects over a Unix socket is a `Config` error naming `client`.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use lock_runtime::redis;
    ///
    /// let client = redis::Client::open("redis://locker:secret@10.0.0.5:6379/2")?;
    /// lock_runtime::init(lock_runtime::LockConfig::from_client(client))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_client(client: redis::Client) -> Self {
        Self::with_backend(SingleConfig {
            node: NodeSource::Client(Box::new(client.get_connection_info().clone())),
            field: "client",
        })
    }

    /// The Redlock algorithm over independent Redis masters (not replicas of each other, not a
    /// Redis Cluster). A lock is held when a majority (N/2 + 1) of the nodes granted it.
    pub fn redlock<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_backend(RedlockConfig {
            nodes: urls
                .into_iter()
                .map(|url| NodeSource::Url(url.into()))
                .collect(),
            field: "urls",
        })
    }

    /// [`redlock`](Self::redlock) over the masters your own `redis::Client`s (of
    /// `lock_runtime::redis`) reach, each as
    /// [`from_client`](Self::from_client) takes one (its credentials, database and TLS
    /// settings). Errors name `clients`.
    pub fn redlock_from_clients<I>(clients: I) -> Self
    where
        I: IntoIterator<Item = redis::Client>,
    {
        Self::with_backend(RedlockConfig {
            nodes: clients
                .into_iter()
                .map(|client| NodeSource::Client(Box::new(client.get_connection_info().clone())))
                .collect(),
            field: "clients",
        })
    }

    /// Redis Cluster, reached through any of `seed_urls` (the client learns the rest of the
    /// topology, follows `MOVED`/`ASK` during resharding and refreshes it after a failover).
    ///
    /// Every key of a lock (its lock key and release channel, and the fence counter it counts on,
    /// one per slot) lives in one slot.
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
        Self::with_backend(ClusterConfig {
            seed_urls: seed_urls.into_iter().map(Into::into).collect(),
        })
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
    /// Each URL is a sentinel's address: `redis://[user:password@]host:port[/db]` (`rediss://`
    /// for TLS). The user, password and database of the first URL apply to the *master* (as for
    /// [`single`](Self::single)), unless [`master_auth`](Self::master_auth) gives the master's
    /// credentials. A sentinel is first asked without credentials; one that requires them
    /// (`requirepass` in its config, or an ACL user: it answers `NOAUTH`) is asked again, and
    /// from then on, with the user and password of its own URL. So one password set on the
    /// sentinels and the data nodes alike goes in the URLs alone; sentinels with a password of
    /// their own take it in their URLs, and the master's goes to `master_auth`. A sentinel that
    /// asks for credentials its URL does not have, or refuses them, fails the call as
    /// `Unavailable` with [`FailureKind::Auth`](crate::FailureKind::Auth), naming that
    /// sentinel. Passwords never show in `Debug` or in errors.
    ///
    /// The promise is the single-node one while the master keeps the key; as with a cluster, a
    /// failover can promote a replica that never saw a grant (see
    /// [`min_replicas`](Self::min_replicas)).
    pub fn sentinel<I, S>(master_name: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_backend(SentinelConfig {
            master_name: master_name.into(),
            sentinel_urls: sentinel_urls.into_iter().map(Into::into).collect(),
        })
    }

    /// Locks that live in this process only: for tests, demos and single-instance deployments.
    /// Same semantics as Redis (expiry, renewal, fencing, wake-ups), but nothing is shared between
    /// processes.
    pub fn in_memory() -> Self {
        Self::with_backend(InMemory)
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
        Self::with_backend(EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            field: "endpoints",
        })
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
    /// (default 100ms), doubling with every attempt (each jittered, see
    /// [`retry_jitter`](Self::retry_jitter)). A waiter never sleeps past the holder's remaining
    /// TTL. Behind a holder whose release announces nothing (another library on the same key,
    /// such as redis-py's `Lock` or node-redlock, which the refusal tells by the holder's
    /// value), the pauses stop at `2 x retry_delay x (1 + retry_jitter)` (300 ms by default):
    /// the waiter notices that release within that pause plus one request. Behind a holder of
    /// this library, whose release wakes its waiters, they are only a safety net for a lost
    /// message: they grow to `8 x retry_delay x (1 + retry_jitter)` (1.2 s), and a waiter with a
    /// place in the lock's queue asks only to renew it (once a second by default). A key deleted
    /// by hand under such a holder is noticed within those pauses.
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
    ///
    /// [`LockError::MaxHoldExceeded`]: crate::LockError::MaxHoldExceeded
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.settings.default_max_hold = Some(max_hold);
        self
    }

    /// Cluster and Sentinel only: a grant counts only once `n` replicas of the master
    /// acknowledged it (`WAIT n timeout`, sent behind the acquire script on the same connection,
    /// with a timeout of half `response_timeout`; under Sentinel a connection of its own for each
    /// grant or renewal in flight, so a `WAIT` for a lagging replica holds up no other request). With fewer acknowledgements the grant is
    /// withdrawn and the call fails with [`LockError::Unavailable`] (cause kind
    /// [`FailureKind::Replication`](crate::FailureKind::Replication), retried within `wait`);
    /// each renewal is checked the same way and counts as failed otherwise (the lock is lost if
    /// no renewal is confirmed before its validity runs out).
    ///
    /// [`LockError::Unavailable`]: crate::LockError::Unavailable
    ///
    /// This closes the common failover case, a replica promoted before it received the grant.
    /// It does not make replication synchronous: `WAIT` counts replicas that *received* the
    /// write, not ones that persisted it, so a replica that restarts without its data, a
    /// failover to a replica that was not among the acknowledging ones (with more replicas
    /// than `n`), or a partition in which the old master keeps answering a minority can still
    /// lose a lock. On a cluster every `WAIT` blocks the shared connection to that master until
    /// the replicas answer, so it costs throughput there (see the README's benchmark). Any other backend
    /// rejects it (`LockError::Config` naming `min_replicas`).
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.settings.min_replicas = Some(n);
        self
    }

    /// Whether this client's locks carry a fencing token unless a lock says otherwise
    /// ([`Lock::fencing`](crate::Lock::fencing), the attribute's `fencing = true`): a number that
    /// grows with every grant of a key, which a resource uses to reject a superseded holder
    /// ([`crate::fence`]). Default: off on Redis topologies, where a token costs a counter; on
    /// etcd (the key's revision) and in memory (a counter) every lock carries one, whatever this
    /// says, as it costs nothing there.
    ///
    /// On Redis the counter is one key per server (per master; per node under Redlock; per hash
    /// slot on Cluster, in the lock key's slot), not one per lock name: a counter that grows for
    /// every key grows for each. It never runs more than 100 ms behind the server's clock in
    /// microseconds, so tokens still grow when the counter is lost (a restart without data, a
    /// failover to a replica that missed the last grants) as long as the clock does not go back.
    /// In Redlock mode the token is the largest of the granting nodes' counters, written back to
    /// a majority of those nodes before the lock is handed out (one more round trip per
    /// acquire), so every later majority sees it.
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.settings.fencing = Some(enabled);
        self
    }

    /// Runs connections, renewal and lock operations on `runtime` (a multi-thread tokio runtime)
    /// instead of the library's own background runtime.
    ///
    /// By default connections and renewal live on the library's runtime, which is what lets locks
    /// work from any runtime, from several runtimes in turn, and from plain sync code; on a single
    /// node, async calls from a multi-thread runtime with IO and time (say `#[tokio::main]` or
    /// `#[tokio::test(flavor = "multi_thread")]`) still go over a connection of their own runtime
    /// (made for it after its first call, closed when it shuts down), so they cross no threads.
    /// Other calls (Redlock, Cluster, Sentinel, current-thread runtimes) hop to the library's
    /// runtime and back. A service with one long-lived runtime can pass
    /// `tokio::runtime::Handle::current()` here: everything then stays on it. The runtime must
    /// live as long as any lock: once it shuts down, lock calls fail with [`LockError::Runtime`].
    /// Sync lock calls made on its worker threads use `block_in_place`, so they never starve it.
    ///
    /// [`LockError::Runtime`]: crate::LockError::Runtime
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Sentinel only: the credentials of the master the sentinels name (and of whichever node
    /// they name after a failover), instead of the user and password of the first sentinel URL
    /// (see [`sentinel`](Self::sentinel)): for sentinels whose password is not the master's. An
    /// empty `username` is the `default` user (`requirepass`); an empty `username` and
    /// `password` connect to the master without credentials. The database still comes from the
    /// first URL. Any other backend rejects it (`LockError::Config` naming `master_auth`). The
    /// password never shows in `Debug` or in errors.
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    ///
    /// // Sentinels with `requirepass "s3cret"`, a master with `requirepass "m4ster"`.
    /// let config = LockConfig::sentinel(
    ///     "locks",
    ///     ["redis://:s3cret@10.0.0.1:26379", "redis://:s3cret@10.0.0.2:26379"],
    /// )
    /// .master_auth("", "m4ster");
    /// let shown = format!("{config:?}");
    /// assert!(!shown.contains("s3cret") && !shown.contains("m4ster"));
    /// ```
    pub fn master_auth(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.settings.master_auth = Some(Credentials {
            username: username.into(),
            password: password.into(),
        });
        self
    }

    /// The owner name every grant of this client records (default: `host:pid`), shown by
    /// [`inspect`](crate::inspect) in [`LockInfo::owners`](crate::LockInfo::owners) and by
    /// `lockctl` beside the host, process id and program, which are always recorded. Name it
    /// after what an operator looks for: the service and its instance (`billing-7`, a pod name).
    ///
    /// `init` fails with `LockError::Config` naming `owner` when it is empty, longer than 128
    /// bytes or holds a control character.
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    ///
    /// let config = LockConfig::in_memory().owner("billing-7");
    /// # let client = lock_runtime::LockClient::new(config).unwrap();
    /// ```
    pub fn owner(mut self, name: impl Into<String>) -> Self {
        self.settings.owner = Some(name.into());
        self
    }

    /// Trusts the certificates in `pem` (one or more `-----BEGIN CERTIFICATE-----` blocks),
    /// instead of the public (webpki) roots, on every TLS connection the client makes: to each
    /// `rediss://` node (single, Redlock), to every node of a Cluster, to the sentinels and the
    /// masters they name, and to etcd `https://` endpoints. For servers whose certificates come
    /// from a private CA. The server's certificate must name the host of the URL (a DNS name, or
    /// an IP address as an IP subject alternative name).
    ///
    /// Needs the `tls` feature. `init` fails with `LockError::Config` naming `tls_root_ca`
    /// without it, when `pem` holds no certificate or one that does not parse, and when no URL
    /// uses TLS (a CA given for plain `redis://` would silently go unused).
    ///
    /// ```no_run
    /// use lock_runtime::LockConfig;
    ///
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").expect("the CA certificate");
    /// lock_runtime::init(LockConfig::single("rediss://redis.internal:6380/").tls_root_ca(ca))?;
    /// # Ok::<(), lock_runtime::LockError>(())
    /// ```
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.settings.tls.root_ca = Some(pem.into());
        self
    }

    /// Presents the certificate chain `cert_pem` (the client's certificate first) and its
    /// private key `key_pem` (PKCS#8, PKCS#1 or SEC1 PEM) on every TLS connection, for servers
    /// that verify their clients (Redis `tls-auth-clients yes`, etcd `--client-cert-auth`).
    /// Applies where [`tls_root_ca`](Self::tls_root_ca) does, with or without it.
    ///
    /// Needs the `tls` feature. `init` fails with `LockError::Config` naming `tls_client_cert`
    /// without it, when either PEM does not parse, when the key is not the certificate's, and
    /// when no URL uses TLS. The key never shows in `Debug` or in errors.
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.settings.tls.client_cert = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// In memory only (cargo feature `testing`): the clients built from this config suffer the
    /// faults `faults` injects, so tests can see what their code does when a lock is
    /// unavailable or lost (see [`testing`](crate::testing)). Keep a clone to inject them. Any
    /// other backend rejects it (`LockError::Config` naming `faults`).
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use lock_runtime::testing::Faults;
    ///
    /// let faults = Faults::new();
    /// let client = lock_runtime::LockClient::new(LockConfig::in_memory().faults(faults.clone()));
    /// # assert!(client.is_ok());
    /// faults.unavailable("wallet:*");
    /// ```
    #[cfg(feature = "testing")]
    pub fn faults(mut self, faults: crate::testing::Faults) -> Self {
        self.settings.faults = Some(faults);
        self
    }
}

impl Default for LockConfig {
    /// Same as [`LockConfig::from_env`].
    fn default() -> Self {
        Self::from_env()
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
    /// What TLS connections trust and present.
    pub(crate) tls: Tls,
    /// Sentinel: the master's credentials, when not the first URL's.
    pub(crate) master_auth: Option<Credentials>,
    /// The owner name recorded in every grant (`None`: `host:pid`).
    pub(crate) owner: Option<String>,
    /// In memory: the faults injected into the node (feature `testing`).
    #[cfg(feature = "testing")]
    pub(crate) faults: Option<crate::testing::Faults>,
}

/// A user name and password given apart from a URL. `Debug` shows the user only.
#[derive(Clone)]
pub(crate) struct Credentials {
    /// Empty: the `default` user.
    pub(crate) username: String,
    pub(crate) password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:***", self.username)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
