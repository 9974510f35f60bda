//! Test harness for the `lock-*` crates: real `redis-server` processes on free loopback ports
//! (stop, restart, freeze), groups of independent masters for Redlock, a Redis Cluster
//! (3 masters + 3 replicas) and a Sentinel set (master, replica, 3 sentinels), a fault-injecting TCP proxy,
//! an HTTP server (something other than Redis at a Redis URL), child processes of this package's binaries (and of the interop tests' scripts in other
//! languages), and one helper each for the lock key layout and
//! bounded polling.
//!
//! Everything binds and connects to 127.0.0.1 only. Every wait is bounded; a harness failure panics
//! with context (for servers, the tail of the server log). Servers and proxies clean up on drop, so a
//! failing test leaves no process behind.
//!
//! ```no_run
//! use lock_tests::{FaultProxy, RedisServer, lock_keys, unique_key};
//! use std::time::Duration;
//!
//! let server = RedisServer::start();
//! let proxy = FaultProxy::start(server.port());
//! proxy.set_delay(Duration::from_millis(50));
//! let key = unique_key("example");
//! // ... point the client under test at `proxy.url()` and lock `key` ...
//! assert!(server.keys(&lock_keys(&key).lock).is_empty());
//! ```
//!
//! `redis-server` is taken from `PATH`, or from `LOCK_TESTS_REDIS_SERVER` if set; any server
//! kind runs another program given in [`ServerOptions::binary`] (the Valkey tests: the
//! `valkey-server` of [`valkey_server`]). With the `etcd` feature, [`EtcdCluster`] starts `etcd`
//! members (from `PATH`, or `LOCK_TESTS_ETCD`).

pub mod campaign;
pub mod capture;
mod harness;
pub mod history;
pub mod sections;

pub use harness::cluster::RedisCluster;
#[cfg(feature = "etcd")]
pub use harness::etcd::{ETCD_BINARY_ENV, ETCD_ELECTION_TIMEOUT, EtcdCluster, EtcdStore, etcd_key};
pub use harness::foreign::{Foreign, Interop};
pub use harness::http::HttpServer;
pub use harness::keyspace::{KeyEvent, KeyEvents};
pub use harness::levers::{
    BusyScript, LoadingServer, await_waiter, bounded, bounded_blocking, callers_connection,
    callers_connections, eventually, key_exists, pause_writes, ping_error_code,
    release_lost_in_a_partition, wait_key_gone, waiter, warm_up,
};
pub use harness::monitor::{Monitor, Sent};
pub use harness::proxy::FaultProxy;
pub use harness::sentinel::{SentinelOptions, SentinelSet};
pub use harness::server::{RedisMasters, RedisServer, ServerOptions, Stats};
pub use harness::store::{LockStore, RedisStore, SHORT_TTL};
pub use harness::tls::TestCa;
pub use harness::util::{
    CLEANUP_PAUSE, LockKeys, QUICK_REQUEST, SCHEDULING_SLACK, assert_lost_at_the_deadline, client,
    config_field, default_validity, free_port, lock_keys, ms, queued, quick_client,
    unavailable_causes, unique_key, until_queued, wait_until, wait_until_async,
};
#[cfg(feature = "etcd")]
pub use harness::util::{ETCD_REQUEST, etcd_client};
pub use harness::valkey::valkey_server;
pub use harness::worker::{Finished, Worker, finish_all};
