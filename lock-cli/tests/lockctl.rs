//! `lockctl` as a real process against real `redis-server`s, with locks held through `LockClient`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{
    Finished, RedisMasters, RedisServer, Worker, free_port, key_exists, unique_key, wait_until,
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
        ["KEY", "REMAINING", "FENCE", "HOLDERS", "QUEUED"]
    );
    let cells = row(&all, &wallet).unwrap_or_else(|| panic!("{wallet} not listed: {all:?}"));
    assert!(cells[1].ends_with('s'), "remaining: {cells:?}");
    let token = held.fencing_token().unwrap().to_string();
    assert_eq!(cells[2], token);
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
        cells[3..],
        ["2", "0"],
        "holders and queue of a read lock: {all:?}"
    );
    let cells = row(&all, &queue).unwrap_or_else(|| panic!("{queue} not listed: {all:?}"));
    assert_eq!(
        cells[3..],
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
    let text = out.stdout.join("\n");
    assert!(text.contains(&key), "{text}");
    let remaining = out
        .stdout
        .iter()
        .find(|l| l.starts_with("remaining"))
        .unwrap();
    assert!(remaining.trim_end().ends_with('s'), "{remaining}");
    let token = out
        .stdout
        .iter()
        .find(|l| l.starts_with("fencing token"))
        .unwrap();
    assert!(
        token
            .trim_end()
            .ends_with(&guard.fencing_token().unwrap().to_string()),
        "{token}"
    );

    let free = lockctl(&["--url", &url, "inspect", &unique_key("free")]);
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
    let [lock_key, _, _] = lock_runtime::__private::redis_keys("lock:", &key);
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

#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_a_release_then_stops_after_count() {
    let server = RedisServer::start();
    let locks = client(&server);
    let (key, ignored) = (unique_key("watched"), unique_key("ignored"));
    let url = server.url();
    for json_output in [false, true] {
        let guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
        let noise = locks.lock(&ignored).ttl(TTL).acquire().await.unwrap();
        let mut args = vec!["--url", &url, "watch", "watched:*", "--count", "1"];
        if json_output {
            args.push("--json");
        }
        let mut watch = Worker::spawn(env!("CARGO_BIN_EXE_lockctl"), &args);
        wait_until(Duration::from_secs(10), "lockctl watch subscribed", || {
            numpat(&server) >= 1
        });
        // Filtered out by the pattern: must not count.
        noise.release().await.unwrap();
        guard.release().await.unwrap();
        let line = watch.next_line(Duration::from_secs(10));
        if json_output {
            let event: serde_json::Value = serde_json::from_str(&line).unwrap();
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
            numpat(&server) == 0
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_outputs_parse() {
    let server = RedisServer::start();
    let locks = client(&server);
    let key = unique_key("wallet");
    let guard = locks.lock(&key).ttl(TTL).acquire().await.unwrap();
    let token = guard.fencing_token().unwrap();
    let url = server.url();

    let list = json(&lockctl(&["--url", &url, "--json", "list"]));
    let entry = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["key"] == key.as_str());
    let entry = entry.unwrap_or_else(|| panic!("{key} not in {list}"));
    assert_eq!(entry["held"], true);
    assert_eq!(entry["fencing_token"], token);
    assert!(entry["remaining_ms"].as_u64().unwrap() <= 30_000);

    let inspect = json(&lockctl(&["--url", &url, "--json", "inspect", &key]));
    assert_eq!(inspect["key"], key.as_str());
    assert_eq!(inspect["fencing_token"], token);
    assert_eq!(inspect["holders"], 1);

    let free = lockctl(&["--url", &url, "--json", "inspect", "nobody"]);
    assert_eq!(code(&free), Some(1));
    assert_eq!(json(&free)["held"], false);

    let release = json(&lockctl(&[
        "--url", &url, "--json", "release", &key, "--force", "--yes",
    ]));
    assert_eq!(release["released"], true);
}

#[test]
fn an_unreachable_server_exits_2_with_a_one_line_error_without_the_password() {
    let password = "s3cret-pw";
    let url = format!("redis://:{password}@127.0.0.1:{}/", free_port());
    for command in [
        &["list"][..],
        &["inspect", "wallet:1"],
        &["watch", "--count", "1"],
    ] {
        let mut args = vec!["--url", &url];
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
        9,
        "key, nodes, remaining, fence, holders, queued and one column per node: {list:?}"
    );

    // One node loses the key: still listed, held by 2 of 3.
    let [lock_key, _, _] = lock_runtime::__private::redis_keys("lock:", &key);
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
        let [lock_key, _, _] = lock_runtime::__private::redis_keys("lock:", &key);
        masters.insert(format!("127.0.0.1:{}", cluster.master_of(&lock_key).port()));
    }
    assert!(masters.len() > 1, "{masters:?}");

    let list = lockctl(&["--cluster", "--url", &seed, "list", &format!("{prefix}:*")]);
    assert_eq!(code(&list), Some(0), "{list:?}");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("{prefix}:{i}");
        let cells = row(&list, &key).unwrap_or_else(|| panic!("{key} not listed: {list:?}"));
        let [lock_key, _, _] = lock_runtime::__private::redis_keys("lock:", &key);
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
        guards[3].fencing_token().unwrap(),
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
    let [lock_key, _, _] = lock_runtime::__private::redis_keys("lock:", &key);
    assert!(cluster.master_of(&lock_key).keys(&lock_key).is_empty());

    let watch = lockctl(&["--cluster", "--url", &seed, "watch"]);
    assert_eq!(code(&watch), Some(2), "{watch:?}");
    assert!(watch.stderr.contains("sharded"), "{watch:?}");
    for guard in guards {
        let _ = guard.release().await;
    }
}
