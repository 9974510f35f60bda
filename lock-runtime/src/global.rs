//! The process-wide client behind [`init`](crate::init), and the library's own runtime.

use std::sync::{LazyLock, OnceLock};

use tokio::runtime::{Handle, Runtime};

use crate::{LockClient, LockConfig, LockError};

static CLIENT: OnceLock<LockClient> = OnceLock::new();

/// Connections, renewal and releases live here, not on the caller's runtime, so locks keep working
/// across `#[tokio::test]` runtimes, from plain `main`, and from sync code inside async code.
static RUNTIME: LazyLock<Result<Runtime, String>> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lock-runtime")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
});

pub(crate) fn runtime() -> Result<&'static Handle, LockError> {
    match &*RUNTIME {
        Ok(runtime) => Ok(runtime.handle()),
        Err(reason) => Err(LockError::Runtime {
            reason: format!("could not start the lock runtime: {reason}"),
        }),
    }
}

/// Sets up the process-wide lock client used by `#[distributed_lock]` and [`Lock::new`](crate::Lock::new).
///
/// Call it once at startup, from sync or async code. It validates `config`
/// (`LockError::Config` names the wrong field) but does not connect: connections are made on first
/// use, so a service can start while Redis is still coming up. A failed `init` leaves the process
/// uninitialised, so a later valid call works; a second successful call is
/// [`LockError::AlreadyInitialized`].
pub fn init(config: LockConfig) -> Result<(), LockError> {
    if CLIENT.get().is_some() {
        return Err(LockError::AlreadyInitialized);
    }
    let client = LockClient::new(config)?;
    CLIENT
        .set(client)
        .map_err(|_| LockError::AlreadyInitialized)
}

pub(crate) fn client() -> Result<&'static LockClient, LockError> {
    CLIENT.get().ok_or(LockError::NotInitialized)
}
