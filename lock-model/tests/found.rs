//! What the model found in the real design, replayed step by step: each test walks the trace
//! that breaks a property, and passes while the defect is there (the lead fixes `lock-runtime`
//! against a real server, then this test flips to the fixed behaviour).

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

/// `Calls::acquire_plain` marks the lock waited for with `SET waiting 1 PX <its wait>`, which
/// replaces a longer mark: a waiter with a short wait (a `try_lock` for 1 tick) shortens the
/// flag of a waiter that waits on, the flag lapses, and the holder's release (`DEL lock
/// waiting` deleted only the lock) tells nobody, while the long waiter sleeps on the `PTTL` it
/// read. `mark_waiting` in the scripts (`SET NX PX`, else `PEXPIRE GT`) never shortens it.
#[test]
fn a_short_waiters_plain_mark_shortens_the_flag_of_a_long_one() {
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
            // C (2), waiting 1 tick, is refused and marks it until 1.
            Attempt(2),
            Run(2),
            Deliver(0),
            Run(2),
            Deliver(0),
            Tick,
            // The flag is gone: A's release deletes the lock and tells nobody.
            Release(0),
            Run(0),
        ],
    );
    assert!(
        state.server.lock.is_none() && state.messages.is_empty(),
        "{state:?}"
    );
    assert!(
        !holds(&model, &state, "no lost wake-up"),
        "B is not asleep past a free lock: {state:?}"
    );
}
