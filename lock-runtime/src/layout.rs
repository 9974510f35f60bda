//! How locks are laid out on the servers, for tools that look at them directly: `lockctl`
//! (crate `lock-cli`) is built on this module, and so can an operator's own script or a test.
//!
//! Everything here is pure (no I/O) and agrees with what the library writes: the names of a
//! lock's keys on Redis and etcd and the way back from a key to its lock, the call that reads
//! what a Redis node holds of a lock and the typed reading of its reply ([`NodeHold`]), and the
//! quorum arithmetic by which [`inspect`](crate::inspect) and Redlock count nodes. To free a lock,
//! use [`force_release`](crate::force_release) (or `lockctl release --force`), not a `DEL`: it
//! also wakes the lock's waiters.
//!
//! The Redis items take and return types of redis-rs 1.x, which this crate depends on and
//! re-exports as `lock_runtime::redis`: a tool passes them to connections of that crate (or of
//! a `redis` 1.x dependency of its own).
//!
//! # Redis
//!
//! A lock `name` under the key prefix ([`LockConfig::key_prefix`](crate::LockConfig::key_prefix),
//! default `lock:`) has these keys, each made by [`redis_key`] with a [`RedisKeyKind`] (here
//! for `wallet:42`):
//!
//! | kind | key | what it holds |
//! |---|---|---|
//! | [`Lock`](RedisKeyKind::Lock) | `lock:{wallet:42}` | an exclusive or fair lock: a string, the holder's token followed by its [`Owner`] record; a shared lock or semaphore: a sorted set of its holders' values scored by the expiry of their leases (server milliseconds), with a member `#shared` or `#permits=N` scored `+inf` and, for each writer waiting for readers, `#w:` followed by 16 hex digits (its mark, scored by when it runs out) |
//! | [`Released`](RedisKeyKind::Released) | `lock:{wallet:42}:released` | not a key: the pub/sub channel each release that frees the lock is announced on (an empty message, `PUBLISH`, or `SPUBLISH` on a Cluster); a release that hands the lock to a queued waiter tells it alone, on its own channel `lock:{wallet:42}:released{<16 hex digits of its token's SHA-1>}` |
//! | [`Queue`](RedisKeyKind::Queue) | `lock:{wallet:42}:queue` | a fair lock's waiters: a sorted set of their tokens scored by arrival (server microseconds) |
//! | [`QueueLeases`](RedisKeyKind::QueueLeases) | `lock:{wallet:42}:queue-leases` | the same waiters scored by the expiry of their entry's lease (server milliseconds) |
//! | [`Waiting`](RedisKeyKind::Waiting) | `lock:{wallet:42}:waiting` | that someone waits (`1`, living as long as the longest waiter's lease): a refused waiter sets it, the release that frees the lock deletes it with the lock and only then announces itself or hands the lock on |
//!
//! The layout is injective: under one prefix no two lock names (and no name and kind) share a key
//! or channel, whatever braces or `%` the names contain, so [`redis_lock_name`] reads the name
//! back from a key. Every key of a lock carries one Redis Cluster hash tag, so they live in one
//! slot:
//! - a name without a hash tag is escaped (`%` as `%25`, `{` as `%7B`, `}` as `%7D`) and
//!   becomes the tag: `lock:{wallet:42}`, `lock:{wallet:42}:released`;
//! - a name with a hash tag `{t}` keeps `t` as the tag, so names that share a tag share a slot,
//!   and the escaped name follows an `=`: `{t}a` is `lock:{t}=%7Bt%7Da`, its release channel
//!   `lock:{t}:released=%7Bt%7Da`.
//!
//! Fencing tokens (for locks that ask for them) count on one counter per server, not one per
//! lock: [`redis_fence_key`] (`lock:fence`, an integer) on a single node, a Sentinel master and
//! each Redlock node, and on a Cluster one per hash slot, in the slot of the locks it counts for
//! ([`redis_cluster_fence_key`]: `lock:fence{<n>}`). No key of a lock outlives it.
//!
//! The first 32 bytes of a holder's value, and of each member of a lock's sorted sets, are the
//! secret part of a token: whoever reads them can extend or release that holder's lock. The
//! library never logs them, and the inspect script ([`redis_inspect`]) strips them on the server.
//! A tool that reads the keys itself must not print them either.
//!
//! ```
//! use lock_runtime::layout::{RedisKeyKind, redis_key, redis_lock_name};
//!
//! let key = redis_key("lock:", "wallet:42", RedisKeyKind::Lock);
//! assert_eq!(key, "lock:{wallet:42}");
//! assert_eq!(
//!     redis_key("lock:", "wallet:42", RedisKeyKind::Released),
//!     "lock:{wallet:42}:released"
//! );
//! assert_eq!(
//!     redis_lock_name("lock:", &key, RedisKeyKind::Lock).as_deref(),
//!     Some("wallet:42")
//! );
//! ```
//!
//! # etcd
//!
//! A lock `name` is the key `etcd_key(prefix, name)` (feature `etcd`): the prefix and the
//! name, each NUL byte followed by 0x7f. Its value is an exclusive holder's token (with the
//! [`Owner`] record), bound to the holder's lease; fair, shared and semaphore callers each put an
//! entry under it instead, `key NUL tag NUL token`, tag `q` (a fair lock's line), `r` (a reader),
//! `p` (a semaphore's line) or `w` (a writer waiting for readers), bound to their own leases. The fencing token of a grant is the create revision of its key or entry.
//! `etcd_lock_name` reads a lock's name back from its key or from an entry of a caller that
//! holds it or waits in its line. Values and entry keys carry tokens, secrets included: a tool
//! must not print them.
//!
//! # Counting nodes
//!
//! Under Redlock a lock is held while a [`majority`] of its nodes hold it, and
//! [`inspect`](crate::inspect) counts a lock's holders, waiters and time to live as that majority
//! does (see [`LockInfo`](crate::LockInfo)); [`majority_owners`] counts its owners so. A tool that
//! reads each node itself (with [`redis_inspect`]) counts with these to agree with `inspect`.
//! Waiters of a contended Redlock lock line up, and listen for its release, at its gate node,
//! [`redlock_gate`].

use crate::owner::Owner;

pub use crate::backend::KeyKind as RedisKeyKind;
pub use crate::backend::NodeHold;

/// The Redis key (or, for [`RedisKeyKind::Released`], the pub/sub channel) of `kind` of the lock
/// `name` under `prefix`: see the [table](self#redis). `prefix` is the client's
/// [`LockConfig::key_prefix`](crate::LockConfig::key_prefix) (default `lock:`).
///
/// ```
/// use lock_runtime::layout::{RedisKeyKind, redis_key};
///
/// assert_eq!(redis_key("lock:", "wallet:42", RedisKeyKind::Lock), "lock:{wallet:42}");
/// // A name's own hash tag stays the tag: the keys of `{user:7}:*` locks share a slot.
/// assert_eq!(
///     redis_key("lock:", "{user:7}:wallet", RedisKeyKind::Lock),
///     "lock:{user:7}=%7Buser:7%7D:wallet"
/// );
/// ```
pub fn redis_key(prefix: &str, name: &str, kind: RedisKeyKind) -> String {
    crate::backend::redis_key(prefix, name, kind)
}

/// The name of the lock whose Redis key (or channel) of `kind` under `prefix` is `key`: the
/// inverse of [`redis_key`]. `None` when `key` is no lock's key of that kind, such as a fence
/// counter or a fair lock's queue read as a lock key, or a key under another prefix.
///
/// This is how a tool that `SCAN`s for `lock:{*` keys (or `PSUBSCRIBE`s to `lock:{*`) tells lock
/// keys (or release channels, a waiter's own included) from the rest and names their locks:
///
/// ```
/// use lock_runtime::layout::{RedisKeyKind, redis_lock_name};
///
/// let lock = |key: &str| redis_lock_name("lock:", key, RedisKeyKind::Lock);
/// assert_eq!(lock("lock:{wallet:42}").as_deref(), Some("wallet:42"));
/// assert_eq!(lock("lock:{wallet:42}:queue"), None);
/// assert_eq!(lock("lock:fence"), None);
/// let released = |channel: &str| redis_lock_name("lock:", channel, RedisKeyKind::Released);
/// assert_eq!(released("lock:{wallet:42}:released").as_deref(), Some("wallet:42"));
/// // A queued waiter's own channel, which a release that hands it the lock publishes on.
/// assert_eq!(
///     released("lock:{wallet:42}:released{0123456789abcdef}").as_deref(),
///     Some("wallet:42")
/// );
/// ```
pub fn redis_lock_name(prefix: &str, key: &str, kind: RedisKeyKind) -> Option<String> {
    crate::backend::lock_name_of(prefix, key, kind)
}

/// The fence counter of one Redis server under `prefix` (a single node, a Sentinel master, each
/// Redlock node): every lock there that asks for a fencing token counts on it.
///
/// ```
/// assert_eq!(lock_runtime::layout::redis_fence_key("lock:"), "lock:fence");
/// ```
pub fn redis_fence_key(prefix: &str) -> String {
    crate::backend::server_fence_key(prefix)
}

/// The fence counter on a Redis Cluster that the lock `name` under `prefix` counts on: one per
/// hash slot, in the slot of the lock's keys.
///
/// ```
/// use lock_runtime::layout::{RedisKeyKind, redis_cluster_fence_key, redis_key};
///
/// // Locks that share a hash tag share a slot, and so a counter.
/// assert_eq!(
///     redis_cluster_fence_key("lock:", "{user:7}:a"),
///     redis_cluster_fence_key("lock:", "{user:7}:b")
/// );
/// assert!(redis_cluster_fence_key("lock:", "wallet:42").starts_with("lock:fence{"));
/// ```
pub fn redis_cluster_fence_key(prefix: &str, name: &str) -> String {
    crate::backend::slot_fence_key(prefix, name)
}

/// The call that reads what one Redis node holds of the lock `name` under `prefix`: the
/// library's own inspect script (the one [`inspect`](crate::inspect) runs), with the lock's keys
/// set (its lock key and fair queue's leases, which share a slot). Read its reply
/// with [`decode_redis_inspect`].
///
/// A prepared [`redis::ScriptInvocation`] rather than the script, so that the keys cannot be
/// given in the wrong order. [`invoke_async`](redis::ScriptInvocation::invoke_async) runs it
/// once, loading the script when the server does not have it; to ask about many locks in one
/// round trip, add the calls to a [`redis::Pipeline`] with
/// [`invoke_script`](redis::Pipeline::invoke_script), after loading the script once with
/// [`load_async`](redis::ScriptInvocation::load_async) (a pipeline does not load it). The script
/// only reads, and it leaves the holders' secrets on the server.
///
/// ```no_run
/// use lock_runtime::layout::{decode_redis_inspect, redis_inspect};
///
/// # async fn list() -> redis::RedisResult<()> {
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let mut conn = client.get_multiplexed_async_connection().await?;
/// let names = ["wallet:1", "wallet:2"];
/// let calls: Vec<_> = names.iter().map(|name| redis_inspect("lock:", name)).collect();
/// calls[0].load_async(&mut conn).await?;
/// let mut pipe = redis::pipe();
/// for call in &calls {
///     pipe.invoke_script(call);
/// }
/// let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
/// for (name, reply) in names.iter().zip(&replies) {
///     match decode_redis_inspect(reply)? {
///         Some(hold) => println!("{name}: {} holder(s), {:?} left", hold.holders, hold.remaining),
///         None => println!("{name}: not held"),
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub fn redis_inspect(prefix: &str, name: &str) -> redis::ScriptInvocation<'static> {
    crate::backend::inspect_invocation(prefix, name)
}

/// Reads a reply to [`redis_inspect`]: what the node holds of the lock, `None` when it does not
/// hold it (no key, or a shared lock or semaphore without a live holder). An error when `reply`
/// is not one of the script's replies (for example another command's, out of order in a
/// pipeline); it converts into a [`redis::RedisError`] with `?`.
pub fn decode_redis_inspect(reply: &redis::Value) -> Result<Option<NodeHold>, redis::ParsingError> {
    let decoded = match reply {
        redis::Value::Array(items) => crate::backend::decode_inspect(items),
        _ => None,
    };
    decoded.ok_or_else(|| redis::ParsingError::from("not a reply of the inspect script"))
}

/// The etcd key of the lock `name` under `prefix` (feature `etcd`): `prefix` and `name`, each NUL
/// byte followed by 0x7f, so that no lock's key is an entry of another's (see the
/// [module documentation](self#etcd)). A name without NUL bytes keeps its plain key.
///
/// ```
/// assert_eq!(lock_runtime::layout::etcd_key("lock:", "wallet:42"), "lock:wallet:42");
/// ```
#[cfg(feature = "etcd")]
pub fn etcd_key(prefix: &str, name: &str) -> String {
    crate::backend::etcd_key(prefix, name)
}

/// The name of the lock whose etcd key, or caller's entry, is `key` under `prefix` (feature
/// `etcd`): the inverse of [`etcd_key`], for tools that read etcd directly (`lockctl list` and
/// `watch` range over the prefix). `Some` for a lock's key and for the entries of its fair,
/// shared and semaphore callers, which hold the lock or wait in its line; `None` for a writer's
/// waiting mark (it never holds the lock) and for keys that are no lock's.
///
/// ```
/// use lock_runtime::layout::{etcd_key, etcd_lock_name};
///
/// let key = etcd_key("lock:", "wallet:42");
/// assert_eq!(etcd_lock_name("lock:", key.as_bytes()).as_deref(), Some("wallet:42"));
/// assert_eq!(etcd_lock_name("other:", key.as_bytes()), None);
/// ```
#[cfg(feature = "etcd")]
pub fn etcd_lock_name(prefix: &str, key: &[u8]) -> Option<String> {
    crate::backend::etcd_lock_name(prefix, key)
}

/// How many of `nodes` nodes are a majority (`nodes / 2 + 1`): under Redlock, how many must
/// grant, renew or hold a lock, and how many nodes [`inspect`](crate::inspect) needs to report
/// it held. 1 for one node.
///
/// ```
/// use lock_runtime::layout::majority;
///
/// assert_eq!(majority(1), 1);
/// assert_eq!(majority(3), 2);
/// assert_eq!(majority(4), 3);
/// assert_eq!(majority(5), 3);
/// ```
pub fn majority(nodes: usize) -> usize {
    crate::backend::Quorum::majority(nodes)
}

/// The owners at least `quorum` nodes record, as [`LockInfo::owners`](crate::LockInfo::owners)
/// counts them: `per_node` holds the [`NodeHold::owners`] of each node that holds the lock, and
/// each owner is returned as many times as the `quorum`-th of those nodes records it (one per
/// share or permit), in the order the nodes first list them. `quorum` is [`majority`] of the
/// nodes asked (1 for a lone node or a Cluster master; 0 counts as 1).
pub fn majority_owners(per_node: &[Vec<Owner>], quorum: usize) -> Vec<Owner> {
    crate::info::majority_owners(per_node, quorum)
}

/// The gate node of a Redlock lock: the index, among `nodes` Redlock nodes in configuration
/// order, of the node that a contended lock's acquires ask first, where its fair waiters line
/// up and where its waiters listen for its release. The same for every client; `name` is the
/// lock's key, or the first of its keys in sorted order. Less than `nodes` (0 when `nodes` is 0).
///
/// ```
/// use lock_runtime::layout::redlock_gate;
///
/// let gate = redlock_gate("wallet:42", 3);
/// assert!(gate < 3);
/// assert_eq!(redlock_gate("wallet:42", 3), gate);
/// ```
pub fn redlock_gate(name: &str, nodes: usize) -> usize {
    if nodes == 0 {
        return 0;
    }
    crate::backend::gate_of(name, nodes)
}
