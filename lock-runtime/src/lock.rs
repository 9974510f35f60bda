use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::bridge;
use crate::engine::Engine;
use crate::error::LockError;
use crate::global;
use crate::guard::LockGuard;

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
    engine: Option<Arc<Engine>>,
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
            engine: None,
            key: key.into(),
            ttl: None,
            wait: None,
        }
    }

    pub(crate) fn on(engine: Arc<Engine>, key: String) -> Self {
        Lock {
            engine: Some(engine),
            ..Lock::new(key)
        }
    }

    /// Time to live (default from the config, 30s). Renewed automatically while the guard lives;
    /// it bounds how long a crashed holder keeps others out.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait while someone else holds it (default from the config, 0: one attempt;
    /// `Duration::MAX`: as long as it takes).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    fn engine(&self) -> Result<Arc<Engine>, LockError> {
        match &self.engine {
            Some(engine) => Ok(Arc::clone(engine)),
            None => global::engine().map(Arc::clone),
        }
    }

    /// Acquires the lock, waiting up to `wait`. Works from any async runtime (the work runs on the
    /// runtime that hosts the client). Dropping the future stops waiting and releases anything
    /// granted meanwhile.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let engine = self.engine()?;
        let req = engine.request(self.key, self.ttl, self.wait)?;
        let runtime = engine.runtime.clone();
        bridge::run(&runtime, move |gone| async move {
            let hold = engine.acquire(req, gone).await?;
            Ok(LockGuard::new(engine, hold))
        })
        .await?
    }

    /// Acquires the lock from sync code, blocking this thread up to `wait` plus one request
    /// timeout. Safe inside an async runtime too (it blocks that thread, it never panics); on a
    /// current-thread runtime that must also run the holder, it would wait for the full `wait`.
    pub fn acquire_blocking(self) -> Result<LockGuard, LockError> {
        let engine = self.engine()?;
        let req = engine.request(self.key, self.ttl, self.wait)?;
        let runtime = engine.runtime.clone();
        bridge::run_blocking(&runtime, async move {
            let hold = engine
                .acquire(req, tokio_util::sync::CancellationToken::new())
                .await?;
            Ok(LockGuard::new(engine, hold))
        })?
    }
}
