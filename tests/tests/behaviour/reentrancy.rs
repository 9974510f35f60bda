//! Nested calls on a held lock: they join the hold (without a server command), also on a subset of
//! its keys but not a superset; a guard that escaped the outer call is lost once it ends; another
//! task or thread is not the holder; a loss reaches every level; `reentrant(false)` contends.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::{bounded, unique_key, wait_until, wait_until_async};

use super::fixture::{Fx, endless_body, shut_down, two_keys};

/// A nested call on a held key joins the hold: with wait 0 it succeeds, ten levels deep, async
/// and sync, without one server command; the key stays held until the outermost call ends.
pub(crate) async fn reentrant_nested_calls_join(fx: &Fx) {
    let key = unique_key("beh:reentrant");
    let ttl = Duration::from_secs(60); // no renewal during the count
    let everywhere = || fx.holders(&key) == fx.node_count();
    let result = fx
        .a
        .lock(&key)
        .ttl(ttl)
        .run(async {
            // Nothing of the outer acquire is still in flight (Redlock's slower nodes included).
            wait_until_async(Duration::from_secs(5), "the lock on every node", everywhere).await;
            let before = fx.lock_requests();
            let n = nested_chain(fx.a.clone(), key.clone(), 9).await? + 1;
            assert_eq!(
                fx.lock_requests() - before,
                0,
                "nested calls went to the server"
            );
            // Still held after the nested calls returned: another task (never the holder) is refused.
            let (b, k) = (fx.b.clone(), key.clone());
            let other = tokio::spawn(async move { b.lock(&k).acquire().await.map(drop) });
            assert!(other.await.unwrap().unwrap_err().is_contended());
            Ok::<_, LockError>(n)
        })
        .await;
    assert_eq!(result, Ok(10));
    fx.all_free(&[&key]).await;

    // The same from sync code, on one thread: three nested levels.
    let result = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                fx.a.lock(&key).ttl(ttl).run_blocking(|| {
                    wait_until(Duration::from_secs(5), "the lock on every node", everywhere);
                    let before = fx.lock_requests();
                    let n =
                        fx.a.lock(&key)
                            .wait(Duration::ZERO)
                            .run_blocking(|| {
                                fx.a.lock(&key).wait(Duration::ZERO).run_blocking(|| Ok(2))
                            })
                            .map(|n: u32| n + 1);
                    assert_eq!(
                        fx.lock_requests() - before,
                        0,
                        "sync nested calls went to the server"
                    );
                    n
                })
            })
            .join()
            .unwrap()
    });
    assert_eq!(result, Ok::<u32, LockError>(3));
    fx.free_now(&[&key]).await;
}

/// A nested guard returned out of the outer call's body (it joined the outer hold) holds
/// nothing once the outer call released: it reports the lock lost, its release says `Lost`, and
/// it never claims a key that another client holds by then.
pub(crate) async fn an_escaped_joined_guard_is_lost_once_the_outer_hold_ends(fx: &Fx) {
    let key = unique_key("beh:escaped");
    let escaped =
        fx.a.lock(&key)
            .run(async { fx.a.lock(&key).wait(Duration::ZERO).acquire().await })
            .await
            .unwrap();
    assert!(escaped.is_lost(), "a joined guard outlived its hold");
    bounded(
        Duration::from_secs(1),
        "the escaped guard's lost()",
        escaped.lost(),
    )
    .await;
    // Someone else holds the key now: the escaped guard must not look held beside them.
    let other = fx.b.lock(&key).acquire().await.unwrap();
    assert!(escaped.is_lost());
    assert!(matches!(
        escaped.release().await,
        Err(LockError::Lost { .. })
    ));
    assert!(!other.is_lost());
    other.release().await.unwrap();
    fx.all_free(&[&key]).await;
}

/// Inside a hold of {a, b}, a nested call on b joins; inside a hold of a, a nested call on
/// {a, b} is a `Config` error naming `keys` (upgrading a held set is not atomic).
pub(crate) async fn reentrant_subset_joins_superset_is_an_error(fx: &Fx) {
    let (ka, kb) = two_keys("beh:subset");
    let (a, k) = (fx.a.clone(), kb.clone());
    let subset =
        fx.a.lock_many([&ka, &kb])
            .run(async move { a.lock(&k).wait(Duration::ZERO).run(async { Ok(1) }).await })
            .await;
    assert_eq!(subset, Ok::<u32, LockError>(1));
    fx.all_free(&[&ka, &kb]).await;

    let (a, keys) = (fx.a.clone(), [ka.clone(), kb.clone()]);
    let superset =
        fx.a.lock(&ka)
            .run(async move {
                let nested = a
                    .lock_many(keys)
                    .wait(Duration::ZERO)
                    .run(async { Ok::<u32, LockError>(1) })
                    .await;
                Ok::<_, LockError>(nested)
            })
            .await
            .unwrap();
    match superset {
        Err(LockError::Config { field, reason }) => {
            assert_eq!(field, "keys", "{reason}");
        }
        other => panic!("expected a Config error on `keys`, got {other:?}"),
    }
    fx.all_free(&[&ka, &kb]).await;
}

/// A task spawned inside a hold, or a thread started there, is not the holder: with wait 0 it is
/// `Contended`.
pub(crate) async fn spawned_task_inside_a_hold_waits(fx: &Fx) {
    let key = unique_key("beh:spawned");
    let (a, k) = (fx.a.clone(), key.clone());
    let (task, thread) =
        fx.a.lock(&key)
            .run(async move {
                let task = tokio::spawn(run_now(a.clone(), k.clone(), true));
                let task = task.await.unwrap();
                let thread = std::thread::spawn(move || run_now_blocking(&a, &k, true));
                let thread = tokio::task::spawn_blocking(move || thread.join().unwrap());
                Ok::<_, LockError>((task, thread.await.unwrap()))
            })
            .await
            .unwrap();
    assert!(task.unwrap_err().is_contended(), "a spawned task joined");
    assert!(thread.unwrap_err().is_contended(), "another thread joined");
}

/// A loss reaches every level of a nested hold: the async stack is cancelled and every level
/// says `Lost` naming the key; a sync stack runs to its end, and neither level's success survives.
pub(crate) async fn loss_reaches_every_nested_level(fx: &Fx) {
    let key = unique_key("beh:nestedloss");
    let own = fx.client_with(|config| config);
    let dropped = std::sync::Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (inner_tx, inner_rx) = tokio::sync::oneshot::channel();
    let body = endless_body(&dropped, started_tx);
    let (inner_client, k) = (own.clone(), key.clone());
    let outer = tokio::spawn(own.lock(&key).run(async move {
        let inner = inner_client.lock(&k).wait(Duration::ZERO).run(body).await;
        let _ = inner_tx.send(inner.clone());
        inner
    }));
    let started = bounded(Duration::from_secs(5), "the inner body started", started);
    started.await.unwrap();
    shut_down(&own).await;
    let outer = bounded(Duration::from_secs(5), "the outer call ended", outer)
        .await
        .unwrap();
    assert_eq!(outer, Err(LockError::Lost { key: key.clone() }));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the inner body was not cancelled"
    );
    // Whether the inner call still reported (or was dropped with the outer body), never a success.
    if let Ok(inner) = inner_rx.await {
        assert_eq!(inner, Err(LockError::Lost { key: key.clone() }));
    }
    assert_eq!(fx.holders(&key), 0);

    // Sync: both bodies finish after the loss; both calls return `Lost`.
    let own = fx.client_with(|config| config);
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let (client, k) = (own.clone(), key.clone());
    let stack = tokio::task::spawn_blocking(move || {
        let mut inner = None;
        let outer = client.lock(&k).run_blocking(|| {
            inner = Some(client.lock(&k).wait(Duration::ZERO).run_blocking(|| {
                started_tx.send(()).unwrap();
                go.recv_timeout(Duration::from_secs(10)).unwrap();
                Ok::<u32, LockError>(1)
            }));
            Ok::<u32, LockError>(2)
        });
        (outer, inner)
    });
    let started = move || started.recv_timeout(Duration::from_secs(5)).unwrap();
    tokio::task::spawn_blocking(started).await.unwrap();
    shut_down(&own).await;
    go_tx.send(()).unwrap();
    let (outer, inner) = bounded(Duration::from_secs(5), "the sync stack ended", stack)
        .await
        .unwrap();
    assert_eq!(inner, Some(Err(LockError::Lost { key: key.clone() })));
    assert_eq!(outer, Err(LockError::Lost { key: key.clone() }));
}

/// With `reentrant(false)` a nested call is like any other caller: with wait 0 it is `Contended`.
pub(crate) async fn non_reentrant_nested_call_contends(fx: &Fx) {
    let key = unique_key("beh:nonreentrant");
    let (a, k) = (fx.a.clone(), key.clone());
    let nested =
        fx.a.lock(&key)
            .run(async move { Ok::<_, LockError>(run_now(a, k, false).await) })
            .await
            .unwrap();
    match nested {
        Err(LockError::Contended { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected Contended, got {other:?}"),
    }
    let (a, k) = (fx.a.clone(), key.clone());
    let nested = tokio::task::spawn_blocking(move || {
        a.lock(&k)
            .run_blocking(|| Ok::<_, LockError>(run_now_blocking(&a, &k, false)))
    })
    .await
    .unwrap()
    .unwrap();
    assert!(nested.unwrap_err().is_contended());
    fx.all_free(&[&key]).await;
}

/// `client` runs an empty body under `key` with wait 0: `Ok` if it joined or got the lock.
async fn run_now(client: LockClient, key: String, reentrant: bool) -> Result<(), LockError> {
    let lock = client.lock(key).reentrant(reentrant).wait(Duration::ZERO);
    lock.run(async { Ok(()) }).await
}

/// [`run_now`] from sync code.
fn run_now_blocking(client: &LockClient, key: &str, reentrant: bool) -> Result<(), LockError> {
    let lock = client.lock(key).reentrant(reentrant).wait(Duration::ZERO);
    lock.run_blocking(|| Ok(()))
}

/// Nested `run` calls `depth` deep on `key` through `client`, each with wait 0: the innermost
/// returns 0, each level adds 1.
fn nested_chain(
    client: LockClient,
    key: String,
    depth: u32,
) -> std::pin::Pin<Box<dyn Future<Output = Result<u32, LockError>> + Send>> {
    Box::pin(async move {
        let inner_client = client.clone();
        let inner_key = key.clone();
        client
            .lock(&key)
            .wait(Duration::ZERO)
            .run(async move {
                if depth == 0 {
                    Ok(0)
                } else {
                    nested_chain(inner_client, inner_key, depth - 1)
                        .await
                        .map(|n| n + 1)
                }
            })
            .await
    })
}
