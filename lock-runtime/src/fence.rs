//! Fenced writes: a resource that checks the lock's fencing token, so that a holder paused past
//! its validity (a GC pause, a VM freeze) cannot overwrite what the next holder wrote.
//!
//! [`set`] writes a value under a key only when its token is at least the largest token that
//! wrote that key, in one script: the key is a hash holding the value and the token beside it
//! (no TTL of its own: set one yourself if the value should expire). [`get`] reads both. Both work
//! on any async redis-rs connection (one node, Cluster: one key per call).
//!
//! ```no_run
//! # async fn demo(client: &redis::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use lock_runtime::{fence, Lock};
//!
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! // A single Redis node (or etcd, or in memory) hands out a token with every grant.
//! let guard = Lock::new("wallet:42").acquire().await?;
//! let token = guard.fencing_token().ok_or("fencing is off")?;
//! match fence::set(&mut conn, "balance:42", 90, token).await {
//!     Ok(()) => {}
//!     // A later holder wrote already: this holder lost the lock while it was paused.
//!     Err(fence::FenceError::Stale { .. }) => return Err("lost the lock".into()),
//!     Err(err) => return Err(err.into()),
//! }
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! A SQL resource does the same with a column beside the row:
//! `UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2`; when it updates
//! no row (and the row exists), a later holder wrote first: treat it as [`FenceError::Stale`]
//! (roll back, report the lock lost), never as success.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, Script, ToRedisArgs};

/// KEYS: the fenced key. ARGV: value, token. Writes the value and the token when the token is at
/// least the one stored (none: 0); returns `{1}` when written, `{0, stored}` when refused. Tokens
/// are compared as Lua numbers: exact below 2^53 (the library's tokens are the server clock in
/// microseconds, about 2^51 today, or etcd revisions).
static SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) < stored then return {0, stored} end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2])
return {1}
",
    )
});

/// Why a fenced write was not made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A larger token wrote `key` already: the writer's lock was lost (it is no longer the
    /// latest holder). Nothing was written.
    #[error("fenced write to `{key}` refused: token {token} is below {stored}, which wrote it")]
    Stale {
        /// The key written to.
        key: String,
        /// The token this write carried.
        token: u64,
        /// The largest token that wrote the key.
        stored: u64,
    },
    /// Redis failed or answered an error (the write may or may not have been made).
    #[error("fenced write to `{key}`: {source}")]
    Redis {
        /// The key written to.
        key: String,
        /// What Redis said.
        source: RedisError,
    },
}

/// Writes `value` under `key` if `token` is at least the largest token that wrote `key`, else
/// answers [`FenceError::Stale`] and writes nothing.
pub async fn set<C, V>(conn: &mut C, key: &str, value: V, token: u64) -> Result<(), FenceError>
where
    C: ConnectionLike + Send,
    V: ToRedisArgs + Send + Sync,
{
    let reply: Vec<u64> = SET
        .key(key)
        .arg(value)
        .arg(token)
        .invoke_async(conn)
        .await
        .map_err(|source| FenceError::Redis {
            key: key.to_owned(),
            source,
        })?;
    match reply.as_slice() {
        [1] => Ok(()),
        [0, stored] => Err(FenceError::Stale {
            key: key.to_owned(),
            token,
            stored: *stored,
        }),
        _ => Err(FenceError::Redis {
            key: key.to_owned(),
            source: RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply from the fenced write script",
            )),
        }),
    }
}

/// The value under `key` and the token that wrote it, or `None` when nothing was written.
pub async fn get<C, V>(conn: &mut C, key: &str) -> Result<Option<(V, u64)>, RedisError>
where
    C: ConnectionLike + Send,
    V: FromRedisValue,
{
    let (value, token): (Option<V>, Option<u64>) = redis::cmd("HMGET")
        .arg(key)
        .arg("value")
        .arg("fence")
        .query_async(conn)
        .await?;
    Ok(value.zip(token))
}
