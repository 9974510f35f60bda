//! `#[distributed_lock]` against a real Redis node through the global client: contention, renewal,
//! loss (async cancelled, sync finished), cancellation, panic, keys from names bound by parameter
//! patterns, and mixed sync/async callers counting exactly, in this process and across processes.
//! One test, because `init` is per process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockConfig, LockError, distributed_lock};
use lock_tests::{
    RedisServer, Worker, finish_all, lock_keys, unique_key, wait_until, wait_until_async,
};

static BODY_RUNS: AtomicU32 = AtomicU32::new(0);
static FINISHED: AtomicBool = AtomicBool::new(false);

#[distributed_lock(key = "attr:<id>")]
async fn quick(id: &str) -> Result<(), LockError> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "attr:<id>", ttl = "500ms", fencing = true, guard = lock)]
async fn long_async(id: &str, hold: Duration) -> Result<u64, LockError> {
    tokio::time::sleep(hold).await;
    Ok(lock.fencing_token().unwrap_or(0))
}

#[distributed_lock(key = "attr:<id>", ttl = "600ms")]
async fn deleted_while_async(id: &str, url: &str) -> Result<(), LockError> {
    delete_lock_key(url, id);
    tokio::time::sleep(Duration::from_secs(10)).await;
    FINISHED.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "attr:<id>", ttl = "600ms", guard = lock)]
fn deleted_while_sync(id: &str, url: &str) -> Result<bool, LockError> {
    delete_lock_key(url, id);
    let deadline = Instant::now() + Duration::from_secs(10);
    // The body keeps running; it may look at the guard itself.
    while !lock.is_lost() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    FINISHED.store(true, Ordering::SeqCst);
    Ok(lock.is_lost())
}

#[distributed_lock(key = "attr:<id>", ttl = "30s")]
fn panics(id: &str) -> Result<(), LockError> {
    panic!("boom in {id}");
}

#[distributed_lock(key = "attr:<id>", ttl = "5s", wait = "20s")]
async fn increment_async(id: &str, url: &str) -> Result<(), LockError> {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let inside: i64 = redis::cmd("INCR")
        .arg(format!("{id}:inside"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(inside, 1, "two holders at once");
    let n: i64 = redis::cmd("GET")
        .arg(format!("{id}:n"))
        .query_async::<Option<i64>>(&mut conn)
        .await
        .unwrap()
        .unwrap_or(0);
    tokio::task::yield_now().await;
    let _: () = redis::cmd("SET")
        .arg(format!("{id}:n"))
        .arg(n + 1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DECR")
        .arg(format!("{id}:inside"))
        .query_async(&mut conn)
        .await
        .unwrap();
    Ok(())
}

#[distributed_lock(key = "attr:<id>", ttl = "5s", wait = "20s")]
fn increment_sync(id: &str, conn: &mut redis::Connection) -> Result<(), LockError> {
    let inside: i64 = redis::cmd("INCR")
        .arg(format!("{id}:inside"))
        .query(conn)
        .unwrap();
    assert_eq!(inside, 1, "two holders at once");
    let n: Option<i64> = redis::cmd("GET")
        .arg(format!("{id}:n"))
        .query(conn)
        .unwrap();
    std::thread::yield_now();
    let _: () = redis::cmd("SET")
        .arg(format!("{id}:n"))
        .arg(n.unwrap_or(0) + 1)
        .query(conn)
        .unwrap();
    let _: i64 = redis::cmd("DECR")
        .arg(format!("{id}:inside"))
        .query(conn)
        .unwrap();
    Ok(())
}

// axum's extractors, in small: handlers whose key names what their parameter patterns bind.
struct Path<T>(T);
struct State<T>(T);

/// Holds `attr:<user>` until `release` fires (or 10s pass).
#[distributed_lock(key = "attr:<user>", guard = lock)]
async fn withdraw_async(
    State(release): State<tokio::sync::oneshot::Receiver<()>>,
    Path((user, amount)): Path<(String, u64)>,
) -> Result<(String, u64), LockError> {
    let _ = tokio::time::timeout(Duration::from_secs(10), release).await;
    Ok((lock.key().to_owned(), amount))
}

/// Holds `attr:<user>` until `release` fires (or 10s pass).
#[distributed_lock(key = "attr:<user>", guard = lock)]
fn withdraw_sync(
    State(release): State<std::sync::mpsc::Receiver<()>>,
    Path((user, amount)): Path<(String, u64)>,
) -> Result<(String, u64), LockError> {
    let _ = release.recv_timeout(Duration::from_secs(10));
    Ok((lock.key().to_owned(), amount))
}

/// The Redis lock key of `attr:<id>`, the key template of every fn here.
fn lock_key(id: &str) -> String {
    lock_keys(&format!("attr:{id}")).lock
}

fn delete_lock_key(url: &str, id: &str) {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let deleted: i64 = redis::cmd("DEL")
        .arg(lock_key(id))
        .query(&mut conn)
        .unwrap();
    assert_eq!(deleted, 1);
}

/// Waits (bounded) until the lock key is gone; returns how long it took.
fn wait_free(server: &RedisServer, id: &str) -> Duration {
    wait_until(Duration::from_secs(5), "the lock key is gone", || {
        server.keys(&lock_key(id)).is_empty()
    })
}

#[test]
fn the_attribute_on_redis() {
    // What the library logs, to say why a lock was lost if one is lost unexpectedly.
    lock_tests::capture::install();
    let server = RedisServer::start();
    let url = server.url();
    lock_runtime::init(LockConfig::single(&url)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // Contention: the body does not run.
    let id = unique_key("contended");
    rt.block_on(async {
        let held = Lock::new(format!("attr:{id}")).acquire().await.unwrap();
        let before = BODY_RUNS.load(Ordering::SeqCst);
        assert!(matches!(quick(&id).await, Err(LockError::Contended { .. })));
        assert_eq!(BODY_RUNS.load(Ordering::SeqCst), before);
        held.release().await.unwrap();
        quick(&id).await.unwrap();
        assert_eq!(BODY_RUNS.load(Ordering::SeqCst), before + 1);
    });

    // Renewal for the whole body: 4 TTLs, still held, and exclusive throughout.
    let id = unique_key("renewed");
    rt.block_on(async {
        let body = tokio::spawn({
            let id = id.clone();
            async move { long_async(&id, Duration::from_secs(2)).await }
        });
        wait_until_async(Duration::from_secs(5), "the body holds the lock", || {
            !server.keys(&lock_key(&id)).is_empty()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(matches!(quick(&id).await, Err(LockError::Contended { .. })));
        let held = body.await.unwrap();
        assert!(
            held.as_ref().is_ok_and(|fence| *fence > 0),
            "{held:?}; the library's loss events: {:?}",
            lock_tests::capture::lines()
                .into_iter()
                .filter(|line| line.contains("lost"))
                .collect::<Vec<_>>()
        );
    });
    assert!(server.keys(&lock_key(&id)).is_empty());

    // Loss in an async body: cancelled at its next .await, the call returns Lost.
    let id = unique_key("lost-async");
    FINISHED.store(false, Ordering::SeqCst);
    let start = Instant::now();
    let result = rt.block_on(deleted_while_async(&id, &url));
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(
        !FINISHED.load(Ordering::SeqCst),
        "the async body ran on after the loss"
    );
    eprintln!(
        "async body cancelled {:?} after the key was deleted",
        start.elapsed()
    );

    // Loss in a sync body: it runs to its end, then the call returns Lost.
    let id = unique_key("lost-sync");
    FINISHED.store(false, Ordering::SeqCst);
    let result = deleted_while_sync(&id, &url);
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(FINISHED.load(Ordering::SeqCst));

    // Cancellation: the future dropped mid-body frees the lock promptly.
    let id = unique_key("cancelled");
    rt.block_on(async {
        let cut = tokio::time::timeout(
            Duration::from_millis(200),
            long_async(&id, Duration::from_secs(30)),
        )
        .await;
        assert!(cut.is_err());
    });
    eprintln!("free after cancellation: {:?}", wait_free(&server, &id));

    // Panic: the lock is released and the panic goes on.
    let id = unique_key("panicked");
    let caught = std::panic::catch_unwind(|| panics(&id));
    assert!(caught.is_err());
    eprintln!("free after panic: {:?}", wait_free(&server, &id));

    // Keys from pattern bindings: `Path((user, amount))` locks `attr:<user>` itself. While one call
    // holds it, a call for the same user contends and one for another user goes through.
    let (user, other) = (
        unique_key("pattern-async"),
        unique_key("pattern-async-other"),
    );
    rt.block_on(async {
        let (release, gate) = tokio::sync::oneshot::channel();
        let first = tokio::spawn(withdraw_async(State(gate), Path((user.clone(), 1))));
        wait_until_async(
            Duration::from_secs(5),
            "the first call holds attr:<user>",
            || !server.keys(&lock_key(&user)).is_empty(),
        )
        .await;
        let (_, gate) = tokio::sync::oneshot::channel();
        let same = withdraw_async(State(gate), Path((user.clone(), 2))).await;
        assert!(matches!(same, Err(LockError::Contended { .. })), "{same:?}");
        let (open, gate) = tokio::sync::oneshot::channel();
        open.send(()).unwrap();
        let apart = withdraw_async(State(gate), Path((other.clone(), 3))).await;
        assert_eq!(apart.unwrap(), (format!("attr:{other}"), 3));
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), (format!("attr:{user}"), 1));
    });
    let (user, other) = (unique_key("pattern-sync"), unique_key("pattern-sync-other"));
    let (release, gate) = std::sync::mpsc::channel();
    let first = std::thread::spawn({
        let user = user.clone();
        move || withdraw_sync(State(gate), Path((user, 1)))
    });
    wait_until(
        Duration::from_secs(5),
        "the first call holds attr:<user>",
        || !server.keys(&lock_key(&user)).is_empty(),
    );
    let (_, gate) = std::sync::mpsc::channel();
    let same = withdraw_sync(State(gate), Path((user.clone(), 2)));
    assert!(matches!(same, Err(LockError::Contended { .. })), "{same:?}");
    let (open, gate) = std::sync::mpsc::channel();
    open.send(()).unwrap();
    let apart = withdraw_sync(State(gate), Path((other.clone(), 3)));
    assert_eq!(apart.unwrap(), (format!("attr:{other}"), 3));
    release.send(()).unwrap();
    assert_eq!(first.join().unwrap().unwrap(), (format!("attr:{user}"), 1));

    // Mixed callers in this process: 4 async tasks and 2 threads, 40 increments each, all done
    // within one bound (each call could wait 20s for the lock; together they take about a second).
    let id = unique_key("mixed");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (id, url, done_tx) = (id.clone(), url.clone(), done_tx.clone());
            std::thread::spawn(move || {
                let mut conn = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                for _ in 0..40 {
                    increment_sync(&id, &mut conn).unwrap();
                }
                done_tx.send(()).unwrap();
            })
        })
        .collect();
    drop(done_tx);
    rt.block_on(async {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (id, url) = (id.clone(), url.clone());
                tokio::spawn(async move {
                    for _ in 0..40 {
                        increment_async(&id, &url).await.unwrap();
                    }
                })
            })
            .collect();
        tokio::time::timeout_at(deadline.into(), async {
            for task in tasks {
                task.await.unwrap();
            }
        })
        .await
        .expect("the async callers did not finish in time");
    });
    for _ in &threads {
        done_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a sync caller failed or did not finish in time");
    }
    for thread in threads {
        thread.join().unwrap();
    }
    let total: i64 = redis::cmd("GET")
        .arg(format!("{id}:n"))
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(total, 240);

    // Across processes: 4 workers calling a sync locked fn on this single node.
    let id = unique_key("processes");
    let mut workers: Vec<Worker> = (0..4)
        .map(|_| {
            Worker::spawn(
                env!("CARGO_BIN_EXE_redlock_worker"),
                &[url.as_str(), url.as_str(), id.as_str(), id.as_str(), "25"],
            )
        })
        .collect();
    // 100 short critical sections: seconds at most; a hang is killed and fails here.
    for out in finish_all(&mut workers, Duration::from_secs(60)) {
        out.assert_success("redlock_worker");
        assert!(
            out.stdout.iter().any(|l| l.contains("violations=0 lost=0")),
            "{:?}",
            out.stdout
        );
    }
    let total: i64 = redis::cmd("GET")
        .arg(format!("{id}:counter"))
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(total, 100);
}
