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

    /// A waiting attempt of `token` on `names` was refused; `pttl` as the answer said.
    pub(super) fn refused(&self, names: &[Arc<str>], token: &Token, pttl: Option<Duration>) {
        let refusal = Refusal {
            at: Instant::now(),
            held: pttl != Some(Duration::ZERO),
            heard: self.heard(names),
        };
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        remember(&mut refused, token.clone(), refusal, |r| r.at);
    }

    /// `token` won: its refusals are over.
    pub(super) fn granted(&self, token: &Token) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.remove(token);
    }

    /// Whether the gate's "held", answered to a gated attempt of `token` on `names`, is to be
    /// checked with the other nodes: when this waiter's last refusal was a hold, and this client
    /// has heard no release of the lock since. Its pause then ran out: the holder has held on
    /// since, or let go without the gate hearing of it (a release whose part on the gate was
    /// lost leaves its copy there until its ttl, and announces nothing there). Only the other
    /// nodes tell. A waiter woken by a release keeps to the gate: it and the other woken
    /// waiters, asking the others too, would split the vote with whoever won the gate.
    pub(super) fn looks_past_the_gate(&self, names: &[Arc<str>], token: &Token) -> bool {
        let heard = self.heard(names);
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused
            .get(token)
            .is_some_and(|last| last.held && last.heard == heard)
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
