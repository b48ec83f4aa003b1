//! Rules on the name, size, version and repository of a cluster.

use super::syntax::{is_dns1035_label, quoted};
use super::{Defaults, Report};
use crate::EtcdCluster;
use crate::names::MAX_CLUSTER_NAME_LEN;
use crate::version::{EtcdVersion, LINES, OLDEST_SUPPORTED, supported_range};

/// Smallest cluster.
pub const MIN_SIZE: i32 = 1;
/// Largest cluster: beyond 7 members every write waits on more peers for no more safety.
pub const MAX_SIZE: i32 = 7;

/// `metadata.name` must yield valid names for the Services and member pods derived from it.
pub(crate) fn check_name(cluster: &EtcdCluster, report: &mut Report) {
    let Some(name) = cluster.metadata.name.as_deref() else {
        // generateName: the API server makes a name we cannot check yet.
        return;
    };
    check_cluster_name(name, "metadata.name", report);
}

/// A cluster's name, at `field` (`metadata.name`, or an EtcdRestore's `spec.etcdCluster.name`):
/// a DNS-1035 label of at most [`MAX_CLUSTER_NAME_LEN`] characters.
pub(crate) fn check_cluster_name(name: &str, field: &str, report: &mut Report) {
    if name.len() > MAX_CLUSTER_NAME_LEN {
        report.refuse(
            "name-length",
            field,
            format!(
                "must be at most {MAX_CLUSTER_NAME_LEN} characters so that the Service NAME-client and the member pods NAME-N are valid names, got {} characters",
                name.len()
            ),
        );
    } else if !is_dns1035_label(name) {
        report.refuse(
            "name-syntax",
            field,
            format!(
                "must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter) because Services are named after it, got {}",
                quoted(name)
            ),
        );
    }
}

/// `spec.size`: 1 to 7; warnings for a single member and for even sizes.
pub(crate) fn check_size(cluster: &EtcdCluster, report: &mut Report) {
    let Some(size) = cluster.spec.size else {
        return;
    };
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        report.refuse(
            "size-range",
            "spec.size",
            format!("must be between {MIN_SIZE} and {MAX_SIZE}, got {size}"),
        );
    } else if size == 1 {
        report.warn(
            "spec.size",
            "1 member has no fault tolerance: losing it loses the cluster",
        );
    } else if size % 2 == 0 {
        report.warn(
            "spec.size",
            format_args!(
                "{size} members tolerate no more failures than {} (a majority of {size} is {}); an odd size is recommended",
                size - 1,
                size / 2 + 1
            ),
        );
    }
}

/// `spec.version`: a supported release; end-of-life lines get a warning.
pub(crate) fn check_version(cluster: &EtcdCluster, defaults: &Defaults, report: &mut Report) {
    let raw = defaults.version_of(cluster);
    let version: EtcdVersion = match raw.parse() {
        Ok(v) => v,
        Err(_) => {
            // Not ParseVersionError's text: it holds the whole value.
            report.refuse(
                "version-syntax",
                "spec.version",
                format!(
                    "must be a released etcd version MAJOR.MINOR.PATCH such as {}, got {}",
                    crate::version::DEFAULT_VERSION,
                    quoted(raw)
                ),
            );
            return;
        }
    };
    match version.capabilities() {
        None => {
            let why = if version < OLDEST_SUPPORTED {
                "is older than the operator supports"
            } else {
                "is a line the operator does not know"
            };
            report.refuse(
                "version-unsupported",
                "spec.version",
                format!(
                    "{version} {why}; supported versions are {}",
                    supported_range()
                ),
            );
        }
        Some(line) if line.end_of_life => {
            let newest = LINES
                .iter()
                .rev()
                .find(|l| !l.end_of_life)
                .map(|l| format!("{}.{}", l.major, l.minor))
                .unwrap_or_default();
            report.warn(
                "spec.version",
                format_args!(
                    "etcd {} is end of life and gets no fixes; upgrade one minor line at a time towards {newest}",
                    version.line()
                ),
            );
        }
        Some(_) => {}
    }
    if let Some(fixed) = crate::version::security_fix(&version) {
        report.warn(
            "spec.version",
            format_args!(
                "etcd {version} has known security vulnerabilities that {fixed} fixes (etcd's security advisories); use {fixed} or a later {} patch",
                version.line()
            ),
        );
    }
}

/// `spec.repository`: an image repository without a tag or digest.
pub(crate) fn check_repository(cluster: &EtcdCluster, report: &mut Report) {
    let Some(repo) = cluster.spec.repository.as_deref() else {
        return;
    };
    // An image name is at most 255 characters: anything longer is refused before it is parsed.
    if repo.len() > super::image_ref::NAME_TOTAL_LENGTH_MAX {
        report.refuse(
            "repository-syntax",
            "spec.repository",
            format!(
                "must be an image repository of at most {} characters, got {}",
                super::image_ref::NAME_TOTAL_LENGTH_MAX,
                quoted(repo)
            ),
        );
        return;
    }
    let last = repo.rsplit('/').next().unwrap_or(repo);
    if repo.contains('@') || last.contains(':') {
        report.refuse(
            "repository-tag",
            "spec.repository",
            format!(
                "must be an image repository without a tag or digest (the tag comes from spec.version), got {}",
                quoted(repo)
            ),
        );
    } else if let Err(why) = super::image_ref::parse_repository(repo) {
        report.refuse(
            "repository-syntax",
            "spec.repository",
            format!(
                "must be an image repository such as quay.io/coreos/etcd, got {}: {why}",
                quoted(repo)
            ),
        );
    }
}

/// `spec.recovery.policy`: `Manual` (also when absent) or `Automatic`.
pub(crate) fn check_recovery(cluster: &EtcdCluster, report: &mut Report) {
    let Some(recovery) = &cluster.spec.recovery else {
        return;
    };
    use crate::types::recovery_policy::{AUTOMATIC, MANUAL};
    if !["", MANUAL, AUTOMATIC].contains(&recovery.policy.as_str()) {
        report.refuse(
            "recovery-policy",
            "spec.recovery.policy",
            format!(
                "must be {MANUAL} (recover once the cluster is annotated {}={}) or {AUTOMATIC} (recover at once), got {}",
                crate::names::ANNOTATION_RECOVER,
                crate::names::RECOVER_NOW,
                quoted(&recovery.policy)
            ),
        );
    }
}

/// The most client selectors a cluster may list.
const MAX_CLIENT_SELECTORS: usize = 32;

/// `spec.network`: a known policy, and client selectors that a NetworkPolicy accepts.
pub(crate) fn check_network(cluster: &EtcdCluster, report: &mut Report) {
    use crate::types::network_policy::{DEFAULT, NONE};
    let Some(network) = &cluster.spec.network else {
        return;
    };
    let policy = network.policy.as_deref().unwrap_or(DEFAULT);
    if ![DEFAULT, NONE].contains(&policy) {
        report.refuse(
            "network-policy",
            "spec.network.policy",
            format!(
                "must be {DEFAULT} (the operator keeps the cluster's NetworkPolicy) or {NONE}, got {}",
                quoted(policy)
            ),
        );
    }
    if policy == NONE && !network.client_selectors.is_empty() {
        report.refuse(
            "network-policy",
            "spec.network.clientSelectors",
            format!("has no effect with policy {NONE}: remove it, or set policy {DEFAULT}"),
        );
    }
    if network.client_selectors.len() > MAX_CLIENT_SELECTORS {
        report.refuse(
            "network-selectors",
            "spec.network.clientSelectors",
            format!(
                "lists {} peers; at most {MAX_CLIENT_SELECTORS}",
                network.client_selectors.len()
            ),
        );
    }
    for (i, peer) in network.client_selectors.iter().enumerate() {
        let field = format!("spec.network.clientSelectors[{i}]");
        let selectors = peer.pod_selector.is_some() || peer.namespace_selector.is_some();
        match &peer.ip_block {
            Some(_) if selectors => report.refuse(
                "network-selectors",
                field,
                "sets ipBlock beside a selector: a NetworkPolicy peer is either ipBlock or podSelector/namespaceSelector",
            ),
            Some(block) => {
                if !is_cidr(&block.cidr) {
                    report.refuse(
                        "network-selectors",
                        format!("{field}.ipBlock.cidr"),
                        format!("{} is not a CIDR such as 10.0.0.0/8", quoted(&block.cidr)),
                    );
                }
                for (j, except) in block.except.iter().flatten().enumerate() {
                    if !is_cidr(except) {
                        report.refuse(
                            "network-selectors",
                            format!("{field}.ipBlock.except[{j}]"),
                            format!("{} is not a CIDR", quoted(except)),
                        );
                    }
                }
            }
            None if !selectors => report.refuse(
                "network-selectors",
                field,
                "names no peer: set podSelector, namespaceSelector or ipBlock (to admit any pod, leave clientSelectors unset)",
            ),
            None => {}
        }
    }
}

/// `ADDRESS/PREFIX` with a prefix that fits the address.
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// The recovery approval annotation: its one value is `now`.
pub(crate) fn check_recover_annotation(cluster: &EtcdCluster, report: &mut Report) {
    use crate::names::{ANNOTATION_RECOVER, RECOVER_NOW};
    let Some(value) = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RECOVER))
    else {
        return;
    };
    if value != RECOVER_NOW {
        report.refuse(
            "recover-annotation",
            format!("metadata.annotations[{ANNOTATION_RECOVER}]"),
            format!(
                "approves a recovery from permanent quorum loss and takes one value, {RECOVER_NOW}; got {}",
                quoted(value)
            ),
        );
    }
}
