//! What `#[distributed_lock]` expands to. Not public API: no stability guarantees.

pub use crate::{LockError, LockGuard};
pub use core::time::Duration;

/// The Redis keys of a lock (lock, fence counter, release channel), for tests and tools.
pub use crate::backend::redis_keys;

use crate::Lock;
use crate::hold::{Verdict, verdict};

/// The return type of a `#[distributed_lock]` function.
#[diagnostic::on_unimplemented(
    message = "a `#[distributed_lock]` function must return `Result<T, E>` where `E: From<LockError>`, found `{Self}`",
    label = "this return type cannot carry a `LockError`",
    note = "return `Result<T, lock_runtime::LockError>`, or implement `From<lock_runtime::LockError>` for your error type"
)]
pub trait LockResult: Sized {
    /// The error value for a lock failure.
    fn from_lock_error(err: LockError) -> Self;
    /// Whether this is a success (which a lost lock must not let through).
    fn is_success(&self) -> bool;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(err: LockError) -> Self {
        Err(E::from(err))
    }

    fn is_success(&self) -> bool {
        self.is_ok()
    }
}

/// A part of a lock key template.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of a lock key: it does not implement `Display`",
    label = "used in the `key` template of `#[distributed_lock]`",
    note = "interpolate a field that implements `Display`, or implement `Display` for `{Self}`"
)]
pub trait KeyPart: core::fmt::Display {}

impl<T: core::fmt::Display + ?Sized> KeyPart for T {}

fn lock(key: String, ttl: Option<Duration>, wait: Option<Duration>) -> Lock {
    let mut lock = Lock::new(key);
    if let Some(ttl) = ttl {
        lock = lock.ttl(ttl);
    }
    if let Some(wait) = wait {
        lock = lock.wait(wait);
    }
    lock
}

pub async fn acquire(
    key: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
) -> Result<LockGuard, LockError> {
    lock(key, ttl, wait).acquire().await
}

pub fn acquire_blocking(
    key: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
) -> Result<LockGuard, LockError> {
    lock(key, ttl, wait).acquire_blocking()
}

pub fn lock_error<R: LockResult>(err: LockError) -> R {
    R::from_lock_error(err)
}

/// Runs `body` until it completes or the lock is lost; on loss the body is dropped at its
/// current `.await` and `None` is returned.
pub async fn until_lost<F: Future>(guard: &LockGuard, body: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = body => Some(out),
        () = guard.lost() => None,
    }
}

/// Releases the guard after an async body and returns the call's result (see `hold::verdict`).
pub async fn finish<R: LockResult>(guard: LockGuard, out: Option<R>) -> R {
    let key = guard.key().to_owned();
    let released = guard.release().await;
    settle(key, out, released)
}

/// [`finish`] for sync bodies: a lock lost while the body ran turns its success into `Err(Lost)`.
pub fn finish_blocking<R: LockResult>(guard: LockGuard, out: R) -> R {
    let key = guard.key().to_owned();
    let released = guard.release_blocking();
    settle(key, Some(out), released)
}

fn settle<R: LockResult>(key: String, out: Option<R>, released: Result<(), LockError>) -> R {
    match (
        verdict(&key, out.as_ref().map(R::is_success), &released),
        out,
    ) {
        (Verdict::Body, Some(out)) => out,
        (_, _) => R::from_lock_error(match released {
            Err(lost @ LockError::Lost { .. }) => lost,
            _ => LockError::Lost { key },
        }),
    }
}
