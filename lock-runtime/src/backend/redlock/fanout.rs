//! How one token's operations reach each node in order, and how one operation fans out to the
//! nodes: polled by the call until the decision, then run to the end in the background.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::backend::{BoxFuture, Token};
use crate::callers::{self, Caller, Routed};
use crate::error::NodeFailure;
use crate::signal::Signal;

/// The token of one acquisition (tokens are unique per acquisition).
pub(super) type OpKey = Token;

/// Per node, in node order: how the operation is going there.
pub(super) type NodeSignals = Arc<[NodeSignal]>;

#[derive(Default)]
pub(super) struct NodeSignal {
    /// Raised once the operation is over on the node.
    pub(super) done: Signal,
    /// Set when the node failed the operation (no answer in time, broken connection).
    pub(super) failure: Mutex<Option<NodeFailure>>,
}

/// One node's part of an operation. It starts after the same token's previous operation is over on
/// that node, and signals its own end when dropped.
pub(super) struct NodeStep {
    pub(super) index: usize,
    pub(super) previous: Option<NodeSignals>,
    pub(super) op: Arc<OpEntry>,
}

impl NodeStep {
    pub(super) async fn after_previous(&self) {
        if let Some(previous) = &self.previous {
            previous[self.index].done.raised().await;
        }
    }

    /// How the node failed the previous operation, if it did and that operation is still busy
    /// there.
    pub(super) fn node_failing(&self) -> Option<NodeFailure> {
        let signal = &self.previous.as_ref()?[self.index];
        if signal.done.is_raised() {
            return None;
        }
        signal
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Ends a step that sends nothing, after the same token's previous operation on its node,
    /// as every step does: ending it at once would let the next operation's step on that node
    /// overtake the previous one still in flight there (a late withdrawal would then delete the
    /// next attempt's grant).
    pub(super) fn end_unused(self, tasks: &TaskTracker) {
        let busy = self
            .previous
            .as_ref()
            .is_some_and(|previous| !previous[self.index].done.is_raised());
        if busy {
            tasks.spawn(async move { self.after_previous().await });
        }
    }

    /// Whether a later operation of the same token has begun (the lock's release, or its keep):
    /// the lock is no longer wanted on more nodes.
    pub(super) fn superseded(&self) -> bool {
        self.op
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&self.op.key)
            .is_none_or(|current| !Arc::ptr_eq(current, &self.op.signals))
    }

    pub(super) fn mark_failed(&self, failure: &NodeFailure) {
        *self.op.signals[self.index]
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(failure.clone());
    }
}

impl Drop for NodeStep {
    fn drop(&mut self) {
        self.op.signals[self.index].done.raise();
    }
}

/// Removes the operation from `in_flight` once its last node step is dropped, unless a later
/// operation of the same token replaced it.
pub(super) struct OpEntry {
    pub(super) key: OpKey,
    pub(super) signals: NodeSignals,
    pub(super) in_flight: Arc<Mutex<HashMap<OpKey, NodeSignals>>>,
}

impl Drop for OpEntry {
    fn drop(&mut self) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if in_flight
            .get(&self.key)
            .is_some_and(|current| Arc::ptr_eq(current, &self.signals))
        {
            in_flight.remove(&self.key);
        }
    }
}

/// The nodes' parts of one operation. Until the operation is decided they are polled by the call
/// itself, in the caller's task: a call from a caller's runtime then writes and reads its requests
/// on that runtime's own connection to each node (see `redis/local.rs`), as a hand-written loop
/// does, instead of handing each over to the library's runtime and back. Once decided (or if the
/// call stops waiting for it), the parts still running go on as a task of `tasks`, with the call's
/// route: a frozen minority never holds up the caller, and no part is cut off halfway.
///
/// That task runs where the call ran: on the caller's runtime when the call has one (see
/// [`Rest`]), else on the runtime whose context the call entered. On the library's runtime
/// instead, each decided call would wake that runtime's thread twice (the task's spawn, and its
/// nodes' replies, read on the caller's connections), and free there what the caller's threads
/// allocated.
pub(super) struct Fanout {
    pub(super) running: Parts,
    pub(super) tasks: TaskTracker,
    /// The runtime whose context the call entered (the library's, for a caller's call): the
    /// rest is polled in it, and runs on it when the call has no runtime of its own.
    pub(super) runtime: Option<Handle>,
}

/// The parts still running, polled in place, every one at each wake-up of the task polling
/// them: a part per node (a handful), so that costs less than a task of its own per part (a
/// `FuturesUnordered` allocates one for each, and two more of its own).
#[derive(Default)]
pub(super) struct Parts(Vec<BoxFuture<'static, ()>>);

impl Parts {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Polls every part once; ready once none is left.
    fn poll_all(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.0
            .retain_mut(|part| part.as_mut().poll(cx).is_pending());
        if self.0.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Future for Parts {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_all(cx)
    }
}

impl Fanout {
    pub(super) fn new(tasks: &TaskTracker, nodes: usize) -> Self {
        Fanout {
            running: Parts(Vec::with_capacity(nodes)),
            tasks: tasks.clone(),
            runtime: Handle::try_current().ok(),
        }
    }

    pub(super) fn push(&mut self, part: impl Future<Output = ()> + Send + 'static) {
        self.running.0.push(Box::pin(part));
    }

    /// The next of `replies`, polling the parts meanwhile; `None` once every sender is gone.
    pub(super) async fn next<T>(&mut self, replies: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
        let running = &mut self.running;
        tokio::select! {
            biased;
            reply = replies.recv() => reply,
            // Ends only once every part has (and with them every sender but the call's own).
            () = poll_fn(|cx| running.poll_all(cx)), if !running.is_empty() => replies.recv().await,
        }
    }

    /// Ends the parts that are done once the decision is out (kept grants), and lets the others
    /// go on as a task.
    pub(super) fn decided(mut self) {
        let waker = Waker::noop();
        let _ = self.running.poll_all(&mut Context::from_waker(waker));
    }
}

impl Drop for Fanout {
    fn drop(&mut self) {
        if self.running.is_empty() {
            return;
        }
        let running = std::mem::take(&mut self.running);
        let route = callers::current();
        let caller = route
            .as_ref()
            .map(|route| route.caller())
            .filter(|caller| caller.is_alive())
            .cloned();
        let rest = Routed {
            route,
            work: running,
        };
        // Always set: the nodes' requests are bounded by tokio's timers, so the call runs in a
        // runtime's context.
        let Some(runtime) = &self.runtime else { return };
        match caller {
            Some(caller) => {
                let handle = caller.handle().clone();
                let rest = Rest {
                    rest: Some(rest),
                    context: runtime.clone(),
                    tasks: self.tasks.clone(),
                    caller,
                };
                self.tasks.spawn_on(rest, &handle);
            }
            None => {
                self.tasks.spawn_on(rest, runtime);
            }
        }
    }
}

/// The parts of a decided call that are still running, as a task on the caller's runtime:
/// polled in the context the call entered (timers and spawns as when the call polled them), and
/// handed over to that context's runtime when dropped unfinished (the caller's runtime shuts
/// down), so that no part is cut off halfway. The caller then counts as gone at once: the parts'
/// later requests (a withdrawal) go over the shared connections, not the runtime's, whose tasks
/// are being dropped with this one.
struct Rest {
    rest: Option<Routed<Parts>>,
    context: Handle,
    tasks: TaskTracker,
    caller: Caller,
}

impl Future for Rest {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(rest) = this.rest.as_mut() else {
            return Poll::Ready(());
        };
        let _context = this.context.enter();
        ready!(Pin::new(rest).poll(cx));
        this.rest = None;
        Poll::Ready(())
    }
}

impl Drop for Rest {
    fn drop(&mut self) {
        if let Some(rest) = self.rest.take() {
            self.caller.shutting_down();
            self.tasks.spawn_on(rest, &self.context);
        }
    }
}
