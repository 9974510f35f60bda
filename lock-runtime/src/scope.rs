//! Reentrancy: the locks the current task (async bodies) or thread (sync bodies) holds.
//!
//! A locked body runs inside a scope that lists its lock; a nested call on keys that a lock of the
//! scope already holds (on the same client) joins it instead of waiting on itself. Tokio task
//! locals are not inherited by spawned tasks, nor thread locals by other threads, so those are
//! never taken for the holder.

use std::cell::RefCell;
use std::sync::Arc;

use crate::hold::Hold;

/// The locks of one scope, innermost last.
#[derive(Clone, Default)]
struct Scope(Vec<(usize, Arc<Hold>)>);

thread_local! {
    /// The scope of the async body being polled on this thread, if any: each locked body's
    /// [`TaskScope`] is swapped in for its polls (as a tokio task local would be, but without a
    /// future type per body).
    static TASK: RefCell<Option<Scope>> = const { RefCell::new(None) };
    static THREAD: RefCell<Scope> = RefCell::new(Scope::default());
}

/// What the current task or thread holds of a set of keys.
pub(crate) enum Held {
    /// Nothing: acquire as usual.
    Nothing,
    /// All of them, by this lock: join it.
    All(Arc<Hold>),
    /// Some of them only: taking the rest would not be atomic.
    Some,
}

impl Scope {
    fn find(&self, client: usize, names: &[Arc<str>]) -> Held {
        let mut some = false;
        for (owner, hold) in self.0.iter().rev() {
            if *owner != client || hold.is_released() {
                continue;
            }
            let held = names.iter().filter(|n| hold.names.contains(n)).count();
            if held == names.len() {
                return Held::All(Arc::clone(hold));
            }
            some |= held > 0;
        }
        if some { Held::Some } else { Held::Nothing }
    }

    fn with(&self, client: usize, hold: &Arc<Hold>) -> Scope {
        let mut scope = self.clone();
        scope.0.push((client, Arc::clone(hold)));
        scope
    }
}

/// What the current task's scope, then the current thread's, holds of `names` on `client`.
pub(crate) fn find(client: usize, names: &[Arc<str>]) -> Held {
    let in_task = TASK.with_borrow(|scope| {
        scope
            .as_ref()
            .map_or(Held::Nothing, |scope| scope.find(client, names))
    });
    match in_task {
        Held::Nothing => THREAD.with_borrow(|scope| scope.find(client, names)),
        found => found,
    }
}

/// The scope an async body runs in: the current task's (the body's whose poll makes it, if any)
/// and `hold`. Made where the body's future is made, so a nested lock's scope extends the outer
/// body's; a spawned task's polls happen outside any body's, so it inherits nothing.
pub(crate) struct TaskScope(Option<Scope>);

impl TaskScope {
    pub(crate) fn new(client: usize, hold: &Arc<Hold>) -> TaskScope {
        let scope = TASK.with_borrow(|scope| match scope {
            Some(scope) => scope.with(client, hold),
            None => Scope::default().with(client, hold),
        });
        TaskScope(Some(scope))
    }

    /// Makes this the current task's scope until the answer is dropped: for one poll of the body
    /// (also when it panics).
    #[inline]
    pub(crate) fn enter(&mut self) -> Entered<'_> {
        let outer = TASK.with_borrow_mut(|current| std::mem::replace(current, self.0.take()));
        Entered { scope: self, outer }
    }
}

/// [`TaskScope::enter`]: puts the outer scope back when dropped.
pub(crate) struct Entered<'a> {
    scope: &'a mut TaskScope,
    outer: Option<Scope>,
}

impl Drop for Entered<'_> {
    #[inline]
    fn drop(&mut self) {
        self.scope.0 =
            TASK.with_borrow_mut(|current| std::mem::replace(current, self.outer.take()));
    }
}

/// Runs a sync body in a scope (of this thread) that also holds `hold`.
pub(crate) fn enter_blocking<R>(client: usize, hold: &Arc<Hold>, body: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            THREAD.with_borrow_mut(|scope| scope.0.pop());
        }
    }
    THREAD.with_borrow_mut(|scope| scope.0.push((client, Arc::clone(hold))));
    // Also when the body panics.
    let _leave = Leave;
    body()
}
