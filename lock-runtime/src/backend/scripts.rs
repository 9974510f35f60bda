//! The Lua scripts: one call per operation on one node. Keys only through `KEYS[]`, values only
//! through `ARGV[]`, so the scripts are correct on Redis Cluster when the keys share a hash tag.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: the n lock keys, then their n fence keys. ARGV: token, ttl_ms, fencing ("1" or "0").
/// Takes every lock key for the token, or none.
/// Returns `{1, fence_1, ..., fence_n}` when every key is ours (fences 0 when fencing is off),
/// `{0, i, pttl}` when someone else holds key `i`. Idempotent for one token: an attempt whose
/// reply was lost can be sent again and answers "ours" (refreshing the TTL) instead of "held".
///
/// Every step that can fail (a key of the wrong type, a fence that is not a number, `OOM`) comes
/// before the first lock key is written, so a failed call leaves no lock behind; the `#!lua` line
/// makes Redis refuse the whole script up front when it is out of memory.
///
/// A fence counter that does not exist (first grant of the key, evicted, or Redis restarted
/// without its data) starts from the server's clock in microseconds, not from 1: it then still
/// exceeds every token handed out before, as long as the clock does not go back and the key saw
/// fewer than one grant per microsecond on average. A same-token retry takes the same path, so it
/// never answers without a fence.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"#!lua
local n = #KEYS / 2
local ours = {}
for i = 1, n do
  local holder = redis.call('GET', KEYS[i])
  if holder == ARGV[1] then
    ours[i] = true
  elseif holder then
    return {0, i, redis.call('PTTL', KEYS[i])}
  end
end
local function fence(k)
  local f = redis.call('INCR', k)
  if f == 1 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', k, f)
  end
  return f
end
local reply = {1}
for i = 1, n do
  local f = 0
  if ARGV[3] == '1' then
    local k = KEYS[n + i]
    if ours[i] then
      f = tonumber(redis.call('GET', k) or '') or fence(k)
    else
      f = fence(k)
    end
  end
  reply[i + 1] = f
end
for i = 1, n do
  if ours[i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  end
end
return reply
",
    )
});

/// KEYS: the lock keys. ARGV: token, ttl_ms. Returns 1 when every key's TTL was reset, `-i` when
/// key `i` is not ours (also when it now holds another type: it certainly is not our lock any
/// more); then nothing was extended.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) ~= ARGV[1] then return -i end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
",
    )
});

/// KEYS: the lock keys. ARGV: token, the publish command (`PUBLISH`, or `SPUBLISH` on a
/// cluster), then one release channel per key (all empty: wake nobody).
/// Deletes each key that is ours (a key of another type is not ours) and wakes the waiters
/// subscribed to its channel. Returns how many keys were ours. Without channels it withdraws the
/// grants of a Redlock attempt that did not win a quorum: they never were a lock, so nobody is
/// woken. A failed publish (a server without sharded pub/sub) never fails the release: waiters
/// then rely on their backoff.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
    if ARGV[i + 2] ~= '' then redis.pcall(ARGV[2], ARGV[i + 2], '') end
  end
end
return deleted
",
    )
});

/// KEYS: fence keys. ARGV: one value per key. Raises each fence counter to at least its value
/// (Redlock: the tokens a quorum granted, written back so that every later majority includes a
/// node that has seen them).
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
for i = 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[i]) or '0') < tonumber(ARGV[i]) then
    redis.call('SET', KEYS[i], ARGV[i])
  end
end
return 1
",
    )
});

/// KEYS: lock. ARGV: the publish command (as for [`RELEASE`]), release channel. Deletes the
/// lock whoever holds it (an operator's forced release) and wakes its waiters. Returns 1 when it
/// was held.
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.pcall(ARGV[1], ARGV[2], '')
  return 1
end
return 0
",
    )
});
