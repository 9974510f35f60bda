use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "wallet:<user_id>", fencing = 1)]
fn withdraw(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = withdraw(1);
}
