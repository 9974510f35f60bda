//! Test harness for the `lock-*` crates: real `redis-server` processes on free loopback ports
//! (stop, restart, freeze), groups of independent masters for Redlock, and a fault-injecting TCP proxy.
//!
//! Everything binds and connects to 127.0.0.1 only. Every wait is bounded; a harness failure panics
//! with context (for servers, the tail of the server log). Servers and proxies clean up on drop, so a
//! failing test leaves no process behind.
//!
//! ```no_run
//! use lock_tests::{FaultProxy, RedisServer, unique_key};
//! use std::time::Duration;
//!
//! let server = RedisServer::start();
//! let proxy = FaultProxy::start(server.port());
//! proxy.set_delay(Duration::from_millis(50));
//! let key = unique_key("lock:example");
//! // ... point the client under test at `proxy.url()` ...
//! assert!(server.keys(&format!("{key}*")).is_empty());
//! ```
//!
//! `redis-server` is taken from `PATH`, or from `LOCK_TESTS_REDIS_SERVER` if set.

mod harness;

pub use harness::levers::{
    BusyScript, LoadingServer, await_waiter, bounded, eventually, key_exists, lock_key,
    ping_error_code,
};
pub use harness::proxy::FaultProxy;
pub use harness::server::{RedisCluster, RedisServer, ServerOptions};
pub use harness::util::{free_port, unique_key};
