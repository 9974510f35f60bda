//! Who holds a lock, on every backend: each grant records its owner (the configured name, host,
//! process id, program, and when it asked), and `inspect` from another client reads it back: one
//! owner for an exclusive or fair lock, one per share or permit.

use std::time::{Duration, SystemTime};

use lock_runtime::{LockClient, LockInfo, Owner};
use lock_tests::unique_key;

use super::Fx;

/// A client of the fixture's backend named `name`, and the client that inspects what it holds:
/// `fx.b` (another client, another "process"), or in memory, where clients share nothing, the
/// named client itself.
fn named(fx: &Fx, name: &str) -> (LockClient, LockClient) {
    let own = fx.client_with(|config| config.owner(name));
    let observer = if fx.node_count() == 0 {
        own.clone()
    } else {
        fx.b.clone()
    };
    (own, observer)
}

/// The program this test runs as, as a grant records it.
fn program() -> String {
    std::env::current_exe()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// `owner` is this process, named `name`, and asked between `asked` and `granted` (records
/// keep milliseconds: `asked` counts from its millisecond).
fn assert_ours(owner: &Owner, name: &str, asked: SystemTime, granted: SystemTime) {
    assert_eq!(owner.name, name);
    assert_eq!(owner.pid, std::process::id());
    assert_eq!(owner.program, program());
    assert!(!owner.host.is_empty(), "{owner:?}");
    let since = owner.since.expect("a time");
    assert!(
        since + Duration::from_millis(1) > asked && since <= granted,
        "asked at {asked:?}, granted by {granted:?}, recorded {since:?}"
    );
}

async fn held(observer: &LockClient, key: &str) -> LockInfo {
    observer.inspect(key).await.unwrap().expect("held")
}

/// An exclusive and a fair lock name their one holder; the name defaults to `host:pid`; the
/// owner goes with the lock (gone once released).
pub(crate) async fn inspect_names_the_owner(fx: &Fx) {
    let (own, observer) = named(fx, "beh-owner");
    for fair in [false, true] {
        let key = unique_key("beh:owner");
        let asked = SystemTime::now();
        let guard = own.lock(&key).fair(fair).acquire().await.unwrap();
        let granted = SystemTime::now();
        let info = held(&observer, &key).await;
        assert_eq!(info.owners.len(), 1, "fair {fair}: {info:?}");
        assert_ours(&info.owners[0], "beh-owner", asked, granted);
        guard.release().await.unwrap();
        assert_eq!(observer.inspect(&key).await.unwrap(), None);
    }
    let unnamed = if fx.node_count() == 0 {
        fx.a.clone()
    } else {
        fx.client_with(|config| config)
    };
    let key = unique_key("beh:owner-default");
    let guard = unnamed.lock(&key).acquire().await.unwrap();
    let viewer = if fx.node_count() == 0 {
        &unnamed
    } else {
        &fx.b
    };
    let info = held(viewer, &key).await;
    let [owner] = info.owners.as_slice() else {
        panic!("one owner: {info:?}");
    };
    assert_eq!(owner.name, format!("{}:{}", owner.host, owner.pid));
    guard.release().await.unwrap();
}

/// Each reader of a shared lock has its own entry, named after its client.
#[allow(
    dead_code,
    reason = "binaries without the kind checks (hosted) leave this check unused"
)]
pub(crate) async fn each_share_names_its_owner(fx: &Fx) {
    let key = unique_key("beh:owner-shared");
    let (first, observer) = named(fx, "reader-1");
    let second = fx.client_with(|config| config.owner("reader-2"));
    let asked = SystemTime::now();
    // Not reentrant: each call is a share of its own, not a join of the task's first one.
    let share = |client: &LockClient| client.lock(&key).shared(true).reentrant(false);
    let one = share(&first).acquire().await.unwrap();
    // In memory only the first client's state is visible: its reader takes a second share.
    let other = if fx.node_count() == 0 {
        &first
    } else {
        &second
    };
    let two = share(other).acquire().await.unwrap();
    let granted = SystemTime::now();
    let info = held(&observer, &key).await;
    assert_eq!(info.holders, 2, "{info:?}");
    let mut names: Vec<&str> = info.owners.iter().map(|o| o.name.as_str()).collect();
    names.sort_unstable();
    let expected = if fx.node_count() == 0 {
        ["reader-1", "reader-1"]
    } else {
        ["reader-1", "reader-2"]
    };
    assert_eq!(names, expected, "{info:?}");
    for owner in &info.owners {
        assert_ours(owner, &owner.name, asked, granted);
    }
    two.release().await.unwrap();
    let info = held(&observer, &key).await;
    assert_eq!(info.owners.len(), 1, "{info:?}");
    assert_eq!(info.owners[0].name, "reader-1");
    one.release().await.unwrap();
}

/// A semaphore names the holder of each permit taken.
#[allow(
    dead_code,
    reason = "Redlock refuses semaphores and hosted runs no kind: their binaries leave it unused"
)]
pub(crate) async fn each_permit_names_its_owner(fx: &Fx) {
    let key = unique_key("beh:owner-permits");
    let (own, observer) = named(fx, "permit-holder");
    let asked = SystemTime::now();
    let permit = || own.lock(&key).permits(3).reentrant(false);
    let first = permit().acquire().await.unwrap();
    let second = permit().acquire().await.unwrap();
    let granted = SystemTime::now();
    let info = held(&observer, &key).await;
    assert_eq!(info.holders, 2, "{info:?}");
    assert_eq!(info.owners.len(), 2, "{info:?}");
    for owner in &info.owners {
        assert_ours(owner, "permit-holder", asked, granted);
    }
    first.release().await.unwrap();
    second.release().await.unwrap();
}
