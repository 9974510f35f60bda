use lock_runtime::{LockError, distributed_lock};

pub struct Path<T>(pub T);

#[distributed_lock(key = "wallet:<user>", guard = user)]
pub fn withdraw(Path((user, amount)): Path<(u64, i64)>) -> Result<i64, LockError> {
    Ok(amount + user as i64)
}

fn main() {}
