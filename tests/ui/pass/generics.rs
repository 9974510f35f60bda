// Generic functions: type and lifetime parameters, `where` clauses, `impl Trait` arguments, pattern
// parameters beside named ones, and `impl Trait` inside the return type.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::fmt::{Debug, Display};

#[distributed_lock(key = "generic:<id>")]
fn describe<T: Display, U>(id: T, extra: U) -> Result<String, LockError>
where
    U: Debug,
{
    Ok(format!("{id}/{extra:?}"))
}

#[distributed_lock(key = "longest:<a>")]
fn longest<'a, 'b: 'a>(a: &'a str, b: &'b str) -> Result<&'a str, LockError> {
    Ok(if a.len() >= b.len() { a } else { b })
}

#[distributed_lock(key = "items:<name>")]
async fn total(
    name: impl Display + Send,
    items: impl IntoIterator<Item = u32> + Send,
) -> Result<u32, LockError> {
    let _ = name.to_string();
    Ok(items.into_iter().sum())
}

// Pattern parameters beside named ones (what they bind can be in the key too: pattern_params.rs).
#[distributed_lock(key = "point:<label>")]
fn point(label: &str, (x, y): (i32, i32), &z: &i32) -> Result<i32, LockError> {
    let _ = label;
    Ok(x + y + z)
}

// `impl Trait` in the return type.
#[distributed_lock(key = "iter:<n>")]
fn numbers(n: u32) -> Result<impl Iterator<Item = u32>, LockError> {
    Ok(0..n)
}

#[distributed_lock(key = "async-iter:<n>")]
async fn numbers_async(n: u32) -> Result<impl Iterator<Item = u32> + Send, LockError> {
    Ok(0..n)
}

fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    assert_eq!(describe(7, "x").unwrap(), "7/\"x\"");
    assert_eq!(longest("abc", "de").unwrap(), "abc");
    assert_eq!(point("p", (1, 2), &3).unwrap(), 6);
    assert_eq!(numbers(3).unwrap().sum::<u32>(), 3);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        assert_eq!(total("t", vec![1, 2, 3]).await.unwrap(), 6);
        assert_eq!(numbers_async(4).await.unwrap().sum::<u32>(), 6);
    });
}
