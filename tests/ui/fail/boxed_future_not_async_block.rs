use lock_runtime::{LockError, distributed_lock};
use std::future::Future;
use std::pin::Pin;

struct Service;

impl Service {
    async fn inner(&self) -> Result<u64, LockError> {
        Ok(1)
    }

    // A hand-written boxed future that is not an async block: there is nowhere to put the lock.
    #[distributed_lock(key = "service")]
    fn run(&self) -> Pin<Box<dyn Future<Output = Result<u64, LockError>> + Send + '_>> {
        Box::pin(self.inner())
    }
}

fn main() {
    let _ = Service.run();
}
