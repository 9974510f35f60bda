//! Which servers to talk to: Redis URLs from `--url` or `LOCK_REDIS_URL`, or etcd endpoints
//! from `--etcd` or `LOCK_ETCD_ENDPOINTS`; the library client built from them, and direct
//! connections for the commands the library has no call for (list, watch).

use std::time::Duration;

use lock_runtime::{ENV_ETCD_ENDPOINTS, ENV_MODE, ENV_URL, LockClient, LockConfig, LockError};
use redis::aio::{MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo as _,
};

use crate::cli::Global;
use crate::error::CliError;

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The servers and prefix of one invocation.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) prefix: String,
    pub(crate) servers: Servers,
    config: LockConfig,
    /// Every password found in the URLs or endpoints, to scrub from error messages we did not
    /// write.
    secrets: Vec<String>,
}

#[derive(Debug)]
pub(crate) enum Servers {
    /// One node, the Redlock masters, or a cluster's masters (`cluster`: each lock lives on one
    /// of them).
    Redis { nodes: Vec<Node>, cluster: bool },
    /// An etcd cluster: one linearizable store, whatever its members.
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::Etcd),
}

/// One Redis node: its `host:port` label (never with credentials) and a client for it.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: String,
    client: Client,
}

/// The servers the arguments or the environment name, and `from` where (for errors).
enum Chosen {
    Redis {
        urls: Vec<String>,
        from: &'static str,
    },
    Etcd {
        endpoints: Vec<String>,
        from: &'static str,
    },
}

impl Target {
    /// Reads the servers: `--url` or `--etcd` (clap refuses both), else `LOCK_REDIS_URL` or
    /// `LOCK_ETCD_ENDPOINTS` (refused when both are set). Checks them the way the library does:
    /// one Redis URL is a single node, several are Redlock masters (or cluster seeds).
    pub(crate) fn from_args(global: &Global) -> Result<Target, CliError> {
        match choose(global)? {
            Chosen::Redis { urls, from } => Target::redis(global, urls, from),
            Chosen::Etcd { endpoints, from } => Target::etcd(global, endpoints, from),
        }
    }

    fn redis(global: &Global, urls: Vec<String>, from: &'static str) -> Result<Target, CliError> {
        let secrets: Vec<String> = urls.iter().filter_map(|u| password_of(u)).collect();
        let scrub = |text: String| scrub_with(&secrets, text);
        let cluster =
            global.cluster || std::env::var(ENV_MODE).is_ok_and(|m| m.trim() == "cluster");
        let config = match urls.as_slice() {
            seeds if cluster => LockConfig::cluster(seeds.iter().map(String::as_str)),
            [one] => LockConfig::single(one.as_str()),
            many => LockConfig::redlock(many.iter().map(String::as_str)),
        }
        .key_prefix(global.prefix.as_str());
        // Validates every URL (the library's messages never show a password).
        LockClient::new(config.clone()).map_err(|e| CliError::new(scrub(invalid(from, e))))?;
        let mut infos = Vec::with_capacity(urls.len());
        for url in &urls {
            infos.push(
                url.as_str()
                    .into_connection_info()
                    .map_err(|e| CliError::new(scrub(format!("invalid {from}: {e}"))))?,
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
            servers: Servers::Redis { nodes, cluster },
            config,
            secrets,
        })
    }

    #[cfg(feature = "etcd")]
    fn etcd(
        global: &Global,
        endpoints: Vec<String>,
        from: &'static str,
    ) -> Result<Target, CliError> {
        let secrets: Vec<String> = endpoints.iter().filter_map(|e| password_of(e)).collect();
        let config = LockConfig::etcd(endpoints.iter().map(String::as_str))
            .key_prefix(global.prefix.as_str());
        // Validates every endpoint (the library's messages never show a password).
        LockClient::new(config.clone())
            .map_err(|e| CliError::new(scrub_with(&secrets, invalid(from, e))))?;
        Ok(Target {
            prefix: global.prefix.clone(),
            servers: Servers::Etcd(crate::etcd::Etcd::new(&endpoints)),
            config,
            secrets,
        })
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd(_: &Global, _: Vec<String>, from: &'static str) -> Result<Target, CliError> {
        Err(CliError::new(format!(
            "{from}: this lockctl was built without etcd support: build it with `--features etcd`"
        )))
    }

    /// A library client on these servers.
    pub(crate) fn client(&self) -> Result<LockClient, CliError> {
        LockClient::new(self.config.clone()).map_err(|e| self.error(e))
    }

    /// An error whose text cannot show a password from the URLs or endpoints.
    pub(crate) fn error(&self, err: impl std::fmt::Display) -> CliError {
        CliError::new(scrub_with(&self.secrets, err.to_string()))
    }

    /// The Redlock masters, when there are several independent Redis nodes (not a cluster).
    pub(crate) fn redlock(&self) -> Option<&[Node]> {
        match &self.servers {
            Servers::Redis {
                nodes,
                cluster: false,
            } if nodes.len() > 1 => Some(nodes),
            _ => None,
        }
    }
}

/// The servers the flags name, else those the environment names.
fn choose(global: &Global) -> Result<Chosen, CliError> {
    let flag = |values: &[String], name: &'static str| -> Result<Option<Vec<String>>, CliError> {
        if values.is_empty() {
            return Ok(None);
        }
        let list = clean(values.iter().map(String::as_str));
        if list.is_empty() {
            return Err(CliError::new(format!("{name} names no server")));
        }
        Ok(Some(list))
    };
    if let Some(urls) = flag(&global.urls, "--url")? {
        return Ok(Chosen::Redis {
            urls,
            from: "--url",
        });
    }
    if let Some(endpoints) = flag(&global.etcd, "--etcd")? {
        return Ok(Chosen::Etcd {
            endpoints,
            from: "--etcd",
        });
    }
    let env = |name: &str| clean(std::env::var(name).unwrap_or_default().split(','));
    match (env(ENV_URL), env(ENV_ETCD_ENDPOINTS)) {
        (urls, endpoints) if !urls.is_empty() && !endpoints.is_empty() => {
            Err(CliError::new(format!(
                "{ENV_URL} and {ENV_ETCD_ENDPOINTS} are both set: pass --url or --etcd to choose"
            )))
        }
        (urls, _) if !urls.is_empty() => Ok(Chosen::Redis {
            urls,
            from: ENV_URL,
        }),
        (_, endpoints) if !endpoints.is_empty() => Ok(Chosen::Etcd {
            endpoints,
            from: ENV_ETCD_ENDPOINTS,
        }),
        _ => Err(CliError::new(format!(
            "no servers: pass --url (Redis) or --etcd (etcd), or set {ENV_URL} or {ENV_ETCD_ENDPOINTS}"
        ))),
    }
}

/// The non-empty, trimmed items.
fn clean<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    items
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The library's verdict on the servers, naming the flag or variable they came from.
fn invalid(from: &str, err: LockError) -> String {
    match err {
        LockError::Config {
            field: "key_prefix",
            reason,
        } => format!("invalid --prefix: {reason}"),
        LockError::Config { reason, .. } => format!("invalid {from}: {reason}"),
        other => other.to_string(),
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

/// The password in a URL's or an endpoint's user info (the scheme is optional).
fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
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
        assert_eq!(password_of("root:pw@127.0.0.1:1").as_deref(), Some("pw"));
        assert_eq!(password_of("127.0.0.1:1"), None);
    }
}
