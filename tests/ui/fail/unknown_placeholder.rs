use lock_runtime::{LockError, distributed_lock};

// A misspelt parameter: the message names the nearest one and still lists them all.
#[distributed_lock(key = "wallet:<usr_id>")]
async fn withdraw(user_id: u64, amount: u64) -> Result<u64, LockError> {
    Ok(user_id + amount)
}

fn main() {
    let _ = withdraw(1, 2);
}
