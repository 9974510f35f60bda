//! An `Instant` that threads share without a lock: nanoseconds since a process-wide origin in
//! an `AtomicU64`.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The process-wide origin of every [`AtomicInstant`].
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

fn to_nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*ORIGIN).as_nanos()).unwrap_or(u64::MAX)
}

/// An instant at or after the process-wide origin (earlier ones read as the origin).
#[derive(Debug, Default)]
pub(crate) struct AtomicInstant(AtomicU64);

impl AtomicInstant {
    pub(crate) fn new(at: Instant) -> Self {
        AtomicInstant(AtomicU64::new(to_nanos(at)))
    }

    pub(crate) fn load(&self) -> Instant {
        *ORIGIN + Duration::from_nanos(self.0.load(Ordering::Acquire))
    }

    /// Moves it to `at` if that is later.
    pub(crate) fn fetch_max(&self, at: Instant) {
        self.0.fetch_max(to_nanos(at), Ordering::AcqRel);
    }
}
