//! How a backend is set up: its [`BackendKind`], its configuration as a constructor of
//! [`LockConfig`](crate::LockConfig) stores it ([`BackendConfig`]) and as validation leaves it
//! ([`ValidBackend`]), which builds the [`Backend`]. Each backend implements both traits in its
//! own file; the rest of the crate sees only these.

use std::fmt;
use std::sync::Arc;

use super::Backend;
use crate::config::Settings;
use crate::error::LockError;
use crate::wait::WakeRegistry;

/// Which backend a client runs on: the `backend` label of its spans and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendKind {
    /// One Redis master (also Redlock over one node).
    Single,
    Redlock,
    Memory,
    #[cfg(feature = "etcd")]
    Etcd,
    Cluster,
    Sentinel,
}

impl BackendKind {
    /// The `backend` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            BackendKind::Single => "single",
            BackendKind::Redlock => "redlock",
            BackendKind::Memory => "memory",
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => "etcd",
            BackendKind::Cluster => "cluster",
            BackendKind::Sentinel => "sentinel",
        }
    }
}

/// A backend as its constructor stores it: nothing checked yet. `Clone` gives it
/// [`CloneBackendConfig`].
pub(crate) trait BackendConfig: CloneBackendConfig + Send + Sync + 'static {
    /// Checks and parses what the constructor was given, reporting the first invalid value as
    /// [`LockError::Config`] naming the constructor's argument.
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError>;

    /// The backend's part of `LockConfig`'s `Debug`, with every password replaced.
    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

/// What clones a `Box<dyn BackendConfig>`: any config that is `Clone` has it.
pub(crate) trait CloneBackendConfig {
    fn clone_box(&self) -> Box<dyn BackendConfig>;
}

impl<T: BackendConfig + Clone> CloneBackendConfig for T {
    fn clone_box(&self) -> Box<dyn BackendConfig> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn BackendConfig> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// A validated backend, ready to build. What it accepts of the [`Settings`] is checked against
/// these answers before it is built.
pub(crate) trait ValidBackend {
    fn kind(&self) -> BackendKind;

    /// Whether any of its URLs (or endpoints) uses TLS: the TLS settings apply only then.
    fn uses_tls(&self) -> bool;

    /// Whether its fencing token costs nothing (etcd's revision, the in-memory counter): then
    /// every lock carries one, whatever the config says. On Redis a token costs a counter, so
    /// locks carry one only when asked ([`LockConfig::fencing`](crate::LockConfig::fencing),
    /// [`Lock::fencing`](crate::Lock::fencing)).
    fn fencing_free(&self) -> bool {
        false
    }

    /// Whether its master has replicas for `min_replicas` to wait for.
    fn has_replicas(&self) -> bool {
        false
    }

    /// Whether it takes `master_auth`.
    fn takes_master_auth(&self) -> bool {
        false
    }

    /// Builds the backend (its connections are made lazily, on first use), on the runtime
    /// that will host the client.
    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError>;
}
