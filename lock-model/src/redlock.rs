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
//! - **After the decision** (`acquire_on`): a won lock is placed on each node that refused it
//!   (`place_after_a_split`: one more `SET NX PX`, which finds the node free once the contender
//!   withdrew); a lost attempt is withdrawn from every node that granted it or did not answer
//!   (compare-and-delete, queued behind the attempt's own request there, so it never overtakes
//!   it). The client pauses, then asks again ([`Action::Attempt`]).
//! - **The release** (`Quorum::release`): compare-and-delete on every node.
//! - **Time** ([`Action::Tick`]) and expiry as in the single-node model; a node's clock step
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
//! Not modelled: the gate (a waiter's attempts ask one node first), waiting for releases
//! (waiters here poll), renewal, fencing, several keys, and lost or delayed answers other than a
//! timeout.
//!
//! # Mutation
//!
//! `mutation-redlock-unordered`: a client's requests to a node run in any order. A withdrawal of
//! a lost attempt can then run after the same token's next attempt was granted there, and
//! deletes it (the token matches); the holder counts a node it no longer has.

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
}

impl RedlockConfig {
    fn quorum(&self) -> u8 {
        self.nodes / 2 + 1
    }
}

/// What a request asks of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// `SET NX PX` for attempt `attempt` (its answer counts while the client waits for it).
    Acquire { attempt: u8 },
    /// `SET NX PX` after a won decision, on a node that refused (no answer needed).
    Place,
    /// Compare-and-delete: a lost attempt's withdrawal, or the release.
    Delete,
}

/// A node's answer to an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Answer {
    pub client: Client,
    pub node: u8,
    pub attempt: u8,
    pub granted: bool,
}

/// Where a client is in its one acquisition. Node sets are bit masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not asked yet, or between attempts.
    Idle,
    /// Attempt `attempt`, sent at `sent_at`: the nodes that granted it, refused it, or failed
    /// (timed out).
    Asking {
        attempt: u8,
        sent_at: u8,
        won: u8,
        refused: u8,
        failed: u8,
    },
    /// In its section until `valid_until`.
    Holding {
        valid_until: u8,
    },
    Done,
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
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// An idle client sends its next attempt to every node.
    Attempt(Client),
    /// A node runs the client's oldest request to it (any of them, with the mutation).
    Run {
        client: Client,
        node: u8,
        index: usize,
    },
    Deliver(usize),
    /// The client stops waiting for `node`'s answer: failed, the outcome unknown.
    TimeOut {
        client: Client,
        node: u8,
    },
    Release(Client),
    /// `node`'s clock steps: its key expires now.
    Forget(u8),
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

    fn run(&self, state: &mut RedlockState, c: Client, node: u8, ask: Ask) {
        let now = state.now;
        let key = &mut state.keys[usize::from(node)];
        if key.is_some_and(|(_, until)| until <= now) {
            *key = None;
        }
        match ask {
            Ask::Acquire { attempt } => {
                let granted = key.is_none_or(|(holder, _)| holder == c);
                if granted {
                    *key = Some((c, now + self.0.ttl));
                }
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
                    });
                    state
                        .answers
                        .sort_unstable_by_key(|a| (a.client, a.node, a.attempt, a.granted));
                }
            }
            Ask::Place => {
                if key.is_none() {
                    *key = Some((c, now + self.0.ttl));
                }
            }
            Ask::Delete => {
                if key.is_some_and(|(holder, _)| holder == c) {
                    *key = None;
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
            // The nodes that refused: place the lock there too (`place_after_a_split`). The
            // unanswered ones place it by their own request.
            for node in (0..nodes).filter(|n| refused & (1 << n) != 0) {
                self.send(state, client, node, Ask::Place);
            }
        } else if count(won) >= quorum || nodes - count(refused | failed) < quorum {
            // Lost (or won too late): withdraw wherever it may have been granted.
            state.clients[usize::from(client)] = Phase::Idle;
            for node in (0..nodes).filter(|n| (won | failed | unanswered) & (1 << n) != 0) {
                self.send(state, client, node, Ask::Delete);
            }
        }
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
    }

    fn next_state(&self, last: &RedlockState, action: Action) -> Option<RedlockState> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.now += 1,
            Action::Attempt(c) => {
                let i = usize::from(c);
                state.attempts[i] += 1;
                let attempt = state.attempts[i];
                state.clients[i] = Phase::Asking {
                    attempt,
                    sent_at: state.now,
                    won: 0,
                    refused: 0,
                    failed: 0,
                };
                for node in 0..self.0.nodes {
                    self.send(&mut state, c, node, Ask::Acquire { attempt });
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
                    failed,
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
                if answer.granted {
                    *won |= 1 << answer.node;
                } else {
                    *refused |= 1 << answer.node;
                }
                self.decide(&mut state, c);
            }
            Action::TimeOut { client, node } => {
                if let Phase::Asking { ref mut failed, .. } = state.clients[usize::from(client)] {
                    *failed |= 1 << node;
                }
                state
                    .answers
                    .retain(|a| !(a.client == client && a.node == node));
                self.decide(&mut state, client);
            }
            Action::Release(c) => {
                state.clients[usize::from(c)] = Phase::Done;
                for node in 0..self.0.nodes {
                    self.send(&mut state, c, node, Ask::Delete);
                }
            }
            Action::Forget(node) => {
                state.keys[usize::from(node)] = None;
                state.stepped = true;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
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
        ]
    }

    fn within_boundary(&self, state: &RedlockState) -> bool {
        state.attempts.iter().all(|&a| a <= self.0.attempts)
    }
}

/// Whether a client is in its section with a valid lease.
fn in_section(phase: &Phase, now: u8) -> bool {
    matches!(*phase, Phase::Holding { valid_until } if valid_until > now)
}
