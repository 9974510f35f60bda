use lock_runtime::{LockError, distributed_lock};

// The fake return edge: a body of the wrong type is reported against the declared return type.
#[distributed_lock(key = "wallet:<user_id>")]
fn withdraw(user_id: u64) -> Result<u64, LockError> {
    user_id
}

fn main() {
    let _ = withdraw(1);
}
