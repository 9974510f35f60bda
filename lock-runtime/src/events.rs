//! What happened to an acquisition, as tracing events and (feature `metrics`) metrics.
//! `acquire/` and `hold.rs` decide the outcomes; this file only reports them. Lock tokens and
//! passwords never appear here.
//!
//! Levels: `warn` for what needs a person (a lock lost while held, `max_hold` passed, a forced
//! release, a release that failed), `debug` for the normal life of a lock, so `info` stays quiet
//! in normal operation. Each acquisition runs in a `distributed_lock` span (see [`span`]).
//!
//! Metrics carry the labels `lock` (the key template or [`Lock::name`](crate::Lock::name), never
//! the rendered key, so their number stays bounded) and `backend`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::BackendKind;
use crate::error::{LockError, NodeFailure};

/// The labels of one lock's events and metrics.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    /// The key template (attribute) or the name set with `Lock::name`; `unnamed` otherwise.
    pub(crate) lock: Arc<str>,
    pub(crate) backend: BackendKind,
}

/// The span one acquisition (acquire, body, release) runs in.
pub(crate) fn span(labels: &Labels, keys: &[Arc<str>]) -> tracing::Span {
    tracing::info_span!(
        "distributed_lock",
        lock = %labels.lock,
        key = %Keys(keys),
        backend = labels.backend.label(),
    )
}

pub(crate) fn acquired(labels: &Labels, waited: Duration, attempts: u32, fences: &[u64]) {
    tracing::debug!(?waited, attempts, fencing_tokens = ?fences, "lock acquired");
    #[cfg(feature = "metrics")]
    {
        count(labels, "acquired");
        metrics::histogram!("lock_wait_seconds", "lock" => labels.lock.to_string(), "backend" => labels.backend.label())
            .record(waited.as_secs_f64());
        metrics::gauge!("locks_held", "lock" => labels.lock.to_string(), "backend" => labels.backend.label())
            .increment(1.0);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}

pub(crate) fn not_acquired(labels: &Labels, err: &LockError, attempts: u32) {
    let outcome = match err {
        LockError::Contended { key, waited } => {
            tracing::debug!(key = %key, ?waited, attempts, "lock contended");
            "contended"
        }
        LockError::Unavailable { key, causes } => {
            tracing::debug!(key = %key, attempts, causes = %Causes(causes), "lock servers unavailable");
            "unavailable"
        }
        other => {
            tracing::debug!(err = %other, "lock not acquired");
            "error"
        }
    };
    #[cfg(feature = "metrics")]
    count(labels, outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, outcome);
}

#[cfg(feature = "metrics")]
fn count(labels: &Labels, outcome: &'static str) {
    metrics::counter!(
        "lock_acquire_total",
        "lock" => labels.lock.to_string(),
        "backend" => labels.backend.label(),
        "outcome" => outcome
    )
    .increment(1);
}

pub(crate) fn renewed(labels: &Labels, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lock_renewal_lag_seconds", "lock" => labels.lock.to_string(), "backend" => labels.backend.label())
        .record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, took);
}

pub(crate) fn renewal_failed(name: &str, cause: &NodeFailure) {
    tracing::debug!(key = name, %cause, "renewal failed; retrying before the validity deadline");
}

pub(crate) fn lost(labels: &Labels, name: &str, why: &str) {
    tracing::warn!(key = name, why, "lock lost while held");
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_lost_total", "lock" => labels.lock.to_string(), "backend" => labels.backend.label())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}

pub(crate) fn max_hold(name: &str, max_hold: Duration) {
    tracing::warn!(
        key = name,
        ?max_hold,
        "lock held for its max_hold: renewal stopped, body told to stop"
    );
}

/// A hold ended (released, or given up after a loss): once per hold. `acquired_at`: the clock
/// is read only with metrics on.
pub(crate) fn ended(labels: &Labels, acquired_at: Instant) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!("lock_hold_seconds", "lock" => labels.lock.to_string(), "backend" => labels.backend.label())
            .record(acquired_at.elapsed().as_secs_f64());
        metrics::gauge!("locks_held", "lock" => labels.lock.to_string(), "backend" => labels.backend.label())
            .decrement(1.0);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, acquired_at);
}

pub(crate) fn forced_release(name: &str, outcome: &Result<bool, LockError>) {
    let by = std::env::args().next().unwrap_or_default();
    let pid = std::process::id();
    match outcome {
        Ok(held) => tracing::warn!(key = name, held, by, pid, "lock force-released"),
        Err(err) => tracing::warn!(key = name, %err, by, pid, "forced release failed"),
    }
}

/// `acquired_at`: the clock is read only when the event is recorded.
pub(crate) fn released(acquired_at: Instant) {
    tracing::debug!(held_for = ?acquired_at.elapsed(), "lock released");
}

/// A release before `min_hold` passed: the keys stay for `left`, then expire.
pub(crate) fn kept(left: Duration) {
    tracing::debug!(
        ?left,
        "lock let go before its min_hold: kept until it passes"
    );
}

pub(crate) fn release_failed(name: &str, err: &LockError) {
    tracing::warn!(key = name, %err, "release failed");
}

pub(crate) fn release_retried(name: &str) {
    tracing::debug!(
        key = name,
        "no server answered the release: retried in the background until one does"
    );
}

pub(crate) fn cleanup_failed(name: &str, causes: &[NodeFailure]) {
    tracing::debug!(key = name, causes = %Causes(causes), "cleanup release failed; the key expires by its ttl");
}

struct Keys<'a>(&'a [Arc<str>]);

impl std::fmt::Display for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, key) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(key)?;
        }
        Ok(())
    }
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
