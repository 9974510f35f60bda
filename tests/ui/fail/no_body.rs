use lock_runtime::{LockError, distributed_lock};

trait Wallet {
    #[distributed_lock(key = "wallet:<user_id>")]
    fn withdraw(&self, user_id: u64) -> Result<u64, LockError>;
}

fn main() {}
