//! The behaviour suite on the in-memory backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

behaviour_tests!(behaviour::Fx::memory());
