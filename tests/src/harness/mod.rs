//! Processes and sockets the integration tests run against.

pub(crate) mod cluster;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod foreign;
pub(crate) mod http;
pub(crate) mod keyspace;
pub(crate) mod levers;
pub(crate) mod monitor;
pub(crate) mod proxy;
pub(crate) mod sentinel;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod tls;
pub(crate) mod util;
pub(crate) mod valkey;
pub(crate) mod worker;
