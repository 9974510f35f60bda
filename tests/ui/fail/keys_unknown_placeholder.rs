use lock_runtime::{LockError, distributed_lock};

// Each template follows the rules of `key`; the error points at the template that breaks one.
#[distributed_lock(keys = ["wallet:<from>", "wallet:<too>"])]
fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {
    let _ = transfer(1, 2);
}
