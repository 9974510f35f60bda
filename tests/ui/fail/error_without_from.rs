use lock_runtime::distributed_lock;

#[derive(Debug)]
struct WalletError;

#[distributed_lock(key = "wallet:<user_id>")]
async fn withdraw(user_id: u64) -> Result<u64, WalletError> {
    Ok(user_id)
}

fn main() {
    let _ = withdraw(1);
}
