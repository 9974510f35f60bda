// Free functions, sync and async: arguments, key templates, the guard binding, `?` and `return`.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::fmt;

struct Order {
    id: u32,
    customer: Customer,
}

struct Customer {
    name: String,
}

#[distributed_lock(key = "report:<day>")]
fn build_report(day: &str) -> Result<usize, LockError> {
    Ok(day.len())
}

#[distributed_lock(
    key = "{orders}:<order.id>:<order.customer.name>",
    ttl = "500ms",
    wait = "1m 30s"
)]
fn ship(order: &Order) -> Result<String, LockError> {
    Ok(format!("{} for {}", order.id, order.customer.name))
}

// `guard` exposes the held lock; `mut` parameters stay mutable; `return` leaves the body only, so
// the lock is still released.
#[distributed_lock(key = "counter:<name>", ttl = "10s", wait = "0s", guard = lock)]
fn count(name: &str, mut times: u32) -> Result<(String, u32), LockError> {
    assert!(!lock.is_lost());
    assert_eq!(lock.key(), format!("counter:{name}"));
    if times == 0 {
        return Ok((lock.key().to_owned(), 0));
    }
    times *= 2;
    Ok((lock.key().to_owned(), times))
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

// `?` converts into the declared error type, inside the locked body.
#[distributed_lock(key = "parse:<text>")]
fn parse(text: &str) -> Result<u32, AppError> {
    let value: u32 = text.parse()?;
    Ok(value)
}

// A key part only needs `Display`; `impl Trait` arguments work.
#[distributed_lock(key = "display:<what>:<<literal>>")]
fn show(what: impl fmt::Display) -> Result<String, LockError> {
    Ok(what.to_string())
}

// A non-reentrant nested lock on the same key contends instead of deadlocking: the inner call
// fails fast. (Reentrant nesting, the default, is in `reentrant.rs`.)
#[distributed_lock(key = "wallet:<user_id>")]
fn outer(user_id: u64) -> Result<Result<(), LockError>, LockError> {
    Ok(inner(user_id))
}

#[distributed_lock(key = "wallet:<user_id>", wait = "0s", reentrant = false)]
fn inner(user_id: u64) -> Result<(), LockError> {
    let _ = user_id;
    Ok(())
}

#[distributed_lock(key = "async:<user_id>", ttl = "10s", wait = "5s", fencing = true, guard = lock)]
async fn withdraw(user_id: u64, amount: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    assert!(lock.fencing_token().is_some());
    Ok(user_id * 100 - amount)
}

#[distributed_lock(key = "async-parse:<text>")]
async fn parse_async(text: String) -> Result<u32, AppError> {
    tokio::task::yield_now().await;
    if text.is_empty() {
        return Ok(0);
    }
    Ok(text.parse()?)
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();

    assert_eq!(build_report("monday").unwrap(), 6);
    let order = Order {
        id: 7,
        customer: Customer { name: "ada".into() },
    };
    assert_eq!(ship(&order).unwrap(), "7 for ada");
    assert_eq!(count("a", 0).unwrap(), ("counter:a".to_owned(), 0));
    assert_eq!(count("b", 3).unwrap(), ("counter:b".to_owned(), 6));
    assert_eq!(parse("42").unwrap(), 42);
    assert!(matches!(parse("x"), Err(AppError::Parse(_))));
    assert_eq!(show(1.5).unwrap(), "1.5");
    assert!(matches!(outer(1), Ok(Err(LockError::Contended { .. }))));
    // Both locks were released: the key is free again.
    assert!(matches!(inner(1), Ok(())));

    assert_eq!(withdraw(3, 50).await.unwrap(), 250);
    assert_eq!(parse_async("12".into()).await.unwrap(), 12);
    assert_eq!(parse_async(String::new()).await.unwrap(), 0);
    assert!(matches!(
        parse_async("?".into()).await,
        Err(AppError::Parse(_))
    ));
}
