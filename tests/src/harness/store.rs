//! What the behaviour suite reads from the store behind a client, whatever the backend: one Redis
//! server, a Redis Cluster or Sentinel set seen as one store (each key lives on the master of its
//! slot), or an etcd cluster (one store however many members it has). A Redis topology answers
//! through the admin commands of [`RedisStore`]; etcd answers for itself (`EtcdStore`, feature
//! `etcd`).

use std::time::Duration;

use super::server::RedisServer;
use crate::lock_keys;

/// A short ttl that renewal must keep alive where a write takes a millisecond or so (Redis, in
/// memory).
pub const SHORT_TTL: Duration = Duration::from_millis(500);

/// A place locks live, as the behaviour suite reads it.
pub trait LockStore: Send + Sync + std::fmt::Debug {
    /// Whether lock `name` (default prefix) is held here.
    fn holds(&self, name: &str) -> bool;
    /// Whether no lock whose name starts with `prefix` is held here but `but`'s (if given).
    fn holds_none_under(&self, prefix: &str, but: Option<&str>) -> bool;
    /// A probe, made before a waiter for lock `name` starts, that says once a waiter listens here
    /// for a release of it.
    fn listening(&self, name: &str) -> Box<dyn FnMut() -> bool + Send + '_>;
    /// How long a waiter may take to listen here after its first attempt was refused.
    fn listen_timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
    /// A count that grows with every request of the lock protocol this store gets (not the
    /// harness's own reads), in a unit of the store's own: it stands still while nothing is asked.
    fn lock_requests(&self) -> u64;
    /// The lock scripts run here so far (one per lock operation on a Redis node), or `None` where
    /// locks are no scripts.
    fn script_calls(&self) -> Option<u64>;
    /// How many times `command` (lowercase) ran here so far, those scripts ran included, or
    /// `None` where locks are no Redis commands.
    fn command_calls(&self, command: &str) -> Option<u64>;
    /// Whether a master can be replaced (Sentinel, Cluster): the client then confirms a fair
    /// hand-off's message with the current master (one acquire call per hand-off).
    fn fails_over(&self) -> bool {
        false
    }
    /// A short ttl that renewal must keep alive here.
    fn short_ttl(&self) -> Duration {
        SHORT_TTL
    }
    /// How much later than its time to live a lock may still be found held here: none where keys
    /// expire by the millisecond.
    fn expiry_granularity(&self) -> Duration {
        Duration::ZERO
    }
}

/// A Redis topology read as admin: one server, or a Cluster or Sentinel set seen as one.
pub trait RedisStore: Send + Sync + std::fmt::Debug {
    /// `KEYS pattern`, sorted (over every master of a cluster).
    fn keys(&self, pattern: &str) -> Vec<String>;
    /// How many subscriptions listen for the releases of the lock whose release channel is
    /// `channel`: to it and to its queued waiters' own channels (sharded channels on a cluster;
    /// see [`RedisServer::subscribers`]).
    fn subscribers(&self, channel: &str) -> i64;
    /// How many times `command` ran, summed over the servers.
    fn command_calls(&self, command: &str) -> u64;
    /// Whether a master can be replaced (Sentinel, Cluster).
    fn fails_over(&self) -> bool {
        false
    }
}

/// Commands of the lock protocol (scripts first, then plain key commands and pub/sub), not the
/// harness's own `INFO` and connection set-up.
///
/// Not `PUBLISH`: the client publishes only from its scripts, which are counted already, while
/// every sentinel publishes its hello message on the master every 2 s (3 sentinels: 1.5 a
/// second), which made a count over a few milliseconds on a Sentinel set grow with no lock
/// request (two clean-clone CI runs).
const LOCK_COMMANDS: [&str; 11] = [
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "set",
    "get",
    "del",
    "incr",
    "pexpire",
    "subscribe",
];

/// How many of [`LOCK_COMMANDS`] run a lock script.
const SCRIPT_COMMANDS: usize = 4;

impl<T: RedisStore> LockStore for T {
    fn holds(&self, name: &str) -> bool {
        let lock = lock_keys(name).lock;
        self.keys(&lock) == [lock.as_str()]
    }

    fn holds_none_under(&self, prefix: &str, but: Option<&str>) -> bool {
        let all = lock_keys(&format!("{prefix}*")).lock;
        let this = but.map(|k| lock_keys(k).lock);
        let found = self.keys(&all);
        found.is_empty() || this.as_ref().is_some_and(|k| found == [k.as_str()])
    }

    /// A subscription to the lock's release channel.
    fn listening(&self, name: &str) -> Box<dyn FnMut() -> bool + Send + '_> {
        let channel = lock_keys(name).channel;
        Box::new(move || self.subscribers(&channel) > 0)
    }

    fn lock_requests(&self) -> u64 {
        LOCK_COMMANDS.iter().map(|c| self.command_calls(c)).sum()
    }

    fn command_calls(&self, command: &str) -> Option<u64> {
        Some(RedisStore::command_calls(self, command))
    }

    fn script_calls(&self) -> Option<u64> {
        Some(
            LOCK_COMMANDS[..SCRIPT_COMMANDS]
                .iter()
                .map(|c| self.command_calls(c))
                .sum(),
        )
    }

    fn fails_over(&self) -> bool {
        RedisStore::fails_over(self)
    }
}

impl RedisStore for RedisServer {
    fn keys(&self, pattern: &str) -> Vec<String> {
        RedisServer::keys(self, pattern)
    }

    fn subscribers(&self, channel: &str) -> i64 {
        RedisServer::subscribers(self, channel)
    }

    fn command_calls(&self, command: &str) -> u64 {
        RedisServer::command_calls(self, command)
    }
}
