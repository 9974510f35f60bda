use lock_runtime::{LockError, distributed_lock};

pub struct Path<T>(pub T);

// Rust itself rejects the second `user`; the attribute adds no error of its own. (The first
// `user` is unused with or without the attribute: the body and the key read the second.)
#[allow(unused_variables)]
#[distributed_lock(key = "wallet:<user>")]
pub fn withdraw(user: u64, Path((user, amount)): Path<(u64, i64)>) -> Result<i64, LockError> {
    Ok(amount + user as i64)
}

fn main() {}
