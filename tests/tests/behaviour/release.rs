//! A lock let go without `release`: a dropped guard (also on a plain thread), a cancelled
//! future and a panic free it promptly, not after its ttl.

use std::time::Duration;

use lock_tests::unique_key;

use super::fixture::Fx;

pub(crate) async fn dropped_guard_frees_promptly(fx: &Fx) {
    let key = unique_key("beh:drop");
    let guard =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
    drop(guard);
    let took = fx.time_until_free(&key).await;
    eprintln!("free after drop: {took:?}");
    // And a guard of the blocking API dropped on a plain thread, outside any runtime.
    let guard =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire_blocking()
            .unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let took = fx.time_until_free(&key).await;
    eprintln!("free after a drop on a plain thread: {took:?}");
}

pub(crate) async fn cancelled_future_frees_promptly(fx: &Fx) {
    let key = unique_key("beh:cancel");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let a = fx.a.clone();
    let k = key.clone();
    let task = tokio::spawn(async move {
        let guard = a
            .lock(&k)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        tx.send(()).unwrap();
        std::future::pending::<()>().await;
        drop(guard);
    });
    rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let took = fx.time_until_free(&key).await;
    eprintln!("free after cancellation: {took:?}");
}

pub(crate) async fn panic_frees(fx: &Fx) {
    let key = unique_key("beh:panic");
    let a = fx.a.clone();
    let k = key.clone();
    let task = tokio::spawn(async move {
        let _guard = a
            .lock(&k)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        panic!("boom inside the critical section");
    });
    assert!(task.await.unwrap_err().is_panic());
    let took = fx.time_until_free(&key).await;
    eprintln!("free after panic: {took:?}");
}
