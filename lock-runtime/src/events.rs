//! What happened to an acquisition, as tracing events. `hold.rs` and `acquire.rs` decide the
//! outcomes; this file only reports them. Lock tokens and passwords never appear here.
//!
//! Levels: `warn` for what needs a person (a lock lost while held, a release that failed after a
//! loss), `debug` for the normal life of a lock, so `info` stays quiet in normal operation.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{LockError, NodeFailure};

pub(crate) fn acquired(names: &[Arc<str>], waited: Duration, attempts: u32, fences: &[u64]) {
    tracing::debug!(keys = ?names, ?waited, attempts, fencing_tokens = ?fences, "lock acquired");
}

pub(crate) fn not_acquired(err: &LockError, attempts: u32) {
    match err {
        LockError::Contended { key, waited } => {
            tracing::debug!(key = %key, ?waited, attempts, "lock contended");
        }
        LockError::Unavailable { key, causes } => {
            tracing::debug!(key = %key, attempts, causes = %Causes(causes), "lock servers unavailable");
        }
        other => tracing::debug!(err = %other, "lock not acquired"),
    }
}

pub(crate) fn renewal_failed(name: &str, cause: &NodeFailure) {
    tracing::debug!(key = name, %cause, "renewal failed; retrying before the validity deadline");
}

pub(crate) fn lost(name: &str, why: &str) {
    tracing::warn!(key = name, why, "lock lost while held");
}

pub(crate) fn max_hold(name: &str, max_hold: Duration) {
    tracing::warn!(
        key = name,
        ?max_hold,
        "lock held for its max_hold: renewal stopped, body cancelled"
    );
}

pub(crate) fn forced_release(name: &str, outcome: &Result<bool, LockError>) {
    let by = std::env::args().next().unwrap_or_default();
    let pid = std::process::id();
    match outcome {
        Ok(held) => tracing::warn!(key = name, held, by, pid, "lock force-released"),
        Err(err) => tracing::warn!(key = name, %err, by, pid, "forced release failed"),
    }
}

pub(crate) fn released(name: &str, held_for: Duration) {
    tracing::debug!(key = name, ?held_for, "lock released");
}

pub(crate) fn release_failed(name: &str, err: &LockError) {
    tracing::warn!(key = name, %err, "release failed; the lock expires by its ttl");
}

pub(crate) fn cleanup_failed(name: &str, causes: &[NodeFailure]) {
    tracing::debug!(key = name, causes = %Causes(causes), "cleanup release failed; the key expires by its ttl");
}

struct Causes<'a>(&'a [NodeFailure]);

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, cause) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{cause}")?;
        }
        Ok(())
    }
}
