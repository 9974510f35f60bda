//! The endpoints of an etcd cluster, as configured: each member's address, and the one user
//! the client authenticates as.

use std::fmt;

use crate::config::redact_endpoint;
use crate::error::LockError;

/// The validated endpoints of an etcd cluster, and the user to authenticate as.
pub(crate) struct EtcdAddrs {
    pub(super) members: Vec<MemberAddr>,
    pub(super) user: Option<(String, String)>,
}

pub(super) struct MemberAddr {
    /// `host:port`, for errors.
    pub(super) name: String,
    /// `http(s)://host:port`, without credentials.
    pub(super) url: String,
}

impl fmt::Debug for EtcdAddrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.members.iter().map(|m| m.name.as_str()).collect();
        f.debug_struct("EtcdAddrs")
            .field("members", &names)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

impl EtcdAddrs {
    /// Parses `endpoints` (see [`LockConfig::etcd`](crate::LockConfig::etcd)), reporting errors
    /// on `field`.
    pub(crate) fn parse(field: &'static str, endpoints: &[String]) -> Result<Self, LockError> {
        if endpoints.is_empty() {
            return Err(LockError::config(field, "must name at least one endpoint"));
        }
        let mut members: Vec<MemberAddr> = Vec::with_capacity(endpoints.len());
        let mut user: Option<(String, String)> = None;
        for endpoint in endpoints {
            let shown = redact_endpoint(endpoint);
            let (scheme, rest) = endpoint.split_once("://").unwrap_or(("http", endpoint));
            match scheme {
                "http" => {}
                "https" if cfg!(feature = "tls") => {}
                "https" => {
                    return Err(LockError::config(
                        field,
                        format!(
                            "{shown} uses TLS, which this build does not include: enable the `tls` feature of lock-runtime"
                        ),
                    ));
                }
                _ => {
                    return Err(LockError::config(
                        field,
                        format!("{shown} is not an http:// or https:// endpoint"),
                    ));
                }
            }
            let authority = rest.trim_end_matches('/');
            let (userinfo, host) = match authority.rsplit_once('@') {
                Some((userinfo, host)) => (Some(userinfo), host),
                None => (None, authority),
            };
            let port_ok = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !port_ok || host.contains('/') {
                return Err(LockError::config(
                    field,
                    format!("{shown} is not host:port (with an optional http:// or https://)"),
                ));
            }
            if let Some(userinfo) = userinfo {
                let Some((name, password)) = userinfo.split_once(':') else {
                    return Err(LockError::config(
                        field,
                        format!("{shown} names a user without a password (user:password@)"),
                    ));
                };
                let this = (name.to_owned(), password.to_owned());
                match &user {
                    Some(other) if *other != this => {
                        return Err(LockError::config(
                            field,
                            "names different users on different endpoints (one client, one user)",
                        ));
                    }
                    _ => user = Some(this),
                }
            }
            if members.iter().any(|m| m.name == host) {
                return Err(LockError::config(
                    field,
                    format!("names endpoint {host} twice"),
                ));
            }
            members.push(MemberAddr {
                name: host.to_owned(),
                url: format!("{scheme}://{host}"),
            });
        }
        Ok(EtcdAddrs { members, user })
    }

    /// Whether any endpoint is `https://`.
    pub(crate) fn uses_tls(&self) -> bool {
        self.members.iter().any(|m| m.url.starts_with("https://"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(endpoints: &[&str]) -> Result<EtcdAddrs, LockError> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
        EtcdAddrs::parse("endpoints", &endpoints)
    }

    #[test]
    fn endpoints_parse_and_name_their_field() {
        let addrs = parse(&["127.0.0.1:2379", "http://u:hunter2@h2:2379/"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(addrs.members[0].url, "http://127.0.0.1:2379");
        assert_eq!(addrs.members[1].url, "http://h2:2379");
        assert_eq!(addrs.user, Some(("u".to_owned(), "hunter2".to_owned())));
        assert!(!format!("{addrs:?}").contains("hunter2"));
        for bad in [
            &[][..],
            &["redis://h:1"],
            &["h"],
            &["h:0"],
            &["h:1", "http://h:1"],
            &["http://u@h:1"],
            &["http://a:b@h:1", "http://c:d@h:2"],
        ] {
            match parse(bad) {
                Err(LockError::Config { field, reason }) => {
                    assert_eq!(field, "endpoints");
                    assert!(
                        !reason.contains("hunter2") && !reason.contains(":b@"),
                        "{reason}"
                    );
                }
                Err(other) => panic!("{bad:?}: {other:?}"),
                Ok(_) => panic!("{bad:?} was accepted"),
            }
        }
        let tls = parse(&["https://u:hunter2@h:2379"]);
        if cfg!(feature = "tls") {
            assert!(tls.is_ok());
        } else {
            let msg = tls.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains("`tls` feature") && !msg.contains("hunter2"),
                "{msg}"
            );
        }
    }
}
