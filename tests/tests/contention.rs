//! Waiting for a held lock: no polling storm, a crowd of waiters served without overlap, and
//! wake-ups that survive a lost notification connection (reset by the proxy, or killed by
//! `CLIENT KILL`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    FaultProxy, Monitor, RedisServer, SCHEDULING_SLACK, await_waiter, bounded, client, lock_keys,
    unique_key, wait_until_async, warm_up,
};

/// Makes the server load the queue's scripts, which a first call finds missing and sends again
/// (and several waiters queueing at once would each load): a waiter of the held lock `key` that
/// queues and gives up.
async fn load_queue_scripts(locks: &LockClient, key: &str) {
    match locks
        .lock(key)
        .wait(Duration::from_millis(50))
        .acquire()
        .await
    {
        Err(LockError::Contended { .. }) => {}
        other => panic!("held, yet {other:?}"),
    }
}

/// A waiter behind a holder of this library, whose release hands the lock on and tells it,
/// does not poll: once it has its place in the lock's queue (from its 10 ms threshold) it asks
/// only to renew it, every third of its 3 s lease. A 3 s wait costs its first attempt's mark
/// (one script: the mark and the `PTTL` read in one step), its attempt at the threshold, one a
/// second, its last, and leaving the queue: 6 script calls (when its own channel's
/// subscription is confirmed it looks at the key with `GET` and `PTTL`, where it asked with a
/// sixth; behind a holder whose release announces nothing, it asks every 300 ms at most: about
/// 14).
#[tokio::test]
async fn waiting_is_not_a_polling_storm() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("contention:storm");
    let held = client.lock(&key).acquire().await.unwrap();
    load_queue_scripts(&client, &key).await;
    let before = server.command_calls("evalsha");
    let wait = Duration::from_secs(3);
    match client.lock(&key).wait(wait).acquire().await {
        Err(LockError::Contended { waited, .. }) => assert!(waited >= wait),
        other => panic!("expected Contended, got {other:?}"),
    }
    let attempts = server.command_calls("evalsha") - before;
    eprintln!("script calls during a 3s wait: {attempts}");
    // The first attempt's mark, the threshold's attempt, the renewals at 1 s and 2 s, the last
    // at 3 s, the leaving.
    assert!(attempts <= 6, "{attempts} script calls in 3s");
    held.release().await.unwrap();
}

/// A holder whose release announces nothing (another library's, here a value set by hand):
/// its waiter asks every 300 ms at most (`2 x retry_delay x 1.5`), so it notices the key
/// deleted by hand within that, however long it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_notices_a_foreign_holders_key_deleted_within_its_polling_interval() {
    const POLL: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("contention:foreign");
    let lock_key = lock_keys(&key).lock;
    // redis-py's and node-redlock's values: 32 hex digits, no owner record.
    let () = redis::cmd("SET")
        .arg(&lock_key)
        .arg("0123456789abcdef0123456789abcdef")
        .arg("PX")
        .arg(30_000)
        .query(&mut server.admin())
        .unwrap();
    let waiting = tokio::spawn(locks.lock(&key).wait(Duration::from_secs(30)).acquire());
    await_waiter(&server, &key).await;
    // Long enough for its pauses to grow to their longest, and its place in the queue to be
    // renewed.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Deleted right after an attempt: the next comes a whole pause later (a waiter that took
    // the holder for one of ours would sleep until its place's renewal, a second on).
    let asked = server.command_calls("evalsha");
    wait_until_async(Duration::from_secs(2), "an attempt", || {
        server.command_calls("evalsha") > asked
    })
    .await;
    let () = redis::cmd("DEL")
        .arg(&lock_key)
        .query(&mut server.admin())
        .unwrap();
    let deleted = Instant::now();
    let guard = bounded(POLL + SCHEDULING_SLACK, "the waiter", waiting)
        .await
        .unwrap()
        .unwrap();
    eprintln!("granted {:?} after the deletion", deleted.elapsed());
    guard.release().await.unwrap();
}

/// 8 waiters behind one holder for 1.2 s ask the server few times: each its first attempt and
/// its mark (one round trip), its attempt at its 10 ms threshold that takes a place in the
/// queue, a look at the key once its subscription to its own channel is confirmed (a hand-off to
/// it before then went unheard; `GET` and `PTTL`, counted with the marks), and a renewal of its
/// place each second; then the release hands
/// the lock to the first in line and tells it alone. Counted from `MONITOR` (requests, not the
/// commands a script or a pipeline runs within one): 40 for 1.2 s (about 66 when every waiter
/// polled every 300 ms). Subscriptions, on a connection of their own, are printed, not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_behind_one_holder_for_a_while_ask_few_times() {
    const WAITERS: usize = 8;
    const HOLD: Duration = Duration::from_millis(1200);
    /// How often a queued waiter renews its place: a third of a starving waiter's 3 s lease.
    const RENEWAL: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let key = unique_key("contention:herd");
    let holder = client(LockConfig::single(server.url()));
    warm_up(&holder).await;
    let waiters: Vec<LockClient> = (0..WAITERS)
        .map(|_| client(LockConfig::single(server.url())))
        .collect();
    for waiter in &waiters {
        warm_up(waiter).await;
    }
    let held = holder.lock(&key).acquire().await.unwrap();
    load_queue_scripts(&holder, &key).await;
    let monitor = Monitor::start(&server);
    let started = Instant::now();
    let mut waiting = tokio::task::JoinSet::new();
    for waiter in &waiters {
        let lock = waiter.lock(&key).wait(Duration::from_secs(30));
        waiting.spawn(async move {
            let guard = lock.acquire().await?;
            guard.release().await
        });
    }
    tokio::time::sleep(HOLD).await;
    let sent = monitor.stop(&server);
    // The window the requests were sent in: a loaded machine stretches it, and each second of
    // it adds a renewal per waiter.
    let window = started.elapsed();
    held.release().await.unwrap();
    while let Some(done) = waiting.join_next().await {
        done.unwrap().unwrap();
    }
    let mut by_command = std::collections::BTreeMap::<&str, usize>::new();
    for s in &sent {
        *by_command.entry(s.command.as_str()).or_default() += 1;
    }
    eprintln!("sent while {WAITERS} waited {window:?}: {by_command:?}");
    // An attempt is `SET .. NX PX .. GET` or a script; a refused plain attempt's mark and `PTTL`
    // are one more round trip.
    let attempts = sent
        .iter()
        .filter(|s| {
            s.command == "evalsha" || (s.command == "set" && s.args.iter().any(|a| a == "GET"))
        })
        .count();
    let marks = by_command.get("pttl").copied().unwrap_or(0);
    assert!(
        attempts >= WAITERS && marks >= WAITERS,
        "every waiter asked and was refused: {by_command:?}"
    );
    let renewals = usize::try_from(window.as_millis() / RENEWAL.as_millis()).unwrap();
    let bound = WAITERS * (4 + renewals);
    assert!(
        attempts + marks <= bound,
        "{attempts} attempts and {marks} marks in {window:?}, bound {bound}: {by_command:?}"
    );
}

/// A waiter that answered a release's wake-up and lost the race for the lock (its releaser
/// took it again first, as a loop on one key does) sleeps until its 10 ms threshold, hearing no
/// release, and then takes a place in the queue: its refused attempt marks nothing (a mark made
/// the next release wake every other waiter, who mostly lost the same race; 1.1 of the 8.1
/// commands per section with 8 clients on one key). The race is staged: with the key held
/// throughout, the flag is deleted and a wake-up published, as by a release its releaser won
/// back at once. The wake-up must reach the waiter inside its first 10 ms: a round where its
/// answer was already its queueing attempt proves nothing and is played again with a new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_lost_a_wake_up_marks_nothing_until_it_starves() {
    const ROUNDS: usize = 20;
    const STEP: Duration = Duration::from_secs(5);
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    warm_up(&waiter).await;
    let warm = warm_up(&holder).await;
    let loader = holder.lock(&warm).acquire().await.unwrap();
    load_queue_scripts(&holder, &warm).await;
    loader.release().await.unwrap();
    for round in 1..=ROUNDS {
        let key = unique_key("contention:lost-race");
        let keys = lock_keys(&key);
        let held = holder.lock(&key).acquire().await.unwrap();
        let monitor = Monitor::start(&server);
        let marked = server.command_calls("pttl");
        let lock = waiter.lock(&key).wait(Duration::from_secs(10));
        let waiting = tokio::spawn(async move { lock.acquire().await });
        wait_until_async(STEP, "the waiter's mark", || {
            server.command_calls("pttl") > marked
        })
        .await;
        await_waiter(&server, &key).await;
        let asked = server.command_calls("evalsha");
        let () = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(&keys.waiting)
            .ignore()
            .cmd("PUBLISH")
            .arg(&keys.channel)
            .arg("")
            .ignore()
            .query(&mut server.admin())
            .unwrap();
        wait_until_async(STEP, "the waiter's queueing attempt", || {
            server.command_calls("evalsha") > asked
        })
        .await;
        let sent = monitor.stop(&server);
        held.release().await.unwrap();
        let guard = bounded(STEP, "the hand-off to the waiter", waiting)
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
        let is_attempt =
            |s: &&lock_tests::Sent| s.command == "set" && s.args.iter().any(|a| a == "GET");
        let theirs = &sent
            .iter()
            .find(|s| is_attempt(s) && s.args.first() == Some(&keys.lock))
            .expect("the waiter's first attempt")
            .client;
        let published = sent
            .iter()
            .position(|s| s.command == "publish")
            .expect("the wake-up");
        let after: Vec<&lock_tests::Sent> = sent[published..]
            .iter()
            .filter(|s| &s.client == theirs)
            .collect();
        if !after.first().is_some_and(is_attempt) {
            // Past its threshold already: it answered by queueing.
            continue;
        }
        let queued = after
            .iter()
            .position(|s| s.command == "evalsha")
            .expect("the queueing attempt");
        let between: Vec<&str> = after[1..queued]
            .iter()
            .map(|s| s.command.as_str())
            .collect();
        assert!(
            between.is_empty(),
            "after the lost race, before queueing, it sent {between:?}"
        );
        eprintln!("the wake-up reached the waiter in its first 10 ms in round {round}");
        return;
    }
    panic!("in {ROUNDS} rounds no wake-up reached the waiter within its first 10 ms");
}

/// 8 waiters, one holder releasing 40 times: every grant goes to someone, nobody is starved into
/// an error within the generous wait, and grants never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_waiters_gets_every_grant_without_overlap() {
    let server = RedisServer::start();
    let key = unique_key("contention:crowd");
    let inside = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = LockClient::new(LockConfig::single(server.url())).unwrap();
        let (key, inside, grants) = (key.clone(), Arc::clone(&inside), Arc::clone(&grants));
        tasks.spawn(async move {
            for _ in 0..5 {
                let guard = client
                    .lock(&key)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await?;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    assert_eq!(grants.load(Ordering::SeqCst), 40);
}

/// The waiter's connections (commands and release notifications) are cut while it waits: the
/// release it misses is made up for by its backoff, so it still gets the lock, well within `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_connection_does_not_strand_a_waiter() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = LockClient::new(LockConfig::single(server.url())).unwrap();
    let waiter = LockClient::new(LockConfig::single(proxy.url())).unwrap();
    let key = unique_key("contention:cut");
    let held = holder.lock(&key).acquire().await.unwrap();
    let channel = lock_keys(&key).channel;
    let k = key.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .lock(&k)
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    wait_until_async(Duration::from_secs(5), "the waiter subscribed", || {
        server.subscribers(&channel) > 0
    })
    .await;
    proxy.cut_all();
    let released_at = Instant::now();
    held.release().await.unwrap();
    let guard = waiting.await.unwrap().unwrap();
    eprintln!(
        "waiter got the lock {:?} after the release",
        released_at.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_of_the_notification_connection_does_not_strand_a_waiter() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    let key = unique_key("table:client-kill");
    let held = holder.lock(&key).acquire().await.unwrap();
    let wait = Duration::from_secs(5);
    let started = Instant::now();
    let task = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(wait).acquire().await })
    };
    await_waiter(&server, &key).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.admin())
        .unwrap();
    assert!(killed >= 1, "no pubsub connection killed");
    held.release().await.unwrap();
    let result = bounded(Duration::from_secs(15), "waiter", task)
        .await
        .unwrap();
    let took = started.elapsed();
    eprintln!(
        "notification connection killed: waiter {:?} after {took:?}",
        result.as_ref().map(drop)
    );
    assert!(took <= wait, "answered after {took:?}");
    result
        .expect("the waiter gets the lock")
        .release()
        .await
        .unwrap();
}

/// How long a waiter of a default lock lets newcomers barge in before it takes a place in the
/// lock's queue (the library's threshold, `Herd::STARVING` in `acquire/waiting.rs`).
const STARVING: Duration = Duration::from_millis(10);

/// A holder that takes its lock again as soon as it lets go (a loop with a 50 ms section) still
/// loses it to a waiter within a bounded wait. The waiter sits behind a link 20 ms each way, so
/// every attempt it makes on a release's wake-up reaches the server 40 ms after that release,
/// long after the loop took the lock again (one round trip later): the lock is free for a
/// fraction of a millisecond per 50 ms, and its retry timer (1 s) never fires within the wait.
/// Past its threshold the waiter queues, and the loop's next release hands it the lock: within
/// its first attempt (two links), the threshold, a release's wake-up (one section and one link),
/// its queueing attempt (two links), the next release and its message (one section and one
/// link), and slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_handed_a_lock_that_its_holder_keeps_taking_again() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let key = unique_key("contention:barged");
    let looper = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(proxy.url()).retry_delay(Duration::from_secs(1)));
    // Before the link slows down: the waiter's connections made (for commands and release
    // notifications) and the scripts it uses loaded, by a wait of its own past the threshold.
    warm_up(&waiter).await;
    let warm = unique_key("contention:warm");
    let other = looper.lock(&warm).acquire().await.unwrap();
    let waited = waiter.lock(&warm).wait(STARVING * 5).acquire().await;
    assert!(
        matches!(waited, Err(LockError::Contended { .. })),
        "{waited:?}"
    );
    other.release().await.unwrap();
    let (link, section) = (Duration::from_millis(20), Duration::from_millis(50));
    proxy.set_delay(link);
    let stop = Arc::new(AtomicBool::new(false));
    let releases = Arc::new(AtomicUsize::new(0));
    let mut held = looper.lock(&key).acquire().await.unwrap();
    let looping = {
        let (key, stop, releases) = (key.clone(), Arc::clone(&stop), Arc::clone(&releases));
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // The critical section's work, not a wait for anything.
                tokio::time::sleep(section).await;
                held.release().await?;
                releases.fetch_add(1, Ordering::SeqCst);
                held = looper
                    .lock(&key)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await?;
            }
            held.release().await
        })
    };
    let bound = STARVING + section * 2 + link * 6 + SCHEDULING_SLACK;
    let started = Instant::now();
    let result = waiter.lock(&key).wait(bound).acquire().await;
    let took = started.elapsed();
    let during = releases.load(Ordering::SeqCst);
    let guard = result.unwrap_or_else(|e| {
        panic!("not handed the lock within {bound:?}, while the loop let go {during} times: {e}")
    });
    eprintln!("handed the lock after {took:?}; the loop let go {during} times meanwhile");
    assert!(
        during >= 2,
        "the loop let go and took the lock again while the waiter waited: {during} releases"
    );
    stop.store(true, Ordering::SeqCst);
    guard.release().await.unwrap();
    bounded(Duration::from_secs(5), "the loop ends", looping)
        .await
        .unwrap()
        .unwrap();
}

/// A waiter that took a place in the queue and then gave up leaves it before its acquire answers:
/// the lock's release then frees the lock for anyone instead of handing it to the waiter that
/// left (which would keep it from everyone for the rest of the place's lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_its_place_in_the_queue() {
    let server = RedisServer::start();
    let key = unique_key("contention:left");
    let keys = lock_keys(&key);
    let holder = client(LockConfig::single(server.url()));
    // Attempts by timer, every few milliseconds: the second one is past the threshold.
    let waiter = client(LockConfig::single(server.url()).retry_delay(Duration::from_millis(5)));
    let held = holder.lock(&key).acquire().await.unwrap();
    let wait = Duration::from_millis(300);
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(wait).acquire().await.map(drop) })
    };
    let queued = || -> i64 {
        redis::cmd("ZCARD")
            .arg(&keys.queue)
            .query(&mut server.admin())
            .unwrap()
    };
    wait_until_async(wait, "the waiter queued past its threshold", || {
        queued() == 1
    })
    .await;
    let result = bounded(wait + SCHEDULING_SLACK, "the waiter gives up", waiting)
        .await
        .unwrap();
    assert!(
        matches!(result, Err(LockError::Contended { .. })),
        "{result:?}"
    );
    assert_eq!(queued(), 0, "the waiter left its place before it answered");
    held.release().await.unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&keys.lock)
        .query(&mut server.admin())
        .unwrap();
    assert!(
        !exists,
        "the release handed the lock to the waiter that left"
    );
}

/// A queued waiter of one Redis server, once the subscription to its own channel is confirmed,
/// looks at the lock's key (`GET` and `PTTL`, one round trip) instead of asking again with the
/// fair attempt (about a dozen commands on the server): a hand-off to it before the
/// confirmation went unheard, and shows there. Before, the look-again was the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_looks_at_the_key_instead_of_asking_again() {
    const STEP: Duration = Duration::from_secs(5);
    let server = RedisServer::start();
    let [holder, waiter] = [(); 2].map(|()| client(LockConfig::single(server.url())));
    warm_up(&waiter).await;
    let key = unique_key("contention:look");
    let keys = lock_keys(&key);
    let held = holder.lock(&key).fair(true).acquire().await.unwrap();
    load_queue_scripts(&holder, &key).await;
    let monitor = Monitor::start(&server);
    // The fair attempt runs a `GET` too: its queueing attempt and its look-again, either way.
    let gets = server.command_calls("get");
    let waiting = {
        let lock = waiter.lock(&key).fair(true).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.acquire().await })
    };
    wait_until_async(STEP, "the waiter's look-again", || {
        server.command_calls("get") >= gets + 2
    })
    .await;
    assert_eq!(server.zcard(&keys.queue), 1, "the waiter is in line");
    held.release().await.unwrap();
    let guard = bounded(STEP, "the hand-off", waiting)
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    let sent = monitor.stop(&server);
    let script = |s: &lock_tests::Sent| s.command == "evalsha" || s.command == "eval";
    let theirs = &sent
        .iter()
        .find(|s| script(s))
        .expect("the waiter's queueing attempt")
        .client;
    let released = sent
        .iter()
        .position(|s| script(s) && &s.client != theirs)
        .expect("the holder's release");
    let asked: Vec<&str> = sent[..released]
        .iter()
        .filter(|s| &s.client == theirs)
        .map(|s| s.command.as_str())
        .collect();
    assert_eq!(
        asked,
        ["evalsha", "get", "pttl"],
        "the waiter's requests before the hand-off"
    );
}

/// A hand-off that comes before the queued waiter's subscription to its own channel is
/// confirmed goes unheard: the waiter's look at the key finds its token there, and the attempt
/// that follows takes the lock (a grant comes from an attempt's answer), which it holds,
/// renewed, past the lease the hand-off gave. The proxy slows the waiter's link so that its
/// subscription reaches the server only after the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_before_the_waiters_subscription_is_found_by_its_look() {
    const DELAY: Duration = Duration::from_millis(150);
    const TTL: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(proxy.url()));
    // Its connections made before the link slows: release notifications (a wait in line) and
    // renewals (a lock held past one).
    let warm = warm_up(&waiter).await;
    let warm_held = holder.lock(&warm).acquire().await.unwrap();
    load_queue_scripts(&waiter, &warm).await;
    warm_held.release().await.unwrap();
    let renewed = waiter
        .lock(&warm)
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!renewed.is_lost(), "not renewed");
    renewed.release().await.unwrap();
    let key = unique_key("contention:unheard");
    let keys = lock_keys(&key);
    let held = holder.lock(&key).fair(true).acquire().await.unwrap();
    proxy.set_delay(DELAY);
    let monitor = Monitor::start(&server);
    let waiting = {
        let lock = waiter
            .lock(&key)
            .fair(true)
            .ttl(TTL)
            .wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.acquire().await })
    };
    wait_until_async(Duration::from_secs(5), "the waiter in line", || {
        server.zcard(&keys.queue) == 1
    })
    .await;
    // The answer that put it in line is still on its way to it: nobody listens on its channel.
    assert_eq!(server.subscribers(&keys.channel), 0, "already subscribed");
    let publishes = server.command_calls("publish");
    held.release().await.unwrap();
    let released = Instant::now();
    assert_eq!(
        server.command_calls("publish"),
        publishes + 1,
        "the hand-off was published"
    );
    // The answer reaches it, its subscription goes and is confirmed, its look and then its
    // attempt go and come back: eight trips over the slowed link.
    let guard = bounded(8 * DELAY + SCHEDULING_SLACK, "the waiter's look", waiting)
        .await
        .unwrap()
        .unwrap();
    eprintln!("held {:?} after the unheard hand-off", released.elapsed());
    let sent = monitor.stop(&server);
    let theirs = &sent
        .iter()
        .find(|s| s.command == "evalsha")
        .expect("the waiter's queueing attempt")
        .client;
    let asked: Vec<&str> = sent
        .iter()
        .filter(|s| &s.client == theirs)
        .map(|s| s.command.as_str())
        .collect();
    assert_eq!(
        asked,
        ["evalsha", "get", "pttl", "evalsha"],
        "the waiter's requests"
    );
    if tokio::time::timeout(TTL + DELAY, guard.lost())
        .await
        .is_ok()
    {
        panic!("lost {:?} after the unheard hand-off", released.elapsed());
    }
    let holds: Option<String> = redis::cmd("GET")
        .arg(&keys.lock)
        .query(&mut server.admin())
        .unwrap();
    assert!(holds.is_some(), "the key expired under its holder");
    guard.release().await.unwrap();
}

/// A release that hands a lock to a queued waiter tells that waiter alone, on a channel of its
/// own: a client listening on the lock's release channel (one whose waiters still race for it) is
/// not woken by the hand-off, only by a later release that frees the lock. The hand-off was
/// published on the release channel, waking every client with a waiter of the lock, before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_wakes_only_the_waiter_it_goes_to() {
    let server = RedisServer::start();
    let [a, b] = [(); 2].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("contention:told-alone");
    let mut conn = server.admin();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut listener = conn.as_pubsub();
    listener.subscribe(lock_keys(&key).channel).unwrap();

    let held = a.lock(&key).fair(true).acquire().await.unwrap();
    let waiting = {
        let lock = b.lock(&key).fair(true).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.acquire().await })
    };
    lock_tests::until_queued(&a, &key, 1).await;
    let publishes = server.command_calls("publish");
    held.release().await.unwrap();
    // The release published the hand-off (a fair release with nobody in line publishes
    // nothing): the message the listener must not get was sent.
    assert_eq!(server.command_calls("publish"), publishes + 1);
    let handed = bounded(Duration::from_secs(5), "the hand-off", waiting)
        .await
        .unwrap()
        .unwrap();
    handed.release().await.unwrap();
    // A release with nobody in line, which every waiter of the lock must hear.
    a.lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let first: String = tokio::task::block_in_place(|| listener.get_message())
        .unwrap()
        .get_payload()
        .unwrap();
    assert_eq!(
        first, "",
        "the release channel carried the hand-off's message before the free lock's"
    );
}

/// A lock's release channel lingers after its last waiter left (a lock contended again soon costs
/// no `SUBSCRIBE`), and is unsubscribed within two lingers (2 s each): also when it is left while
/// another channel already lingers, and the waiter leaving it does not wake the task that keeps
/// the subscriptions (that task already looks again within a linger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_channel_left_while_another_lingers_is_unsubscribed_within_two_lingers() {
    const LINGER: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    let keys = [
        unique_key("contention:linger"),
        unique_key("contention:linger"),
    ];
    let mut held = Vec::new();
    for key in &keys {
        held.push(holder.lock(key).acquire().await.unwrap());
    }
    let mut left_at = Instant::now();
    for (key, held) in keys.iter().zip(held) {
        let waiting = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move { waiter.lock(&key).wait(LINGER).acquire().await })
        };
        await_waiter(&server, key).await;
        held.release().await.unwrap();
        bounded(LINGER, "the waiter's grant", waiting)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
        left_at = Instant::now();
        // Still subscribed: it lingers (so the first channel lingers while the second is left).
        assert!(
            server.subscribers(&lock_keys(key).channel) > 0,
            "{key}'s channel lingers after its waiter left"
        );
    }
    let channel = lock_keys(&keys[1]).channel;
    wait_until_async(
        2 * LINGER + SCHEDULING_SLACK,
        "the second release channel is unsubscribed",
        || server.subscribers(&channel) == 0,
    )
    .await;
    eprintln!("unsubscribed {:?} after it was left", left_at.elapsed());
}
