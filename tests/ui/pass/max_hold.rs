// `max_hold`: past it an async body is cancelled and a sync body finishes, and either way the
// call returns `LockError::MaxHoldExceeded`; a body within it returns normally. The key is free
// right after.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static SYNC_BODY_FINISHED: AtomicBool = AtomicBool::new(false);

#[distributed_lock(key = "slow:<id>", max_hold = "50ms")]
async fn slow(id: u64) -> Result<u64, LockError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(id)
}

#[distributed_lock(keys = ["slow:<a>", "slow:<b>"], max_hold = "50ms", reentrant = false)]
async fn slow_pair(a: u64, b: u64) -> Result<u64, LockError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(a + b)
}

#[distributed_lock(key = "slow:<id>", max_hold = "50ms")]
fn slow_sync(id: u64) -> Result<u64, LockError> {
    std::thread::sleep(Duration::from_millis(200));
    SYNC_BODY_FINISHED.store(true, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key = "slow:<id>", wait = "0s", max_hold = "10s")]
async fn quick(id: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id)
}

#[distributed_lock(key = "slow:<id>", wait = "0s", max_hold = "1m 30s")]
fn quick_sync(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    let started = Instant::now();
    assert!(matches!(
        slow(1).await,
        Err(LockError::MaxHoldExceeded { .. })
    ));
    assert!(started.elapsed() < Duration::from_millis(900));
    assert_eq!(quick(1).await.unwrap(), 1);

    let started = Instant::now();
    assert!(matches!(
        slow_pair(2, 3).await,
        Err(LockError::MaxHoldExceeded { .. })
    ));
    assert!(started.elapsed() < Duration::from_millis(900));
    assert_eq!(quick(2).await.unwrap(), 2);
    assert_eq!(quick(3).await.unwrap(), 3);

    assert!(matches!(
        slow_sync(4),
        Err(LockError::MaxHoldExceeded { .. })
    ));
    assert!(SYNC_BODY_FINISHED.load(Ordering::SeqCst));
    assert_eq!(quick_sync(4).unwrap(), 4);
}
