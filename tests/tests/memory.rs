//! The behaviour suite on the in-memory backend.
mod behaviour;

behaviour_tests!(behaviour::Fx::memory());
