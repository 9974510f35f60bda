//! etcd (feature `etcd`): the reads the library has no call for. `list` ranges over the lock
//! prefix for lock names, `watch` watches it for deletions; `lock_runtime::layout::etcd_lock_name`
//! maps each key back to its lock (the layout is the library's).

use std::collections::BTreeSet;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchFilterType, WatchOptions};

use crate::target::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};

/// Keys read per range request of `list`.
const PAGE: i64 = 1000;

/// An etcd cluster: its endpoints without credentials, and the user to authenticate as.
pub(crate) struct Etcd {
    /// `etcd[host:port,...]`, as the library names the cluster in `inspect`'s node list.
    pub(crate) name: String,
    urls: Vec<String>,
    user: Option<(String, String)>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Keys of a lock were deleted at `revision`: it was released (by its holder or by force), a
/// lease under it ran out, or a waiter left its line.
#[derive(Debug)]
pub(crate) struct Deletion {
    pub(crate) name: String,
    pub(crate) revision: i64,
}

impl Etcd {
    /// `endpoints` as the library accepted them: `[http(s)://][user:password@]host:port`.
    pub(crate) fn new(endpoints: &[String]) -> Etcd {
        let mut user = None;
        let mut hosts = Vec::with_capacity(endpoints.len());
        let mut urls = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let (scheme, rest) = endpoint.split_once("://").unwrap_or(("http", endpoint));
            let authority = rest.trim_end_matches('/');
            let host = match authority.rsplit_once('@') {
                Some((userinfo, host)) => {
                    if let Some((name, password)) = userinfo.split_once(':') {
                        user = Some((name.to_owned(), password.to_owned()));
                    }
                    host
                }
                None => authority,
            };
            hosts.push(host.to_owned());
            urls.push(format!("{scheme}://{host}"));
        }
        Etcd {
            name: format!("etcd[{}]", hosts.join(",")),
            urls,
            user,
        }
    }

    /// A client with bounded connect and request times (a watch's stream is not bounded, only
    /// its start), which asks only members that have a leader.
    async fn client(&self) -> Result<Client, String> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(RESPONSE_TIMEOUT)
            .with_require_leader(true);
        if let Some((user, password)) = &self.user {
            options = options.with_user(user.clone(), password.clone());
        }
        // With a user, connecting authenticates: one request.
        let bound = CONNECT_TIMEOUT + RESPONSE_TIMEOUT;
        match tokio::time::timeout(bound, Client::connect(&self.urls, Some(options))).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(format!("{}: {e}", self.name)),
            Err(_) => Err(format!("{}: no connection within {bound:?}", self.name)),
        }
    }

    /// The names of the locks that have a key or a holder's entry under `prefix`, sorted, from
    /// one snapshot (the revision of the first page).
    pub(crate) async fn names(&self, prefix: &str) -> Result<BTreeSet<String>, String> {
        let mut client = self.client().await?;
        let (mut start, end) = range_of(prefix);
        let mut revision = 0;
        let mut names = BTreeSet::new();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(PAGE)
                .with_revision(revision);
            let request = client.get(start.clone(), Some(options));
            let page = match tokio::time::timeout(RESPONSE_TIMEOUT, request).await {
                Ok(Ok(page)) => page,
                Ok(Err(e)) => return Err(format!("{}: {e}", self.name)),
                Err(_) => {
                    return Err(format!(
                        "{}: no answer to a range read within {RESPONSE_TIMEOUT:?}",
                        self.name
                    ));
                }
            };
            if revision == 0 {
                revision = page.header().map_or(0, |h| h.revision());
            }
            names.extend(
                page.kvs()
                    .iter()
                    .filter_map(|kv| lock_runtime::layout::etcd_lock_name(prefix, kv.key())),
            );
            match page.kvs().last() {
                Some(last) if page.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok(names)
    }

    /// Watches `prefix` for deletions from now on and sends one [`Deletion`] per lock and
    /// revision; returns once the watch is set up, with the stream of deletions (ending with an
    /// error when the watch breaks).
    pub(crate) async fn watch(
        &self,
        prefix: &str,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Deletion, String>>, String> {
        let mut client = self.client().await?;
        let (start, end) = range_of(prefix);
        let options = WatchOptions::new()
            .with_range(end)
            .with_filters([WatchFilterType::NoPut]);
        let failed = |e: etcd_client::Error| format!("{}: {e}", self.name);
        let mut stream = match tokio::time::timeout(
            RESPONSE_TIMEOUT,
            client.watch(start, Some(options)),
        )
        .await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => {
                return Err(format!(
                    "{}: no watch within {RESPONSE_TIMEOUT:?}",
                    self.name
                ));
            }
        };
        // The first message confirms the watch: deletions from then on are seen.
        match tokio::time::timeout(RESPONSE_TIMEOUT, stream.message()).await {
            Ok(Ok(Some(resp))) if resp.created() => {}
            Ok(Ok(_)) => return Err(format!("{}: the watch was refused", self.name)),
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => {
                return Err(format!(
                    "{}: no watch within {RESPONSE_TIMEOUT:?}",
                    self.name
                ));
            }
        }
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let (prefix, name) = (prefix.to_owned(), self.name.clone());
        tokio::spawn(async move {
            // The client must live as long as its watch.
            let _client = client;
            loop {
                let resp = match stream.message().await {
                    Ok(Some(resp)) => resp,
                    Ok(None) => {
                        let _ = tx.send(Err(format!("{name}: the watch ended"))).await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("{name}: {e}"))).await;
                        return;
                    }
                };
                let mut seen: Vec<(i64, String)> = Vec::new();
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    if event.event_type() != EventType::Delete {
                        continue;
                    }
                    let Some(lock) = lock_runtime::layout::etcd_lock_name(&prefix, kv.key()) else {
                        continue;
                    };
                    // One line per lock and revision: a release deletes a lock's keys at once.
                    let this = (kv.mod_revision(), lock);
                    if !seen.contains(&this) {
                        seen.push(this);
                    }
                }
                for (revision, lock) in seen {
                    let deletion = Deletion {
                        name: lock,
                        revision,
                    };
                    if tx.send(Ok(deletion)).await.is_err() {
                        return;
                    }
                }
                if resp.canceled() {
                    let why = resp.cancel_reason();
                    let _ = tx
                        .send(Err(format!("{name}: the watch was cancelled: {why}")))
                        .await;
                    return;
                }
            }
        });
        Ok(rx)
    }
}

/// The etcd keys `[start, end)` that every lock key under `prefix` falls in: those that begin
/// with the prefix up to its first NUL (the library escapes NUL bytes of a key).
fn range_of(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let plain = prefix.split('\0').next().unwrap_or_default().as_bytes();
    let mut end = plain.to_vec();
    // The first key past every key that starts with `plain` (`\0`: no end, every key).
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            break;
        }
    }
    if end.is_empty() {
        end.push(0);
    }
    let start = if plain.is_empty() {
        vec![0]
    } else {
        plain.to_vec()
    };
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_covers_the_prefix() {
        assert_eq!(range_of("lock:"), (b"lock:".to_vec(), b"lock;".to_vec()));
        assert_eq!(range_of(""), (vec![0], vec![0]));
        assert_eq!(range_of("a\0b"), (b"a".to_vec(), b"b".to_vec()));
    }

    #[test]
    fn endpoints_lose_their_credentials() {
        let etcd = Etcd::new(&[
            "http://root:pw@127.0.0.1:1".to_owned(),
            "127.0.0.1:2".to_owned(),
        ]);
        assert_eq!(etcd.name, "etcd[127.0.0.1:1,127.0.0.1:2]");
        assert_eq!(etcd.urls, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert_eq!(etcd.user, Some(("root".to_owned(), "pw".to_owned())));
        assert!(!format!("{etcd:?}").contains("pw"));
    }
}
