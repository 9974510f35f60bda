use lock_runtime::{LockError, distributed_lock};

struct Account {
    id: u64,
}

impl Account {
    #[distributed_lock(key = "account:<self.id>")]
    fn open(id: u64) -> Result<Account, LockError> {
        Ok(Account { id })
    }
}

fn main() {
    let _ = Account::open(1).map(|account| account.id);
}
