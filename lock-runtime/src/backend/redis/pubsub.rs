//! Release notifications: the pub/sub connection of one node, the channels its waiters listen
//! on, and what a release message says.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{PushKind, RedisResult};
use tokio::sync::{Notify, watch};

use crate::backend::{BoxFuture, Subscription};
use crate::config::Settings;
use crate::wait::{HandOff, WakeRegistry};

/// A pub/sub connection: plain channels on one node, sharded channels on a cluster.
pub(crate) trait PubSub: Send + 'static {
    fn subscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>>;
    fn unsubscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>>;
}

impl PubSub for ConnectionManager {
    fn subscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(ConnectionManager::subscribe(self, channels))
    }

    fn unsubscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(ConnectionManager::unsubscribe(self, channels))
    }
}

/// Where pushes (messages, disconnections) of the notification connection go.
pub(crate) type PushFn =
    Arc<dyn Fn(redis::PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync>;

/// How long a lock's release channel stays subscribed after its last waiter left (see
/// `Entry::idle_since`): a lock contended again within it costs no subscription round trip.
const LINGER: Duration = Duration::from_secs(2);

/// Opens the notification connection (lazily connecting, resubscribing after reconnects).
pub(crate) type OpenPubSub =
    Box<dyn Fn(PushFn) -> BoxFuture<'static, RedisResult<Box<dyn PubSub>>> + Send + Sync>;

/// The release channels this node's waiters listen on, and the task that keeps the notification
/// connection subscribed to exactly those.
///
/// One task per node applies changes in order (so an unsubscribe never overtakes a later
/// subscribe of the same channel) and in batches: a frozen or dead node costs one request timeout
/// per round, whatever the number of waiters, and no waiter ever waits for it (waiters only
/// learn, through `confirmed`, when their releases can no longer be missed).
pub(crate) struct Subscriptions {
    table: Mutex<Table>,
    kick: Notify,
    started: OnceLock<()>,
    open: OpenPubSub,
    wakers: Arc<WakeRegistry>,
    connect_timeout: Duration,
    response_timeout: Duration,
}

/// The channels, and whether the task already looks again within [`LINGER`]: the task and the
/// waiters read and write both under the same lock.
#[derive(Default)]
struct Table {
    channels: HashMap<String, Entry>,
    /// Whether the task waits at most [`LINGER`] for its next look (a channel lingers): a
    /// waiter that leaves a lingering channel then need not wake it.
    lingering: bool,
}

struct Entry {
    name: Arc<str>,
    waiters: usize,
    /// A lock's release channel (not a waiter's own) stays subscribed [`LINGER`] after its last
    /// waiter left, so that a lock contended again and again costs no `SUBSCRIBE` and
    /// `UNSUBSCRIBE` per wait: since when it has no waiter (`None`: it has, or it does not
    /// linger).
    idle_since: Option<Instant>,
    lingers: bool,
    /// `Some(true)` once subscribed on the server, `Some(false)` when that failed.
    confirmed: watch::Sender<Option<bool>>,
}

impl Subscriptions {
    pub(crate) fn new(
        open: OpenPubSub,
        wakers: Arc<WakeRegistry>,
        settings: &Settings,
    ) -> Arc<Self> {
        Arc::new(Subscriptions {
            table: Mutex::new(Table::default()),
            kick: Notify::new(),
            started: OnceLock::new(),
            open,
            wakers,
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
        })
    }

    /// A waiter's interest in `channel`, the release channel of the lock `name` or a waiter's own
    /// channel of it (see [`own_channel`](super::own_channel)).
    ///
    /// The task is woken only when it has something to do: not for a channel that is subscribed
    /// already (another waiter's, or lingering), which it keeps as long as it is in the table.
    pub(crate) fn watch(self: &Arc<Self>, name: &str, channel: String) -> Subscription {
        let (confirmed, subscribed) = {
            let mut table = self.table();
            let lingers = !channel.ends_with('}');
            let entry = table
                .channels
                .entry(channel.clone())
                .or_insert_with(|| Entry {
                    name: name.into(),
                    waiters: 0,
                    idle_since: None,
                    lingers,
                    confirmed: watch::channel(None).0,
                });
            entry.waiters += 1;
            entry.idle_since = None;
            if *entry.confirmed.borrow() == Some(false) {
                // The last try failed: this waiter waits for the next one.
                entry.confirmed.send_replace(None);
            }
            let subscribed = *entry.confirmed.borrow() == Some(true);
            (entry.confirmed.subscribe(), subscribed)
        };
        self.start();
        if !subscribed {
            self.kick.notify_one();
        }
        let mut confirmed = confirmed;
        Subscription {
            confirmed: Box::pin(async move {
                match confirmed.wait_for(Option::is_some).await {
                    Ok(value) => value.unwrap_or(false),
                    Err(_) => false,
                }
            }),
            keep: Some(Box::new(Unwatch {
                subs: Arc::clone(self),
                channel,
            })),
        }
    }

    /// Lets the notification task notice that its node is gone.
    pub(crate) fn node_dropped(&self) {
        self.kick.notify_one();
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start(self: &Arc<Self>) {
        self.started.get_or_init(|| {
            tokio::spawn(Arc::clone(self).run());
        });
    }

    /// Keeps the server's subscriptions equal to the table's channels.
    async fn run(self: Arc<Self>) {
        let me = Arc::downgrade(&self);
        let wakers = Arc::clone(&self.wakers);
        let on_push = move |push: redis::PushInfo| {
            let Some(subs) = me.upgrade() else {
                return Ok(());
            };
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    if let Some(redis::Value::BulkString(channel)) = push.data.first() {
                        let name = std::str::from_utf8(channel).ok().and_then(|c| {
                            subs.table().channels.get(c).map(|e| Arc::clone(&e.name))
                        });
                        if let Some(name) = name {
                            let (ticket, hand_off) = match push.data.get(1) {
                                Some(redis::Value::BulkString(payload)) => hand_off(payload),
                                _ => (0, None),
                            };
                            wakers.notify_for(&name, ticket, hand_off);
                        }
                    }
                }
                // Releases may have been missed while disconnected: every waiter retries now.
                PushKind::Disconnection => wakers.notify_all(),
                _ => {}
            }
            Ok::<(), redis::aio::SendError>(())
        };
        let mut conn = match (self.open)(Arc::new(on_push)).await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(%err, "release notifications unavailable; waiters rely on backoff");
                return;
            }
        };
        let mut subscribed: HashSet<String> = HashSet::new();
        // Whether a channel lingers without waiters: then look again within `LINGER`.
        let mut lingering = false;
        loop {
            if lingering {
                let _ = tokio::time::timeout(LINGER, self.kick.notified()).await;
            } else {
                self.kick.notified().await;
            }
            if Arc::strong_count(&self) == 1 {
                return; // the node is gone
            }
            let (add, remove) = {
                let mut table = self.table();
                let now = Instant::now();
                table.channels.retain(|_, e| {
                    e.waiters > 0
                        || e.idle_since
                            .is_some_and(|idle| now.saturating_duration_since(idle) < LINGER)
                });
                lingering = table.channels.values().any(|e| e.waiters == 0);
                table.lingering = lingering;
                let table = &table.channels;
                let add: Vec<String> = table
                    .iter()
                    .filter(|(c, e)| {
                        !subscribed.contains(*c) || *e.confirmed.borrow() != Some(true)
                    })
                    .map(|(c, _)| c.clone())
                    .collect();
                let remove: Vec<String> = subscribed
                    .iter()
                    .filter(|c| !table.contains_key(*c))
                    .cloned()
                    .collect();
                (add, remove)
            };
            // New channels first: a waiter that moves from one channel to another (see
            // `acquire::NotifyOrBackoff`) is never listening on neither.
            if !add.is_empty() {
                let bound = self.connect_timeout.saturating_add(self.response_timeout);
                let ok = matches!(
                    tokio::time::timeout(bound, conn.subscribe(&add)).await,
                    Ok(Ok(()))
                );
                let table = self.table();
                for c in add {
                    if ok {
                        subscribed.insert(c.clone());
                    }
                    if let Some(entry) = table.channels.get(&c) {
                        entry.confirmed.send_replace(Some(ok));
                    }
                }
            }
            if !remove.is_empty() {
                let done =
                    tokio::time::timeout(self.response_timeout, conn.unsubscribe(&remove)).await;
                if matches!(done, Ok(Ok(()))) {
                    for c in &remove {
                        subscribed.remove(c);
                    }
                }
            }
        }
    }
}

/// Drops a waiter's interest in a channel.
struct Unwatch {
    subs: Arc<Subscriptions>,
    channel: String,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        // The task must look when the last waiter left: to unsubscribe a channel that does not
        // linger, or to start looking again within `LINGER` (unless it already does).
        let kick = {
            let mut table = self.subs.table();
            let lingering = table.lingering;
            match table.channels.get_mut(&self.channel) {
                Some(entry) => {
                    entry.waiters -= 1;
                    if entry.waiters == 0 && entry.lingers {
                        entry.idle_since = Some(Instant::now());
                    }
                    entry.waiters == 0 && !(entry.lingers && lingering)
                }
                None => false,
            }
        };
        if kick {
            self.subs.kick.notify_one();
        }
    }
}

/// What a release message says: a fair lock's hand-off names the waiter it went to by ticket,
/// with a fence (0 from Redis: a waiter that wants one asks) and the digest of its token (see
/// `scripts::FAIR_RELEASE`); anything else ("", garbage) is for every waiter (ticket 0).
fn hand_off(payload: &[u8]) -> (u64, Option<HandOff>) {
    let text = std::str::from_utf8(payload).unwrap_or_default();
    let mut parts = text.split(' ');
    let Some(ticket) = parts.next().and_then(|t| t.parse::<u64>().ok()) else {
        return (0, None);
    };
    let fence = parts.next().and_then(|f| f.parse::<u64>().ok());
    let digest = parts.next().and_then(|d| u64::from_str_radix(d, 16).ok());
    match (fence, digest) {
        (Some(fence), Some(digest)) => (
            ticket,
            Some(HandOff {
                ticket,
                fence,
                digest,
            }),
        ),
        _ => (ticket, None),
    }
}
