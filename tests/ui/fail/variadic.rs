// `...` is rejected by the attribute; on stable, rustc also rejects C-variadic functions itself.
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "log:<level>")]
unsafe extern "C" fn log(level: u8, _: ...) -> Result<u8, LockError> {
    Ok(level)
}

fn main() {}
