//! Fenced writes: a resource that checks the fencing token of the lock that guards it, so a
//! holder that lost its lock (paused, partitioned, past its TTL) and then writes late is refused
//! instead of overwriting the next holder's work.
//!
//! A lock alone cannot stop a late write: the old holder does not know it lost the lock until
//! it looks, and its write may already be on the wire. What stops it is the resource comparing
//! the writer's token with the largest token that wrote before
//! ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token) grows with every grant of a
//! key). [`set`] and [`get`] do that for a value kept in Redis; for SQL, see [below](#sql).
//!
//! # Redis
//!
//! [`set`] writes `value` under `key` only when `token` is at least the largest token that
//! wrote `key`, in one script (so check and write are one step on the server), and answers
//! [`FenceError::Stale`] otherwise, with nothing written. An equal token is accepted: one holder
//! may write several times. [`get`] reads the value with the token that wrote it.
//!
//! The key is a hash with two fields, `value` and `fence` (the token), so the token lives and
//! dies with the value: it has no TTL of its own (set one on the key with `EXPIRE` if the value
//! should expire; later writes keep it). Both work on any async connection of
//! `lock_runtime::redis` (the redis-rs 1.x this crate is built with, re-exported; one of your
//! own `redis` dependency only when it is 1.x too): a `MultiplexedConnection`, a
//! `ConnectionManager`, a Cluster connection (the script touches one key, so it runs on that
//! key's master).
//!
//! ```no_run
//! use lock_runtime::{fence, redis, FenceError, Lock};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! let guard = Lock::new("wallet:42").fencing(true).acquire().await?;
//! let token = guard.fencing_token().ok_or("no fencing token")?;
//! match fence::set(&mut conn, "balance:42", 100_i64, token).await {
//!     Ok(()) => {}
//!     // A later holder wrote already: this holder lost its lock, its write must not count.
//!     Err(FenceError::Stale { .. }) => return Err("lost the lock to wallet:42".into()),
//!     Err(other) => return Err(other.into()),
//! }
//! let balance: Option<fence::Fenced<i64>> = fence::get(&mut conn, "balance:42").await?;
//! assert_eq!(balance.map(|b| (b.value, b.token)), Some((100, token)));
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # SQL
//!
//! Keep the token in a column beside the row it guards, and make every write conditional on it,
//! in the same statement:
//!
//! ```sql
//! UPDATE wallets SET balance = $balance, fence = $token WHERE id = $id AND fence <= $token
//! ```
//!
//! One updated row: the write counted. No row updated: either the row does not exist (insert
//! it, with `fence = $token`, if that is what the caller wanted) or a later holder wrote it
//! (`fence > $token`): this holder lost its lock, so it must treat its work as not done (roll
//! back its transaction, answer as for [`LockError::Lost`](crate::LockError::Lost)), not retry
//! the write. A new row starts with `fence = 0`. The check and the write are one statement, so
//! the database's own row lock makes them atomic; a `SELECT` of the fence followed by an
//! `UPDATE` would not be. The tests run this pattern on SQLite (`tests/tests/fence.rs`).

use redis::{FromRedisValue, Script, ToRedisArgs, ToSingleRedisArg};
use std::sync::LazyLock;

/// Why a fenced write or read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A write with a larger token than `token` (`current`) reached `key` first: nothing was
    /// written. The writer's lock was lost (a later holder got it and wrote).
    #[error("fenced write to {key} refused: a later lock holder wrote it first")]
    Stale {
        /// The Redis key written.
        key: String,
        /// The token the refused write carried.
        token: u64,
        /// The largest token that wrote `key`.
        current: u64,
    },
    /// Redis failed or refused the call (connection, timeout, `WRONGTYPE` for a key that is not
    /// a fenced hash, a `fence` field that is not a number).
    #[error("fenced access to {key} failed: {source}")]
    Redis {
        /// The Redis key.
        key: String,
        /// What the client reported.
        #[source]
        source: redis::RedisError,
    },
}

/// A value read by [`get`], with the token of the write that stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fenced<V> {
    /// The value written.
    pub value: V,
    /// The fencing token of the write that stored it: the largest that wrote the key.
    pub token: u64,
}

/// KEYS[1] = the fenced key; ARGV[1] = the value, ARGV[2] = the token (decimal, no leading
/// zeros). Returns `{1}` when written, `{0, current}` when a larger token wrote before.
/// Tokens are compared as decimal strings (length, then bytes): exact for all of u64, which
/// Lua's doubles are not above 2^53.
static SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('HGET', KEYS[1], 'fence')
if current then
  if not string.match(current, '^%d+$') then
    return redis.error_reply('ERR fence field of ' .. KEYS[1] .. ' is not a token')
  end
  local token = ARGV[2]
  if #token < #current or (#token == #current and token < current) then
    return {0, current}
  end
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2])
return {1}
",
    )
});

/// Writes `value` under `key` when `token` is at least the largest token that wrote `key` (an
/// equal token is accepted), else answers [`FenceError::Stale`] and writes nothing. One script
/// call, so the check and the write are atomic on the server. See the [module docs](self).
pub async fn set<C, V>(conn: &mut C, key: &str, value: V, token: u64) -> Result<(), FenceError>
where
    C: redis::aio::ConnectionLike,
    V: ToRedisArgs + ToSingleRedisArg,
{
    let reply: Vec<u64> = SET
        .key(key)
        .arg(value)
        .arg(token)
        .invoke_async(conn)
        .await
        .map_err(|source| redis_error(key, source))?;
    match reply.as_slice() {
        [1] => Ok(()),
        [0, current] => Err(FenceError::Stale {
            key: key.to_owned(),
            token,
            current: *current,
        }),
        _ => Err(redis_error(
            key,
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply of the fenced write script",
            )),
        )),
    }
}

/// Reads the value [`set`] stored under `key` with the token that wrote it; `None` when the key
/// does not exist.
pub async fn get<C, V>(conn: &mut C, key: &str) -> Result<Option<Fenced<V>>, FenceError>
where
    C: redis::aio::ConnectionLike,
    V: FromRedisValue,
{
    let (value, token): (Option<V>, Option<u64>) = redis::cmd("HMGET")
        .arg(key)
        .arg("value")
        .arg("fence")
        .query_async(conn)
        .await
        .map_err(|source| redis_error(key, source))?;
    Ok(match (value, token) {
        (Some(value), Some(token)) => Some(Fenced { value, token }),
        _ => None,
    })
}

fn redis_error(key: &str, source: redis::RedisError) -> FenceError {
    FenceError::Redis {
        key: key.to_owned(),
        source,
    }
}
