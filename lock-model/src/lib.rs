//! A model of the waiting protocol of one Redis node as `lock-runtime` runs it since the lean
//! redesign, for a default (exclusive, barging) lock and for a fair lock: the lock key, the
//! waiting flag (`lock:{name}:waiting`), the line of waiters (a place per waiter, with a ticket
//! and a lease), the release's message (a wake-up for everyone, or a hand-off to the first
//! place), fencing on or off, releases by the server's own compare-and-delete, and the
//! background release of what a client let go of without an answer, checked exhaustively with
//! [stateright](https://docs.rs/stateright) over every interleaving of a small configuration.
//!
//! # What is modelled, and the code each action follows
//!
//! Each script is one atomic step of the server ([`Action::Run`]), and so is each command of a
//! pipeline (other clients' commands, and time, may pass between two of them), but for the
//! refused plain caller's mark (see below); a client's requests run in the order sent (one
//! connection), any time after.
//! - **Time** ([`Action::Tick`]): one clock, in ticks, which any step may advance (a client
//!   paused between two of its steps is a client whose steps are not taken while time passes).
//!   A key, a flag or a place expires at its deadline (Redis never answers an expired key).
//! - **A default lock, unfenced** (`Calls::acquire_plain`): [`Ask::Set`] is `SET NX PX GET`
//!   (granted when free, whatever the line: newcomers barge; a key already holding the caller's
//!   token is answered by `ACQUIRE_ONE`, which refreshes it); a refused caller that waits then
//!   sends [`Ask::Mark`], the second round trip ([`MARK`]): `SET waiting 1 NX PX mark` and
//!   `PEXPIRE waiting mark GT` (the flag lives *at least* the mark, never shorter: a plain
//!   `SET .. PX` there let a short waiter cut a long waiter's mark, the lost wake-up this model
//!   found, `tests/found.rs`, and feature `mutation-plain-mark-shortens`) and `PTTL` (the key's
//!   expiry bounds its pause; `-2`: ask again at once). The mark is the waiter's lease or the
//!   rest of its wait, the shorter. One step: `lock-runtime` runs the three in one script
//!   (`scripts::MARK_AND_PTTL`); it sent them as a plain pipeline, and run command by command
//!   they lose a wake-up (found by this model, see "Found"; [`MARK_APART`],
//!   `mutation-mark-apart`).
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
//! - **The release script** ([`Ask::Release`]). Default lock (`scripts::EXCLUSIVE_RELEASE`,
//!   `TAKE_BACK_QUIETLY`), by its wake argument ([`Wake`]): a release ("1") by the holder
//!   deletes the key and the flag in one `DEL`, and when the flag was not there returns at once
//!   (nobody told); a release that finds the key free and the flag set wakes as one that freed
//!   it, and deletes the flag (a release may have run unseen: this is the retry of one whose
//!   answer was lost); a withdrawal ("0") deletes the key, leaves the flag to the waiters and
//!   publishes nothing; the wake-up after a native release ("2") is a release while the key is
//!   free or the caller's, and once someone else took it wakes the waiters unless some queue,
//!   and keeps the flag. A caller that does not hold the key (a waiter giving up its place)
//!   does nothing when there is no flag. Otherwise, with no line, a release that wakes
//!   publishes on the lock's channel (a wake-up for every subscribed waiter); with a line, the
//!   caller leaves it, lapsed places go, and a free key is handed to the head (`HAND_TO_HEAD`:
//!   set to its token for the rest of its place's lease, a message on its own channel naming
//!   its ticket and no fence), the flag marked again for the handed key and the last place's
//!   lease; nobody left in line: the wake-up. Fair lock (`scripts::FAIR_RELEASE`): delete,
//!   leave, hand to the head; nobody in line: nothing is published, the flag is not read.
//! - **The native release** (`Calls::release_native`, with [`Config::native`]): a default
//!   lock's release with wake-up is a pipeline of [`Ask::DelIfEq`] (`DELIFEQ`, or `DELEX ..
//!   IFEQ`) and [`Ask::Exists`] on the flag, two steps: not atomic. Answered "deleted, flag
//!   there", the wake-up ("2") follows, whose failure is only logged; "not ours, flag there",
//!   the release script ("1") answers; otherwise the release is done. After a native release
//!   met waiters, the server's releases of the next second go by script (`WAITED_FOR`): not
//!   modelled, since a client here acquires once and no release of its follows within that
//!   second but the steps of the same release (and a release by script is a step the model has).
//! - **Letting go** ([`Phase::Releasing`]): the client waits for its release's answer (a
//!   holder's release, `hold::release`; a waiter leaving its place; the give-up's cleanup, see
//!   the client). One that does not come ([`Action::LoseAnswer`], then [`Action::TimeOut`]) is
//!   retried in the background by the engine's cleanup (`Engine::cleanup`) until a server
//!   answers, by script ("1"): after a timeout the client forgets the native commands
//!   (`Calls::forget_native`). Each retry's answer may be lost in turn. A release times out in
//!   the model only once its answer is lost: one that times out sooner, its request still on
//!   its way, leaves the server the same order (the retry goes behind it on the connection).
//! - **Messages** ([`Message`], `pubsub.rs`, `wait.rs`, `NotifyOrBackoff::pause`): a wake-up is
//!   published on the lock's channel, a hand-off on its waiter's own (`own_channel`). A
//!   pausing waiter listens on one of them: its own alone once it had a place in line
//!   (`queued`), the lock's before that and again once an attempt of unknown outcome stops it
//!   queueing. A waiter whose attempt is under way hears what comes meanwhile: until its next
//!   pause it listens as in its last (a release then wakes that pause at once,
//!   `WakeHandle::mark_seen`), and a pause that subscribes anew (its first, or one on the other
//!   channel) looks again once the subscription is confirmed: an attempt, or for a queued
//!   waiter `GET` and `PTTL` (`acquire/` `look`), whose attempt follows at once only when the
//!   key holds its token, the hand-off it missed, or is free; the message on its way stands for
//!   that look (the states in which the look-again attempt grants still grant, by that
//!   attempt). What came on the channel a pause does not listen to, with no new subscription to
//!   cover it, is never heard. The code skips the look-again when the pause ends within the
//!   starving threshold anyway; "refused once" is that threshold here, so no pause of the
//!   model is that short. Messages may come late, never ([`Action::LoseMessage`]) or twice
//!   ([`Action::Read`] `twice`).
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
//!   wait ends (`wait` in [`Config`]) is refused for good, and its acquisition ends: with a
//!   place, it leaves the line (the release script, waking); after an attempt of unknown
//!   outcome (a timeout, or a grant too late to use) it first asks once more with the same
//!   token (`final_try`), and ends, that failing too or refused, with the engine's cleanup of
//!   a grant it may have unseen: released by token, waking, as the release it stands for (it
//!   was a real key, and the waiters it refused set the flag and sleep on it). A cancelled call
//!   ends by the same cleanup; cancellation is not an action of its own here.
//!
//! The states are kept canonical: what the clock passed (an expired key, flag or place, a
//! pause's bound, an attempt made before this tick) is dropped at each tick, and the order of
//! answers, messages and different clients' requests, which nothing reads, is sorted away.
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
//! ahead of it) has a message on its way, or one was lost (a fault the model injects), or a
//! release is still under way (sent, and its answer or its retry's not in yet: the wake-up it
//! owes may yet come). So, once every release was answered, no release is silent to a waiter
//! that sleeps on the strength of its last answer: the flag it set covers the whole pause,
//! every release that frees the key while a waiter sleeps tells it, a read `PTTL` is never a
//! promise the release breaks, a release whose answer was lost is retried by a step that wakes
//! (a lost answer is a fault too, but its retry is what the client owes), and a grant given up
//! wakes the waiters it refused. A bounded checker cannot check liveness itself (every path
//! ends at the last tick, a message may be lost forever, a client may pause forever, a retry
//! may never be answered); this property is the step that liveness rests on: a waiter is never
//! left sleeping past a free lock by the protocol, only by a fault or its own pause. Its limits:
//! the backoff poll is not modelled as a deadline (the code's pause is also bounded by the
//! backoff: a lost wake-up costs at most that long, never a hang), a waiter after a timeout
//! is promised nothing (it sleeps its backoff), a client that dies takes its retries with it
//! (clients here do not die), starvation by barging newcomers is allowed (a default lock is not
//! fair; the queue bounds a starving waiter's wait), and one defect of `lock-runtime` is
//! excused by name (`unheard`: see "Found").
//!
//! # Mutations
//!
//! Each `mutation-*` feature puts a defect back; `cargo test -p lock-model --features <it>` must
//! then fail with a trace. `mutation-no-waiting-flag-on-refusal` (a refused waiter leaves no
//! flag: its holder's release tells nobody) and `mutation-pttl-before-flag` (the plain waiter's
//! `PTTL` read before its flag is set, the commands apart: a release between them tells nobody
//! while the `PTTL` promised a held key) break "no lost wake-up";
//! `mutation-release-retry-wakes-nobody` (the release script as it was: "1" on a free key with
//! the flag wakes nobody, so the retry of a native release whose answer was lost tells nobody)
//! breaks it with the native release (`tests/check.rs` `native_default_lock_two_clients`), and
//! `mutation-quiet-cleanup` (the given-up grant's cleanup as it was, a withdrawal) breaks it
//! when a client gives up (`default_lock_two_clients_one_gives_up`);
//! `mutation-handoff-full-ttl` breaks "holder holds". `mutation-stale-handoff` is not found at
//! the CI sizes (two clients: a lock handed to a lapsed place needs a third client to take it
//! meanwhile, and three ticks): `tests/found.rs` walks such a trace, which breaks "one holder"
//! with it. `mutation-mark-apart` (the mark's three commands as separate steps, as
//! `lock-runtime` sent them in a pipeline) breaks "no lost wake-up" in `tests/found.rs`, and at
//! the CI sizes too. `mutation-unrenewed-place` is unreachable since the lean redesign (the only
//! attempt that does not queue is a waiter's last, after which it gives up); it is kept for
//! larger runs.
//!
//! # Found in the real design
//!
//! `tests/found.rs` walks the traces of three defects: issue 32's stale hand-off (found by the
//! campaign, before this model), and two lost wake-ups this model found in
//! `Calls::acquire_plain`'s mark. It marked with a plain `SET waiting 1 PX <mark>`, which
//! *shortens* a longer mark, unlike `mark_waiting` in the scripts: a short waiter's mark then
//! lapsed before a long waiter's pause ended, and the release told nobody (the long waiter woke
//! at its backoff poll instead). Its `SET NX PX`, `PEXPIRE GT` and `PTTL` went as a pipeline,
//! which the server runs command by command: a flag that lapses between the `SET NX` that found
//! it and the `PEXPIRE`, which then finds nothing to lengthen, is gone, and the `PTTL` promises
//! a held key whose release tells nobody; they now run in one script (`MARK_AND_PTTL`), one
//! step, as the model runs them.
//!
//! And one it excuses by name (`ClientState::unheard`): a waiter whose queueing attempt timed
//! out may hold a place it was never told of (the request ran), and an attempt of unknown
//! outcome makes it listen on the lock's channel, not its own; a release hands the lock to that
//! place, on its own channel, unheard, and the waiter (and every other) waits until its next
//! poll, the key on its token.
//!
//! Not modelled here: renewal of a held lock, several nodes (Redlock has a model of its own,
//! [`redlock`]), replication (Sentinel, Cluster: hand-offs are not taken as grants there),
//! several keys, shared locks and semaphores, `min_hold`, forced release, a client's death.
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
    /// Whether the server has its own compare-and-delete (`DELIFEQ`, `DELEX .. IFEQ`): a default
    /// lock's release with wake-up then goes by [`Ask::DelIfEq`] and [`Ask::Exists`].
    pub native: bool,
    /// How long the last client waits, in ticks from its first attempt (`None`: to the end).
    pub last_waits: Option<u8>,
    /// Whether answers may be lost (a timeout, the outcome unknown).
    pub lose_answers: bool,
    /// Whether messages may be lost or delivered twice.
    pub lose_messages: bool,
}

/// One command of a refused plain caller's second round trip (`Calls::acquire_plain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MarkStep {
    /// `SET waiting 1 NX PX mark`.
    SetNx,
    /// `PEXPIRE waiting mark GT`.
    Longer,
    /// `SET waiting 1 PX mark`: the mark as it was (`mutation-plain-mark-shortens`).
    SetPlain,
    /// `PTTL lock`.
    Pttl,
}

/// The round trip's commands, in the order sent (each mutation puts back an older one).
pub const MARK: &[MarkStep] = if cfg!(feature = "mutation-no-waiting-flag-on-refusal") {
    &[MarkStep::Pttl] as &[MarkStep]
} else if cfg!(feature = "mutation-pttl-before-flag") {
    &[MarkStep::Pttl, MarkStep::SetNx, MarkStep::Longer]
} else if cfg!(feature = "mutation-plain-mark-shortens") {
    &[MarkStep::SetPlain, MarkStep::Pttl]
} else {
    &[MarkStep::SetNx, MarkStep::Longer, MarkStep::Pttl]
};

/// Whether the server runs the round trip's commands one at a time, other clients' commands
/// and time passing in between (a plain pipeline, as `lock-runtime` sent them), or as one step
/// (the script `MARK_AND_PTTL` it runs now).
pub const MARK_APART: bool =
    cfg!(feature = "mutation-mark-apart") || cfg!(feature = "mutation-pttl-before-flag");

/// `EXCLUSIVE_RELEASE`'s wake argument (`ARGV[4]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wake {
    /// "0": a withdrawal, which publishes nothing and leaves the flag to the waiters.
    Quiet,
    /// "1": a release.
    Release,
    /// "2": the wake-up after a native release that found the flag.
    AfterNative,
}

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// `SET NX PX GET` (an unfenced default lock); `mark`: the flag's time if refused (0: the
    /// caller does not wait).
    Set { mark: u8 },
    /// The refused plain caller's second round trip, [`MARK`] from command `step` on; `until`:
    /// what its `PTTL` read, once read.
    Mark { mark: u8, step: u8, until: u8 },
    /// `ACQUIRE_ONE` (a fenced default lock).
    One { mark: u8 },
    /// `FAIR_ACQUIRE`; `queue`: take or renew a place when refused.
    Fair { queue: bool },
    /// `DELIFEQ lock token`: a native release's first command.
    DelIfEq,
    /// `EXISTS waiting`, the second, in the same pipeline; `deleted`: what the first answered.
    Exists { deleted: bool },
    /// `EXCLUSIVE_RELEASE` with its wake argument, or `FAIR_RELEASE` (which takes none): the
    /// holder lets go, a waiter leaves its place, or a grant is given back.
    Release { wake: Wake },
}

/// A request on its way to the server (or sent and not run yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub client: Client,
    /// Whether the client still waits for its answer (not: it timed out); an answer it no
    /// longer waits for is dropped when it comes.
    pub awaited: bool,
    pub ask: Ask,
}

/// What the server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// The native release's pipeline: whether `DELIFEQ` deleted the key, and the flag was there.
    Native {
        deleted: bool,
        waited: bool,
    },
    Released,
}

/// What a request's run leaves: an answer, or the next command of its pipeline.
enum Ran {
    Answer(Reply),
    Next(Ask),
}

/// An answer the client waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Answer {
    pub client: Client,
    pub reply: Reply,
}

/// A release's message: a wake-up (`ticket` 0, on the lock's channel) or a hand-off to the
/// place `ticket` (on its waiter's own channel, no fence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// Waiting for the answer to its attempt sent at `sent_at`, which asked to `queue`;
    /// `queues`: whether it takes a place once it starves (not after an attempt of unknown
    /// outcome, `acquire/`'s `will_queue`).
    Asking {
        sent_at: u8,
        queue: bool,
        queues: bool,
    },
    /// Between attempts, asleep until `until` at the latest (a message may wake it sooner).
    Pausing { until: u8 },
    /// In its section until `valid_until`.
    Holding { valid_until: u8 },
    /// Letting go (of its grant, of its place, or of a grant it gave up), waiting for the
    /// answer. A timeout is retried by the engine's `cleanup`, by script, waking (`Some(true)`)
    /// or not; the wake-up after a native release (`None`) is not retried (its failure is
    /// logged).
    Releasing { retry: Option<bool> },
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
    /// An attempt's outcome was unknown (a timeout, or a grant too late to use): a grant may sit
    /// on the server unseen, and an acquisition that ends without one gives it back by token.
    pub unknown: bool,
    /// Past its wait after an unknown outcome, it asks once more with the same token.
    pub final_try: bool,
    /// Whether it was refused once (a default lock's waiter starves, and queues, from then on).
    pub refused: bool,
    /// Whether it listens on its own channel alone (it had a place in line: `queued` in
    /// `NotifyOrBackoff`), not on the lock's.
    pub own: bool,
    /// When it sent its first attempt (kept only by a client whose wait ends).
    pub started: Option<u8>,
    /// Whether it sent an attempt at this tick (a pause lasts till the clock moves).
    pub attempted: bool,
    /// A message to it was lost since its last attempt (a fault: the no-lost-wake-up property
    /// excuses it).
    pub missed: bool,
    /// The lock was handed to a place of its while it did not listen on its own channel, since
    /// its last attempt (a defect of `lock-runtime`, excused by name: see "Found").
    pub unheard: bool,
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

    fn run(&self, state: &mut State, request: Request) -> Ran {
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
        let reply = match request.ask {
            Ask::Set { mark } | Ask::One { mark } => {
                let counted = matches!(request.ask, Ask::One { .. }) && fencing;
                if counted {
                    server.fence += 1;
                }
                if mine || server.lock.is_none() {
                    server.lock = Some((c, now + ttl));
                    return Ran::Answer(Reply::Granted {
                        fence: if counted { server.fence } else { 0 },
                    });
                }
                if let Ask::Set { .. } = request.ask {
                    return Ran::Answer(Reply::Taken);
                }
                if mark > 0 && !cfg!(feature = "mutation-no-waiting-flag-on-refusal") {
                    Self::mark_waiting(server, now + mark);
                }
                Reply::Held {
                    ticket: 0,
                    until: Self::pttl(server, now),
                }
            }
            Ask::Mark {
                mark,
                mut step,
                mut until,
            } => loop {
                match MARK[usize::from(step)] {
                    MarkStep::SetNx => {
                        server.flag.get_or_insert(now + mark);
                    }
                    MarkStep::Longer => {
                        if let Some(flag) = &mut server.flag {
                            *flag = (*flag).max(now + mark);
                        }
                    }
                    MarkStep::SetPlain => server.flag = Some(now + mark),
                    MarkStep::Pttl => until = Self::pttl(server, now),
                }
                step += 1;
                if usize::from(step) == MARK.len() {
                    break Reply::Held { ticket: 0, until };
                }
                if MARK_APART {
                    return Ran::Next(Ask::Mark { mark, step, until });
                }
            },
            Ask::Fair { queue } => {
                let head = server.line.first().map(|p| p.client);
                if mine || (server.lock.is_none() && head.is_none_or(|h| h == c)) {
                    if fencing {
                        server.fence += 1;
                    }
                    server.lock = Some((c, now + ttl));
                    server.line.retain(|p| p.client != c);
                    return Ran::Answer(Reply::Granted {
                        fence: if fencing { server.fence } else { 0 },
                    });
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
            Ask::DelIfEq => {
                if mine {
                    server.lock = None;
                }
                return Ran::Next(Ask::Exists { deleted: mine });
            }
            Ask::Exists { deleted } => Reply::Native {
                deleted,
                waited: server.flag.is_some(),
            },
            Ask::Release { .. } if fair => {
                if mine {
                    server.lock = None;
                }
                server.line.retain(|p| p.client != c);
                if server.lock.is_none() {
                    Self::hand_to_head(state);
                }
                Reply::Released
            }
            Ask::Release { wake } => {
                Self::exclusive_release(state, c, wake);
                Reply::Released
            }
        };
        Ran::Answer(reply)
    }

    /// `EXCLUSIVE_RELEASE` (`TAKE_BACK_QUIETLY`, then the line): see the module doc.
    fn exclusive_release(state: &mut State, c: Client, wake: Wake) {
        let server = &mut state.server;
        let holder = server.lock.map(|(holder, _)| holder);
        let flagged = server.flag.is_some();
        if wake == Wake::AfterNative && holder.is_some_and(|h| h != c) {
            // Taken since the native release: the waiters that do not queue are woken all the
            // same (they find it held, and mark it again), and the flag stays.
            if server.line.is_empty() {
                Self::wake_all(state);
            }
            return;
        }
        // A release that frees the key wakes; so does one that finds it free with the flag set
        // (a release may have run unseen: its answer lost, and this is its retry), but for a
        // release by the script as it was ("1" on a free key woke nobody).
        let old_script = cfg!(feature = "mutation-release-retry-wakes-nobody");
        let frees =
            holder == Some(c) || (holder.is_none() && (wake == Wake::AfterNative || !old_script));
        let wakes = wake != Wake::Quiet && frees;
        if holder == Some(c) {
            server.lock = None;
        }
        if wakes {
            server.flag = None;
        }
        if !flagged {
            return;
        }
        if server.line.is_empty() {
            if wakes {
                Self::wake_all(state);
            }
            return;
        }
        server.line.retain(|p| p.client != c);
        if server.lock.is_some() {
            return;
        }
        let handed = Self::hand_to_head(state);
        let server = &mut state.server;
        if let Some(until) = handed {
            Self::mark_waiting(server, until);
        }
        if let Some(last) = server.line.last().map(|p| p.until) {
            Self::mark_waiting(server, last);
        }
        if handed.is_none() && wakes {
            Self::wake_all(state);
        }
    }

    /// `HAND_TO_HEAD`: a free key goes to the first live place, told on its own channel;
    /// answers when the handed key expires (`None`: nobody in line).
    fn hand_to_head(state: &mut State) -> Option<u8> {
        if state.server.line.is_empty() {
            return None;
        }
        let head = state.server.line.remove(0);
        state.server.lock = Some((head.client, head.until));
        Self::publish(
            state,
            Message {
                client: head.client,
                ticket: head.ticket,
            },
        );
        Some(head.until)
    }

    /// A release's `PUBLISH` on the lock's channel: a wake-up for every waiting client.
    fn wake_all(state: &mut State) {
        for c in 0..state.clients.len() {
            Self::publish(
                state,
                Message {
                    client: c as Client,
                    ticket: 0,
                },
            );
        }
    }

    /// A message reaches a pausing client that listens on its channel (the lock's, or its own
    /// once it had a place), and a client whose attempt is under way: until its next pause it
    /// listens as in the last, and a pause that listens elsewhere looks again once subscribed
    /// (see [`Protocol::subscribe`]). A hand-off nobody hears is noted (`unheard`).
    fn publish(state: &mut State, told: Message) {
        let client = &mut state.clients[usize::from(told.client)];
        let heard = match client.phase {
            Phase::Asking { .. } => true,
            Phase::Pausing { .. } => client.own == (told.ticket != 0),
            _ => return,
        };
        if heard {
            state.messages.push(told);
        } else if told.ticket != 0 {
            client.unheard = true;
        }
    }

    /// A pause begins, listening on its own channel alone (`own`) or on the lock's
    /// (`NotifyOrBackoff::pause`). Unchanged, what came on the other channel during the attempt
    /// was never heard; changed, the new subscription's confirmation makes it look again (an
    /// attempt, or for a queued waiter `GET` and `PTTL`, which finds a free key, or its own),
    /// which the messages on their way stand for.
    fn subscribe(state: &mut State, c: Client, own: bool) {
        let client = &mut state.clients[usize::from(c)];
        if client.own != own {
            client.own = own;
            return;
        }
        let before = state.messages.len();
        state
            .messages
            .retain(|m| m.client != c || (m.ticket != 0) == own);
        if !own && state.messages.len() < before {
            state.clients[usize::from(c)].unheard = true;
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

    /// How long client `c` waits (`None`: to the end).
    fn wait_of(&self, c: usize) -> Option<u8> {
        self.0
            .last_waits
            .filter(|_| c + 1 == usize::from(self.0.clients))
    }

    /// When the client's wait ends (`None`: not before the last tick).
    fn give_up(&self, c: usize, client: &ClientState) -> Option<u8> {
        Some(client.started.unwrap_or(0) + self.wait_of(c)?)
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

    /// The client lets go: by the server's own compare-and-delete where it has one (a default
    /// lock's release with wake-up, `Calls::release`), else by script; `retry`: see
    /// [`Phase::Releasing`].
    fn let_go(&self, state: &mut State, c: Client, wake: bool, retry: Option<bool>) {
        let ask = if self.0.native && !self.0.fair && wake {
            Ask::DelIfEq
        } else {
            Ask::Release {
                wake: if wake { Wake::Release } else { Wake::Quiet },
            }
        };
        state.requests.push(Request {
            client: c,
            awaited: true,
            ask,
        });
        state.clients[usize::from(c)].phase = Phase::Releasing { retry };
    }

    /// The acquisition ends without a grant (`acquire/`): a grant that may sit on the server
    /// unseen is given back by token (the engine's `cleanup`, waking its waiters, as a release
    /// does: it was a real key, and they sleep on it), and a place in line is left (the release
    /// script, with wake-up; if that goes unanswered, the cleanup takes over).
    fn end(&self, state: &mut State, c: Client) {
        let cleanup_wakes = !cfg!(feature = "mutation-quiet-cleanup");
        let client = &state.clients[usize::from(c)];
        if client.unknown {
            self.let_go(state, c, cleanup_wakes, Some(cleanup_wakes));
        } else if client.place.is_some() {
            self.let_go(state, c, true, Some(cleanup_wakes));
        } else {
            state.clients[usize::from(c)].phase = Phase::Done;
        }
    }

    /// An attempt failed with its outcome unknown (a timeout, or a grant too late to use): it
    /// asks again, and past its wait once more only (`final_try`), then ends.
    fn failed(&self, state: &mut State, c: Client) {
        let now = state.now;
        let give_up = self.give_up(usize::from(c), &state.clients[usize::from(c)]);
        let client = &mut state.clients[usize::from(c)];
        client.unproven = true;
        client.unknown = true;
        if give_up.is_some_and(|g| now >= g) {
            if client.final_try {
                return self.end(state, c);
            }
            client.final_try = true;
        }
        client.phase = Phase::Pausing { until: now };
    }

    /// The answer to an attempt.
    fn answered(&self, state: &mut State, c: Client, reply: Reply) -> Option<()> {
        let Config { ttl, lease, .. } = self.0;
        let now = state.now;
        let give_up = self.give_up(usize::from(c), &state.clients[usize::from(c)]);
        let past = give_up.is_some_and(|g| now >= g);
        let client = &mut state.clients[usize::from(c)];
        let Phase::Asking {
            sent_at,
            queue,
            queues,
        } = client.phase
        else {
            return None;
        };
        client.unproven = false;
        match reply {
            Reply::Granted { fence } if sent_at + ttl > now => {
                self.grant(state, c, sent_at + ttl, fence);
            }
            Reply::Granted { .. } => self.failed(state, c),
            Reply::Taken => {
                let waits = give_up.map_or(ttl, |g| g.saturating_sub(sent_at).min(ttl));
                if waits == 0 {
                    client.refused = true;
                    self.end(state, c);
                    return Some(());
                }
                state.requests.push(Request {
                    client: c,
                    awaited: true,
                    ask: Ask::Mark {
                        mark: waits,
                        step: 0,
                        until: 0,
                    },
                });
            }
            Reply::Held { ticket, until } => {
                client.refused = true;
                // The answer renewed the place it names only if the attempt asked to queue: a
                // refused attempt that does not queue is told its place too (`FAIR_ACQUIRE`),
                // whose lease runs on from its last renewal.
                let renewed = queue || cfg!(feature = "mutation-unrenewed-place");
                if ticket != 0 && renewed {
                    client.place = Some(Known {
                        ticket,
                        renewed_at: sent_at,
                    });
                }
                if past {
                    self.end(state, c);
                    return Some(());
                }
                let bound = until.min(sent_at + lease);
                let bound = give_up.map_or(bound, |g| bound.min(g));
                client.phase = Phase::Pausing { until: bound };
                // Once it had a place it listens on its own channel alone, until an attempt
                // of unknown outcome stops it queueing.
                let own = (client.own && queues) || ticket != 0;
                Self::subscribe(state, c, own);
            }
            Reply::Native { .. } | Reply::Released => return None,
        }
        Some(())
    }

    /// The answer to a release.
    fn released(state: &mut State, c: Client, reply: Reply) -> Option<()> {
        let client = &mut state.clients[usize::from(c)];
        let Phase::Releasing { retry } = client.phase else {
            return None;
        };
        let (ask, retry) = match reply {
            // Someone waits: the wake-up follows.
            Reply::Native {
                deleted: true,
                waited: true,
            } => (Wake::AfterNative, None),
            // Not ours while someone waits: the script answers, and tidies the line.
            Reply::Native {
                deleted: false,
                waited: true,
            } => (Wake::Release, retry),
            _ => {
                client.phase = Phase::Done;
                return Some(());
            }
        };
        client.phase = Phase::Releasing { retry };
        state.requests.push(Request {
            client: c,
            awaited: true,
            ask: Ask::Release { wake: ask },
        });
        Some(())
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
            unknown: false,
            final_try: false,
            refused: false,
            own: false,
            started: None,
            attempted: false,
            missed: false,
            unheard: false,
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
                Phase::Idle | Phase::Pausing { .. } if !client.attempted => {
                    actions.push(Action::Attempt(c));
                }
                Phase::Idle | Phase::Pausing { .. } => {}
                Phase::Asking { .. } => actions.push(Action::TimeOut(c)),
                // A release times out once its answer is lost: one sooner, its request still
                // on its way, leaves the server the same order (the retry goes behind it).
                Phase::Releasing { .. }
                    if !state.requests.iter().any(|r| r.client == c && r.awaited)
                        && !state.answers.iter().any(|a| a.client == c) =>
                {
                    actions.push(Action::TimeOut(c));
                }
                Phase::Releasing { .. } => {}
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
            ttl, fair, fencing, ..
        } = self.0;
        match action {
            Action::Tick => {
                state.now += 1;
                // What the clock passed is as good as gone: an expired key, flag or place (Redis
                // never answers them), a pause over, an attempt made before this tick.
                Self::live(&mut state.server, state.now);
                for client in &mut state.clients {
                    client.attempted = false;
                    if let Phase::Pausing { until } = &mut client.phase {
                        *until = (*until).max(state.now);
                    }
                }
            }
            Action::Attempt(c) => {
                let now = state.now;
                let give_up = {
                    let client = &mut state.clients[usize::from(c)];
                    if self.wait_of(usize::from(c)).is_some() {
                        client.started.get_or_insert(now);
                    }
                    self.give_up(usize::from(c), client)
                };
                let client = &mut state.clients[usize::from(c)];
                let waits = give_up.map_or(ttl, |g| g.saturating_sub(now).min(ttl));
                let queue = waits > 0;
                let starving = !fair && client.refused && !client.unproven;
                client.attempted = true;
                client.missed = false;
                client.unheard = false;
                client.phase = Phase::Asking {
                    sent_at: now,
                    queue: queue && (fair || starving),
                    queues: fair || !client.unproven,
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
                match self.run(&mut state, request) {
                    // The pipeline's next command, first in this client's line still.
                    Ran::Next(ask) => state.requests.insert(index, Request { ask, ..request }),
                    Ran::Answer(reply) if request.awaited => {
                        state.answers.push(Answer { client: c, reply });
                    }
                    Ran::Answer(_) => {}
                }
            }
            Action::Deliver(i) => {
                let Answer { client, reply } = state.answers.remove(i);
                match state.clients[usize::from(client)].phase {
                    Phase::Asking { .. } => self.answered(&mut state, client, reply)?,
                    Phase::Releasing { .. } => Self::released(&mut state, client, reply)?,
                    _ => return None,
                }
            }
            Action::LoseAnswer(i) => {
                state.answers.remove(i);
            }
            Action::TimeOut(c) => {
                for request in &mut state.requests {
                    request.awaited &= request.client != c;
                }
                state.answers.retain(|a| a.client != c);
                match state.clients[usize::from(c)].phase {
                    Phase::Asking { .. } => self.failed(&mut state, c),
                    // The engine's `cleanup`: by script (the native commands are forgotten
                    // after a timeout), until a server answers.
                    Phase::Releasing { retry: Some(wake) } => state.requests.push(Request {
                        client: c,
                        awaited: true,
                        ask: Ask::Release {
                            wake: if wake { Wake::Release } else { Wake::Quiet },
                        },
                    }),
                    Phase::Releasing { retry: None } => {
                        state.clients[usize::from(c)].phase = Phase::Done;
                    }
                    _ => return None,
                }
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
            Action::Release(c) => self.let_go(&mut state, c, true, Some(true)),
        }
        // Orders that mean nothing: any answer or message may come first, and a client's
        // requests keep their order among themselves only.
        state.requests.sort_by_key(|r| r.client);
        state.answers.sort_unstable();
        state.messages.sort_unstable();
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
                // A release still under way (its answer, or its retry's, not in yet) may owe
                // the wake-up: the property holds once every release was answered.
                let releasing = state
                    .clients
                    .iter()
                    .any(|c| matches!(c.phase, Phase::Releasing { .. }));
                releasing
                    || state.clients.iter().enumerate().all(|(i, client)| {
                        let c = i as Client;
                        let Phase::Pausing { until } = client.phase else {
                            return true;
                        };
                        until <= state.now
                            || client.missed
                            || client.unheard
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
