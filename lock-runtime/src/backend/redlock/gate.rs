//! The gate of a contended Redlock lock: one node, the same for every client, that a waiting
//! attempt asks first (see [`Quorum::acquire`](super::Quorum::acquire)), and what a client
//! remembers to decide when an attempt takes it and when it looks past it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::Token;
use crate::wait::WakeRegistry;

/// How long a lock found held counts as contended: its acquires go through the gate meanwhile.
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// How many recently contended lock names, and refused waiters, a client remembers.
const REMEMBERED_MAX: usize = 4096;
/// How long a gated acquire waits for the gate node before asking the others anyway.
pub(super) const GATE_PATIENCE: Duration = Duration::from_millis(10);

/// The gate node of a lock (its index among `nodes` Redlock nodes, in configuration order): the
/// same for every client (FNV-1a of the name), spread over the nodes.
pub(crate) fn gate_of(name: &str, nodes: usize) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    usize::try_from(hash % nodes as u64).unwrap_or(0)
}

/// What one client remembers of the locks it found held.
pub(super) struct Memory {
    /// The releases this client heard, per lock name (see [`WakeRegistry::heard`]).
    wakers: Arc<WakeRegistry>,
    /// Lock names this client recently found held, and when: their acquires take the gate.
    contended: Mutex<HashMap<Arc<str>, Instant>>,
    /// The last refusal of each waiter (by its token).
    refused: Mutex<HashMap<Token, Refusal>>,
}

/// A waiting attempt's refusal.
struct Refusal {
    at: Instant,
    /// Whether someone held the lock (not a split vote, nor a lock about to expire).
    held: bool,
    /// The releases of the lock's names this client had heard by then.
    heard: u64,
    /// The copy on the gate that refused it, if the gate did.
    gate: Option<GateCopy>,
}

/// A copy of a lock on its gate node that refused an attempt, told apart from another by when
/// it expires: two answers a pause apart that name the same expiry are the same copy, neither
/// renewed nor handed to someone else meanwhile.
#[derive(Debug, Clone, Copy)]
pub(super) enum GateCopy {
    /// It expires between these two moments: the server read its time to live somewhere between
    /// the request and the answer.
    Expires { from: Instant, to: Instant },
    /// It never expires (set by someone else, without a ttl).
    Never,
}

/// How far apart two readings of one expiry may lie beyond the round trips they were made in:
/// `PTTL` counts whole milliseconds.
const PTTL_GRAIN: Duration = Duration::from_millis(1);

impl GateCopy {
    /// The copy whose time to live the gate answered `pttl` to a request sent at `asked` (read
    /// now, as the answer is taken).
    pub(super) fn of(asked: Instant, pttl: Option<Duration>) -> Self {
        let expires = pttl.and_then(|pttl| {
            let to = Instant::now().checked_add(pttl.checked_add(PTTL_GRAIN)?)?;
            Some(GateCopy::Expires {
                from: asked.checked_add(pttl)?,
                to,
            })
        });
        // Beyond what the clock counts: as good as never.
        expires.unwrap_or(GateCopy::Never)
    }

    fn same(self, other: GateCopy) -> bool {
        match (self, other) {
            (GateCopy::Expires { from, to }, GateCopy::Expires { from: f, to: t }) => {
                from <= t && f <= to
            }
            (GateCopy::Never, GateCopy::Never) => true,
            _ => false,
        }
    }
}

impl Memory {
    pub(super) fn new(wakers: Arc<WakeRegistry>) -> Self {
        Memory {
            wakers,
            contended: Mutex::default(),
            refused: Mutex::default(),
        }
    }

    /// Whether this client found `name` held within the last [`CONTENDED_FOR`].
    pub(super) fn contended_recently(&self, name: &str) -> bool {
        let contended = self
            .contended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        contended
            .get(name)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    pub(super) fn mark_contended(&self, name: &Arc<str>) {
        let mut contended = self
            .contended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        remember(&mut contended, Arc::clone(name), Instant::now(), |at| *at);
    }

    /// A waiting attempt of `token` on `names` was refused; `pttl` as the answer said, `gate`
    /// the copy on the gate that refused it too, if it did.
    pub(super) fn refused(
        &self,
        names: &[Arc<str>],
        token: &Token,
        pttl: Option<Duration>,
        gate: Option<GateCopy>,
    ) {
        let refusal = Refusal {
            at: Instant::now(),
            held: pttl != Some(Duration::ZERO),
            heard: self.heard(names),
            gate,
        };
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        remember(&mut refused, token.clone(), refusal, |r| r.at);
    }

    /// `token` won: its refusals are over.
    pub(super) fn granted(&self, token: &Token) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.remove(token);
    }

    /// Whether the gate's "held", answered to a gated attempt of `token` on `names` by the copy
    /// `copy` after the waiter's pause ran out (see `Ask::pause_ran_out`: an attempt after its
    /// subscription was confirmed only finds out whether a release came before, and the gate
    /// tells), is to be checked with the other nodes: when the waiter's last refusal was a hold
    /// by that same copy, and this client has heard no release of the lock since. The waiter's
    /// pause then ran out with the same copy on the gate, neither renewed nor handed on: a
    /// holder that holds on without renewing, or one that let go without the gate hearing of it
    /// (a release whose part on the gate was lost leaves its copy there until its ttl, and
    /// announces nothing there). Only the other nodes tell.
    ///
    /// Otherwise the gate's "held" is the answer. A waiter woken by a release, and one that
    /// finds a new copy on the gate (a fair lock handed on, whose waiters are not told of each
    /// other's hand-offs), keeps to the gate: asking the others too, it would race the gate's
    /// new holder for them, split the vote, or take a fair lock out of its line's order.
    pub(super) fn looks_past_the_gate(
        &self,
        names: &[Arc<str>],
        token: &Token,
        copy: GateCopy,
    ) -> bool {
        let heard = self.heard(names);
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.get(token).is_some_and(|last| {
            last.held && last.heard == heard && last.gate.is_some_and(|gate| gate.same(copy))
        })
    }

    fn heard(&self, names: &[Arc<str>]) -> u64 {
        names
            .iter()
            .fold(0, |sum, name| sum.wrapping_add(self.wakers.heard(name)))
    }
}

/// Inserts `key` in `map`, bounded: when full, what is older than [`CONTENDED_FOR`] (by `at`) is
/// forgotten, and everything if that is not enough. Forgetting costs a split vote more, or one
/// pause more behind a stale gate, never a wrong answer.
fn remember<K: Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    key: K,
    value: V,
    at: impl Fn(&V) -> Instant,
) {
    if map.len() >= REMEMBERED_MAX && !map.contains_key(&key) {
        map.retain(|_, v| at(v).elapsed() < CONTENDED_FOR);
        if map.len() >= REMEMBERED_MAX {
            map.clear();
        }
    }
    map.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::Identity;

    const MS: Duration = Duration::from_millis(1);

    /// The copy read by a request sent at `asked` and answered `rtt` later, `pttl` left.
    fn read(asked: Instant, rtt: Duration, pttl: Duration) -> GateCopy {
        let to = asked + rtt + pttl + PTTL_GRAIN;
        GateCopy::Expires {
            from: asked + pttl,
            to,
        }
    }

    #[test]
    fn one_copy_read_twice_is_the_same_and_a_copy_set_since_is_not() {
        let start = Instant::now();
        let expiry = start + Duration::from_secs(30);
        let first = read(start, MS, expiry - start);
        // A pause later, over a slower round trip: the same expiry.
        let later = start + Duration::from_millis(800);
        assert!(first.same(read(later, 20 * MS, expiry - later)));
        // Renewed, or handed to the next waiter of a fair lock, 5 ms apart.
        let other = expiry + 5 * MS;
        assert!(!first.same(read(later, MS, other - later)));
        assert!(GateCopy::Never.same(GateCopy::Never));
        assert!(!first.same(GateCopy::Never));
        // A time to live beyond the clock's range counts as none.
        let far = GateCopy::of(start, Some(Duration::MAX));
        assert!(far.same(GateCopy::Never));
    }

    #[test]
    fn a_waiter_looks_past_the_gate_only_after_a_silent_pause_behind_the_same_copy() {
        let wakers = Arc::new(WakeRegistry::default());
        let memory = Memory::new(Arc::clone(&wakers));
        let names: Vec<Arc<str>> = vec![Arc::from("gate:a")];
        let token = Token::new(&Identity::new(None), Instant::now());
        let start = Instant::now();
        let copy = read(start, MS, Duration::from_secs(30));
        // Not refused before (its first attempt, or it won since).
        assert!(!memory.looks_past_the_gate(&names, &token, copy));
        // Refused by a hold, then the pause ran out: the same copy is checked with the others.
        let _watching = wakers.watch("gate:a");
        memory.refused(&names, &token, Some(Duration::from_secs(30)), Some(copy));
        assert!(memory.looks_past_the_gate(&names, &token, copy));
        // Another copy on the gate (renewed, handed on): the gate's answer stands.
        let other = read(start, MS, Duration::from_secs(31));
        assert!(!memory.looks_past_the_gate(&names, &token, other));
        // A release heard since: the gate's answer stands.
        wakers.notify("gate:a");
        assert!(!memory.looks_past_the_gate(&names, &token, copy));
        // After a split vote: the contenders retry at the gate, or they would split again.
        memory.refused(&names, &token, Some(Duration::ZERO), Some(copy));
        assert!(!memory.looks_past_the_gate(&names, &token, copy));
        memory.refused(&names, &token, Some(Duration::from_secs(30)), Some(copy));
        assert!(memory.looks_past_the_gate(&names, &token, copy));
        memory.granted(&token);
        assert!(!memory.looks_past_the_gate(&names, &token, copy));
    }
}
