//! A model of Redlock as `lock-runtime` runs it (`backend/redlock`): a plain lock over N
//! independent nodes, granted by a majority, with the parts of a call that the decision no
//! longer waits for still running to their end, checked exhaustively like the single-node model.
//!
//! # What is modelled, and the code each action follows
//!
//! - **Nodes**: each holds the lock key (its holder's token and expiry) or not. A request is one
//!   atomic step of its node ([`Action::Run`]), any time after it was sent: requests from one
//!   client to one node run in the order sent (`fanout.rs`'s `NodeStep`: one token's operations
//!   reach each node in order), and nothing else orders them (a slow or frozen node runs them
//!   late).
//! - **An attempt** (`Quorum::acquire`): `SET NX PX` to every node at once, with the client's
//!   token, the same across the attempts of one call. The client counts the answers as they come
//!   ([`Action::Deliver`]); a node it stops waiting for ([`Action::TimeOut`]: the request may
//!   still run) counts as failed. It decides as soon as a majority granted it (granted, valid
//!   until the attempt's start plus the ttl: `ttl - elapsed`, drift left out) or a majority can
//!   no longer be won (refused).
//! - **The gate** (with [`RedlockConfig::gate`]; `gate.rs`, node 0 here): once a client found
//!   the lock held (`Memory::contended_recently`), its attempts ask the gate first, and the
//!   other nodes only once the gate granted; the gate's "held" is the answer (the others are not
//!   asked), but for a waiter whose pause ran out (no release heard) and whose last refusal was
//!   a hold by the same copy on the gate (`Memory::looks_past_the_gate`: a copy is its holder
//!   and expiry): it asks the others too, and the majority decides. A gate that does not answer
//!   within its patience ([`Action::TimeOut`] on it, `GATE_PATIENCE`) is not waited for: the
//!   others are asked, and its answer counts when it comes. A refused waiter remembers its
//!   refusal (by a holder or a split vote, and the copy on the gate that refused it) and pauses;
//!   a client that found the lock held listens at the gate, whose release of a key announces it
//!   ([`Action::Read`]: the pause ends, heard); a pause ends otherwise by running out (the
//!   subscription's confirmation, which ends a first pause early without a pause run out, is
//!   left out).
//! - **After the decision** (`acquire_on`): a won lock is placed on each node that refused it
//!   (`place_after_a_split`: one more `SET NX PX`, which finds the node free once the contender
//!   withdrew); a lost attempt is withdrawn from every node that granted it or did not answer
//!   (compare-and-delete, queued behind the attempt's own request there, so it never overtakes
//!   it), quietly (a split vote's contenders retry after a short pause: an announcement would
//!   wake them into a busy loop). The client pauses, then asks again ([`Action::Attempt`]).
//! - **The release** (`Quorum::release`): compare-and-delete on every node, announced. With
//!   [`RedlockConfig::failures`], a node's part may fail ([`Action::Fail`]: a reset connection,
//!   not run); the release's part that failed is retried in the background after a majority
//!   decided it, until the node answers, so it is a part still on its way, which the model has
//!   already (`mutation-redlock-release-no-retry`: dropped for good).
//! - **Time** ([`Action::Tick`]) and expiry as in the single-node model (an expired key is
//!   dropped at each tick, so that it makes no state of its own); a node's clock step
//!   ([`Action::Forget`], only with [`RedlockConfig::clock_step`]) expires its key early, once
//!   in a run: a step ahead, or the return of a step back for a key set during it.
//!
//! # Properties
//!
//! - **one holder**: never two clients in their sections with valid leases;
//! - **holder holds**: a client in its section holds the key on a majority of nodes.
//!
//! Both hold without clock steps. With one (`clock_step`), "one holder" fails: a grant that won
//! only a bare majority (a contender held the other nodes when it asked, and had not withdrawn
//! when the lock was placed on them) loses one of its nodes, and the contender's next attempt
//! wins that node and the others. That is Redlock's clock assumption, the documented limit the
//! fault campaign's checker allows (`tests/redlock.rs` requires the checker to find it).
//!
//! Two more, each only where it is at stake (the checker explores on until every property has
//! failed, and the clock step's test stops at its two):
//! - **a released copy goes** (with failures): a copy of a released lock stays on a node only
//!   while the release's part there is on its way. With the retry, a release reaches every node
//!   (a bounded checker cannot wait for it; this is the step it rests on: the part is never
//!   dropped, so it runs once the node answers).
//! - **a stale gate copy holds a waiter up one pause at most** (with the gate): a waiter is never
//!   refused by the gate alone, after a pause that ran out, by the same copy that refused it
//!   before, once that copy's holder let go and a majority confirmed it (a release whose part on
//!   the gate failed leaves the copy there, and the gate announces nothing). The promise, in
//!   time: one announced pause (`Backoff::longest_announced`, 8 x `retry_delay` x (1 +
//!   `retry_jitter`)), after which the waiter asks the other nodes; and the retried part
//!   deletes the copy as soon as the gate answers again.
//!
//! Not modelled: renewal, fencing, several keys, fair locks' lines, the gate's replacement by
//! the others' subscriptions when it does not confirm (`watch_others`), the wake-up of a
//! withdrawal whose answer was lost (the single-node model checks the cleanup's), and lost or
//! delayed answers other than a timeout.
//!
//! # Mutations
//!
//! `mutation-redlock-unordered`: a client's requests to a node run in any order. A withdrawal of
//! a lost attempt can then run after the same token's next attempt was granted there, and
//! deletes it (the token matches); the holder counts a node it no longer has.
//! `mutation-redlock-release-no-retry`: a release's part that failed is not sent again once a
//! majority decided, as it was; "a released copy goes" fails (the copy stays until its ttl).
//! `mutation-gate-pause-unbounded`: a waiter never looks past the gate; "a stale gate copy
//! holds a waiter up one pause at most" fails (it is held up for as many pauses as the copy
//! lives).

use stateright::{Model, Property};

use crate::Client;

/// The sizes of one check.
#[derive(Clone, Copy, Debug)]
pub struct RedlockConfig {
    /// Clients, each acquiring once (in as many attempts as it takes), then releasing.
    pub clients: u8,
    /// Nodes (a majority grants the lock).
    pub nodes: u8,
    /// The last tick: every path ends there.
    pub max_time: u8,
    /// The lock's ttl, in ticks.
    pub ttl: u8,
    /// Attempts per client at most.
    pub attempts: u8,
    /// Whether a client may stop waiting for a node (a timeout: the request may still run).
    pub timeouts: bool,
    /// Whether one node's clock may step once (its key expires early).
    pub clock_step: bool,
    /// Whether a waiter's attempts go through the gate (node 0) once it found the lock held,
    /// and it listens there for releases.
    pub gate: bool,
    /// Whether a release's part on a node may fail (a reset connection: not run).
    pub failures: bool,
}

impl RedlockConfig {
    fn quorum(&self) -> u8 {
        self.nodes / 2 + 1
    }
}

/// The gate node of the model's one lock (`gate_of`: any node, the same for every client).
const GATE: u8 = 0;

/// What a request asks of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// `SET NX PX` for attempt `attempt` (its answer counts while the client waits for it).
    Acquire { attempt: u8 },
    /// `SET NX PX` after a won decision, on a node that refused (no answer needed).
    Place,
    /// Compare-and-delete: a lost attempt's withdrawal, or the `release` (announced: the waiters
    /// at the gate hear it there).
    Delete { release: bool },
}

/// A copy of the lock on a node: its holder and when it expires.
pub type LockCopy = (Client, u8);

/// A node's answer to an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Answer {
    pub client: Client,
    pub node: u8,
    pub attempt: u8,
    pub granted: bool,
    /// The copy that refused it, with the gate (`None` otherwise: nothing reads it).
    pub copy: Option<LockCopy>,
}

/// Where a client is in its one acquisition. Node sets are bit masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not asked yet, or between attempts.
    Idle,
    /// Attempt `attempt`, sent at `sent_at`: the nodes that granted it, refused it, or failed
    /// (timed out); `gate_only`: only the gate was asked yet; `gate_copy`: the copy on the gate
    /// that refused it.
    Asking {
        attempt: u8,
        sent_at: u8,
        won: u8,
        refused: u8,
        failed: u8,
        gate_only: bool,
        gate_copy: Option<LockCopy>,
    },
    /// In its section until `valid_until`.
    Holding {
        valid_until: u8,
    },
    Done,
}

/// What a client remembers of the lock (`gate.rs`'s `Memory`), with the gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Memory {
    /// It found the lock held: its attempts take the gate, and it listens there.
    pub contended: bool,
    /// Its last refusal: whether by a holder (not a split vote), and the copy on the gate that
    /// refused it too, if the gate did.
    pub refusal: Option<(bool, Option<LockCopy>)>,
    /// Its pause ended without a release heard (it ran out).
    pub ran_out: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RedlockState {
    pub now: u8,
    /// Per node: the key's holder and expiry.
    pub keys: Vec<Option<(Client, u8)>>,
    pub clients: Vec<Phase>,
    /// Per client, its attempts so far.
    pub attempts: Vec<u8>,
    /// Per client and node (client-major), the requests sent and not run yet, oldest first.
    pub links: Vec<Vec<Ask>>,
    /// Answers on their way, sorted (their order means nothing: any may come first).
    pub answers: Vec<Answer>,
    /// Whether a node's clock stepped already.
    pub stepped: bool,
    /// Per client, with the gate.
    pub memory: Vec<Memory>,
    /// The gate's release announcements on their way, one per waiter (sorted).
    pub messages: Vec<Client>,
    /// A waiter was refused by the gate alone, after a pause that ran out, by the same copy as
    /// before, whose holder let it go.
    pub held_up: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// An idle client sends its next attempt to every node (to the gate first, once it found
    /// the lock held).
    Attempt(Client),
    /// A node runs the client's oldest request to it (any of them, with the mutation).
    Run {
        client: Client,
        node: u8,
        index: usize,
    },
    Deliver(usize),
    /// The client stops waiting for `node`'s answer: failed, the outcome unknown (the gate's,
    /// while only the gate was asked: its patience ran out).
    TimeOut {
        client: Client,
        node: u8,
    },
    Release(Client),
    /// `node`'s clock steps: its key expires now.
    Forget(u8),
    /// A waiter's pause ends: it hears the release announced to it.
    Read(usize),
    /// A release's part on `node` fails (not run): retried after the decision.
    Fail {
        client: Client,
        node: u8,
    },
}

/// The model: a [`RedlockConfig`].
#[derive(Clone, Debug)]
pub struct Redlock(pub RedlockConfig);

fn count(mask: u8) -> u8 {
    // At most 8 nodes: the count fits.
    mask.count_ones() as u8
}

impl Redlock {
    fn link(&self, client: Client, node: u8) -> usize {
        usize::from(client) * usize::from(self.0.nodes) + usize::from(node)
    }

    fn send(&self, state: &mut RedlockState, client: Client, node: u8, ask: Ask) {
        let link = self.link(client, node);
        state.links[link].push(ask);
    }

    /// Sends attempt `attempt` of `client` to every node but the gate.
    fn ask_the_others(&self, state: &mut RedlockState, client: Client, attempt: u8) {
        for node in (0..self.0.nodes).filter(|n| *n != GATE) {
            self.send(state, client, node, Ask::Acquire { attempt });
        }
    }

    fn run(&self, state: &mut RedlockState, c: Client, node: u8, ask: Ask) {
        let now = state.now;
        let key = &mut state.keys[usize::from(node)];
        if key.is_some_and(|(_, until)| until <= now) {
            *key = None;
        }
        match ask {
            Ask::Acquire { attempt } => {
                let granted = key.is_none_or(|(holder, _)| holder == c);
                let copy = if granted {
                    *key = Some((c, now + self.0.ttl));
                    None
                } else {
                    (*key).filter(|_| self.0.gate)
                };
                let awaited = matches!(
                    state.clients[usize::from(c)],
                    Phase::Asking { attempt: a, failed, .. }
                        if a == attempt && failed & (1 << node) == 0
                );
                if awaited {
                    state.answers.push(Answer {
                        client: c,
                        node,
                        attempt,
                        granted,
                        copy,
                    });
                    state
                        .answers
                        .sort_unstable_by_key(|a| (a.client, a.node, a.attempt, a.granted, a.copy));
                }
            }
            Ask::Place => {
                if key.is_none() {
                    *key = Some((c, now + self.0.ttl));
                }
            }
            Ask::Delete { release } => {
                if key.is_some_and(|(holder, _)| holder == c) {
                    *key = None;
                    if release && node == GATE {
                        // `EXCLUSIVE_RELEASE`'s wake-up, heard by the waiters listening at the
                        // gate.
                        for (w, memory) in state.memory.iter().enumerate() {
                            let waiting =
                                matches!(state.clients[w], Phase::Idle | Phase::Asking { .. });
                            if memory.contended && waiting {
                                state.messages.push(w as Client);
                            }
                        }
                        state.messages.sort_unstable();
                    }
                }
            }
        }
    }

    /// Takes the decision of `client`'s attempt once it is settled.
    fn decide(&self, state: &mut RedlockState, client: Client) {
        let Phase::Asking {
            sent_at,
            won,
            refused,
            failed,
            gate_copy,
            ..
        } = state.clients[usize::from(client)]
        else {
            return;
        };
        let nodes = self.0.nodes;
        let quorum = self.0.quorum();
        let all = (1u8 << nodes) - 1;
        let unanswered = all & !(won | refused | failed);
        if count(won) >= quorum && sent_at + self.0.ttl > state.now {
            state.clients[usize::from(client)] = Phase::Holding {
                valid_until: sent_at + self.0.ttl,
            };
            state.messages.retain(|w| *w != client);
            // The nodes that refused: place the lock there too (`place_after_a_split`). The
            // unanswered ones place it by their own request.
            for node in (0..nodes).filter(|n| refused & (1 << n) != 0) {
                self.send(state, client, node, Ask::Place);
            }
        } else if count(won) >= quorum || nodes - count(refused | failed) < quorum {
            // Lost (or won too late): withdraw wherever it may have been granted, quietly (the
            // contenders after a split vote retry after a short pause; an announcement would
            // wake them into a busy loop).
            if count(failed) > nodes - quorum {
                // Unavailable, not refused: the waiter sleeps its backoff, and remembers no
                // refusal.
                state.clients[usize::from(client)] = Phase::Idle;
                state.memory[usize::from(client)].ran_out = false;
            } else {
                self.refused(state, client, count(won) == 0, gate_copy);
            }
            for node in (0..nodes).filter(|n| (won | failed | unanswered) & (1 << n) != 0) {
                self.send(state, client, node, Ask::Delete { release: false });
            }
        }
    }

    /// A waiter's attempt was refused (`Memory::refused`): by a holder, or a split vote
    /// (`held` false), and by `gate`, the copy on the gate; it pauses.
    fn refused(&self, state: &mut RedlockState, c: Client, held: bool, gate: Option<LockCopy>) {
        state.clients[usize::from(c)] = Phase::Idle;
        if self.0.gate {
            let memory = &mut state.memory[usize::from(c)];
            memory.contended = true;
            memory.refusal = Some((held, gate));
            memory.ran_out = true;
        }
    }

    /// The gate answered a gated attempt: granted, the others are asked; refused, the
    /// refusal is the answer, unless the waiter's pause ran out behind the same copy
    /// (`Memory::looks_past_the_gate`): then the others are asked too, and the majority decides.
    fn gate_answered(
        &self,
        state: &mut RedlockState,
        c: Client,
        attempt: u8,
        copy: Option<LockCopy>,
    ) {
        let memory = state.memory[usize::from(c)];
        let behind_it = memory.ran_out && memory.refusal == Some((true, copy));
        let past = behind_it && !cfg!(feature = "mutation-gate-pause-unbounded");
        if let Some((holder, _)) = copy.filter(|_| !past) {
            // Stale: its holder let go, and a majority confirmed it (the release was decided).
            let now = state.now;
            let copies = state
                .keys
                .iter()
                .filter(|k| k.is_some_and(|(h, until)| h == holder && until > now))
                .count();
            let released = state.clients[usize::from(holder)] == Phase::Done
                && copies < usize::from(self.0.quorum());
            state.held_up |= behind_it && released;
            return self.refused(state, c, true, copy);
        }
        if let Phase::Asking {
            gate_only,
            gate_copy,
            refused,
            won,
            ..
        } = &mut state.clients[usize::from(c)]
        {
            *gate_only = false;
            *gate_copy = copy;
            match copy {
                Some(_) => *refused |= 1 << GATE,
                None => *won |= 1 << GATE,
            }
        }
        self.ask_the_others(state, c, attempt);
        self.decide(state, c);
    }
}

impl Model for Redlock {
    type State = RedlockState;
    type Action = Action;

    fn init_states(&self) -> Vec<RedlockState> {
        let clients = usize::from(self.0.clients);
        vec![RedlockState {
            now: 0,
            keys: vec![None; usize::from(self.0.nodes)],
            clients: vec![Phase::Idle; clients],
            attempts: vec![0; clients],
            links: vec![Vec::new(); clients * usize::from(self.0.nodes)],
            answers: Vec::new(),
            stepped: false,
            memory: vec![Memory::default(); clients],
            messages: Vec::new(),
            held_up: false,
        }]
    }

    fn actions(&self, state: &RedlockState, actions: &mut Vec<Action>) {
        if state.now < self.0.max_time {
            actions.push(Action::Tick);
        }
        for (i, phase) in state.clients.iter().enumerate() {
            let c = i as Client;
            match *phase {
                // At most one attempt per tick each (a pause between attempts).
                Phase::Idle if state.attempts[i] <= state.now => actions.push(Action::Attempt(c)),
                Phase::Asking {
                    gate_only: true, ..
                } if self.0.timeouts => actions.push(Action::TimeOut {
                    client: c,
                    node: GATE,
                }),
                Phase::Asking {
                    won,
                    refused,
                    failed,
                    ..
                } if self.0.timeouts => {
                    for node in 0..self.0.nodes {
                        if (won | refused | failed) & (1 << node) == 0 {
                            actions.push(Action::TimeOut { client: c, node });
                        }
                    }
                }
                Phase::Holding { .. } => actions.push(Action::Release(c)),
                Phase::Idle | Phase::Asking { .. } | Phase::Done => {}
            }
        }
        // Per client and node, the oldest request (any, with the mutation).
        for (link, asks) in state.links.iter().enumerate() {
            let nodes = usize::from(self.0.nodes);
            let (client, node) = ((link / nodes) as Client, (link % nodes) as u8);
            let runnable = if cfg!(feature = "mutation-redlock-unordered") {
                asks.len()
            } else {
                asks.len().min(1)
            };
            for index in 0..runnable {
                actions.push(Action::Run {
                    client,
                    node,
                    index,
                });
            }
            if self.0.failures && asks.first() == Some(&Ask::Delete { release: true }) {
                actions.push(Action::Fail { client, node });
            }
        }
        for i in 0..state.answers.len() {
            actions.push(Action::Deliver(i));
        }
        if self.0.clock_step && !state.stepped {
            for node in 0..self.0.nodes {
                if state.keys[usize::from(node)].is_some() {
                    actions.push(Action::Forget(node));
                }
            }
        }
        for (i, waiter) in state.messages.iter().enumerate() {
            if state.clients[usize::from(*waiter)] == Phase::Idle {
                actions.push(Action::Read(i));
            }
        }
    }

    fn next_state(&self, last: &RedlockState, action: Action) -> Option<RedlockState> {
        let mut state = last.clone();
        match action {
            Action::Tick => {
                state.now += 1;
                // An expired key is as good as gone (Redis never answers it): one state for both.
                let now = state.now;
                for key in &mut state.keys {
                    if key.is_some_and(|(_, until)| until <= now) {
                        *key = None;
                    }
                }
            }
            Action::Attempt(c) => {
                let i = usize::from(c);
                state.attempts[i] += 1;
                let attempt = state.attempts[i];
                let gated = self.0.nodes > 1 && state.memory[i].contended;
                state.clients[i] = Phase::Asking {
                    attempt,
                    sent_at: state.now,
                    won: 0,
                    refused: 0,
                    failed: 0,
                    gate_only: gated,
                    gate_copy: None,
                };
                self.send(&mut state, c, GATE, Ask::Acquire { attempt });
                if !gated {
                    self.ask_the_others(&mut state, c, attempt);
                }
            }
            Action::Run {
                client,
                node,
                index,
            } => {
                let link = self.link(client, node);
                let ask = state.links[link].remove(index);
                self.run(&mut state, client, node, ask);
            }
            Action::Deliver(i) => {
                let answer = state.answers.remove(i);
                let c = answer.client;
                let Phase::Asking {
                    attempt,
                    ref mut won,
                    ref mut refused,
                    ref mut gate_copy,
                    failed,
                    gate_only,
                    ..
                } = state.clients[usize::from(c)]
                else {
                    // Decided already: a won lock keeps the grant, a lost one withdraws it
                    // (queued when it was decided).
                    return Some(state);
                };
                if attempt != answer.attempt || failed & (1 << answer.node) != 0 {
                    return Some(state);
                }
                if gate_only {
                    self.gate_answered(&mut state, c, attempt, answer.copy);
                    return Some(state);
                }
                if answer.granted {
                    *won |= 1 << answer.node;
                } else {
                    *refused |= 1 << answer.node;
                    if answer.node == GATE {
                        *gate_copy = answer.copy;
                    }
                }
                self.decide(&mut state, c);
            }
            Action::TimeOut { client, node } => {
                let Phase::Asking {
                    attempt,
                    ref mut failed,
                    ref mut gate_only,
                    ..
                } = state.clients[usize::from(client)]
                else {
                    return None;
                };
                if *gate_only {
                    // The gate's patience (`GATE_PATIENCE`): the others are asked, and its
                    // answer counts when it comes.
                    *gate_only = false;
                    self.ask_the_others(&mut state, client, attempt);
                    return Some(state);
                }
                *failed |= 1 << node;
                state
                    .answers
                    .retain(|a| !(a.client == client && a.node == node));
                self.decide(&mut state, client);
            }
            Action::Release(c) => {
                state.clients[usize::from(c)] = Phase::Done;
                state.messages.retain(|w| *w != c);
                for node in 0..self.0.nodes {
                    self.send(&mut state, c, node, Ask::Delete { release: true });
                }
            }
            Action::Forget(node) => {
                state.keys[usize::from(node)] = None;
                state.stepped = true;
            }
            Action::Read(i) => {
                let waiter = state.messages.remove(i);
                state.memory[usize::from(waiter)].ran_out = false;
            }
            Action::Fail { client, node } => {
                // Retried in the background after the release's decision (a part of it that
                // failed is sent again until the node answers): still on its way.
                if cfg!(feature = "mutation-redlock-release-no-retry") {
                    state.links[self.link(client, node)].remove(0);
                } else {
                    return None;
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("one holder", |_, state: &RedlockState| {
                state
                    .clients
                    .iter()
                    .filter(|p| in_section(p, state.now))
                    .count()
                    <= 1
            }),
            Property::always("holder holds", |model: &Redlock, state: &RedlockState| {
                state.clients.iter().enumerate().all(|(i, p)| {
                    let held = state
                        .keys
                        .iter()
                        .filter(|k| {
                            k.is_some_and(|(holder, until)| {
                                usize::from(holder) == i && until > state.now
                            })
                        })
                        .count();
                    !in_section(p, state.now) || held >= usize::from(model.0.quorum())
                })
            }),
        ];
        // Only where they are at stake: the checker explores on until every property it has
        // failed (the clock step's test stops at its two).
        if self.0.failures {
            properties.push(Property::always(
                "a released copy goes",
                |model: &Redlock, state: &RedlockState| {
                    state.keys.iter().enumerate().all(|(node, key)| {
                        key.is_none_or(|(holder, until)| {
                            let link = model.link(holder, node as u8);
                            until <= state.now
                                || state.clients[usize::from(holder)] != Phase::Done
                                || !state.links[link].is_empty()
                        })
                    })
                },
            ));
        }
        if self.0.gate {
            properties.push(Property::always(
                "a stale gate copy holds a waiter up one pause at most",
                |_, state: &RedlockState| !state.held_up,
            ));
        }
        properties
    }

    fn within_boundary(&self, state: &RedlockState) -> bool {
        state.attempts.iter().all(|&a| a <= self.0.attempts)
    }
}

/// Whether a client is in its section with a valid lease.
fn in_section(phase: &Phase, now: u8) -> bool {
    matches!(*phase, Phase::Holding { valid_until } if valid_until > now)
}
