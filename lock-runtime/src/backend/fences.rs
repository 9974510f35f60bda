//! Where a plain lock's transaction (`Calls::acquire_plain`: `SET NX`, `INCR`, `PEXPIRE`,
//! `TIME`, `PTTL` in one MULTI/EXEC, about half the server's CPU of the `ACQUIRE` script) can
//! take its fencing token, and where the script must.
//!
//! The rule the transaction keeps is the scripts' (see `scripts::FENCE`): no token is further
//! than [`scripts::FENCE_LAG_US`] below its grant's server clock. A counter counts on from
//! wherever it is, so the transaction is only right for a name whose counter is close to the
//! clock already, or one it seeds first:
//! - a name this client granted less than the lag ago ([`Fresh`]): its counter is close;
//! - a name this client has not seen: its counter most likely does not exist yet (a name per
//!   job, request or day), and `SET fence seed NX` before the `INCR` creates it at the server's
//!   clock as estimated from a recent `TIME` reply ([`ServerClock`]; with none, one transaction
//!   at a time reads the clock with a plain `INCR`, and the others take the script meanwhile);
//! - a name it has seen, but longer ago than the lag, takes the script: its counter exists and
//!   lags, which the transaction could only fix with a second round trip (`SEED_FENCE`).
//!
//! A wrong guess costs time, never correctness: the transaction reads `TIME` beside its `INCR`
//! and raises a token that lags to the clock before granting it.

use std::hash::Hasher as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use super::scripts;
use crate::atomic_instant::AtomicInstant;

/// How long a fence counter raised to the clock stays close enough to it for the transaction.
pub(crate) const FENCE_LAG: Duration = Duration::from_micros(scripts::FENCE_LAG_US.unsigned_abs());

/// How long a reading of the server's clock is trusted for a seed. The estimate runs at the
/// local monotonic clock's rate: one second keeps it within half a millisecond of a server
/// clock that NTP slews at its maximum rate (500 ppm) the other way.
const CLOCK_TRUST: Duration = Duration::from_secs(1);

/// How the transaction takes the fence of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxFence {
    /// Fencing is off: no fence.
    Off,
    /// The counter is close to the clock: `INCR`.
    Count,
    /// The counter most likely does not exist: `SET fence seed NX`, then `INCR`. `seed` is the
    /// server's clock in microseconds, estimated low.
    Seed(i64),
}

/// The fence paths of one node's names and what they need: see the module docs.
#[derive(Default)]
pub(crate) struct FencePaths {
    fresh: Fresh,
    clock: ServerClock,
}

impl FencePaths {
    /// How a transaction for `name` takes its fence at `now`, or `None` when the script must
    /// answer.
    pub(crate) fn path(&self, name: &str, fencing: bool, now: Instant) -> Option<TxFence> {
        if !fencing {
            return Some(TxFence::Off);
        }
        match self.fresh.state(name, now) {
            Seen::Fresh => Some(TxFence::Count),
            Seen::Stale => None,
            Seen::Not => match self.clock.estimate(now) {
                Some(seed) => Some(TxFence::Seed(seed)),
                // Without a recent reading, one transaction at a time reads the clock for the
                // names that follow (and raises the counter it finds missing in a second round
                // trip); the others take the script meanwhile. A burst of new names would
                // otherwise all go out before the first reading came back, and each need that
                // second round trip.
                None if self.clock.take_reading_turn(now) => Some(TxFence::Count),
                None => None,
            },
        }
    }

    /// The counter of `name` stays close enough to the clock for `margin` from `now`.
    pub(crate) fn fresh_for(&self, name: &str, now: Instant, margin: Duration) {
        self.fresh.insert(name, now, margin);
    }

    /// Reads a `TIME` reply that arrived at `at`: the server's clock in microseconds, which
    /// later seeds start from.
    pub(crate) fn read_clock(&self, reply: &Value, at: Instant) -> Option<i64> {
        let micros = server_micros(reply)?;
        self.clock.learn(micros, at);
        Some(micros)
    }
}

/// What [`Fresh`] knows of a name.
enum Seen {
    /// Its counter is close to the clock.
    Fresh,
    /// It was granted here, longer ago than the lag (or it shares a slot with such a name).
    Stale,
    /// Nothing (never granted here, or pushed out by another name).
    Not,
}

/// A lossy map from lock names to until when their fence counter on this node is known to be
/// within [`scripts::FENCE_LAG_US`] of the server's clock. A name it holds by a hash collision, or
/// one whose counter fell behind meanwhile (a failover), takes the transaction, which notices the
/// lagging counter and raises it in a second round trip: this only picks the cheaper path.
struct Fresh(Box<[FreshSlot]>);

#[derive(Default)]
struct FreshSlot {
    /// The name's hash (never 0, which marks an empty slot).
    hash: AtomicU64,
    until: AtomicInstant,
}

impl Default for Fresh {
    fn default() -> Self {
        Fresh((0..Self::SLOTS).map(|_| FreshSlot::default()).collect())
    }
}

impl Fresh {
    const SLOTS: u64 = 1024;

    fn slot(&self, name: &str) -> (u64, &FreshSlot) {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(name, &mut hasher);
        let hash = hasher.finish() | 1;
        let index = usize::try_from(hash % Self::SLOTS).unwrap_or(0);
        (hash, &self.0[index])
    }

    fn state(&self, name: &str, now: Instant) -> Seen {
        let (hash, slot) = self.slot(name);
        if slot.hash.load(Ordering::Relaxed) != hash {
            Seen::Not
        } else if now < slot.until.load() {
            Seen::Fresh
        } else {
            Seen::Stale
        }
    }

    fn insert(&self, name: &str, now: Instant, margin: Duration) {
        let (hash, slot) = self.slot(name);
        slot.hash.store(hash, Ordering::Relaxed);
        // A margin past any instant (a counter far ahead of the clock) counts as none.
        slot.until.store(now.checked_add(margin).unwrap_or(now));
    }
}

/// The server's clock, estimated from its last `TIME` reply: the reading plus the local
/// monotonic time since the reply arrived. The server read its clock before the reply left, so
/// the estimate is behind by that reply's way back (a loopback or LAN trip: far within the lag).
/// It is never ahead unless the server's clock runs slower than the local one (at most half a
/// millisecond within [`CLOCK_TRUST`]) or steps back (which the fencing promise excludes), or
/// another server answers at the same address now (a virtual address moved to a promoted
/// replica; a Sentinel failover to another address makes a new node, with a clock of its own):
/// the first seed then comes from the previous server's clock, a token the new server's clock
/// reaches later (as after a failover to a master whose clock is behind), and that
/// transaction's own `TIME` corrects the estimate.
struct ServerClock {
    /// The reading less the local clock (microseconds since `base`) when it arrived; `i64::MIN`:
    /// no reading yet. One word, so a reader never mixes two readings.
    offset: AtomicI64,
    /// When the reading arrived.
    read_at: AtomicInstant,
    /// Until when the transaction that reads the clock anew has its turn.
    reading_until: AtomicInstant,
    /// What the local clock counts from.
    base: Instant,
}

impl Default for ServerClock {
    fn default() -> Self {
        ServerClock {
            offset: AtomicI64::new(i64::MIN),
            read_at: AtomicInstant::default(),
            // Now, not the default: an `AtomicInstant` reads instants before its process-wide
            // origin (set at its first use) as the origin, which could lie after the first
            // caller's `now` and refuse it the turn.
            reading_until: AtomicInstant::new(Instant::now()),
            base: Instant::now(),
        }
    }
}

impl ServerClock {
    fn learn(&self, server_micros: i64, at: Instant) {
        let Some(offset) = server_micros.checked_sub(self.local_micros(at)) else {
            return;
        };
        self.offset.store(offset, Ordering::Release);
        self.read_at.fetch_max(at);
    }

    /// Whether a caller without a reading may read the clock with its transaction now: one at a
    /// time, each turn good for [`CLOCK_TRUST`] (a turn whose transaction failed ends by
    /// itself). Two callers racing may both get it: then both read it.
    fn take_reading_turn(&self, now: Instant) -> bool {
        if now < self.reading_until.load() {
            return false;
        }
        self.reading_until.store(now + CLOCK_TRUST);
        true
    }

    fn estimate(&self, now: Instant) -> Option<i64> {
        if now.saturating_duration_since(self.read_at.load()) > CLOCK_TRUST {
            return None;
        }
        let offset = self.offset.load(Ordering::Acquire);
        if offset == i64::MIN {
            return None;
        }
        offset.checked_add(self.local_micros(now))
    }

    /// Whole microseconds from `base` to `at`, rounded down (negative before it).
    fn local_micros(&self, at: Instant) -> i64 {
        let nanos = match at.checked_duration_since(self.base) {
            Some(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
            None => -i128::try_from(self.base.duration_since(at).as_nanos()).unwrap_or(i128::MAX),
        };
        i64::try_from(nanos.div_euclid(1000)).unwrap_or(i64::MAX)
    }
}

/// The server clock in microseconds from a `TIME` reply (seconds and microseconds, as strings).
fn server_micros(reply: &Value) -> Option<i64> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let [secs, micros] = parts.as_slice() else {
        return None;
    };
    let number = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<i64>().ok(),
        Value::Int(n) => Some(*n),
        _ => None,
    };
    number(secs)?
        .checked_mul(1_000_000)?
        .checked_add(number(micros)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_needs_a_recent_reading_and_never_runs_ahead_of_it() {
        // A reading from before the clock's base counts as exactly as one after it.
        let start = Instant::now();
        let clock = ServerClock::default();
        assert_eq!(clock.estimate(start), None, "no reading yet");
        clock.learn(1_800_000_000_000_000, start);
        let later = start + Duration::from_millis(250);
        assert_eq!(clock.estimate(later), Some(1_800_000_000_250_000));
        assert_eq!(
            clock.estimate(start + CLOCK_TRUST + Duration::from_millis(1)),
            None
        );
    }

    #[test]
    fn a_name_seen_long_ago_takes_the_script_and_an_unseen_one_is_seeded() {
        let paths = FencePaths::default();
        let now = Instant::now();
        assert_eq!(
            paths.path("a", true, now),
            Some(TxFence::Count),
            "no clock reading yet"
        );
        assert_eq!(
            paths.path("b", true, now),
            None,
            "another name while the reading is on its way: the script"
        );
        assert_eq!(
            paths.path("b", true, now + CLOCK_TRUST),
            Some(TxFence::Count),
            "a reading that never came back lets the next one try"
        );
        assert_eq!(paths.path("a", false, now), Some(TxFence::Off));
        let time = Value::Array(vec![
            Value::BulkString(b"1800000000".to_vec()),
            Value::BulkString(b"5".to_vec()),
        ]);
        assert_eq!(paths.read_clock(&time, now), Some(1_800_000_000_000_005));
        assert_eq!(
            paths.path("a", true, now),
            Some(TxFence::Seed(1_800_000_000_000_005))
        );
        paths.fresh_for("a", now, FENCE_LAG);
        assert_eq!(paths.path("a", true, now), Some(TxFence::Count));
        assert_eq!(
            paths.path("a", true, now + FENCE_LAG),
            None,
            "seen, and stale now"
        );
    }
}
