//! The one place that hops between the caller's thread or runtime and the runtime that hosts a
//! client (the library's own, or the caller's own with `LockConfig::runtime`).
//!
//! - [`run`]: from async code. The work runs in place, polled by the caller's own task, but with
//!   the hosting runtime's context entered around every poll: whatever it starts (timers, tasks,
//!   connections) belongs to the hosting runtime, so it never depends on the caller's runtime
//!   (which may have no timer, or be about to shut down) and it costs no task hop. The
//!   connections' own tasks run on the hosting runtime, and the caller trades messages with them,
//!   except on a single node or Redlock's nodes called from a multi-thread runtime of the
//!   caller's with IO and time: there the call's requests go over a connection of the caller's
//!   runtime (see [`callers`]), whose workers then write them and read their replies. The
//!   exception: a runtime the caller passed in (`LockConfig::runtime`), called from outside it,
//!   may have shut down (its timers would then panic), so there the work runs as a task.
//! - [`run_blocking`]: from sync code; blocks this thread, never the hosting runtime.
//! - Work started by either is never cut off halfway: if the caller goes away, the work is told
//!   through its [`Signal`] and finishes on the hosting runtime.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, ready};

use tokio::runtime::{Handle, Runtime};
use tokio_util::task::TaskTracker;

use crate::LockError;
use crate::callers::{self, Route, Routed};
use crate::signal::Signal;

/// Connections, renewal and releases live here unless the config names a runtime, so locks keep
/// working across `#[tokio::test]` runtimes, from plain `main`, and from sync code inside async
/// code.
///
/// One worker: its work is connection IO and timers, never CPU-bound, and a second worker only
/// adds wake-ups (tokio wakes an idle sibling to look for work on every hand-over), and each
/// wake-up costs client CPU and a context switch for no work (the bench's first section measures
/// it; the figures are in the README's table). A multi-thread runtime still, so `block_in_place`
/// works on it.
static RUNTIME: LazyLock<Result<Runtime, String>> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("lock-runtime")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
});

/// Work that runs on although its caller may stop waiting: an acquire whose caller went away
/// (its grant, or its cleanup, is still to come) and all work sent to a runtime given in the
/// config. `shutdown` waits for it (see [`left_behind`]) before it waits for the releases, since
/// it is what starts some of them.
static LEFT_BEHIND: LazyLock<TaskTracker> = LazyLock::new(TaskTracker::new);

/// Resolves once the work in [`LEFT_BEHIND`] has finished (the caller bounds the wait).
pub(crate) async fn left_behind() {
    LEFT_BEHIND.close();
    LEFT_BEHIND.wait().await;
    LEFT_BEHIND.reopen();
}

/// The library's own runtime.
pub(crate) fn library_runtime() -> Result<&'static Handle, LockError> {
    match &*RUNTIME {
        Ok(runtime) => Ok(runtime.handle()),
        Err(reason) => Err(LockError::Runtime {
            reason: format!("could not start the lock runtime: {reason}"),
        }),
    }
}

/// Runs `work` on `runtime` for an async caller. `work` gets a signal that is raised when the
/// caller stops waiting (its future dropped); it then still runs to its end on `runtime`.
pub(crate) async fn run<T, F>(
    runtime: &Handle,
    work: impl FnOnce(Arc<Signal>) -> F,
) -> Result<T, LockError>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let gone = Arc::new(Signal::default());
    let told = Arc::clone(&gone);
    hop(runtime, Some(gone), move || work(told)).await
}

/// [`run`] for work that need not be told when its caller stops waiting (a release): no signal
/// is made for it.
pub(crate) async fn run_untold<T, F>(
    runtime: &Handle,
    work: impl FnOnce() -> F,
) -> Result<T, LockError>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    hop(runtime, None, work).await
}

/// [`run`] and [`run_untold`]: `gone`, if any, is raised when the caller stops waiting.
async fn hop<T, F>(
    runtime: &Handle,
    gone: Option<Arc<Signal>>,
    work: impl FnOnce() -> F,
) -> Result<T, LockError>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    if !(on(runtime) || is_library(runtime)) {
        // A runtime the caller gave us, seen from outside: it may have shut down, and then its
        // timers would panic; a task there fails cleanly instead.
        let work = work();
        let (tx, rx) = tokio::sync::oneshot::channel();
        LEFT_BEHIND.spawn_on(
            async move {
                // Whatever the caller no longer takes (say a guard) is dropped here, on the
                // runtime.
                let _ = tx.send(work.await);
            },
            runtime,
        );
        let _raise_on_drop = RaiseOnDrop(gone);
        return rx.await.map_err(|_| stopped());
    }
    // A caller on a runtime of its own sends its requests over that runtime's connections.
    let route = if is_library(runtime) {
        callers::caller(runtime).map(Route::new)
    } else {
        None
    };
    let work = {
        let _context = runtime.enter();
        work()
    };
    Ok(InPlace {
        work: Some(Routed {
            route,
            work: Box::pin(work),
        }),
        runtime: runtime.clone(),
        gone,
    }
    .await)
}

/// Whether `runtime` is the library's own, which lives as long as the process.
fn is_library(runtime: &Handle) -> bool {
    matches!(&*RUNTIME, Ok(library) if library.handle().id() == runtime.id())
}

/// Runs `work` on `runtime` for a sync caller, blocking this thread until it answers. On one of
/// `runtime`'s own worker threads the wait goes through `block_in_place`, so the runtime keeps
/// running the task that answers.
pub(crate) fn run_blocking<T, F>(runtime: &Handle, work: F) -> Result<T, LockError>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(work.await);
    });
    let answer =
        if on(runtime) && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            tokio::task::block_in_place(|| rx.recv())
        } else {
            rx.recv()
        };
    answer.map_err(|_| stopped())
}

/// Whether the caller runs on `runtime`.
fn on(runtime: &Handle) -> bool {
    Handle::try_current().is_ok_and(|current| current.id() == runtime.id())
}

fn stopped() -> LockError {
    LockError::Runtime {
        reason: "the lock runtime stopped before answering".to_owned(),
    }
}

/// Runs `work` in place with `runtime`'s context entered around each poll; if dropped before it
/// finishes, `gone` is raised and the rest runs as a task on `runtime`, so a request already
/// sent is never cut off halfway. Whatever the caller no longer takes (say a guard) is then
/// dropped on the runtime. Either way its requests keep going over the caller's connections
/// (see [`callers`]), so a request sent later (a cleanup) never overtakes an earlier one.
struct InPlace<F: Future<Output: Send> + Send + 'static> {
    work: Option<Routed<Pin<Box<F>>>>,
    runtime: Handle,
    gone: Option<Arc<Signal>>,
}

/// Raises its signal, if any, when dropped: the caller stopped waiting.
struct RaiseOnDrop(Option<Arc<Signal>>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        if let Some(gone) = &self.0 {
            gone.raise();
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for InPlace<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let Some(work) = this.work.as_mut() else {
            return Poll::Pending;
        };
        let out = {
            let _context = this.runtime.enter();
            ready!(Pin::new(work).poll(cx))
        };
        if let Some(Routed {
            route: Some(route), ..
        }) = self.work.take()
        {
            Route::recycle(route);
        }
        Poll::Ready(out)
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for InPlace<F> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            if let Some(gone) = &self.gone {
                gone.raise();
            }
            LEFT_BEHIND.spawn_on(
                async move {
                    drop(work.await);
                },
                &self.runtime,
            );
        }
    }
}
