// `min_hold`: a body that returns at once still keeps the lock until `min_hold` has passed since
// the grant, on sync and async fns alike; the call itself returns at once.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::time::{Duration, Instant};

#[distributed_lock(key = "job:<day>", ttl = "10s", min_hold = "300ms")]
async fn nightly(day: &str) -> Result<usize, LockError> {
    Ok(day.len())
}

#[distributed_lock(key = "job:<day>", min_hold = "300ms", max_hold = "1m")]
fn nightly_sync(day: &str) -> Result<usize, LockError> {
    Ok(day.len())
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    let started = Instant::now();
    assert_eq!(nightly("2026-11-29").await.unwrap(), 10);
    assert!(started.elapsed() < Duration::from_millis(300));
    // Kept after the body returned: the next run is refused until min_hold has passed.
    assert!(matches!(
        nightly("2026-11-29").await,
        Err(LockError::Contended { .. })
    ));
    assert!(matches!(
        nightly_sync("2026-11-29"),
        Err(LockError::Contended { .. })
    ));
    assert!(started.elapsed() < Duration::from_millis(300));

    let started = Instant::now();
    assert_eq!(nightly_sync("2026-11-30").unwrap(), 10);
    assert!(started.elapsed() < Duration::from_millis(300));
    assert!(matches!(
        nightly_sync("2026-11-30"),
        Err(LockError::Contended { .. })
    ));
}
