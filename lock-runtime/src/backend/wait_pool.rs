//! Connections for the requests that end in `WAIT` (`min_replicas`: every grant and renewal).
//!
//! `WAIT` blocks the connection it is sent on until enough replicas acknowledged that
//! connection's writes, or its timeout passes, and counts every write made on it before, other
//! locks' included. On the connection every lock shares, one grant waiting for a lagging replica
//! held up every request behind it (releases, other grants, renewals), and each `WAIT` waited for
//! the others' writes too. So each such request runs on a connection of its own, taken from this
//! pool for its duration: its `WAIT` counts its own writes and blocks nothing else.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisResult};

/// How many idle connections a node keeps for the next requests (more are opened while more are
/// in flight at once, and closed when they come back to a full pool).
const IDLE: usize = 8;

pub(crate) struct WaitPool {
    client: Client,
    config: AsyncConnectionConfig,
    idle: Mutex<Vec<MultiplexedConnection>>,
}

impl WaitPool {
    pub(crate) fn new(
        client: Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        WaitPool {
            client,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout)),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A connection for one request: an idle one, or a new one.
    pub(crate) async fn take(&self) -> RedisResult<MultiplexedConnection> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match idle {
            Some(conn) => Ok(conn),
            None => {
                self.client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
            }
        }
    }

    /// Returns a connection whose request was answered (one whose request failed or timed out
    /// may still be blocked, or broken: it is dropped instead).
    pub(crate) fn give_back(&self, conn: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < IDLE {
            idle.push(conn);
        }
    }
}
