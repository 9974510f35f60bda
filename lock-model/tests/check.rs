//! The waiting protocol checked exhaustively: every interleaving of clients, the server's
//! steps, lost and late answers, lost, late and duplicated hand-off messages, and time, within
//! the bounds below. With a `mutation-*` feature (a defect put back) a property fails and the
//! checker prints the trace that breaks it.

use lock_model::{Config, Protocol};
use stateright::{Checker, Model};

/// Explores every state of `config` (breadth first, so a counterexample is a shortest one), then
/// fails on the first property with a counterexample, printing its trace.
fn check(config: Config) -> usize {
    let checker = Protocol(config).checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    eprintln!("{config:?}: {states} states, done: {}", checker.is_done());
    assert!(checker.is_done(), "the exploration did not finish");
    checker.assert_properties();
    states
}

#[test]
fn two_clients_with_lost_answers_and_messages() {
    let states = check(Config {
        clients: 2,
        max_time: 5,
        ttl: 3,
        lease: 2,
        lose_answers: true,
        lose_messages: true,
    });
    assert!(
        states > 1_000,
        "{states} states: the model explored almost nothing"
    );
}

/// The longer run, by hand: `cargo test -p lock-model -- --ignored` (38.5 million states, about
/// two minutes on two cores).
#[test]
#[ignore = "a longer run, by hand"]
fn three_clients_with_lost_answers() {
    check(Config {
        clients: 3,
        max_time: 3,
        ttl: 2,
        lease: 1,
        lose_answers: true,
        lose_messages: false,
    });
}

#[test]
fn three_clients_with_lost_messages() {
    check(Config {
        clients: 3,
        max_time: 3,
        ttl: 2,
        lease: 1,
        lose_answers: false,
        lose_messages: true,
    });
}
