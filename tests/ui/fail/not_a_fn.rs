use lock_runtime::distributed_lock;

#[distributed_lock(key = "wallet")]
struct Wallet {
    balance: u64,
}

fn main() {
    let wallet = Wallet { balance: 1 };
    let _ = wallet.balance;
}
