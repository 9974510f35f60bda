//! `max_hold` and `min_hold`: a body that runs too long is stopped (async) or loses its success
//! (sync); a lock let go before its `min_hold` is kept until then, also through `shutdown()`, and
//! one let go after it is deleted at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockError;
use lock_tests::{SCHEDULING_SLACK, bounded, unique_key, warm_up};

use super::fixture::{Fx, endless_body, shut_down, takes};

/// An async body that never ends is cancelled at `max_hold` (per lock, or the config default), the
/// call returns `MaxHoldExceeded`, and the key is free right after, long before its TTL.
pub(crate) async fn max_hold_stops_an_endless_async_body(fx: &Fx) {
    let max_hold = Duration::from_millis(300);
    let per_lock = fx.a.clone();
    let by_config = fx.client_with(|config| config.max_hold(max_hold));
    for (how, client) in [("per lock", per_lock), ("config default", by_config)] {
        let key = unique_key("beh:maxhold");
        let lock = client.lock(&key).ttl(Duration::from_secs(30));
        let lock = if how == "per lock" {
            lock.max_hold(max_hold)
        } else {
            lock
        };
        let dropped = std::sync::Arc::new(AtomicBool::new(false));
        let (started_tx, _started) = tokio::sync::oneshot::channel();
        let start = Instant::now();
        let result = bounded(
            Duration::from_secs(5),
            "the body stopped at max_hold",
            lock.run(endless_body(&dropped, started_tx)),
        )
        .await;
        let took = start.elapsed();
        eprintln!("{how}: stopped after {took:?}");
        assert_eq!(
            result,
            Err(LockError::MaxHoldExceeded {
                key: key.clone(),
                max_hold
            }),
            "{how}"
        );
        assert!(took >= max_hold, "{how}: stopped after {took:?}");
        assert!(
            dropped.load(Ordering::SeqCst),
            "{how}: the body was not cancelled"
        );
        // Released (on a majority) when the call returns, then on every node; free for others.
        assert!(fx.holders(&key) <= fx.node_count() - fx.majority(), "{how}");
        fx.free_now(&[&key]).await;
    }
}

/// A sync body that runs past `max_hold` is not interrupted, but its success is replaced by
/// `MaxHoldExceeded`; the key is free right after.
pub(crate) async fn max_hold_replaces_a_late_sync_result(fx: &Fx) {
    let key = unique_key("beh:maxholdsync");
    let max_hold = Duration::from_millis(200);
    let finished = std::sync::Arc::new(AtomicBool::new(false));
    let (a, k, done) = (fx.a.clone(), key.clone(), std::sync::Arc::clone(&finished));
    let start = Instant::now();
    let result = tokio::task::spawn_blocking(move || {
        a.lock(&k)
            .ttl(Duration::from_secs(30))
            .max_hold(max_hold)
            .run_blocking(|| {
                // The behaviour under test is a body that runs too long.
                std::thread::sleep(max_hold * 3);
                done.store(true, Ordering::SeqCst);
                Ok::<u32, LockError>(5)
            })
    })
    .await
    .unwrap();
    assert!(
        finished.load(Ordering::SeqCst),
        "the sync body was interrupted"
    );
    assert!(start.elapsed() >= max_hold * 3);
    assert_eq!(
        result,
        Err(LockError::MaxHoldExceeded {
            key: key.clone(),
            max_hold
        })
    );
    fx.free_now(&[&key]).await;
}

/// `min_hold` of the checks below: long enough that the calls that must not wait for it (bounded
/// by [`UNBLOCKED`]) clearly do not.
const MIN_HOLD: Duration = Duration::from_secs(3);

/// How long a call may take that makes at most four requests on warm connections (acquire on
/// etcd: lease and transaction; a release kept for `min_hold`: the same), each within one
/// response timeout (every fixture's default: 500 ms). Below [`MIN_HOLD`].
const UNBLOCKED: Duration = Duration::from_secs(2);

/// A lock with `min_hold` whose body returns at once: the call returns without waiting for
/// `min_hold`, another client is refused until it passed (checked at a point proven to be before
/// it: measured from before the grant), and gets the lock once it has, within the key's expiry
/// granularity.
pub(crate) async fn min_hold_keeps_a_lock_its_body_let_go_early(fx: &Fx) {
    let key = unique_key("beh:minhold");
    warm_up(&fx.a).await;
    warm_up(&fx.b).await;
    let before_grant = Instant::now();
    let ran =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .min_hold(MIN_HOLD)
            .run(async { Ok::<_, LockError>(7) })
            .await;
    let returned = before_grant.elapsed();
    eprintln!("the call returned after {returned:?}");
    assert_eq!(ran, Ok(7));
    assert!(returned < UNBLOCKED, "blocked for {returned:?}");
    assert!(fx.holders(&key) >= fx.majority());
    // Left for the rest of `min_hold`, not for the rest of its 30 s ttl.
    let info = fx.b.inspect(&key).await.unwrap().expect("kept");
    assert!(info.remaining.is_some_and(|r| r <= MIN_HOLD), "{info:?}");

    let refused = fx.b.lock(&key).acquire().await;
    let checked = before_grant.elapsed();
    assert!(checked < MIN_HOLD, "checked {checked:?} after the grant");
    assert!(
        matches!(refused, Err(LockError::Contended { .. })),
        "{refused:?} {checked:?} after the grant"
    );

    // A waiter is not woken by the release that kept the key: it gets the lock when the key
    // expires (its pause is capped by the key's time to live).
    let bound = MIN_HOLD + fx.expiry_granularity() + Duration::from_millis(1500) + SCHEDULING_SLACK;
    let got = fx.b.lock(&key).wait(bound).acquire().await;
    let got_after = before_grant.elapsed();
    eprintln!("the other client got it {got_after:?} after the grant");
    let got = got.unwrap_or_else(|e| panic!("not free {got_after:?} after the grant: {e}"));
    assert!(got_after >= MIN_HOLD, "free {got_after:?} after the grant");
    assert!(got_after <= bound, "free {got_after:?} after the grant");
    got.release().await.unwrap();
}

/// A lock let go after its `min_hold` passed is deleted at once: another client takes it
/// without waiting.
pub(crate) async fn release_after_min_hold_deletes_at_once(fx: &Fx) {
    let key = unique_key("beh:minholdpast");
    let min_hold = Duration::from_millis(300);
    let guard =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .min_hold(min_hold)
            .acquire()
            .await
            .unwrap();
    // The behaviour under test is the passing of time: min_hold, and then some.
    tokio::time::sleep(min_hold * 2).await;
    guard.release().await.unwrap();
    assert!(fx.holders(&key) <= fx.node_count() - fx.majority());
    takes(fx.b.lock(&key)).await;
}

/// `shutdown()` of a client that holds a lock whose `min_hold` has not passed: its holder sees it
/// lost (and its release says so), but the key stays for the rest of `min_hold`.
pub(crate) async fn shutdown_keeps_a_lock_for_its_min_hold(fx: &Fx) {
    let key = unique_key("beh:minholdshut");
    let own = fx.client_with(|config| config);
    warm_up(&own).await;
    warm_up(&fx.b).await;
    let before_grant = Instant::now();
    let guard = own
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    shut_down(&own).await;
    bounded(UNBLOCKED, "the loss is signalled", guard.lost()).await;
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // Kept for the rest of `min_hold` (not deleted, nor left for its 30 s ttl). In memory the
    // lock lives in the shut-down client, which still answers `inspect`.
    let observer = if fx.node_count() == 0 { &own } else { &fx.b };
    let info = observer.inspect(&key).await.unwrap();
    let checked = before_grant.elapsed();
    assert!(checked < MIN_HOLD, "checked {checked:?} after the grant");
    let info = info.expect("kept after shutdown");
    assert!(info.remaining.is_some_and(|r| r <= MIN_HOLD), "{info:?}");
}
