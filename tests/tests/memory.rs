//! The behaviour suite on the in-memory backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;

// Hosted on the test's runtime: see `Fx::new`.
behaviour_tests!(behaviour::Fx::new(
    LockConfig::in_memory().runtime(tokio::runtime::Handle::current()),
    Vec::new()
));

kind_tests!(behaviour::Fx::new(
    LockConfig::in_memory().runtime(tokio::runtime::Handle::current()),
    Vec::new()
));
