//! A model of the waiting protocol of one Redis node, as `lock-runtime` runs it for a default
//! (exclusive) lock whose waiters queue once they starve, and for a fair lock: the lock key, its
//! line of waiters (a place per waiter, with a ticket and a lease), the hand-off of a released lock
//! to the first place and the message that tells its waiter, checked exhaustively with
//! [stateright](https://docs.rs/stateright) over every interleaving of a small configuration.
//!
//! What is modelled, each script or command one atomic step of the server:
//! - **Time**: one clock, in ticks, which any step may advance (a client paused between two of its
//!   steps is a client whose steps are not taken while time passes). A key or a place expires at
//!   its deadline (Redis never answers an expired key).
//! - **Requests**: a client's requests run in the order sent (one connection), but any time
//!   after they are sent; an answer may come late, or never (the client then times out, the
//!   outcome unknown, and asks again with the same token: the first request may still run).
//! - **The acquire script** (`scripts::FAIR_ACQUIRE`, `EXCLUSIVE_ACQUIRE`'s queue): granted when
//!   free and the caller is first in line (or the line is empty) or when the key already holds
//!   its token; otherwise the caller, when it queues, takes a place (ticket: the server's clock)
//!   or renews its place's lease, keeping its ticket.
//! - **The release script** (`HAND_TO_HEAD`): deletes the key when the caller holds it, leaves the
//!   line, and hands a free lock to the first live place: the key is set to that waiter's token
//!   for what is left of the place's lease, the fence counts on, and a message names the place's
//!   ticket and the fence. Messages may be delayed, lost or delivered twice.
//! - **The client** (`acquire.rs`): the validity of a grant is its attempt's start plus the ttl;
//!   a message is a grant only when it names the place (ticket) that the client's last answer
//!   renewed, valid until that answer's attempt's start plus the place's lease; after a request of
//!   unknown outcome it does not queue until an answer proves that request ran.
//!
//! Properties (checked on every reachable state):
//! - **one holder**: never two clients in their sections with valid leases (the documented
//!   assumption: a holder is not paused past its own validity, so a holder past it is not in its
//!   section);
//! - **holder holds**: a client in its section with a valid lease holds the key on the server;
//! - **tokens grow**: each grant's fencing token is larger than every earlier grant's.
//!
//! Not modelled: renewal of a held lock (a holder's section ends by its release or its validity),
//! the pub/sub subscription itself (a waiter that is not told polls: its attempts are its polls),
//! several nodes (Redlock), replication (Sentinel, Cluster: hand-offs are not taken as grants
//! there), and liveness (the bounded clock ends every path; see the crate's tests).

use stateright::{Model, Property};

/// A client's index.
pub type Client = u8;

/// The sizes of one check.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Clients, each acquiring once, then releasing.
    pub clients: u8,
    /// The last tick: every path ends there.
    pub max_time: u8,
    /// The lock's ttl, in ticks.
    pub ttl: u8,
    /// A place's lease, in ticks (at most the ttl: a default lock's starving waiter's 3 s).
    pub lease: u8,
    /// Whether answers may be lost (a timeout, the outcome unknown).
    pub lose_answers: bool,
    /// Whether hand-off messages may be lost or delivered twice.
    pub lose_messages: bool,
}

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// An attempt: started at `sent_at`; `queue`: take or renew a place when refused.
    Acquire { sent_at: u8, queue: bool },
    /// The holder lets go (or a waiter leaves its place).
    Release,
}

/// A request on its way to the server (or sent and not run yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub client: Client,
    /// Whether the client still waits for its answer (not: it timed out, or it is a release);
    /// an answer it no longer waits for is dropped when it comes.
    pub awaited: bool,
    pub ask: Ask,
}

/// What the server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    Granted {
        fence: u8,
    },
    /// Refused; `ticket`: the place it has in line (0: none).
    Held {
        ticket: u8,
    },
    Released,
}

/// An answer the client waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Answer {
    pub client: Client,
    pub reply: Reply,
}

/// A release's message to the waiter it handed the lock to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandOff {
    pub client: Client,
    pub ticket: u8,
    pub fence: u8,
}

/// A place in line on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    pub client: Client,
    pub ticket: u8,
    /// When its lease ends.
    pub until: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Server {
    /// The key: its holder's token, and when it expires.
    pub lock: Option<(Client, u8)>,
    /// The line, by ticket.
    pub line: Vec<Place>,
    pub fence: u8,
    /// The last ticket given (tickets are the server's clock: they grow).
    pub tickets: u8,
}

/// Where a client is in its one acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not asked yet.
    Idle,
    /// Waiting for the answer to its attempt sent at `sent_at`, which asked to `queue`.
    Asking { sent_at: u8, queue: bool },
    /// Between attempts.
    Pausing,
    /// In its section until `valid_until`.
    Holding { valid_until: u8, fence: u8 },
    /// Released.
    Done,
}

/// The place the client's last answer with a ticket renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Known {
    pub ticket: u8,
    /// The start of the attempt that renewed it.
    pub renewed_at: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientState {
    pub phase: Phase,
    pub place: Option<Known>,
    /// A request's outcome is unknown (it timed out), until the answer to a later request proves
    /// it ran (one connection runs them in order).
    pub unproven: bool,
    /// Whether it was refused once (a default lock's waiter queues from its second attempt).
    pub refused: bool,
    /// When it last sent an attempt.
    pub last_attempt: Option<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    pub server: Server,
    pub clients: Vec<ClientState>,
    pub requests: Vec<Request>,
    pub answers: Vec<Answer>,
    pub messages: Vec<HandOff>,
    /// The largest fencing token a client was granted so far.
    pub granted: u8,
    /// A grant came with a token not larger than an earlier grant's.
    pub token_went_back: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// A client sends its next attempt.
    Attempt(Client),
    /// The server runs a client's oldest request.
    Run(Client),
    Deliver(usize),
    LoseAnswer(usize),
    /// A client stops waiting for its answer: the outcome is unknown.
    TimeOut(Client),
    /// A pausing client reads a hand-off message (delivered once, or `twice`).
    Read {
        index: usize,
        twice: bool,
    },
    LoseMessage(usize),
    /// A holder lets go.
    Release(Client),
}

/// The model: a [`Config`].
#[derive(Clone, Debug)]
pub struct Protocol(pub Config);

impl Protocol {
    fn live(&self, server: &mut Server, now: u8) {
        if server.lock.is_some_and(|(_, until)| until <= now) {
            server.lock = None;
        }
        server.line.retain(|p| p.until > now);
    }

    fn run(&self, state: &mut State, request: Request) -> Reply {
        let Config { ttl, lease, .. } = self.0;
        let now = state.now;
        let server = &mut state.server;
        self.live(server, now);
        let c = request.client;
        match request.ask {
            Ask::Acquire { queue, .. } => {
                let head = server.line.first().map(|p| p.client);
                let mine = server.lock.is_some_and(|(holder, _)| holder == c);
                if mine || (server.lock.is_none() && head.is_none_or(|h| h == c)) {
                    if !mine {
                        server.fence += 1;
                    }
                    server.lock = Some((c, now + ttl));
                    server.line.retain(|p| p.client != c);
                    return Reply::Granted {
                        fence: server.fence,
                    };
                }
                let mut ticket = server.line.iter().find(|p| p.client == c).map(|p| p.ticket);
                if queue {
                    match server.line.iter_mut().find(|p| p.client == c) {
                        Some(place) => place.until = now + lease,
                        None => {
                            server.tickets += 1;
                            ticket = Some(server.tickets);
                            server.line.push(Place {
                                client: c,
                                ticket: server.tickets,
                                until: now + lease,
                            });
                        }
                    }
                }
                Reply::Held {
                    ticket: ticket.unwrap_or(0),
                }
            }
            Ask::Release => {
                if server.lock.is_some_and(|(holder, _)| holder == c) {
                    server.lock = None;
                }
                server.line.retain(|p| p.client != c);
                if server.lock.is_none() && !server.line.is_empty() {
                    let head = server.line.remove(0);
                    server.fence += 1;
                    server.lock = Some((head.client, head.until));
                    state.messages.push(HandOff {
                        client: head.client,
                        ticket: head.ticket,
                        fence: server.fence,
                    });
                }
                Reply::Released
            }
        }
    }

    fn grant(state: &mut State, client: Client, valid_until: u8, fence: u8) {
        if fence <= state.granted {
            state.token_went_back = true;
        }
        state.granted = state.granted.max(fence);
        state.clients[usize::from(client)].phase = Phase::Holding { valid_until, fence };
    }

    /// The client's rule: whether a message is a grant, and until when.
    fn hand_off_valid_until(&self, client: &ClientState, told: HandOff) -> Option<u8> {
        let Config { ttl, lease, .. } = self.0;
        let place = client.place?;
        let names_it = cfg!(feature = "mutation-stale-handoff") || place.ticket == told.ticket;
        let lasts = if cfg!(feature = "mutation-handoff-full-ttl") {
            ttl
        } else {
            lease
        };
        names_it.then_some(place.renewed_at + lasts)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let client = ClientState {
            phase: Phase::Idle,
            place: None,
            unproven: false,
            refused: false,
            last_attempt: None,
        };
        vec![State {
            now: 0,
            server: Server {
                lock: None,
                line: Vec::new(),
                fence: 0,
                tickets: 0,
            },
            clients: vec![client; usize::from(self.0.clients)],
            requests: Vec::new(),
            answers: Vec::new(),
            messages: Vec::new(),
            granted: 0,
            token_went_back: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.0.max_time {
            actions.push(Action::Tick);
        }
        for (i, client) in state.clients.iter().enumerate() {
            let c = i as Client;
            match client.phase {
                // A pause lasts till the clock moves: at most one attempt per tick.
                Phase::Idle | Phase::Pausing if client.last_attempt != Some(state.now) => {
                    actions.push(Action::Attempt(c));
                }
                Phase::Idle | Phase::Pausing => {}
                Phase::Asking { .. } => actions.push(Action::TimeOut(c)),
                Phase::Holding { .. } => actions.push(Action::Release(c)),
                Phase::Done => {}
            }
            if state.requests.iter().any(|r| r.client == c) {
                actions.push(Action::Run(c));
            }
        }
        for i in 0..state.answers.len() {
            actions.push(Action::Deliver(i));
            if self.0.lose_answers {
                actions.push(Action::LoseAnswer(i));
            }
        }
        for (i, m) in state.messages.iter().enumerate() {
            if state.clients[usize::from(m.client)].phase == Phase::Pausing {
                actions.push(Action::Read {
                    index: i,
                    twice: false,
                });
                if self.0.lose_messages {
                    actions.push(Action::Read {
                        index: i,
                        twice: true,
                    });
                }
            }
            if self.0.lose_messages {
                actions.push(Action::LoseMessage(i));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.now += 1,
            Action::Attempt(c) => {
                let client = &mut state.clients[usize::from(c)];
                let queue = client.refused && !client.unproven;
                client.last_attempt = Some(state.now);
                client.phase = Phase::Asking {
                    sent_at: state.now,
                    queue,
                };
                state.requests.push(Request {
                    client: c,
                    awaited: true,
                    ask: Ask::Acquire {
                        sent_at: state.now,
                        queue,
                    },
                });
            }
            Action::Run(c) => {
                let index = state.requests.iter().position(|r| r.client == c)?;
                let request = state.requests.remove(index);
                let reply = self.run(&mut state, request);
                if request.awaited {
                    state.answers.push(Answer { client: c, reply });
                }
            }
            Action::Deliver(i) => {
                let answer = state.answers.remove(i);
                let client = &mut state.clients[usize::from(answer.client)];
                let Phase::Asking { sent_at, queue } = client.phase else {
                    return None;
                };
                client.unproven = false;
                match answer.reply {
                    Reply::Granted { fence } => {
                        let valid_until = sent_at + self.0.ttl;
                        if valid_until > state.now {
                            Self::grant(&mut state, answer.client, valid_until, fence);
                        } else {
                            client.phase = Phase::Pausing;
                        }
                    }
                    Reply::Held { ticket } => {
                        client.refused = true;
                        // The answer renewed the place it names only if the attempt asked to
                        // queue: a refused attempt that does not queue is told its place too
                        // (`FAIR_ACQUIRE`), whose lease runs on from its last renewal.
                        let renewed = queue || cfg!(feature = "mutation-unrenewed-place");
                        if ticket != 0 && renewed {
                            client.place = Some(Known {
                                ticket,
                                renewed_at: sent_at,
                            });
                        }
                        client.phase = Phase::Pausing;
                    }
                    Reply::Released => {}
                }
            }
            Action::LoseAnswer(i) => {
                state.answers.remove(i);
            }
            Action::TimeOut(c) => {
                let client = &mut state.clients[usize::from(c)];
                client.unproven = true;
                client.phase = Phase::Pausing;
                for request in &mut state.requests {
                    request.awaited &= request.client != c;
                }
                state.answers.retain(|a| a.client != c);
            }
            Action::Read { index, twice } => {
                let told = if twice {
                    state.messages[index]
                } else {
                    state.messages.remove(index)
                };
                let client = &state.clients[usize::from(told.client)];
                if let Some(valid_until) = self.hand_off_valid_until(client, told)
                    && valid_until > state.now
                {
                    Self::grant(&mut state, told.client, valid_until, told.fence);
                }
            }
            Action::LoseMessage(i) => {
                state.messages.remove(i);
            }
            Action::Release(c) => {
                state.clients[usize::from(c)].phase = Phase::Done;
                state.requests.push(Request {
                    client: c,
                    awaited: false,
                    ask: Ask::Release,
                });
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one holder", |_, state: &State| {
                state
                    .clients
                    .iter()
                    .filter(|c| in_section(c, state.now))
                    .count()
                    <= 1
            }),
            Property::always("holder holds", |_, state: &State| {
                state.clients.iter().enumerate().all(|(i, c)| {
                    !in_section(c, state.now)
                        || state.server.lock.is_some_and(|(holder, until)| {
                            usize::from(holder) == i && until > state.now
                        })
                })
            }),
            Property::always("tokens grow", |_, state: &State| !state.token_went_back),
        ]
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.requests.len() <= 3 && state.answers.len() <= 3 && state.messages.len() <= 2
    }
}

/// Whether a client is in its section with a valid lease.
fn in_section(client: &ClientState, now: u8) -> bool {
    matches!(client.phase, Phase::Holding { valid_until, .. } if valid_until > now)
}
