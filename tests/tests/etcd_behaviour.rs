//! The behaviour suite on etcd: one member shared by the tests of this binary (distinct keys),
//! each fixture talking to it through a proxy of its own.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;
use lock_tests::EtcdCluster;

fn fixture() -> behaviour::Fx {
    behaviour::Fx::etcd(EtcdCluster::shared(1), |proxy| {
        LockConfig::etcd([proxy.http_url()])
    })
}

behaviour_tests!(fixture());
