//! Rules on updates: the upgrade path of `spec.version` and the fields a running cluster
//! cannot change.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

use super::quantity::Quantity;
use super::syntax::{quoted, shown};
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
                "cannot change on a running cluster (from {} to {}): every member's peer URL is registered under it",
                shown(from),
                shown(to)
            ),
        );
    }
}

fn version(c: &EtcdCluster, defaults: &Defaults) -> Option<EtcdVersion> {
    defaults.version_of(c).parse().ok()
}

/// The lowest version the members run, as the status records it: `status.currentVersion` is
/// the lowest version a healthy member reported (during an upgrade, the version being left).
/// Read leniently: missing or unreadable (CoreOS writes "") is unknown, never a refusal.
fn running_version(c: &EtcdCluster) -> Option<EtcdVersion> {
    c.status
        .as_ref()
        .and_then(|s| s.current_version.as_deref())
        .and_then(|v| v.parse().ok())
}

/// The move of `spec.version` from the stored spec, and from what the members run. The running
/// version is checked whatever the stored spec says: also when its version is missing or no
/// version (an object stored before the version rules, or written around the webhook).
fn check_upgrade_path(
    new: &EtcdCluster,
    old: &EtcdCluster,
    defaults: &Defaults,
    report: &mut Report,
) {
    let Some(to) = version(new, defaults) else {
        return; // a bad new version is refused by the create rules.
    };
    // Only a version the stored spec holds: a missing one is not the operator's default.
    let from: Option<EtcdVersion> = old.spec.version.as_deref().and_then(|v| v.parse().ok());
    let running = running_version(old);
    if let (Some(from), Some(running)) = (from, running)
        && running.major == from.major
        && running.minor < from.minor
        && to.major == running.major
        && to.minor == running.minor
    {
        check_rollback(from, running, to, report);
        return;
    }
    if let Some(from) = from
        && from != to
        && let Err(e) = check_upgrade(&from, &to)
    {
        report.refuse(e.rule, "spec.version", e.message);
        return;
    }
    // The members may run an older version than the old spec asks for (an upgrade in
    // progress, or a stored version that is none): the path must hold from what they run too.
    let Some(running) = running else {
        return;
    };
    if Some(running) == from || running == to {
        return;
    }
    let Err(e) = check_upgrade(&running, &to) else {
        return;
    };
    match from {
        Some(from) => {
            let message = if running.minor != from.minor && e.rule == "version-skip" {
                format!(
                    "cannot move to {to} while the members still run {running} (an upgrade to {from} is in progress); wait until status.currentVersion is {from}"
                )
            } else {
                e.message
            };
            report.refuse("version-upgrade-in-progress", "spec.version", message);
        }
        None => {
            let stored = match old.spec.version.as_deref() {
                None => "is not set".to_string(),
                Some(v) => format!("{} is no version", quoted(v)),
            };
            report.refuse(
                e.rule,
                "spec.version",
                format!(
                    "{} (the members run {running} as status.currentVersion says; the stored spec.version {stored})",
                    e.message
                ),
            );
        }
    }
}

/// Back to the line the members still run, from an upgrade to the next line that has not
/// finished (`status.currentVersion` is still on the old line). etcd runs a mixed cluster at
/// its oldest member's version, and every member may return to that line's binary until all
/// run the new one. Members the controller already moved run next to `to` meanwhile, so `to`
/// must be a version that can run next to `from`; when the members could never have moved
/// (the controller refuses a path etcd does not support), any patch of the line is fine.
fn check_rollback(from: EtcdVersion, running: EtcdVersion, to: EtcdVersion, report: &mut Report) {
    let may_have_started = check_upgrade(&running, &from).is_ok();
    if may_have_started && let Err(e) = check_upgrade(&to, &from) {
        report.refuse(
            "version-rollback",
            "spec.version",
            format!(
                "cannot roll the unfinished upgrade to {from} back to {to}: members that already run {from} would run next to {to} ({})",
                e.message
            ),
        );
        return;
    }
    report.warn(
        "spec.version",
        format_args!(
            "rolls back the unfinished upgrade to {from}: status.currentVersion is still {running}, so the cluster runs at {} and members already on {from} return to {to}",
            running.line()
        ),
    );
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

/// A claim's storage class in words: unset is the cluster's default class, `""` is none.
fn class_words(class: Option<&str>) -> String {
    match class {
        None => "unset (the default StorageClass)".to_string(),
        Some("") => "\"\" (no StorageClass)".to_string(),
        Some(class) => quoted(class),
    }
}

/// A claim's volumeMode, with Kubernetes' default: unset is `Filesystem`.
fn volume_mode(claim: &PersistentVolumeClaimSpec) -> &str {
    claim
        .volume_mode
        .as_deref()
        .filter(|m| !m.is_empty())
        .unwrap_or("Filesystem")
}

/// A claim's access modes as a set, with the controller's default: none is `ReadWriteOnce`
/// (what the claim builder fills in).
fn access_modes(claim: &PersistentVolumeClaimSpec) -> BTreeSet<&str> {
    let modes: BTreeSet<&str> = claim
        .access_modes
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if modes.is_empty() {
        BTreeSet::from(["ReadWriteOnce"])
    } else {
        modes
    }
}

/// Access modes in words: `[ReadWriteOnce, ReadOnlyMany]`, each clipped, at most 8 shown.
fn modes_words(modes: &BTreeSet<&str>) -> String {
    let mut words: Vec<String> = modes.iter().take(8).map(|m| shown(m)).collect();
    if modes.len() > 8 {
        words.push(format!("and {} more", modes.len() - 8));
    }
    format!("[{}]", words.join(", "))
}

/// A running cluster keeps its kind of storage (a claim or an emptyDir), its claim template
/// (class, volumeMode, accessModes, no smaller size) or its emptyDir's medium.
fn check_storage_immutable(new: &EtcdCluster, old: &EtcdCluster, report: &mut Report) {
    let new_pod = new.spec.pod.as_ref();
    let old_pod = old.spec.pod.as_ref();
    let new_claim = new_pod.and_then(|p| p.persistent_volume_claim_spec.as_ref());
    let old_claim = old_pod.and_then(|p| p.persistent_volume_claim_spec.as_ref());
    match (old_claim, new_claim) {
        (None, Some(_)) | (Some(_), None) => {
            refuse_storage_kind_change(old_claim.is_some(), report);
        }
        (Some(o), Some(n)) => {
            check_claim_template_kept(o, n, report);
            check_claim_not_shrunk(old_pod, new_pod, report);
        }
        (None, None) => check_medium_kept(old_pod, new_pod, report),
    }
}

/// A running cluster moved from a claim to an emptyDir (`had_claim`), or back.
fn refuse_storage_kind_change(had_claim: bool, report: &mut Report) {
    let (from, to) = if had_claim {
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

/// The claim template's class, volumeMode and accessModes are the existing members' claims'
/// (`o`, the old template; `n`, the new).
fn check_claim_template_kept(
    o: &PersistentVolumeClaimSpec,
    n: &PersistentVolumeClaimSpec,
    report: &mut Report,
) {
    if o.storage_class_name != n.storage_class_name {
        report.refuse(
            "immutable-storage-class",
            "spec.pod.persistentVolumeClaimSpec.storageClassName",
            format!(
                "cannot change from {} to {}: the existing members' volumes stay in their class",
                class_words(o.storage_class_name.as_deref()),
                class_words(n.storage_class_name.as_deref())
            ),
        );
    }
    let (o_mode, n_mode) = (volume_mode(o), volume_mode(n));
    if o_mode != n_mode {
        report.refuse(
            "immutable-volume-mode",
            "spec.pod.persistentVolumeClaimSpec.volumeMode",
            format!(
                "cannot change from {} to {} on a running cluster: a claim's volumeMode is immutable, and the existing members' claims keep theirs",
                quoted(o_mode),
                quoted(n_mode)
            ),
        );
    }
    let (o_modes, n_modes) = (access_modes(o), access_modes(n));
    if o_modes != n_modes {
        report.refuse(
            "immutable-access-modes",
            "spec.pod.persistentVolumeClaimSpec.accessModes",
            format!(
                "cannot change from {} to {} on a running cluster: a bound claim's accessModes are immutable, and the existing members' claims keep theirs",
                modes_words(&o_modes),
                modes_words(&n_modes)
            ),
        );
    }
}

/// The claims' size does not shrink (when both sizes are readable).
fn check_claim_not_shrunk(
    old_pod: Option<&PodPolicy>,
    new_pod: Option<&PodPolicy>,
    report: &mut Report,
) {
    if let (Some((o_text, o_bytes)), Some((n_text, n_bytes))) =
        (claim_size(old_pod), claim_size(new_pod))
        && n_bytes < o_bytes
    {
        report.refuse(
            "immutable-claim-shrink",
            "spec.pod.persistentVolumeClaimSpec.resources.requests.storage",
            format!(
                "cannot shrink from {} to {}: Kubernetes volumes cannot shrink",
                shown(&o_text),
                shown(&n_text)
            ),
        );
    }
}

/// The emptyDir's medium (unset is `""`, the node's disk) stays the same.
fn check_medium_kept(
    old_pod: Option<&PodPolicy>,
    new_pod: Option<&PodPolicy>,
    report: &mut Report,
) {
    let medium =
        |p: Option<&PodPolicy>| p.and_then(|p| p.storage_medium.clone()).unwrap_or_default();
    if medium(old_pod) != medium(new_pod) {
        report.refuse(
            "immutable-storage-medium",
            "spec.pod.storageMedium",
            format!(
                "cannot change from {} to {} on a running cluster: the members' data volumes cannot move",
                quoted(&medium(old_pod)),
                quoted(&medium(new_pod))
            ),
        );
    }
}

fn tls_in_use(c: &EtcdCluster) -> Option<crate::types::TlsInUse> {
    let name = c.metadata.name.as_deref().unwrap_or_default();
    c.spec.tls.as_ref().and_then(|t| t.in_use(name))
}

fn describe_source(u: &crate::types::TlsInUse) -> String {
    match &u.issuer {
        Some(issuer) => format!("{} ({issuer})", u.source),
        None => u.source.clone(),
    }
}

fn check_tls_mode(new: &EtcdCluster, old: &EtcdCluster, report: &mut Report) {
    let (old_use, new_use) = (tls_in_use(old), tls_in_use(new));
    let modes =
        |u: &Option<crate::types::TlsInUse>| u.as_ref().map_or((false, false), |u| u.modes());
    let (old_peer, old_client) = modes(&old_use);
    let (new_peer, new_client) = modes(&new_use);
    // Plain to TLS is a rolling switch (members replaced in two passes); back is refused.
    if old_peer && !new_peer {
        report.refuse(
            "immutable-tls-mode",
            "spec.TLS.static.member.peerSecret",
            "peer traffic cannot switch from TLS to plain HTTP on a running cluster: members would send their peers' traffic unencrypted (plain HTTP to TLS is supported)".to_string(),
        );
    }
    if old_client && !new_client {
        report.refuse(
            "immutable-tls-mode",
            "spec.TLS.static.member.serverSecret",
            "client traffic cannot switch from TLS to plain HTTP on a running cluster: clients trusting the members' certificates would lose the cluster (plain HTTP to TLS is supported)".to_string(),
        );
    }
    // A new source of certificates (or other Secrets, or another cert-manager issuer) is a
    // rolling switch through a trust bundle of both CAs: one change at a time, from what the
    // members use.
    let (Some(o), Some(n)) = (&old_use, &new_use) else {
        return;
    };
    if o == n {
        return;
    }
    if o.modes() != n.modes() {
        // More traffic encrypted with the same certificates is a switch from plain HTTP.
        let same_source = o.source == n.source
            && o.issuer == n.issuer
            && (o.peer_secret.is_none() || o.peer_secret == n.peer_secret)
            && (o.server_secret.is_none() || o.server_secret == n.server_secret);
        if same_source {
            return;
        }
        report.refuse(
            "tls-switch-one-change",
            "spec.TLS",
            format!(
                "cannot move from {} to {} certificates and change which traffic uses TLS in one change: first encrypt the same traffic with {} (plain HTTP to TLS), then move",
                describe_source(o),
                describe_source(n),
                describe_source(o)
            ),
        );
        return;
    }
    let recorded = old.status.as_ref().and_then(|s| s.tls.as_ref());
    if recorded != Some(o) {
        report.refuse(
            "tls-switch-in-progress",
            "spec.TLS",
            match recorded {
                Some(r) => format!(
                    "the members still move from {} to {} certificates (status.tls): wait until that switch finishes, then move to {}",
                    describe_source(r),
                    describe_source(o),
                    describe_source(n)
                ),
                None => format!(
                    "the operator has not recorded yet which certificate Secrets the members use (status.tls): retry once it has reconciled the cluster, then move to {}",
                    describe_source(n)
                ),
            },
        );
    }
}
