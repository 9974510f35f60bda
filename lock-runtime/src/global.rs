//! The process-wide client behind [`init`](crate::init), and the library's own runtime.

use std::pin::Pin;
use std::sync::{LazyLock, OnceLock};
use std::task::{Context, Poll, ready};

use tokio::runtime::{Handle, Runtime};
use tokio_util::sync::CancellationToken;

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

/// Waits for an answer from `runtime` on a sync caller's thread. On one of that runtime's own
/// workers the wait goes through `block_in_place`, so the runtime keeps running the task that
/// answers (and its other tasks) on other threads.
pub(crate) fn wait_for<T>(runtime: &Handle, answer: std::sync::mpsc::Receiver<T>) -> Option<T> {
    if on(runtime) && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        tokio::task::block_in_place(|| answer.recv().ok())
    } else {
        answer.recv().ok()
    }
}

/// Whether the caller runs on `runtime` (a client hosted on the caller's runtime, see
/// `LockConfig::runtime`); lock operations then run in place instead of hopping to a task.
pub(crate) fn on(runtime: &Handle) -> bool {
    Handle::try_current().is_ok_and(|current| current.id() == runtime.id())
}

/// Runs `work` in place; if the caller drops it before it finishes, `abandoned` is cancelled and
/// the rest runs as a task on `runtime`, so a request already sent is never cut off halfway (a
/// lock granted meanwhile is then released by its guard's drop).
pub(crate) struct InPlace<F: Future<Output: Send> + Send + 'static> {
    work: Option<Pin<Box<F>>>,
    runtime: Handle,
    abandoned: Option<CancellationToken>,
}

impl<F: Future<Output: Send> + Send + 'static> InPlace<F> {
    pub(crate) fn new(work: F, runtime: Handle, abandoned: Option<CancellationToken>) -> Self {
        InPlace {
            work: Some(Box::pin(work)),
            runtime,
            abandoned,
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for InPlace<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Pending;
        };
        let out = ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out)
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for InPlace<F> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            if let Some(abandoned) = &self.abandoned {
                abandoned.cancel();
            }
            self.runtime.spawn(async move {
                drop(work.await);
            });
        }
    }
}

pub(crate) fn client() -> Result<&'static LockClient, LockError> {
    CLIENT.get().ok_or(LockError::NotInitialized)
}
