//! Where locks live. A backend implements [`Node`] once per server and owns its key layout; the
//! rest of the crate sees a [`Backend`]: one node, or a quorum (Redlock) over several. Each
//! backend's file also holds its configuration, its validation and how it is built (the traits
//! of `setup.rs`); its constructor is a line of `config/mod.rs`.

mod cluster;
mod etcd;
mod memory;
mod redis;
mod redlock;
pub(crate) mod scripts;
mod sentinel;
mod setup;
mod wait_pool;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::NodeFailure;
use crate::owner::Identity;
use redis::RedisNode;

pub(crate) use cluster::ClusterConfig;
pub(crate) use etcd::EtcdConfig;
#[cfg(feature = "etcd")]
pub(crate) use etcd::{etcd_key, etcd_lock_name};
pub(crate) use memory::InMemory;
pub use redis::KeyKind;
pub(crate) use redis::{
    Looked, NodeSource, SingleConfig, decode_inspect, inspect_invocation, lock_name_of, redis_key,
    server_fence_key, slot_fence_key,
};
pub(crate) use redlock::{Quorum, RedlockConfig, gate_of};
pub(crate) use sentinel::SentinelConfig;
pub(crate) use setup::{BackendConfig, BackendKind, ValidBackend};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The keys of one lock: sorted, without duplicates, at least one. Several keys are taken all or
/// nothing.
pub(crate) type Names = Arc<[Arc<str>]>;

/// One lock server. Every method is one request (one script call per Redis node), bounded by the
/// node's own request timeout, and covers every key of a lock at once.
pub(crate) trait Node: Send + Sync + fmt::Debug + 'static {
    /// Takes every key of `names` for `token`, or none; refreshes those `token` already holds (a
    /// retry after an unknown outcome answers "ours" rather than "held").
    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>>;

    /// Extends each item for which the node still holds its token on every key; one outcome per
    /// item, in order. A bad item never fails the others.
    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>>;

    /// Deletes every key of `names` that `token` holds (as `mode`) and, when `wake`, notifies
    /// their waiters; also takes `token` out of any queue of `names`. `Ok(true)` when all of them
    /// were ours.
    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>>;

    /// Leaves every key of `names` that `token` holds (an exclusive lock) to expire in `left`
    /// instead of deleting it, and wakes nobody: the release of a lock whose `min_hold` has not
    /// passed. `left` may be longer or shorter than the key's time to live. `Ok(true)` when all
    /// of them were ours (then each expires in `left`; otherwise none was changed).
    fn keep<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        left: Duration,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>>;

    /// Raises each key's fence counter to at least its value in `fences` (Redlock fencing
    /// write-back).
    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>>;

    /// Starts listening for releases of `name` on this node; releases then wake the client's
    /// waiters of `name`. Never blocks: the returned subscription's `confirmed` future resolves
    /// once the node confirmed it (or failed to), and dropping the subscription undoes it.
    ///
    /// `own`: the [`digest`](Token::digest) of a waiter that has (or is about to take) a place in
    /// the lock's queue, which listens only for the hand-off to itself: on Redis a release that
    /// hands the lock on tells that waiter alone, on a channel of its own, so the other waiters
    /// are not woken by it (nodes that tell waiters otherwise ignore it).
    fn watch(&self, name: &str, own: Option<u64>) -> Subscription;

    /// This node as one that answers at once, without IO or waiting (in memory), so that an
    /// uncontended lock skips the runtime hop. `None` for every server.
    fn at_once(&self) -> Option<&dyn AtOnce> {
        None
    }

    /// What this node knows of the lock `name`: `None` when it does not hold it.
    fn inspect<'a>(&'a self, name: &'a str)
    -> BoxFuture<'a, Result<Option<NodeHold>, NodeFailure>>;

    /// Deletes the lock `name` whoever holds it, and wakes its waiters. `Ok(true)` when it was
    /// held.
    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>>;

    /// The node's address (never with credentials), for inspection.
    fn addr(&self) -> &str;

    /// Whether a fair hand-off's message may stand for the grant it announces. False where the
    /// server that sent it may no longer be the one that decides (Sentinel, Cluster: a deposed
    /// master can still publish a hand-off it made before the failover, and the promoted
    /// replica may never have seen it): the waiter then asks the current master, which finds
    /// the lock the waiter's if the hand-off reached it.
    fn hand_off_is_a_grant(&self) -> bool {
        true
    }

    /// Whether a waiter of an exclusive lock of one key that has waited past its threshold (see
    /// `acquire/`, [`Ask::starving`]) takes a place in the lock's fair queue, which the lock's
    /// next release then honours by handing it the lock (Redis: `scripts::EXCLUSIVE_RELEASE`).
    fn queues_starving_waiters(&self) -> bool {
        false
    }

    /// Whether a hand-off to a waiter with a place in a queue is told to that waiter alone,
    /// which then listens with `own` in [`watch`](Self::watch) (Redis: on a channel of its own).
    fn tells_waiters_alone(&self) -> bool {
        false
    }
}

/// The requests of a node that answers at once (see [`Node::at_once`]): the same as
/// [`Node::acquire`] and [`Node::release`], which never fail there, made at `now` (the caller's
/// clock read, which it reuses: a clock read is a tenth of an in-memory acquire).
pub(crate) trait AtOnce {
    fn acquire_at_once(
        &self,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
        now: std::time::Instant,
    ) -> Attempt;

    fn release_at_once(
        &self,
        names: &[Arc<str>],
        token: &Token,
        mode: Mode,
        wake: bool,
        now: std::time::Instant,
    ) -> bool;

    fn keep_at_once(
        &self,
        names: &[Arc<str>],
        token: &Token,
        left: Duration,
        now: std::time::Instant,
    ) -> bool;
}

/// What one server holds of a lock: a Redis node's answer to the inspect script (see
/// [`decode_redis_inspect`](crate::layout::decode_redis_inspect)). [`inspect`](crate::inspect)
/// reads every backend's servers into it (etcd: the cluster is one server) and counts a lock's
/// [`LockInfo`](crate::LockInfo) from those of its nodes, of which
/// [`LockInfo::nodes`](crate::LockInfo::nodes) shows part.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeHold {
    /// The lock key's time to live on this server (`None`: the key has no expiry).
    pub remaining: Option<Duration>,
    /// The lock's fencing token as the server knows it: `None` on Redis, which keeps one fence
    /// counter per server (per slot on a Cluster), not a token per lock; etcd's revision.
    pub fencing_token: Option<u64>,
    /// Live holders: 1 for an exclusive or fair lock, the live shares of a shared lock, the
    /// permits taken of a semaphore.
    pub holders: usize,
    /// Live waiters in a fair lock's queue (0 for other locks).
    pub queued: usize,
    /// The live holders' [`Owner`](crate::Owner) records that could be read (a value written
    /// by something other than this library has none).
    pub owners: Vec<crate::owner::Owner>,
}

/// Where a waiter listens for one lock's releases: its subscriptions, and how many of them must
/// confirm before a release is sure to wake it (one on a single node; a quorum of Redlock's other
/// nodes when its gate did not confirm).
pub(crate) struct Watch {
    pub(crate) subscriptions: Vec<Subscription>,
    pub(crate) needed: usize,
}

/// A waiter's interest in one node's release notifications for one lock.
pub(crate) struct Subscription {
    /// Resolves to true once the node confirmed the subscription: releases after that point wake
    /// the waiter. False when it could not be confirmed (the waiter relies on its backoff).
    pub(crate) confirmed: BoxFuture<'static, bool>,
    /// Undoes the subscription when dropped.
    pub(crate) keep: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

/// One lock to extend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtendItem<'a> {
    pub(crate) names: &'a [Arc<str>],
    pub(crate) token: &'a Token,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
}

/// What kind of hold an acquisition asks for (see `Lock::fair`, `Lock::shared`,
/// `Lock::permits`): the rules' type, which the macro's call carries too.
pub(crate) use lock_rules::Mode;

/// One acquire attempt as a node sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) ttl: Duration,
    pub(crate) fencing: bool,
    pub(crate) mode: Mode,
    /// The caller waits if refused: a fair waiter joins the queue (or refreshes its entry), a
    /// writer refused by readers marks itself waiting so that no new reader gets in, and on etcd
    /// a semaphore waiter keeps its place in line. Each mark lives `ttl` unless renewed by the
    /// next attempt.
    pub(crate) queue: bool,
    /// How much longer the caller waits if refused, at most `ttl` (zero when it does not): a
    /// writer's mark lives that long, so a writer whose wait runs out keeps no reader out after.
    pub(crate) waits: Duration,
    /// How long a place in a fair queue taken or renewed by this attempt lives unless the next
    /// attempt renews it, at most `ttl`: a lock handed to the place lives the rest of it. `ttl`
    /// for a fair waiter; shorter for a default lock's waiter that queues because it starves
    /// (see `acquire/`), so that one that dies there holds up the lock less.
    pub(crate) lease: Duration,
    /// A waiter of a default (exclusive, one key) lock past its threshold (see `acquire/`):
    /// a node that can (see [`Node::queues_starving_waiters`]) asks as a fair waiter does, which
    /// gives it a place in the lock's queue.
    pub(crate) starving: bool,
    /// A refused caller that waits marks the lock waited for (the flag that makes a release
    /// wake its waiters; see `scripts::EXCLUSIVE_RELEASE`). False for a waiter that answered a
    /// release's wake-up and lost the race for it: it then listens to no release until it
    /// starves (see `acquire/waiting.rs`, `Herd`), so a mark would only make the next release
    /// wake the others for nothing.
    pub(crate) marks: bool,
    /// The attempt follows a pause that ran out on its own: no release heard, no subscription
    /// confirmed. Only then does Redlock check a gate that still shows the copy that refused the
    /// waiter before with the other nodes (see `redlock/gate.rs`); after a confirmation, the
    /// attempt only finds out whether a release came before it, which the gate tells.
    pub(crate) pause_ran_out: bool,
}

/// How many bytes of a holder value are the secret: a token's 32 hex digits.
pub(crate) const TOKEN_SECRET_LEN: usize = 32;

/// What proves ownership of one acquisition, and the value its grant writes: a secret, a random
/// (v4) UUID's 32 hex digits (122 bits from a CSPRNG the OS seeds, uuid's `fast-rng`: no system
/// call per token), then the asking client's owner record (see [`crate::owner`]), which
/// `inspect` reads back without the secret. Never printed: `Debug` hides it.
///
/// The value is written out on first use (a server request) and shared by the clones made
/// after: in memory, where no request is made, a token costs no allocation. Tokens are equal
/// when their secrets are.
#[derive(Clone)]
pub(crate) struct Token {
    secret: [u8; TOKEN_SECRET_LEN],
    /// When the holder asked, for the record (made a wall-clock time when it is written out).
    asked: std::time::Instant,
    identity: Identity,
    value: std::sync::OnceLock<Arc<str>>,
}

impl Token {
    /// A token of `identity` for an acquisition asked for at `asked`.
    pub(crate) fn new(identity: &Identity, asked: std::time::Instant) -> Self {
        let mut secret = [0u8; TOKEN_SECRET_LEN];
        uuid::Uuid::new_v4().simple().encode_lower(&mut secret);
        Token {
            secret,
            asked,
            identity: identity.clone(),
            value: std::sync::OnceLock::new(),
        }
    }

    /// The whole value: what the servers store and compare.
    pub(crate) fn as_str(&self) -> &str {
        self.value.get_or_init(|| {
            // Always ASCII hex digits.
            let secret = std::str::from_utf8(&self.secret).unwrap_or_default();
            self.identity.value(secret, wall_clock(self.asked))
        })
    }

    /// Who asked for it, as its value records it.
    pub(crate) fn owner(&self) -> crate::owner::Owner {
        self.identity.owner(wall_clock(self.asked))
    }

    /// The first 64 bits of the token's SHA-1: how a fair hand-off names its new holder in a
    /// message every subscriber of the lock sees, which must not carry the token itself.
    pub(crate) fn digest(&self) -> u64 {
        let sha = sha1_smol::Sha1::from(self.as_str()).digest().bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&sha[..8]);
        u64::from_be_bytes(first)
    }
}

/// The wall-clock time of `at`: the wall clock read once per process, plus the monotonic time
/// since. A fixed mapping, so that every clone of a token writes the same value (a mapping read
/// at each write put different milliseconds in two clones of one token, and a node then took
/// the holder's own release for another token's); the record's time does not follow a wall
/// clock stepped after the first lock.
fn wall_clock(at: std::time::Instant) -> std::time::SystemTime {
    static ANCHOR: std::sync::LazyLock<(std::time::Instant, std::time::SystemTime)> =
        std::sync::LazyLock::new(|| (std::time::Instant::now(), std::time::SystemTime::now()));
    let (instant, wall) = *ANCHOR;
    if at >= instant {
        wall + (at - instant)
    } else {
        wall.checked_sub(instant - at).unwrap_or(wall)
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.secret == other.secret
    }
}

impl Eq for Token {}

impl std::hash::Hash for Token {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.secret.hash(state);
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The answer to one acquire attempt.
#[derive(Debug, Clone)]
pub(crate) enum Attempt {
    /// Every key is ours; with fencing, one token per key (in key order), else empty.
    Acquired { fences: Vec<u64> },
    /// Someone else holds the key at `index`; `pttl` is its remaining time to live when known.
    /// `Some(ZERO)` says it is about to be free (it expires, or, in Redlock, the vote was split
    /// and every contender is withdrawing): retry soon, after a short jittered pause.
    /// `ticket` is a fair waiter's place in the queue: a release that hands the lock to another
    /// waiter wakes only that one (`None`: every release wakes this waiter). A ticket also says
    /// that the waiter left something on the server that a release removes if it gives up (its
    /// place in line; on etcd also a semaphore waiter's place or a waiting writer's marks).
    /// `announced`: the holder's release will tell this waiter by itself (a holder of this
    /// library on Redis, whose release publishes to the waiters that marked the lock; etcd's
    /// watch and the memory backend see every release). A release that announces nothing
    /// (another library's lock on the same key, a key deleted by hand) is noticed only by
    /// asking again, so a waiter polls at a short interval unless its answer says `announced`.
    Held {
        index: usize,
        pttl: Option<Duration>,
        ticket: Option<u64>,
        announced: bool,
    },
    /// The lock is used in another mode by its other callers (say `permits = 3` against
    /// `permits = 5`): never granted, reported as a `Config` error naming `field`.
    Mismatch { field: &'static str, reason: String },
}

impl Attempt {
    /// The answer to a caller of `key` in `mode` whose other callers use it as a lock of another
    /// kind: `other` is their permit count (0: a shared lock, -1: an exclusive lock).
    pub(crate) fn mismatch(key: &str, mode: Mode, other: i64) -> Attempt {
        let theirs = match other {
            -1 => "an exclusive lock".to_owned(),
            0 => "a shared (read/write) lock".to_owned(),
            n => format!("a semaphore with permits = {n}"),
        };
        Attempt::Mismatch {
            field: mode.argument(),
            reason: format!(
                "key {key:?} is used as {theirs} by its other callers; this call asks for a {mode} \
                 lock: every caller of a key must use it the same way"
            ),
        }
    }
}

/// The answer to one extension.
#[derive(Debug, Clone)]
pub(crate) enum ExtendOutcome {
    Extended,
    /// The key at `index` is no longer ours (expired, deleted, or taken by someone else).
    NotOwned {
        index: usize,
    },
    /// No answer that settles it; the renewal driver retries until the validity deadline.
    Failed(NodeFailure),
}

impl ExtendOutcome {
    /// `failure` for each of `n` items: a whole batch that got no answer.
    pub(crate) fn all_failed(n: usize, failure: &NodeFailure) -> Vec<ExtendOutcome> {
        vec![ExtendOutcome::Failed(failure.clone()); n]
    }
}

/// What the lock lifecycle talks to: one node, or a quorum of independent nodes (Redlock).
#[derive(Debug)]
pub(crate) enum Backend {
    /// One Redis server, whose acquire and release are called directly rather than through
    /// `dyn Node` (which boxes each call's future): the uncontended pair's common case.
    Redis(Arc<RedisNode>),
    One(Arc<dyn Node>),
    Quorum(Quorum),
}

impl Backend {
    /// The node of a one-node backend, or the quorum.
    fn node_or_quorum(&self) -> Result<&dyn Node, &Quorum> {
        match self {
            Backend::Redis(node) => Ok(&**node),
            Backend::One(node) => Ok(&**node),
            Backend::Quorum(quorum) => Err(quorum),
        }
    }

    pub(crate) async fn acquire(
        &self,
        names: &Names,
        token: &Token,
        ask: Ask,
    ) -> Result<Attempt, Vec<NodeFailure>> {
        match self {
            Backend::Redis(node) => node
                .acquire_here(names, token, ask)
                .await
                .map_err(|f| vec![f]),
            Backend::One(node) => node.acquire(names, token, ask).await.map_err(|f| vec![f]),
            Backend::Quorum(quorum) => quorum.acquire(names, token, ask).await,
        }
    }

    /// Whether a hand-off message is itself a grant here (see [`Node::hand_off_is_a_grant`]):
    /// never under Redlock.
    pub(crate) fn hand_off_is_a_grant(&self) -> bool {
        self.node_or_quorum().is_ok_and(Node::hand_off_is_a_grant)
    }

    /// On one Redis server, whether the lock `name` holds `token` now (see `Calls::look`);
    /// `None` elsewhere, where a waiter asks with an attempt instead.
    pub(crate) async fn look(
        &self,
        name: &str,
        token: &Token,
    ) -> Option<Result<Looked, NodeFailure>> {
        match self {
            Backend::Redis(node) => Some(node.look_here(name, token).await),
            _ => None,
        }
    }

    /// What a failure of the whole backend names as its node: the node's address, or `quorum`.
    pub(crate) fn label(&self) -> &str {
        self.node_or_quorum().map_or("quorum", Node::addr)
    }

    /// See [`Node::queues_starving_waiters`]: never under Redlock, whose fair queue lives on
    /// one node while its releases go to every node.
    pub(crate) fn queues_starving_waiters(&self) -> bool {
        self.node_or_quorum()
            .is_ok_and(Node::queues_starving_waiters)
    }

    /// See [`Node::tells_waiters_alone`].
    pub(crate) fn tells_waiters_alone(&self) -> bool {
        match self.node_or_quorum() {
            Ok(node) => node.tells_waiters_alone(),
            Err(quorum) => quorum.tells_waiters_alone(),
        }
    }

    /// The node, when the backend is one node that answers at once (in memory).
    pub(crate) fn at_once(&self) -> Option<&dyn AtOnce> {
        self.node_or_quorum().ok().and_then(Node::at_once)
    }

    /// Whether locks of `mode` can be held here; `Err` says why not (a `Config` error for the
    /// caller). Every single node offers every kind; Redlock refuses semaphores.
    pub(crate) fn supports(&self, mode: Mode) -> Result<(), String> {
        match self {
            Backend::Quorum(_) => Quorum::supports(mode),
            Backend::Redis(_) | Backend::One(_) => Ok(()),
        }
    }

    /// Extends `items`, reporting each item's outcome to `done` as soon as it is settled, so a
    /// slow item never holds back the confirmed ones.
    pub(crate) async fn extend_many(
        &self,
        items: Arc<[OwnedExtendItem]>,
        done: &mut (dyn FnMut(usize, ExtendOutcome) + Send),
    ) {
        match self.node_or_quorum() {
            Ok(node) => {
                let borrowed: Vec<ExtendItem<'_>> = items.iter().map(|i| i.borrow()).collect();
                for (i, outcome) in node.extend_many(&borrowed).await.into_iter().enumerate() {
                    done(i, outcome);
                }
            }
            Err(quorum) => quorum.extend_many(items, done).await,
        }
    }

    /// `Ok(true)` when the lock was ours up to the release.
    pub(crate) async fn release(
        &self,
        names: &Names,
        token: &Token,
        mode: Mode,
        wake: bool,
    ) -> Result<bool, Vec<NodeFailure>> {
        match self {
            Backend::Redis(node) => node
                .release_here(names, token, mode, wake)
                .await
                .map_err(|f| vec![f]),
            Backend::One(node) => node
                .release(names, token, mode, wake)
                .await
                .map_err(|f| vec![f]),
            Backend::Quorum(quorum) => quorum.release(names, token, mode, wake).await,
        }
    }

    /// [`Node::keep`] on the node, or under Redlock on every node (the quorum rule as for
    /// [`release`](Self::release)).
    pub(crate) async fn keep(
        &self,
        names: &Names,
        token: &Token,
        left: Duration,
    ) -> Result<bool, Vec<NodeFailure>> {
        match self.node_or_quorum() {
            Ok(node) => node.keep(names, token, left).await.map_err(|f| vec![f]),
            Err(quorum) => quorum.keep(names, token, left).await,
        }
    }

    /// Every node, in config order.
    pub(crate) fn nodes(&self) -> Vec<Arc<dyn Node>> {
        match self {
            Backend::Redis(node) => vec![Arc::clone(node) as Arc<dyn Node>],
            Backend::One(node) => vec![Arc::clone(node)],
            Backend::Quorum(quorum) => quorum.nodes(),
        }
    }

    /// Resolves once no request started so far is still running on any node (Redlock finishes
    /// its slower nodes in the background).
    pub(crate) async fn settled(&self) {
        if let Backend::Quorum(quorum) = self {
            quorum.settled().await;
        }
    }

    /// Subscribes to `name`'s releases for a lock whose first key is `first`: on its node, or
    /// under Redlock on the gate node of `first`, which the lock's attempts ask first. `needed` is
    /// how many confirmations make a release impossible to miss while those nodes answer.
    pub(crate) fn watch(&self, name: &str, first: &str, own: Option<u64>) -> Watch {
        match self.node_or_quorum() {
            Ok(node) => Watch {
                subscriptions: vec![node.watch(name, own)],
                needed: 1,
            },
            Err(quorum) => quorum.watch(name, first, own),
        }
    }

    /// Where else to listen when the subscriptions of [`watch`](Self::watch) could not be
    /// confirmed: Redlock's other nodes (a single node has nowhere else).
    pub(crate) fn watch_others(&self, name: &str, first: &str, own: Option<u64>) -> Option<Watch> {
        self.node_or_quorum()
            .err()
            .map(|quorum| quorum.watch_others(name, first, own))
    }
}

/// An [`ExtendItem`] that owns its parts, to cross task boundaries.
#[derive(Debug, Clone)]
pub(crate) struct OwnedExtendItem {
    pub(crate) names: Names,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
}

impl OwnedExtendItem {
    pub(crate) fn borrow(&self) -> ExtendItem<'_> {
        ExtendItem {
            names: &self.names,
            token: &self.token,
            ttl: self.ttl,
            mode: self.mode,
        }
    }
}

/// Milliseconds for Redis, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Milliseconds for Redis, rounded up: a key kept for `min_hold` never expires before it.
pub(crate) fn millis_up(d: Duration) -> u64 {
    millis(d.saturating_add(Duration::from_nanos(999_999)))
}

#[cfg(test)]
mod tests {
    use super::{Identity, TOKEN_SECRET_LEN, Token};

    /// Two clones of a token write their value out at different moments: the time in it must
    /// not depend on when (it did, and a node took the holder's own release for another
    /// token's: Redlock transfers waited out their 5 s wait).
    #[test]
    fn a_tokens_time_is_a_fixed_mapping_of_its_instant() {
        let at = std::time::Instant::now();
        let first = super::wall_clock(at);
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(first, super::wall_clock(at));
    }

    #[test]
    fn every_clone_of_a_token_writes_the_same_value() {
        let identity = Identity::new(None);
        for _ in 0..2_000 {
            let a = Token::new(&identity, std::time::Instant::now());
            let b = a.clone();
            // Written out at different moments: the same value all the same.
            let first = a.as_str().to_owned();
            std::hint::black_box(std::time::SystemTime::now());
            assert_eq!(first, b.as_str());
        }
    }

    #[test]
    fn tokens_are_random_and_hidden() {
        let identity = Identity::new(None);
        let now = std::time::Instant::now();
        let (a, b) = (Token::new(&identity, now), Token::new(&identity, now));
        let secret = &a.as_str()[..TOKEN_SECRET_LEN];
        assert!(secret.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(secret, &b.as_str()[..TOKEN_SECRET_LEN]);
        assert!(!format!("{a:?}").contains(secret));
        let Some(owner) = crate::owner::of_value(a.as_str().as_bytes()) else {
            panic!("no owner record after the secret");
        };
        assert_eq!(owner.pid, std::process::id());
    }
}
