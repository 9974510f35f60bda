// Reentrancy (the default): a locked call made inside a locked body, on the same thread (sync) or
// task (async), on a key that body holds, joins the hold instead of waiting on itself, so
// `wait = "0s"` still succeeds. `reentrant = false` makes it one more caller; a spawned task is
// never the holder.
use lock_runtime::{LockConfig, LockError, distributed_lock};

#[distributed_lock(key = "account:<id>", wait = "0s")]
fn inner(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "account:<id>")]
fn outer(id: u64) -> Result<u64, LockError> {
    Ok(inner(id)? + 1)
}

// Three levels, the middle one through a method.
struct Accounts;

impl Accounts {
    #[distributed_lock(key = "account:<id>", wait = "0s")]
    fn middle(&self, id: u64) -> Result<u64, LockError> {
        Ok(outer(id)? + 1)
    }
}

#[distributed_lock(key = "account:<id>", wait = "0s", reentrant = false)]
fn inner_strict(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "account:<id>")]
fn outer_strict(id: u64) -> Result<Result<u64, LockError>, LockError> {
    Ok(inner_strict(id))
}

// A nested call on a subset of the held keys joins too.
#[distributed_lock(keys = ["account:<a>", "account:<b>"])]
fn both(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(inner(a)? + inner(b)?)
}

#[distributed_lock(key = "account:<id>", wait = "0s")]
async fn inner_async(id: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id)
}

#[distributed_lock(key = "account:<id>", wait = "0s", reentrant = false)]
async fn inner_async_strict(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "account:<id>", guard = lock)]
async fn outer_async(id: u64) -> Result<(u64, Result<u64, LockError>), LockError> {
    let joined = inner_async(id).await?;
    assert!(!lock.is_lost());
    Ok((joined + 1, inner_async_strict(id).await))
}

// A spawned task runs outside the body's task, so it is not the holder and contends.
#[distributed_lock(key = "account:<id>")]
async fn spawns(id: u64) -> Result<Result<u64, LockError>, LockError> {
    Ok(tokio::spawn(inner_async(id)).await.unwrap())
}

#[distributed_lock(keys = ["account:<a>", "account:<b>"], wait = "0s")]
async fn both_async(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(inner_async(a).await? + inner_async(b).await?)
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    assert_eq!(outer(1).unwrap(), 2);
    assert_eq!(Accounts.middle(1).unwrap(), 3);
    assert!(matches!(
        outer_strict(1),
        Ok(Err(LockError::Contended { .. }))
    ));
    assert_eq!(both(1, 2).unwrap(), 3);
    assert_eq!(both(4, 4).unwrap(), 8);

    let (joined, strict) = outer_async(5).await.unwrap();
    assert_eq!(joined, 6);
    assert!(matches!(strict, Err(LockError::Contended { .. })));
    assert!(matches!(
        spawns(6).await,
        Ok(Err(LockError::Contended { .. }))
    ));
    assert_eq!(both_async(7, 8).await.unwrap(), 15);

    // Every hold ended with its outermost call: the keys are free.
    assert_eq!(inner_strict(1).unwrap(), 1);
    assert_eq!(inner_async_strict(5).await.unwrap(), 5);
    assert_eq!(inner_async_strict(6).await.unwrap(), 6);
}
