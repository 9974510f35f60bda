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

tokio::task_local! {
    static TASK: Scope;
}

thread_local! {
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
    let in_task = TASK
        .try_with(|scope| scope.find(client, names))
        .unwrap_or(Held::Nothing);
    match in_task {
        Held::Nothing => THREAD.with_borrow(|scope| scope.find(client, names)),
        found => found,
    }
}

/// Runs an async body in a scope that also holds `hold`.
pub(crate) async fn enter<F: Future>(client: usize, hold: &Arc<Hold>, body: F) -> F::Output {
    let scope = TASK
        .try_with(|scope| scope.with(client, hold))
        .unwrap_or_else(|_| Scope::default().with(client, hold));
    TASK.scope(scope, body).await
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
