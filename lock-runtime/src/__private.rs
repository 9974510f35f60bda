//! What `#[distributed_lock]` expands to. Not public API: no stability guarantees.
//!
//! Only what the expansion names (see `lock-macros/src/expand.rs`): `Call`, `acquire`,
//! `acquire_blocking`, `until_lost`, `run_blocking`, `finish`, `finish_blocking`, `lock_error`,
//! `KeyPart`, `Mode` and `Duration`; and `LockResult`, the bound of the calls that take the body's
//! result. Tools read the servers through [`crate::layout`].

pub use core::time::Duration;
/// The lock's kind, as the attribute's `fair`, `shared` and `permits` make it.
pub use lock_rules::Mode;

use crate::hold::{self, Body};
use crate::{Lock, LockError, LockGuard};

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

/// What one locked call asks for.
#[derive(Debug)]
pub struct Call {
    /// Rendered keys: one for `key`, several for `keys` (the runtime sorts and dedupes them).
    pub keys: Vec<String>,
    pub ttl: Option<Duration>,
    pub wait: Option<Duration>,
    pub max_hold: Option<Duration>,
    pub min_hold: Option<Duration>,
    pub reentrant: bool,
    pub mode: Mode,
    /// The key templates as written: the label of the lock's span and metrics.
    pub name: &'static str,
}

fn lock(call: Call) -> Lock {
    let mut lock = Lock::many(call.keys)
        .reentrant(call.reentrant)
        .with_mode(call.mode)
        .name(call.name);
    if let Some(ttl) = call.ttl {
        lock = lock.ttl(ttl);
    }
    if let Some(wait) = call.wait {
        lock = lock.wait(wait);
    }
    if let Some(max_hold) = call.max_hold {
        lock = lock.max_hold(max_hold);
    }
    if let Some(min_hold) = call.min_hold {
        lock = lock.min_hold(min_hold);
    }
    lock
}

pub async fn acquire(call: Call) -> Result<LockGuard, LockError> {
    lock(call).acquire().await
}

pub fn acquire_blocking(call: Call) -> Result<LockGuard, LockError> {
    lock(call).acquire_blocking()
}

pub fn lock_error<R: LockResult>(err: LockError) -> R {
    R::from_lock_error(err)
}

/// Runs an async body inside the lock's reentrancy scope until it completes, or until the lock
/// is lost or `max_hold` passes: then the body is dropped at its current `.await` and `None` is
/// returned.
pub async fn until_lost<F: Future>(guard: &LockGuard, body: F) -> Option<F::Output> {
    guard.until_stopped(body).await
}

/// Runs a sync body inside the lock's reentrancy scope (of this thread).
pub fn run_blocking<R>(guard: &LockGuard, body: impl FnOnce() -> R) -> R {
    guard.in_scope_blocking(body)
}

/// Releases the guard after an async body and returns the call's result: the body's, or the
/// error that replaces it (see `hold::verdict`).
pub async fn finish<R: LockResult>(guard: LockGuard, out: Option<R>) -> R {
    let verdict = guard.finish(Body::of(out.as_ref(), R::is_success)).await;
    hold::call_result(verdict, out, R::from_lock_error)
}

/// [`finish`] for sync bodies: a lock lost (or held past `max_hold`) while the body ran turns its
/// success into the error.
pub fn finish_blocking<R: LockResult>(guard: LockGuard, out: R) -> R {
    let verdict = guard.finish_blocking(Body::of(Some(&out), R::is_success));
    hold::call_result(verdict, Some(out), R::from_lock_error)
}
