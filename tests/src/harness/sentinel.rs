//! A Sentinel-managed master on loopback: 1 master, 1 replica, 3 sentinels.

// A harness failure should stop the test loudly, with context.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use super::proxy::FaultProxy;
use super::server::{RedisServer, ServerOptions};
use super::store::RedisStore;
use super::tls::TestCa;
use super::util::{poll_until, reap_after_exit};
use super::valkey::valkey_server_or_panic;

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Sentinels call the master down after this long without an answer...
const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// ...and give up on a failover after this long.
const FAILOVER_TIMEOUT_MS: u64 = 3000;

/// How to start a [`SentinelSet`].
#[derive(Debug, Clone, Default)]
pub struct SentinelOptions {
    /// `requirepass` on both data nodes (the replica and the sentinels authenticate with it).
    pub password: Option<String>,
    /// `requirepass` on the sentinels themselves (they authenticate to each other with it, and
    /// [`SentinelSet::sentinel_urls`] carry it).
    pub sentinel_password: Option<String>,
    /// Every process serves TLS only, with this CA (see [`ServerOptions::tls`]).
    pub tls: Option<TestCa>,
    /// Each data node behind a [`FaultProxy`] of its own, and known by the proxy's port
    /// (`replica-announce-port`, the sentinels' `monitor`): clients, sentinels and the
    /// replication link all reach it through the proxy.
    pub proxied: bool,
    /// The sentinels' down-after time, if not the default 1 s.
    pub down_after: Option<Duration>,
    /// The server program of every process, data nodes and sentinels (see
    /// [`ServerOptions::binary`]).
    pub binary: Option<PathBuf>,
}

/// Two data nodes (one master, one replica) watched by three sentinels under the master name
/// [`MASTER_NAME`](Self::MASTER_NAME), quorum 2. Dropping it kills every process.
#[derive(Debug)]
pub struct SentinelSet {
    /// The data nodes: `data[0]` starts as master, `data[1]` as its replica.
    pub data: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
    /// With [`SentinelOptions::proxied`], `proxies[i]` is the proxy in front of `data[i]`.
    pub proxies: Vec<FaultProxy>,
}

impl SentinelSet {
    /// The master name the sentinels monitor.
    pub const MASTER_NAME: &'static str = "locks";

    /// Starts the set and returns once every sentinel knows the master, its replica and the
    /// two other sentinels, and the replica's link is up (bounded; panics with the logs).
    pub fn start() -> SentinelSet {
        Self::start_with_password(None)
    }

    /// [`start`](Self::start), with `requirepass` on both data nodes (the replica and the
    /// sentinels authenticate with it; the sentinels themselves ask for no password).
    pub fn start_with_password(password: Option<&str>) -> SentinelSet {
        Self::start_with(SentinelOptions {
            password: password.map(str::to_owned),
            ..SentinelOptions::default()
        })
    }

    /// [`start`](Self::start) with `opts`.
    pub fn start_with(opts: SentinelOptions) -> SentinelSet {
        let password = opts.password.as_deref();
        let auth: Vec<String> = password
            .map(|p| vec!["--masterauth".into(), p.into()])
            .unwrap_or_default();
        let master = RedisServer::start_with(ServerOptions {
            binary: opts.binary.clone(),
            requirepass: password.map(str::to_owned),
            tls: opts.tls.clone(),
            extra_args: [
                vec!["--repl-diskless-sync-delay".into(), "0".into()],
                auth.clone(),
            ]
            .concat(),
            ..ServerOptions::default()
        });
        let replica = RedisServer::start_with(ServerOptions {
            binary: opts.binary.clone(),
            requirepass: password.map(str::to_owned),
            tls: opts.tls.clone(),
            extra_args: [
                vec![
                    "--repl-diskless-sync-delay".into(),
                    "0".into(),
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master.port().to_string(),
                ],
                auth,
            ]
            .concat(),
            ..ServerOptions::default()
        });
        let proxies: Vec<FaultProxy> = if opts.proxied {
            [&master, &replica]
                .map(|node| FaultProxy::start(node.port()))
                .into()
        } else {
            Vec::new()
        };
        for (node, proxy) in [&master, &replica].iter().zip(&proxies) {
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("replica-announce-port")
                .arg(proxy.port())
                .query(&mut node.admin())
                .unwrap();
        }
        if let Some(proxy) = proxies.first() {
            // Again, through the proxy, and announcing the replica's proxy to the master.
            let () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(proxy.port())
                .query(&mut replica.admin())
                .unwrap();
        }
        let master_port = proxies.first().map_or(master.port(), FaultProxy::port);
        let name = Self::MASTER_NAME;
        let sentinel_auth = password
            .map(|p| format!("sentinel auth-pass {name} {p}"))
            .unwrap_or_default();
        let sentinel_opts = ServerOptions {
            config_lines: vec![
                sentinel_auth,
                format!("sentinel monitor {name} 127.0.0.1 {master_port} 2"),
                format!(
                    "sentinel down-after-milliseconds {name} {}",
                    opts.down_after.unwrap_or(DOWN_AFTER).as_millis()
                ),
                format!("sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}"),
                format!("sentinel parallel-syncs {name} 1"),
            ],
            extra_args: vec!["--sentinel".into()],
            binary: opts.binary.clone(),
            requirepass: opts.sentinel_password.clone(),
            tls: opts.tls.clone(),
            ..ServerOptions::default()
        };
        let sentinels = (0..3)
            .map(|_| RedisServer::start_with(sentinel_opts.clone()))
            .collect();
        let set = SentinelSet {
            data: vec![master, replica],
            sentinels,
            proxies,
        };
        set.wait_ready(READY_TIMEOUT);
        set
    }

    /// One set for the whole test binary (tests share it with distinct keys and must not fail
    /// it over). Its processes are killed once the test binary exits.
    pub fn shared() -> &'static SentinelSet {
        static SHARED: OnceLock<SentinelSet> = OnceLock::new();
        SHARED.get_or_init(|| SentinelSet::start().reaped_at_exit())
    }

    /// Like [`shared`](Self::shared), over TLS with [`TestCa::shared`].
    pub fn shared_tls() -> &'static SentinelSet {
        static SHARED: OnceLock<SentinelSet> = OnceLock::new();
        SHARED.get_or_init(|| {
            SentinelSet::start_with(SentinelOptions {
                tls: Some(TestCa::shared().clone()),
                ..SentinelOptions::default()
            })
            .reaped_at_exit()
        })
    }

    /// Like [`shared`](Self::shared), every process a `valkey-server` ([`valkey_server`](crate::valkey_server); panics
    /// if there is none: a caller skips first).
    pub fn shared_valkey() -> &'static SentinelSet {
        static SHARED: OnceLock<SentinelSet> = OnceLock::new();
        SHARED.get_or_init(|| {
            SentinelSet::start_with(SentinelOptions {
                binary: Some(valkey_server_or_panic()),
                ..SentinelOptions::default()
            })
            .reaped_at_exit()
        })
    }

    /// Kills the processes, and removes their directories, once the test binary exits (for a
    /// set kept in a `static`, which is never dropped).
    fn reaped_at_exit(self) -> Self {
        let all: Vec<&RedisServer> = self.data.iter().chain(&self.sentinels).collect();
        let pids: Vec<u32> = all.iter().map(|n| n.pid()).collect();
        let dirs: Vec<&std::path::Path> = all.iter().map(|n| n.dir()).collect();
        reap_after_exit(&pids, &dirs);
        self
    }

    /// [`RedisServer::url`] of every sentinel: `redis://127.0.0.1:PORT/` (`rediss://` with
    /// TLS, with the sentinels' password if they have one).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port the sentinels name as master (asks the first one that answers).
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(Self::MASTER_NAME)
                .query(&mut s.admin())
                .ok()?;
            addr.map(|(_, port)| port)
        })
    }

    /// The port the sentinels know `data[i]` by: its proxy's with
    /// [`SentinelOptions::proxied`], else its own.
    pub fn known_port(&self, i: usize) -> u16 {
        self.proxies
            .get(i)
            .map_or_else(|| self.data[i].port(), FaultProxy::port)
    }

    /// The index in `data` of the node the sentinels know by `port` ([`known_port`](Self::known_port)).
    pub fn index_of(&self, port: u16) -> Option<usize> {
        (0..self.data.len()).find(|&i| self.known_port(i) == port)
    }

    /// The data node the sentinels name as master.
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port().expect("the sentinels name a master");
        let i = self
            .index_of(port)
            .unwrap_or_else(|| panic!("the sentinels name an unknown master on port {port}"));
        &self.data[i]
    }

    /// The data node that is not [`master`](Self::master).
    pub fn replica(&self) -> &RedisServer {
        let port = self.master().port();
        self.data.iter().find(|n| n.port() != port).unwrap()
    }

    /// `SENTINEL FAILOVER`: the sentinels promote the replica (the old master becomes its
    /// replica) without waiting for agreement. Returns at once; see
    /// [`wait_master_is`](Self::wait_master_is).
    pub fn failover(&self) {
        let () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(Self::MASTER_NAME)
            .query(&mut self.sentinels[0].admin())
            .unwrap();
    }

    /// Waits until every sentinel names the node on `port` as master and that node says
    /// `role:master`.
    pub fn wait_master_is(&self, port: u16, timeout: Duration) -> Duration {
        let start = std::time::Instant::now();
        let done = poll_until(timeout, Duration::from_millis(20), || {
            let all = self.sentinels.iter().all(|s| {
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(Self::MASTER_NAME)
                    .query::<Option<(String, u16)>>(&mut s.admin())
                    .is_ok_and(|a| a.is_some_and(|(_, p)| p == port))
            });
            let node = &self.data[self.index_of(port)?];
            (all && node.info("replication").contains("role:master")).then_some(())
        });
        assert!(
            done.is_some(),
            "the sentinels did not make port {port} the master within {timeout:?}"
        );
        start.elapsed()
    }

    fn wait_ready(&self, timeout: Duration) {
        let master = self.known_port(0);
        let ready = poll_until(timeout, Duration::from_millis(50), || {
            let sentinels_ready = self.sentinels.iter().all(|s| {
                let info = s.info("sentinel");
                info.contains(&format!("address=127.0.0.1:{master},slaves=1,sentinels=3"))
            });
            let linked = self.data[1]
                .info("replication")
                .contains("master_link_status:up");
            (sentinels_ready && linked).then_some(())
        });
        if ready.is_none() {
            let logs: String = self
                .data
                .iter()
                .chain(&self.sentinels)
                .map(|n| n.log_tail(15))
                .collect();
            panic!("the sentinel set was not ready within {timeout:?}\n{logs}");
        }
    }
}

impl RedisStore for &'static SentinelSet {
    fn fails_over(&self) -> bool {
        true
    }

    fn keys(&self, pattern: &str) -> Vec<String> {
        self.master().keys(pattern)
    }

    fn subscribers(&self, channel: &str) -> i64 {
        self.master().subscribers(channel)
    }

    fn command_calls(&self, command: &str) -> u64 {
        self.master().command_calls(command)
    }
}
