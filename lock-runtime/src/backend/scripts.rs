//! The Lua scripts: one call per operation on one node. Keys only through `KEYS[]`, values only
//! through `ARGV[]`, so the scripts are correct on Redis Cluster when the keys share a hash tag.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: the n lock keys, then their n fence counters (the server's, or each key's slot's on a
/// cluster: the same key repeated), then their n waiting flags. ARGV: token, ttl_ms, fencing
/// ("1" or "0"), mark_ms (how much longer the caller waits if refused, at most the ttl; "0": it
/// does not). A caller that waits, refused by an exclusive holder, marks that key waited for
/// (see [`EXCLUSIVE_RELEASE`]) for `mark_ms`.
/// Takes every lock key for the token, or none.
/// Returns `{1, fence_1, ..., fence_n}` when every key is ours (fences 0 when fencing is off),
/// `{0, i, pttl}` when someone else holds key `i`, `{2, i, n}` when key `i` is a semaphore of
/// `n` permits. Key `i` held by live shared holders (a read lock, see [`SHARED_ACQUIRE`]) counts
/// as held, and a caller that waits marks itself as a waiting writer there (until
/// `now + mark_ms`, renewed by its next attempt), which keeps new readers out; a shared key with
/// no live holder left (only a writer's mark) is free, and the grant replaces it. Idempotent for
/// one token: an attempt whose reply was lost can be sent again and answers "ours" (refreshing
/// the TTL) instead of "held".
///
/// Every step that can fail (a key of the wrong type, a fence that is not a number, `OOM`) comes
/// before the first lock key is written, so a failed call leaves no lock behind; the `#!lua` line
/// makes Redis refuse the whole script up front when it is out of memory.
///
/// Each grant's token counts on by [`FENCE`]'s rule (a same-token retry's too: its earlier reply
/// was lost, so nobody used that token).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "#!lua\n",
        FENCE,
        PERMITS_OF,
        MARK_WAITING,
        WRITER_MARKS,
        r"
local n = #KEYS / 3
local ours = {}
for i = 1, n do
  local holder = redis.pcall('GET', KEYS[i])
  if holder == ARGV[1] then
    ours[i] = true
  elseif type(holder) == 'table' and redis.call('TYPE', KEYS[i]).ok == 'zset' then
    local K = KEYS[i]
    if not redis.call('ZSCORE', K, '#shared') then return {2, i, permits_of(K)} end
    -- The clock is read here, not at the top as `NOW` does: a plain lock never needs it.
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZREMRANGEBYSCORE', K, '-inf', now)
    if shared_state(K) > 0 then
      local mark = tonumber(ARGV[4])
      if mark > 0 then redis.call('ZADD', K, 'GT', now + mark, writer_mark(ARGV[1])) end
      return {0, i, redis.call('PTTL', K)}
    end
  elseif type(holder) == 'table' then
    return holder
  elseif holder then
    if ARGV[4] ~= '0' then mark_waiting(KEYS[2 * n + i], ARGV[4]) end
    return {0, i, redis.call('PTTL', KEYS[i])}
  end
end
local reply = {1}
for i = 1, n do
  reply[i + 1] = grant_fence(KEYS[n + i])
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
    ])
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
    script(&[
        WRITER_MARKS,
        r"
local deleted = 0
for i = 1, #KEYS do
  local holder = redis.pcall('GET', KEYS[i])
  if holder == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
    if ARGV[i + 2] ~= '' then redis.pcall(ARGV[2], ARGV[i + 2], '') end
  elseif type(holder) == 'table' and ARGV[i + 2] ~= '' then
    drop_writer_mark(KEYS[i], ARGV[1])
  end
end
return deleted
",
    ])
});

/// KEYS: fence counters. ARGV: one value per key. Raises each fence counter to at least its
/// value (Redlock: the tokens a quorum granted, written back to a majority of the granting nodes
/// so that every later majority includes a node that has seen them).
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

/// Lua shared by the scripts of fair, shared and permit locks: the server's clock in
/// milliseconds, as `now`.
const NOW: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
";

/// Lua that drops the fair queue entries whose lease ran out. Needs `Q` (waiters by ticket,
/// their arrival in microseconds), `E` (waiters by lease expiry in milliseconds) and `now`.
const PURGE_QUEUE: &str = r"
local gone = redis.call('ZRANGEBYSCORE', E, '-inf', now)
for _, w in ipairs(gone) do redis.call('ZREM', Q, w) end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', E, '-inf', now) end
";

/// Lua that defines `grant_fence(k)`: the fencing token of a grant from the fence counter `k`
/// (0 when `ARGV[3]` turns fencing off), by `count_fence` then `floor_fence`, which a script that
/// must count before it writes the lock (so that a counter that is not a number fails the call
/// before anything is written) calls apart.
///
/// The counter is one per server (per slot on a cluster), so it counts every grant of every key
/// there, and each key's tokens grow with it. It never lags more than 100 ms (`LAG_US`) behind the
/// server's clock in microseconds: a count that would is raised to the clock. The clock is the
/// floor that makes tokens grow across what loses the counter or part of its history: a counter
/// that did not exist (evicted, Redis restarted without its data) and a replica promoted after
/// it missed the last grants (Sentinel, Cluster), whose counter is behind. Every token is at
/// least its grant's server clock less the lag and, at fewer than one grant per microsecond on
/// the server, at most about that clock, so a token handed out after the loss exceeds every
/// token before it as long as the clock did not go back by more than the time between the two
/// grants, less the lag. Within the lag a grant costs `INCR` and `TIME`; a raise adds a `SET`,
/// about once per lag on a busy counter.
const FENCE: &str = r"
local LAG_US = 100000
local function count_fence(k)
  return redis.call('INCR', k)
end
local function floor_fence(k, f)
  local t = redis.call('TIME')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if f < clock - LAG_US then
    f = clock
    redis.call('SET', k, f)
  end
  return f
end
local function grant_fence(k)
  if ARGV[3] ~= '1' then return 0 end
  return floor_fence(k, count_fence(k))
end
";

/// One exclusive lock of one key. KEYS: lock, fence counter, waiting flag. ARGV: token, ttl_ms,
/// fencing ("1" or "0"), lease_ms (how long a refused caller waits before it asks again, at most:
/// it marks the lock waited for that long, see [`EXCLUSIVE_RELEASE`]; "0": it does not wait).
/// [`ACQUIRE`] for one key in fewer commands: `SET NX PX GET` takes the lock and reads
/// its holder at once, and a grant's token costs `INCR` and `TIME`. The counter is counted first,
/// so a counter that is not a number fails the call before the lock is written (a refusal then
/// leaves a gap in the counter, nothing else).
/// Returns `{1, fence}` when granted (also to the same token again, refreshing the TTL: a resent
/// attempt whose reply was lost), `{0, 1, pttl, announced}` when someone else holds it (see
/// [`ANNOUNCED`]), and `{3}` when the key is not a string (a shared lock or semaphore): then
/// [`ACQUIRE`] answers.
pub(crate) static ACQUIRE_ONE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "#!lua\n",
        FENCE,
        MARK_WAITING,
        ANNOUNCED,
        r"
local K, F, W, token, ttl = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
local f = 0
if ARGV[3] == '1' then f = count_fence(F) end
local holder = redis.pcall('SET', K, token, 'NX', 'PX', ttl, 'GET')
if type(holder) == 'table' then return {3} end
if holder == token then
  redis.call('PEXPIRE', K, ttl)
elseif holder then
  if ARGV[4] ~= '0' then mark_waiting(W, ARGV[4]) end
  return {0, 1, redis.call('PTTL', K), announced(holder)}
end
if ARGV[3] == '1' then f = floor_fence(F, f) end
return {1, f}
",
    ])
});

/// Lua that defines `permits_of(k)`: the permit count of the shared lock or semaphore at `k`
/// (0 for a shared lock), from its `+inf` member.
const PERMITS_OF: &str = r"
local function permits_of(k)
  local meta = redis.call('ZRANGEBYSCORE', k, '+inf', '+inf')[1] or ''
  return tonumber(string.match(meta, '^#permits=(%d+)$') or '0')
end
";

/// The bit of a let-go script (a release or a keep: see `Calls::let_go`) or an extension (a
/// renewal, whose first one must not pay for loading it: see `Calls::extend_chunk`) in a set
/// of loaded scripts; 0 for any other script, which is then never counted as loaded.
pub(crate) fn let_go_bit(script: &Script) -> u32 {
    let let_go: [&Script; 6] = [
        &RELEASE,
        &EXCLUSIVE_RELEASE,
        &FAIR_RELEASE,
        &SHARED_RELEASE,
        &EXTEND,
        &SHARED_EXTEND,
    ];
    let_go
        .iter()
        .position(|s| std::ptr::eq(*s, script))
        .map_or(0, |i| 1 << i)
}

fn script(parts: &[&str]) -> Script {
    Script::new(&parts.concat())
}

/// Lua that defines what the scripts know of the writers waiting for a shared lock's readers.
/// Each such writer has its own member in the lock's sorted set, `#w:` and the first 16 hex digits
/// of the SHA-1 of its token (`writer_mark(token)`), scored by when its mark runs out: while one
/// lives, no new reader gets in. A writer's release (not a withdrawal: a Redlock attempt that did
/// not win still waits) drops its own mark wherever the key is still shared
/// (`drop_writer_mark(K, token)`): on a Redlock node that refused it while a reader's release
/// was late, the mark would otherwise keep readers out for the rest of the writer's wait.
/// `shared_state(K)` answers how many live readers (or permits) hold `K` and when its latest
/// writer's mark runs out (0: none), after the caller dropped the lapsed members;
/// `leave_to_writers(K, now)` deletes a key no reader holds, or keeps it as long as a writer's
/// mark lives when only marks are left. Scanning the live members costs one pass over the
/// readers, paid only on a shared key.
const WRITER_MARKS: &str = r"
local function writer_mark(token)
  return '#w:' .. string.sub(redis.sha1hex(token), 1, 16)
end
local function shared_state(K)
  local readers, writer = 0, 0
  local live = redis.call('ZRANGEBYSCORE', K, '-inf', '(inf', 'WITHSCORES')
  for j = 1, #live, 2 do
    if string.sub(live[j], 1, 3) == '#w:' then
      writer = math.max(writer, tonumber(live[j + 1]))
    else
      readers = readers + 1
    end
  end
  return readers, writer
end
local function leave_to_writers(K, now)
  local readers, writer = shared_state(K)
  if readers > 0 then return end
  if writer > 0 then
    -- Only waiting writers' marks are left: they keep new readers out until a writer (woken by
    -- this release) takes the key, or the marks run out. Deleting them would let a reader woken
    -- by the same release in first, again and again.
    redis.call('PEXPIRE', K, math.max(writer - now, 1))
  else
    redis.call('DEL', K)
  end
end
local function drop_writer_mark(K, token)
  if redis.call('TYPE', K).ok ~= 'zset' then return end
  if redis.call('ZREM', K, writer_mark(token)) == 0 then return end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', K, '-inf', now)
  leave_to_writers(K, now)
end
";

/// Lua that defines `announced(holder)`: 1 when the holder's value is one of this library's
/// (its 32-digit secret, then the owner record's start, `US "o1" US`: see `owner.rs`), whose
/// release tells the waiters that marked the lock; 0 for another library's value, whose release
/// announces nothing (see `Attempt::Held`).
pub(crate) const ANNOUNCED: &str = r"
local function announced(holder)
  if string.sub(holder, 33, 36) == '\031o1\031' then return 1 end
  return 0
end
";

/// Lua that defines `mark_waiting(w, ms)`: the lock's waiting flag `w` (see
/// [`EXCLUSIVE_RELEASE`]) lives at least `ms` more milliseconds.
const MARK_WAITING: &str = r"
local function mark_waiting(w, ms)
  if not redis.call('SET', w, '1', 'NX', 'PX', ms) then
    redis.call('PEXPIRE', w, ms, 'GT')
  end
end
";

/// The mark of a plain lock's refused waiter, the second round trip of `Calls::acquire_plain`
/// (its first, `SET NX PX GET`, found the lock held). KEYS: waiting flag, lock. ARGV: mark_ms.
/// Marks the lock waited for at least `mark_ms` (see [`MARK_WAITING`]) and returns the lock's
/// `PTTL`, in one step: sent as three commands (`SET NX PX`, `PEXPIRE GT`, `PTTL`), another
/// waiter's shorter flag could lapse between the `SET`, which left it alone, and the `PEXPIRE`,
/// which then found nothing to lengthen; the release came to nobody while this waiter slept on
/// the strength of its `PTTL` (found by the model: `lock-model/tests/found.rs`).
pub(crate) static MARK_AND_PTTL: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        MARK_WAITING,
        "mark_waiting(KEYS[1], ARGV[1])\nreturn redis.call('PTTL', KEYS[2])\n",
    ])
});

/// A fair lock. KEYS: lock, fence, queue, queue leases, waiting flag. ARGV: token, ttl_ms,
/// fencing ("1" or "0"), queue ("1": the caller waits if refused), lease_ms (how long the
/// caller's place lives unless renewed, at most ttl_ms). A caller that takes or renews a place
/// also marks the lock waited for, as long as its place lives, so that a plain lock's release
/// (see [`EXCLUSIVE_RELEASE`]) hands it on.
///
/// The lock is granted when it is free and the caller is first in the queue (or the queue is
/// empty), or when a release already handed it to the caller. Otherwise a waiting caller joins
/// the queue (its ticket is its arrival time on the server, in microseconds) or renews its entry's
/// lease to `lease_ms`; an entry whose lease runs out leaves the queue.
/// Returns `{1, fence}` when granted, `{0, 1, pttl, ticket, announced}` when not (ticket 0: not
/// queued; `announced`: see [`ANNOUNCED`], 1 when the key is free and waits for the head of the
/// line), `{2, 1, n}` when the key holds a shared lock (`n` 0) or a semaphore of `n` permits.
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "#!lua\nlocal K, F, Q, E, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]\n",
        NOW,
        FENCE,
        PERMITS_OF,
        PURGE_QUEUE,
        MARK_WAITING,
        ANNOUNCED,
        r"
local token, ttl, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local holder = redis.pcall('GET', K)
if type(holder) == 'table' then
  if redis.call('TYPE', K).ok ~= 'zset' then return holder end
  return {2, 1, permits_of(K)}
end
local function take()
  local f = grant_fence(F)
  redis.call('ZREM', Q, token)
  redis.call('ZREM', E, token)
  redis.call('SET', K, token, 'PX', ttl)
  return {1, f}
end
if holder == token then return take() end
local head = redis.call('ZRANGE', Q, 0, 0)[1]
if not holder and (not head or head == token) then return take() end
local ticket = redis.call('ZSCORE', Q, token)
if ARGV[4] == '1' then
  if not ticket then
    ticket = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    redis.call('ZADD', Q, ticket, token)
  end
  redis.call('ZADD', E, now + lease, token)
  for _, k in ipairs({Q, E}) do
    if redis.call('PTTL', k) < lease then redis.call('PEXPIRE', k, lease) end
  end
  mark_waiting(W, lease)
end
local pttl, told = 0, 1
if holder then
  pttl, told = redis.call('PTTL', K), announced(holder)
else
  pttl = math.max(tonumber(redis.call('ZSCORE', E, head) or now) - now, 0)
end
return {0, 1, pttl, tonumber(ticket or 0), told}
",
    ])
});

/// Lua shared by the release scripts of fair and exclusive locks: deletes the lock `K` if
/// `ARGV[1]` (the token) holds it. Leaves `released` (1 when it did) and `holder` (false when
/// the lock is now free).
const TAKE_BACK: &str = r"
local released = 0
local holder = redis.pcall('GET', K)
if holder == ARGV[1] then
  redis.call('DEL', K)
  released = 1
  holder = false
end
";

/// Lua shared by the release scripts of fair and exclusive locks, after [`TAKE_BACK`]: drops
/// the token's entry from the queue `Q` (and `E`); returns when the lock is still held. Then
/// [`PURGE_QUEUE`] and [`HAND_TO_HEAD`].
const LEAVE_QUEUE: &str = r"
redis.call('ZREM', Q, ARGV[1])
redis.call('ZREM', E, ARGV[1])
if holder then return released end
";

/// Lua shared by the release scripts of fair and exclusive locks: hands the free lock `K` to
/// the first waiter in the queue `Q` (see [`FAIR_RELEASE`]), telling only that waiter, on its
/// own channel: the release channel `ARGV[3]` followed by its token's digest in braces
/// (`ARGV[2]`: the publish command; see `keys::own_channel`). Leaves `head` (the waiter's token
/// and ticket, empty when nobody was in line) and `handed` (how long the handed lock lives, in
/// milliseconds; 0 when nobody was in line). Needs [`NOW`].
const HAND_TO_HEAD: &str = r"
local head = redis.call('ZRANGE', Q, 0, 0, 'WITHSCORES')
local handed = 0
if head[1] then
  local lease = tonumber(redis.call('ZSCORE', E, head[1])) - now
  handed = math.max(lease, 1)
  redis.call('SET', K, head[1], 'PX', handed)
  redis.call('ZREM', Q, head[1])
  redis.call('ZREM', E, head[1])
  local digest = string.sub(redis.sha1hex(head[1]), 1, 16)
  -- No fence (0): a waiter that asked for one asks the server for it.
  local told = head[2] .. ' 0 ' .. digest
  redis.pcall(ARGV[2], ARGV[3] .. '{' .. digest .. '}', told)
end
";

/// Releases a fair lock, or takes a waiter out of the queue. KEYS: lock, queue, queue leases.
/// ARGV: token, the publish command, release channel.
///
/// Deletes the lock if `token` holds it and drops `token`'s queue entry. If the lock is then
/// free, it is handed to the first live waiter: set for it with the rest of its entry's lease as
/// time to live (a waiter that died meanwhile keeps it at most that long), and the waiter alone
/// woken, on its own channel (see [`HAND_TO_HEAD`]): the message is `<ticket> 0 <digest>`, the
/// waiter's ticket, no fence (a waiter that wants one asks the server, which counts it on then)
/// and the first 16 hex digits of the SHA-1 of the waiter's token, which lets a waiter without a
/// fence take the lock without asking again. A release that finds
/// nobody in line publishes nothing: every fair waiter has a place in a line (under Redlock, at
/// the lock's gate node), and is woken by the hand-off to it. Returns 1 when `token` held the
/// lock.
pub(crate) static FAIR_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "local K, Q, E = KEYS[1], KEYS[2], KEYS[3]\n",
        NOW,
        TAKE_BACK,
        LEAVE_QUEUE,
        PURGE_QUEUE,
        HAND_TO_HEAD,
        "return released\n",
    ])
});

/// Releases one exclusive lock (not fair), or withdraws its grant. KEYS: lock, queue, queue
/// leases, waiting flag. ARGV: token, the publish command, release channel, wake ("1": a release
/// wakes every waiter when nobody is in line; "0": a withdrawal, which wakes nobody then; "2":
/// the wake-up after a release made by the server's own compare-and-delete, which found the
/// flag: see `Calls::release_native`).
///
/// Deletes the lock if `token` holds it. Whether anyone waits is the waiting flag, which every
/// refused waiter sets (until its next attempt: see `Calls::acquire_plain`), and a release deletes
/// with the lock, in one `DEL`: when it was not there (the common case) the release is `GET` and
/// `DEL`, the hand-written lock's. When it was, a waiter that waited past its threshold may have
/// a place in the lock's queue (as a fair waiter does, see `acquire/`), and while the queue is
/// not empty this is [`FAIR_RELEASE`]: the lock goes to the first live waiter, only that waiter
/// is told, withdrawal or not, and the flag stays as long as the handed lock or a place in line
/// does. Otherwise every waiter is woken, and each refused one sets the flag again. A withdrawal
/// leaves the flag to the waiters it is theirs. A wake-up ("2") acts as the release it follows
/// while the lock is still free; once someone took it, it only wakes the waiters that do not
/// queue. A release ("1") that finds the lock free and the flag there wakes too (a release of
/// the same token may have run unseen, see [`TAKE_BACK_QUIETLY`]). Returns 1 when `token` held
/// the lock (a wake-up: when the lock is free).
pub(crate) static EXCLUSIVE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "local K, Q, E, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n",
        TAKE_BACK_QUIETLY,
        // Defined only past the common case's return: each function is a closure made at every
        // run of the script (the release's Lua time was 1.8x the hand-written script's).
        WRITER_MARKS,
        r"
if type(holder) == 'table' then
  if ARGV[4] == '1' then drop_writer_mark(K, ARGV[1]) end
  if redis.call('EXISTS', W) == 0 then return 0 end
end
if redis.call('EXISTS', Q) == 0 then
  if woke then redis.pcall(ARGV[2], ARGV[3], '') end
  return released
end
",
        NOW,
        LEAVE_QUEUE,
        PURGE_QUEUE,
        HAND_TO_HEAD,
        MARK_WAITING,
        r"
if handed > 0 then mark_waiting(W, handed) end
local last = redis.call('ZRANGE', E, -1, -1, 'WITHSCORES')
if last[1] then mark_waiting(W, math.max(tonumber(last[2]) - now, 1)) end
if not head[1] and woke then redis.pcall(ARGV[2], ARGV[3], '') end
return released
",
    ])
});

/// Lua for [`EXCLUSIVE_RELEASE`]: deletes the lock `K` if `ARGV[1]` (the token) holds it, with
/// the waiting flag `W` when it wakes (`ARGV[4]` "1" or "2"), and returns at once when nobody
/// waits (the flag was not there). When the lock is free and the flag is there, a release or a
/// wake-up deletes the flag and goes on as the release that freed it: someone waits and nobody
/// told them. That is the wake-up after a native release ("2", which answers 1 then), and the
/// background retry of a release whose answer was lost ("1": the first request may have deleted
/// the lock unseen; a native release's reply lost on its way back left the key gone and nobody
/// woken), and the release of a lock that ran out while its waiters slept on the strength of its
/// holder's announcement. A wake-up that finds the lock still held by the token releases it (the
/// native delete it follows never ran); when someone else took the lock in between, it still
/// wakes the waiters unless they queue (they find it held, and mark it again), and keeps the
/// flag: under Redlock the releaser's next attempt often lands on a node before its previous
/// release's wake-up there (a release returns once a quorum confirmed it), and waiters woken by
/// nobody would wait for their next poll. A withdrawal ("0") wakes nobody and leaves the flag
/// to the waiters it is theirs.
/// Leaves `released` and `holder` as [`TAKE_BACK`] does, and `woke` (true when the release is
/// to wake the waiters: the lock is free, and it is not a withdrawal); a `holder` of another
/// type (a shared lock's sorted set, where a writer's mark may be ours) is the caller's to
/// handle.
const TAKE_BACK_QUIETLY: &str = r"
local released, woke = 0, false
local holder = redis.pcall('GET', K)
if holder == ARGV[1] then
  released = 1
  holder = false
  if ARGV[4] == '0' then
    redis.call('DEL', K)
    if redis.call('EXISTS', W) == 0 then return 1 end
  else
    woke = true
    if redis.call('DEL', K, W) == 1 then return 1 end
  end
elseif holder then
  if ARGV[4] == '2' then
    if type(holder) ~= 'table' and redis.call('EXISTS', Q) == 0 then
      redis.pcall(ARGV[2], ARGV[3], '')
    end
    return 0
  end
  if type(holder) ~= 'table' and redis.call('EXISTS', W) == 0 then return 0 end
elseif ARGV[4] == '0' then
  if redis.call('EXISTS', W) == 0 then return 0 end
else
  if ARGV[4] == '2' then released = 1 end
  if redis.call('DEL', W) == 0 then return released end
  woke = true
end
";

/// A shared lock (`ARGV[4]` = "0") or one permit of a semaphore (`ARGV[4]` = the permit count).
/// KEYS: lock, fence, waiting flag. ARGV: token, ttl_ms, fencing ("1" or "0"), permits, mark_ms
/// (how long a reader refused by an exclusive holder marks the lock waited for, see
/// [`EXCLUSIVE_RELEASE`]; "0": it does not wait).
///
/// The lock key is a sorted set: each holder's token scored by its lease's expiry (server
/// milliseconds), a member `#shared` or `#permits=N` scored `+inf` saying what the key is, and
/// for a shared lock a member per waiting writer (see [`WRITER_MARKS`]) scored by the expiry of
/// its mark (while one lives no new reader gets in). The key lives as long as its longest lease.
/// Returns `{1, fence}` when granted, `{0, 1, pttl}` when not, `{2, 1, n}` when the key is used
/// with another mode (`n`: its permit count, 0 for shared, -1 for an exclusive lock).
pub(crate) static SHARED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "#!lua\nlocal K, F, W = KEYS[1], KEYS[2], KEYS[3]\n",
        NOW,
        FENCE,
        PERMITS_OF,
        MARK_WAITING,
        WRITER_MARKS,
        r"
local token, ttl, permits = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local meta = '#shared'
if permits > 0 then meta = '#permits=' .. permits end
local kind = redis.call('TYPE', K).ok
if kind == 'string' then
  if permits == 0 then
    if ARGV[5] ~= '0' then mark_waiting(W, ARGV[5]) end
    return {0, 1, redis.call('PTTL', K)}
  end
  return {2, 1, -1}
end
local ours = false
if kind == 'zset' then
  if not redis.call('ZSCORE', K, meta) then return {2, 1, permits_of(K)} end
  redis.call('ZREMRANGEBYSCORE', K, '-inf', now)
  local mine = redis.call('ZSCORE', K, token)
  ours = mine ~= false and mine ~= nil
  if not ours then
    if permits > 0 then
      if redis.call('ZCARD', K) - 1 >= permits then
        local first = redis.call('ZRANGE', K, 0, 0, 'WITHSCORES')
        return {0, 1, math.max(tonumber(first[2]) - now, 0)}
      end
    else
      -- A waiting writer's mark: worth asking again when it runs out (or at the release that
      -- follows the writer's turn).
      local _, writer = shared_state(K)
      if writer > 0 then return {0, 1, math.max(writer - now, 0)} end
    end
  end
elseif kind ~= 'none' then
  return redis.error_reply('WRONGTYPE the lock key holds a ' .. kind)
end
local f = grant_fence(F)
redis.call('ZADD', K, 'inf', meta)
redis.call('ZADD', K, now + ttl, token)
if redis.call('PTTL', K) < ttl then redis.call('PEXPIRE', K, ttl) end
return {1, f}
",
    ])
});

/// Renews one shared holder or permit. KEYS: lock. ARGV: token, ttl_ms. Returns 1, or -1 when
/// the token holds no live lease there any more.
pub(crate) static SHARED_EXTEND: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "local K = KEYS[1]\n",
        NOW,
        r"
local ttl = tonumber(ARGV[2])
local lease = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(lease) ~= 'string' or tonumber(lease) <= now then return -1 end
redis.call('ZADD', K, now + ttl, ARGV[1])
if redis.call('PTTL', K) < ttl then redis.call('PEXPIRE', K, ttl) end
return 1
",
    ])
});

/// Gives back one shared hold or permit. KEYS: lock. ARGV: token, the publish command, release
/// channel ("": wake nobody). Deletes the key when no holder is left, or keeps it until a live
/// writer's mark runs out when that is all that is left. Returns 1 when the token's
/// lease was live.
pub(crate) static SHARED_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "local K = KEYS[1]\n",
        NOW,
        WRITER_MARKS,
        r"
local lease = redis.pcall('ZSCORE', K, ARGV[1])
if type(lease) ~= 'string' then return 0 end
redis.call('ZREM', K, ARGV[1])
redis.call('ZREMRANGEBYSCORE', K, '-inf', now)
leave_to_writers(K, now)
if ARGV[3] ~= '' then redis.pcall(ARGV[2], ARGV[3], '') end
if tonumber(lease) > now then return 1 end
return 0
",
    ])
});

/// What a node knows of a lock. KEYS: lock, queue leases. Returns `{-2}` when the lock is not
/// held, else `{pttl, live holders, live queued waiters, record...}`:
/// then each live holder's owner record (its value, or its member of a shared lock or
/// semaphore, without the token's secret: the first 32 bytes never leave the server).
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        "local K, E = KEYS[1], KEYS[2]\n",
        NOW,
        r"
local pttl = redis.call('PTTL', K)
if pttl == -2 then return {-2} end
local holders = 1
local records = {}
if redis.call('TYPE', K).ok == 'zset' then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', K, '(' .. now, '(inf')) do
    if string.sub(m, 1, 3) ~= '#w:' then records[#records + 1] = string.sub(m, 33) end
  end
  holders = #records
  if holders == 0 then return {-2} end
else
  local value = redis.pcall('GET', K)
  if type(value) == 'string' then records[1] = string.sub(value, 33) end
end
local reply = {pttl, holders, redis.call('ZCOUNT', E, '(' .. now, '+inf')}
for _, r in ipairs(records) do reply[#reply + 1] = r end
return reply
",
    ])
});
