//! `lock_runtime::testing::Faults` (feature `testing`): an outage of the keys a pattern matches,
//! and a loss of a key now, injected into the in-memory backend; everything above the backend
//! (the attribute, `Lock`, guards, elections) behaves as on a real fault. The attribute's calls
//! and the README's axum example (at the end, as written there) go through the global client,
//! which the README's `tests::faults()` sets up once for this binary; they use keys of their own
//! (`job:`, `sync-job:`, `wallet:`), and only the README's test injects an outage there. The
//! other tests have clients and faults of their own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::testing::Faults;
// `LockError` and `distributed_lock` are imported by the README's code, at the end.
use lock_runtime::{FailureKind, Lock, LockClient, LockConfig};
use lock_tests::{client, unique_key};
use tokio::sync::oneshot;
use tokio::time::timeout;

/// The ttl of the locks that `lose` takes: its renewal period (a third) is 10 s.
const TTL: Duration = Duration::from_secs(30);

/// How long "now" may take: `lose` tells the holder before it returns, so this only covers
/// scheduling; it is far below the 10 s after which a renewal would have found the key gone,
/// so a holder that learnt of the loss from its renewal misses it.
const PROMPTLY: Duration = Duration::from_secs(2);

/// A client of its own on the in-memory backend with `faults`.
fn faulty(faults: &Faults) -> LockClient {
    client(LockConfig::in_memory().faults(faults.clone()))
}

/// Panics unless `lock` can be taken now (then gives it back).
async fn taken(lock: Lock) {
    lock.acquire().await.unwrap().release().await.unwrap();
}

/// Panics unless `result` is an `Unavailable` whose causes were injected.
fn injected(result: Result<impl std::fmt::Debug, LockError>) {
    match result {
        Err(LockError::Unavailable { causes, .. })
            if causes.iter().all(|c| c.kind == FailureKind::Injected) => {}
        other => panic!("expected an injected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn matching_keys_are_unavailable_with_an_injected_cause_and_the_others_are_not() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    faults.unavailable("order:?1:*");

    let err = locks.lock("order:11:a").acquire().await.unwrap_err();
    let LockError::Unavailable { causes, .. } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert_eq!(causes[0].kind, FailureKind::Injected, "{err}");
    assert!(causes[0].detail.contains("order:?1:*"), "{err}");
    assert!(err.to_string().contains("injected fault"), "{err}");
    assert_eq!(err.key(), Some("order:11:a"));
    // As a refused connection is.
    let io = std::io::Error::from(err);
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);

    // A lock over several keys is unavailable when one of them is.
    injected(locks.lock_many(["order:2", "order:21:b"]).acquire().await);
    // So are the requests of inspection.
    injected(locks.inspect("order:31:c").await);

    // `?` is one character, and the rest of the pattern must match too.
    for free in ["order:111:a", "order:1", "order:2:a", "wallet:11:a"] {
        let guard = locks.lock(free).acquire().await;
        assert!(guard.is_ok(), "{free}: {guard:?}");
    }
}

#[tokio::test]
async fn available_and_clear_end_the_outages() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    faults.unavailable("a:*");
    faults.unavailable("b:*");
    injected(locks.lock("a:1").acquire().await);

    assert!(faults.available("a:*"));
    assert!(!faults.available("a:*"), "ended already");
    taken(locks.lock("a:1")).await;
    injected(locks.lock("b:1").acquire().await);

    faults.clear();
    taken(locks.lock("b:1")).await;
}

#[tokio::test]
async fn an_acquire_under_an_outage_retries_within_its_wait() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    faults.unavailable("*");
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = timeout(wait + PROMPTLY, locks.lock("k").wait(wait).acquire()).await;
    injected(result.expect("an acquire answers within its wait"));
    assert!(
        started.elapsed() >= wait,
        "gave up after {:?}, before its wait",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_held_lock_under_an_outage_is_lost_when_its_validity_runs_out() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    let ttl = Duration::from_millis(300);
    let started = Instant::now();
    let guard = locks.lock("held").ttl(ttl).acquire().await.unwrap();
    faults.unavailable("held");
    assert!(
        !guard.is_lost(),
        "lost at once; an outage loses it at its deadline"
    );

    // Its validity: the ttl less the drift allowance (1 % + 2 ms) after the grant.
    let deadline = ttl - (ttl / 100 + Duration::from_millis(2));
    timeout(ttl + PROMPTLY, guard.lost())
        .await
        .expect("lost once its validity ran out");
    assert!(
        started.elapsed() >= deadline,
        "lost after {:?}",
        started.elapsed()
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test]
async fn lose_takes_the_lock_from_its_holder_now_and_frees_the_key() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    let guard = locks.lock("k").ttl(TTL).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").wait(TTL).acquire().await }
    });

    assert!(faults.lose("k"));
    assert!(guard.is_lost());
    timeout(PROMPTLY, guard.lost())
        .await
        .expect("lost() resolves once lose returned");
    // The key is free: the waiter gets it while the old guard still exists.
    let next = timeout(PROMPTLY, waiter).await.unwrap().unwrap().unwrap();
    assert!(!next.is_lost());
    assert!(
        matches!(guard.release().await, Err(LockError::Lost { ref key }) if key == "k"),
        "the old holder's release answers Lost"
    );
    next.release().await.unwrap();

    // Nobody holds it: nothing happens.
    assert!(!faults.lose("k"));
    assert!(!faults.lose("never-taken"));
}

#[tokio::test]
async fn lose_reaches_every_holder_of_the_key_and_names_it() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    let both = locks
        .lock_many(["x", "y"])
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let mut readers = Vec::new();
    for _ in 0..2 {
        let reader = locks.lock("r").shared(true).ttl(TTL).acquire().await;
        readers.push(reader.unwrap());
    }

    assert!(faults.lose("y"));
    assert!(faults.lose("r"));
    for guard in readers.iter().chain([&both]) {
        timeout(PROMPTLY, guard.lost()).await.expect("lost");
    }
    let lost = both.release().await;
    assert!(
        matches!(lost, Err(LockError::Lost { ref key }) if key == "y"),
        "{lost:?}"
    );
    // Both keys are free again: the lost holder's release let go of the one it still had.
    taken(locks.lock_many(["x", "y"])).await;
}

#[tokio::test]
async fn lose_deposes_the_leader() {
    let faults = Faults::new();
    let locks = faulty(&faults);
    let election = locks.election("leader").ttl(TTL);
    let leadership = election.campaign().await.unwrap();

    assert!(faults.lose("leader"));
    timeout(PROMPTLY, leadership.lost())
        .await
        .expect("leadership lost");
    assert!(leadership.is_lost());
    let next = timeout(PROMPTLY, election.campaign())
        .await
        .unwrap()
        .unwrap();
    assert!(next.epoch() > leadership.epoch());
}

#[tokio::test]
async fn faults_are_for_the_in_memory_backend_only() {
    let config = LockConfig::single("redis://127.0.0.1:1/").faults(Faults::new());
    let err = LockClient::new(config).unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Config {
                field: "faults",
                ..
            }
        ),
        "{err:?}"
    );
}

/// Tells the test it runs, then waits for `proceed`, which the test never sends: only a
/// cancellation ends it before `finished` is set.
#[distributed_lock(key = "job:<id>", ttl = "30s")]
async fn job(
    id: String,
    running: oneshot::Sender<()>,
    proceed: oneshot::Receiver<()>,
    finished: Arc<AtomicBool>,
) -> Result<(), LockError> {
    running.send(()).unwrap();
    let _ = proceed.await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn lose_cancels_an_async_body_and_its_call_answers_lost() {
    let faults = tests::faults();
    let id = unique_key("a");
    let (running_tx, running) = oneshot::channel();
    let (proceed, proceed_rx) = oneshot::channel::<()>();
    let finished = Arc::new(AtomicBool::new(false));
    let call = tokio::spawn(job(
        id.clone(),
        running_tx,
        proceed_rx,
        Arc::clone(&finished),
    ));
    timeout(PROMPTLY, running).await.unwrap().unwrap();

    assert!(faults.lose(&format!("job:{id}")));
    let answer = timeout(PROMPTLY, call)
        .await
        .expect("the body was cancelled: it waits for a message never sent")
        .unwrap();
    assert!(
        matches!(answer, Err(LockError::Lost { ref key }) if *key == format!("job:{id}")),
        "{answer:?}"
    );
    assert!(!finished.load(Ordering::SeqCst), "the body went on");
    assert!(proceed.is_closed(), "the body was dropped");
}

/// Tells the test it runs, then waits for `proceed` and succeeds.
#[distributed_lock(key = "sync-job:<id>", ttl = "30s")]
fn sync_job(
    id: &str,
    running: oneshot::Sender<()>,
    proceed: std::sync::mpsc::Receiver<()>,
) -> Result<u32, LockError> {
    running.send(()).unwrap();
    proceed.recv().unwrap();
    Ok(7)
}

#[tokio::test]
async fn a_sync_body_runs_to_its_end_after_lose_and_its_call_answers_lost() {
    let faults = tests::faults();
    let id = unique_key("s");
    let (running_tx, running) = oneshot::channel();
    let (proceed, proceed_rx) = std::sync::mpsc::channel();
    let call = tokio::task::spawn_blocking({
        let id = id.clone();
        move || sync_job(&id, running_tx, proceed_rx)
    });
    timeout(PROMPTLY, running).await.unwrap().unwrap();

    assert!(faults.lose(&format!("sync-job:{id}")));
    // The body cannot be interrupted: it goes on, and returns its success.
    proceed.send(()).unwrap();
    let answer = timeout(PROMPTLY, call).await.unwrap().unwrap();
    assert!(
        matches!(answer, Err(LockError::Lost { ref key }) if *key == format!("sync-job:{id}")),
        "a success after a loss does not count: {answer:?}"
    );
}

// The README's "Testing your code", as written there.

use axum::{Router, extract::Path, routing::post};
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "wallet:<user>")]
async fn withdraw(Path(user): Path<u64>) -> Result<String, LockError> {
    Ok(format!("withdrawn from {user}"))
}

pub(crate) fn app() -> Router {
    Router::new().route("/wallets/{user}/withdraw", post(withdraw))
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use axum::body::Body;
    use http::{Request, StatusCode};
    use lock_runtime::testing::Faults;
    use lock_runtime::{Lock, LockConfig};
    use tower::ServiceExt as _;

    use super::app;

    /// `init` runs once per test binary; every test of it (in parallel) shares this client and
    /// its faults, each with keys of its own, so that one's faults do not reach another's locks.
    pub(crate) fn faults() -> &'static Faults {
        static FAULTS: OnceLock<Faults> = OnceLock::new();
        FAULTS.get_or_init(|| {
            let faults = Faults::new();
            lock_runtime::init(LockConfig::in_memory().faults(faults.clone())).unwrap();
            faults
        })
    }

    async fn withdraw(user: u64) -> StatusCode {
        let request = Request::post(format!("/wallets/{user}/withdraw"))
            .body(Body::empty())
            .unwrap();
        app().oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn lock_failures_answer_409_and_503() {
        let faults = faults();
        assert_eq!(withdraw(1).await, StatusCode::OK);

        // Someone else holds the wallet: 409 Conflict.
        let held = Lock::new("wallet:2").acquire().await.unwrap();
        assert_eq!(withdraw(2).await, StatusCode::CONFLICT);
        held.release().await.unwrap();

        // The lock server is down: 503 Service Unavailable.
        faults.unavailable("wallet:3");
        assert_eq!(withdraw(3).await, StatusCode::SERVICE_UNAVAILABLE);
        faults.available("wallet:3");
        assert_eq!(withdraw(3).await, StatusCode::OK);
    }
}
