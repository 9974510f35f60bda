//! What the behaviour suite reads from the servers behind a client, whatever the topology: one
//! server, or a Redis Cluster seen as one store (each key lives on the master of its slot).

use super::server::RedisServer;

/// A place locks live, read as admin.
pub trait LockStore: Send + Sync + std::fmt::Debug {
    /// `KEYS pattern`, sorted (over every master of a cluster).
    fn keys(&self, pattern: &str) -> Vec<String>;
    /// How many connections are subscribed to the release channel `channel` (sharded channels
    /// on a cluster).
    fn subscribers(&self, channel: &str) -> i64;
    /// How many times `command` ran, summed over the servers.
    fn command_calls(&self, command: &str) -> u64;
    /// Whether a master can be replaced (Sentinel, Cluster): the client then confirms a fair
    /// hand-off's message with the current master (one acquire call per hand-off).
    fn fails_over(&self) -> bool {
        false
    }
}

impl LockStore for RedisServer {
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
