//! Which `EtcdCluster` a client URL names: how an `EtcdBackup`'s `etcdEndpoints` (CoreOS' field,
//! URLs such as `http://example-client:2379`) are tied to one cluster of the backup's own
//! namespace. The webhook refuses endpoints that name no cluster, another namespace or two
//! clusters; the controller reaches the members of the cluster they name itself (pod IPs, the
//! operator's TLS), so a backup can only ever read a cluster of its own namespace.
//!
//! Accepted host names, for cluster `NAME` in namespace `NS` and any cluster domain:
//! the client Service (`NAME-client`, `NAME-client.NS`, `NAME-client.NS.svc`,
//! `NAME-client.NS.svc.DOMAIN`) and a member's CoreOS address (`MEMBER.NAME.NS.svc[.DOMAIN]`,
//! `MEMBER.NAME.NS`, where `MEMBER` is `NAME-N`).

use crate::names;

/// Why client URLs do not name one cluster of the namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// No URL was given.
    #[error(
        "no endpoint is given: name the cluster's client Service, e.g. http://NAME-client:2379"
    )]
    Empty,
    /// The URL is not `http://HOST[:PORT]` or `https://HOST[:PORT]`.
    #[error("{url:?} is not an http:// or https:// URL with a host (and optionally a port)")]
    NotUrl {
        /// The URL, shortened.
        url: String,
    },
    /// The host is an IP address, which names no cluster.
    #[error(
        "{url:?} names an IP address: name the cluster's client Service instead (http://NAME-client:2379)"
    )]
    IpAddress {
        /// The URL, shortened.
        url: String,
    },
    /// The host is not a client Service or member address of a cluster.
    #[error(
        "{url:?} names no EtcdCluster: use its client Service (NAME-client[.{namespace}[.svc]]) or a member address (NAME-N.NAME.{namespace}.svc)"
    )]
    NotCluster {
        /// The URL, shortened.
        url: String,
        /// The namespace of the backup.
        namespace: String,
    },
    /// The host names a cluster of another namespace.
    #[error(
        "{url:?} names namespace {other:?}: a backup reads only clusters of its own namespace ({namespace:?})"
    )]
    OtherNamespace {
        /// The URL, shortened.
        url: String,
        /// The namespace the URL names.
        other: String,
        /// The namespace of the backup.
        namespace: String,
    },
    /// Two URLs name different clusters.
    #[error(
        "the endpoints name two clusters, {first:?} and {second:?}: a backup reads one cluster"
    )]
    TwoClusters {
        /// The cluster of the first URL.
        first: String,
        /// The other cluster.
        second: String,
    },
}

/// Longest part of a URL (or of a name taken from one) quoted in an error.
const QUOTE_MAX: usize = 96;

/// At most [`QUOTE_MAX`] characters of `url`, then `...`.
fn shorten(url: &str) -> String {
    match url.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{}...", &url[..cut]),
        None => url.to_string(),
    }
}

/// The host of an `http://` or `https://` URL, lowercased, without port, path or userinfo.
fn host_of(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.contains('@') {
        return None;
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        // An IPv6 literal: returned with its brackets so the caller sees an IP.
        let end = v6.find(']')?;
        return Some(format!("[{}]", &v6[..end]));
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => {
                if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5 {
                    return None;
                }
                host
            }
            None => authority,
        }
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// The cluster one client URL names, in `namespace`.
pub fn cluster_of_endpoint(url: &str, namespace: &str) -> Result<String, EndpointError> {
    let short = || shorten(url);
    let host = host_of(url.trim()).ok_or_else(|| EndpointError::NotUrl { url: short() })?;
    if host.starts_with('[') || host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(EndpointError::IpAddress { url: short() });
    }
    let not_cluster = || EndpointError::NotCluster {
        url: short(),
        namespace: shorten(namespace),
    };
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let check_namespace = |ns: &str| {
        if ns == namespace {
            Ok(())
        } else {
            Err(EndpointError::OtherNamespace {
                url: short(),
                other: shorten(ns),
                namespace: shorten(namespace),
            })
        }
    };
    // The client Service: NAME-client[.NS[.svc[.DOMAIN...]]].
    if let Some(cluster) = labels[0].strip_suffix(names::CLIENT_SERVICE_SUFFIX)
        && !cluster.is_empty()
    {
        if let Some(ns) = labels.get(1) {
            check_namespace(ns)?;
        }
        if let Some(svc) = labels.get(2)
            && *svc != "svc"
        {
            return Err(not_cluster());
        }
        return Ok(cluster.to_string());
    }
    // A member: NAME-N.NAME.NS[.svc[.DOMAIN...]].
    if labels.len() >= 3 {
        let (member, cluster, ns) = (labels[0], labels[1], labels[2]);
        if names::member_index(cluster, member).is_some()
            && labels.get(3).is_none_or(|svc| *svc == "svc")
        {
            check_namespace(ns)?;
            return Ok(cluster.to_string());
        }
    }
    Err(not_cluster())
}

/// The one cluster every URL names, in `namespace`.
pub fn cluster_of_endpoints(urls: &[String], namespace: &str) -> Result<String, EndpointError> {
    let mut found: Option<String> = None;
    for url in urls {
        let cluster = cluster_of_endpoint(url, namespace)?;
        match &found {
            None => found = Some(cluster),
            Some(first) if *first != cluster => {
                return Err(EndpointError::TwoClusters {
                    first: shorten(first),
                    second: shorten(&cluster),
                });
            }
            Some(_) => {}
        }
    }
    found.ok_or(EndpointError::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_services_and_member_addresses_name_their_cluster() {
        let ok = [
            ("http://example-client:2379", "example"),
            ("https://example-client:2379", "example"),
            ("http://example-client", "example"),
            ("http://example-client.prod:2379", "example"),
            ("http://example-client.prod.svc:2379", "example"),
            (
                "http://example-client.prod.svc.cluster.local:2379/",
                "example",
            ),
            ("http://Example-Client.PROD.svc:2379", "example"),
            ("http://my-etcd-client:2379", "my-etcd"),
            ("https://example-0.example.prod.svc:2379", "example"),
            (
                "https://example-12.example.prod.svc.cluster.local:2379",
                "example",
            ),
            ("http://example-1.example.prod:2379", "example"),
        ];
        for (url, cluster) in ok {
            assert_eq!(
                cluster_of_endpoint(url, "prod"),
                Ok(cluster.into()),
                "{url}"
            );
        }
    }

    fn kind(e: &EndpointError) -> &'static str {
        match e {
            EndpointError::Empty => "Empty",
            EndpointError::NotUrl { .. } => "NotUrl",
            EndpointError::IpAddress { .. } => "IpAddress",
            EndpointError::NotCluster { .. } => "NotCluster",
            EndpointError::OtherNamespace { .. } => "OtherNamespace",
            EndpointError::TwoClusters { .. } => "TwoClusters",
        }
    }

    #[test]
    fn other_urls_are_refused_with_the_reason() {
        let cases = [
            ("example-client:2379", "NotUrl"),
            ("ftp://example-client", "NotUrl"),
            ("http://:2379", "NotUrl"),
            ("http://u:p@example-client:2379", "NotUrl"),
            ("http://example-client:port", "NotUrl"),
            ("http://10.0.0.5:2379", "IpAddress"),
            ("http://[fd00::1]:2379", "IpAddress"),
            ("http://example-client.other:2379", "OtherNamespace"),
            ("http://etcd.example.com:2379", "NotCluster"),
            ("http://example-client.prod.pod:2379", "NotCluster"),
        ];
        for (url, want) in cases {
            let err = cluster_of_endpoint(url, "prod").expect_err(url);
            assert_eq!(kind(&err), want, "{url}: {err}");
        }
        let long = format!("http://{}:2379", "a".repeat(5000));
        let msg = cluster_of_endpoint(&long, "prod")
            .expect_err("long")
            .to_string();
        assert!(msg.len() < 400, "{msg}");
        // The names taken from a URL are shortened too.
        let label = "b".repeat(5000);
        for (urls, namespace) in [
            (vec![format!("http://a-client.{label}:2379")], "prod"),
            (vec![format!("http://a-client.prod:2379")], label.as_str()),
            (vec![format!("http://x.y.z:2379")], label.as_str()),
            (
                vec![
                    "http://a-client:2379".to_string(),
                    format!("http://{label}-client:2379"),
                ],
                "prod",
            ),
        ] {
            let msg = cluster_of_endpoints(&urls, namespace)
                .expect_err("long")
                .to_string();
            assert!(msg.len() < 600, "{} bytes", msg.len());
        }
    }

    #[test]
    fn every_endpoint_must_name_the_same_cluster() {
        let one = |urls: &[&str]| {
            let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
            cluster_of_endpoints(&urls, "prod")
        };
        assert_eq!(
            one(&["http://a-client:2379", "http://a-0.a.prod.svc:2379"]),
            Ok("a".into())
        );
        assert!(matches!(
            one(&["http://a-client:2379", "http://b-client:2379"]),
            Err(EndpointError::TwoClusters { .. })
        ));
        assert_eq!(one(&[]), Err(EndpointError::Empty));
    }
}
