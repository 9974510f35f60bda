//! The process-wide client behind [`init`], the attribute and [`Lock::new`](crate::Lock::new).

use std::sync::{Arc, OnceLock};

use crate::bridge;
use crate::config::LockConfig;
use crate::engine::Engine;
use crate::error::LockError;
use crate::info::LockInfo;

static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();

/// Sets up the process-wide lock client used by `#[distributed_lock]` and
/// [`Lock::new`](crate::Lock::new).
///
/// Call it once at startup, from sync or async code. It validates `config`
/// (`LockError::Config` names the wrong field) but does not connect: connections are made on first
/// use, so a service can start while Redis is still coming up. A failed `init` leaves the process
/// uninitialised, so a later valid call works; a second successful call is
/// [`LockError::AlreadyInitialized`].
pub fn init(config: LockConfig) -> Result<(), LockError> {
    if ENGINE.get().is_some() {
        return Err(LockError::AlreadyInitialized);
    }
    let engine = Engine::new(config)?;
    ENGINE
        .set(engine)
        .map_err(|_| LockError::AlreadyInitialized)
}

/// Releases every lock the process-wide client still holds and waits (at most one request
/// timeout: connect plus response timeout) for releases still running, including those started
/// by dropped guards. Call it at the end of `main`, after the work that takes locks: a release
/// started just before the process exits is otherwise lost, and the lock stays taken until its
/// TTL runs out. Locks still held by running code are released, so that code sees them lost;
/// acquisitions still waiting stop (they answer [`LockError::Runtime`]) and leave their places
/// in line, which the next release would otherwise hand the lock to after the process exited;
/// lock calls made afterwards fail with [`LockError::Runtime`]. Does nothing before [`init`].
/// Blocks the calling thread.
pub fn shutdown() {
    if let Some(engine) = ENGINE.get() {
        let _ = bridge::run_blocking(&engine.runtime.clone(), Arc::clone(engine).shutdown());
    }
}

/// What the servers say of the lock `key` (as passed to [`Lock::new`](crate::Lock::new)):
/// `None` when nobody holds it (Redlock: fewer than a majority of nodes; [`LockInfo::nodes`] of
/// a held lock shows each node). For operators and dashboards: the answer can be stale by the
/// time it arrives.
pub async fn inspect(key: &str) -> Result<Option<LockInfo>, LockError> {
    let engine = Arc::clone(engine()?);
    let key = key.to_owned();
    bridge::run_untold(&engine.runtime.clone(), move || async move {
        engine.inspect(&key).await
    })
    .await?
}

/// Deletes the lock `key` whoever holds it, and wakes its waiters: for an operator freeing a
/// lock whose holder is gone. The holder, if alive, learns at its next renewal that the lock is
/// lost. Logged at `warn` with the calling program and process id. `Ok(true)` when it was held
/// (under Redlock: by any node, also a minority left over by a crashed holder).
pub async fn force_release(key: &str) -> Result<bool, LockError> {
    let engine = Arc::clone(engine()?);
    let key = key.to_owned();
    bridge::run_untold(&engine.runtime.clone(), move || async move {
        engine.force_release(&key).await
    })
    .await?
}

pub(crate) fn engine() -> Result<&'static Arc<Engine>, LockError> {
    ENGINE.get().ok_or(LockError::NotInitialized)
}
