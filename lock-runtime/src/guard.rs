use std::fmt;
use std::sync::Arc;

use crate::bridge;
use crate::engine::Engine;
use crate::error::LockError;
use crate::hold::Hold;

/// Proof that this process holds a lock. The lock is renewed in the background while the guard
/// lives, and released by [`release`](Self::release), [`release_blocking`](Self::release_blocking),
/// or (as a fallback, without reporting the outcome) when the guard is dropped.
///
/// Dropping never blocks: the release is sent from the runtime that hosts the client, and
/// [`shutdown`](crate::shutdown) waits for it.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    engine: Arc<Engine>,
    hold: Arc<Hold>,
    /// Set once the release was started (by `release*`, or by the drop).
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.name)
            .field("fencing_token", &self.hold.fence)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(engine: Arc<Engine>, hold: Arc<Hold>) -> Self {
        LockGuard {
            engine,
            hold,
            released: false,
        }
    }

    /// The key, as passed to [`Lock::new`](crate::Lock::new) (without the configured prefix).
    pub fn key(&self) -> &str {
        &self.hold.name
    }

    /// A number that grows with every grant of this key, so a resource can reject writes from a
    /// holder that has been superseded. `None` when fencing is off: by default in Redlock mode, or
    /// when turned off with [`LockConfig::fencing`](crate::LockConfig::fencing).
    ///
    /// A key's counter starts from the server clock in microseconds, so tokens keep growing across
    /// a Redis restart that lost the counter, as long as that clock does not go back.
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.fence
    }

    /// True once the lock has been lost: renewal was refused, or its validity ran out before a
    /// renewal was confirmed (checked now, on the monotonic clock). A lost lock stays lost.
    pub fn is_lost(&self) -> bool {
        self.hold.check_lost()
    }

    /// Resolves when the lock is declared lost (never, if it is released first while still held).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.hold.lost()
    }

    /// Releases the lock. `Err(Lost)` when it was no longer ours (lost before, or found taken at
    /// release); `Err(Unavailable)` when the servers could not be reached while the lock was still
    /// valid (it then expires by its TTL).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        let (engine, hold) = (Arc::clone(&self.engine), Arc::clone(&self.hold));
        bridge::run(&self.engine.runtime, move |_| async move {
            engine.release(&hold).await
        })
        .await?
    }

    /// Releases the lock from sync code (blocks this thread, also inside an async runtime).
    pub fn release_blocking(mut self) -> Result<(), LockError> {
        self.released = true;
        let (engine, hold) = (Arc::clone(&self.engine), Arc::clone(&self.hold));
        bridge::run_blocking(
            &self.engine.runtime,
            async move { engine.release(&hold).await },
        )?
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            // Early return, panic, cancelled future: the release runs on the hosting runtime.
            self.engine.release_in_background(&self.hold);
        }
    }
}
