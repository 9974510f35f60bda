//! One Redis master: the per-node operations every Redis-backed mode is built on.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot};

use super::{Attempt, ExtendOutcome, LockKeys, Token};
use crate::config::{NodeAddr, Settings};
use crate::error::{LockError, NodeFailure};
use crate::scripts;
use crate::wait::{Listen, NodeSubscription, WakeRegistry};

/// How many extensions go into one pipeline (one round trip).
const EXTEND_CHUNK: usize = 512;

/// One Redis node: a multiplexed, reconnecting connection shared by every lock, and a lazily
/// started pub/sub listener for release notifications.
pub(crate) struct RedisNode {
    pub(crate) name: String,
    conn: ConnectionManager,
    client: redis::Client,
    wakers: Arc<WakeRegistry>,
    listener: OnceLock<mpsc::UnboundedSender<Listen>>,
    /// Bound on one request, connection set-up included.
    deadline: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode")
            .field("node", &self.name)
            .finish()
    }
}

impl RedisNode {
    /// Must run inside the library's runtime: the connection manager spawns its tasks there.
    pub(crate) fn new(
        addr: &NodeAddr,
        settings: &Settings,
        wakers: Arc<WakeRegistry>,
    ) -> Result<Self, LockError> {
        let field = "url";
        let client = redis::Client::open(addr.info.clone())
            .map_err(|e| LockError::config(field, format!("{}: {}", addr.name, e.category())))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(settings.connect_timeout);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|e| LockError::config(field, format!("{}: {}", addr.name, e.category())))?;
        Ok(RedisNode {
            name: addr.name.clone(),
            conn,
            client,
            wakers,
            listener: OnceLock::new(),
            deadline: settings.connect_timeout + settings.response_timeout,
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
        })
    }

    fn failure(&self, err: &RedisError) -> NodeFailure {
        NodeFailure::from_redis(&self.name, err)
    }

    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, NodeFailure> {
        match tokio::time::timeout(self.deadline, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.failure(&err)),
            Err(_) => Err(NodeFailure::timeout(&self.name, what)),
        }
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        fencing: bool,
    ) -> Result<Attempt, NodeFailure> {
        let mut conn = self.conn.clone();
        let mut invocation = scripts::ACQUIRE.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.fence)
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(if fencing { "1" } else { "0" });
        let (ours, value): (i64, i64) = self
            .bounded("acquire", invocation.invoke_async(&mut conn))
            .await?;
        Ok(if ours == 1 {
            Attempt::Acquired {
                fence: (fencing && value > 0).then_some(value as u64),
            }
        } else {
            Attempt::Held {
                // -1: the key has no expiry (set by someone else without one); wait by backoff.
                pttl: (value >= 0).then(|| Duration::from_millis(value as u64)),
            }
        })
    }

    /// Extends many locks in pipelines of [`EXTEND_CHUNK`] script calls.
    pub(crate) async fn extend_many(
        &self,
        items: &[(&LockKeys, &Token, Duration)],
    ) -> Vec<ExtendOutcome> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(EXTEND_CHUNK) {
            match self.extend_chunk(chunk).await {
                Ok(replies) => out.extend(replies.into_iter().map(|r| {
                    if r == 1 {
                        ExtendOutcome::Extended
                    } else {
                        ExtendOutcome::NotOwned
                    }
                })),
                Err(failure) => {
                    out.extend(chunk.iter().map(|_| ExtendOutcome::Failed(failure.clone())))
                }
            }
        }
        out
    }

    async fn extend_chunk(
        &self,
        chunk: &[(&LockKeys, &Token, Duration)],
    ) -> Result<Vec<i64>, NodeFailure> {
        let mut pipe = redis::pipe();
        for (keys, token, ttl) in chunk {
            let mut invocation = scripts::EXTEND.prepare_invoke();
            invocation
                .key(&keys.lock)
                .arg(token.as_str())
                .arg(millis(*ttl));
            pipe.invoke_script(&invocation);
        }
        let mut conn = self.conn.clone();
        let first =
            tokio::time::timeout(self.deadline, pipe.query_async::<Vec<i64>>(&mut conn)).await;
        match first {
            Ok(Ok(replies)) => Ok(replies),
            Ok(Err(err))
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // The server lost its script cache (restart, SCRIPT FLUSH): load once and resend.
                self.bounded("script load", scripts::EXTEND.load_async(&mut conn))
                    .await?;
                self.bounded("extend", pipe.query_async(&mut conn)).await
            }
            Ok(Err(err)) => Err(self.failure(&err)),
            Err(_) => Err(NodeFailure::timeout(&self.name, "extend")),
        }
    }

    /// `Ok(true)` when the lock was ours and is now deleted; waiters are woken.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> Result<bool, NodeFailure> {
        self.delete(keys, token, &keys.channel).await
    }

    /// Deletes the lock when it is ours without waking anyone (see `scripts::RELEASE`).
    pub(crate) async fn withdraw(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> Result<bool, NodeFailure> {
        self.delete(keys, token, "").await
    }

    async fn delete(
        &self,
        keys: &LockKeys,
        token: &Token,
        channel: &str,
    ) -> Result<bool, NodeFailure> {
        let mut conn = self.conn.clone();
        let mut invocation = scripts::RELEASE.prepare_invoke();
        invocation.key(&keys.lock).arg(token.as_str()).arg(channel);
        let deleted: i64 = self
            .bounded("release", invocation.invoke_async(&mut conn))
            .await?;
        Ok(deleted == 1)
    }

    /// Raises the lock's fence counter to at least `fence` (see `scripts::RAISE_FENCE`).
    pub(crate) async fn raise_fence(&self, keys: &LockKeys, fence: u64) -> Result<(), NodeFailure> {
        let mut conn = self.conn.clone();
        let mut invocation = scripts::RAISE_FENCE.prepare_invoke();
        invocation.key(&keys.fence).arg(fence);
        self.bounded("raise fence", invocation.invoke_async::<i64>(&mut conn))
            .await
            .map(drop)
    }

    /// Subscribes this node's listener to the lock's release channel; `None` when the listener
    /// cannot confirm the subscription (the waiter then relies on its backoff alone).
    pub(crate) async fn subscribe(&self, keys: &LockKeys) -> Option<NodeSubscription> {
        let listener = self.listener.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(listen(
                self.client.clone(),
                Arc::clone(&self.wakers),
                rx,
                self.connect_timeout,
                self.response_timeout,
            ));
            tx
        });
        let (reply, confirmed) = oneshot::channel();
        listener
            .send(Listen::Subscribe(keys.channel.clone(), reply))
            .ok()?;
        // From here on the listener counts this subscription: the handle undoes it on drop.
        let subscription = NodeSubscription {
            listener: listener.clone(),
            channel: keys.channel.clone(),
        };
        matches!(confirmed.await, Ok(true)).then_some(subscription)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The pub/sub listener of one node: owns the subscriber connection, reference-counts channels,
/// and turns release messages into wake-ups. One task per node; commands are handled in order, so
/// an unsubscribe can never overtake a later subscribe of the same channel.
async fn listen(
    client: redis::Client,
    wakers: Arc<WakeRegistry>,
    mut commands: mpsc::UnboundedReceiver<Listen>,
    connect_timeout: Duration,
    response_timeout: Duration,
) {
    let mut channels: HashMap<String, usize> = HashMap::new();
    let mut conn: Option<(PubSubSink, PubSubStream)> = None;
    loop {
        let connected = conn.is_some();
        let message = async {
            match conn.as_mut() {
                Some((_, stream)) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Listen::Subscribe(channel, reply)) => {
                    let count = channels.entry(channel.clone()).or_insert(0);
                    *count += 1;
                    let ok = if *count > 1 && conn.is_some() {
                        true
                    } else if conn.is_some() {
                        subscribe(&mut conn, &channel, response_timeout).await
                    } else {
                        connect(&client, &mut conn, &channels, connect_timeout, response_timeout).await
                    };
                    let _ = reply.send(ok);
                }
                Some(Listen::Unsubscribe(channel)) => {
                    if let Some(count) = channels.get_mut(&channel) {
                        *count -= 1;
                        if *count == 0 {
                            channels.remove(&channel);
                            if let Some((sink, _)) = conn.as_mut() {
                                let done = tokio::time::timeout(response_timeout, sink.unsubscribe(&channel)).await;
                                if !matches!(done, Ok(Ok(()))) {
                                    conn = None;
                                }
                            }
                        }
                    }
                }
            },
            message = message => match message {
                Some(message) => wakers.notify(message.get_channel_name()),
                None => conn = None,
            },
        }
        if connected && conn.is_none() {
            // The connection broke: releases may have been missed, so every waiter retries now
            // (and then relies on its backoff); the next subscribe reconnects.
            wakers.notify_all();
        }
    }
}

async fn subscribe(
    conn: &mut Option<(PubSubSink, PubSubStream)>,
    channel: &str,
    response_timeout: Duration,
) -> bool {
    let Some((sink, _)) = conn.as_mut() else {
        return false;
    };
    let ok = matches!(
        tokio::time::timeout(response_timeout, sink.subscribe(channel)).await,
        Ok(Ok(()))
    );
    if !ok {
        *conn = None;
    }
    ok
}

async fn connect(
    client: &redis::Client,
    conn: &mut Option<(PubSubSink, PubSubStream)>,
    channels: &HashMap<String, usize>,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> bool {
    let Ok(Ok(pubsub)) = tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await
    else {
        return false;
    };
    let (mut sink, stream) = pubsub.split();
    let names: Vec<&str> = channels.keys().map(String::as_str).collect();
    let ok = matches!(
        tokio::time::timeout(response_timeout, sink.subscribe(&names)).await,
        Ok(Ok(()))
    );
    if ok {
        *conn = Some((sink, stream));
    }
    ok
}
