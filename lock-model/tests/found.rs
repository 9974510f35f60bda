//! Defects replayed step by step: what the model found in the real design, and a defect the CI
//! sizes do not reach. Each test walks the trace that broke a property, and checks that it holds
//! with the fix (in `lock-runtime`); the defect's mutation feature makes it fail again (`.ci/run`
//! checks that it does).

use lock_model::{Action, Config, Protocol, State};
use stateright::Model;

/// A default lock, three clients (a holder, and two waiters of which the last waits one tick),
/// ttl 3, lease 2: the size both lost wake-ups of `Calls::acquire_plain`'s mark were found at.
fn two_waiters_one_short() -> Protocol {
    Protocol(Config {
        clients: 3,
        max_time: 2,
        ttl: 3,
        lease: 2,
        fair: false,
        fencing: false,
        native: false,
        last_waits: Some(1),
        lose_answers: false,
        lose_messages: false,
    })
}

/// Runs `actions` from the initial state, each of which must be enabled, and answers the last
/// state. `Run(c)` runs one round trip of `c`'s: a pipeline whole, however many steps the model
/// makes of it.
fn replay(model: &Protocol, actions: &[Action]) -> State {
    replay_from(model, model.init_states().remove(0), actions)
}

fn replay_from(model: &Protocol, mut state: State, actions: &[Action]) -> State {
    let sent = |state: &State, c: u8| state.requests.iter().filter(|r| r.client == c).count();
    for action in actions {
        let before = state.clone();
        state = step(model, state, action);
        if let Action::Run(c) = *action {
            // The pipeline's next command took its place.
            while sent(&state, c) == sent(&before, c) {
                state = step(model, state, action);
            }
        }
    }
    state
}

/// Takes `action`, which must be enabled.
fn step(model: &Protocol, state: State, action: &Action) -> State {
    let mut enabled = Vec::new();
    model.actions(&state, &mut enabled);
    assert!(
        enabled.contains(action),
        "{action:?} not enabled in {state:?}"
    );
    model
        .next_state(&state, action.clone())
        .unwrap_or_else(|| panic!("{action:?} changed nothing"))
}

fn holds(model: &Protocol, state: &State, property: &str) -> bool {
    let properties = model.properties();
    let Some(p) = properties.iter().find(|p| p.name == property) else {
        panic!("no property {property}");
    };
    (p.condition)(model, state)
}

/// `Calls::acquire_plain` marked the lock waited for with `SET waiting 1 PX <its wait>`, which
/// replaced a longer mark: a waiter with a short wait (a `try_lock` for 1 tick) shortened the
/// flag of a waiter that waits on, the flag lapsed, and the holder's release (`DEL lock
/// waiting` deleted only the lock) told nobody, while the long waiter slept on the `PTTL` it
/// read. Fixed as the scripts' `mark_waiting` marks (`SET NX PX`, then `PEXPIRE GT`: never
/// shorter), tested on a real server by `lean.rs::a_short_waiter_does_not_shorten_a_long_waiters_mark`.
/// This walks the trace that found it: the release now wakes the long waiter. With the feature
/// `mutation-plain-mark-shortens` (the old mark) it fails.
#[test]
fn a_short_waiters_mark_no_longer_shortens_the_flag_of_a_long_one() {
    let model = two_waiters_one_short();
    use Action::*;
    let state = replay(
        &model,
        &[
            // A (0) takes the lock until 3.
            Attempt(0),
            Run(0),
            Deliver(0),
            // B (1), waiting to the end, is refused and marks the flag until 3.
            Attempt(1),
            Run(1),
            Deliver(0),
            Run(1),
            Deliver(0),
            // C (2), waiting 1 tick, is refused and marks it until 1 (the old mark: cut to 1).
            Attempt(2),
            Run(2),
            Deliver(0),
            Run(2),
            Deliver(0),
            Tick,
            // A's release deletes the lock and (the flag still there) wakes B.
            Release(0),
            Run(0),
            Deliver(0),
        ],
    );
    assert!(state.server.lock.is_none(), "{state:?}");
    assert!(
        !state.messages.is_empty(),
        "the release told nobody: {state:?}"
    );
    assert!(
        holds(&model, &state, "no lost wake-up"),
        "B asleep past a free lock with no wake-up coming: {state:?}"
    );
}

/// `Calls::acquire_plain`'s second round trip sends `SET waiting 1 NX PX <mark>`, `PEXPIRE
/// waiting <mark> GT` and `PTTL lock` in one pipeline, which the server runs command by command,
/// other clients' commands and time passing in between. Found by this model: C, whose wait ends
/// at tick 1, marked the flag until 1; B's `SET NX` finds that flag and leaves it, the flag lapses
/// before B's `PEXPIRE GT`, which then finds nothing to lengthen, and B's `PTTL` reads A's key. B
/// sleeps on a key whose release finds no flag and tells nobody. Run as one step (the script
/// `MARK_AND_PTTL`, as `lock-runtime` now runs them), B's commands find the flag and lengthen it
/// to B's mark, and A's release wakes B. With the feature `mutation-mark-apart` (the commands
/// apart, as `lock-runtime` sent them when this was found) this fails.
#[test]
fn a_flag_that_lapses_under_a_waiters_mark_is_marked_again() {
    let model = two_waiters_one_short();
    use Action::*;
    // A (0) takes the lock until 3; C (2), waiting 1 tick, is refused and marks the flag until 1.
    let state = replay(
        &model,
        &[
            Attempt(0),
            Run(0),
            Deliver(0),
            Attempt(2),
            Run(2),
            Deliver(0),
            Run(2),
            Deliver(0),
        ],
    );
    assert_eq!(state.server.flag, Some(1), "C's mark: {state:?}");
    // B (1), waiting to the end, is refused; the first command of its mark runs, then the clock
    // passes C's mark, then the rest of B's round trip, whose `PTTL` reads A's key.
    let state = replay_from(&model, state, &[Attempt(1), Run(1), Deliver(0)]);
    let state = step(&model, state, &Run(1));
    let state = replay_from(&model, state, &[Tick]);
    // As one step, the whole round trip ran before the tick.
    let rest: &[Action] = if state.requests.iter().any(|r| r.client == 1) {
        &[Run(1), Deliver(0)]
    } else {
        &[Deliver(0)]
    };
    let state = replay_from(&model, state, rest);
    // A's release.
    let state = replay_from(&model, state, &[Release(0), Run(0), Deliver(0)]);
    assert!(state.server.lock.is_none(), "{state:?}");
    assert!(
        holds(&model, &state, "no lost wake-up"),
        "B asleep past a free lock with no wake-up coming: {state:?}"
    );
}

/// Issue 32's defect 1, a stale hand-off taken as a grant: a release hands the key to B's place
/// (ticket 1) while B, paused, does not read the message; the handed key expires, C takes the
/// lock, and B, refused, queues again (ticket 2). B then reads the late message naming ticket 1.
/// `handed_to_us` takes a hand-off only when it names the place B's last answer renewed (ticket
/// 2 here): B keeps waiting, and C is the one holder. The CI sizes do not reach this (it takes
/// three clients and three ticks); with the feature `mutation-stale-handoff` (any ticket taken)
/// B believes it holds while C does, and this fails.
#[test]
fn a_late_hand_off_to_a_lapsed_place_is_not_a_grant() {
    let model = Protocol(Config {
        clients: 3,
        max_time: 3,
        ttl: 3,
        lease: 2,
        fair: false,
        fencing: false,
        native: false,
        last_waits: None,
        lose_answers: false,
        lose_messages: false,
    });
    use Action::*;
    let trace = [
        // A (0) takes the lock until 3.
        Attempt(0),
        Run(0),
        Deliver(0),
        // B (1) is refused (SET NX PX GET, then the flag and PTTL) and pauses.
        Attempt(1),
        Run(1),
        Deliver(0),
        Run(1),
        Deliver(0),
        Tick,
        // Refused once, B starves: FAIR_ACQUIRE gives it place 1, leased until 3.
        Attempt(1),
        Run(1),
        Deliver(0),
        // A's release hands the key to place 1 until 3: a message to B naming ticket 1, unread.
        Release(0),
        Run(0),
        Deliver(0),
        Tick,
        Tick,
        // The handed key and place 1 expire; C (2) takes the lock until 6.
        Attempt(2),
        Run(2),
        Deliver(0),
        // B asks again: refused, place 2 (leased until 5).
        Attempt(1),
        Run(1),
        Deliver(0),
        // B reads the late hand-off naming place 1.
        Read {
            index: 0,
            twice: false,
        },
    ];
    let state = replay(&model, &trace);
    assert_eq!(
        state.server.lock.map(|(holder, _)| holder),
        Some(2),
        "C holds the key: {state:?}"
    );
    assert_eq!(
        state.server.line.first().map(|p| p.ticket),
        Some(2),
        "B's place is ticket 2: {state:?}"
    );
    assert!(
        holds(&model, &state, "one holder") && holds(&model, &state, "holder holds"),
        "the late hand-off to place 1 was taken as a grant: two holders after {trace:?}, in \
         {state:?}"
    );
}
