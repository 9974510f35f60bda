//! The behaviour suite on Redlock: five independent masters.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;
use lock_tests::RedisMasters;

fn fixture() -> behaviour::Fx {
    let masters = RedisMasters::start(5);
    behaviour::Fx::new(LockConfig::redlock(masters.urls()), masters.nodes)
}

behaviour_tests!(fixture());
kind_tests!(fixture(), redlock);
