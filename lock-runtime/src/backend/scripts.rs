//! The Lua scripts: one call per operation on one node. Keys only through `KEYS[]`, values only
//! through `ARGV[]`, so the scripts are correct on Redis Cluster when the keys share a hash tag.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence. ARGV: token, ttl_ms, fencing ("1" or "0").
/// Returns `{1, fence}` when the lock is ours (fence 0 when fencing is off), `{0, pttl}` when
/// someone else holds it. Idempotent for one token: an attempt whose reply was lost can be sent
/// again and answers "ours" (refreshing the TTL) instead of "held".
///
/// Every step that can fail (a key of the wrong type, a fence that is not a number, `OOM`) comes
/// before the lock is written, so a failed call leaves no lock behind; the `#!lua` line makes
/// Redis refuse the whole script up front when it is out of memory.
///
/// A fence counter that does not exist (first grant of the key, evicted, or Redis restarted
/// without its data) starts from the server's clock in microseconds, not from 1: it then still
/// exceeds every token handed out before, as long as the clock does not go back and the key saw
/// fewer than one grant per microsecond on average. A same-token retry takes the same path, so it
/// never answers without a fence.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"#!lua
local function fence()
  if ARGV[3] ~= '1' then return 0 end
  local f = redis.call('INCR', KEYS[2])
  if f == 1 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], f)
  end
  return f
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  local f = 0
  if ARGV[3] == '1' then
    f = tonumber(redis.call('GET', KEYS[2]) or '') or fence()
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, f}
end
if holder then
  return {0, redis.call('PTTL', KEYS[1])}
end
local f = fence()
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, f}
",
    )
});

/// KEYS: lock. ARGV: token, ttl_ms. Returns 1 when the TTL was reset, 0 when the lock is not ours
/// (also when the key now holds another type: it certainly is not our lock any more).
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});

/// KEYS: lock. ARGV: token, release channel (empty: wake nobody). Deletes the lock when it is
/// ours (a key of another type is not ours) and, unless the channel is empty, wakes the waiters subscribed to it. Returns 1 when it was
/// ours, 0 otherwise. Without a channel it withdraws the grants of a Redlock attempt that did not
/// win a quorum: they never were a lock, so nobody is woken.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], '') end
  return 1
end
return 0
",
    )
});

/// KEYS: fence. ARGV: value. Raises the fence counter to at least `value` (Redlock: the token a
/// quorum granted, written back so that every later majority includes a node that has seen it).
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
",
    )
});
