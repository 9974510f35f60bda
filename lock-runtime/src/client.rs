use std::fmt;
use std::sync::Arc;

use crate::bridge;
use crate::config::LockConfig;
use crate::election::Election;
use crate::engine::Engine;
use crate::error::LockError;
use crate::info::LockInfo;
use crate::lock::Lock;

/// A handle to a configured lock backend. Cheap to clone; all clones share connections and the
/// renewal driver.
///
/// Most code uses the global client through [`init`](crate::init), [`Lock::new`] and the
/// attribute; a `LockClient` is for programs that need several backends, or tests.
#[derive(Clone)]
pub struct LockClient {
    engine: Arc<Engine>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.engine.backend)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Validates `config` and builds a client. Connections are made lazily, on first use, so this
    /// neither blocks nor fails when Redis is down; lock calls then report `Unavailable`.
    pub fn new(config: LockConfig) -> Result<LockClient, LockError> {
        Ok(LockClient {
            engine: Engine::new(config)?,
        })
    }

    /// A lock on `key` through this client (instead of the global one).
    pub fn lock(&self, key: impl Into<String>) -> Lock {
        Lock::new(key).on(Arc::clone(&self.engine))
    }

    /// A lock over several keys through this client (see [`Lock::many`]).
    pub fn lock_many<I>(&self, keys: I) -> Lock
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Lock::many(keys).on(Arc::clone(&self.engine))
    }

    /// The election `name` through this client (instead of the global one): see [`Election`].
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(name).on(Arc::clone(&self.engine))
    }

    /// What the servers say of the lock `key` (see [`inspect`](crate::inspect)).
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let (engine, key) = (Arc::clone(&self.engine), key.to_owned());
        bridge::run_untold(&self.engine.runtime, move || async move {
            engine.inspect(&key).await
        })
        .await?
    }

    /// Deletes the lock `key` whoever holds it (see [`force_release`](crate::force_release)).
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let (engine, key) = (Arc::clone(&self.engine), key.to_owned());
        bridge::run_untold(&self.engine.runtime, move || async move {
            engine.force_release(&key).await
        })
        .await?
    }

    /// What [`shutdown`](crate::shutdown) does, for this client: releases every lock it still
    /// holds (their holders see them lost), refuses new ones, and waits up to one request timeout
    /// (connect plus response timeout) for the releases still running. Blocks this thread.
    pub fn shutdown(&self) {
        let engine = Arc::clone(&self.engine);
        let _ = bridge::run_blocking(&self.engine.runtime.clone(), engine.shutdown());
    }
}
