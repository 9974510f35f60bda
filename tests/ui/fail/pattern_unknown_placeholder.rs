use lock_runtime::{LockError, distributed_lock};

pub struct Path<T>(pub T);
pub struct State<T>(pub T);

pub struct Wallets;

impl Wallets {
    // A name bound nowhere: the message lists the parameters and what their patterns bind.
    #[distributed_lock(key = "wallet:<usr>")]
    pub async fn withdraw(
        &self,
        State(bank): State<String>,
        Path((user, amount)): Path<(u64, i64)>,
        note: &str,
    ) -> Result<String, LockError> {
        Ok(format!("{bank} {user} {amount} {note}"))
    }
}

fn main() {}
