// Native `async fn` in traits: the attribute on trait impls (including one whose trait promises a
// `Send` future), on a trait's default method, and dispatch through generics.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::future::Future;

trait Jobs {
    async fn run(&self, job: u32) -> Result<u32, LockError>;

    // The trait promises a `Send` future; the impl writes `async fn`.
    fn run_send(&self, job: u32) -> impl Future<Output = Result<u32, LockError>> + Send;

    // A default body under the lock.
    #[distributed_lock(key = "jobs:default:<job>")]
    async fn run_default(&self, job: u32) -> Result<u32, LockError> {
        tokio::task::yield_now().await;
        Ok(job + 1)
    }
}

struct Worker {
    name: String,
}

impl Jobs for Worker {
    #[distributed_lock(key = "jobs:<self.name>:<job>", ttl = "10s", wait = "1s")]
    async fn run(&self, job: u32) -> Result<u32, LockError> {
        tokio::task::yield_now().await;
        Ok(job * 2)
    }

    #[distributed_lock(key = "jobs:send:<self.name>:<job>", guard = lock)]
    async fn run_send(&self, job: u32) -> Result<u32, LockError> {
        tokio::task::yield_now().await;
        assert!(!lock.is_lost());
        Ok(job * 3)
    }
}

async fn drive<J: Jobs + Sync>(jobs: &J) -> Result<u32, LockError> {
    Ok(jobs.run(1).await? + jobs.run_send(1).await? + jobs.run_default(1).await?)
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    let worker = Worker { name: "w".into() };
    assert_eq!(drive(&worker).await.unwrap(), 2 + 3 + 2);

    // The `Send` promise holds: the future can be spawned.
    let worker = std::sync::Arc::new(worker);
    let spawned = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_send(5).await }
    });
    assert_eq!(spawned.await.unwrap().unwrap(), 15);
}
