// Generated code adds no warnings, even under `deny(warnings)` and with `mut` parameters that the
// body overwrites before reading, early returns and unused `?` conversions.
#![deny(warnings)]

use lock_runtime::{LockConfig, LockError, distributed_lock};

#[distributed_lock(key = "dw:sync:<id>", ttl = "10s", wait = "0s", guard = lock)]
fn sync_fn(id: u32, mut count: u32) -> Result<u32, LockError> {
    count = u32::from(!lock.is_lost());
    if id == 0 {
        return Ok(0);
    }
    Ok(id + count)
}

#[distributed_lock(key = "dw:async:<id>")]
async fn async_fn(id: u32, mut label: String) -> Result<String, LockError> {
    label = format!("{label}{id}");
    Ok(label)
}

struct Counter {
    id: u32,
    value: u32,
}

impl Counter {
    #[distributed_lock(key = "dw:counter:<self.id>")]
    async fn reset(mut self) -> Result<u32, LockError> {
        self.value = 0;
        Ok(self.value)
    }

    #[distributed_lock(key = "dw:counter:<self.id>")]
    fn bump(&mut self) -> Result<u32, LockError> {
        self.value += 1;
        Ok(self.value)
    }
}

#[distributed_lock(key = "dw:static")]
fn static_key() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    assert_eq!(sync_fn(2, 5).unwrap(), 3);
    assert_eq!(sync_fn(0, 5).unwrap(), 0);
    static_key().unwrap();
    let mut counter = Counter { id: 1, value: 4 };
    assert_eq!(counter.bump().unwrap(), 5);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        assert_eq!(async_fn(1, "a".into()).await.unwrap(), "a1");
        assert_eq!(counter.reset().await.unwrap(), 0);
    });
}
