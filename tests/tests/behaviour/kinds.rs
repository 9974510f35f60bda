//! Behaviour of the other lock kinds (fair, shared, permits) on every backend that offers them:
//! `kind_tests!(fixture)` makes one test of each check, `kind_tests!(fixture, redlock)` the
//! Redlock subset (semaphores are refused there, and a hand-off there is confirmed by a majority).

#![allow(
    dead_code,
    reason = "binaries of backends without every kind (Redlock, etcd) leave some checks unused"
)]

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockGuard};
use lock_tests::{bounded, config_field, queued, unique_key, until_queued, wait_until_async};

use super::fixture::{Fx, released_to, takes};
#[allow(
    unused_imports,
    reason = "binaries without the kind checks (hosted) leave them unused"
)]
pub(crate) use super::owners::{each_permit_names_its_owner, each_share_names_its_owner};

const LONG: Duration = Duration::from_secs(10);

fn is_contended<T: std::fmt::Debug>(result: &Result<T, LockError>) -> bool {
    matches!(result, Err(LockError::Contended { .. }))
}

/// Five fair waiters that queued one after another get the lock in that order, each handed it
/// by the release before (woken by it: the retry delay is 5 s).
pub(crate) async fn fair_waiters_are_served_in_arrival_order(fx: &Fx) {
    let key = unique_key("kind:fair-order");
    let held = fx.a.lock(&key).fair(true).acquire().await.unwrap();
    let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (client, k, tx) = (
            if i % 2 == 0 {
                fx.b.clone()
            } else {
                fx.a.clone()
            },
            key.clone(),
            tx.clone(),
        );
        let waiter = fx
            .start_waiter(&key, async move {
                let guard = client.lock(&k).fair(true).wait(LONG).acquire().await;
                let guard = guard.unwrap();
                tx.send(i).unwrap();
                guard.release().await.unwrap();
            })
            .await;
        waiters.push(waiter);
        // Queued before the next one starts.
        until_queued(&fx.b, &key, i + 1).await;
    }
    let released = Instant::now();
    held.release().await.unwrap();
    for waiter in waiters {
        bounded(LONG, "a fair waiter", waiter).await.unwrap();
    }
    drop(tx);
    let mut got = Vec::new();
    while let Some(i) = order.recv().await {
        got.push(i);
    }
    assert_eq!(got, [0, 1, 2, 3, 4]);
    // Five hand-offs, each by a wake-up: far below one retry delay.
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(queued(&fx.b, &key).await, 0);
}

/// A fair release hands the lock to the head of the queue and wakes it alone, and the head
/// takes it from the release's message without asking again: six hand-offs in a row cost the
/// seven releases and nothing else (waking every waiter would add 15 attempts, confirming each
/// hand-off 6), and the fencing tokens still grow with every grant.
pub(crate) async fn a_fair_hand_off_wakes_the_head_alone(fx: &Fx) {
    let key = unique_key("kind:fair-herd");
    // Once before, so that the node has the scripts (a first call costs a second one to load).
    let warm = fx.a.lock(&key).fair(true).acquire().await.unwrap();
    warm.release().await.unwrap();
    let held = fx.a.lock(&key).fair(true).fencing(true).acquire().await;
    let held = held.unwrap();
    let first_fence = held.fencing_token();
    let (tx, mut fences) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    let (base, gets) = (fx.script_calls(), fx.command_calls("get"));
    for i in 0..6 {
        let (client, k, tx) = (
            if i % 2 == 0 { &fx.b } else { &fx.a }.clone(),
            key.clone(),
            tx.clone(),
        );
        waiters.push(
            fx.start_waiter(&key, async move {
                let lock = client.lock(&k).fair(true).fencing(true).wait(LONG);
                let guard = lock.acquire().await.unwrap();
                tx.send(guard.fencing_token()).unwrap();
                guard.release().await.unwrap();
            })
            .await,
        );
    }
    // Each waiter asks twice before it sleeps: its first attempt, and once its subscription is
    // confirmed (a release may have come before it) a look at the key on one Redis server
    // (`GET` and `PTTL`; the attempt, which runs a `GET` too, elsewhere).
    let asked = match (fx.runs_scripts(), fx.one_server()) {
        (false, _) => 0,
        (true, true) => 6,
        (true, false) => 2 * 6,
    };
    let looked = if fx.one_server() { 2 * 6 } else { 0 };
    wait_until_async(Duration::from_secs(5), "every waiter asked twice", || {
        fx.script_calls() - base == asked && fx.command_calls("get") - gets >= looked
    })
    .await;
    let before = fx.script_calls();
    held.release().await.unwrap();
    for waiter in waiters {
        bounded(LONG, "a fair waiter", waiter).await.unwrap();
    }
    let spent = fx.script_calls() - before;
    eprintln!("six fair hand-offs: {spent} script calls");
    let releases = if fx.runs_scripts() { 7 } else { 0 };
    // On Redis each woken waiter asks for its fencing token (the hand-off carries none: the
    // fence counter is the server's, counted at a grant): one acquire call each. That call is
    // also the confirmation a master that can be deposed needs: a deposed master's message taken
    // as the grant handed out a lock the new master never gave (the Sentinel campaign's long run
    // saw it).
    let confirmations = if fx.runs_scripts() { 6 } else { 0 };
    assert_eq!(
        spent,
        releases + confirmations,
        "script calls beyond the releases and confirmations"
    );
    drop(tx);
    let mut last = first_fence;
    while let Some(fence) = fences.recv().await {
        assert!(fence > last, "fencing token {fence:?} after {last:?}");
        last = fence;
    }
    assert_eq!(queued(&fx.b, &key).await, 0);
}

/// A free fair lock with a queue goes to the queue, not to a caller that did not wait in it.
pub(crate) async fn fair_lock_is_not_taken_past_the_queue(fx: &Fx) {
    let key = unique_key("kind:fair-barge");
    let held = fx.a.lock(&key).fair(true).acquire().await.unwrap();
    let waiter = fx
        .start_lock_waiter(&key, fx.b.lock(&key).fair(true).wait(LONG))
        .await;
    held.release().await.unwrap();
    // Handed to the waiter on the server: a newcomer finds it taken even before the waiter
    // has picked it up.
    assert!(is_contended(&fx.a.lock(&key).fair(true).acquire().await));
    let guard = bounded(LONG, "the waiter", waiter)
        .await
        .unwrap()
        .1
        .unwrap();
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    takes(fx.a.lock(&key).fair(true)).await;
}

/// A waiter whose `wait` runs out, and one whose future is dropped, leave the queue at once: the
/// next waiter is handed the lock on release, not after their 30 s leases.
pub(crate) async fn fair_waiters_that_give_up_leave_the_queue(fx: &Fx) {
    let key = unique_key("kind:fair-leave");
    let held = fx.a.lock(&key).fair(true).acquire().await.unwrap();
    let ttl = Duration::from_secs(30);
    let timed_out =
        fx.b.lock(&key)
            .fair(true)
            .ttl(ttl)
            .wait(Duration::from_millis(300))
            .acquire()
            .await;
    assert!(is_contended(&timed_out), "{timed_out:?}");
    let cancelled = fx
        .start_lock_waiter(&key, fx.b.lock(&key).fair(true).ttl(ttl).wait(LONG))
        .await;
    let last = fx
        .start_lock_waiter(&key, fx.a.lock(&key).fair(true).wait(LONG))
        .await;
    until_queued(&fx.b, &key, 2).await;
    cancelled.abort();
    assert!(cancelled.await.is_err());
    until_queued(&fx.b, &key, 1).await;
    let guard = released_to(held.release(), last, Duration::from_secs(4)).await;
    guard.release().await.unwrap();
}

/// Readers share the key; a writer is kept out while they hold it and gets it when the last
/// one leaves; readers are kept out while the writer holds it.
pub(crate) async fn shared_holders_overlap_and_exclude_a_writer(fx: &Fx) {
    let key = unique_key("kind:rw");
    let r1 = fx.a.lock(&key).shared(true).fencing(true).acquire().await;
    let r2 = fx.b.lock(&key).shared(true).fencing(true).acquire().await;
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert!(r1.fencing_token().is_some());
    assert_ne!(r1.fencing_token(), r2.fencing_token());
    assert_eq!(fx.b.inspect(&key).await.unwrap().unwrap().holders, 2);
    assert!(is_contended(&fx.b.lock(&key).acquire().await));
    r1.release().await.unwrap();
    assert!(is_contended(&fx.b.lock(&key).acquire().await));
    r2.release().await.unwrap();
    // Redlock's release answers once a majority let go; the slower nodes follow.
    fx.all_free(&[&key]).await;
    let writer = fx.b.lock(&key).acquire().await.unwrap();
    assert!(is_contended(&fx.a.lock(&key).shared(true).acquire().await));
    writer.release().await.unwrap();
    fx.all_free(&[&key]).await;
    takes(fx.a.lock(&key).shared(true)).await;
}

/// A writer that waits for readers keeps new readers out, so a stream of readers cannot starve
/// it; it is woken by the last reader's release.
pub(crate) async fn a_waiting_writer_is_not_starved(fx: &Fx) {
    let key = unique_key("kind:rw-writer");
    let reader = fx.a.lock(&key).shared(true).acquire().await.unwrap();
    let writer = fx.start_lock_waiter(&key, fx.b.lock(&key).wait(LONG)).await;
    // The writer waits: a new reader is refused although only readers hold the key.
    let late = fx.a.lock(&key).shared(true).acquire().await;
    assert!(is_contended(&late), "{late:?}");
    let guard = released_to(reader.release(), writer, Duration::from_secs(2)).await;
    guard.release().await.unwrap();
    fx.all_free(&[&key]).await;
    takes(fx.a.lock(&key).shared(true)).await;
}

/// Readers that came while a writer waited are woken by the same release as the writer, and
/// still let it go first: the release keeps the writer's mark, so none of them gets in before
/// the writer has had the lock.
pub(crate) async fn readers_woken_with_a_waiting_writer_let_it_go_first(fx: &Fx) {
    let key = unique_key("kind:rw-order");
    let first = fx.a.lock(&key).shared(true).acquire().await.unwrap();
    let writer = fx.start_lock_waiter(&key, fx.b.lock(&key).wait(LONG)).await;
    let mut readers = Vec::new();
    for client in [&fx.a, &fx.b, &fx.a] {
        let reader = client.lock(&key).shared(true).wait(LONG);
        readers.push(fx.start_lock_waiter(&key, reader).await);
    }
    first.release().await.unwrap();
    let (_, guard) = bounded(LONG, "the writer", writer).await.unwrap();
    let guard = guard.unwrap();
    let writer_done = Instant::now();
    guard.release().await.unwrap();
    for reader in readers {
        let (got_at, reader) = bounded(LONG, "a reader", reader).await.unwrap();
        assert!(
            got_at >= writer_done,
            "a reader got in before the writer was done"
        );
        reader.unwrap().release().await.unwrap();
    }
}

/// A writer whose wait runs out stops keeping readers out when it stops waiting, not a ttl
/// (30 s here) later.
pub(crate) async fn a_writer_that_gives_up_keeps_no_reader_out(fx: &Fx) {
    let key = unique_key("kind:rw-give-up");
    let reader = fx.a.lock(&key).shared(true).acquire().await.unwrap();
    let writer =
        fx.b.lock(&key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_millis(300))
            .acquire()
            .await;
    assert!(is_contended(&writer), "{writer:?}");
    let gave_up = Instant::now();
    let next =
        fx.b.lock(&key)
            .shared(true)
            .wait(Duration::from_secs(5))
            .acquire()
            .await;
    let next = next.unwrap_or_else(|e| panic!("a reader after the writer gave up: {e}"));
    eprintln!(
        "a reader got in {:?} after the writer gave up",
        gave_up.elapsed()
    );
    assert!(gave_up.elapsed() < Duration::from_secs(5));
    next.release().await.unwrap();
    reader.release().await.unwrap();
}

/// A semaphore admits up to its permit count; a waiter gets a permit when one is returned.
pub(crate) async fn permits_admit_up_to_their_count(fx: &Fx) {
    let key = unique_key("kind:permits");
    let mut held: Vec<LockGuard> = Vec::new();
    for i in 0..3 {
        let client = if i % 2 == 0 { &fx.a } else { &fx.b };
        held.push(
            client
                .lock(&key)
                .permits(3)
                .fencing(true)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let tokens: std::collections::BTreeSet<_> = held.iter().map(|g| g.fencing_token()).collect();
    assert_eq!(tokens.len(), 3, "each permit has its own fencing token");
    assert!(!tokens.contains(&None), "{tokens:?}");
    assert_eq!(fx.b.inspect(&key).await.unwrap().unwrap().holders, 3);
    assert!(is_contended(&fx.b.lock(&key).permits(3).acquire().await));
    let waiter = fx
        .start_lock_waiter(&key, fx.b.lock(&key).permits(3).wait(LONG))
        .await;
    let returned = held.pop().unwrap();
    let fourth = released_to(returned.release(), waiter, Duration::from_secs(2)).await;
    for guard in held {
        guard.release().await.unwrap();
    }
    fourth.release().await.unwrap();
    assert_eq!(fx.b.inspect(&key).await.unwrap(), None);
}

/// Callers that disagree on what a key is get a `Config` error naming the argument, and nothing.
pub(crate) async fn mismatched_kinds_are_config_errors(fx: &Fx) {
    let key = unique_key("kind:mismatch");
    let sem = fx.a.lock(&key).permits(3).acquire().await.unwrap();
    assert_eq!(
        config_field(fx.b.lock(&key).permits(5).acquire().await),
        "permits"
    );
    assert_eq!(
        config_field(fx.b.lock(&key).shared(true).acquire().await),
        "shared"
    );
    assert_eq!(config_field(fx.b.lock(&key).acquire().await), "permits");
    assert_eq!(
        config_field(fx.b.lock(&key).fair(true).acquire().await),
        "fair"
    );
    sem.release().await.unwrap();
    let exclusive = fx.a.lock(&key).acquire().await.unwrap();
    assert_eq!(
        config_field(fx.b.lock(&key).permits(2).acquire().await),
        "permits"
    );
    exclusive.release().await.unwrap();
    // Arguments that make no sense, before any request.
    assert_eq!(
        config_field(fx.a.lock(&key).permits(0).acquire().await),
        "permits"
    );
    assert_eq!(
        config_field(fx.a.lock(&key).shared(true).permits(2).acquire().await),
        "shared"
    );
    assert_eq!(
        config_field(fx.a.lock(&key).fair(true).shared(true).acquire().await),
        "fair"
    );
    let pair = [format!("{key}:1"), format!("{key}:2")];
    assert_eq!(
        config_field(fx.a.lock_many(pair).permits(2).acquire().await),
        "keys"
    );
}

/// Each shared holder and permit is renewed on its own, and lost on its own.
pub(crate) async fn shares_renew_and_are_lost_each_on_their_own(fx: &Fx) {
    let key = unique_key("kind:renew");
    let ttl = Duration::from_millis(600);
    let a = fx.a.lock(&key).permits(2).ttl(ttl).acquire().await.unwrap();
    let b = fx.b.lock(&key).permits(2).ttl(ttl).acquire().await.unwrap();
    // The behaviour under test is the passing of time: four TTLs, renewed.
    tokio::time::sleep(ttl * 4).await;
    assert!(!a.is_lost() && !b.is_lost());
    assert!(is_contended(&fx.b.lock(&key).permits(2).acquire().await));
    // Forced off the key: both holders see their permit lost, and their release says so.
    assert!(fx.b.force_release(&key).await.unwrap());
    bounded(LONG, "a sees the loss", a.lost()).await;
    bounded(LONG, "b sees the loss", b.lost()).await;
    assert!(matches!(a.release().await, Err(LockError::Lost { .. })));
    assert!(matches!(b.release().await, Err(LockError::Lost { .. })));
}

/// A nested call inside a hold joins it when the hold covers it, and is refused when it would
/// wait on itself (a writer inside a reader).
pub(crate) async fn nested_kinds_join_or_refuse(fx: &Fx) {
    let key = unique_key("kind:nested");
    let reader_in_writer =
        fx.a.lock(&key)
            .run(async { fx.a.lock(&key).shared(true).acquire().await.map(drop) })
            .await;
    assert!(reader_in_writer.is_ok(), "{reader_in_writer:?}");
    let writer_in_reader =
        fx.a.lock(&key)
            .shared(true)
            .run(async { Ok::<_, LockError>(fx.a.lock(&key).acquire().await.map(drop)) })
            .await
            .unwrap();
    assert_eq!(config_field(writer_in_reader), "reentrant");
}

/// Redlock offers no semaphores, and says why before asking any node.
pub(crate) async fn redlock_refuses_permits(fx: &Fx) {
    let key = unique_key("kind:redlock");
    match fx.a.lock(&key).permits(2).acquire().await {
        Err(LockError::Config { field, reason }) => {
            assert_eq!(field, "permits");
            assert!(reason.contains("Redlock"), "{reason}");
        }
        other => panic!("expected a Config error, got {other:?}"),
    }
    assert!(fx.at_most_under("kind:redlock", None));
}

/// One `#[tokio::test]` per check of this file, each with a fresh `$fixture`: every check, or
/// with `redlock` the ones that apply to Redlock. Checks marked `alone` run alone, as in
/// [`behaviour_tests!`](crate::behaviour_tests), whose rules make the tests.
#[macro_export]
macro_rules! kind_tests {
    ($fixture:expr) => {
        behaviour_tests!(@each $fixture; behaviour::kinds;
            alone fair_waiters_are_served_in_arrival_order, alone fair_lock_is_not_taken_past_the_queue,
            alone a_fair_hand_off_wakes_the_head_alone,
            alone fair_waiters_that_give_up_leave_the_queue, shared_holders_overlap_and_exclude_a_writer,
            alone a_waiting_writer_is_not_starved, alone readers_woken_with_a_waiting_writer_let_it_go_first,
            a_writer_that_gives_up_keeps_no_reader_out, permits_admit_up_to_their_count,
            mismatched_kinds_are_config_errors, shares_renew_and_are_lost_each_on_their_own,
            nested_kinds_join_or_refuse, each_share_names_its_owner, each_permit_names_its_owner);
    };
    ($fixture:expr, redlock) => {
        behaviour_tests!(@each $fixture; behaviour::kinds;
            alone fair_waiters_are_served_in_arrival_order, alone fair_lock_is_not_taken_past_the_queue,
            alone fair_waiters_that_give_up_leave_the_queue, shared_holders_overlap_and_exclude_a_writer,
            alone a_waiting_writer_is_not_starved, alone readers_woken_with_a_waiting_writer_let_it_go_first,
            a_writer_that_gives_up_keeps_no_reader_out, nested_kinds_join_or_refuse,
            redlock_refuses_permits, each_share_names_its_owner);
    };
}
