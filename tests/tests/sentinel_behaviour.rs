//! The behaviour suite on a Sentinel set (master, replica, 3 sentinels; one set for this binary).

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;
use lock_tests::SentinelSet;

fn fixture() -> behaviour::Fx {
    let set = SentinelSet::shared();
    behaviour::Fx::on(
        LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls()),
        vec![Box::new(set)],
    )
}

behaviour_tests!(fixture());
