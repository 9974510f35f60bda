use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "answer:<x>")]
const fn answer(x: u8) -> Result<u8, LockError> {
    Ok(x)
}

fn main() {
    let _ = answer(42);
}
