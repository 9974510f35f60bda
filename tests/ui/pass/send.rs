// The generated future is `Send` whenever the body's is, so locked functions can be spawned.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::sync::Arc;

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[distributed_lock(key = "send:<id>", ttl = "2s", guard = lock)]
async fn work(id: u64, data: Arc<Vec<u8>>) -> Result<usize, LockError> {
    let _ = lock.fencing_token();
    tokio::task::yield_now().await;
    Ok(data.len() + id as usize)
}

struct Service {
    shard: u32,
}

impl Service {
    #[distributed_lock(key = "service:<self.shard>:<name>")]
    async fn handle(&self, name: String) -> Result<String, LockError> {
        tokio::task::yield_now().await;
        Ok(format!("{}/{name}", self.shard))
    }
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    let data = Arc::new(vec![1, 2, 3]);
    let handle = tokio::spawn(assert_send(work(1, data.clone())));
    assert_eq!(handle.await.unwrap().unwrap(), 4);

    let service = Arc::new(Service { shard: 9 });
    let handle = tokio::spawn(async move { service.handle("x".into()).await });
    assert_eq!(handle.await.unwrap().unwrap(), "9/x");
}
