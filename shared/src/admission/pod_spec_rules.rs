//! What the API server checks on a pod (Kubernetes' `pkg/apis/core/validation`), applied to
//! the `spec.pod` fields the member pods are built from, so that a spec whose pods would be
//! refused is refused at `kubectl apply` and not when the controller creates a pod: the total
//! size of the annotations, tolerations, topology spread constraints, resource names and the
//! pod security context; and the Pod Security `baseline` controls of what the spec lets a
//! user set ([`super::pod_security`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    PodSecurityContext, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::Report;
use super::pod_security::{self, clip};
use super::quantity::Quantity;
use super::syntax::{is_label_value, is_qualified_name};
use crate::names;
use crate::types::PodPolicy;

/// The API server's limit on the total size of an object's annotations: the sum of the
/// lengths of every key and value, 256 KiB.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// The largest value the operator writes in each annotation of its own (a version of at most
/// 64 characters, counters and raft indexes of at most 20 digits).
const OPERATOR_ANNOTATIONS: &[(&str, usize)] = &[
    (names::ANNOTATION_CREATED_ON, 64),
    (names::ANNOTATION_RESTARTS_AT_UPGRADE, 20),
    (names::ANNOTATION_SNAPSHOT_BARRIER, 20),
];

/// The bytes the operator's own annotations may take on a member pod.
pub fn operator_annotation_bytes() -> usize {
    OPERATOR_ANNOTATIONS.iter().map(|(k, v)| k.len() + v).sum()
}

/// The largest user or group ID (`IsValidUserID`, `IsValidGroupID`: 0 to 2^31-1).
const MAX_ID: i64 = i32::MAX as i64;

/// Every rule of this module on `spec.pod`.
pub(crate) fn check(pod: &PodPolicy, report: &mut Report) {
    check_annotation_size(&pod.annotations, report);
    check_tolerations(&pod.tolerations, report);
    check_topology_spread(&pod.topology_spread_constraints, report);
    if let Some(resources) = &pod.resources {
        check_resource_names(resources, report);
    }
    if let Some(context) = &pod.security_context {
        check_security_context(context, report);
    }
    for v in pod_security::baseline_annotations(&pod.annotations, "spec.pod.annotations") {
        report.refuse("pod-security-baseline", v.field, v.message);
    }
}

/// `ValidateAnnotationsSize`: the keys and values of a pod's annotations total at most
/// 256 KiB, and the member pods carry the operator's annotations besides the user's.
fn check_annotation_size(annotations: &BTreeMap<String, String>, report: &mut Report) {
    let user: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    let ours = operator_annotation_bytes();
    if user + ours > TOTAL_ANNOTATION_SIZE_LIMIT {
        report.refuse(
            "annotation-size",
            "spec.pod.annotations",
            format!(
                "total {user} bytes (keys and values); the API server allows {TOTAL_ANNOTATION_SIZE_LIMIT} bytes (256 KiB) of annotations on a pod, and the operator's own take up to {ours}, so at most {} are left",
                TOTAL_ANNOTATION_SIZE_LIMIT - ours
            ),
        );
    }
}

/// `ValidateTolerations`.
fn check_tolerations(tolerations: &[Toleration], report: &mut Report) {
    for (i, t) in tolerations.iter().enumerate() {
        let path = format!("spec.pod.tolerations[{i}]");
        let key = t.key.as_deref().unwrap_or("");
        let operator = t.operator.as_deref().unwrap_or("");
        let value = t.value.as_deref().unwrap_or("");
        let effect = t.effect.as_deref().unwrap_or("");
        let mut refuse = |field: &str, message: String| {
            report.refuse("toleration", format!("{path}.{field}"), message);
        };
        if !key.is_empty() && !is_qualified_name(key) {
            refuse(
                "key",
                format!(
                    "{} is not a valid taint key ([prefix/]name, name up to 63 characters)",
                    clip(key)
                ),
            );
        }
        if key.is_empty() && operator != "Exists" {
            refuse(
                "operator",
                "must be Exists when `key` is empty, which means \"match all values and all keys\""
                    .into(),
            );
        }
        if t.toleration_seconds.is_some() && effect != "NoExecute" {
            refuse(
                "effect",
                "must be NoExecute when `tolerationSeconds` is set".into(),
            );
        }
        match operator {
            "" | "Equal" if !is_label_value(value) => refuse(
                "value",
                format!(
                    "{} is not a valid taint value (up to 63 alphanumerics, '-', '_' or '.')",
                    clip(value)
                ),
            ),
            "" | "Equal" => {}
            "Exists" if !value.is_empty() => {
                refuse("value", "must be empty when `operator` is Exists".into())
            }
            "Exists" => {}
            other => refuse(
                "operator",
                format!("{} is not supported: Equal or Exists", clip(other)),
            ),
        }
        if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            refuse(
                "effect",
                format!(
                    "{} is not supported: NoSchedule, PreferNoSchedule or NoExecute (empty matches all)",
                    clip(effect)
                ),
            );
        }
    }
}

/// Where a rule of this module records a violation: the field under the path of the item
/// being checked, and the message.
type Refuse<'a> = dyn FnMut(&str, String) + 'a;

/// `validateTopologySpreadConstraints`: each constraint's spread, its node policies, its
/// `matchLabelKeys`, then its label selector.
fn check_topology_spread(constraints: &[TopologySpreadConstraint], report: &mut Report) {
    for (i, c) in constraints.iter().enumerate() {
        let path = format!("spec.pod.topologySpreadConstraints[{i}]");
        let mut refuse = |field: &str, message: String| {
            report.refuse("topology-spread", format!("{path}.{field}"), message);
        };
        check_spread(c, &constraints[i + 1..], &mut refuse);
        check_node_policies(c, &mut refuse);
        check_match_label_keys(c, &mut refuse);
        if let Some(selector) = &c.label_selector {
            for (field, message) in label_selector_problems(selector) {
                refuse(&format!("labelSelector.{field}"), message);
            }
        }
    }
}

/// How a constraint spreads the pods: a positive `maxSkew`, a `topologyKey`, a known
/// `whenUnsatisfiable`, one constraint per pair of the two (`later` are the constraints after
/// it), and `minDomains` positive and only with `DoNotSchedule`.
fn check_spread(
    c: &TopologySpreadConstraint,
    later: &[TopologySpreadConstraint],
    refuse: &mut Refuse<'_>,
) {
    if c.max_skew <= 0 {
        refuse(
            "maxSkew",
            format!("must be greater than 0, got {}", c.max_skew),
        );
    }
    if c.topology_key.is_empty() {
        refuse(
            "topologyKey",
            "can not be empty: the node label that names a topology domain, such as topology.kubernetes.io/zone".into(),
        );
    }
    let action = c.when_unsatisfiable.as_str();
    if !matches!(action, "DoNotSchedule" | "ScheduleAnyway") {
        refuse(
            "whenUnsatisfiable",
            format!(
                "{} is not supported: DoNotSchedule or ScheduleAnyway",
                clip(action)
            ),
        );
    }
    if later
        .iter()
        .any(|o| o.topology_key == c.topology_key && o.when_unsatisfiable == action)
    {
        refuse(
            "{topologyKey, whenUnsatisfiable}",
            format!(
                "{{{}, {}}} is repeated: one constraint per pair",
                clip(&c.topology_key),
                clip(action)
            ),
        );
    }
    if let Some(min) = c.min_domains {
        if min <= 0 {
            refuse("minDomains", format!("must be greater than 0, got {min}"));
        }
        if action != "DoNotSchedule" {
            refuse(
                "minDomains",
                format!(
                    "can only use minDomains if whenUnsatisfiable=DoNotSchedule, not {}",
                    clip(action)
                ),
            );
        }
    }
}

/// `nodeAffinityPolicy` and `nodeTaintsPolicy`, when set, are `Honor` or `Ignore`.
fn check_node_policies(c: &TopologySpreadConstraint, refuse: &mut Refuse<'_>) {
    for (field, policy) in [
        ("nodeAffinityPolicy", &c.node_affinity_policy),
        ("nodeTaintsPolicy", &c.node_taints_policy),
    ] {
        if let Some(p) = policy.as_deref()
            && !matches!(p, "Honor" | "Ignore")
        {
            refuse(
                field,
                format!("{} is not supported: Honor or Ignore", clip(p)),
            );
        }
    }
}

/// `matchLabelKeys` only with a `labelSelector`, each a valid label key the selector does not
/// already select on.
fn check_match_label_keys(c: &TopologySpreadConstraint, refuse: &mut Refuse<'_>) {
    let keys = c.match_label_keys.as_deref().unwrap_or_default();
    if !keys.is_empty() && c.label_selector.is_none() {
        refuse(
            "matchLabelKeys",
            "must not be specified when labelSelector is not set".into(),
        );
    }
    let selected: BTreeSet<&str> = c.label_selector.iter().flat_map(selected_keys).collect();
    for (j, key) in keys.iter().enumerate() {
        if !is_qualified_name(key) {
            refuse(
                &format!("matchLabelKeys[{j}]"),
                format!("{} is not a valid label key", clip(key)),
            );
        } else if selected.contains(key.as_str()) {
            refuse(
                &format!("matchLabelKeys[{j}]"),
                format!(
                    "{} exists in both matchLabelKeys and labelSelector",
                    clip(key)
                ),
            );
        }
    }
}

/// The label keys a selector selects on: those of its `matchLabels` and its
/// `matchExpressions`.
fn selected_keys(selector: &LabelSelector) -> impl Iterator<Item = &str> {
    selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .chain(
            selector
                .match_expressions
                .iter()
                .flatten()
                .map(|e| e.key.as_str()),
        )
}

/// `ValidateLabelSelector`: label keys and values, and operators with their values.
fn label_selector_problems(selector: &LabelSelector) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        if !is_qualified_name(key) || !is_label_value(value) {
            out.push((
                format!("matchLabels[{}]", clip(key)),
                format!("{}={} is not a valid label", clip(key), clip(value)),
            ));
        }
    }
    for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => out.push((
                format!("matchExpressions[{i}].values"),
                "must be specified when `operator` is 'In' or 'NotIn'".into(),
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => out.push((
                format!("matchExpressions[{i}].values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'".into(),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => out.push((
                format!("matchExpressions[{i}].operator"),
                format!("{} is not a valid label selector operator", clip(other)),
            )),
        }
        if !is_qualified_name(&e.key) {
            out.push((
                format!("matchExpressions[{i}].key"),
                format!("{} is not a valid label key", clip(&e.key)),
            ));
        }
        for (j, v) in values.iter().enumerate() {
            if !is_label_value(v) {
                out.push((
                    format!("matchExpressions[{i}].values[{j}]"),
                    format!("{} is not a valid label value", clip(v)),
                ));
            }
        }
    }
    out
}

/// Whether the resource is one Kubernetes defines itself (no domain, or a `kubernetes.io/`
/// domain): only those may be overcommitted (request below limit), hugepages excepted.
fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

fn is_hugepages(name: &str) -> bool {
    name.starts_with("hugepages-")
}

/// `IsExtendedResourceName`: a `domain/name` outside `kubernetes.io`, such that
/// `requests.domain/name` (its quota name) is a qualified name.
fn is_extended(name: &str) -> bool {
    !is_native(name)
        && !name.starts_with("requests.")
        && is_qualified_name(&format!("requests.{name}"))
}

/// Why `name` is not a resource a container may request (`validateContainerResourceName`),
/// or `None`.
pub fn container_resource_name_problem(name: &str) -> Option<String> {
    if !is_qualified_name(name) {
        return Some(format!(
            "{} is not a valid resource name ([domain/]name, name up to 63 characters)",
            clip(name)
        ));
    }
    if !name.contains('/') {
        let standard = matches!(name, "cpu" | "memory" | "ephemeral-storage") || is_hugepages(name);
        return (!standard).then(|| {
            format!(
                "{} is not a standard resource for containers: cpu, memory, ephemeral-storage, hugepages-<size>, or an extended resource domain/name such as example.com/device",
                clip(name)
            )
        });
    }
    (!is_native(name) && !is_extended(name)).then(|| {
        format!(
            "{} doesn't follow the extended resource name standard (domain/name)",
            clip(name)
        )
    })
}

/// A container's resource requests or limits, by resource name.
type Resources = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

/// The names and the rules the API server applies per resource (`ValidateResourceRequirements`):
/// standard or extended names; extended resources and hugepages in whole units, never
/// overcommitted (a request needs an equal limit); hugepages in multiples of their page
/// size and with cpu or memory; no resource claims (the member pods have none).
fn check_resource_names(resources: &ResourceRequirements, report: &mut Report) {
    let requests = resources.requests.clone().unwrap_or_default();
    let limits = resources.limits.clone().unwrap_or_default();
    let named_ok = valid_resource_names(&requests, &limits, report);
    check_resource_units(&requests, &limits, &named_ok, report);
    check_not_overcommitted(&requests, &limits, &named_ok, report);
    let any = |f: &dyn Fn(&str) -> bool| requests.keys().chain(limits.keys()).any(|n| f(n));
    if any(&is_hugepages) && !any(&|n| n == "cpu" || n == "memory") {
        report.refuse(
            "resource-hugepages",
            "spec.pod.resources",
            "HugePages require cpu or memory",
        );
    }
    if resources.claims.as_ref().is_some_and(|c| !c.is_empty()) {
        report.refuse(
            "resource-claims",
            "spec.pod.resources.claims",
            "is not supported: the member pods have no resource claims to use",
        );
    }
}

/// The resource names a container may request, the requests' then the limits'; each other
/// name is refused. The rules on quantities apply to the names answered.
fn valid_resource_names(
    requests: &Resources,
    limits: &Resources,
    report: &mut Report,
) -> BTreeSet<String> {
    let mut named_ok = BTreeSet::new();
    for (kind, map) in [("requests", requests), ("limits", limits)] {
        for name in map.keys() {
            match container_resource_name_problem(name) {
                Some(why) => report.refuse(
                    "resource-name",
                    format!("spec.pod.resources.{kind}.{}", clip_path(name)),
                    why,
                ),
                None => {
                    named_ok.insert(name.clone());
                }
            }
        }
    }
    named_ok
}

/// A quantity that parses and is not negative (the quantity rules refuse the others).
fn non_negative(quantity: &str) -> Option<Quantity> {
    Quantity::parse(quantity).ok().filter(|q| !q.is_negative())
}

/// Extended resources in whole units, hugepages in multiples of their page size, in the
/// requests and then the limits of the resources in `named_ok`.
fn check_resource_units(
    requests: &Resources,
    limits: &Resources,
    named_ok: &BTreeSet<String>,
    report: &mut Report,
) {
    for (kind, map) in [("requests", requests), ("limits", limits)] {
        for (name, quantity) in map.iter().filter(|(n, _)| named_ok.contains(*n)) {
            let field = format!("spec.pod.resources.{kind}.{name}");
            let Some(q) = non_negative(&quantity.0) else {
                continue; // refused by the quantity rules
            };
            if is_extended(name) && !is_whole(q) {
                report.refuse(
                    "resource-integer",
                    field.clone(),
                    format!("{} must be an integer", clip(&quantity.0)),
                );
            }
            if is_hugepages(name) && !divides(name, q) {
                report.refuse(
                    "resource-hugepages",
                    field,
                    format!(
                        "{} is not a positive integer multiple of the page size {}",
                        clip(&quantity.0),
                        clip(name.trim_start_matches("hugepages-"))
                    ),
                );
            }
        }
    }
}

/// A request of a resource that cannot be overcommitted (extended resources, hugepages) needs
/// a limit, equal to it; names outside `named_ok` are not judged.
fn check_not_overcommitted(
    requests: &Resources,
    limits: &Resources,
    named_ok: &BTreeSet<String>,
    report: &mut Report,
) {
    for (name, request) in requests.iter().filter(|(n, _)| named_ok.contains(*n)) {
        let overcommit_allowed = is_native(name) && !is_hugepages(name);
        if overcommit_allowed {
            continue;
        }
        match limits.get(name) {
            None => report.refuse(
                "resource-limit-required",
                format!("spec.pod.resources.limits.{name}"),
                format!("Limit must be set for non overcommitable resources ({name} is requested)"),
            ),
            Some(limit) => {
                if let (Some(r), Some(l)) = (non_negative(&request.0), non_negative(&limit.0))
                    && r != l
                {
                    report.refuse(
                        "resource-limit-equal",
                        format!("spec.pod.resources.requests.{name}"),
                        format!(
                            "{} must be equal to {name} limit of {} (it cannot be overcommitted)",
                            clip(&request.0),
                            clip(&limit.0)
                        ),
                    );
                }
            }
        }
    }
}

/// A resource name as a field path segment, clipped.
fn clip_path(name: &str) -> String {
    match name.char_indices().nth(64) {
        None => name.to_string(),
        Some((end, _)) => format!("{}...", &name[..end]),
    }
}

/// A whole number of units (`MilliValue() % 1000 == 0`).
fn is_whole(q: Quantity) -> bool {
    !q.to_string().contains('.')
}

/// `IsHugePageResourceValueDivisible`: the page size of `hugepages-<size>` is a positive whole
/// quantity and the value a multiple of it.
fn divides(name: &str, q: Quantity) -> bool {
    let Ok(page) = Quantity::parse(name.trim_start_matches("hugepages-")) else {
        return false;
    };
    let (Ok(page), Ok(value)) = (
        page.to_string().parse::<i128>(),
        q.to_string().parse::<i128>(),
    ) else {
        return false;
    };
    page > 0 && value % page == 0
}

/// `validatePodSpecSecurityContext` (user and group IDs, the change policies, seccomp and
/// AppArmor profiles, sysctls listed once), then the Pod Security `baseline` controls.
fn check_security_context(c: &PodSecurityContext, report: &mut Report) {
    const PATH: &str = "spec.pod.securityContext";
    let mut refuse = |field: &str, message: String| {
        report.refuse("security-context", format!("{PATH}.{field}"), message);
    };
    check_ids(c, &mut refuse);
    check_change_policies(c, &mut refuse);
    check_profiles(c, &mut refuse);
    check_sysctls_listed_once(c, &mut refuse);
    for v in pod_security::baseline_pod_security_context(c, PATH) {
        report.refuse("pod-security-baseline", v.field, v.message);
    }
}

/// User and group IDs in range (`runAsUser`, `runAsGroup`, `fsGroup`, then each of
/// `supplementalGroups`), and no `runAsNonRoot: true` with `runAsUser: 0`.
fn check_ids(c: &PodSecurityContext, refuse: &mut Refuse<'_>) {
    for (field, id) in [
        ("runAsUser", c.run_as_user),
        ("runAsGroup", c.run_as_group),
        ("fsGroup", c.fs_group),
    ] {
        if let Some(id) = id
            && !(0..=MAX_ID).contains(&id)
        {
            refuse(field, format!("must be between 0 and {MAX_ID}, got {id}"));
        }
    }
    // The kubelet refuses to start such a container ("runAsUser breaks non-root policy").
    if c.run_as_non_root == Some(true) && c.run_as_user == Some(0) {
        refuse(
            "runAsNonRoot",
            "true contradicts runAsUser: 0; to run an image as root (the opt-in for old etcd images) set runAsUser: 0 or runAsNonRoot: false alone".into(),
        );
    }
    for (i, id) in c.supplemental_groups.iter().flatten().enumerate() {
        if !(0..=MAX_ID).contains(id) {
            refuse(
                &format!("supplementalGroups[{i}]"),
                format!("must be between 0 and {MAX_ID}, got {id}"),
            );
        }
    }
}

/// The change policies, when set, have a value the API server knows: `fsGroupChangePolicy`,
/// `supplementalGroupsPolicy`, `seLinuxChangePolicy`.
fn check_change_policies(c: &PodSecurityContext, refuse: &mut Refuse<'_>) {
    for (field, value, allowed) in [
        (
            "fsGroupChangePolicy",
            &c.fs_group_change_policy,
            &["OnRootMismatch", "Always"][..],
        ),
        (
            "supplementalGroupsPolicy",
            &c.supplemental_groups_policy,
            &["Merge", "Strict"][..],
        ),
        (
            "seLinuxChangePolicy",
            &c.se_linux_change_policy,
            &["Recursive", "MountOption"][..],
        ),
    ] {
        if let Some(v) = value.as_deref()
            && !allowed.contains(&v)
        {
            refuse(
                field,
                format!("{} is not supported: {}", clip(v), allowed.join(" or ")),
            );
        }
    }
}

/// The seccomp and AppArmor profiles: a known type, with a `localhostProfile` when and only
/// when the type is `Localhost`.
fn check_profiles(c: &PodSecurityContext, refuse: &mut Refuse<'_>) {
    let profiles = [
        (
            "seccompProfile",
            c.seccomp_profile
                .as_ref()
                .map(|p| (p.type_.as_str(), p.localhost_profile.as_deref())),
        ),
        (
            "appArmorProfile",
            c.app_armor_profile
                .as_ref()
                .map(|p| (p.type_.as_str(), p.localhost_profile.as_deref())),
        ),
    ];
    for (field, profile) in profiles {
        let Some((kind, localhost)) = profile else {
            continue;
        };
        match (kind, localhost) {
            ("Localhost", None | Some("")) => refuse(
                &format!("{field}.localhostProfile"),
                "must be set when the profile type is Localhost".into(),
            ),
            ("Localhost", Some(_)) => {}
            ("RuntimeDefault" | "Unconfined", Some(_)) => refuse(
                &format!("{field}.localhostProfile"),
                "can only be set when the profile type is Localhost".into(),
            ),
            ("RuntimeDefault" | "Unconfined", None) => {}
            (other, _) => refuse(
                &format!("{field}.type"),
                format!(
                    "{} is not supported: RuntimeDefault, Localhost or Unconfined",
                    clip(other)
                ),
            ),
        }
    }
}

/// Each sysctl is set once (in either separator spelling).
fn check_sysctls_listed_once(c: &PodSecurityContext, refuse: &mut Refuse<'_>) {
    let mut seen = BTreeSet::new();
    for (i, sysctl) in c.sysctls.iter().flatten().enumerate() {
        if !seen.insert(pod_security::normalized_sysctl(&sysctl.name)) {
            refuse(
                &format!("sysctls[{i}].name"),
                format!("{} is listed more than once", clip(&sysctl.name)),
            );
        }
    }
}
