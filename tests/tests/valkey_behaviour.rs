//! The behaviour suite and the lock kinds' checks on Valkey (`valkey-server`, which
//! `scripts/test.sh` fetches, or `LOCK_TESTS_VALKEY_SERVER`): one node, Redlock over three
//! masters, a Cluster (3 masters, 3 replicas) and a Sentinel set, as on Redis in
//! `single_node.rs`, `redlock_behaviour.rs`, `cluster_behaviour.rs` and `sentinel_behaviour.rs`.
//! With no `valkey-server` and `LOCK_TESTS_VALKEY_FETCH=no`, every test returns having run
//! nothing, and the binary says so on stderr; with neither, they fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;
use lock_tests::{RedisCluster, RedisMasters, RedisServer, SentinelSet, ServerOptions};

/// `$fixture`, or a return from the test when the Valkey tests are skipped.
macro_rules! on_valkey {
    ($fixture:expr) => {{
        if lock_tests::valkey_server().is_none() {
            return;
        }
        $fixture
    }};
}

fn valkey() -> ServerOptions {
    ServerOptions {
        binary: lock_tests::valkey_server(),
        ..ServerOptions::default()
    }
}

/// Every server these tests start is Valkey, not the `redis-server` the other tests run.
#[test]
fn the_servers_are_valkey() {
    on_valkey!(());
    let server = RedisServer::start_with(valkey());
    let info = server.info("server");
    assert!(
        info.lines().any(|l| l.trim() == "server_name:valkey"),
        "LOCK_TESTS_VALKEY_SERVER is not a valkey-server:\n{info}"
    );
    let version = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("valkey_version:"))
        .unwrap_or("unknown");
    eprintln!("valkey-server {version}");
    for node in [
        RedisCluster::shared_valkey().master_of("valkey"),
        SentinelSet::shared_valkey().master(),
    ] {
        assert!(node.info("server").contains("server_name:valkey"));
    }
}

mod single_node {
    use super::*;
    use crate::{behaviour_tests, kind_tests};

    fn fixture() -> behaviour::Fx {
        let server = RedisServer::start_with(valkey());
        behaviour::Fx::new(LockConfig::single(server.url()), vec![server])
    }

    behaviour_tests!(on_valkey!(fixture()));
    kind_tests!(on_valkey!(fixture()));
}

mod redlock {
    use super::*;
    use crate::{behaviour_tests, kind_tests};

    fn fixture() -> behaviour::Fx {
        let masters = RedisMasters::start_with(3, &valkey());
        behaviour::Fx::new(LockConfig::redlock(masters.urls()), masters.nodes)
    }

    behaviour_tests!(on_valkey!(fixture()));
    kind_tests!(on_valkey!(fixture()), redlock);
}

mod cluster {
    use super::*;
    use crate::{behaviour_tests, kind_tests};

    fn fixture() -> behaviour::Fx {
        let cluster = RedisCluster::shared_valkey();
        behaviour::Fx::on(LockConfig::cluster(cluster.urls()), vec![Box::new(cluster)])
    }

    behaviour_tests!(on_valkey!(fixture()));
    kind_tests!(on_valkey!(fixture()));
}

mod sentinel {
    use super::*;
    use crate::{behaviour_tests, kind_tests};

    fn fixture() -> behaviour::Fx {
        let set = SentinelSet::shared_valkey();
        behaviour::Fx::on(
            LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls()),
            vec![Box::new(set)],
        )
    }

    behaviour_tests!(on_valkey!(fixture()));
    kind_tests!(on_valkey!(fixture()));
}
