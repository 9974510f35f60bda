// Inherent and trait-impl methods with every receiver, `<self.field>` keys, generic impls with
// `where` clauses, and explicit and elided lifetimes in borrowed results.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::fmt::Display;

struct Account {
    id: u64,
    balance: u64,
    owner: Owner,
}

struct Owner {
    name: String,
}

impl Account {
    #[distributed_lock(key = "account:<self.id>")]
    fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>", ttl = "5s")]
    fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>:<self.owner.name>")]
    fn close(self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>")]
    async fn balance_async(&self) -> Result<u64, LockError> {
        tokio::task::yield_now().await;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>")]
    async fn deposit_async(&mut self, amount: u64) -> Result<u64, LockError> {
        tokio::task::yield_now().await;
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>")]
    async fn close_async(mut self) -> Result<u64, LockError> {
        self.balance = 0;
        Ok(self.balance)
    }

    // An associated function without receiver, keyed by an argument.
    #[distributed_lock(key = "account:<id>")]
    fn open(id: u64) -> Result<Self, LockError> {
        Ok(Self {
            id,
            balance: 0,
            owner: Owner { name: "new".into() },
        })
    }

    // Borrowed results: elided and explicit lifetimes.
    #[distributed_lock(key = "owner:<self.id>")]
    fn owner(&self) -> Result<&str, LockError> {
        Ok(&self.owner.name)
    }

    #[distributed_lock(key = "owner:<self.id>:<prefix>")]
    fn owner_or<'a>(&'a self, prefix: &'a str) -> Result<&'a str, LockError> {
        if prefix.is_empty() {
            Ok(&self.owner.name)
        } else {
            Ok(prefix)
        }
    }
}

// `<self>` renders the receiver itself.
struct Tenant(u32);

impl Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tenant-{}", self.0)
    }
}

impl Tenant {
    #[distributed_lock(key = "<self>:<self.0>", guard = lock)]
    fn key(&self) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }
}

// Generic impl with a `where` clause; a generic method on top.
struct Store<K> {
    name: K,
}

impl<K> Store<K>
where
    K: Display + Send + Sync,
{
    #[distributed_lock(key = "store:<self.name>:<item>")]
    fn put<V: Display>(&self, item: V) -> Result<String, LockError> {
        Ok(format!("{}={}", self.name, item))
    }

    #[distributed_lock(key = "store:<self.name>")]
    async fn name_len(&self) -> Result<usize, LockError>
    where
        K: 'static,
    {
        Ok(self.name.to_string().len())
    }
}

// Trait impl methods (sync), including a default method in the trait itself.
trait Ledger {
    fn id(&self) -> u64;
    fn post(&mut self, amount: u64) -> Result<u64, LockError>;

    #[distributed_lock(key = "ledger:audit")]
    fn audit(&self) -> Result<u64, LockError> {
        Ok(self.id())
    }
}

impl Ledger for Account {
    fn id(&self) -> u64 {
        self.id
    }

    #[distributed_lock(key = "ledger:<self.id>")]
    fn post(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance -= amount;
        Ok(self.balance)
    }
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    let mut account = Account::open(1).unwrap();
    assert_eq!(account.deposit(10).unwrap(), 10);
    assert_eq!(account.balance().unwrap(), 10);
    assert_eq!(account.deposit_async(5).await.unwrap(), 15);
    assert_eq!(account.balance_async().await.unwrap(), 15);
    assert_eq!(account.post(3).unwrap(), 12);
    assert_eq!(account.audit().unwrap(), 1);
    assert_eq!(account.owner().unwrap(), "new");
    assert_eq!(account.owner_or("x").unwrap(), "x");
    assert_eq!(account.close().unwrap(), 12);
    assert_eq!(Account::open(2).unwrap().close_async().await.unwrap(), 0);

    assert_eq!(Tenant(4).key().unwrap(), "tenant-4:4");
    let store = Store { name: "s" };
    assert_eq!(store.put(3).unwrap(), "s=3");
    assert_eq!(store.name_len().await.unwrap(), 1);
}
