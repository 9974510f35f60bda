//! What `#[distributed_lock]` expands to. Not public API: no stability guarantees.
//!
//! Only what the expansion names (see `lock-macros/src/expand.rs`): `Call`, `acquire`,
//! `acquire_blocking`, `until_lost`, `run_blocking`, `finish`, `finish_blocking`,
//! `FromLockError` (public, re-exported here for the `crate = ".."` path), `KeyPart`, `Mode` and
//! `Duration`; and `CallResult`, the bound of the calls that take the body's result. Tools read
//! the servers through [`crate::layout`].

pub use core::time::Duration;
/// The lock's kind, as the attribute's `fair`, `shared` and `permits` make it.
pub use lock_rules::Mode;

use crate::hold::{self, Body};
use crate::{Lock, LockError, LockGuard};

pub use crate::error::FromLockError;

/// The return type of a `#[distributed_lock]` function: a `Result` (the error type is checked
/// apart, by [`FromLockError`] or the `map_err` function's type).
#[diagnostic::on_unimplemented(
    message = "a `#[distributed_lock]` function must return `Result<T, E>`, found `{Self}`",
    label = "this return type cannot carry a lock failure",
    note = "return `Result<T, E>` where `E: From<lock_runtime::LockError>` (or name a conversion with `map_err = path`)"
)]
pub trait CallResult {
    /// The error type.
    type Error;
    /// Whether this is a success (which a lost lock must not let through).
    fn is_success(&self) -> bool;
    /// The failure `err`.
    fn failed(err: Self::Error) -> Self;
}

impl<T, E> CallResult for Result<T, E> {
    type Error = E;

    fn is_success(&self) -> bool {
        self.is_ok()
    }

    fn failed(err: E) -> Self {
        Err(err)
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
    /// `fencing = ..`: `None` for the client's default.
    pub fencing: Option<bool>,
    pub mode: Mode,
    /// The key templates as written: the label of the lock's span and metrics.
    pub name: &'static str,
}

fn lock(call: Call) -> Lock {
    let mut lock = Lock::many(call.keys)
        .reentrant(call.reentrant)
        .with_mode(call.mode)
        .name(call.name);
    if let Some(fencing) = call.fencing {
        lock = lock.fencing(fencing);
    }
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

/// Runs an async body inside the lock's reentrancy scope until it completes, or until the lock
/// is lost or `max_hold` passes: then the body is dropped at its current `.await` and `None` is
/// returned.
pub fn until_lost<F: Future>(
    guard: &LockGuard,
    body: F,
) -> impl Future<Output = Option<F::Output>> {
    guard.until_stopped(body)
}

/// Runs a sync body inside the lock's reentrancy scope (of this thread).
pub fn run_blocking<R>(guard: &LockGuard, body: impl FnOnce() -> R) -> R {
    guard.in_scope_blocking(body)
}

/// Releases the guard after an async body (`None`: stopped) and returns the body's result, or
/// the error that replaces it (see `hold::verdict`), which the expansion converts.
pub async fn finish<R: CallResult>(guard: LockGuard, out: Option<R>) -> Result<R, LockError> {
    let verdict = guard.finish(Body::of(out.as_ref(), R::is_success)).await;
    hold::call_result(verdict, out)
}

/// [`finish`] for sync bodies: a lock lost (or held past `max_hold`) while the body ran turns its
/// success into the error.
pub fn finish_blocking<R: CallResult>(guard: LockGuard, out: R) -> Result<R, LockError> {
    let verdict = guard.finish_blocking(Body::of(Some(&out), R::is_success));
    hold::call_result(verdict, Some(out))
}
