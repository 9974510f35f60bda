//! Connections on callers' runtimes (see [`crate::callers`]): one per runtime that calls and
//! node, made in the background on that runtime the first time it calls, and used by its calls
//! once made. The caller's own worker threads then write each request and read its reply, as a
//! hand-written loop on one connection does, instead of handing both over to the library's
//! runtime.
//!
//! - A connection is dropped when its runtime shuts down (its task there ends with it); a
//!   request still on it fails as over a broken connection, and the call's cleanup then goes
//!   over the node's shared connection ([`Via::SharedAfterOwn`]). The server may not have run
//!   the requests it had already read from the closed one: it reads its connections in the
//!   order they became readable, so a release on a shared connection that was readable first
//!   (another call's request ahead of it) runs before them. A release answered comes after the
//!   server's round of reads that ran them, so such a cleanup releases once more when its first
//!   release let nothing go (see `RedisNode::release`).
//! - A connection that breaks reconnects as the shared one does (`ConnectionManager`); the new
//!   one is then driven by the library's runtime, where the reconnect runs.
//! - The node's shared connection is made first: renewals and background releases go over it,
//!   and a server that refuses new connections (`maxclients`) must not find a held lock without
//!   one.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::callers::{Caller, Route};

/// A node's connections on callers' runtimes.
pub(super) struct Locals {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// Bound on making one, and the pause before trying again after a failure.
    connect_timeout: Duration,
    conns: Mutex<Vec<Local>>,
}

/// The connection a call's request goes over (see [`Locals::for_call`]).
pub(super) enum Via {
    /// Its caller's own.
    Own(ConnectionManager),
    /// The shared one.
    Shared,
    /// The shared one, after the call's earlier requests went over its caller's connection,
    /// which closed with the caller's runtime: the server may run those later.
    SharedAfterOwn,
}

/// One runtime's connection: empty until made.
struct Local {
    caller: Caller,
    conn: Arc<OnceLock<ConnectionManager>>,
}

impl Locals {
    pub(super) fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Locals {
            client,
            config,
            connect_timeout,
            conns: Mutex::new(Vec::new()),
        })
    }

    /// The connection `route`'s call goes over to this node: its caller's, when made before the
    /// call's first request to this node (the call then keeps it), else the shared one. Starts
    /// making the caller's connection when it has none, once `shared_made` says the shared one
    /// is.
    pub(super) fn for_call(
        self: &Arc<Self>,
        route: &Route,
        shared_made: impl FnOnce() -> bool,
    ) -> Via {
        let mut got = None;
        // This node's connections, as told apart from other nodes'.
        let node = Arc::as_ptr(self) as usize;
        let local = route.local(node, || {
            got = shared_made().then(|| self.get(route.caller())).flatten();
            got.is_some()
        });
        if !local {
            return Via::Shared;
        }
        // Decided by an earlier request of the call; gone only if its runtime shut down since.
        match got.or_else(|| self.get(route.caller())) {
            Some(conn) => Via::Own(conn),
            None => Via::SharedAfterOwn,
        }
    }

    /// `caller`'s connection, if made; starts making it otherwise.
    fn get(self: &Arc<Self>, caller: &Caller) -> Option<ConnectionManager> {
        if !caller.is_alive() {
            // The rest of a call whose runtime shut down (its cleanup, on the library's
            // runtime): the shared connection, as the module says; nothing is started on a
            // runtime that is gone.
            return None;
        }
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(local) = conns.iter().find(|l| l.caller.id() == caller.id()) {
            return local.conn.get().cloned();
        }
        // Runtimes that shut down: their connections' tasks are gone.
        conns.retain(|l| l.caller.is_alive());
        let slot = Arc::new(OnceLock::new());
        conns.push(Local {
            caller: caller.clone(),
            conn: Arc::clone(&slot),
        });
        drop(conns);
        let this = Arc::clone(self);
        let id = caller.id();
        caller.handle().spawn(async move {
            let made = tokio::time::timeout(
                this.connect_timeout,
                ConnectionManager::new_with_config(this.client.clone(), this.config.clone()),
            )
            .await;
            match made {
                Ok(Ok(conn)) => {
                    let _ = slot.set(conn);
                }
                _ => {
                    // Calls keep to the shared connection meanwhile; try again after a pause.
                    tokio::time::sleep(this.connect_timeout).await;
                    this.conns
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|l| l.caller.id() != id);
                }
            }
        });
        None
    }
}
