//! A Redis Cluster of real `redis-server` processes on loopback: 3 masters, each with 1 replica.

// A harness failure should stop the test loudly, with context.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::Duration;

use super::server::{RedisServer, ServerOptions};
use super::store::RedisStore;
use super::tls::{CA_CERT, CLIENT_CERT, CLIENT_KEY, TestCa};
use super::util::{poll_until, reap_after_exit};
use super::valkey::valkey_server_or_panic;

const MASTERS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Short, so that a replica takes over a dead master within a few seconds.
const NODE_TIMEOUT_MS: u64 = 1000;

/// Six cluster nodes: after [`start`](Self::start), the first three are masters (slots split in
/// three) and the last three their replicas. Dropping it kills every node and removes their
/// directories; [`shared`](Self::shared) is one cluster per test binary.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node, masters first; roles change with failovers (see [`masters`](Self::masters)).
    pub nodes: Vec<RedisServer>,
    /// After [`announce`](Self::announce): the port each node announces (a proxy's in front of
    /// it), by node index; empty before.
    announced: Vec<u16>,
}

impl RedisCluster {
    /// Starts 6 nodes, joins them with `redis-cli --cluster create --cluster-replicas 1`, and
    /// returns once every node reports `cluster_state:ok`, agrees on the slot owners, and every
    /// replica's link to its master is up (bounded; panics with the logs).
    pub fn start() -> RedisCluster {
        Self::start_with(ServerOptions::default())
    }

    /// [`start`](Self::start) with `base` for every node (the cluster's own options are added
    /// to its `extra_args`). With [`tls`](ServerOptions::tls), clients and the cluster bus
    /// speak TLS only, and `redis-cli` joins the nodes over TLS.
    pub fn start_with(base: ServerOptions) -> RedisCluster {
        let opts = ServerOptions {
            extra_args: [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &NODE_TIMEOUT_MS.to_string(),
                // A replica may take over even right after it was cut off (the failover tests
                // freeze it first).
                "--cluster-replica-validity-factor",
                "0",
                "--cluster-allow-replica-migration",
                "no",
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(str::to_owned)
            .into_iter()
            .chain(base.extra_args.iter().cloned())
            .collect(),
            ..base.clone()
        };
        let nodes: Vec<RedisServer> = thread::scope(|scope| {
            let handles: Vec<_> = (0..MASTERS * 2)
                .map(|_| scope.spawn(|| RedisServer::start_with(opts.clone())))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let tls: Vec<std::ffi::OsString> = match &base.tls {
            None => Vec::new(),
            Some(ca) => vec![
                "--tls".into(),
                "--cacert".into(),
                ca.file(CA_CERT).into(),
                "--cert".into(),
                ca.file(CLIENT_CERT).into(),
                "--key".into(),
                ca.file(CLIENT_KEY).into(),
            ],
        };
        let out = Command::new("redis-cli")
            .args(tls)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run redis-cli (is it installed?): {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster {
            nodes,
            announced: Vec::new(),
        };
        cluster.wait_ok(READY_TIMEOUT);
        cluster
    }

    /// One cluster for the whole test binary, started on first use. Tests share it with distinct
    /// keys and must not change its topology. Its processes are killed, and their directories
    /// removed, once the test binary exits.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| RedisCluster::start().reaped_at_exit())
    }

    /// Like [`shared`](Self::shared), over TLS with [`TestCa::shared`].
    pub fn shared_tls() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            RedisCluster::start_with(ServerOptions {
                tls: Some(TestCa::shared().clone()),
                ..ServerOptions::default()
            })
            .reaped_at_exit()
        })
    }

    /// Like [`shared`](Self::shared), every node a `valkey-server` ([`valkey_server`](crate::valkey_server); panics
    /// if there is none: a caller skips first). Joined by `redis-cli` all the same.
    pub fn shared_valkey() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            RedisCluster::start_with(ServerOptions {
                binary: Some(valkey_server_or_panic()),
                ..ServerOptions::default()
            })
            .reaped_at_exit()
        })
    }

    /// Kills the processes, and removes their directories, once the test binary exits (for a
    /// cluster kept in a `static`, which is never dropped).
    fn reaped_at_exit(self) -> Self {
        let pids: Vec<u32> = self.nodes.iter().map(RedisServer::pid).collect();
        let dirs: Vec<&std::path::Path> = self.nodes.iter().map(RedisServer::dir).collect();
        reap_after_exit(&pids, &dirs);
        self
    }

    /// Seed URLs: every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits until every running node reports `cluster_state:ok`, all of them name the same
    /// master for every slot, and every master's replica has its link up.
    pub fn wait_ok(&self, timeout: Duration) {
        let mut last = String::new();
        let healthy = poll_until(timeout, Duration::from_millis(50), || {
            let running: Vec<&RedisServer> = self.nodes.iter().filter(|n| n.is_running()).collect();
            for n in &running {
                if !cluster_info(n).is_some_and(|i| i.contains("cluster_state:ok")) {
                    last = format!("port {}: cluster_state not ok", n.port());
                    return None;
                }
            }
            let first = slot_owners(running[0]);
            for n in &running {
                let owners = slot_owners(n);
                if owners.is_none() || owners != first {
                    last = format!("port {}: slot owners {owners:?} vs {first:?}", n.port());
                    return None;
                }
            }
            for n in &running {
                let up = try_info(n, "replication").is_some_and(|i| {
                    i.contains("role:master") || i.contains("master_link_status:up")
                });
                if !up {
                    last = format!("port {}: replica link not up", n.port());
                    return None;
                }
            }
            Some(())
        });
        if healthy.is_none() {
            let logs: String = self.nodes.iter().map(|n| n.log_tail(15)).collect();
            panic!("the cluster was not healthy within {timeout:?}: {last}\n{logs}");
        }
    }

    /// Makes node `i` announce `ports[i]` (`cluster-announce-port`: a fault proxy in front of
    /// it), and waits until every node names only those ports as slot owners: clients then reach
    /// the nodes, and a replica that (re)connects its master, through them; the cluster bus stays
    /// direct. A restarted node forgets it: see [`reannounce`](Self::reannounce).
    pub fn announce(&mut self, ports: Vec<u16>) {
        assert_eq!(ports.len(), self.nodes.len(), "one announced port per node");
        self.announced = ports;
        for i in 0..self.nodes.len() {
            self.reannounce(i);
        }
        let announced = &self.announced;
        let done = poll_until(READY_TIMEOUT, Duration::from_millis(50), || {
            self.nodes
                .iter()
                .filter(|n| n.is_running())
                .all(|n| {
                    slot_owners(n).is_some_and(|o| o.values().all(|(_, p)| announced.contains(p)))
                })
                .then_some(())
        });
        assert!(
            done.is_some(),
            "the nodes did not name the announced ports {announced:?} within {READY_TIMEOUT:?}"
        );
        self.wait_ok(READY_TIMEOUT);
    }

    /// Makes node `i` announce its port of [`announce`](Self::announce) again (after a restart;
    /// nothing without announced ports).
    pub fn reannounce(&self, i: usize) {
        if let Some(port) = self.announced.get(i) {
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-port")
                .arg(port)
                .query(&mut self.nodes[i].admin())
                .unwrap();
        }
    }

    /// The slot Redis Cluster hashes `key` to.
    pub fn slot_of(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.any().admin())
            .unwrap()
    }

    /// The node serving `slot` as master, per a running node's `CLUSTER SLOTS`.
    pub fn master_of_slot(&self, slot: u16) -> &RedisServer {
        let owners = slot_owners(self.any()).expect("CLUSTER SLOTS");
        let port = owners
            .range(..=slot)
            .next_back()
            .filter(|(_, (end, _))| *end >= slot)
            .map(|(_, (_, port))| *port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        self.by_port(port)
    }

    /// The master of the slot of the Redis key `key`.
    pub fn master_of(&self, key: &str) -> &RedisServer {
        self.master_of_slot(self.slot_of(key))
    }

    /// The running nodes whose role is master.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .filter(|n| try_info(n, "replication").is_some_and(|i| i.contains("role:master")))
            .collect()
    }

    /// The running replica of `master` (linked to its port or to the one it announces).
    pub fn replica_of(&self, master: &RedisServer) -> &RedisServer {
        let index = self.index_of(master.port());
        let ports = [Some(master.port()), self.announced.get(index).copied()];
        let needles: Vec<String> = ports
            .iter()
            .flatten()
            .map(|p| format!("master_port:{p}"))
            .collect();
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .find(|n| {
                try_info(n, "replication")
                    .is_some_and(|i| needles.iter().any(|needle| i.contains(needle.as_str())))
            })
            .unwrap_or_else(|| panic!("no replica of the master on port {}", master.port()))
    }

    /// Index in [`nodes`](Self::nodes) of the node on `port`, or announcing it.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .or_else(|| self.announced.iter().position(|&p| p == port))
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// Moves `slot` and its keys to the master `to` by hand, the way `redis-cli --cluster
    /// reshard` does: `SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE` in batches (clients get `ASK`
    /// meanwhile), then `SETSLOT NODE` on every master. Returns how many keys moved.
    pub fn move_slot(&self, slot: u16, to: &RedisServer) -> usize {
        let from = self.master_of_slot(slot);
        assert_ne!(from.port(), to.port(), "slot {slot} is already there");
        let id = |n: &RedisServer| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut n.admin())
                .unwrap()
        };
        let (from_id, to_id) = (id(from), id(to));
        let setslot = |n: &RedisServer, state: &str, node: &str| {
            let () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(node)
                .query(&mut n.admin())
                .unwrap_or_else(|e| panic!("SETSLOT {slot} {state} on {}: {e}", n.port()));
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
        let mut moved = 0;
        // Bounded: at most this many batches of 100 keys.
        for _ in 0..10_000 {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut from.admin())
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to.port())
                .arg("")
                .arg(0)
                .arg(2000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut from.admin())
                .unwrap_or_else(|e| panic!("MIGRATE {keys:?}: {e}"));
            moved += keys.len();
        }
        setslot(to, "NODE", &to_id);
        setslot(from, "NODE", &to_id);
        for master in self.masters() {
            if master.port() != from.port() && master.port() != to.port() {
                setslot(master, "NODE", &to_id);
            }
        }
        moved
    }

    fn any(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node")
    }

    fn by_port(&self, port: u16) -> &RedisServer {
        &self.nodes[self.index_of(port)]
    }
}

impl RedisStore for &'static RedisCluster {
    fn fails_over(&self) -> bool {
        true
    }

    fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .masters()
            .into_iter()
            .flat_map(|m| m.keys(pattern))
            .collect();
        keys.sort();
        keys
    }

    fn subscribers(&self, channel: &str) -> i64 {
        self.masters()
            .into_iter()
            .map(|m| m.shard_subscribers(channel))
            .sum()
    }

    fn command_calls(&self, command: &str) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.command_calls(command))
            .sum()
    }
}

/// A connection to `node` with 500ms timeouts, or `None` when it does not answer.
fn connect(node: &RedisServer) -> Option<redis::Connection> {
    let con = node
        .client()
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    Some(con)
}

/// `INFO section`, or `None` when the node does not answer.
fn try_info(node: &RedisServer, section: &str) -> Option<String> {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut connect(node)?)
        .ok()
}

/// `CLUSTER INFO`, or `None` when the node does not answer.
fn cluster_info(node: &RedisServer) -> Option<String> {
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut connect(node)?)
        .ok()
}

/// `CLUSTER SLOTS` of `node`: first slot -> (last slot, master port).
fn slot_owners(node: &RedisServer) -> Option<BTreeMap<u16, (u16, u16)>> {
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut connect(node)?)
        .ok()?;
    let mut owners = BTreeMap::new();
    for range in slots {
        let redis::Value::Array(parts) = range else {
            return None;
        };
        let (start, end): (u16, u16) = (
            redis::from_redis_value_ref(parts.first()?).ok()?,
            redis::from_redis_value_ref(parts.get(1)?).ok()?,
        );
        let redis::Value::Array(master) = parts.get(2)? else {
            return None;
        };
        let port: u16 = redis::from_redis_value_ref(master.get(1)?).ok()?;
        owners.insert(start, (end, port));
    }
    let covered: u32 = owners
        .iter()
        .map(|(s, (e, _))| u32::from(*e) - u32::from(*s) + 1)
        .sum();
    (covered == 16384).then_some(owners)
}
