//! The behaviour suite and the lock kinds' checks on etcd: on one member, and on a cluster of three (writes committed by a
//! majority, the client on one member that may be a follower). Each cluster is shared by the
//! tests of this binary (distinct keys); each fixture talks to member 0 through a proxy of its own.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;
use lock_tests::EtcdCluster;

fn fixture(members: usize) -> behaviour::Fx {
    behaviour::Fx::etcd(EtcdCluster::shared(members), |proxy| {
        LockConfig::etcd([proxy.http_url()])
    })
}

behaviour_tests!(fixture(1));
kind_tests!(fixture(1));

mod three_members {
    use super::{behaviour, fixture};
    use crate::{behaviour_tests, kind_tests};

    behaviour_tests!(fixture(3));
    kind_tests!(fixture(3));
}
