//! What the model found in the real design, replayed step by step: each test walks the trace
//! that broke a property, and checks that it holds now that `lock-runtime` is fixed (each fix
//! with its real-server test); the defect's mutation feature makes it fail again.

use lock_model::{Action, Config, Protocol, State};
use stateright::Model;

/// Runs `actions` from the initial state, each of which must be enabled, and answers the last
/// state.
fn replay(model: &Protocol, actions: &[Action]) -> State {
    let mut state = model.init_states().remove(0);
    for action in actions {
        let mut enabled = Vec::new();
        model.actions(&state, &mut enabled);
        assert!(
            enabled.contains(action),
            "{action:?} not enabled in {state:?}"
        );
        state = model
            .next_state(&state, action.clone())
            .unwrap_or_else(|| panic!("{action:?} changed nothing"));
    }
    state
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
    let model = Protocol(Config {
        clients: 3,
        max_time: 2,
        ttl: 3,
        lease: 2,
        fair: false,
        fencing: false,
        last_waits: Some(1),
        lose_answers: false,
        lose_messages: false,
    });
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
