use std::fmt;
use std::time::Duration;

use crate::{LockClient, LockError, LockGuard, global};

/// A lock to acquire: the programmatic form of `#[distributed_lock]`.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::Lock;
///
/// let guard = Lock::new("report:2026-11-29")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// // ... critical section; `guard.fencing_token()` for the resource ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a Lock does nothing until acquired"]
pub struct Lock {
    client: Option<LockClient>,
    key: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// A lock on `key` through the global client set up by [`init`](crate::init).
    pub fn new(key: impl Into<String>) -> Self {
        Lock {
            client: None,
            key: key.into(),
            ttl: None,
            wait: None,
        }
    }

    pub(crate) fn with_client(client: LockClient, key: String) -> Self {
        Lock {
            client: Some(client),
            key,
            ttl: None,
            wait: None,
        }
    }

    /// Time to live (default from the config, 30s). Renewed automatically while the guard lives;
    /// it bounds how long a crashed holder keeps others out.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait while someone else holds it (default from the config, 0: one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Acquires the lock, waiting up to `wait`. Works from any async runtime (the work runs on the
    /// library's own). Dropping the future stops waiting and releases anything granted meanwhile.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let client = match self.client {
            Some(client) => client,
            None => global::client()?.clone(),
        };
        client.acquire(self.key, self.ttl, self.wait).await
    }

    /// Acquires the lock from sync code, blocking this thread up to `wait` plus the request
    /// timeouts. Safe inside an async runtime too (it blocks that thread, it never panics).
    pub fn acquire_blocking(self) -> Result<LockGuard, LockError> {
        let client = match self.client {
            Some(client) => client,
            None => global::client()?.clone(),
        };
        client.acquire_blocking(self.key, self.ttl, self.wait)
    }
}
