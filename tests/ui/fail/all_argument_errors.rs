use lock_runtime::{LockError, distributed_lock};

// Independent mistakes are all reported in one compilation, each on its own span.
#[distributed_lock(
    key = "wallet:<usr_id>:<>",
    ttl = "0s",
    wait = "soon",
    retries = 3,
    wait = "1s"
)]
const fn withdraw(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = withdraw(1);
}
