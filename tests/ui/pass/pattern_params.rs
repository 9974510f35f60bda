// Key placeholders name what parameter patterns bind, as in an axum handler:
// `State(app): State<App>, Path((user, amount)): Path<(u64, i64)>` binds `app`, `user` and
// `amount`. Tuple, tuple-struct, struct (with `..` and renamed fields), nested and reference
// patterns, `x @ ..`, `ref` and `mut` bindings, field paths on bound names; sync and async fns,
// methods with every receiver, `#[async_trait]`, generics and `impl Trait`. The key borrows the
// bindings before the body runs, so the body still owns and moves them as written. No warnings:
// a binding used only by the key counts as used.
#![deny(warnings)]
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::fmt::Display;

// axum's extractors and response, in small.
struct Path<T>(pub T);
struct State<T>(pub T);
struct Query<T>(pub T);
struct Json<T>(pub T);

#[derive(Clone)]
struct App {
    tenant: String,
    balance: i64,
}

struct Params {
    page: u32,
    per_page: u32,
}

#[derive(Debug)]
#[allow(dead_code)] // only inspected through `Debug`
enum AppError {
    Lock(LockError),
    Insufficient,
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

// The handler of the issue.
#[distributed_lock(key = "wallet:<user>", wait = "1s", guard = lock)]
async fn withdraw(
    State(app): State<App>,
    Path((user, amount)): Path<(u64, i64)>,
) -> Result<Json<i64>, AppError> {
    assert_eq!(lock.key(), format!("wallet:{user}"));
    tokio::task::yield_now().await;
    if amount > app.balance {
        return Err(AppError::Insufficient);
    }
    Ok(Json(app.balance - amount))
}

// Sync, a field path on a bound name, a struct pattern with `..`, and the body moving the
// bindings the key borrowed.
#[distributed_lock(key = "{<app.tenant>}:list:<page>", guard = lock)]
fn list(
    State(app): State<App>,
    Query(Params { page, .. }): Query<Params>,
) -> Result<(String, String), AppError> {
    let tenant: String = app.tenant;
    assert_eq!(page, 2);
    Ok((tenant, lock.key().to_owned()))
}

struct Point {
    x: i32,
    y: i32,
}

// A renamed field (`y: why` binds `why`), a reference pattern, nested tuples with `_`, and
// `ref`, `ref mut` and `mut` bindings: the key shows the values from before the body.
#[distributed_lock(key = "shape:<x>:<why>:<a>:<b>:<first>:<count>:<per_page>", guard = lock)]
fn shapes(
    Point { x, y: why }: Point,
    &(a, b): &(u8, u8),
    Path((first, (_, ref last))): Path<(String, (u8, String))>,
    Path(mut count): Path<u32>,
    Query(Params {
        ref mut per_page, ..
    }): Query<Params>,
) -> Result<(String, String), LockError> {
    count += 1;
    *per_page *= 10;
    let owned: String = first;
    Ok((
        format!("{x} {why} {a} {b} {owned} {last} {count} {per_page}"),
        lock.key().to_owned(),
    ))
}

// `all @ (lo, hi)`: the parameter `all`, and `lo` and `hi` bound inside it.
#[distributed_lock(key = "range:<all.0>-<all.1>:<hi>", guard = lock)]
fn range(all @ (lo, hi): (u8, u8)) -> Result<(u8, String), LockError> {
    Ok((hi - lo, lock.key().to_owned()))
}

// Generics and `impl Trait` inside patterns.
#[distributed_lock(key = "generic:<id>:<label>")]
fn generic<T: Display, U>(
    Path((id, extra)): Path<(T, U)>,
    State(label): State<impl Display>,
) -> Result<(T, U), LockError> {
    Ok((id, extra))
}

#[distributed_lock(key = "generic-async:<id>", guard = lock)]
async fn generic_async<T: Display + Send>(Path(id): Path<T>) -> Result<String, LockError> {
    tokio::task::yield_now().await;
    Ok(format!("{id} {}", lock.key()))
}

struct Wallets {
    bank: String,
    moves: u32,
}

impl Wallets {
    #[distributed_lock(key = "<self.bank>:<user>", guard = lock)]
    async fn withdraw(&self, Path((user, amount)): Path<(u64, i64)>) -> Result<String, LockError> {
        tokio::task::yield_now().await;
        Ok(format!("{} {amount}", lock.key()))
    }

    #[distributed_lock(key = "<self.bank>:<user>")]
    fn deposit(&mut self, Path((user, amount)): Path<(u64, i64)>) -> Result<i64, LockError> {
        self.moves += 1;
        Ok(amount)
    }

    #[distributed_lock(key = "<self.bank>:<app.tenant>", guard = lock)]
    async fn close(self, State(app): State<App>) -> Result<String, LockError> {
        Ok(format!("{} {} {}", self.moves, app.balance, lock.key()))
    }
}

#[async_trait::async_trait]
trait Handlers {
    async fn handle(
        &self,
        state: State<App>,
        path: Path<(u64, i64)>,
        pair: &(u8, u8),
    ) -> Result<String, LockError>;
}

// `#[async_trait]` renames pattern parameters `__argN` and destructures them in its async block;
// the key still names what they bind.
#[async_trait::async_trait]
impl Handlers for Wallets {
    #[distributed_lock(key = "<self.bank>:<app.tenant>:<user>:<a>", guard = lock)]
    async fn handle(
        &self,
        State(app): State<App>,
        Path((user, mut amount)): Path<(u64, i64)>,
        &(a, b): &(u8, u8),
    ) -> Result<String, LockError> {
        amount += i64::from(a + b);
        tokio::task::yield_now().await;
        Ok(format!("{user} {} {amount} {}", app.balance, lock.key()))
    }
}

#[tokio::main]
async fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    let app = App {
        tenant: "acme".into(),
        balance: 100,
    };

    let Json(left) = withdraw(State(app.clone()), Path((7, 30))).await.unwrap();
    assert_eq!(left, 70);
    assert!(matches!(
        withdraw(State(app.clone()), Path((7, 300))).await,
        Err(AppError::Insufficient)
    ));

    let query = Query(Params {
        page: 2,
        per_page: 10,
    });
    assert_eq!(
        list(State(app.clone()), query).unwrap(),
        ("acme".to_owned(), "{acme}:list:2".to_owned())
    );

    let params = Params {
        page: 0,
        per_page: 5,
    };
    let (body, key) = shapes(
        Point { x: 1, y: 2 },
        &(3, 4),
        Path(("f".into(), (0, "l".into()))),
        Path(6),
        Query(params),
    )
    .unwrap();
    assert_eq!(body, "1 2 3 4 f l 7 50");
    assert_eq!(key, "shape:1:2:3:4:f:6:5");

    assert_eq!(range((2, 5)).unwrap(), (3, "range:2-5:5".to_owned()));
    assert_eq!(generic(Path((1, 'x')), State("l")).unwrap(), (1, 'x'));
    assert_eq!(generic_async(Path("g")).await.unwrap(), "g generic-async:g");

    let mut wallets = Wallets {
        bank: "b".into(),
        moves: 0,
    };
    assert_eq!(wallets.withdraw(Path((1, 5))).await.unwrap(), "b:1 5");
    assert_eq!(wallets.deposit(Path((1, 6))).unwrap(), 6);
    assert_eq!(
        wallets
            .handle(State(app.clone()), Path((2, 10)), &(1, 2))
            .await
            .unwrap(),
        "2 100 13 b:acme:2:1"
    );
    assert_eq!(wallets.close(State(app)).await.unwrap(), "1 100 b:acme");
}
