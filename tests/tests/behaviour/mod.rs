//! Behaviour every backend must show. A backend's test file builds its fixture with [`Fx::new`]
//! (`fixture.rs`) and calls `behaviour_tests!(fixture)`, which makes one test of every check: the
//! list in that macro is the only one, and a check missing from it is dead code, which is denied
//! here. One file per topic of checks; the lock kinds' checks (`kinds.rs`) have a macro of their
//! own, `kind_tests!`.

#![deny(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod election;
mod exclusion;
mod fencing;
mod fixture;
mod hold_limits;
mod inspect;
pub(crate) mod kinds;
mod multi_key;
mod owners;
mod reentrancy;
mod release;
mod renewal;
mod waiting;

pub(crate) use election::*;
pub(crate) use exclusion::*;
pub(crate) use fencing::*;
pub(crate) use fixture::Fx;
pub(crate) use hold_limits::*;
pub(crate) use inspect::*;
pub(crate) use multi_key::*;
pub(crate) use owners::inspect_names_the_owner;
pub(crate) use reentrancy::*;
pub(crate) use release::*;
pub(crate) use renewal::*;
pub(crate) use waiting::*;

static TURNS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A check's turn on the servers of this test binary, alone: for the checks marked `alone` in
/// the lists of [`behaviour_tests!`](crate::behaviour_tests) and
/// [`kind_tests!`](crate::kind_tests), and a backend's own tests that must not share the store.
pub(crate) async fn turn_alone() -> Box<dyn Send + Sync> {
    Box::new(TURNS.write().await)
}

/// A check's turn on the servers of this test binary, beside the other checks that do not run
/// alone.
pub(crate) async fn turn_beside_others() -> Box<dyn Send + Sync> {
    Box::new(TURNS.read().await)
}

/// One `#[tokio::test]` per check, each with a fresh `$fixture`. The only list of the checks.
///
/// A check marked `alone` runs alone on a store shared by a whole test binary (Cluster,
/// Sentinel, etcd): one that counts the commands the servers ran or freezes a server, or whose
/// waiters must line up in a given order. Where a store only sees that some new waiter listens,
/// not whose (etcd counts watchers per member, not per key), another check's waiter could pass
/// for this one: a reader then came before the writer it was meant to queue behind (a
/// clean-clone CI run).
#[macro_export]
macro_rules! behaviour_tests {
    ($fixture:expr) => {
        behaviour_tests!(@each $fixture; behaviour;
            acquire_release, contention_error_and_waited, waiter_gets_lock_right_after_release,
            renewal_keeps_a_short_lock, dropped_guard_frees_promptly, cancelled_future_frees_promptly,
            cancelled_waiter_keeps_nothing, panic_frees, fencing_tokens_increase, blocking_api_inside_async_code,
            release_of_a_lost_lock_is_lost, multi_key_acquire_release, duplicate_keys_are_locked_once,
            held_second_key_fails_the_whole_lock, multi_key_waiter_wakes_on_any_release,
            multi_key_fencing_tokens_grow_per_key, alone reentrant_nested_calls_join,
            an_escaped_joined_guard_is_lost_once_the_outer_hold_ends,
            reentrant_subset_joins_superset_is_an_error, spawned_task_inside_a_hold_waits,
            loss_reaches_every_nested_level, non_reentrant_nested_call_contends,
            max_hold_stops_an_endless_async_body, max_hold_replaces_a_late_sync_result,
            min_hold_keeps_a_lock_its_body_let_go_early, release_after_min_hold_deletes_at_once,
            shutdown_keeps_a_lock_for_its_min_hold, inspect_and_force_release,
            inspect_names_the_owner,
            election_hands_over_when_the_leader_resigns,
            election_deposed_leader_sees_the_loss_and_a_rival_takes_over,
            election_cancelled_campaign_leaves_nothing, election_epochs_are_fenced_with_fencing_off,
            election_leader_is_the_holder_while_it_leads,
            election_observe_yields_the_leader_then_each_change);
    };
    // The list, one check at a time: `alone name` or `name`, each the name of a check in
    // `$module` (which `behaviour::$name` reaches).
    (@each $fixture:expr; $($module:ident)::+;) => {};
    (@each $fixture:expr; $($module:ident)::+; alone $name:ident $(, $($rest:tt)*)?) => {
        behaviour_tests!(@test $fixture; $($module)::+; $name; turn_alone);
        behaviour_tests!(@each $fixture; $($module)::+; $($($rest)*)?);
    };
    (@each $fixture:expr; $($module:ident)::+; $name:ident $(, $($rest:tt)*)?) => {
        behaviour_tests!(@test $fixture; $($module)::+; $name; turn_beside_others);
        behaviour_tests!(@each $fixture; $($module)::+; $($($rest)*)?);
    };
    (@test $fixture:expr; $($module:ident)::+; $name:ident; $turn:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let _turn = behaviour::$turn().await;
            let fx = $fixture;
            $($module)::+::$name(&fx).await;
        }
    };
}
