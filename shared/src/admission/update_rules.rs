//! Rules on updates: the upgrade path of `spec.version` and the fields a running cluster
//! cannot change.

use super::quantity::Quantity;
use super::{Defaults, Report};
use crate::EtcdCluster;
use crate::names;
use crate::types::PodPolicy;
use crate::version::{EtcdVersion, check_upgrade};

/// Every update rule.
pub(crate) fn check(
    new: &EtcdCluster,
    old: &EtcdCluster,
    defaults: &Defaults,
    report: &mut Report,
) {
    check_upgrade_path(new, old, defaults, report);
    check_storage_immutable(new, old, report);
    check_tls_mode(new, old, report);
    check_cluster_domain(new, old, report);
}

/// The domain the pods' DNS resolves names in when none is named.
const KUBERNETES_DEFAULT_DOMAIN: &str = "cluster.local";

/// The domain a `spec.pod.ClusterDomain` stands for: unset, `""` (what CoreOS' Go client sends
/// when none is set), `cluster.local` and `.cluster.local` are all the cluster's default
/// domain, under which the members' `.svc` names resolve.
fn domain_identity(cluster: &EtcdCluster) -> &str {
    let value = cluster
        .spec
        .pod
        .as_ref()
        .and_then(|p| p.cluster_domain.as_deref());
    names::cluster_domain(value).unwrap_or(KUBERNETES_DEFAULT_DOMAIN)
}

fn check_cluster_domain(new: &EtcdCluster, old: &EtcdCluster, report: &mut Report) {
    let (from, to) = (domain_identity(old), domain_identity(new));
    if from != to {
        report.refuse(
            "immutable-cluster-domain",
            "spec.pod.ClusterDomain",
            format!(
                "cannot change on a running cluster (from {from} to {to}): every member's peer URL is registered under it"
            ),
        );
    }
}

fn version(c: &EtcdCluster, defaults: &Defaults) -> Option<EtcdVersion> {
    defaults.version_of(c).parse().ok()
}

fn check_upgrade_path(
    new: &EtcdCluster,
    old: &EtcdCluster,
    defaults: &Defaults,
    report: &mut Report,
) {
    let (Some(to), Some(from)) = (version(new, defaults), version(old, defaults)) else {
        return; // a bad new version is refused by the create rules; a bad old one has no path.
    };
    if to == from {
        return;
    }
    if let Err(e) = check_upgrade(&from, &to) {
        report.refuse(e.rule, "spec.version", e.message);
        return;
    }
    // The members may still run an older version than the old spec asks for (an upgrade in
    // progress): the path must hold from what they run too. The status is read for nothing
    // else, and leniently: a missing or unreadable currentVersion (CoreOS writes "") only skips
    // this check, never the spec's own path above, and never refuses by itself.
    let running: Option<EtcdVersion> = old
        .status
        .as_ref()
        .and_then(|s| s.current_version.as_deref())
        .and_then(|v| v.parse().ok());
    if let Some(running) = running
        && running != from
        && let Err(e) = check_upgrade(&running, &to)
    {
        let message = if running.minor != from.minor && e.rule == "version-skip" {
            format!(
                "cannot move to {to} while the members still run {running} (an upgrade to {from} is in progress); wait until status.currentVersion is {from}"
            )
        } else {
            e.message
        };
        report.refuse("version-upgrade-in-progress", "spec.version", message);
    }
}

/// The claim size the spec asks for, exactly (no float rounding), with its text.
fn claim_size(pod: Option<&PodPolicy>) -> Option<(String, Quantity)> {
    let q = pod?
        .persistent_volume_claim_spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    Some((q.0.clone(), Quantity::parse(&q.0).ok()?))
}

fn check_storage_immutable(new: &EtcdCluster, old: &EtcdCluster, report: &mut Report) {
    let new_pod = new.spec.pod.as_ref();
    let old_pod = old.spec.pod.as_ref();
    let new_claim = new_pod.and_then(|p| p.persistent_volume_claim_spec.as_ref());
    let old_claim = old_pod.and_then(|p| p.persistent_volume_claim_spec.as_ref());
    match (old_claim, new_claim) {
        (None, Some(_)) | (Some(_), None) => {
            let (from, to) = if old_claim.is_some() {
                ("a persistent claim", "an emptyDir")
            } else {
                ("an emptyDir", "a persistent claim")
            };
            report.refuse(
                "immutable-storage-kind",
                "spec.pod.persistentVolumeClaimSpec",
                format!("cannot change from {from} to {to} on a running cluster: members would lose or strand their data; create a new cluster instead"),
            );
        }
        (Some(o), Some(n)) => {
            if o.storage_class_name != n.storage_class_name {
                report.refuse(
                    "immutable-storage-class",
                    "spec.pod.persistentVolumeClaimSpec.storageClassName",
                    format!(
                        "cannot change from {:?} to {:?}: the existing members' volumes stay in their class",
                        o.storage_class_name.as_deref().unwrap_or(""),
                        n.storage_class_name.as_deref().unwrap_or("")
                    ),
                );
            }
            if let (Some((o_text, o_bytes)), Some((n_text, n_bytes))) =
                (claim_size(old_pod), claim_size(new_pod))
                && n_bytes < o_bytes
            {
                report.refuse(
                    "immutable-claim-shrink",
                    "spec.pod.persistentVolumeClaimSpec.resources.requests.storage",
                    format!(
                        "cannot shrink from {o_text} to {n_text}: Kubernetes volumes cannot shrink"
                    ),
                );
            }
        }
        (None, None) => {
            let medium = |p: Option<&PodPolicy>| {
                p.and_then(|p| p.storage_medium.clone()).unwrap_or_default()
            };
            if medium(old_pod) != medium(new_pod) {
                report.refuse(
                    "immutable-storage-medium",
                    "spec.pod.storageMedium",
                    format!(
                        "cannot change from {:?} to {:?} on a running cluster: the members' data volumes cannot move",
                        medium(old_pod),
                        medium(new_pod)
                    ),
                );
            }
        }
    }
}

fn check_tls_mode(new: &EtcdCluster, old: &EtcdCluster, report: &mut Report) {
    let modes = |c: &EtcdCluster| {
        let st = c.spec.tls.as_ref().and_then(|t| t.static_tls.as_ref());
        let member = st.and_then(|s| s.member.as_ref());
        (
            member.and_then(|m| m.peer_secret.as_ref()).is_some(),
            member.and_then(|m| m.server_secret.as_ref()).is_some(),
        )
    };
    let (old_peer, old_client) = modes(old);
    let (new_peer, new_client) = modes(new);
    let word = |on: bool| if on { "TLS" } else { "plain HTTP" };
    if old_peer != new_peer {
        report.refuse(
            "immutable-tls-mode",
            "spec.TLS.static.member.peerSecret",
            format!(
                "peer traffic cannot switch from {} to {} on a running cluster: members registered their peer URLs with the old scheme",
                word(old_peer),
                word(new_peer)
            ),
        );
    }
    if old_client != new_client {
        report.refuse(
            "immutable-tls-mode",
            "spec.TLS.static.member.serverSecret",
            format!(
                "client traffic cannot switch from {} to {} on a running cluster: clients and the operator would lose the cluster",
                word(old_client),
                word(new_client)
            ),
        );
    }
}
