// `#[async_trait]` impls: by the time the attribute runs, `async fn f(..) -> R` has become
// `fn f(..) -> Pin<Box<dyn Future<Output = R> + Send + '_>>` with body `Box::pin(async move { .. })`;
// the lock is taken inside that async block, and `R` is the result type. No warnings: a parameter
// used only by the key (`audit`'s `user_id`) counts as used, as it does without `#[async_trait]`.
#![deny(warnings)]
use async_trait::async_trait;
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::sync::Arc;

#[async_trait]
trait Wallets {
    async fn withdraw(&self, user_id: u64, amount: u64) -> Result<u64, LockError>;
    async fn owner(&self) -> Result<String, LockError>;
    async fn rename(&mut self, name: String) -> Result<usize, LockError>;

    // A default body under the lock.
    #[distributed_lock(key = "wallets:default:<user_id>", guard = lock)]
    async fn audit(&self, user_id: u64) -> Result<String, LockError> {
        tokio::task::yield_now().await;
        Ok(lock.key().to_owned())
    }
}

struct Bank {
    name: String,
}

#[derive(Debug, PartialEq)]
enum BankError {
    Lock(String),
    Insufficient,
}

impl From<LockError> for BankError {
    fn from(err: LockError) -> Self {
        BankError::Lock(err.to_string())
    }
}

#[async_trait]
trait Ledger {
    async fn debit(&self, account: u32, amount: u64) -> Result<u64, BankError>;
}

#[async_trait]
impl Wallets for Bank {
    // A placeholder from an argument; `return` and `?` leave the body only.
    #[distributed_lock(key = "wallet:<user_id>", ttl = "10s", wait = "1s", guard = lock)]
    async fn withdraw(&self, user_id: u64, amount: u64) -> Result<u64, LockError> {
        assert_eq!(lock.key(), format!("wallet:{user_id}"));
        tokio::task::yield_now().await;
        if amount == 0 {
            return Ok(0);
        }
        let balance: Result<u64, LockError> = Ok(100);
        Ok(balance? - amount)
    }

    // A placeholder from `self`.
    #[distributed_lock(key = "bank:<self.name>", guard = lock)]
    async fn owner(&self) -> Result<String, LockError> {
        tokio::task::yield_now().await;
        Ok(format!("{} {}", self.name, lock.key()))
    }

    #[distributed_lock(key = "bank:<self.name>:<name>")]
    async fn rename(&mut self, name: String) -> Result<usize, LockError> {
        tokio::task::yield_now().await;
        self.name = name;
        Ok(self.name.len())
    }
}

#[async_trait]
trait Transfers {
    async fn transfer(&self, from: u32, to: u32, amount: u64) -> Result<u64, BankError>;
}

#[async_trait]
impl Transfers for Bank {
    // `keys`, with parameters used only by the keys, and the other new arguments.
    #[distributed_lock(
        keys = ["ledger:<self.name>:<from>", "ledger:<self.name>:<to>"],
        max_hold = "1m",
        reentrant = false
    )]
    async fn transfer(&self, from: u32, to: u32, amount: u64) -> Result<u64, BankError> {
        tokio::task::yield_now().await;
        Ok(amount)
    }
}

#[async_trait]
impl Ledger for Bank {
    // A user error type with `From<LockError>`.
    #[distributed_lock(key = "ledger:<self.name>:<account>")]
    async fn debit(&self, account: u32, amount: u64) -> Result<u64, BankError> {
        tokio::task::yield_now().await;
        if amount > 10 {
            return Err(BankError::Insufficient);
        }
        Ok(u64::from(account) + amount)
    }
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    let mut bank = Bank { name: "b".into() };
    assert_eq!(bank.withdraw(7, 30).await.unwrap(), 70);
    assert_eq!(bank.withdraw(7, 0).await.unwrap(), 0);
    assert_eq!(bank.owner().await.unwrap(), "b bank:b");
    assert_eq!(bank.audit(3).await.unwrap(), "wallets:default:3");
    assert_eq!(bank.rename("bb".into()).await.unwrap(), 2);
    assert_eq!(bank.debit(1, 2).await, Ok(3));
    assert_eq!(bank.debit(1, 20).await, Err(BankError::Insufficient));
    assert_eq!(bank.transfer(1, 2, 5).await, Ok(5));
    assert_eq!(bank.transfer(2, 2, 6).await, Ok(6));

    // Through a trait object, and spawned: the boxed future stays `Send`.
    let bank: Arc<dyn Wallets + Send + Sync> = Arc::new(bank);
    let spawned = tokio::spawn({
        let bank = bank.clone();
        async move { bank.owner().await }
    });
    assert_eq!(spawned.await.unwrap().unwrap(), "bb bank:bb");
}
