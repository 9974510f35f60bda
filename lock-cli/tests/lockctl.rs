//! `lockctl` as a real process against real `redis-server`s, with locks held through `LockClient`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{
    Finished, RedisMasters, RedisServer, Worker, free_port, key_exists, lock_keys, unique_key,
    wait_until,
};

const RUN_TIMEOUT: Duration = Duration::from_secs(20);
const TTL: Duration = Duration::from_secs(30);

fn lockctl(args: &[&str]) -> Finished {
    Worker::spawn(env!("CARGO_BIN_EXE_lockctl"), args).finish(RUN_TIMEOUT)
}

fn code(out: &Finished) -> Option<i32> {
    out.status.code()
}

fn json(out: &Finished) -> serde_json::Value {
    serde_json::from_str(&out.stdout.join("\n"))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", out.stdout))
}

/// The table row whose first cell is `key`, split into cells.
fn row<'a>(out: &'a Finished, key: &str) -> Option<Vec<&'a str>> {
    out.stdout
        .iter()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&key))
}

fn client(server: &RedisServer) -> LockClient {
    LockClient::new(LockConfig::single(server.url())).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_held_locks_with_remaining_and_token_and_filters_by_pattern() {
    let server = RedisServer::start();
    let locks = client(&server);
    let (wallet, order) = (unique_key("wallet"), unique_key("order"));
    let held = locks.lock(&wallet).ttl(TTL).acquire().await.unwrap();
    let _other = locks.lock(&order).ttl(TTL).acquire().await.unwrap();
    let url = server.url();

    let all = lockctl(&["--url", &url, "list"]);
    assert_eq!(code(&all), Some(0), "{all:?}");
    assert_eq!(
        all.stdout[0].split_whitespace().collect::<Vec<_>>(),
        ["KEY", "REMAINING", "FENCE", "HOLDERS", "QUEUED", "OWNER"]
    );
    let cells = row(&all, &wallet).unwrap_or_else(|| panic!("{wallet} not listed: {all:?}"));
    assert!(cells[1].ends_with('s'), "remaining: {cells:?}");
    // Redis keeps one fence counter per server, not a token per lock: nothing to show.
    assert_eq!(held.fencing_token(), None);
    assert_eq!(cells[2], "-");
    assert!(row(&all, &order).is_some(), "{all:?}");

    let filtered = lockctl(&["--url", &url, "list", "wallet:*"]);
    assert_eq!(code(&filtered), Some(0), "{filtered:?}");
    assert!(row(&filtered, &wallet).is_some(), "{filtered:?}");
    assert!(row(&filtered, &order).is_none(), "{filtered:?}");
}

/// A read lock's holders and a fair lock's queue, in `list` (table and JSON) and `inspect`.
#[tokio::test(flavor = "multi_thread")]
async fn list_and_inspect_show_holders_and_the_queue_of_lock_kinds() {
    let server = RedisServer::start();
    let (locks, others) = (client(&server), client(&server));
    let (cache, queue) = (unique_key("cache"), unique_key("queue"));
    let mut readers = Vec::new();
    for client in [&locks, &others] {
        let reader = client.lock(&cache).shared(true).ttl(TTL).acquire().await;
        readers.push(reader.unwrap());
    }
    let _head = locks
        .lock(&queue)
        .fair(true)
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        others
            .lock(&queue)
            .fair(true)
            .ttl(TTL)
            .wait(Duration::from_secs(20))
            .acquire(),
    );
    lock_tests::until_queued(&locks, &queue, 1).await;
    let url = server.url();

    let all = lockctl(&["--url", &url, "list"]);
    assert_eq!(code(&all), Some(0), "{all:?}");
    let cells = row(&all, &cache).unwrap_or_else(|| panic!("{cache} not listed: {all:?}"));
    assert_eq!(
        cells[3..5],
        ["2", "0"],
        "holders and queue of a read lock: {all:?}"
    );
    let cells = row(&all, &queue).unwrap_or_else(|| panic!("{queue} not listed: {all:?}"));
    assert_eq!(
        cells[3..5],
        ["1", "1"],
        "holders and queue of a fair lock: {all:?}"
    );

    let listed = json(&lockctl(&["--url", &url, "--json", "list"]));
    let entry = |key: &str| {
        listed["locks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["key"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("{key} not in {listed}"))
    };
    assert_eq!(entry(&cache)["holders"], 2);
    assert_eq!(entry(&queue)["queued"], 1);

    let inspect = lockctl(&["--url", &url, "inspect", &queue]);
    assert!(
        inspect
            .stdout
            .iter()
            .any(|l| l.split_whitespace().eq(["queued", "1"])),
        "{inspect:?}"
    );
    let inspect = json(&lockctl(&["--url", &url, "--json", "inspect", &cache]));
    assert_eq!(
        (&inspect["holders"], &inspect["queued"]),
        (&2.into(), &0.into())
    );
    waiter.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_remaining_and_token_and_exits_1_for_a_free_key() {
    let server = RedisServer::start();
    let locks = client(&server);
    let key = unique_key("wallet");
    let guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
    let url = server.url();

    let out = lockctl(&["--url", &url, "inspect", &key]);
    assert_eq!(code(&out), Some(0), "{out:?}");
    assert_eq!(field(&out, "key"), Some(key.as_str()), "{out:?}");
    let remaining = field(&out, "remaining").unwrap_or_default();
    assert!(remaining.ends_with('s'), "{out:?}");
    assert_eq!(guard.fencing_token(), None);
    assert_eq!(field(&out, "fencing token"), Some("-"), "{out:?}");
    assert_a_free_key_exits_1(["--url", &url]);
}

/// The value of `inspect`'s field `name` (`FIELD  VALUE` rows).
fn field<'a>(out: &'a Finished, name: &str) -> Option<&'a str> {
    out.stdout
        .iter()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix("  "))
        .map(str::trim)
}

/// `lockctl <target> inspect` of a key nobody holds: exit 1, "not held".
fn assert_a_free_key_exits_1(target: [&str; 2]) {
    let mut args = target.to_vec();
    let key = unique_key("free");
    args.extend(["inspect", &key]);
    let free = lockctl(&args);
    assert_eq!(code(&free), Some(1), "{free:?}");
    assert!(free.stderr.contains("not held"), "{free:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn release_needs_force_and_yes_then_frees_the_lock_and_the_holder_sees_it_lost() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server), client(&server));
    let key = unique_key("wallet");
    // Short, so that the holder's next renewal (and its verdict) comes soon.
    let ttl = Duration::from_secs(2);
    let guard = holder.lock(&key).ttl(ttl).acquire().await.unwrap();
    let url = server.url();

    let unforced = lockctl(&["--url", &url, "release", &key]);
    assert_eq!(code(&unforced), Some(2), "{unforced:?}");
    assert!(unforced.stderr.contains("--force"), "{unforced:?}");
    // stdin is not a terminal here: no confirmation possible without --yes.
    let unconfirmed = lockctl(&["--url", &url, "release", &key, "--force"]);
    assert_eq!(code(&unconfirmed), Some(2), "{unconfirmed:?}");
    assert!(unconfirmed.stderr.contains("--yes"), "{unconfirmed:?}");
    let lock_key = lock_keys(&key).lock;
    assert!(
        key_exists(&server, &lock_key),
        "a refused release deleted the lock"
    );

    let released = lockctl(&["--url", &url, "release", &key, "--force", "--yes"]);
    assert_eq!(code(&released), Some(0), "{released:?}");
    let taken = other.lock(&key).ttl(TTL).acquire().await;
    assert!(
        taken.is_ok(),
        "a second client could not take the freed lock: {taken:?}"
    );
    tokio::time::timeout(4 * ttl, guard.lost())
        .await
        .expect("the holder did not see its lock lost at its next renewal");

    drop(taken);
    let again = lockctl(&[
        "--url",
        &url,
        "release",
        &unique_key("free"),
        "--force",
        "--yes",
    ]);
    assert_eq!(code(&again), Some(1), "{again:?}");
}

fn numpat(server: &RedisServer) -> i64 {
    redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query(&mut server.admin())
        .unwrap()
}

/// `lockctl <target> watch watched:* --count 1`, as text and then as JSON lines: the release of
/// a lock held through `locks` whose name matches prints a line and ends the watch, the release
/// of one that does not match (released first) prints none. `watches` counts the watches the
/// servers serve (this test's alone); `waited` marks a lock waited for where a release is only
/// announced when someone waits (Redis), as a refused waiter does. Returns the JSON event.
async fn watch_prints_the_release_of_a_matching_lock(
    target: [&str; 2],
    locks: &LockClient,
    watches: impl Fn() -> i64,
    waited: impl Fn(&str),
) -> serde_json::Value {
    let (key, ignored) = (unique_key("watched"), unique_key("ignored"));
    let mut event = serde_json::Value::Null;
    for json_output in [false, true] {
        let guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
        let noise = locks.lock(&ignored).ttl(TTL).acquire().await.unwrap();
        let mut args = target.to_vec();
        args.extend(["watch", "watched:*", "--count", "1"]);
        if json_output {
            args.push("--json");
        }
        let mut watch = Worker::spawn(env!("CARGO_BIN_EXE_lockctl"), &args);
        wait_until(Duration::from_secs(10), "lockctl watch subscribed", || {
            watches() >= 1
        });
        // Filtered out by the pattern: must not count.
        waited(&ignored);
        noise.release().await.unwrap();
        waited(&key);
        guard.release().await.unwrap();
        let line = watch.next_line(Duration::from_secs(10));
        if json_output {
            event = serde_json::from_str(&line).unwrap();
            assert_eq!(event["key"], key.as_str(), "{line}");
            assert_eq!(event["event"], "released", "{line}");
        } else {
            assert!(line.contains(&key) && line.contains("released"), "{line}");
        }
        let done = watch.finish(RUN_TIMEOUT);
        assert_eq!(code(&done), Some(0), "{done:?}");
        assert!(
            !done.stdout.iter().any(|l| l.contains(&ignored)),
            "{done:?}"
        );
        wait_until(Duration::from_secs(10), "watch unsubscribed", || {
            watches() == 0
        });
    }
    event
}

/// Lock `key` marked waited for on `node`, as a refused waiter leaves it: its next release is
/// announced (a release nobody waits for is not).
fn mark_waited(node: &RedisServer, key: &str) {
    let () = redis::cmd("SET")
        .arg(lock_keys(key).waiting)
        .arg("1")
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query(&mut node.admin())
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_a_release_then_stops_after_count() {
    let server = RedisServer::start();
    let url = server.url();
    watch_prints_the_release_of_a_matching_lock(
        ["--url", &url],
        &client(&server),
        || numpat(&server),
        |key| mark_waited(&server, key),
    )
    .await;
}

/// A release that hands a fair lock to its waiter is announced on that waiter's own channel:
/// `watch` prints it as the lock's release all the same (it printed nothing).
#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_a_release_that_hands_the_lock_to_a_waiter() {
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server), client(&server));
    let key = unique_key("watched");
    let guard = holder
        .lock(&key)
        .fair(true)
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let waiting = {
        let lock = waiter.lock(&key).fair(true).ttl(TTL).wait(TTL);
        tokio::spawn(async move { lock.acquire().await })
    };
    lock_tests::until_queued(&holder, &key, 1).await;
    let url = server.url();
    let mut watch = Worker::spawn(
        env!("CARGO_BIN_EXE_lockctl"),
        &["--url", &url, "watch", "watched:*", "--count", "1"],
    );
    wait_until(Duration::from_secs(10), "lockctl watch subscribed", || {
        numpat(&server) >= 1
    });
    guard.release().await.unwrap();
    let handed = lock_tests::bounded(Duration::from_secs(10), "the hand-off", waiting)
        .await
        .unwrap()
        .unwrap();
    let line = watch.next_line(Duration::from_secs(10));
    assert!(line.contains(&key) && line.contains("released"), "{line}");
    let done = watch.finish(RUN_TIMEOUT);
    assert_eq!(code(&done), Some(0), "{done:?}");
    handed.release().await.unwrap();
}

/// Who holds each lock: `list`'s OWNER column (the first owner's name, and how many more),
/// `inspect`'s `owner` rows (name, pid, host, program, since), and both in JSON; never the token.
#[tokio::test(flavor = "multi_thread")]
async fn list_and_inspect_show_who_holds_each_lock() {
    let server = RedisServer::start();
    let named = |name: &str| LockClient::new(LockConfig::single(server.url()).owner(name)).unwrap();
    let (a, b) = (named("billing-7"), named("billing-8"));
    let (wallet, cache) = (unique_key("wallet"), unique_key("cache"));
    let before = std::time::SystemTime::now();
    let _held = a.lock(&wallet).ttl(TTL).acquire().await.unwrap();
    let mut readers = Vec::new();
    for client in [&a, &b] {
        let reader = client.lock(&cache).shared(true).ttl(TTL).acquire().await;
        readers.push(reader.unwrap());
    }
    let after = std::time::SystemTime::now();
    let url = server.url();

    let list = lockctl(&["--url", &url, "list"]);
    assert_eq!(code(&list), Some(0), "{list:?}");
    assert_eq!(row(&list, &wallet).unwrap()[5..], ["billing-7"], "{list:?}");
    let readers_cell = &row(&list, &cache).unwrap()[5..];
    assert!(
        readers_cell == ["billing-7", "+1"] || readers_cell == ["billing-8", "+1"],
        "{list:?}"
    );

    let inspect = lockctl(&["--url", &url, "inspect", &wallet]);
    assert_eq!(code(&inspect), Some(0), "{inspect:?}");
    let pid = std::process::id();
    let owner = field(&inspect, "owner").unwrap_or_else(|| panic!("no owner row: {inspect:?}"));
    assert!(
        owner.starts_with(&format!("billing-7 (pid {pid} on ")),
        "{inspect:?}"
    );

    let owners = |doc: &serde_json::Value| -> Vec<serde_json::Value> {
        doc["owners"].as_array().unwrap().clone()
    };
    let inspected = json(&lockctl(&["--url", &url, "--json", "inspect", &cache]));
    let mut names: Vec<String> = owners(&inspected)
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["billing-7", "billing-8"], "{inspected}");
    let ms = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
    };
    for owner in owners(&inspected) {
        assert_eq!(owner["pid"], pid, "{inspected}");
        let since = owner["since_ms"].as_u64().unwrap();
        assert!(ms(before) <= since && since <= ms(after), "{inspected}");
    }
    let listed = json(&lockctl(&["--url", &url, "--json", "list", &wallet]));
    let listed_owners = owners(&listed["locks"][0]);
    assert_eq!(listed_owners.len(), 1, "{listed}");
    assert_eq!(listed_owners[0]["name"], "billing-7", "{listed}");
    // The value the grant wrote starts with the token's secret; nothing shows it.
    let lock_key = lock_keys(&wallet).lock;
    let value: String = redis::cmd("GET")
        .arg(&lock_key)
        .query(&mut server.admin())
        .unwrap();
    let secret = &value[..32];
    for out in [&list, &inspect] {
        assert!(!out.stdout.iter().any(|l| l.contains(secret)), "{out:?}");
    }
    assert!(!listed.to_string().contains(secret) && !inspected.to_string().contains(secret));
}

#[tokio::test(flavor = "multi_thread")]
async fn json_outputs_parse() {
    let server = RedisServer::start();
    let locks = client(&server);
    let key = unique_key("wallet");
    let _guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
    let url = server.url();

    let list = json(&lockctl(&["--url", &url, "--json", "list"]));
    let entry = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["key"] == key.as_str());
    let entry = entry.unwrap_or_else(|| panic!("{key} not in {list}"));
    assert_eq!(entry["held"], true);
    assert_eq!(entry["fencing_token"], serde_json::Value::Null);
    assert!(entry["remaining_ms"].as_u64().unwrap() <= 30_000);

    let inspect = json(&lockctl(&["--url", &url, "--json", "inspect", &key]));
    assert_eq!(inspect["key"], key.as_str());
    assert_eq!(inspect["fencing_token"], serde_json::Value::Null);
    assert_eq!(inspect["holders"], 1);

    let free = lockctl(&["--url", &url, "--json", "inspect", "nobody"]);
    assert_eq!(code(&free), Some(1));
    assert_eq!(json(&free)["held"], false);

    let release = json(&lockctl(&[
        "--url", &url, "--json", "release", &key, "--force", "--yes",
    ]));
    assert_eq!(release["released"], true);
}

/// Runs each of `commands` after `target` (a flag and the servers): each must exit 2 with a
/// one-line error, and never show `password`.
fn assert_one_line_errors_without(password: &str, target: [&str; 2], commands: &[&[&str]]) {
    for command in commands {
        let mut args = target.to_vec();
        args.extend_from_slice(command);
        let out = lockctl(&args);
        assert_eq!(code(&out), Some(2), "{command:?}: {out:?}");
        assert_eq!(
            out.stderr.trim_end().lines().count(),
            1,
            "{command:?}: {out:?}"
        );
        assert!(!out.stderr.contains(password), "{command:?}: {out:?}");
        assert!(
            !out.stdout.iter().any(|l| l.contains(password)),
            "{command:?}: {out:?}"
        );
    }
}

#[test]
fn an_unreachable_server_exits_2_with_a_one_line_error_without_the_password() {
    let password = "s3cret-pw";
    let url = format!("redis://:{password}@127.0.0.1:{}/", free_port());
    assert_one_line_errors_without(
        password,
        ["--url", &url],
        &[
            &["list"],
            &["inspect", "wallet:1"],
            &["watch", "--count", "1"],
        ],
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn redlock_list_and_inspect_show_each_node() {
    let masters = RedisMasters::start(3);
    let urls = masters.urls();
    let locks = LockClient::new(LockConfig::redlock(urls.clone()).fencing(true)).unwrap();
    let key = unique_key("wallet");
    let _guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
    let url = urls.join(",");

    let list = lockctl(&["--url", &url, "list"]);
    assert_eq!(code(&list), Some(0), "{list:?}");
    let cells = row(&list, &key).unwrap_or_else(|| panic!("{key} not listed: {list:?}"));
    assert_eq!(cells[1], "3/3", "{list:?}");
    assert_eq!(
        cells.len(),
        10,
        "key, nodes, remaining, fence, holders, queued, owner and one column per node: {list:?}"
    );

    // One node loses the key: still listed, held by 2 of 3.
    let lock_key = lock_keys(&key).lock;
    let _: i64 = redis::cmd("DEL")
        .arg(&lock_key)
        .query(&mut masters.nodes[0].admin())
        .unwrap();
    let listed = json(&lockctl(&["--url", &url, "--json", "list", &key]));
    let entry = &listed["locks"][0];
    assert_eq!(entry["key"], key.as_str(), "{listed}");
    assert_eq!(entry["nodes_holding"], 2, "{listed}");
    let held: Vec<bool> = entry["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["held"].as_bool().unwrap())
        .collect();
    assert_eq!(held, [false, true, true], "{listed}");

    let inspect = json(&lockctl(&["--url", &url, "--json", "inspect", &key]));
    let nodes = inspect["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{inspect}");
    assert_eq!(nodes[0]["held"], false, "{inspect}");
    assert_eq!(nodes[1]["held"], true, "{inspect}");

    let human = lockctl(&["--url", &url, "inspect", &key]);
    assert_eq!(code(&human), Some(0), "{human:?}");
    let node_rows = human
        .stdout
        .iter()
        .filter(|l| l.starts_with("127.0.0.1:"))
        .count();
    assert_eq!(node_rows, 3, "{human:?}");
}

/// On a Redis Cluster (`--cluster`, one seed): `list` scans every master and names the one
/// holding each lock, `inspect` and `release --force` reach the key's master, and `watch` says
/// it cannot work there.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_list_inspect_and_release_reach_every_master() {
    let cluster = lock_tests::RedisCluster::shared();
    let seed = cluster.urls()[0].clone();
    let locks = LockClient::new(LockConfig::cluster(cluster.urls())).unwrap();
    let prefix = unique_key("clctl");
    let mut guards = Vec::new();
    let mut masters = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("{prefix}:{i}");
        guards.push(locks.lock(&key).ttl(TTL).acquire().await.unwrap());
        let lock_key = lock_keys(&key).lock;
        masters.insert(format!("127.0.0.1:{}", cluster.master_of(&lock_key).port()));
    }
    assert!(masters.len() > 1, "{masters:?}");

    let list = lockctl(&["--cluster", "--url", &seed, "list", &format!("{prefix}:*")]);
    assert_eq!(code(&list), Some(0), "{list:?}");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("{prefix}:{i}");
        let cells = row(&list, &key).unwrap_or_else(|| panic!("{key} not listed: {list:?}"));
        let lock_key = lock_keys(&key).lock;
        let master = format!("127.0.0.1:{}", cluster.master_of(&lock_key).port());
        assert_eq!(cells[1], master, "{list:?}");
        seen.insert(master);
    }
    assert_eq!(seen, masters);

    let key = format!("{prefix}:3");
    let inspect = json(&lockctl(&[
        "--cluster",
        "--url",
        &seed,
        "--json",
        "inspect",
        &key,
    ]));
    assert_eq!(
        inspect["fencing_token"],
        serde_json::Value::Null,
        "{inspect}"
    );
    let released = lockctl(&[
        "--cluster",
        "--url",
        &seed,
        "release",
        &key,
        "--force",
        "--yes",
    ]);
    assert_eq!(code(&released), Some(0), "{released:?}");
    let lock_key = lock_keys(&key).lock;
    assert!(cluster.master_of(&lock_key).keys(&lock_key).is_empty());

    let watch = lockctl(&["--cluster", "--url", &seed, "watch"]);
    assert_eq!(code(&watch), Some(2), "{watch:?}");
    assert!(watch.stderr.contains("sharded"), "{watch:?}");
    for guard in guards {
        let _ = guard.release().await;
    }
}

/// Lock `name` held on `node` alone, written there directly as a grant would leave it (a lock
/// key with a time to live).
fn hold_on_one_node(node: &RedisServer, name: &str) {
    let keys = lock_tests::lock_keys(name);
    let mut admin = node.admin();
    let () = redis::cmd("SET")
        .arg(&keys.lock)
        .arg("someone-elses-token")
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query(&mut admin)
        .unwrap();
}

/// A key only 1 of 3 Redlock nodes holds is not a held lock (exit 1, as for a free key), but
/// `inspect` says how many hold it and prints every node's view: held or not, the time to live
/// and the fence there (none: Redis keeps no token per lock).
#[tokio::test(flavor = "multi_thread")]
async fn redlock_inspect_of_a_key_on_a_minority_prints_each_node_and_exits_1() {
    let masters = RedisMasters::start(3);
    let url = masters.urls().join(",");
    let key = unique_key("minority");
    hold_on_one_node(&masters.nodes[1], &key);
    let names: Vec<String> = masters
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();

    let human = lockctl(&["--url", &url, "inspect", &key]);
    assert_eq!(code(&human), Some(1), "{human:?}");
    assert!(
        human.stderr.contains("not held") && human.stderr.contains("1 of 3 nodes"),
        "{human:?}"
    );
    assert_eq!(
        human.stdout[0].split_whitespace().collect::<Vec<_>>(),
        ["NODE", "HELD", "REMAINING", "FENCE"],
        "{human:?}"
    );
    for (i, name) in names.iter().enumerate() {
        let cells = row(&human, name).unwrap_or_else(|| panic!("no line for {name}: {human:?}"));
        if i == 1 {
            assert_eq!((cells[1], cells[3]), ("yes", "-"), "{human:?}");
            assert!(cells[2].ends_with('s'), "remaining: {human:?}");
        } else {
            assert_eq!(cells[1..], ["no", "-", "-"], "{human:?}");
        }
    }

    let out = lockctl(&["--url", &url, "--json", "inspect", &key]);
    assert_eq!(code(&out), Some(1), "{out:?}");
    let doc = json(&out);
    assert_eq!(
        (&doc["held"], &doc["nodes_holding"], &doc["quorum"]),
        (&false.into(), &1.into(), &2.into()),
        "{doc}"
    );
    let held: Vec<bool> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["held"].as_bool().unwrap())
        .collect();
    assert_eq!(held, [false, true, false], "{doc}");
    assert_eq!(
        doc["nodes"][1]["fencing_token"],
        serde_json::Value::Null,
        "{doc}"
    );
    let remaining = doc["nodes"][1]["remaining_ms"].as_u64().unwrap();
    assert!(remaining <= TTL.as_millis() as u64, "{doc}");
}

/// Under Redlock every node announces a release: `watch` prints one line per node, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn redlock_watch_prints_one_line_per_node_naming_it() {
    let masters = RedisMasters::start(3);
    let urls = masters.urls();
    let locks = LockClient::new(LockConfig::redlock(urls.clone())).unwrap();
    let key = unique_key("watched");
    let guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
    let url = urls.join(",");
    let mut watch = Worker::spawn(
        env!("CARGO_BIN_EXE_lockctl"),
        &["--url", &url, "watch", "watched:*", "--count", "3"],
    );
    wait_until(Duration::from_secs(10), "lockctl watch subscribed", || {
        masters.nodes.iter().all(|n| numpat(n) >= 1)
    });
    for node in &masters.nodes {
        mark_waited(node, &key);
    }
    guard.release().await.unwrap();
    let mut announced: Vec<String> = (0..3)
        .map(|_| {
            let line = watch.next_line(Duration::from_secs(10));
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells[1..3], ["released", key.as_str()], "{line}");
            cells[3].to_owned()
        })
        .collect();
    announced.sort();
    let mut nodes: Vec<String> = masters
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    nodes.sort();
    assert_eq!(announced, nodes);
    let done = watch.finish(RUN_TIMEOUT);
    assert_eq!(code(&done), Some(0), "{done:?}");
}

/// Both backends named, or none: exit 2 with a one-line error naming the flags or variables.
#[test]
fn both_backends_or_none_exit_2_naming_the_flags_or_variables() {
    let lockctl_env = |args: &[&str], env: &[(&str, &str)]| {
        Worker::spawn_with_env(env!("CARGO_BIN_EXE_lockctl"), args, env).finish(RUN_TIMEOUT)
    };
    let both = lockctl(&[
        "--url",
        "redis://127.0.0.1:1/",
        "--etcd",
        "127.0.0.1:2",
        "list",
    ]);
    assert_eq!(code(&both), Some(2), "{both:?}");
    assert!(
        both.stderr.contains("--url") && both.stderr.contains("--etcd"),
        "{both:?}"
    );
    let both_env = lockctl_env(
        &["list"],
        &[
            ("LOCK_REDIS_URL", "redis://127.0.0.1:1/"),
            ("LOCK_ETCD_ENDPOINTS", "127.0.0.1:2"),
        ],
    );
    assert_eq!(code(&both_env), Some(2), "{both_env:?}");
    assert!(
        both_env.stderr.contains("LOCK_REDIS_URL")
            && both_env.stderr.contains("LOCK_ETCD_ENDPOINTS"),
        "{both_env:?}"
    );
    let none = lockctl_env(
        &["list"],
        &[("LOCK_REDIS_URL", ""), ("LOCK_ETCD_ENDPOINTS", "")],
    );
    assert_eq!(code(&none), Some(2), "{none:?}");
    assert!(
        none.stderr.contains("--url") && none.stderr.contains("--etcd"),
        "{none:?}"
    );
    for out in [&both_env, &none] {
        assert_eq!(out.stderr.trim_end().lines().count(), 1, "{out:?}");
    }
}

#[cfg(not(feature = "etcd"))]
#[test]
fn without_the_etcd_feature_etcd_exits_2_saying_how_to_build_it() {
    let out = lockctl(&["--etcd", "127.0.0.1:2379", "list"]);
    assert_eq!(code(&out), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("--etcd") && out.stderr.contains("--features etcd"),
        "{out:?}"
    );
}

/// `lockctl --etcd` against real etcd members, with locks held through `LockClient` on etcd.
#[cfg(feature = "etcd")]
mod on_etcd {
    use super::*;
    use lock_tests::{EtcdCluster, SCHEDULING_SLACK, bounded};

    fn endpoints(cluster: &EtcdCluster) -> String {
        cluster.endpoints().join(",")
    }

    fn etcd_client(cluster: &EtcdCluster) -> LockClient {
        LockClient::new(LockConfig::etcd(cluster.endpoints())).unwrap()
    }

    /// A lock held on etcd shows in `list` (table and JSON) and `inspect` with its lease's
    /// remaining time and its revision as fencing token; readers of a shared lock (entries under
    /// its key, no lock key) show as one lock with two holders; a free key exits 1.
    #[tokio::test(flavor = "multi_thread")]
    async fn list_and_inspect_show_the_lease_and_the_revision_of_a_lock_held_on_etcd() {
        let cluster = EtcdCluster::shared(1);
        let (locks, others) = (etcd_client(cluster), etcd_client(cluster));
        let (wallet, cache) = (unique_key("ewallet"), unique_key("ecache"));
        let before = cluster.revision();
        let held = locks.lock(&wallet).ttl(TTL).acquire().await.unwrap();
        let after = cluster.revision();
        let token = held.fencing_token().unwrap();
        // The revision of the grant's transaction: between the two reads of the revision.
        assert!(
            i64::try_from(token).is_ok_and(|t| before < t && t <= after),
            "token {token} not a revision in ({before}, {after}]"
        );
        let mut readers = Vec::new();
        for client in [&locks, &others] {
            let reader = client.lock(&cache).shared(true).ttl(TTL).acquire().await;
            readers.push(reader.unwrap());
        }
        let etcd = endpoints(cluster);
        // A renewal every ttl / 3 keeps the lease within that of its full length (etcd counts
        // whole seconds).
        let lowest = TTL - TTL / 3 - Duration::from_secs(1);

        let all = lockctl(&["--etcd", &etcd, "list"]);
        assert_eq!(code(&all), Some(0), "{all:?}");
        assert_eq!(
            all.stdout[0].split_whitespace().collect::<Vec<_>>(),
            ["KEY", "REMAINING", "FENCE", "HOLDERS", "QUEUED", "OWNER"]
        );
        let cells = row(&all, &wallet).unwrap_or_else(|| panic!("{wallet} not listed: {all:?}"));
        assert_eq!(
            cells[2..5],
            [token.to_string().as_str(), "1", "0"],
            "{all:?}"
        );
        let cells = row(&all, &cache).unwrap_or_else(|| panic!("{cache} not listed: {all:?}"));
        assert_eq!(cells[3], "2", "two readers: {all:?}");

        let filtered = lockctl(&["--etcd", &etcd, "list", "ewallet:*"]);
        assert!(row(&filtered, &wallet).is_some(), "{filtered:?}");
        assert!(row(&filtered, &cache).is_none(), "{filtered:?}");

        let listed = json(&lockctl(&["--etcd", &etcd, "--json", "list", &wallet]));
        let entry = &listed["locks"][0];
        assert_eq!(
            (&entry["key"], &entry["held"], &entry["fencing_token"]),
            (&wallet.as_str().into(), &true.into(), &token.into()),
            "{listed}"
        );
        let remaining = Duration::from_millis(entry["remaining_ms"].as_u64().unwrap());
        assert!(lowest <= remaining && remaining <= TTL, "{listed}");

        let inspect = json(&lockctl(&["--etcd", &etcd, "--json", "inspect", &wallet]));
        assert_eq!(inspect["fencing_token"], token, "{inspect}");
        assert_eq!(inspect["holders"], 1, "{inspect}");
        assert_eq!(inspect["owners"][0]["pid"], std::process::id(), "{inspect}");
        let remaining = Duration::from_millis(inspect["remaining_ms"].as_u64().unwrap());
        assert!(lowest <= remaining && remaining <= TTL, "{inspect}");
        let human = lockctl(&["--etcd", &etcd, "inspect", &wallet]);
        assert_eq!(code(&human), Some(0), "{human:?}");
        let token = token.to_string();
        assert_eq!(
            field(&human, "fencing token"),
            Some(token.as_str()),
            "{human:?}"
        );
        assert_a_free_key_exits_1(["--etcd", &etcd]);
    }

    /// `release --force` deletes a lock held on etcd: another client takes it at once, and the
    /// holder sees it lost at its next renewal (within a renewal period, one request and slack);
    /// a free key exits 1.
    #[tokio::test(flavor = "multi_thread")]
    async fn release_force_frees_an_etcd_lock_and_the_holder_sees_it_lost_within_a_renewal() {
        let cluster = EtcdCluster::shared(1);
        let (holder, other) = (etcd_client(cluster), etcd_client(cluster));
        let key = unique_key("erelease");
        let ttl = Duration::from_secs(3);
        let guard = holder.lock(&key).ttl(ttl).acquire().await.unwrap();
        let etcd = endpoints(cluster);

        let unforced = lockctl(&["--etcd", &etcd, "release", &key]);
        assert_eq!(code(&unforced), Some(2), "{unforced:?}");
        assert!(
            cluster.exists(&lock_tests::etcd_key(&key)),
            "a refused release deleted the lock"
        );

        // Before the release: the time measured to the loss is at least its true delay.
        let forced = std::time::Instant::now();
        let released = lockctl(&["--etcd", &etcd, "release", &key, "--force", "--yes"]);
        assert_eq!(code(&released), Some(0), "{released:?}");
        let taken = other.lock(&key).ttl(TTL).acquire().await;
        assert!(taken.is_ok(), "the freed lock was not free: {taken:?}");
        // Its next renewal: one renewal period (ttl / 3) + one request (connect 1 s + response
        // 500 ms, the defaults) + slack.
        let bound = ttl / 3 + Duration::from_millis(1500) + SCHEDULING_SLACK;
        bounded(bound, "the holder sees the loss", guard.lost()).await;
        assert!(
            forced.elapsed() <= bound,
            "lost {:?} after",
            forced.elapsed()
        );

        drop(taken);
        let free = lockctl(&[
            "--etcd",
            &etcd,
            "release",
            &unique_key("efree"),
            "--force",
            "--yes",
        ]);
        assert_eq!(code(&free), Some(1), "{free:?}");
    }

    /// `watch` on etcd prints a line (text, then JSON with the deletion's revision) when a lock
    /// it matches is released, and none for one it does not match.
    #[tokio::test(flavor = "multi_thread")]
    async fn watch_prints_a_line_when_an_etcd_lock_is_released() {
        // Its own cluster: the test counts the watchers etcd serves.
        let cluster = EtcdCluster::start(1);
        let etcd = endpoints(&cluster);
        let start = cluster.revision();
        let event = watch_prints_the_release_of_a_matching_lock(
            ["--etcd", &etcd],
            &etcd_client(&cluster),
            || i64::try_from(cluster.watchers()).unwrap_or(i64::MAX),
            // etcd announces every delete.
            |_| {},
        )
        .await;
        let revision = event["revision"].as_i64().unwrap();
        assert!(
            start < revision && revision <= cluster.revision(),
            "{event} (from revision {start})"
        );
    }

    /// A bad endpoint and an unreachable cluster exit 2 with a one-line error naming the flag
    /// (or the cluster), never the password of `user:pass@`.
    #[test]
    fn bad_or_unreachable_endpoints_exit_2_naming_the_flag_without_the_password() {
        let bad = lockctl(&["--etcd", "not-an-endpoint", "list"]);
        assert_eq!(code(&bad), Some(2), "{bad:?}");
        assert!(
            bad.stderr.contains("--etcd") && bad.stderr.contains("not-an-endpoint"),
            "{bad:?}"
        );
        let password = "s3cret-pw";
        let endpoint = format!("http://root:{password}@127.0.0.1:{}", free_port());
        assert_one_line_errors_without(
            password,
            ["--etcd", &endpoint],
            &[
                &["list"],
                &["inspect", "wallet:1"],
                &["release", "wallet:1", "--force", "--yes"],
                &["watch", "--count", "1"],
                &["--etcd", "also-not-an-endpoint", "list"],
            ],
        );
    }
}
