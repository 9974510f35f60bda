//! Which servers to talk to: the URLs from `--url` or `LOCK_REDIS_URL`, the library client built
//! from them, and direct connections for the commands the library has no call for (list, watch).

use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use redis::aio::{MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo as _,
};

use crate::cli::Global;
use crate::error::CliError;

const ENV_URL: &str = "LOCK_REDIS_URL";
const ENV_MODE: &str = "LOCK_REDIS_MODE";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The servers and prefix of one invocation.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) prefix: String,
    /// The servers: one, the Redlock masters, or a cluster's masters.
    pub(crate) nodes: Vec<Node>,
    /// A Redis Cluster: each lock lives on one of `nodes`.
    pub(crate) cluster: bool,
    config: LockConfig,
    /// Every password found in the URLs, to scrub from error messages we did not write.
    secrets: Vec<String>,
}

/// One Redis node: its `host:port` label (never with credentials) and a client for it.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: String,
    client: Client,
}

impl Target {
    /// Reads the URLs (the flag, else the environment variable) and checks them the way the
    /// library does: one URL is a single node, several are Redlock masters.
    pub(crate) fn from_args(global: &Global) -> Result<Target, CliError> {
        let urls: Vec<String> = if global.urls.is_empty() {
            std::env::var(ENV_URL)
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect()
        } else {
            global.urls.clone()
        };
        let urls: Vec<String> = urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        let secrets: Vec<String> = urls.iter().filter_map(|u| password_of(u)).collect();
        let scrub = |text: String| scrub_with(&secrets, text);
        let cluster =
            global.cluster || std::env::var(ENV_MODE).is_ok_and(|m| m.trim() == "cluster");
        let config = match urls.as_slice() {
            [] => {
                return Err(CliError::new(format!(
                    "no redis url: pass --url or set {ENV_URL}"
                )));
            }
            seeds if cluster => LockConfig::cluster(seeds.iter().map(String::as_str)),
            [one] => LockConfig::single(one.as_str()),
            many => LockConfig::redlock(many.iter().map(String::as_str)),
        }
        .key_prefix(global.prefix.as_str());
        // Validates every URL (the library's messages never show a password).
        LockClient::new(config.clone()).map_err(|e| CliError::new(scrub(e.to_string())))?;
        let mut infos = Vec::with_capacity(urls.len());
        for url in &urls {
            infos.push(
                url.as_str()
                    .into_connection_info()
                    .map_err(|e| CliError::new(scrub(format!("invalid redis url: {e}"))))?,
            );
        }
        if cluster {
            infos = cluster_masters(&infos).map_err(|e| CliError::new(scrub(e)))?;
        }
        let mut nodes = Vec::with_capacity(infos.len());
        for info in infos {
            let name = info.addr().to_string();
            let client =
                Client::open(info).map_err(|e| CliError::new(scrub(format!("{name}: {e}"))))?;
            nodes.push(Node { name, client });
        }
        Ok(Target {
            prefix: global.prefix.clone(),
            nodes,
            cluster,
            config,
            secrets,
        })
    }

    /// A library client on these servers.
    pub(crate) fn client(&self) -> Result<LockClient, CliError> {
        LockClient::new(self.config.clone()).map_err(|e| self.error(e))
    }

    /// An error whose text cannot show a password from the URLs.
    pub(crate) fn error(&self, err: impl std::fmt::Display) -> CliError {
        CliError::new(scrub_with(&self.secrets, err.to_string()))
    }

    /// How many nodes must agree for a lock to be held (1 on a single node and on a cluster,
    /// where each lock lives on one master).
    pub(crate) fn quorum(&self) -> usize {
        if self.cluster {
            1
        } else {
            self.nodes.len() / 2 + 1
        }
    }
}

impl Node {
    /// A connection with bounded connect and response times.
    pub(crate) async fn connect(&self) -> Result<MultiplexedConnection, String> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| format!("{}: {e}", self.name))
    }

    /// A pub/sub connection (bounded connect).
    pub(crate) async fn pubsub(&self) -> Result<PubSub, String> {
        match tokio::time::timeout(CONNECT_TIMEOUT, self.client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => Ok(pubsub),
            Ok(Err(e)) => Err(format!("{}: {e}", self.name)),
            Err(_) => Err(format!(
                "{}: no connection within {CONNECT_TIMEOUT:?}",
                self.name
            )),
        }
    }
}

/// The masters of the cluster the `seeds` belong to (`CLUSTER SLOTS` from the first seed that
/// answers), with the seeds' credentials and database.
fn cluster_masters(seeds: &[ConnectionInfo]) -> Result<Vec<ConnectionInfo>, String> {
    let mut errors = Vec::new();
    for seed in seeds {
        let slots = Client::open(seed.clone()).and_then(|client| {
            let mut conn = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
            conn.set_read_timeout(Some(RESPONSE_TIMEOUT))?;
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query::<Vec<Vec<redis::Value>>>(&mut conn)
        });
        match slots {
            Ok(ranges) => {
                // Each range: first slot, last slot, [host, port, id, ..] of its master, replicas.
                let mut masters: Vec<(String, u16)> = ranges
                    .iter()
                    .filter_map(|range| match range.get(2) {
                        Some(redis::Value::Array(master)) => Some((
                            redis::from_redis_value_ref(master.first()?).ok()?,
                            redis::from_redis_value_ref(master.get(1)?).ok()?,
                        )),
                        _ => None,
                    })
                    .collect();
                masters.sort();
                masters.dedup();
                return Ok(masters
                    .into_iter()
                    .map(|(host, port)| seed.clone().set_addr(ConnectionAddr::Tcp(host, port)))
                    .collect());
            }
            Err(e) => errors.push(format!("{}: {e}", seed.addr())),
        }
    }
    Err(format!("no cluster seed answered: {}", errors.join("; ")))
}

/// The password in a URL's user info, raw and percent-decoded.
fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

fn scrub_with(secrets: &[String], mut text: String) -> String {
    for secret in secrets {
        for form in [secret.clone(), percent_decode(secret)] {
            if !form.is_empty() {
                text = text.replace(&form, "***");
            }
        }
    }
    text
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_scrubbed_raw_and_decoded() {
        let secret = password_of("redis://user:p%40ss@127.0.0.1:1/").unwrap_or_default();
        assert_eq!(secret, "p%40ss");
        let text = scrub_with(&[secret], "auth failed for p@ss (p%40ss)".to_owned());
        assert_eq!(text, "auth failed for *** (***)");
        assert_eq!(password_of("redis://127.0.0.1:1/"), None);
        assert_eq!(password_of("redis://user@127.0.0.1:1/"), None);
    }
}
