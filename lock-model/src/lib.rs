//! A model of the waiting protocol of one Redis node as `lock-runtime` runs it since the lean
//! redesign, for a default (exclusive, barging) lock and for a fair lock: the lock key, the
//! waiting flag (`lock:{name}:waiting`), the line of waiters (a place per waiter, with a ticket
//! and a lease), the release's message (a wake-up for everyone, or a hand-off to the first
//! place), fencing on or off, checked exhaustively with [stateright](https://docs.rs/stateright)
//! over every interleaving of a small configuration.
//!
//! # What is modelled, and the code each action follows
//!
//! Each script, or each round trip of plain commands, is one atomic step of the server
//! ([`Action::Run`]); a client's requests run in the order sent (one connection), any time after.
//! - **Time** ([`Action::Tick`]): one clock, in ticks, which any step may advance (a client
//!   paused between two of its steps is a client whose steps are not taken while time passes).
//!   A key, a flag or a place expires at its deadline (Redis never answers an expired key).
//! - **A default lock, unfenced** (`Calls::acquire_plain`): [`Ask::Set`] is `SET NX PX GET`
//!   (granted when free, whatever the line: newcomers barge; a key already holding the caller's
//!   token is answered by `ACQUIRE_ONE`, which refreshes it); a refused caller that waits then
//!   sends [`Ask::MarkThenPttl`], the second round trip: `SET waiting 1 NX PX mark` and
//!   `PEXPIRE waiting mark GT` (the flag lives *at least* the mark, never shorter: a plain
//!   `SET .. PX` there let a short waiter cut a long waiter's mark, the lost wake-up this model
//!   found, `tests/found.rs`, and feature `mutation-plain-mark-shortens`) and `PTTL` (the key's
//!   expiry bounds its pause; `-2`: ask again at once). The mark is the waiter's lease or the
//!   rest of its wait, the shorter.
//! - **A default lock, fenced** (`scripts::ACQUIRE_ONE`, [`Ask::One`]): the fence counter's
//!   `INCR` (every call, refused or not), `SET NX PX GET`, a refused waiter's `mark_waiting`
//!   (the flag lives *at least* the mark: `SET NX PX`, else `PEXPIRE GT`) and `PTTL`, one step.
//! - **A starving waiter of a default lock, and every attempt on a fair lock**
//!   (`scripts::FAIR_ACQUIRE`, [`Ask::Fair`]): granted when the key is free and the caller heads
//!   the live line (or it is empty), or when the key holds its token (a hand-off); otherwise a
//!   caller that queues takes a place (ticket: the server's clock) or renews its place's lease,
//!   and marks the flag for its lease (`mark_waiting`); its pause is bounded by the holder's
//!   `PTTL`, or, the key free, by the head's lease. A default lock's waiter starves from its
//!   second attempt ("refused once" stands for `Herd::STARVING`), and not while an attempt's
//!   outcome is unknown (`acquire/`, `unproven`). The code's plain attempts in between, a
//!   young waiter's answers to wake-ups, are this step early: one that loses the race marks
//!   nothing (`Ask::marks`), since the waiter then hears no release until its threshold, which
//!   bounds that pause as the backoff bounds any other (see "No lost wake-up").
//! - **The release** ([`Ask::Release`]). Default lock (`scripts::EXCLUSIVE_RELEASE`,
//!   `TAKE_BACK_QUIETLY`): the holder's compare-and-delete deletes the key and the flag in one
//!   `DEL`; when the flag was not there it returns at once (nobody told). A caller that does not
//!   hold the key (a waiter giving up its place) does nothing when there is no flag. Otherwise,
//!   with no line, a release that freed the key publishes on the lock's channel (a wake-up for
//!   every subscribed waiter); with a line, the caller leaves it, lapsed places go, and a free
//!   key is handed to the head (`HAND_TO_HEAD`: set to its token for the rest of its place's
//!   lease, a message on its own channel naming its ticket and no fence), the flag marked again
//!   for the handed key and the last place's lease; nobody left in line: the wake-up. Fair lock
//!   (`scripts::FAIR_RELEASE`): delete, leave, hand to the head; nobody in line: nothing is
//!   published, the flag is not read.
//! - **Messages** ([`Message`], `pubsub.rs`, `wait.rs`): a wake-up reaches every client that
//!   is waiting (subscribed: the real waiter looks again once its subscription is confirmed, so
//!   a release before that is as good as heard; on one Redis server a queued waiter's look-again
//!   is `GET` and `PTTL`, `acquire/` `look`, and the attempt follows at once only when the key
//!   holds its token, the hand-off it missed, or is free (`PTTL` -2): the states in which the
//!   look-again attempt grants still grant, by that attempt; elsewhere the look-again is the
//!   attempt); messages may come late, never
//!   ([`Action::LoseMessage`]) or twice ([`Action::Read`] `twice`).
//! - **The client** (`acquire/`): a grant's validity is its attempt's start plus the ttl; an
//!   answer may be lost ([`Action::LoseAnswer`]; the client times out, [`Action::TimeOut`], the
//!   outcome unknown, and asks again with the same token: the first request may still run). A
//!   hand-off is a grant only unfenced (`handed_to_us`: a fenced waiter needs a token, which
//!   the message does not carry, so it asks the server), and only when it names the place
//!   (ticket) its last answer renewed, valid until that answer's attempt's start plus the lease.
//!   A waiter wakes on a message ([`Action::Read`]) or polls ([`Action::Attempt`], any time: a
//!   jittered backoff), and sleeps at most until its pause's bound: the key's expiry its `PTTL`
//!   read (the head's lease for a fair waiter refused by a free key), its lease after its
//!   attempt's start (`lease / 3` in the code: sooner), and the end of its wait. A client whose
//!   wait ends (`wait` in [`Config`]) is refused for good and, with a place, leaves the line
//!   (the release script, as `acquire` does).
//!
//! # Properties
//!
//! Safety, on every reachable state:
//! - **one holder**: never two clients in their sections with valid leases (the documented
//!   assumption: a holder is not paused past its own validity);
//! - **holder holds**: a client in its section with a valid lease holds the key on the server
//!   (so `Ok` came from a server answer to this attempt, or a hand-off naming the place that
//!   answer renewed);
//! - **tokens grow**: with fencing, each grant's token is larger than every earlier grant's.
//!
//! **No lost wake-up**, also on every reachable state: a waiter asleep before its pause's bound
//! (see above) while the lock is free *for it* (the key free or handed to it, and no live place
//! ahead of it) has a message on its way, or one was lost (a fault the model injects). So no
//! release is silent to a waiter that sleeps on the strength of its last answer: the flag it
//! set covers the whole pause, every release that frees the key while a waiter sleeps tells it,
//! and a read `PTTL` is never a promise the release breaks. A bounded checker cannot check
//! liveness itself (every path ends at the last tick, a message may be lost forever, a client
//! may pause forever); this property is the step that liveness rests on: a waiter is never
//! left sleeping past a free lock by the protocol, only by a fault or its own pause. Its limits:
//! the backoff poll is not modelled as a deadline (the code's pause is also bounded by the
//! backoff: a lost wake-up costs at most that long, never a hang), a waiter after a timeout
//! is promised nothing (it sleeps its backoff), and starvation by barging newcomers is allowed
//! (a default lock is not fair; the queue bounds a starving waiter's wait).
//!
//! # Mutations
//!
//! Each `mutation-*` feature puts a defect back; `cargo test -p lock-model --features <it>` must
//! then fail with a trace. `mutation-no-waiting-flag-on-refusal` (a refused waiter leaves no
//! flag: its holder's release tells nobody) and `mutation-pttl-before-flag` (the plain waiter's
//! `PTTL` read before its flag is set, in two commands: a release between them tells nobody
//! while the `PTTL` promised a held key) break "no lost wake-up"; `mutation-handoff-full-ttl`
//! breaks "holder holds". `mutation-stale-handoff` is not found at the CI sizes (two clients:
//! a lock handed to a lapsed place needs a third client to take it meanwhile, and three ticks):
//! `tests/found.rs` walks such a trace, which breaks "one holder" with it.
//! `mutation-unrenewed-place` is unreachable since the lean redesign (the only attempt that does
//! not queue is a waiter's last, after which it gives up); it is kept for larger runs.
//!
//! # Found in the real design
//!
//! `tests/found.rs` walks the traces of two defects: issue 32's stale hand-off (found by the
//! campaign, before this model) and a lost wake-up this model found: `Calls::acquire_plain` marks with a plain
//! `SET waiting 1 PX <mark>`, which *shortens* a longer mark, unlike `mark_waiting` in the
//! scripts; a short waiter's mark then lapses before a long waiter's pause ends, and the release
//! tells nobody (the long waiter wakes at its backoff poll instead).
//!
//! Not modelled here: renewal of a held lock, the subscription's set-up (see Messages), several
//! nodes (Redlock has a model of its own, [`redlock`]), replication (Sentinel, Cluster: hand-offs are not taken as grants there), several
//! keys, shared locks and semaphores, `min_hold`, forced release.

use stateright::{Model, Property};

pub mod redlock;

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
    /// A fair lock (every waiter queues) instead of a default one.
    pub fair: bool,
    /// Fencing tokens asked for (`Lock::fencing`).
    pub fencing: bool,
    /// How long the last client waits, in ticks from its first attempt (`None`: to the end).
    pub last_waits: Option<u8>,
    /// Whether answers may be lost (a timeout, the outcome unknown).
    pub lose_answers: bool,
    /// Whether messages may be lost or delivered twice.
    pub lose_messages: bool,
}

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// `SET NX PX GET` (an unfenced default lock); `mark`: the flag's time if refused (0: the
    /// caller does not wait).
    Set { mark: u8 },
    /// The refused plain caller's second round trip: `SET waiting PX mark`, `PTTL`.
    MarkThenPttl { mark: u8 },
    /// `SET waiting PX mark` alone (`mutation-pttl-before-flag`: after the `PTTL`).
    Mark { mark: u8 },
    /// `ACQUIRE_ONE` (a fenced default lock).
    One { mark: u8 },
    /// `FAIR_ACQUIRE`; `queue`: take or renew a place when refused.
    Fair { queue: bool },
    /// The holder lets go, or a waiter leaves its place.
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
    /// `SET NX PX GET` refused: the caller marks the flag next.
    Taken,
    /// Refused; `ticket`: the place it has in line (0: none); `until`: when its pause ends at
    /// the latest, as the `PTTL` it read says.
    Held {
        ticket: u8,
        until: u8,
    },
    Released,
}

/// An answer the client waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Answer {
    pub client: Client,
    pub reply: Reply,
}

/// A release's message: a wake-up (`ticket` 0, on the lock's channel) or a hand-off to the
/// place `ticket` (on its waiter's own channel, no fence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Message {
    pub client: Client,
    pub ticket: u8,
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
    /// The waiting flag: when it expires.
    pub flag: Option<u8>,
    /// The line, by ticket.
    pub line: Vec<Place>,
    /// The server's fence counter (`lock:fence`).
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
    /// Between attempts, asleep until `until` at the latest (a message may wake it sooner).
    Pausing { until: u8 },
    /// In its section until `valid_until`.
    Holding { valid_until: u8 },
    /// Released, or gave up.
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
    /// Whether it was refused once (a default lock's waiter starves, and queues, from then on).
    pub refused: bool,
    /// When it sent its first attempt, and its last.
    pub started: Option<u8>,
    pub last_attempt: Option<u8>,
    /// A message to it was lost since its last attempt (a fault: the no-lost-wake-up property
    /// excuses it).
    pub missed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    pub server: Server,
    pub clients: Vec<ClientState>,
    pub requests: Vec<Request>,
    pub answers: Vec<Answer>,
    pub messages: Vec<Message>,
    /// The largest fencing token a client was granted so far.
    pub granted: u8,
    /// A fenced grant came with a token not larger than an earlier grant's.
    pub token_went_back: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// A client sends its next attempt (its first, or a poll).
    Attempt(Client),
    /// The server runs a client's oldest request.
    Run(Client),
    Deliver(usize),
    LoseAnswer(usize),
    /// A client stops waiting for its answer: the outcome is unknown.
    TimeOut(Client),
    /// A pausing client reads a message (delivered once, or `twice`).
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
    fn live(server: &mut Server, now: u8) {
        if server.lock.is_some_and(|(_, until)| until <= now) {
            server.lock = None;
        }
        if server.flag.is_some_and(|until| until <= now) {
            server.flag = None;
        }
        server.line.retain(|p| p.until > now);
    }

    /// `mark_waiting`: the flag lives at least `ms` more.
    fn mark_waiting(server: &mut Server, until: u8) {
        server.flag = Some(server.flag.map_or(until, |f| f.max(until)));
    }

    /// A refused waiter's pause bound, as the key's `PTTL` says (`-2`: at once).
    fn pttl(server: &Server, now: u8) -> u8 {
        server.lock.map_or(now, |(_, until)| until)
    }

    fn run(&self, state: &mut State, request: Request) -> Reply {
        let Config {
            ttl,
            lease,
            fencing,
            fair,
            ..
        } = self.0;
        let now = state.now;
        let server = &mut state.server;
        Self::live(server, now);
        let c = request.client;
        let mine = server.lock.is_some_and(|(holder, _)| holder == c);
        match request.ask {
            Ask::Set { mark } | Ask::One { mark } => {
                let counted = matches!(request.ask, Ask::One { .. }) && fencing;
                if counted {
                    server.fence += 1;
                }
                if mine || server.lock.is_none() {
                    server.lock = Some((c, now + ttl));
                    return Reply::Granted {
                        fence: if counted { server.fence } else { 0 },
                    };
                }
                if let Ask::Set { .. } = request.ask {
                    return Reply::Taken;
                }
                if mark > 0 && !cfg!(feature = "mutation-no-waiting-flag-on-refusal") {
                    Self::mark_waiting(server, now + mark);
                }
                Reply::Held {
                    ticket: 0,
                    until: Self::pttl(server, now),
                }
            }
            Ask::MarkThenPttl { mark } => {
                let until = Self::pttl(server, now);
                if cfg!(feature = "mutation-pttl-before-flag") {
                    state.requests.insert(
                        0,
                        Request {
                            client: c,
                            awaited: false,
                            ask: Ask::Mark { mark },
                        },
                    );
                } else if cfg!(feature = "mutation-plain-mark-shortens") {
                    server.flag = Some(now + mark);
                } else if !cfg!(feature = "mutation-no-waiting-flag-on-refusal") {
                    Self::mark_waiting(server, now + mark);
                }
                Reply::Held { ticket: 0, until }
            }
            Ask::Mark { mark } => {
                Self::mark_waiting(server, now + mark);
                Reply::Released
            }
            Ask::Fair { queue } => {
                let head = server.line.first().map(|p| p.client);
                if mine || (server.lock.is_none() && head.is_none_or(|h| h == c)) {
                    if fencing {
                        server.fence += 1;
                    }
                    server.lock = Some((c, now + ttl));
                    server.line.retain(|p| p.client != c);
                    return Reply::Granted {
                        fence: if fencing { server.fence } else { 0 },
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
                    if !cfg!(feature = "mutation-no-waiting-flag-on-refusal") {
                        Self::mark_waiting(server, now + lease);
                    }
                }
                let until = match (server.lock, server.line.first()) {
                    (Some((_, until)), _) => until,
                    (None, Some(head)) => head.until,
                    (None, None) => now,
                };
                Reply::Held {
                    ticket: ticket.unwrap_or(0),
                    until,
                }
            }
            Ask::Release if fair => {
                if mine {
                    server.lock = None;
                }
                server.line.retain(|p| p.client != c);
                if server.lock.is_none() {
                    Self::hand_to_head(state);
                }
                Reply::Released
            }
            Ask::Release => {
                let flagged = server.flag.is_some();
                if mine {
                    server.lock = None;
                    server.flag = None;
                }
                if !flagged {
                    return Reply::Released;
                }
                if server.line.is_empty() {
                    if mine {
                        Self::wake_all(state);
                    }
                    return Reply::Released;
                }
                server.line.retain(|p| p.client != c);
                if server.lock.is_some() {
                    return Reply::Released;
                }
                let handed = Self::hand_to_head(state);
                let server = &mut state.server;
                if let Some(until) = handed {
                    Self::mark_waiting(server, until);
                }
                if let Some(last) = server.line.last().map(|p| p.until) {
                    Self::mark_waiting(server, last);
                }
                if handed.is_none() && mine {
                    Self::wake_all(state);
                }
                Reply::Released
            }
        }
    }

    /// `HAND_TO_HEAD`: a free key goes to the first live place, told on its own channel; answers
    /// when the handed key expires (`None`: nobody in line).
    fn hand_to_head(state: &mut State) -> Option<u8> {
        if state.server.line.is_empty() {
            return None;
        }
        let head = state.server.line.remove(0);
        state.server.lock = Some((head.client, head.until));
        state.messages.push(Message {
            client: head.client,
            ticket: head.ticket,
        });
        Some(head.until)
    }

    /// A release's `PUBLISH` on the lock's channel: every waiting client hears it.
    fn wake_all(state: &mut State) {
        for (i, client) in state.clients.iter().enumerate() {
            if matches!(client.phase, Phase::Asking { .. } | Phase::Pausing { .. }) {
                state.messages.push(Message {
                    client: i as Client,
                    ticket: 0,
                });
            }
        }
    }

    fn grant(&self, state: &mut State, client: Client, valid_until: u8, fence: u8) {
        if self.0.fencing {
            if fence <= state.granted {
                state.token_went_back = true;
            }
            state.granted = state.granted.max(fence);
        }
        state.clients[usize::from(client)].phase = Phase::Holding { valid_until };
    }

    /// The client's rule (`handed_to_us`): whether a hand-off is a grant, and until when.
    fn hand_off_valid_until(&self, client: &ClientState, told: Message) -> Option<u8> {
        let Config {
            ttl,
            lease,
            fencing,
            ..
        } = self.0;
        if fencing || told.ticket == 0 {
            return None;
        }
        let place = client.place?;
        let names_it = cfg!(feature = "mutation-stale-handoff") || place.ticket == told.ticket;
        let lasts = if cfg!(feature = "mutation-handoff-full-ttl") {
            ttl
        } else {
            lease
        };
        names_it.then_some(place.renewed_at + lasts)
    }

    /// When the client's wait ends (`None`: not before the last tick).
    fn give_up(&self, c: usize, client: &ClientState) -> Option<u8> {
        let wait = self
            .0
            .last_waits
            .filter(|_| c + 1 == usize::from(self.0.clients))?;
        Some(client.started.unwrap_or(0) + wait)
    }

    /// Whether the lock is free for `c`: the key free or handed to it, no live place ahead.
    fn free_for(state: &State, c: Client) -> bool {
        let now = state.now;
        let key_free = state
            .server
            .lock
            .is_none_or(|(holder, until)| holder == c || until <= now);
        let head = state.server.line.iter().find(|p| p.until > now);
        key_free && head.is_none_or(|p| p.client == c)
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
            started: None,
            last_attempt: None,
            missed: false,
        };
        vec![State {
            now: 0,
            server: Server {
                lock: None,
                flag: None,
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
                Phase::Idle | Phase::Pausing { .. } if client.last_attempt != Some(state.now) => {
                    actions.push(Action::Attempt(c));
                }
                Phase::Idle | Phase::Pausing { .. } => {}
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
            if matches!(
                state.clients[usize::from(m.client)].phase,
                Phase::Pausing { .. }
            ) {
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
        let Config {
            ttl,
            lease,
            fair,
            fencing,
            ..
        } = self.0;
        match action {
            Action::Tick => state.now += 1,
            Action::Attempt(c) => {
                let now = state.now;
                let give_up = {
                    let client = &mut state.clients[usize::from(c)];
                    client.started.get_or_insert(now);
                    self.give_up(usize::from(c), client)
                };
                let client = &mut state.clients[usize::from(c)];
                let waits = give_up.map_or(ttl, |g| g.saturating_sub(now).min(ttl));
                let queue = waits > 0;
                let starving = !fair && client.refused && !client.unproven;
                client.last_attempt = Some(now);
                client.missed = false;
                client.phase = Phase::Asking {
                    sent_at: now,
                    queue: queue && (fair || starving),
                };
                let mark = if queue { waits } else { 0 };
                let ask = if fair || starving {
                    Ask::Fair { queue }
                } else if fencing {
                    Ask::One { mark }
                } else {
                    Ask::Set { mark }
                };
                state.requests.push(Request {
                    client: c,
                    awaited: true,
                    ask,
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
                let c = usize::from(answer.client);
                let now = state.now;
                let give_up = self.give_up(c, &state.clients[c]);
                let client = &mut state.clients[c];
                let Phase::Asking { sent_at, queue } = client.phase else {
                    return None;
                };
                client.unproven = false;
                match answer.reply {
                    Reply::Granted { fence } => {
                        let valid_until = sent_at + ttl;
                        if valid_until > now {
                            self.grant(&mut state, answer.client, valid_until, fence);
                        } else {
                            client.phase = Phase::Pausing { until: now };
                        }
                    }
                    Reply::Taken => {
                        let waits = give_up.map_or(ttl, |g| g.saturating_sub(sent_at).min(ttl));
                        if waits > 0 {
                            state.requests.push(Request {
                                client: answer.client,
                                awaited: true,
                                ask: Ask::MarkThenPttl { mark: waits },
                            });
                        } else {
                            client.refused = true;
                            client.phase = Phase::Done;
                        }
                    }
                    Reply::Held { ticket, until } => {
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
                        if give_up.is_some_and(|g| now >= g) {
                            client.phase = Phase::Done;
                            if client.place.is_some() {
                                state.requests.push(Request {
                                    client: answer.client,
                                    awaited: false,
                                    ask: Ask::Release,
                                });
                            }
                        } else {
                            let bound = until.min(sent_at + lease);
                            let bound = give_up.map_or(bound, |g| bound.min(g));
                            client.phase = Phase::Pausing { until: bound };
                        }
                    }
                    Reply::Released => {}
                }
            }
            Action::LoseAnswer(i) => {
                state.answers.remove(i);
            }
            Action::TimeOut(c) => {
                let now = state.now;
                let client = &mut state.clients[usize::from(c)];
                client.unproven = true;
                client.phase = Phase::Pausing { until: now };
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
                let now = state.now;
                let client = &mut state.clients[usize::from(told.client)];
                // Woken: it asks again at once.
                client.phase = Phase::Pausing { until: now };
                if let Some(valid_until) = self.hand_off_valid_until(client, told)
                    && valid_until > now
                {
                    self.grant(&mut state, told.client, valid_until, 0);
                }
            }
            Action::LoseMessage(i) => {
                let lost = state.messages.remove(i);
                state.clients[usize::from(lost.client)].missed = true;
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
            Property::always("no lost wake-up", |_, state: &State| {
                state.clients.iter().enumerate().all(|(i, client)| {
                    let c = i as Client;
                    let Phase::Pausing { until } = client.phase else {
                        return true;
                    };
                    until <= state.now
                        || client.missed
                        || !Self::free_for(state, c)
                        || state.messages.iter().any(|m| m.client == c)
                })
            }),
        ]
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.requests.len() <= 3 && state.answers.len() <= 3 && state.messages.len() <= 3
    }
}

/// Whether a client is in its section with a valid lease.
fn in_section(client: &ClientState, now: u8) -> bool {
    matches!(client.phase, Phase::Holding { valid_until } if valid_until > now)
}
