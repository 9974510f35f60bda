//! Which runtime an async call comes from, and whether that runtime can carry the call's own
//! requests (a connection of its own per Redis node, see `backend/redis/local.rs`).
//!
//! A request over a connection of the library's runtime crosses threads twice (the caller's
//! task hands it to that runtime's connection task, whose reply wakes the caller), a request over
//! a connection of the caller's own runtime does not. So a call made from a runtime that can
//! host one goes over that runtime's connection, and [`bridge`](crate::bridge) says so by making
//! the caller current (a thread-local) around each poll of the call's work.
//!
//! A runtime can host connections when it is multi-threaded (a current-thread runtime drives IO
//! only inside `block_on`, so the cleanup of a call it dropped could stall until it next blocks)
//! and has IO and time drivers. Tokio cannot be asked about the drivers, and using one that is
//! missing panics, so each runtime is asked once, by using both under `catch_unwind`. The
//! process's panic hook is wrapped once so that this one expected panic is not reported; every
//! other panic reaches the hook that was there before. Builds with `panic = "abort"` cannot catch
//! it and never ask: their calls go over the library's connections, as do sync callers.
//!
//! A runtime that shut down is forgotten: a task parked on it notices (tasks are dropped when
//! their runtime shuts down), and its connections are dropped on their next look.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use tokio::runtime::{Handle, Id, RuntimeFlavor};

/// A caller's runtime that can carry requests.
#[derive(Clone)]
pub(crate) struct Caller {
    handle: Handle,
    /// Lowered when the runtime shuts down.
    alive: Arc<AtomicBool>,
}

impl Caller {
    pub(crate) fn id(&self) -> Id {
        self.handle.id()
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Counts the runtime as shut down from now on, before the task that says so is dropped
    /// with the others: a task of the runtime that never ends by itself was dropped unfinished,
    /// which only the runtime's shutdown does. Its connections are then no longer handed out.
    pub(crate) fn shutting_down(&self) {
        self.alive.store(false, Ordering::Release);
    }
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("id", &self.id())
            .field("alive", &self.is_alive())
            .finish()
    }
}

/// What is known of each runtime that called: `None` for one that cannot carry requests.
static RUNTIMES: LazyLock<Mutex<HashMap<Id, Option<Caller>>>> = LazyLock::new(Default::default);

thread_local! {
    /// The route of the call whose work this thread is polling (see [`Routed`]).
    static CURRENT: RefCell<Option<Arc<Route>>> = const { RefCell::new(None) };
    /// What this thread last learnt of its runtime: most threads only ever serve one.
    static LAST: RefCell<Option<(Id, Option<Caller>)>> = const { RefCell::new(None) };
    /// Set while this thread asks a runtime for its drivers: the panic hook stays silent.
    static PROBING: Cell<bool> = const { Cell::new(false) };
    /// A route whose call ended here, for this thread's next call (see [`Route::recycle`]).
    static SPARE: RefCell<Option<Arc<Route>>> = const { RefCell::new(None) };
}

/// The runtime the calling code runs on, if it can carry requests and is not `host` (the
/// runtime the client's own connections live on: nothing to gain there).
pub(crate) fn caller(host: &Handle) -> Option<Caller> {
    let current = Handle::try_current().ok()?;
    let id = current.id();
    if id == host.id() {
        return None;
    }
    let cached = LAST.with_borrow(|last| match last {
        Some((last_id, caller)) if *last_id == id => Some(caller.clone()),
        _ => None,
    });
    if let Some(caller) = cached {
        match caller {
            Some(c) if !c.is_alive() => {}
            known => return known,
        }
    }
    let caller = learn(current);
    LAST.set(Some((id, caller.clone())));
    caller
}

/// Looks `runtime` up, asking it about its drivers the first time.
fn learn(runtime: Handle) -> Option<Caller> {
    let id = runtime.id();
    if let Some(known) = RUNTIMES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
    {
        return known.clone();
    }
    let caller =
        (runtime.runtime_flavor() == RuntimeFlavor::MultiThread && has_drivers()).then(|| Caller {
            handle: runtime,
            alive: Arc::new(AtomicBool::new(true)),
        });
    let mut runtimes = RUNTIMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = runtimes.get(&id) {
        // Another thread of the runtime was first.
        return known.clone();
    }
    runtimes.insert(id, caller.clone());
    drop(runtimes);
    if let Some(c) = &caller {
        // Dropped with the runtime's tasks when it shuts down (at once if it already has: the
        // lock is not held here).
        let watch = ForgetOnDrop {
            id,
            alive: Arc::clone(&c.alive),
        };
        c.handle.spawn(async move {
            let _watch = watch;
            std::future::pending::<()>().await;
        });
    }
    caller
}

/// Forgets a runtime when the task that holds it is dropped: at the runtime's shutdown.
struct ForgetOnDrop {
    id: Id,
    alive: Arc<AtomicBool>,
}

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        RUNTIMES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Whether the current runtime has an IO and a time driver.
#[cfg(panic = "unwind")]
fn has_drivers() -> bool {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PROBING.get() {
                previous(info);
            }
        }));
    });
    struct Probing;
    impl Drop for Probing {
        fn drop(&mut self) {
            PROBING.set(false);
        }
    }
    PROBING.set(true);
    let _probing = Probing;
    let asked = std::panic::catch_unwind(|| -> std::io::Result<()> {
        let socket = std::net::UdpSocket::bind(("127.0.0.1", 0))?;
        socket.set_nonblocking(true)?;
        // Both panic when the runtime lacks the driver.
        drop(tokio::net::UdpSocket::from_std(socket)?);
        drop(tokio::time::sleep(std::time::Duration::ZERO));
        Ok(())
    });
    matches!(asked, Ok(Ok(())))
}

/// Without unwinding the question cannot be asked safely: never.
#[cfg(not(panic = "unwind"))]
fn has_drivers() -> bool {
    false
}

/// One call's way to the servers: its caller, and per node whether its requests go over the
/// caller's connection to that node, decided at its first request there and kept for the rest of
/// the call (its retries and its cleanup), so that no request of the call overtakes an earlier one
/// on another connection. Redlock's nodes decide apart: the caller's connection to one node may be
/// made before its connection to another.
#[derive(Debug)]
pub(crate) struct Route {
    caller: Caller,
    /// The first node's decision (a single node's only one), without a lock.
    first: OnceLock<(usize, bool)>,
    /// The other nodes' decisions (Redlock), by node.
    others: Mutex<Vec<(usize, bool)>>,
}

impl Route {
    pub(crate) fn new(caller: Caller) -> Arc<Route> {
        let route = Route {
            caller,
            first: OnceLock::new(),
            others: Mutex::new(Vec::new()),
        };
        let spare = SPARE.try_with(RefCell::take).ok().flatten();
        if let Some(mut spare) = spare
            && let Some(reused) = Arc::get_mut(&mut spare)
        {
            *reused = route;
            return spare;
        }
        Arc::new(route)
    }

    /// Gives back the route of a call that ended: when nothing else holds it (a cleanup or a
    /// node's request still running would), this thread's next call takes it instead of
    /// allocating one (every async call from a caller's runtime makes a route).
    pub(crate) fn recycle(route: Arc<Route>) {
        if Arc::strong_count(&route) == 1 {
            let _ = SPARE.try_with(|spare| spare.replace(Some(route)));
        }
    }

    pub(crate) fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Whether the call goes over the caller's connection to `node` (any number that tells the
    /// nodes apart): `first` decides, at the call's first request to that node.
    pub(crate) fn local(&self, node: usize, first: impl FnOnce() -> bool) -> bool {
        let mut decide = Some(first);
        let (decided_for, local) = *self.first.get_or_init(|| {
            let decide = decide.take().is_some_and(|f| f());
            (node, decide)
        });
        if decided_for == node {
            return local;
        }
        let mut others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, local)) = others.iter().find(|(n, _)| *n == node) {
            return *local;
        }
        let local = decide.take().is_some_and(|f| f());
        others.push((node, local));
        local
    }
}

/// The route of the call whose work this thread is polling, if its caller can carry requests.
pub(crate) fn current() -> Option<Arc<Route>> {
    CURRENT.with_borrow(Clone::clone)
}

/// Polls `work` with `route` current, wherever it is polled (on the caller's task, or on the
/// library's runtime once the caller stopped waiting or for the call's cleanup).
pub(crate) struct Routed<F> {
    pub(crate) route: Option<Arc<Route>>,
    pub(crate) work: F,
}

impl<F: Future + Unpin> Future for Routed<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Puts back the caller that was current, even if the poll panics.
        struct Restore(Option<Arc<Route>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.set(self.0.take());
            }
        }
        let this = &mut *self;
        let _restore = Restore(CURRENT.replace(this.route.clone()));
        Pin::new(&mut this.work).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_of_a_call_decides_its_connection_once_on_its_own() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let route = Route::new(Caller {
            handle: runtime.handle().clone(),
            alive: Arc::new(AtomicBool::new(true)),
        });
        let asked = &Cell::new(0);
        let decide = |answer: bool| {
            move || {
                asked.set(asked.get() + 1);
                answer
            }
        };
        assert!(route.local(1, decide(true)), "node 1 decides local");
        assert!(!route.local(2, decide(false)), "node 2 decides shared");
        assert!(!route.local(3, decide(false)), "node 3 decides shared");
        assert_eq!(asked.get(), 3);
        assert!(route.local(1, decide(false)), "node 1 keeps its decision");
        assert!(!route.local(2, decide(true)), "node 2 keeps its decision");
        assert!(!route.local(3, decide(true)), "node 3 keeps its decision");
        assert_eq!(asked.get(), 3, "a decision is asked for once per node");
    }
}
