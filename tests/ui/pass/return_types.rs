// Any `Result<T, E>` with `E: From<LockError>` works, written directly or through an alias; the body
// keeps `?` and early `return`, and a contended lock comes back as the caller's error type.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::error::Error;

#[derive(Debug)]
enum WalletError {
    Lock(LockError),
    Insufficient { missing: u64 },
}

impl From<LockError> for WalletError {
    fn from(err: LockError) -> Self {
        WalletError::Lock(err)
    }
}

type WalletResult<T> = Result<T, WalletError>;
type BoxResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

mod app {
    pub type Result<T, E = lock_runtime::LockError> = std::result::Result<T, E>;
}

#[distributed_lock(key = "wallet:<user_id>", wait = "0s", reentrant = false)]
fn withdraw(user_id: u64, balance: u64, amount: u64) -> WalletResult<u64> {
    let _ = user_id;
    if amount > balance {
        return Err(WalletError::Insufficient {
            missing: amount - balance,
        });
    }
    Ok(balance - amount)
}

#[distributed_lock(key = "boxed:<input>")]
fn parse_boxed(input: &str) -> BoxResult<u64> {
    Ok(input.parse::<u64>()?)
}

#[distributed_lock(key = "boxed-async:<input>")]
async fn parse_boxed_async(input: String) -> Result<u64, Box<dyn Error + Send + Sync>> {
    Ok(input.parse::<u64>()?)
}

#[distributed_lock(key = "app:<id>")]
fn defaulted(id: u8) -> app::Result<u8> {
    Ok(id)
}

#[distributed_lock(key = "unit:<id>")]
fn unit_ok(id: u8) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// The outer call holds `wallet:1`, and `withdraw` is not reentrant, so the inner call is contended
// and reports it in `WalletError`.
#[distributed_lock(key = "wallet:<user_id>")]
fn nested(user_id: u64) -> WalletResult<WalletResult<u64>> {
    Ok(withdraw(user_id, 10, 1))
}

fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    assert_eq!(withdraw(1, 10, 3).unwrap(), 7);
    assert!(matches!(
        withdraw(1, 1, 3),
        Err(WalletError::Insufficient { missing: 2 })
    ));
    match nested(1) {
        Ok(Err(WalletError::Lock(err))) => assert!(matches!(err, LockError::Contended { .. })),
        other => panic!("expected contention, got {other:?}"),
    }
    assert_eq!(parse_boxed("5").unwrap(), 5);
    assert!(parse_boxed("x").is_err());
    assert_eq!(defaulted(4).unwrap(), 4);
    unit_ok(1).unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(runtime.block_on(parse_boxed_async("6".into())).unwrap(), 6);
}
