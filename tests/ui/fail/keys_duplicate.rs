use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = ["wallet:<from>", "wallet:<to>", "wallet:<from>"])]
fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {
    let _ = transfer(1, 2);
}
