//! One Redis master: the node the rest of the crate sees, over its key layout ([`keys`]), its
//! script calls ([`calls`]) and its release notifications ([`pubsub`]); its URLs ([`addr`]), and
//! the single-node backend ([`single`]).

mod addr;
mod calls;
mod keys;
mod local;
mod native;
mod pubsub;
mod single;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use local::Via;

use super::wait_pool::WaitPool;
use super::{
    Ask, Attempt, BoxFuture, ExtendItem, ExtendOutcome, Mode, Node, NodeHold, Subscription, Token,
};
use crate::config::Settings;
use crate::error::{LockError, NodeFailure};
use crate::wait::WakeRegistry;

pub(crate) use addr::{NodeAddr, NodeSource};
pub(crate) use calls::{Calls, Looked, decode_inspect, inspect_invocation};
pub use keys::KeyKind;
pub(in crate::backend) use keys::hash_tag;
pub(crate) use keys::{lock_name_of, own_channel, redis_key, server_fence_key, slot_fence_key};
pub(crate) use pubsub::{OpenPubSub, PubSub, Subscriptions};
pub(crate) use single::{SingleConfig, ValidSingle};

/// One Redis node: a multiplexed, reconnecting connection shared by every lock, and a lazily
/// started second connection (RESP3, resubscribing after reconnects) for release notifications;
/// for a single node, also one connection per caller's runtime ([`local`]).
pub(crate) struct RedisNode {
    calls: Calls,
    conn: ConnectionManager,
    /// Whether a request over `conn` was answered: callers' connections are made after it.
    shared_made: AtomicBool,
    locals: Option<Arc<local::Locals>>,
    subs: Arc<Subscriptions>,
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.subs.node_dropped();
    }
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode")
            .field("node", &self.calls.addr)
            .finish()
    }
}

impl RedisNode {
    /// Must run inside the library's runtime: the connection manager spawns its tasks there.
    /// `callers`: whether calls from callers' runtimes go over connections of their own (a
    /// single node, and Redlock's nodes; not a Sentinel's master, which is replaced on failover).
    pub(crate) fn new(
        addr: &NodeAddr,
        field: &'static str,
        settings: &Settings,
        wakers: Arc<WakeRegistry>,
        callers: bool,
    ) -> Result<Self, LockError> {
        let invalid =
            |e: RedisError| LockError::config(field, format!("{}: {}", addr.name, e.category()));
        let info = settings.tls.apply(addr.info.clone()).map_err(invalid)?;
        let client = redis::Client::open(info.clone()).map_err(invalid)?;
        let waits = settings.min_replicas.map(|_| {
            WaitPool::new(
                client.clone(),
                settings.connect_timeout,
                settings.response_timeout,
            )
        });
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(settings.connect_timeout);
        let locals = callers
            .then(|| local::Locals::new(client.clone(), config.clone(), settings.connect_timeout));
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(invalid)?;
        let resp3 = info.clone().set_redis_settings(
            info.redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3),
        );
        let notify_client = redis::Client::open(resp3).map_err(invalid)?;
        let (connect_timeout, response_timeout) =
            (settings.connect_timeout, settings.response_timeout);
        let open: OpenPubSub = Box::new(move |on_push| {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout))
                .set_number_of_retries(1)
                .set_max_delay(connect_timeout)
                .set_push_sender(move |push| on_push(push))
                .set_automatic_resubscription();
            let conn = ConnectionManager::new_lazy_with_config(notify_client.clone(), config);
            Box::pin(async move { conn.map(|c| Box::new(c) as Box<dyn PubSub>) })
        });
        let mut calls = Calls::new(addr.name.clone(), settings, "PUBLISH", true);
        calls.waits = waits;
        Ok(RedisNode {
            calls,
            conn,
            shared_made: AtomicBool::new(false),
            locals,
            subs: Subscriptions::new(open, wakers, settings),
        })
    }

    /// [`Node::acquire`], unboxed: the single-node backend calls it directly
    /// ([`Backend::Redis`](super::Backend::Redis)). The connection is chosen when it is called,
    /// on the caller's thread (see [`conn`](Self::conn)), not when it is first polled.
    pub(crate) fn acquire_here<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> impl Future<Output = Result<Attempt, NodeFailure>> + Send + 'a {
        let conn = self.conn();
        async move {
            let attempt = self.calls.acquire(conn.get(), names, token, ask).await;
            conn.answered(&attempt);
            attempt
        }
    }

    /// Whether the lock `name` holds `token` now (see [`Calls::look`]).
    pub(crate) async fn look_here(&self, name: &str, token: &Token) -> Result<Looked, NodeFailure> {
        let conn = self.conn();
        let looked = self.calls.look(conn.get(), name, token).await;
        conn.answered(&looked);
        looked
    }

    /// [`Node::release`], unboxed (see [`acquire_here`](Self::acquire_here)).
    pub(crate) fn release_here<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        wake: bool,
    ) -> impl Future<Output = Result<bool, NodeFailure>> + Send + 'a {
        let conn = self.conn();
        async move {
            let released = self
                .calls
                .release(conn.get(), names, token, mode, wake)
                .await;
            conn.answered(&released);
            if conn.after_closed() && matches!(released, Ok(false)) {
                // The server may have run it before the call's requests on the closed
                // connection (see `local`), in the round of reads that ran them: answered,
                // that round is over, and a release now comes after them.
                return self
                    .calls
                    .release(conn.get(), names, token, mode, wake)
                    .await;
            }
            released
        }
    }

    /// The connection a request goes over: the caller's own when its call has one (see
    /// [`local`]), else the shared one.
    fn conn(&self) -> Conn<'_> {
        let via = match (&self.locals, crate::callers::current()) {
            (Some(locals), Some(route)) => {
                locals.for_call(&route, || self.shared_made.load(Ordering::Relaxed))
            }
            _ => Via::Shared,
        };
        match via {
            Via::Own(conn) => Conn::Local(conn),
            Via::Shared => Conn::Shared(self, false),
            Via::SharedAfterOwn => Conn::Shared(self, true),
        }
    }
}

/// Where a request goes: see [`RedisNode::conn`]. `Shared(_, true)`: after the call's earlier
/// requests went over its runtime's connection, closed since ([`Via::SharedAfterOwn`]).
enum Conn<'a> {
    Shared(&'a RedisNode, bool),
    Local(ConnectionManager),
}

impl Conn<'_> {
    fn get(&self) -> &ConnectionManager {
        match self {
            Conn::Shared(node, _) => &node.conn,
            Conn::Local(conn) => conn,
        }
    }

    /// Whether requests of the call may still be on their way over a connection that closed.
    fn after_closed(&self) -> bool {
        matches!(self, Conn::Shared(_, true))
    }

    /// Notes an answer over the shared connection: it is made.
    fn answered<T, E>(&self, result: &Result<T, E>) {
        if let Conn::Shared(node, _) = self
            && result.is_ok()
        {
            node.shared_made.store(true, Ordering::Relaxed);
        }
    }
}

impl Node for RedisNode {
    fn tells_waiters_alone(&self) -> bool {
        true
    }

    fn queues_starving_waiters(&self) -> bool {
        self.calls.queues_starving_waiters()
    }

    fn addr(&self) -> &str {
        &self.calls.addr
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeHold>, NodeFailure>> {
        Box::pin(self.calls.inspect(&self.conn, name))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.calls.force_release(&self.conn, name))
    }

    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        Box::pin(self.acquire_here(names, token, ask))
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        Box::pin(self.calls.extend_many(&self.conn, items))
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.release_here(names, token, mode, wake))
    }

    fn keep<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        left: Duration,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let conn = self.conn();
        Box::pin(async move { self.calls.keep(conn.get(), names, token, left).await })
    }

    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        Box::pin(self.calls.raise_fences(&self.conn, names, fences))
    }

    fn watch(&self, name: &str, own: Option<u64>) -> Subscription {
        let [_, channel] = self.calls.keys(name);
        self.subs.watch(name, own_channel(channel, own))
    }
}
