//! A master behind Redis Sentinel: one [`RedisNode`] for the master the sentinels name, replaced
//! when they name another one.
//!
//! The master is looked up again (all sentinels at once, the address most of them name wins)
//! before the first call after a failure a failover explains (no connection, a broken one, no
//! answer in time, or `READONLY`: the node was demoted), and at least every [`RECHECK`] while
//! calls are made (a demoted master can keep answering for a while before the sentinels
//! reconfigure it). A failover is therefore followed within the sentinels' own failover time
//! plus [`RECHECK`] plus one lookup and one request. Waiters subscribed on the old master are
//! woken to retry at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::{ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

use super::redis::{NodeAddr, RedisNode};
use super::{
    Ask, Attempt, Backend, BackendConfig, BackendKind, BoxFuture, ExtendItem, ExtendOutcome, Mode,
    Node, NodeHold, Subscription, Token, ValidBackend,
};
use crate::config::{Settings, redact_all};
use crate::error::{FailureKind, LockError, NodeFailure};
use crate::wait::WakeRegistry;

pub(crate) struct SentinelNode {
    /// `sentinel(<master name>)`.
    label: String,
    master_name: String,
    sentinels: Vec<Sentinel>,
    /// The first URL: scheme, credentials (or `master_auth`'s) and database for the master.
    master_template: ConnectionInfo,
    settings: Settings,
    wakers: Arc<WakeRegistry>,
    current: Mutex<Current>,
    /// One lookup at a time; callers that waited for one use its result.
    lookup: tokio::sync::Mutex<()>,
}

/// How to reach one sentinel (with the TLS certificates, no database).
struct Sentinel {
    /// Without credentials: a sentinel that asks for none would refuse `AUTH`.
    plain: ConnectionInfo,
    /// With its URL's user and password, if it has any: used once the sentinel answered
    /// `NOAUTH` (it has `requirepass`, or its default user is off).
    auth: Option<ConnectionInfo>,
    /// It answered `NOAUTH`: later lookups authenticate at once.
    asks_auth: AtomicBool,
}

/// How long a master the sentinels named is used without asking them again.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Current {
    node: Option<Arc<RedisNode>>,
    /// A call failed as a failover would make it fail: look the master up before the next call.
    suspect: bool,
    /// When the sentinels were last asked.
    checked: Option<Instant>,
}

impl std::fmt::Debug for SentinelNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelNode")
            .field("master", &self.label)
            .finish()
    }
}

impl SentinelNode {
    pub(crate) fn new(
        master_name: &str,
        sentinels: &[NodeAddr],
        settings: &Settings,
        wakers: Arc<WakeRegistry>,
    ) -> Result<Self, LockError> {
        let Some(first) = sentinels.first() else {
            return Err(LockError::config(
                "sentinel_urls",
                "must name at least one sentinel",
            ));
        };
        let invalid = |e: redis::RedisError| LockError::config("sentinel_urls", e.category());
        let sentinel_infos = sentinels
            .iter()
            .map(|s| {
                let info = settings.tls.apply(s.info.clone()).map_err(invalid)?;
                let url = info.redis_settings();
                let auth = url.password().map(|password| {
                    let mut auth = RedisConnectionInfo::default().set_password(password);
                    if let Some(user) = url.username() {
                        auth = auth.set_username(user);
                    }
                    info.clone().set_redis_settings(auth)
                });
                Ok(Sentinel {
                    plain: info
                        .clone()
                        .set_redis_settings(RedisConnectionInfo::default()),
                    auth,
                    asks_auth: AtomicBool::new(false),
                })
            })
            .collect::<Result<_, LockError>>()?;
        let mut master_template = first.info.clone();
        if let Some(auth) = &settings.master_auth {
            let url = first.info.redis_settings();
            let mut master = RedisConnectionInfo::default()
                .set_db(url.db())
                .set_protocol(url.protocol());
            if !auth.username.is_empty() {
                master = master.set_username(&auth.username);
            }
            if !auth.password.is_empty() || !auth.username.is_empty() {
                master = master.set_password(&auth.password);
            }
            master_template = master_template.set_redis_settings(master);
        }
        Ok(SentinelNode {
            label: format!("sentinel({master_name})"),
            master_name: master_name.to_owned(),
            sentinels: sentinel_infos,
            master_template,
            settings: settings.clone(),
            wakers,
            current: Mutex::new(Current::default()),
            lookup: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The master to talk to: the known one, or the one the sentinels name now.
    async fn master(&self) -> Result<Arc<RedisNode>, NodeFailure> {
        let known = {
            let current = self.current();
            match (&current.node, current.suspect) {
                (Some(node), false) => Some((
                    Arc::clone(node),
                    current.checked.is_none_or(|at| at.elapsed() >= RECHECK),
                )),
                _ => None,
            }
        };
        if let Some((node, stale)) = known {
            if !stale {
                return Ok(node);
            }
            // Due for a recheck: one caller asks, the others go on with the known master; a
            // lookup that fails keeps it.
            let Ok(_one_at_a_time) = self.lookup.try_lock() else {
                return Ok(node);
            };
            return match self.ask_sentinels().await {
                Ok(addr) => self.adopt(addr),
                Err(_) => {
                    self.current().checked = Some(Instant::now());
                    Ok(node)
                }
            };
        }
        let _one_at_a_time = self.lookup.lock().await;
        {
            // Someone else looked it up meanwhile.
            let current = self.current();
            if let (Some(node), false) = (&current.node, current.suspect) {
                return Ok(Arc::clone(node));
            }
        }
        let addr = self.ask_sentinels().await?;
        self.adopt(addr)
    }

    /// Makes the master at `(host, port)` the current one (a new connection if it moved).
    fn adopt(&self, (host, port): (String, u16)) -> Result<Arc<RedisNode>, NodeFailure> {
        let name = format!("{host}:{port}");
        let mut current = self.current();
        current.checked = Some(Instant::now());
        if let Some(node) = current.node.clone().filter(|n| n.addr() == name) {
            current.suspect = false;
            return Ok(node);
        }
        let addr = NodeAddr {
            name: name.clone(),
            info: self
                .master_template
                .clone()
                .set_addr(match self.master_template.addr() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => ConnectionAddr::Tcp(host, port),
                }),
        };
        let node = RedisNode::new(
            &addr,
            "sentinel_urls",
            &self.settings,
            Arc::clone(&self.wakers),
            false,
        )
        .map(Arc::new)
        .map_err(|e| NodeFailure::response(&self.label, &e.to_string()))?;
        let moved = current.node.replace(Arc::clone(&node)).is_some();
        current.suspect = false;
        drop(current);
        if moved {
            tracing::info!(master = %name, "sentinel: following the master to a new address");
            // Waiters listening on the old master would otherwise wait for their backoff.
            self.wakers.notify_all();
        }
        Ok(node)
    }

    /// `SENTINEL get-master-addr-by-name` on every sentinel at once (each bounded by
    /// connect_timeout + response_timeout); the address most of them name. Fails with `Auth`
    /// when a sentinel refused the credentials (or asked for some and the URL has none), which
    /// waiting does not fix; otherwise as refused.
    async fn ask_sentinels(&self) -> Result<(String, u16), NodeFailure> {
        let bound = self.settings.request_timeout();
        let asks = self.sentinels.iter().map(|sentinel| async move {
            let addr = sentinel.plain.addr().to_string();
            match tokio::time::timeout(bound, self.ask(sentinel)).await {
                Ok(Ok(Some(addr))) => Ok(addr),
                Ok(Ok(None)) => Err(NodeFailure::response(
                    &addr,
                    &format!("knows no master named {}", self.master_name),
                )),
                Ok(Err(err)) => Err(NodeFailure::from_redis(&addr, &err)),
                Err(_) => Err(NodeFailure::timeout(
                    &addr,
                    "SENTINEL get-master-addr-by-name",
                )),
            }
        });
        let mut votes: HashMap<(String, u16), usize> = HashMap::new();
        let mut errors = Vec::new();
        for answer in join_all(asks).await {
            match answer {
                Ok(addr) => *votes.entry(addr).or_default() += 1,
                Err(failure) => errors.push(failure),
            }
        }
        let auth = errors
            .iter()
            .any(|f| matches!(f.kind, FailureKind::Auth | FailureKind::Permission));
        votes
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(addr, _)| addr)
            .ok_or_else(|| NodeFailure {
                node: self.label.clone(),
                kind: if auth {
                    FailureKind::Auth
                } else {
                    FailureKind::Refused
                },
                detail: format!(
                    "no sentinel named the master: {}",
                    errors
                        .iter()
                        .map(|f| format!("{}: {}", f.node, f.detail))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            })
    }

    /// One sentinel's answer: without credentials, unless it asked for them before; with its
    /// URL's once it answers `NOAUTH`.
    async fn ask(&self, sentinel: &Sentinel) -> redis::RedisResult<Option<(String, u16)>> {
        let query = |info: &ConnectionInfo| {
            let info = info.clone();
            async move {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.settings.connect_timeout))
                    .set_response_timeout(Some(self.settings.response_timeout));
                let mut conn = redis::Client::open(info)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master_name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            }
        };
        let Some(auth) = &sentinel.auth else {
            return query(&sentinel.plain).await;
        };
        if sentinel.asks_auth.load(Ordering::Relaxed) {
            return query(auth).await;
        }
        match query(&sentinel.plain).await {
            Err(err) if err.code() == Some("NOAUTH") => {
                sentinel.asks_auth.store(true, Ordering::Relaxed);
                query(auth).await
            }
            answer => answer,
        }
    }

    /// Notes a failed call to `node`: if a failover explains it, the next call looks the
    /// master up again.
    fn failed(&self, node: &Arc<RedisNode>, failure: &NodeFailure) {
        let failover_like = matches!(
            failure.kind,
            FailureKind::Refused | FailureKind::Io | FailureKind::Timeout
        ) || failure.detail.contains("READONLY");
        if failover_like {
            let mut current = self.current();
            if current.node.as_ref().is_some_and(|n| Arc::ptr_eq(n, node)) {
                current.suspect = true;
            }
        }
    }

    async fn on_master<'a, T>(
        &'a self,
        call: impl FnOnce(Arc<RedisNode>) -> BoxFuture<'a, Result<T, NodeFailure>>,
    ) -> Result<T, NodeFailure> {
        let node = self.master().await?;
        let outcome = call(Arc::clone(&node)).await;
        if let Err(failure) = &outcome {
            self.failed(&node, failure);
        }
        outcome
    }
}

impl Node for SentinelNode {
    fn tells_waiters_alone(&self) -> bool {
        true
    }

    /// The master of the moment decides each attempt (one whose ACL refuses the fair queue's
    /// commands asks as a plain waiter).
    fn queues_starving_waiters(&self) -> bool {
        true
    }

    fn hand_off_is_a_grant(&self) -> bool {
        false
    }

    fn addr(&self) -> &str {
        &self.label
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeHold>, NodeFailure>> {
        Box::pin(self.on_master(move |node| Box::pin(async move { node.inspect(name).await })))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(
            self.on_master(move |node| Box::pin(async move { node.force_release(name).await })),
        )
    }

    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        Box::pin(
            self.on_master(move |node| {
                Box::pin(async move { node.acquire(names, token, ask).await })
            }),
        )
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        Box::pin(async move {
            let node = match self.master().await {
                Ok(node) => node,
                Err(failure) => {
                    return ExtendOutcome::all_failed(items.len(), &failure);
                }
            };
            let outcomes = node.extend_many(items).await;
            if let Some(ExtendOutcome::Failed(failure)) = outcomes
                .iter()
                .find(|o| matches!(o, ExtendOutcome::Failed(_)))
            {
                self.failed(&node, failure);
            }
            outcomes
        })
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.on_master(move |node| {
            Box::pin(async move { node.release(names, token, mode, wake).await })
        }))
    }

    fn keep<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        left: Duration,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(
            self.on_master(move |node| {
                Box::pin(async move { node.keep(names, token, left).await })
            }),
        )
    }

    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        Box::pin(
            self.on_master(move |node| {
                Box::pin(async move { node.raise_fences(names, fences).await })
            }),
        )
    }

    fn watch(&self, name: &str, own: Option<u64>) -> Subscription {
        let node = self.current().node.clone();
        match node {
            Some(node) => node.watch(name, own),
            // No master known yet: the waiter relies on its backoff.
            None => Subscription {
                confirmed: Box::pin(async { false }),
                keep: None,
            },
        }
    }
}

/// What [`LockConfig::sentinel`](crate::LockConfig::sentinel) stores.
#[derive(Clone)]
pub(crate) struct SentinelConfig {
    pub(crate) master_name: String,
    pub(crate) sentinel_urls: Vec<String>,
}

impl BackendConfig for SentinelConfig {
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        if self.master_name.trim().is_empty() {
            return Err(LockError::config("master_name", "must not be empty"));
        }
        Ok(Box::new(ValidSentinel {
            master_name: self.master_name.clone(),
            sentinels: NodeAddr::parse_all(
                "sentinel_urls",
                &self.sentinel_urls,
                "must name at least one sentinel",
            )?,
        }))
    }

    fn fmt_redacted(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = redact_all(&self.sentinel_urls);
        write!(f, "sentinel({}, [{urls}])", self.master_name)
    }
}

struct ValidSentinel {
    master_name: String,
    sentinels: Vec<NodeAddr>,
}

impl ValidBackend for ValidSentinel {
    fn kind(&self) -> BackendKind {
        BackendKind::Sentinel
    }

    fn uses_tls(&self) -> bool {
        self.sentinels.iter().any(NodeAddr::uses_tls)
    }

    fn has_replicas(&self) -> bool {
        true
    }

    fn takes_master_auth(&self) -> bool {
        true
    }

    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError> {
        let node = SentinelNode::new(&self.master_name, &self.sentinels, settings, wakers)?;
        Ok(Backend::One(Arc::new(node)))
    }
}
