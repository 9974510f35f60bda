use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "wallet:<user_id>", timeout = "10s")]
fn withdraw(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

// The function is still emitted, so callers get no follow-on errors.
fn main() {
    let _ = withdraw(1);
}
