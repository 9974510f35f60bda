// The attribute doesn't hide unused functions: `dead_code` still fires.
#![deny(dead_code)]

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "wallet:<user_id>")]
fn withdraw(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {}
