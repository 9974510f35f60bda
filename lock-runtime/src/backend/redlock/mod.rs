//! Redlock: a quorum over N independent Redis nodes, each running the single-node operations;
//! a lock is held while a majority (N/2 + 1) holds it. Every request fans out in parallel (but
//! a waiter's attempt on a contended lock, which asks the lock's gate node first: see `gate.rs`
//! and [`Quorum::acquire`]) and the decision is taken as soon as the quorum is won or can no
//! longer be won: a slow or frozen minority never delays it.
//!
//! The requests a decision no longer waits for still run to the end in the background: after a
//! won acquire they place the lock on the slower nodes too (so the lock survives the loss of a
//! minority of nodes rather than sitting on a bare quorum), after a lost one they withdraw what
//! they were granted. Until the decision, the nodes' parts are polled by the call itself (see
//! `fanout.rs`): a call from a caller's runtime then sends and reads its requests on that
//! runtime's own connections, as on a single node. The operations of one token reach each node
//! in order (one acquire call keeps its token across attempts): a late withdrawal never deletes a
//! newer grant, a late grant never lands after the release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use super::redis::RedisNode;
use super::{Ask, Attempt, ExtendOutcome, Mode, Names, Node, OwnedExtendItem, Token, Watch};
use crate::error::NodeFailure;
use crate::wait::WakeRegistry;
mod config;
mod fanout;
mod gate;

pub(crate) use config::RedlockConfig;
use fanout::{Fanout, NodeSignal, NodeSignals, NodeStep, OpEntry, OpKey};
pub(crate) use gate::gate_of;
use gate::{GATE_PATIENCE, GateCopy, Memory};

pub(crate) struct Quorum {
    /// Concrete, not `dyn Node`: a node's part of an operation calls its request unboxed.
    nodes: Vec<Arc<RedisNode>>,
    /// Every node's part of every operation runs to its end, also after the decision: in the
    /// call until then, as one of these tasks after (see [`Fanout`]); `shutdown` waits for them.
    tasks: TaskTracker,
    quorum: usize,
    /// The latest acquire or release of each (lock, token) that still runs on some node.
    in_flight: Arc<Mutex<HashMap<OpKey, NodeSignals>>>,
    /// What this client remembers of the locks it found held: when an acquire takes the gate.
    memory: Memory,
}

impl std::fmt::Debug for Quorum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not `in_flight`: it holds tokens.
        f.debug_struct("Quorum")
            .field("nodes", &self.nodes)
            .field("quorum", &self.quorum)
            .finish_non_exhaustive()
    }
}

/// One node's part of an acquire: ask it (after the same token's previous operation there), report
/// the answer, then keep the grant if the verdict is "ours", else withdraw it.
#[allow(clippy::too_many_arguments)]
async fn acquire_on(
    node: Arc<RedisNode>,
    step: NodeStep,
    names: Names,
    token: Token,
    ask: Ask,
    reply_tx: mpsc::UnboundedSender<(usize, Result<Attempt, NodeFailure>)>,
    mut verdict: watch::Receiver<Option<bool>>,
) {
    if let Some(failure) = step.node_failing() {
        // The previous attempt failed on this node and is still waiting on it: count the node as
        // failed (same cause) at once rather than queue behind it and hold up this decision.
        // Nothing is sent; the step still ends after the previous one.
        step.mark_failed(&failure);
        let _ = reply_tx.send((step.index, Err(failure)));
        step.after_previous().await;
        return;
    }
    step.after_previous().await;
    let reply = node.acquire_here(&names, &token, ask).await;
    if let Err(failure) = &reply {
        step.mark_failed(failure);
    }
    let held_by_another = matches!(reply, Ok(Attempt::Held { .. }));
    let unanswered = reply.is_err();
    let _ = reply_tx.send((step.index, reply));
    let keep = matches!(
        verdict.wait_for(Option::is_some).await.as_deref(),
        Ok(Some(true))
    );
    if keep && held_by_another {
        place_after_a_split(&node, &step, &names, &token, ask).await;
    }
    if !keep && !held_by_another {
        // Withdrawn, not released: a grant the node answered never was a lock, so no release
        // is published. An announcement would wake every waiter, the withdrawing one included,
        // into another attempt at once: a busy loop for as long as a real holder keeps a
        // majority that lacks the gate (say the gate restarted empty). Contenders after a split
        // retry after a short jittered pause instead (`Attempt::Held` with `pttl` zero). A
        // grant whose answer was lost is told as a release: it may have refused waiters for as
        // long as its request took (they sleep on the strength of its announcement), and no
        // busy loop comes of it, since each such attempt costs its caller a request timeout.
        if let Err(failure) = node
            .release_here(&names, &token, ask.mode, unanswered)
            .await
        {
            step.mark_failed(&failure);
        }
    }
    drop(step);
}

/// How long a release's part that failed transiently on a node is sent again (see
/// [`Quorum::release`]): as long as the engine retries a release no server answered.
const RELEASE_RETRIES_FOR: Duration = Duration::from_secs(60);

/// Sends a node's part again (`send`) until the node answers, or refuses it (down: see
/// [`Quorum::on_every_node`]), pausing 50 ms doubling to a second between tries, for up to
/// `give_up_after`.
async fn retry_part<F>(give_up_after: Duration, send: impl Fn() -> F)
where
    F: Future<Output = Result<bool, NodeFailure>>,
{
    let give_up = Instant::now() + give_up_after;
    let mut pause = Duration::from_millis(50);
    while Instant::now() + pause < give_up {
        tokio::time::sleep(pause).await;
        match send().await {
            Err(failure) if failure.kind.may_have_applied() => {
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            _ => return,
        }
    }
}

/// The pauses before each new try to place a won lock on a node that another token held when it
/// was asked: about 60 ms in all.
const PLACE_RETRIES: [Duration; 5] = [
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
    Duration::from_millis(16),
    Duration::from_millis(32),
];

/// Places a won lock on a node that another token held when the acquire asked it: after a split
/// vote, that is a contender withdrawing what it won, within a few round trips. Without it the
/// lock would sit on a bare majority, where one node that loses its key early (its clock stepped
/// ahead, a restart) hands the lock to someone else while it is held. Tries again a few times,
/// without queueing, and gives up (the lock is held by a majority all the same) when the node
/// stays held, fails, or the lock is no longer wanted there: its release has begun (and waits
/// for this step on this node only). Placed after that, it stayed there as a copy of a released
/// lock until the release's own step came, and the holder's next acquire was refused there.
async fn place_after_a_split(
    node: &RedisNode,
    step: &NodeStep,
    names: &Names,
    token: &Token,
    ask: Ask,
) {
    let ask = Ask {
        queue: false,
        waits: Duration::ZERO,
        ..ask
    };
    for pause in PLACE_RETRIES {
        tokio::time::sleep(pause).await;
        if step.superseded() {
            return;
        }
        match node.acquire_here(names, token, ask).await {
            Ok(Attempt::Held { .. }) => {}
            // Placed, or the node cannot take it: nothing more to do.
            Ok(_) | Err(_) => return,
        }
    }
}

impl Quorum {
    /// `wakers`: the client's, which the nodes' release announcements wake.
    pub(crate) fn new(nodes: Vec<Arc<RedisNode>>, wakers: Arc<WakeRegistry>) -> Self {
        Quorum {
            quorum: Quorum::majority(nodes.len()),
            nodes,
            tasks: TaskTracker::new(),
            in_flight: Arc::default(),
            memory: Memory::new(wakers),
        }
    }

    /// How many of `nodes` nodes are a majority: what every decision over them needs.
    pub(crate) fn majority(nodes: usize) -> usize {
        nodes / 2 + 1
    }

    /// Starts an operation of `token`: one step per node, in node order.
    fn begin(&self, token: &Token) -> Vec<NodeStep> {
        // The value is written out once, before the clones (the operation's key, and each node's
        // part), which then share it: not once per node.
        token.as_str();
        let key = token.clone();
        let signals: NodeSignals = self.nodes.iter().map(|_| NodeSignal::default()).collect();
        let previous = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), Arc::clone(&signals));
        let op = Arc::new(OpEntry {
            key,
            signals,
            in_flight: Arc::clone(&self.in_flight),
        });
        (0..self.nodes.len())
            .map(|index| NodeStep {
                index,
                previous: previous.clone(),
                op: Arc::clone(&op),
            })
            .collect()
    }

    /// Which lock modes Redlock offers: every one but semaphores (see the message).
    pub(crate) fn supports(mode: Mode) -> Result<(), String> {
        match mode {
            Mode::Exclusive | Mode::Shared | Mode::Fair => Ok(()),
            Mode::Permits(_) => Err(
                "Redlock cannot offer a semaphore safely: each node counts its own holders, and \
                 with more than one permit, more holders than permits can each win a different \
                 majority (5 nodes, 2 permits: three holders on nodes {1,2,3}, {3,4,5} and \
                 {1,2,4} leave no node over its count). Use a single node, Sentinel, Cluster or \
                 etcd for permits"
                    .to_owned(),
            ),
        }
    }

    /// Acquires on a quorum.
    ///
    /// Failure is `Err` (unavailable) when more nodes failed than a quorum can spare, whatever the
    /// others answered, and `Held` (contended) otherwise. The answer is given as soon as it is
    /// settled, so a frozen minority never delays it, and never depends on which node answers
    /// first. On failure every node that granted the lock, or may have (no answer), withdraws it
    /// as soon as its acquire is over, so the withdrawal can never overtake the grant.
    ///
    /// A lock this client found held in the last second goes through a gate: its gate node (the
    /// same for every client, chosen by the lock's name) is asked first, and the others only once
    /// it granted, so contenders queue at one node instead of splitting the vote across all of
    /// them (a split vote wins nobody the lock and costs every contender a retry). The gate costs
    /// one round trip more, so an uncontended lock skips it; a gate that does not answer within
    /// [`GATE_PATIENCE`] (slow, frozen or down) is not waited for: the others are asked then, and
    /// its answer counts when it comes. A caller that does not wait if refused (its wait is over,
    /// or zero) skips the gate: the gate's "held" alone would refuse a lock that a majority has
    /// already let go. Nor does a waiter whose pause ran out without a release heard take the
    /// gate's "held" for the answer (see [`Memory::looks_past_the_gate`]): it asks the others
    /// too, without taking a place in their lines, and the majority decides. A release whose part
    /// on the gate was lost left a copy there that would refuse it until its ttl. A waiter that
    /// the gate granted asks the others without a place in their lines either: refused there, it
    /// lined up, and a node's own line then handed the lock to it later, out of the gate's order,
    /// while it listened at the gate alone.
    ///
    /// Shared locks are a quorum of shares, which excludes a writer's quorum as one exclusive
    /// lock excludes another. A fair lock is a line on each node; the lock is granted like any
    /// other, by a majority, so the lines only order the waiters: while the lock is contended its
    /// waiters ask the gate first and line up there, so the gate's line is the order. A waiter
    /// that wins a minority (the lines disagree) withdraws, which passes those nodes on and puts
    /// it at the back of their lines.
    pub(crate) async fn acquire(
        &self,
        names: &Names,
        token: &Token,
        ask: Ask,
    ) -> Result<Attempt, Vec<NodeFailure>> {
        let fencing = ask.fencing;
        let (reply_tx, mut replies) = mpsc::unbounded_channel();
        // `Some(true)`: the lock is ours, keep every grant. `Some(false)` (or the sender dropped
        // before deciding): withdraw them.
        let (verdict_tx, verdict) = watch::channel(None::<bool>);
        let n = self.nodes.len();
        let mut steps: Vec<Option<NodeStep>> = self.begin(token).into_iter().map(Some).collect();
        let gate = gate_of(&names[0], n);
        let mut parts = Fanout::new(&self.tasks, self.nodes.len());
        let start = |parts: &mut Fanout, step: NodeStep, ask: Ask| {
            let node = Arc::clone(&self.nodes[step.index]);
            let (names, token) = (Arc::clone(names), token.clone());
            let (reply_tx, verdict) = (reply_tx.clone(), verdict.clone());
            parts.push(acquire_on(node, step, names, token, ask, reply_tx, verdict));
        };
        let mut first = None;
        // What the nodes other than the gate are asked.
        let mut others_ask = ask;
        // Asked past the gate, or once it granted: without a place in their lines, which would
        // hand them the lock later in an order of their own (the gate's line is the order), to
        // a waiter that does not listen there.
        let unqueued = Ask {
            queue: false,
            waits: Duration::ZERO,
            starving: false,
            ..ask
        };
        // The gate's "held" is one node's word: a hint to wait for its announcement, never the
        // answer for a caller that does not wait (a release returns once a majority confirmed
        // it, and its part on the gate may land later; the lock is free all the same).
        // A waiter's: when it asked, and the copy on the gate that refused it (see `Memory`).
        let asked = ask.queue.then(Instant::now);
        let mut gate_copy = None;
        let gated = n > 1 && ask.queue && self.memory.contended_recently(&names[0]);
        if let Some(asked) = asked.filter(|_| gated) {
            if let Some(step) = steps[gate].take() {
                start(&mut parts, step, ask);
            }
            match tokio::time::timeout(GATE_PATIENCE, parts.next(&mut replies)).await {
                Ok(Some((
                    _,
                    Ok(Attempt::Held {
                        index,
                        pttl,
                        ticket,
                        announced,
                    }),
                ))) => {
                    let copy = GateCopy::of(asked, pttl);
                    let past =
                        ask.pause_ran_out && self.memory.looks_past_the_gate(names, token, copy);
                    if !past {
                        // The gate's holder (or a contender that got there first) goes on;
                        // nothing was sent to the other nodes. Their steps end unused. A fair
                        // waiter now has its place in the gate's line.
                        for step in steps.into_iter().flatten() {
                            step.end_unused(&self.tasks);
                        }
                        verdict_tx.send_replace(Some(false));
                        parts.decided();
                        self.memory.mark_contended(&names[0]);
                        self.memory.refused(names, token, pttl, Some(copy));
                        return Ok(Attempt::Held {
                            index,
                            pttl,
                            ticket,
                            announced,
                        });
                    }
                    // Checked with the others: they decide, and the waiter's place in line
                    // stays the gate's.
                    gate_copy = Some(copy);
                    first = Some((
                        gate,
                        Ok(Attempt::Held {
                            index,
                            pttl,
                            ticket,
                            announced,
                        }),
                    ));
                    others_ask = unqueued;
                }
                Ok(Some(granted @ (_, Ok(Attempt::Acquired { .. })))) => {
                    first = Some(granted);
                    others_ask = unqueued;
                }
                Ok(reply) => first = reply,
                // Not answering in time: ask the others now; its answer counts when it comes.
                Err(_) => {}
            }
        }
        for step in steps.into_iter().flatten() {
            start(&mut parts, step, others_ask);
        }
        drop(reply_tx);
        // How many nodes may fail or refuse while a quorum is still possible.
        let spare = n - self.quorum;
        let mut pending = n;
        let mut won = 0;
        // Which nodes granted it: the token's write-back counts only theirs (see `raise_fences`).
        let mut granted_by = vec![false; n];
        // Per key, the largest token of the granting nodes.
        let mut fences = vec![0u64; if fencing { names.len() } else { 0 }];
        let mut held: Option<(usize, Option<Duration>)> = None;
        // Whether every node that refused it said its holder announces its release: a foreign
        // Redlock (node-redlock, say) on one of them announces nothing there.
        let mut announced = true;
        let mut mismatch = None;
        let mut failures = Vec::new();
        // A fair waiter's place in the gate's line: the one whose hand-off wakes it.
        let mut gate_ticket = None;
        // Its place in another node's line, for when the gate did not answer: the waiter then
        // left entries behind all the same, which its give-up must take back (the acquire loop
        // releases when an answer carries a ticket), and it listens at the other nodes, whose
        // hand-offs to this ticket wake it.
        let mut other_ticket = None;
        loop {
            let (node, reply) = match first.take() {
                Some(reply) => reply,
                None => match parts.next(&mut replies).await {
                    Some(reply) => reply,
                    None => break,
                },
            };
            pending -= 1;
            match reply {
                Ok(Attempt::Acquired { fences: granted }) => {
                    won += 1;
                    granted_by[node] = true;
                    for (f, g) in fences.iter_mut().zip(granted) {
                        *f = (*f).max(g);
                    }
                }
                Ok(Attempt::Mismatch { field, reason }) => {
                    // Never granted: counts as a refusal, and is the answer unless a quorum
                    // (of nodes that disagree with this one) grants it.
                    mismatch = Some(Attempt::Mismatch { field, reason });
                }
                Ok(Attempt::Held {
                    index,
                    pttl,
                    ticket,
                    announced: told,
                }) => {
                    announced &= told;
                    if node == gate {
                        gate_ticket = ticket;
                        if let Some(asked) = asked {
                            gate_copy.get_or_insert(GateCopy::of(asked, pttl));
                        }
                    } else {
                        other_ticket = other_ticket.or(ticket);
                    }
                    // The blocking key with the shortest known remaining time.
                    let shorter = match (held, pttl) {
                        (None, _) | (Some((_, None)), Some(_)) => true,
                        (Some((_, Some(s))), Some(p)) => p < s,
                        _ => false,
                    };
                    if shorter {
                        held = Some((index, pttl));
                    }
                }
                Err(failure) => failures.push(failure),
            }
            let lost = won + pending < self.quorum;
            // Contended for sure: even if every node still pending fails, the failures alone
            // would not rule out a quorum.
            let contended = lost && failures.len() + pending <= spare;
            if won >= self.quorum || failures.len() > spare || contended {
                break;
            }
        }
        let mut acquired = won >= self.quorum;
        // A token that did not reach a majority of its granting nodes is not handed out: the
        // grants are withdrawn and the call fails as those nodes did (a transient failure is
        // retried within the wait), never as contention.
        let mut unraised = None;
        if acquired
            && fencing
            && let Err(raise_failures) = self
                .raise_fences(names, &fences, &granted_by, &mut parts)
                .await
        {
            acquired = false;
            unraised = Some(raise_failures);
        }
        verdict_tx.send_replace(Some(acquired));
        parts.decided();
        let ticket = gate_ticket.or(other_ticket);
        if acquired {
            if gated {
                self.memory.granted(token);
            }
            Ok(Attempt::Acquired { fences })
        } else if let Some(failures) = unraised {
            Err(failures)
        } else if failures.len() > spare {
            Err(failures)
        } else if let Some(mismatch) = mismatch {
            Ok(mismatch)
        } else if won > 0 {
            self.memory.mark_contended(&names[0]);
            if ask.queue {
                self.memory
                    .refused(names, token, Some(Duration::ZERO), gate_copy);
            }
            // A split vote: this attempt won some nodes, so no holder has them all; the other
            // contenders are withdrawing their grants as this one does. Nobody will publish a
            // release, so say "free any moment" and let the strategy retry after a short jittered
            // pause rather than the long backoff that suits a lock that is really held.
            let (index, _) = held.unwrap_or((0, None));
            Ok(Attempt::Held {
                index,
                pttl: Some(Duration::ZERO),
                ticket,
                announced,
            })
        } else {
            self.memory.mark_contended(&names[0]);
            let (index, pttl) = held.unwrap_or((0, None));
            if ask.queue {
                self.memory.refused(names, token, pttl, gate_copy);
            }
            Ok(Attempt::Held {
                index,
                pttl,
                ticket,
                announced,
            })
        }
    }

    /// Writes the granted token back to the nodes' fence counters and returns once a majority of
    /// nodes *that granted it* (`granted_by`) has it. A later grant's majority shares one of
    /// those nodes, and is granted there only after this lock let go of it (released or
    /// expired), so after the write-back landed: its counter makes the later token larger.
    ///
    /// Any majority is not enough. A node that did not grant this lock may have granted a
    /// contender already (a minority it holds on to, or an attempt of its in flight), whose
    /// token from there is older than the write-back; and the write-back to a granting node may
    /// still be on its way when this lock's release, sent after, frees that node. The later
    /// grant's majority could then be such nodes only, every counter below this token (the fault
    /// campaign found it, seed 200639: a token 4 s of clock below the one before).
    ///
    /// The other nodes finish in the background. `parts`: the acquire's, which these join (the
    /// acquire's own parts still run there).
    async fn raise_fences(
        &self,
        names: &Names,
        fences: &[u64],
        granted_by: &[bool],
        parts: &mut Fanout,
    ) -> Result<(), Vec<NodeFailure>> {
        let fences: Arc<[u64]> = fences.into();
        let (tx, mut replies) = mpsc::unbounded_channel();
        for (i, node) in self.nodes.iter().enumerate() {
            let (node, names, fences, tx) = (
                Arc::clone(node),
                Arc::clone(names),
                Arc::clone(&fences),
                tx.clone(),
            );
            parts.push(async move {
                let _ = tx.send((i, node.raise_fences(&names, &fences).await));
            });
        }
        drop(tx);
        let granting = granted_by.iter().filter(|g| **g).count();
        let mut done = 0;
        let mut failures = Vec::new();
        while let Some((node, reply)) = parts.next(&mut replies).await {
            if !granted_by[node] {
                continue;
            }
            match reply {
                Ok(()) => done += 1,
                Err(failure) => failures.push(failure),
            }
            if done >= self.quorum {
                return Ok(());
            }
            if failures.len() > granting.saturating_sub(self.quorum) {
                break;
            }
        }
        Err(failures)
    }

    /// Extends on every node in parallel; an item is extended when a quorum confirms it, and not
    /// ours any more when a quorum can no longer confirm it because nodes said "not yours". Each
    /// item is reported as soon as it is settled, so a slow node or item never holds back the
    /// confirmed ones.
    ///
    /// Nodes slower than the decision still finish in the background: abandoning them would let
    /// the lock expire there (or never load the script there), until it sits on a bare quorum
    /// and the next single node failure loses it.
    pub(crate) async fn extend_many(
        &self,
        items: Arc<[OwnedExtendItem]>,
        done: &mut (dyn FnMut(usize, ExtendOutcome) + Send),
    ) {
        let (tx, mut pending) = mpsc::unbounded_channel();
        for node in &self.nodes {
            let (node, items, tx) = (Arc::clone(node), Arc::clone(&items), tx.clone());
            self.tasks.spawn(async move {
                let borrowed: Vec<_> = items.iter().map(OwnedExtendItem::borrow).collect();
                let _ = tx.send(node.extend_many(&borrowed).await);
            });
        }
        drop(tx);
        let n = self.nodes.len();
        let mut yes = vec![0usize; items.len()];
        let mut no = vec![0usize; items.len()];
        // Per item, the key the first "not yours" named.
        let mut lost_key = vec![0usize; items.len()];
        let mut first_failure: Vec<Option<NodeFailure>> = vec![None; items.len()];
        let mut settled = vec![false; items.len()];
        let mut open = items.len();
        while let Some(replies) = pending.recv().await {
            for (i, reply) in replies.into_iter().enumerate().take(items.len()) {
                if settled[i] {
                    continue;
                }
                match reply {
                    ExtendOutcome::Extended => yes[i] += 1,
                    ExtendOutcome::NotOwned { index } => {
                        if no[i] == 0 {
                            lost_key[i] = index;
                        }
                        no[i] += 1;
                    }
                    ExtendOutcome::Failed(f) => {
                        first_failure[i].get_or_insert(f);
                    }
                }
                let outcome = if yes[i] >= self.quorum {
                    ExtendOutcome::Extended
                } else if n - no[i] < self.quorum {
                    ExtendOutcome::NotOwned { index: lost_key[i] }
                } else {
                    continue;
                };
                settled[i] = true;
                open -= 1;
                done(i, outcome);
            }
            if open == 0 {
                return;
            }
        }
        for (i, failure) in first_failure.into_iter().enumerate() {
            if !settled[i] {
                done(
                    i,
                    ExtendOutcome::Failed(failure.unwrap_or_else(|| {
                        NodeFailure::timeout("quorum", "extend on a quorum of nodes")
                    })),
                );
            }
        }
    }

    /// Releases on every node. Returns once the outcome is settled (a quorum said "ours" or
    /// "not ours"), while the remaining nodes finish in the background, so a frozen or dead
    /// minority never makes the caller wait. With `wake`, every node announces it: waiters listen
    /// at the gate, and at the others when the gate does not confirm (see `watch`).
    ///
    /// A node's part that may have run unseen (no answer in time, a broken connection) is sent
    /// again in the background until the node answers (see
    /// [`RELEASE_RETRIES_FOR`]), whatever the quorum decided: a copy left on a node, the gate
    /// above all, refuses the waiters that ask it until its ttl and announces nothing; and a
    /// release that ran there unseen (its answer lost on the way back) woke nobody when it was
    /// the server's own compare-and-delete, whose wake-up follows its answer. The retry goes by
    /// script (a node that timed out forgets its native commands), which wakes the waiters when
    /// it finds the lock free and marked waited for.
    pub(crate) async fn release(
        &self,
        names: &Names,
        token: &Token,
        mode: Mode,
        wake: bool,
    ) -> Result<bool, Vec<NodeFailure>> {
        let retry = Some(RELEASE_RETRIES_FOR);
        self.on_every_node(names, token, retry, move |node, names, token| async move {
            node.release_here(&names, &token, mode, wake).await
        })
        .await
    }

    /// [`Node::keep`] on every node, settled as [`release`](Self::release) is: the keys then
    /// expire `left` from now on a quorum (each node counts from when it ran the call).
    pub(crate) async fn keep(
        &self,
        names: &Names,
        token: &Token,
        left: Duration,
    ) -> Result<bool, Vec<NodeFailure>> {
        // Not retried: a keep sent again later would set the expiry from then on.
        self.on_every_node(names, token, None, move |node, names, token| async move {
            node.keep(&names, &token, left).await
        })
        .await
    }

    /// Runs `call` (one request that answers whether all the keys were ours) on every node, each
    /// in its own task, and returns once a quorum said "ours" or "not ours". With `retry`, a
    /// node's part that may have run unseen is sent again in the background, pausing 50 ms
    /// doubling to a second, for up to that long. Not one that was refused: it never reached
    /// the node, which is down (a node that comes back with its data keeps the copy until its
    /// ttl, one pause of a gated waiter's), and a retry per release for as long as a node is
    /// down is a load its minority should not cost.
    async fn on_every_node<F>(
        &self,
        names: &Names,
        token: &Token,
        retry: Option<Duration>,
        call: impl Fn(Arc<RedisNode>, Names, Token) -> F + Clone + Send + 'static,
    ) -> Result<bool, Vec<NodeFailure>>
    where
        F: Future<Output = Result<bool, NodeFailure>> + Send + 'static,
    {
        let (tx, mut replies) = mpsc::unbounded_channel();
        // Each node's part completes even if nobody waits (see `Fanout`).
        let mut parts = Fanout::new(&self.tasks, self.nodes.len());
        for (node, step) in self.nodes.iter().zip(self.begin(token)) {
            let (call, node) = (call.clone(), Arc::clone(node));
            let (names, token) = (Arc::clone(names), token.clone());
            let tx = tx.clone();
            parts.push(async move {
                let send = move || call(Arc::clone(&node), Arc::clone(&names), token.clone());
                step.after_previous().await;
                let reply = send().await;
                let unseen = reply.as_ref().is_err_and(|f| f.kind.may_have_applied());
                if let Err(failure) = &reply {
                    step.mark_failed(failure);
                }
                let _ = tx.send(reply);
                if let Some(give_up_after) = retry.filter(|_| unseen) {
                    retry_part(give_up_after, send).await;
                }
                drop(step);
            });
        }
        drop(tx);
        let n = self.nodes.len();
        let (mut ours, mut not_ours) = (0, 0);
        let mut failures = Vec::new();
        while let Some(reply) = parts.next(&mut replies).await {
            match reply {
                Ok(true) => ours += 1,
                Ok(false) => not_ours += 1,
                Err(f) => failures.push(f),
            }
            if ours >= self.quorum {
                parts.decided();
                return Ok(true);
            }
            if n - not_ours < self.quorum {
                parts.decided();
                return Ok(false);
            }
        }
        // Too many nodes failed to tell whether a quorum still held the lock.
        Err(failures)
    }

    /// Every node, in config order.
    pub(crate) fn nodes(&self) -> Vec<Arc<dyn Node>> {
        self.nodes
            .iter()
            .map(|node| Arc::clone(node) as Arc<dyn Node>)
            .collect()
    }

    /// Resolves once every node's part of every operation started so far has ended.
    pub(crate) async fn settled(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Subscribes to `name`'s releases on the gate node of the lock's first key `first` alone:
    /// every attempt of a contended lock asks that node first, so a release is worth waking for
    /// once that node has it (it is announced by every node). Listening at `name`'s own gate
    /// lost wake-ups of locks over several keys: woken by the release at that node, a waiter
    /// asked its lock's gate before the release had landed there, was refused, and heard nothing
    /// more.
    ///
    /// Listening on every node woke each waiter once per node that released, and a waiter woken
    /// by another node's message asked the gate before the gate's own release had landed, was
    /// refused, and asked again: more attempts on the gate per hand-off than one per waiter, plus a
    /// subscription and an unsubscription on every node per wait (measured by `peer-bench` C8;
    /// the figures are in the README's table).
    ///
    /// A gate that does not confirm (down, frozen) is replaced by
    /// [`watch_others`](Self::watch_others); one that goes down after confirming misses the
    /// releases meanwhile, which the waiter then finds by its next attempt, on its backoff (at
    /// most a third of the lock's ttl).
    pub(crate) fn watch(&self, name: &str, first: &str, own: Option<u64>) -> Watch {
        let gate = gate_of(first, self.nodes.len());
        Watch {
            subscriptions: vec![self.nodes[gate].watch(name, own)],
            needed: 1,
        }
    }

    /// See [`Node::tells_waiters_alone`]: whether the nodes (the gate of a fair waiter among
    /// them) do.
    pub(crate) fn tells_waiters_alone(&self) -> bool {
        self.nodes.iter().all(|node| node.tells_waiters_alone())
    }

    /// Subscribes on every node but the gate of `first`, for a waiter whose gate did not confirm.
    /// A quorum of confirmations is enough: a release that succeeded reached a quorum of nodes,
    /// and any two quorums share one.
    pub(crate) fn watch_others(&self, name: &str, first: &str, own: Option<u64>) -> Watch {
        let gate = gate_of(first, self.nodes.len());
        let subscriptions = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != gate)
            .map(|(_, node)| node.watch(name, own))
            .collect();
        Watch {
            subscriptions,
            needed: self.quorum,
        }
    }
}
