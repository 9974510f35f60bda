use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::client::{LockClient, LockKeys, Token, background_gone};
use crate::{LockError, global};

/// One acquisition, shared by its guard and the renewal driver.
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) fence: Option<u64>,
    /// Cancelled when the lock is declared lost.
    pub(crate) lost: CancellationToken,
    /// Set when the guard releases: renewal stops.
    pub(crate) released: AtomicBool,
}

impl Held {
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        token: Token,
        ttl: Duration,
        fence: Option<u64>,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Held {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            keys,
            token,
            ttl,
            fence,
            lost: CancellationToken::new(),
            released: AtomicBool::new(false),
        }
    }
}

/// Proof that this process holds a lock. The lock is renewed in the background while the guard
/// lives, and released by [`release`](Self::release), [`release_blocking`](Self::release_blocking),
/// or (as a fallback, without reporting the outcome) when the guard is dropped.
///
/// Dropping never blocks: the release is sent from the library's own runtime.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    client: LockClient,
    held: Arc<Held>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.held.keys.name)
            .field("fencing_token", &self.held.fence)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(client: LockClient, held: Arc<Held>) -> Self {
        LockGuard {
            client,
            held,
            released: false,
        }
    }

    /// The key, as passed to [`Lock::new`](crate::Lock::new) (without the configured prefix).
    pub fn key(&self) -> &str {
        &self.held.keys.name
    }

    /// A number that grows with every grant of this key, so a resource can reject writes from a
    /// holder that has been superseded. `None` when fencing is off: by default in Redlock mode, or
    /// when turned off with [`LockConfig::fencing`](crate::LockConfig::fencing).
    ///
    /// A key's counter starts from the server clock in microseconds, so tokens keep growing across
    /// a Redis restart that lost the counter, as long as that clock does not go back.
    pub fn fencing_token(&self) -> Option<u64> {
        self.held.fence
    }

    /// True once the lock has been lost: renewal was refused, or could not be confirmed before the
    /// lock's validity ran out. A lost lock stays lost.
    pub fn is_lost(&self) -> bool {
        self.held.lost.is_cancelled()
    }

    /// Resolves when the lock is lost (never, if it is released first while still held).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.held.lost.cancelled()
    }

    /// Releases the lock. `Err(Lost)` when it was no longer ours (lost before or found taken at
    /// release), `Err(Unavailable)` when Redis could not be reached (the lock then expires by its TTL).
    pub async fn release(mut self) -> Result<(), LockError> {
        let release = self.start_release();
        let runtime = &self.client.inner.runtime;
        if global::on(runtime) {
            return global::InPlace::new(release, runtime.clone(), None).await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.client.inner.runtime.spawn(async move {
            let _ = tx.send(release.await);
        });
        rx.await.unwrap_or_else(|_| Err(background_gone()))
    }

    /// Releases the lock from sync code (blocks this thread, also inside an async runtime).
    pub fn release_blocking(mut self) -> Result<(), LockError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let release = self.start_release();
        self.client.inner.runtime.spawn(async move {
            let _ = tx.send(release.await);
        });
        global::wait_for(&self.client.inner.runtime, rx).unwrap_or_else(|| Err(background_gone()))
    }

    /// Stops renewal and returns the release to run on the library's runtime.
    fn start_release(&mut self) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        self.released = true;
        // Read before unregistering: a renewal refused because of this very release must not
        // count as a loss.
        let was_lost = self.is_lost();
        self.held.released.store(true, Ordering::Release);
        let backend = Arc::clone(&self.client.inner.backend);
        let held = Arc::clone(&self.held);
        async move {
            let key = || held.keys.name.clone();
            match backend.release(&held.keys, &held.token).await {
                Ok(true) if !was_lost => Ok(()),
                Ok(_) => {
                    held.lost.cancel();
                    Err(LockError::Lost { key: key() })
                }
                Err(causes) => Err(LockError::Unavailable { key: key(), causes }),
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Fallback for guards not released explicitly (early return, panic, cancelled future):
        // the release runs on the library's runtime, so Drop never blocks.
        let release = self.start_release();
        self.client.inner.runtime.spawn(async move {
            if let Err(err) = release.await {
                tracing::debug!(%err, "release on drop did not complete");
            }
        });
    }
}
