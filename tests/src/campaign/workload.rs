//! What a campaign worker asks for: a random mix of lock kinds over a few keys, short holds and
//! holds longer than a third of the ttl (so renewal runs), and the fenced register each exclusive
//! holder writes to.

use std::sync::LazyLock;
use std::time::Duration;

use crate::sections::Kind;

/// Permits of the semaphore key.
pub const PERMITS: u32 = 2;

/// How long a holder works between checking its lock and writing to the register.
pub const WORK: Duration = Duration::from_millis(25);

/// One lock call to make.
#[derive(Debug, Clone)]
pub struct Step {
    /// The kind.
    pub kind: Kind,
    /// Its keys (two for a lock over several keys).
    pub keys: Vec<String>,
    /// How long to hold it once granted.
    pub hold: Duration,
    /// How long to wait for it.
    pub wait: Duration,
}

/// The keys of a run whose keys start with `prefix`: two plain keys (also taken together), a
/// fair one, a shared one (readers and writers) and a semaphore.
pub fn keys(prefix: &str) -> [String; 5] {
    ["x:0", "x:1", "f:0", "rw:0", "p:0"].map(|k| format!("{prefix}{k}"))
}

/// The next call: plain 30%, both plain keys 10%, fair 15%, reader 15%, writer 10%, permit 20%
/// (a plain lock instead where semaphores are not offered); 25% of holds last from a third to
/// three quarters of `ttl`, the others 5-40ms; waits of 300-1500ms.
pub fn next_step(rng: &mut fastrand::Rng, prefix: &str, ttl: Duration, permits: bool) -> Step {
    let [x0, x1, fair, shared, semaphore] = keys(prefix);
    let plain = |rng: &mut fastrand::Rng| if rng.bool() { x0.clone() } else { x1.clone() };
    let (kind, keys) = match rng.u32(0..100) {
        0..30 => (Kind::Exclusive, vec![plain(rng)]),
        30..40 => (Kind::Exclusive, vec![x0.clone(), x1.clone()]),
        40..55 => (Kind::Fair, vec![fair]),
        55..70 => (Kind::Shared, vec![shared]),
        70..80 => (Kind::Exclusive, vec![shared]),
        _ if permits => (Kind::Permits(PERMITS), vec![semaphore]),
        _ => (Kind::Exclusive, vec![plain(rng)]),
    };
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let hold_ms = if rng.u32(0..4) == 0 {
        rng.u64(ttl_ms / 3..=ttl_ms * 3 / 4)
    } else {
        rng.u64(5..=40)
    };
    Step {
        kind,
        keys,
        hold: Duration::from_millis(hold_ms),
        wait: Duration::from_millis(rng.u64(300..=1500)),
    }
}

/// The fenced register (a max-register on the data server): KEYS `value, accepted, rejected`,
/// ARGV the writer's fencing token. Stores the token and replies 1 when it is at least the stored
/// one, else counts a rejected stale write and replies 0.
pub fn register_script() -> &'static redis::Script {
    static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| {
        redis::Script::new(
            r"
local stored = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) >= stored then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('INCR', KEYS[2])
  return 1
end
redis.call('INCR', KEYS[3])
return 0
",
        )
    });
    &SCRIPT
}

/// The register of lock `key` on the data server: `[value, accepted, rejected]`.
pub fn register_keys(key: &str) -> [String; 3] {
    ["value", "accepted", "rejected"].map(|part| format!("campaign-register:{key}:{part}"))
}
