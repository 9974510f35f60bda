use lock_runtime::{LockError, distributed_lock};

struct UserId(u64);

#[distributed_lock(key = "wallet:<user_id>")]
fn withdraw(user_id: UserId) -> Result<u64, LockError> {
    Ok(user_id.0)
}

fn main() {
    let _ = withdraw(UserId(1));
}
