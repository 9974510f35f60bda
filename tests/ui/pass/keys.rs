// `keys = [..]`: one lock over several keys, all or nothing, on free fns, methods (`<self.x>`),
// generics, sync and async, beside `reentrant`, `max_hold` and `guard`.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::fmt::Display;
use std::sync::mpsc;
use std::thread;

#[distributed_lock(keys = ["wallet:<from>", "wallet:<to>"], ttl = "10s", wait = "5s")]
fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
    Ok(amount)
}

#[distributed_lock(keys = ["wallet:<from>", "wallet:<to>"], wait = "0s", reentrant = false)]
fn try_transfer(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
    Ok(amount)
}

#[distributed_lock(key = "wallet:<id>", wait = "0s", reentrant = false)]
fn touch(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// Holds `wallet:<id>` on another thread until told to let go.
#[distributed_lock(key = "wallet:<id>")]
fn hold(id: u64, held: mpsc::Sender<()>, release: mpsc::Receiver<()>) -> Result<(), LockError> {
    held.send(()).unwrap();
    release.recv().unwrap();
    Ok(())
}

#[distributed_lock(
    keys = ["wallet:<from>", "wallet:<to>"],
    wait = "5s",
    max_hold = "2m",
    guard = lock
)]
async fn transfer_async(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    assert!(!lock.is_lost());
    Ok(amount)
}

#[derive(Debug)]
#[allow(dead_code)] // the fields are only inspected through `Debug`
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(err: std::num::ParseIntError) -> Self {
        AppError::Parse(err)
    }
}

// `?` and `return` leave the body only, as with `key`; braces pass through.
#[distributed_lock(keys = ["audit:<day>", "report:<day>", "{global}:reports"])]
fn audit(day: &str) -> Result<u32, AppError> {
    if day.is_empty() {
        return Ok(0);
    }
    Ok(day.parse()?)
}

struct Bank {
    name: String,
    moved: u64,
}

impl Bank {
    #[distributed_lock(keys = ["<self.name>:<from>", "<self.name>:<to>"], reentrant = false)]
    fn move_funds(&self, from: u64, to: u64) -> Result<String, LockError> {
        Ok(format!("{}:{from}->{to}", self.name))
    }

    #[distributed_lock(keys = ["<self.name>:<from>", "<self.name>:<to>"], max_hold = "1m")]
    async fn move_funds_async(
        &mut self,
        from: u64,
        to: u64,
        amount: u64,
    ) -> Result<u64, LockError> {
        tokio::task::yield_now().await;
        self.moved += amount;
        Ok(self.moved)
    }

    #[distributed_lock(keys = ["bank:<self.name>", "<self>"])]
    fn close(self) -> Result<u64, LockError> {
        Ok(self.moved)
    }
}

impl Display for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bank-{}", self.name)
    }
}

#[distributed_lock(keys = ["pair:<a>", "pair:<b>"], reentrant = true, max_hold = "30s")]
fn pair<A: Display, B: Display + ?Sized>(a: A, b: &B) -> Result<String, LockError> {
    Ok(format!("{a}/{b}"))
}

#[distributed_lock(keys = ["pair:<a>", "pair:<b>"], reentrant = false)]
async fn pair_async<A>(a: A, b: impl Display + Send) -> Result<String, LockError>
where
    A: Display + Send,
{
    tokio::task::yield_now().await;
    Ok(format!("{a}/{b}"))
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    assert_eq!(transfer(1, 2, 10).unwrap(), 10);
    assert_eq!(transfer(2, 1, 10).unwrap(), 10);
    // The same key twice is one key.
    assert_eq!(transfer(1, 1, 5).unwrap(), 5);
    assert_eq!(try_transfer(3, 3, 5).unwrap(), 5);
    assert_eq!(transfer_async(1, 2, 7).await.unwrap(), 7);
    assert_eq!(transfer_async(2, 2, 7).await.unwrap(), 7);
    assert_eq!(audit("12").unwrap(), 12);
    assert_eq!(audit("").unwrap(), 0);
    assert!(matches!(audit("x"), Err(AppError::Parse(_))));

    // All or nothing: while another thread holds `wallet:2`, a transfer from 1 to 2 is contended
    // and leaves `wallet:1` free.
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let holder = thread::spawn(move || hold(2, held_tx, release_rx));
    held_rx.recv().unwrap();
    assert!(matches!(
        try_transfer(1, 2, 1),
        Err(LockError::Contended { .. })
    ));
    assert!(matches!(
        try_transfer(2, 1, 1),
        Err(LockError::Contended { .. })
    ));
    assert_eq!(touch(1).unwrap(), 1);
    release_tx.send(()).unwrap();
    holder.join().unwrap().unwrap();
    assert_eq!(try_transfer(1, 2, 1).unwrap(), 1);

    let mut bank = Bank {
        name: "b".into(),
        moved: 0,
    };
    assert_eq!(bank.move_funds(1, 2).unwrap(), "b:1->2");
    assert_eq!(bank.move_funds_async(1, 2, 3).await.unwrap(), 3);
    assert_eq!(bank.move_funds_async(2, 2, 4).await.unwrap(), 7);
    assert_eq!(bank.close().unwrap(), 7);

    assert_eq!(pair(1, "x").unwrap(), "1/x");
    assert_eq!(pair("y", "y").unwrap(), "y/y");
    assert_eq!(pair_async(2.5, 'z').await.unwrap(), "2.5/z");
}
