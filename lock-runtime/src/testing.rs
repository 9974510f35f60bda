//! Faults injected into the in-memory backend, to test what your code does when a lock cannot be
//! had or is lost (cargo feature `testing`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::testing::Faults;
//! use lock_runtime::{FailureKind, Lock, LockClient, LockConfig, LockError};
//!
//! let faults = Faults::new();
//! let client = LockClient::new(LockConfig::in_memory().faults(faults.clone()))?;
//!
//! // An outage of the `wallet:` locks: their acquires answer `Unavailable`.
//! faults.unavailable("wallet:*");
//! let err = client.lock("wallet:42").acquire().await.unwrap_err();
//! let LockError::Unavailable { causes, .. } = &err else { panic!("{err}") };
//! assert_eq!(causes[0].kind, FailureKind::Injected);
//! faults.clear();
//!
//! // The holder loses its lock now: `lost()` resolves, and someone else can take the key.
//! let guard = client.lock("wallet:42").acquire().await?;
//! assert!(faults.lose("wallet:42"));
//! guard.lost().await;
//! let other = client.lock("wallet:42").acquire().await?;
//! # drop(other);
//! # Ok(())
//! # }
//! ```
//!
//! A [`Faults`] acts on every client built from a config it was given to
//! ([`LockConfig::faults`](crate::LockConfig::faults), in-memory only), and on nothing else: the
//! faults are the servers', so everything above them (acquiring, waiting, renewal, loss, the
//! attribute, [`Lock`](crate::Lock), guards, elections) behaves as it does on a real fault.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::error::{FailureKind, NodeFailure};

/// Faults to inject into the in-memory backend: give a clone to
/// [`LockConfig::faults`](crate::LockConfig::faults) (`LockConfig::in_memory().faults(faults.clone())`)
/// and keep one to inject them. Clones share the faults.
///
/// - [`unavailable`](Self::unavailable)`(pattern)`: an outage of the keys `pattern` matches,
///   until [`available`](Self::available)`(pattern)` or [`clear`](Self::clear).
/// - [`lose`](Self::lose)`(key)`: the holders of `key` lose it now.
#[derive(Clone, Default)]
pub struct Faults {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The patterns of [`Faults::unavailable`], in the order given.
    unavailable: Vec<String>,
    /// What a loss acts on: each client's node and the client itself (its holds).
    targets: Vec<Weak<dyn Target>>,
}

/// Something a [`Faults::lose`] acts on, attached when a client is built from the config: the
/// in-memory node (which frees the key) and the client (which declares its holds of the key
/// lost, as its renewal does when a server says "not yours").
pub(crate) trait Target: Send + Sync {
    /// Acts on the loss of `key`; true when `key` was held here.
    fn lose(&self, key: &str) -> bool;
}

impl Faults {
    /// No faults yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the keys that match `pattern` unavailable, as if their server could not be
    /// reached, until [`available`](Self::available)`(pattern)` or [`clear`](Self::clear).
    /// Keys are matched as given to the lock (rendered, without the key prefix); `*` matches
    /// any run of characters (`:` too, none too), `?` one character, and every other character
    /// itself (there is no escape, and no `[..]` class). A lock over several keys is
    /// unavailable when any of its keys is.
    ///
    /// Every request about a matching key then fails, each with one cause of kind
    /// [`FailureKind::Injected`] whose detail names the pattern. The library treats that cause
    /// as a refused connection, so it behaves as on a real outage:
    /// - an acquire retries within its `wait` and then answers [`LockError::Unavailable`]
    ///   (with no `wait`, at once); an [`Election::campaign`] keeps campaigning until the keys
    ///   are available again;
    /// - a lock already held is not lost at once: its renewals fail, and it is lost (its
    ///   `lost()` resolves, a body is cancelled, the call answers `Lost`) when its validity runs
    ///   out (its ttl, less the drift allowance, after its last confirmed renewal), unless the
    ///   outage is cleared before;
    /// - a release fails ([`LockError::Unavailable`]; a body that finished still counts) and
    ///   the key stays taken until its ttl runs out; [`inspect`](crate::inspect) and
    ///   [`force_release`](crate::force_release) fail too.
    ///
    /// [`LockError::Unavailable`]: crate::LockError::Unavailable
    /// [`Election::campaign`]: crate::Election::campaign
    pub fn unavailable(&self, pattern: impl Into<String>) {
        self.state().unavailable.push(pattern.into());
    }

    /// Ends the outage that [`unavailable`](Self::unavailable) started with the same `pattern`
    /// (compared as written, not matched: every call with it); the other patterns stay.
    /// Answers whether there was one. For tests that share one client (the global one) and
    /// run in parallel, where [`clear`](Self::clear) would end the others' outages too.
    pub fn available(&self, pattern: &str) -> bool {
        let mut state = self.state();
        let before = state.unavailable.len();
        state.unavailable.retain(|p| p != pattern);
        state.unavailable.len() < before
    }

    /// Ends every outage of [`unavailable`](Self::unavailable): requests succeed again.
    pub fn clear(&self) {
        self.state().unavailable.clear();
    }

    /// The current holders of exactly `key` lose it now, as when the server lost the key (it
    /// expired, or was deleted): the key is free for the next acquire (its waiters are woken),
    /// and each holder is told at once, as its renewal is told "not yours". So once this
    /// returns, the holder's [`LockGuard::lost`](crate::LockGuard::lost) (and
    /// [`Leadership::lost`](crate::Leadership::lost)) resolves, an async
    /// `#[distributed_lock]` body is cancelled at its next `.await` and its call answers
    /// [`LockError::Lost`](crate::LockError::Lost), and a sync body runs to its end and its call
    /// answers `Lost` in place of its success. A lock over several keys is lost when one of
    /// them is; a shared lock's or semaphore's holders all lose it; a fair lock's queue stays.
    ///
    /// Answers whether anyone held `key`; losing a key nobody holds does nothing. Unlike
    /// [`unavailable`](Self::unavailable) it takes no pattern, and it acts whether or not the
    /// key is unavailable.
    pub fn lose(&self, key: &str) -> bool {
        let targets: Vec<Arc<dyn Target>> = {
            let mut state = self.state();
            state.targets.retain(|t| t.strong_count() > 0);
            state.targets.iter().filter_map(Weak::upgrade).collect()
        };
        // Every target acts, even once one found the key held.
        targets
            .iter()
            .fold(false, |held, target| target.lose(key) | held)
    }

    /// Attaches what a loss acts on (a client built from a config with these faults).
    pub(crate) fn attach(&self, target: Weak<dyn Target>) {
        let mut state = self.state();
        state.targets.retain(|t| t.strong_count() > 0);
        state.targets.push(target);
    }

    /// Whether any key is unavailable now.
    pub(crate) fn any_unavailable(&self) -> bool {
        !self.state().unavailable.is_empty()
    }

    /// The cause a request about `names` fails with on node `node`, when one of them is
    /// unavailable.
    pub(crate) fn failure<S: AsRef<str>>(&self, node: &str, names: &[S]) -> Option<NodeFailure> {
        let state = self.state();
        let pattern = state.unavailable.iter().find(|p| {
            names
                .iter()
                .any(|name| lock_rules::name_matches(p, name.as_ref()))
        })?;
        Some(NodeFailure {
            node: node.to_owned(),
            kind: FailureKind::Injected,
            detail: format!("lock_runtime::testing::Faults::unavailable({pattern:?})"),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("Faults")
            .field("unavailable", &state.unavailable)
            .finish_non_exhaustive()
    }
}
