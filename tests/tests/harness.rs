//! Self-tests of the harness: if these fail, no other integration test result means anything.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_tests::{FaultProxy, RedisMasters, RedisServer, ServerOptions, free_port, unique_key};
use redis::{Connection, RedisResult};

fn connect(url: &str, timeout: Duration) -> RedisResult<Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

fn ping(con: &mut Connection) -> RedisResult<String> {
    redis::cmd("PING").query(con)
}

#[test]
fn start_ping_and_keys() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 0);
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    let mut admin = server.admin();
    assert_eq!(ping(&mut admin).unwrap(), "PONG");

    let prefix = unique_key("harness:keys");
    let (a, b) = (format!("{prefix}:b"), format!("{prefix}:a"));
    let () = redis::cmd("SET").arg(&a).arg(1).query(&mut admin).unwrap();
    let () = redis::cmd("SET").arg(&b).arg(2).query(&mut admin).unwrap();
    assert_eq!(server.keys(&format!("{prefix}:*")), vec![b, a], "sorted");
    assert!(server.keys("nothing:*").is_empty());
    assert!(
        server.log_tail(50).contains("Ready to accept connections"),
        "{}",
        server.log_tail(50)
    );
}

#[test]
fn stop_breaks_connections_and_is_idempotent() {
    let mut server = RedisServer::start();
    let mut con = connect(&server.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    let pid = server.pid();

    server.stop();
    server.stop();
    assert!(
        ping(&mut con).is_err(),
        "existing connection still works after stop"
    );
    let fresh = connect(&server.url(), Duration::from_secs(2)).and_then(|mut c| ping(&mut c));
    assert!(fresh.is_err(), "new connection works after stop: {fresh:?}");
    assert_eq!(server.pid(), pid);
    // The process is reaped: it no longer exists.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    assert!(nix::sys::signal::kill(pid, None).is_err());
}

#[test]
fn freeze_times_out_and_thaw_recovers() {
    let server = RedisServer::start();
    let mut con = connect(&server.url(), Duration::from_millis(300)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    server.freeze();
    let err = ping(&mut con).unwrap_err();
    assert!(
        err.is_timeout(),
        "expected a read timeout while frozen, got {err:?}"
    );

    server.thaw();
    // The old connection still has the late PONG in flight; use a fresh one.
    let mut fresh = connect(&server.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
}

#[test]
fn drop_of_frozen_server_kills_it() {
    let server = RedisServer::start();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.pid()).unwrap());
    server.freeze();
    drop(server);
    assert!(
        nix::sys::signal::kill(pid, None).is_err(),
        "process survived drop"
    );
}

#[test]
fn restart_gives_empty_dataset_on_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    let old_pid = server.pid();
    let key = unique_key("harness:restart");
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(server.keys("*"), vec![key.clone()]);

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(server.keys("*").is_empty(), "dataset survived restart");
    assert_eq!(ping(&mut server.admin()).unwrap(), "PONG");

    // Restarting a stopped server works too.
    server.stop();
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(ping(&mut server.admin()).unwrap(), "PONG");
}

#[test]
fn restart_with_appendonly_keeps_data() {
    let mut server = RedisServer::start_with(ServerOptions {
        appendonly: true,
        extra_args: vec!["--appendfsync".into(), "always".into()],
        ..ServerOptions::default()
    });
    let key = unique_key("harness:aof");
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query(&mut server.admin())
        .unwrap();
    server.restart();
    assert_eq!(server.keys("*"), vec![key]);
}

#[test]
fn requirepass_rejects_anonymous_clients() {
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some("s3cr:t@pw".into()),
        ..ServerOptions::default()
    });
    assert!(
        server.url().contains(":s3cr%3At%40pw@127.0.0.1:"),
        "{}",
        server.url()
    );

    let anonymous = format!("redis://127.0.0.1:{}/", server.port());
    let err = connect(&anonymous, Duration::from_secs(2))
        .and_then(|mut c| ping(&mut c))
        .unwrap_err();
    assert!(
        err.code() == Some("NOAUTH") || err.kind() == redis::ErrorKind::AuthenticationFailed,
        "expected an auth error, got {err:?}"
    );
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let err = connect(&wrong, Duration::from_secs(2))
        .and_then(|mut c| ping(&mut c))
        .unwrap_err();
    assert!(
        err.kind() == redis::ErrorKind::AuthenticationFailed || err.code() == Some("WRONGPASS"),
        "expected an auth error, got {err:?}"
    );

    assert_eq!(ping(&mut server.admin()).unwrap(), "PONG");
    assert!(server.keys("*").is_empty());
}

#[test]
fn acl_rule_restricts_user() {
    let server = RedisServer::start_with(ServerOptions {
        acl_rules: vec!["user locker on >lockpw ~lock:* +@all".into()],
        ..ServerOptions::default()
    });
    let url = server.url_as("locker", "lockpw");
    assert_eq!(
        url,
        format!("redis://locker:lockpw@127.0.0.1:{}/", server.port())
    );
    let mut locker = connect(&url, Duration::from_secs(2)).unwrap();
    let () = redis::cmd("SET")
        .arg("lock:x")
        .arg(1)
        .query(&mut locker)
        .unwrap();
    let err = redis::cmd("SET")
        .arg("other:x")
        .arg(1)
        .query::<()>(&mut locker)
        .unwrap_err();
    assert_eq!(err.code(), Some("NOPERM"), "{err:?}");

    let bad = connect(&server.url_as("locker", "nope"), Duration::from_secs(2));
    assert!(bad.is_err(), "wrong password accepted");

    // The default user is untouched.
    let () = redis::cmd("SET")
        .arg("other:x")
        .arg(1)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(
        server.keys("*"),
        vec!["lock:x".to_owned(), "other:x".to_owned()]
    );
}

#[test]
fn masters_are_distinct_independent_nodes() {
    let masters = RedisMasters::start(3);
    assert_eq!(masters.nodes.len(), 3);
    let mut ports: Vec<u16> = masters.nodes.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "ports not distinct: {ports:?}");
    let urls = masters.urls();
    assert_eq!(urls.len(), 3);
    assert_eq!(urls[1], masters.nodes[1].url());

    let key = unique_key("harness:masters");
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(1)
        .query(&mut masters.nodes[0].admin())
        .unwrap();
    assert_eq!(masters.nodes[0].keys("*"), vec![key]);
    assert!(masters.nodes[1].keys("*").is_empty());
    assert!(masters.nodes[2].keys("*").is_empty());
}

#[test]
fn proxy_forwards_and_delays() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    let mut con = connect(&proxy.url(), Duration::from_secs(5)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    // Applies to an existing connection.
    proxy.set_delay(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "PING through a 200ms delay took {took:?}"
    );

    // Many chunks in flight under a delay arrive intact and in order.
    proxy.set_delay(Duration::from_millis(2));
    let key = unique_key("harness:proxy");
    let value: String = (0..200_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut pipe = redis::pipe();
    for i in 0..50 {
        pipe.cmd("RPUSH").arg(&key).arg(format!("{i}:{value}"));
    }
    pipe.cmd("LRANGE").arg(&key).arg(0).arg(-1);
    let mut results: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    let list: Vec<String> = redis::from_redis_value(results.pop().unwrap()).unwrap();
    let expected: Vec<String> = (0..50).map(|i| format!("{i}:{value}")).collect();
    assert!(
        list == expected,
        "bytes reordered or lost through the proxy"
    );
}

#[test]
fn proxy_blackhole_hangs_then_heals() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url(), Duration::from_millis(300)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    proxy.set_blackhole(true);
    let err = ping(&mut con).unwrap_err();
    assert!(
        err.is_timeout(),
        "expected a read timeout in the blackhole, got {err:?}"
    );

    proxy.set_blackhole(false);
    let mut fresh = connect(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
}

#[test]
fn proxy_cut_all_breaks_existing_connections_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    proxy.cut_all();
    assert!(ping(&mut con).is_err(), "connection survived cut_all");

    let mut fresh = connect(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
}

#[test]
fn proxy_holds_fifty_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut cons: Vec<Connection> = (0..50)
        .map(|_| connect(&proxy.url(), Duration::from_secs(5)).unwrap())
        .collect();
    for con in &mut cons {
        assert_eq!(ping(con).unwrap(), "PONG");
    }
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.admin())
        .unwrap();
    assert!(clients.lines().count() >= 50, "{clients}");
}

#[test]
fn proxy_drop_closes_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    drop(proxy);
    assert!(ping(&mut con).is_err(), "connection survived proxy drop");
}

#[tokio::test]
async fn proxy_and_server_can_be_used_and_dropped_in_async_tests() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    drop(proxy);
    drop(server);
}

#[test]
fn unique_keys_and_free_ports() {
    let a = unique_key("p");
    let b = unique_key("p");
    assert_ne!(a, b);
    assert!(a.starts_with(&format!("p:{}:", std::process::id())), "{a}");
    assert_ne!(free_port(), 0);
}

/// The cluster harness: three masters with one replica each, every slot served, and keys of
/// different hash tags spread over all three masters.
#[test]
fn cluster_has_three_masters_with_replicas() {
    let cluster = lock_tests::RedisCluster::shared();
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");
    for master in &masters {
        let replica = cluster.replica_of(master);
        assert_ne!(replica.port(), master.port());
    }
    let owners: std::collections::BTreeSet<u16> = (0..60)
        .map(|i| cluster.master_of(&format!("lock:{{k{i}}}")).port())
        .collect();
    assert_eq!(owners.len(), 3, "{owners:?}");
}

/// The sentinel harness: the sentinels name the first data node as master, the other is its
/// replica.
#[test]
fn sentinel_set_names_its_master() {
    let set = lock_tests::SentinelSet::shared();
    assert_eq!(set.master().port(), set.data[0].port());
    assert!(
        set.replica()
            .info("replication")
            .contains("master_link_status:up")
    );
}

/// A Sentinel set's count of lock requests stands still while no client asks, though every
/// sentinel publishes its hello message on the master (every 2 s each): two clean-clone CI runs
/// failed a count over a few milliseconds on one such `PUBLISH`.
#[test]
fn a_sentinel_sets_lock_request_count_leaves_out_the_sentinels_hellos() {
    use lock_tests::LockStore;
    let set = lock_tests::SentinelSet::shared();
    let requests = set.lock_requests();
    let publishes = set.master().command_calls("publish");
    // The hello period plus slack for a sentinel that is still connecting.
    lock_tests::wait_until(
        Duration::from_secs(4),
        "a sentinel's hello on the master",
        || set.master().command_calls("publish") > publishes,
    );
    assert_eq!(set.lock_requests(), requests);
}

/// The campaign's worker pause (`nemesis::pause_process`) records a span that no clock reading
/// of the paused process falls into: the checker compares the workers' readings with it (a
/// reading taken after the signal was sent but before it took effect once passed for one taken
/// during the pause, and the campaign reported a documented limit as a violation).
#[test]
fn a_paused_process_reads_the_clock_only_before_or_after_the_recorded_pause() {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};

    use lock_tests::campaign::nemesis::pause_process;

    let mut child = Command::new(env!("CARGO_BIN_EXE_clock_reader"))
        .arg("20")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Every reading, in the order printed.
    let readings = std::thread::spawn(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| line.parse::<u64>().ok())
            .collect::<Vec<u64>>()
    });
    let mut spans = Vec::new();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(20));
        spans.push(pause_process(child.id(), Duration::from_millis(50)).unwrap());
    }
    std::thread::sleep(Duration::from_millis(20));
    child.kill().unwrap();
    child.wait().unwrap();
    let readings = readings.join().unwrap();
    // The reader reads as fast as it runs, but runs only when scheduled, and blocks when the
    // pipe is full: on a busy machine its readings have gaps of tens of milliseconds (24 ms
    // before a pause failed a 20 ms bound here with two test binaries beside it).
    let near = u64::try_from(lock_tests::SCHEDULING_SLACK.as_nanos()).unwrap();
    for (start, end) in spans {
        // The process was running around the pause: it read the clock shortly before and after.
        let before = readings.iter().filter(|&&r| r < start).max().copied();
        let after = readings.iter().filter(|&&r| r > end).min().copied();
        assert!(
            before.is_some_and(|b| start - b < near) && after.is_some_and(|a| a - end < near),
            "no reading within {near} ns of the pause {start}..{end}: {before:?}, {after:?}"
        );
        let inside: Vec<u64> = readings
            .iter()
            .copied()
            .filter(|&r| (start..=end).contains(&r))
            .collect();
        assert!(
            inside.is_empty(),
            "{} readings inside the pause {start}..{end}, the first {} ns after its start",
            inside.len(),
            inside[0] - start
        );
    }
}
