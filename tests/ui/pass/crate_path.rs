// `crate = "path"` reaches the runtime through a re-export, for facades that wrap lock_runtime.
mod facade {
    pub use lock_runtime as locks;
}

use facade::locks::{LockConfig, LockError};

#[facade::locks::distributed_lock(key = "facade:<id>", crate = "facade::locks")]
fn through_facade(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[lock_runtime::distributed_lock(key = "absolute:<id>", crate = "::lock_runtime")]
async fn absolute(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {
    facade::locks::init(LockConfig::in_memory()).unwrap();
    assert_eq!(through_facade(3).unwrap(), 3);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(runtime.block_on(absolute(4)).unwrap(), 4);
}
