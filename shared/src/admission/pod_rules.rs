//! Rules on `spec.pod`: labels, environment, resources, storage and scheduling.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};

use super::quantity::Quantity;
use super::syntax::{is_dns1123_subdomain, is_env_var_name, is_label_value, is_qualified_name};
use super::syntax::{quoted, shown};
use super::{Defaults, Report};
use crate::EtcdCluster;
use crate::names::is_reserved_label;
use crate::types::PodPolicy;
use crate::version::EtcdVersion;

/// Every rule on `spec.pod`: its labels, annotation keys and node selector, the environment,
/// the pod spec's own rules, resources and storage, then scheduling and the ignored fields.
pub(crate) fn check(cluster: &EtcdCluster, defaults: &Defaults, report: &mut Report) {
    let Some(pod) = cluster.spec.pod.as_ref() else {
        warn_ephemeral(report);
        return;
    };
    check_labels(&pod.labels, report);
    check_annotation_keys(&pod.annotations, report);
    check_node_selector(&pod.node_selector, report);
    check_env(cluster, defaults, report);
    super::pod_spec_rules::check(pod, report);
    if let Some(resources) = &pod.resources {
        check_resources(resources, report);
    }
    check_storage(cluster, report);
    check_anti_affinity(pod, report);
    warn_ignored_fields(pod, report);
    check_cluster_domain(pod.cluster_domain.as_deref(), report);
    check_image_pull_secrets(&pod.image_pull_secrets, report);
    check_priority_class(pod.priority_class_name.as_deref(), report);
}

/// Each label is the user's (the operator's selector labels are reserved), with a valid key
/// and value.
fn check_labels(labels: &BTreeMap<String, String>, report: &mut Report) {
    for (key, value) in labels {
        let field = format!("spec.pod.labels[{key}]");
        if is_reserved_label(key) {
            report.refuse(
                "reserved-label",
                field,
                "is reserved for the operator (app, etcd_*, app.kubernetes.io/* and etcd.database.coreos.com/* select the members)",
            );
        } else if !is_qualified_name(key) {
            report.refuse(
                "label-syntax",
                field,
                "is not a valid label key ([prefix/]name, name up to 63 characters)",
            );
        } else if !is_label_value(value) {
            report.refuse(
                "label-syntax",
                field,
                format!(
                    "value {} is not a valid label value (up to 63 alphanumerics, '-', '_' or '.')",
                    quoted(value)
                ),
            );
        }
    }
}

/// Each annotation key is a qualified name, lowercased as the API server checks it
/// (`ValidateAnnotations`).
fn check_annotation_keys(annotations: &BTreeMap<String, String>, report: &mut Report) {
    for key in annotations.keys() {
        if !is_qualified_name(&key.to_ascii_lowercase()) {
            report.refuse(
                "annotation-syntax",
                format!("spec.pod.annotations[{key}]"),
                "is not a valid annotation key ([prefix/]name, name up to 63 characters)",
            );
        }
    }
}

/// Each node selector term is a valid label key and value.
fn check_node_selector(node_selector: &BTreeMap<String, String>, report: &mut Report) {
    for (key, value) in node_selector {
        if !is_qualified_name(key) || !is_label_value(value) {
            report.refuse(
                "label-syntax",
                format!("spec.pod.nodeSelector[{key}]"),
                format!(
                    "{}={} is not a valid label selector term",
                    shown(key),
                    shown(value)
                ),
            );
        }
    }
}

/// `antiAffinity` and `affinity.podAntiAffinity` are two ways to say one thing: one of them.
fn check_anti_affinity(pod: &PodPolicy, report: &mut Report) {
    if pod.anti_affinity
        && pod
            .affinity
            .as_ref()
            .is_some_and(|a| a.pod_anti_affinity.is_some())
    {
        report.refuse(
            "anti-affinity-conflict",
            "spec.pod.antiAffinity",
            "cannot be combined with spec.pod.affinity.podAntiAffinity; set one of them",
        );
    }
}

/// CoreOS' fields for its DNS wait container, which this operator has no use for.
fn warn_ignored_fields(pod: &PodPolicy, report: &mut Report) {
    if pod.busybox_image.is_some() {
        report.warn(
            "spec.pod.busyboxImage",
            "is ignored: this operator needs no DNS wait container",
        );
    }
    // CoreOS' Go client leaves it out when 0 (omitempty): only a timeout someone chose is news.
    if pod.dns_timeout_in_second.is_some_and(|t| t != 0) {
        report.warn(
            "spec.pod.DNSTimeoutInSecond",
            "is ignored: this operator's members need no DNS init container to time out",
        );
    }
}

/// A priority class, when named, is a valid PriorityClass name.
fn check_priority_class(class: Option<&str>, report: &mut Report) {
    if let Some(class) = class
        && !is_dns1123_subdomain(class)
    {
        report.refuse(
            "priority-class-syntax",
            "spec.pod.priorityClassName",
            format!("must be a valid PriorityClass name, got {}", quoted(class)),
        );
    }
}

/// The most image pull secrets a member pod may name: a registry or two per image is the
/// need, and the list is copied into every member pod.
pub const MAX_IMAGE_PULL_SECRETS: usize = 16;

/// Each pull secret is a Secret's name, named once; the list is bounded.
fn check_image_pull_secrets(secrets: &[LocalObjectReference], report: &mut Report) {
    if secrets.len() > MAX_IMAGE_PULL_SECRETS {
        report.refuse(
            "image-pull-secrets",
            "spec.pod.imagePullSecrets",
            format!(
                "names {} secrets, at most {MAX_IMAGE_PULL_SECRETS} are allowed",
                secrets.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, secret) in secrets.iter().enumerate() {
        let field = format!("spec.pod.imagePullSecrets[{i}].name");
        if !is_dns1123_subdomain(&secret.name) {
            report.refuse(
                "image-pull-secrets",
                field,
                format!(
                    "must be the name of a Secret in the cluster's namespace (a DNS subdomain), got {}",
                    quoted(&secret.name)
                ),
            );
        } else if !seen.insert(secret.name.as_str()) {
            report.refuse(
                "image-pull-secrets",
                field,
                format!("names {} a second time", quoted(&secret.name)),
            );
        }
    }
}

/// `""` is unset (CoreOS' Go client always sends the field); CoreOS' documented leading dot
/// (`.cluster.local`) is accepted; what remains must be a DNS subdomain.
fn check_cluster_domain(domain: Option<&str>, report: &mut Report) {
    let Some(domain) = domain.filter(|d| !d.is_empty()) else {
        return;
    };
    let bare = domain.strip_prefix('.').unwrap_or(domain);
    if !is_dns1123_subdomain(bare) {
        report.refuse(
            "cluster-domain-syntax",
            "spec.pod.ClusterDomain",
            format!(
                "must be a DNS domain such as cluster.local (a leading dot is accepted, \"\" means none), got {}",
                quoted(domain)
            ),
        );
    }
}

/// `spec.pod.etcdEnv`: valid, distinct names, none of them the operator's
/// ([`crate::member_flags::reserved_env`]: the flags the pod builder passes, the container's
/// own variables and etcd's dangerous switches). User values are quoted clipped.
fn check_env(cluster: &EtcdCluster, defaults: &Defaults, report: &mut Report) {
    use super::syntax::{quoted, shown};
    let Some(pod) = cluster.spec.pod.as_ref() else {
        return;
    };
    let line = defaults
        .version_of(cluster)
        .parse::<EtcdVersion>()
        .ok()
        .and_then(|v| v.capabilities());
    let mut seen = BTreeSet::new();
    for (i, env) in pod.etcd_env.iter().enumerate() {
        let field = format!("spec.pod.etcdEnv[{i}].name");
        let name = env.name.as_str();
        if !is_env_var_name(name) {
            report.refuse(
                "env-syntax",
                field,
                format!("{} is not a valid environment variable name (letters, digits, '_', '-' and '.', not starting with a digit)", quoted(name)),
            );
        } else if let Some(why) = crate::member_flags::reserved_env(name) {
            report.refuse(
                "env-reserved",
                field,
                format!(
                    "{} is set by the operator and cannot be overridden: it {why}",
                    shown(name)
                ),
            );
        } else if !seen.insert(name) {
            report.refuse(
                "env-duplicate",
                field,
                format!("{} is set more than once", shown(name)),
            );
        } else if name == "ETCD_ENABLE_V2"
            && let Some(line) = line
        {
            warn_enable_v2(line, &field, report);
        }
    }
}

/// `ETCD_ENABLE_V2`, as each line's binary treats it (measured with `ETCD_ENABLE_V2=true` on
/// 3.2.13, 3.3.27, 3.4.45, 3.5.35, 3.6.16 and 3.7.3): 3.2 to 3.4 use it ("recognized and used
/// environment variable") and serve v2; 3.5 uses it and logs a deprecation; 3.6 and 3.7 no
/// longer have the flag, log "unrecognized environment variable" and start without the v2 API
/// (`/v2/keys` answers 404). (The flag `--enable-v2` itself makes
/// 3.6 and 3.7 exit with "flag provided but not defined"; the operator never passes it.)
fn warn_enable_v2(line: &crate::version::LineCapabilities, field: &str, report: &mut Report) {
    let next_drops_it = crate::version::LINES
        .iter()
        .any(|l| l.major == line.major && l.minor == line.minor + 1 && !l.v2_flag);
    if !line.v2_flag {
        report.warn(
            field,
            format_args!(
                "ETCD_ENABLE_V2 is ignored by etcd {}.{}: --enable-v2 was removed in 3.6, the member logs \"unrecognized environment variable\" and starts without the v2 API; remove it",
                line.major, line.minor
            ),
        );
    } else if next_drops_it {
        report.warn(
            field,
            format_args!(
                "etcd {}.{} logs \"--enable-v2 is deprecated in 3.5 and will be decommissioned in 3.6.\": 3.6 ignores ETCD_ENABLE_V2; before upgrading, check the v2 store with `etcdutl check v2store`",
                line.major, line.minor
            ),
        );
    }
}

fn check_resources(resources: &ResourceRequirements, report: &mut Report) {
    let requests = resources.requests.clone().unwrap_or_default();
    let limits = resources.limits.clone().unwrap_or_default();
    for (kind, map) in [("requests", &requests), ("limits", &limits)] {
        for (resource, quantity) in map {
            let field = format!("spec.pod.resources.{kind}.{resource}");
            match Quantity::parse(&quantity.0) {
                Err(e) => report.refuse("resource-syntax", field, e.to_string()),
                Ok(q) if q.is_negative() => refuse_negative(report, field, &quantity.0),
                Ok(_) => {}
            }
        }
    }
    // Exact: a request above its limit by 1m (or 1n) is refused at any magnitude.
    let valid = |q: &str| Quantity::parse(q).ok().filter(|q| !q.is_negative());
    for (resource, request) in &requests {
        let Some(limit) = limits.get(resource) else {
            continue;
        };
        if let (Some(r), Some(l)) = (valid(&request.0), valid(&limit.0))
            && r > l
        {
            report.refuse(
                "request-above-limit",
                format!("spec.pod.resources.requests.{resource}"),
                format!(
                    "request {} is above the limit {}",
                    shown(&request.0),
                    shown(&limit.0)
                ),
            );
        }
    }
}

fn check_storage(cluster: &EtcdCluster, report: &mut Report) {
    let Some(pod) = cluster.spec.pod.as_ref() else {
        return;
    };
    match pod.storage_medium.as_deref() {
        None | Some("") => {}
        Some("Memory") if pod.persistent_volume_claim_spec.is_some() => report.refuse(
            "storage-medium-conflict",
            "spec.pod.storageMedium",
            "Memory applies to the emptyDir used without persistentVolumeClaimSpec; set one of them",
        ),
        Some("Memory") => report.warn(
            "spec.pod.storageMedium",
            "Memory keeps data in tmpfs: members whose node restarts lose their data and are replaced",
        ),
        Some(other) => report.refuse(
            "storage-medium",
            "spec.pod.storageMedium",
            format!("must be \"\" or \"Memory\", got {}", quoted(other)),
        ),
    }
    let Some(claim) = &pod.persistent_volume_claim_spec else {
        if pod.storage_medium.as_deref() != Some("Memory") {
            warn_ephemeral(report);
        }
        return;
    };
    let storage = claim
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    match storage {
        None => report.refuse(
            "claim-size-missing",
            "spec.pod.persistentVolumeClaimSpec.resources.requests.storage",
            "is required: the size of each member's data volume, such as 8Gi",
        ),
        Some(q) => match Quantity::parse(&q.0) {
            Err(e) => report.refuse(
                "resource-syntax",
                "spec.pod.persistentVolumeClaimSpec.resources.requests.storage",
                e.to_string(),
            ),
            Ok(bytes) if bytes.is_negative() => refuse_negative(
                report,
                "spec.pod.persistentVolumeClaimSpec.resources.requests.storage".into(),
                &q.0,
            ),
            Ok(bytes) if bytes < MIN_CLAIM => report.refuse(
                "claim-size-small",
                "spec.pod.persistentVolumeClaimSpec.resources.requests.storage",
                format!(
                    "{} is too small for an etcd data directory (at least 64Mi)",
                    shown(&q.0)
                ),
            ),
            Ok(_) => {}
        },
    }
    if claim.data_source.is_some() || claim.data_source_ref.is_some() {
        report.refuse(
            "claim-data-source",
            "spec.pod.persistentVolumeClaimSpec.dataSource",
            "is not supported: a new member must start from an empty data directory and sync from its peers",
        );
    }
}

/// The smallest claim: 64Mi.
const MIN_CLAIM: Quantity = Quantity::from_units(64 << 20);

/// Kubernetes refuses a negative request, limit or claim size ("must be greater than or
/// equal to 0"); `-0` is zero.
fn refuse_negative(report: &mut Report, field: String, value: &str) {
    report.refuse(
        "resource-negative",
        field,
        format!(
            "{} is negative; a resource quantity must be at least 0",
            quoted(value)
        ),
    );
}

fn warn_ephemeral(report: &mut Report) {
    report.warn(
        "spec.pod.persistentVolumeClaimSpec",
        "is not set: member data lives in an emptyDir and a member whose pod is deleted is replaced by an empty one; set it for durable members",
    );
}
