//! Table-driven tests of the rules the API server and Pod Security `baseline` apply to the
//! member pods, judged on `spec.pod` at admission (issue 14, items 11 and 12).

use crate::EtcdCluster;
use crate::admission::AdmissionPolicy;

use super::image_ref::parse_repository;
use super::pod_security::{BASELINE_SYSCTLS, is_baseline_sysctl, normalized_sysctl};
use super::pod_spec_rules::{TOTAL_ANNOTATION_SIZE_LIMIT, operator_annotation_bytes};

/// A durable cluster whose `pod:` holds the given lines (YAML, indented under `pod:`).
fn with_pod(lines: &str) -> EtcdCluster {
    let indented: String = lines.lines().map(|l| format!("    {l}\n")).collect();
    let yaml = format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: demo\n  namespace: default\nspec:\n  pod:\n    persistentVolumeClaimSpec:\n      resources:\n        requests:\n          storage: 1Gi\n{indented}"
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("fixture does not parse: {e}\n{yaml}"))
}

/// The violations of `c`, displayed; empty when accepted.
fn violations(c: &EtcdCluster) -> Vec<String> {
    match AdmissionPolicy::default().validate(c, None) {
        Ok(_) => Vec::new(),
        Err(r) => r.0.iter().map(ToString::to_string).collect(),
    }
}

/// Each row: the `pod:` lines and `None` (accepted) or a part of the violation expected.
fn run(rows: &[(&str, Option<&str>)]) {
    for (lines, want) in rows {
        let got = violations(&with_pod(lines));
        match want {
            None => assert!(got.is_empty(), "{lines}\nwant acceptance, got {got:#?}"),
            Some(want) => assert!(
                got.iter().any(|v| v.contains(want)),
                "{lines}\nwant a violation containing {want:?}, got {got:#?}"
            ),
        }
    }
}

#[test]
fn tolerations_as_the_api_server_validates_them() {
    run(&[
        (
            "tolerations:\n- {key: dedicated, operator: Equal, value: etcd, effect: NoSchedule}",
            None,
        ),
        ("tolerations:\n- {key: dedicated, value: etcd}", None),
        ("tolerations:\n- {operator: Exists}", None),
        (
            "tolerations:\n- {key: example.com/node, operator: Exists, effect: NoExecute, tolerationSeconds: 30}",
            None,
        ),
        (
            "tolerations:\n- {operator: Exists, value: x}",
            Some("tolerations[0].value: must be empty when `operator` is Exists"),
        ),
        (
            "tolerations:\n- {key: a, operator: Exists, value: x}",
            Some("tolerations[0].value: must be empty when `operator` is Exists"),
        ),
        (
            "tolerations:\n- {value: x}",
            Some("tolerations[0].operator: must be Exists when `key` is empty"),
        ),
        (
            "tolerations:\n- {key: a, value: x, effect: NoSchedule, tolerationSeconds: 5}",
            Some("tolerations[0].effect: must be NoExecute when `tolerationSeconds` is set"),
        ),
        (
            "tolerations:\n- {key: a, value: x, effect: NoRun}",
            Some("tolerations[0].effect: \"NoRun\" is not supported"),
        ),
        (
            "tolerations:\n- {key: a, operator: Gt, value: \"1\"}",
            Some("tolerations[0].operator: \"Gt\" is not supported: Equal or Exists"),
        ),
        (
            "tolerations:\n- {key: \"bad key\", operator: Exists}",
            Some("tolerations[0].key: \"bad key\" is not a valid taint key"),
        ),
        (
            "tolerations:\n- {key: a, value: \"not/a value\"}",
            Some("tolerations[0].value: \"not/a value\" is not a valid taint value"),
        ),
    ]);
}

#[test]
fn topology_spread_as_the_api_server_validates_it() {
    let ok = "topologySpreadConstraints:\n- maxSkew: 1\n  topologyKey: topology.kubernetes.io/zone\n  whenUnsatisfiable: DoNotSchedule\n  minDomains: 3\n  nodeAffinityPolicy: Honor\n  nodeTaintsPolicy: Ignore\n  labelSelector:\n    matchLabels: {etcd_cluster: demo}\n  matchLabelKeys: [pod-template-hash]";
    run(&[
        (ok, None),
        (
            "topologySpreadConstraints:\n- {maxSkew: 0, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}",
            Some("topologySpreadConstraints[0].maxSkew: must be greater than 0, got 0"),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: -1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}",
            Some("maxSkew: must be greater than 0, got -1"),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: \"\", whenUnsatisfiable: DoNotSchedule}",
            Some("topologySpreadConstraints[0].topologyKey: can not be empty"),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: Sometimes}",
            Some(
                "whenUnsatisfiable: \"Sometimes\" is not supported: DoNotSchedule or ScheduleAnyway",
            ),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: ScheduleAnyway, minDomains: 2}",
            Some(
                "minDomains: can only use minDomains if whenUnsatisfiable=DoNotSchedule, not \"ScheduleAnyway\"",
            ),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule, minDomains: 0}",
            Some("minDomains: must be greater than 0, got 0"),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}\n- {maxSkew: 2, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}",
            Some("{\"zone\", \"DoNotSchedule\"} is repeated"),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}\n- {maxSkew: 2, topologyKey: zone, whenUnsatisfiable: ScheduleAnyway}",
            None,
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule, nodeTaintsPolicy: Always}",
            Some("nodeTaintsPolicy: \"Always\" is not supported: Honor or Ignore"),
        ),
        (
            "topologySpreadConstraints:\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule, matchLabelKeys: [app]}",
            Some("matchLabelKeys: must not be specified when labelSelector is not set"),
        ),
        (
            "topologySpreadConstraints:\n- maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n  labelSelector: {matchLabels: {app: etcd}}\n  matchLabelKeys: [app]",
            Some("\"app\" exists in both matchLabelKeys and labelSelector"),
        ),
        (
            "topologySpreadConstraints:\n- maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n  labelSelector:\n    matchExpressions:\n    - {key: app, operator: In}",
            Some(
                "labelSelector.matchExpressions[0].values: must be specified when `operator` is 'In' or 'NotIn'",
            ),
        ),
        (
            "topologySpreadConstraints:\n- maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n  labelSelector:\n    matchExpressions:\n    - {key: app, operator: Exists, values: [x]}",
            Some("may not be specified when `operator` is 'Exists' or 'DoesNotExist'"),
        ),
        (
            "topologySpreadConstraints:\n- maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n  labelSelector:\n    matchExpressions:\n    - {key: app, operator: Like, values: [x]}",
            Some("\"Like\" is not a valid label selector operator"),
        ),
    ]);
}

#[test]
fn resource_names_as_the_api_server_validates_them() {
    run(&[
        (
            "resources:\n  requests: {cpu: 500m, memory: 1Gi, ephemeral-storage: 1Gi}\n  limits: {cpu: \"1\", memory: 2Gi}",
            None,
        ),
        (
            "resources:\n  requests: {cpus: \"1\"}",
            Some("resources.requests.cpus: \"cpus\" is not a standard resource for containers"),
        ),
        (
            "resources:\n  limits: {storage: 1Gi}",
            Some("\"storage\" is not a standard resource for containers"),
        ),
        (
            "resources:\n  limits: {pods: \"1\"}",
            Some("\"pods\" is not a standard resource for containers"),
        ),
        (
            "resources:\n  limits: {\"bad name\": \"1\"}",
            Some("\"bad name\" is not a valid resource name"),
        ),
        ("resources:\n  limits: {example.com/device: \"2\"}", None),
        (
            "resources:\n  requests: {example.com/device: \"2\"}\n  limits: {example.com/device: \"2\"}",
            None,
        ),
        (
            "resources:\n  limits: {example.com/device: 500m}",
            Some("limits.example.com/device: \"500m\" must be an integer"),
        ),
        (
            "resources:\n  requests: {example.com/device: \"1\"}",
            Some("limits.example.com/device: Limit must be set for non overcommitable resources"),
        ),
        (
            "resources:\n  requests: {example.com/device: \"1\"}\n  limits: {example.com/device: \"2\"}",
            Some(
                "requests.example.com/device: \"1\" must be equal to example.com/device limit of \"2\"",
            ),
        ),
        (
            "resources:\n  limits: {requests.example.com/device: \"1\"}",
            Some("doesn't follow the extended resource name standard"),
        ),
        (
            "resources:\n  requests: {memory: 1Gi, hugepages-2Mi: 4Mi}\n  limits: {memory: 1Gi, hugepages-2Mi: 4Mi}",
            None,
        ),
        (
            "resources:\n  limits: {memory: 1Gi, hugepages-2Mi: 3Mi}",
            Some("\"3Mi\" is not a positive integer multiple of the page size \"2Mi\""),
        ),
        (
            "resources:\n  limits: {hugepages-2Mi: 4Mi}",
            Some("spec.pod.resources: HugePages require cpu or memory"),
        ),
        (
            "resources:\n  requests: {memory: 1Gi, hugepages-1Gi: 1Gi}",
            Some("limits.hugepages-1Gi: Limit must be set for non overcommitable resources"),
        ),
        (
            "resources:\n  claims:\n  - name: gpu",
            Some("resources.claims: is not supported"),
        ),
    ]);
}

#[test]
fn annotations_total_at_most_256_kib_with_the_operators_own() {
    let room = TOTAL_ANNOTATION_SIZE_LIMIT - operator_annotation_bytes();
    // One annotation `a: VALUE`: the key takes one byte.
    let fits = format!("annotations:\n  a: {}", "x".repeat(room - 1));
    let over = format!("annotations:\n  a: {}", "x".repeat(room));
    run(&[
        (&fits, None),
        (
            &over,
            Some(&format!(
                "spec.pod.annotations: total {} bytes (keys and values); the API server allows 262144 bytes",
                room + 1
            )),
        ),
    ]);
    // Spread over many keys, still the sum that counts.
    let many: String = (0..300)
        .map(|i| format!("\n  k{i:03}: {}", "y".repeat(1000)))
        .collect();
    run(&[(&format!("annotations:{many}"), Some("total 301200 bytes"))]);
    // And the message never quotes the values.
    let got = violations(&with_pod(&over));
    assert!(got.iter().all(|v| v.len() < 1000), "{got:?}");
}

#[test]
fn annotation_keys_are_judged_lowercased_as_the_api_server_does() {
    run(&[
        ("annotations:\n  Example.COM/Owner: me", None),
        (
            "annotations:\n  \"bad key\": me",
            Some("is not a valid annotation key"),
        ),
    ]);
}

/// Pod Security `baseline` on every pod field the spec lets a user set: the pod security
/// context and the AppArmor annotations. What baseline allows (and the restricted-only
/// controls, such as running as root or privilege escalation) stays allowed.
#[test]
fn pod_security_baseline_is_refused_outright() {
    run(&[
        // Allowed by baseline: root (the opt-in for old images), groups, safe sysctls.
        (
            "securityContext:\n  runAsUser: 0\n  runAsNonRoot: false\n  fsGroup: 0",
            None,
        ),
        (
            "securityContext:\n  runAsUser: 1000\n  runAsGroup: 1000\n  fsGroup: 1000\n  fsGroupChangePolicy: OnRootMismatch\n  supplementalGroups: [5, 6]",
            None,
        ),
        (
            "securityContext:\n  sysctls:\n  - {name: net.ipv4.tcp_keepalive_time, value: \"60\"}\n  - {name: net/ipv4/ip_local_port_range, value: \"1024 65000\"}",
            None,
        ),
        (
            "securityContext:\n  seccompProfile: {type: RuntimeDefault}\n  appArmorProfile: {type: RuntimeDefault}",
            None,
        ),
        (
            "securityContext:\n  seccompProfile: {type: Localhost, localhostProfile: profiles/etcd.json}",
            None,
        ),
        (
            "securityContext:\n  seLinuxOptions: {type: container_t, level: \"s0:c123,c456\"}",
            None,
        ),
        (
            "annotations:\n  container.apparmor.security.beta.kubernetes.io/etcd: runtime/default",
            None,
        ),
        // Forbidden by baseline.
        (
            "securityContext:\n  sysctls:\n  - {name: kernel.msgmax, value: \"65536\"}",
            Some(
                "spec.pod.securityContext.sysctls[0].name: \"kernel.msgmax\" is not a safe sysctl",
            ),
        ),
        (
            "securityContext:\n  sysctls:\n  - {name: net.core.somaxconn, value: \"1024\"}",
            Some("\"net.core.somaxconn\" is not a safe sysctl"),
        ),
        (
            "securityContext:\n  seccompProfile: {type: Unconfined}",
            Some(
                "securityContext.seccompProfile.type: Unconfined is forbidden by Pod Security baseline",
            ),
        ),
        (
            "securityContext:\n  appArmorProfile: {type: Unconfined}",
            Some(
                "securityContext.appArmorProfile.type: Unconfined is forbidden by Pod Security baseline",
            ),
        ),
        (
            "annotations:\n  container.apparmor.security.beta.kubernetes.io/etcd: unconfined",
            Some("AppArmor profile \"unconfined\" is forbidden by Pod Security baseline"),
        ),
        (
            "securityContext:\n  seLinuxOptions: {type: spc_t}",
            Some("seLinuxOptions.type: SELinux type \"spc_t\" is forbidden"),
        ),
        (
            "securityContext:\n  seLinuxOptions: {user: system_u, role: system_r}",
            Some("seLinuxOptions.user: setting the SELinux user is forbidden"),
        ),
        (
            "securityContext:\n  windowsOptions: {hostProcess: true}",
            Some("windowsOptions.hostProcess: HostProcess containers are forbidden"),
        ),
    ]);
}

/// The rest of what the API server checks on a pod security context.
#[test]
fn pod_security_context_as_the_api_server_validates_it() {
    run(&[
        (
            "securityContext: {runAsUser: -1}",
            Some("securityContext.runAsUser: must be between 0 and 2147483647, got -1"),
        ),
        (
            "securityContext: {runAsUser: 0, runAsNonRoot: true}",
            Some("securityContext.runAsNonRoot: true contradicts runAsUser: 0"),
        ),
        (
            "securityContext: {fsGroup: 2147483648}",
            Some("securityContext.fsGroup: must be between 0 and 2147483647"),
        ),
        (
            "securityContext: {supplementalGroups: [1, -5]}",
            Some("supplementalGroups[1]: must be between 0 and 2147483647, got -5"),
        ),
        (
            "securityContext: {fsGroupChangePolicy: Sometimes}",
            Some("fsGroupChangePolicy: \"Sometimes\" is not supported: OnRootMismatch or Always"),
        ),
        (
            "securityContext:\n  seccompProfile: {type: Localhost}",
            Some("seccompProfile.localhostProfile: must be set when the profile type is Localhost"),
        ),
        (
            "securityContext:\n  seccompProfile: {type: RuntimeDefault, localhostProfile: x.json}",
            Some(
                "seccompProfile.localhostProfile: can only be set when the profile type is Localhost",
            ),
        ),
        (
            "securityContext:\n  seccompProfile: {type: Strict}",
            Some("seccompProfile.type: \"Strict\" is not supported"),
        ),
        (
            "securityContext:\n  sysctls:\n  - {name: net.ipv4.tcp_syncookies, value: \"1\"}\n  - {name: net/ipv4/tcp_syncookies, value: \"0\"}",
            Some("sysctls[1].name: \"net/ipv4/tcp_syncookies\" is listed more than once"),
        ),
    ]);
}

#[test]
fn the_baseline_sysctls_are_the_current_safe_set() {
    assert_eq!(BASELINE_SYSCTLS.len(), 12);
    for name in BASELINE_SYSCTLS {
        assert!(is_baseline_sysctl(name));
        assert!(is_baseline_sysctl(&name.replace('.', "/")), "{name}");
    }
    for name in [
        "kernel.msgmax",
        "kernel.shmmax",
        "net.core.somaxconn",
        "vm.swappiness",
        "net.ipv4",
        "",
    ] {
        assert!(!is_baseline_sysctl(name), "{name}");
    }
    // An interface name with a dot, in the slash spelling, keeps its dot.
    assert_eq!(
        normalized_sysctl("net/ipv4/conf/eno2.100/rp_filter"),
        "net.ipv4.conf.eno2/100.rp_filter"
    );
}

/// The repository rule the admission check is asked to use (see `image_ref`), on the
/// repositories the tests and CoreOS users run.
#[test]
fn repositories_in_use_parse_as_image_names() {
    for repo in [
        "quay.io/coreos/etcd",
        "gcr.io/etcd-development/etcd",
        "registry.example.test/etcd",
    ] {
        assert!(parse_repository(repo).is_ok(), "{repo}");
    }
}

#[test]
fn image_pull_secrets_name_secrets_once_and_are_bounded() {
    let many: String = (0..=super::pod_rules::MAX_IMAGE_PULL_SECRETS)
        .map(|i| format!("- name: registry-{i}\n"))
        .collect();
    let many = format!("imagePullSecrets:\n{many}");
    run(&[
        ("imagePullSecrets:\n- name: registry-credentials", None),
        (
            "imagePullSecrets:\n- name: quay\n- name: internal.registry",
            None,
        ),
        (
            "imagePullSecrets:\n- name: Registry_Credentials",
            Some("spec.pod.imagePullSecrets[0].name: must be the name of a Secret"),
        ),
        (
            "imagePullSecrets:\n- name: \"\"",
            Some("spec.pod.imagePullSecrets[0].name: must be the name of a Secret"),
        ),
        (
            "imagePullSecrets:\n- name: quay\n- name: quay",
            Some("spec.pod.imagePullSecrets[1].name: names \"quay\" a second time"),
        ),
        (&many, Some("names 17 secrets, at most 16 are allowed")),
    ]);
}

/// `spec.pod` holding `lines` is refused with exactly `want`, in this order.
fn assert_violations(lines: &str, want: &[&str]) {
    assert_eq!(violations(&with_pod(lines)), want, "{lines}");
}

/// Every violation of one object, in order: the rules of a topology spread constraint, one constraint after another.
#[test]
fn topology_spread_violations_come_in_the_api_servers_order() {
    assert_violations(
        "topologySpreadConstraints:\n- maxSkew: 0\n  topologyKey: \"\"\n  whenUnsatisfiable: Sometimes\n  minDomains: 0\n  nodeAffinityPolicy: Always\n  nodeTaintsPolicy: Never\n  matchLabelKeys: [app, \"bad key\", zone]\n  labelSelector:\n    matchLabels: {app: etcd}\n    matchExpressions:\n    - {key: \"bad key\", operator: Like, values: [x]}\n- {maxSkew: 1, topologyKey: \"\", whenUnsatisfiable: Sometimes, matchLabelKeys: [app]}\n- {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: ScheduleAnyway, minDomains: -1}",
        &[
            "spec.pod.topologySpreadConstraints[0].maxSkew: must be greater than 0, got 0",
            "spec.pod.topologySpreadConstraints[0].topologyKey: can not be empty: the node label that names a topology domain, such as topology.kubernetes.io/zone",
            "spec.pod.topologySpreadConstraints[0].whenUnsatisfiable: \"Sometimes\" is not supported: DoNotSchedule or ScheduleAnyway",
            "spec.pod.topologySpreadConstraints[0].{topologyKey, whenUnsatisfiable}: {\"\", \"Sometimes\"} is repeated: one constraint per pair",
            "spec.pod.topologySpreadConstraints[0].minDomains: must be greater than 0, got 0",
            "spec.pod.topologySpreadConstraints[0].minDomains: can only use minDomains if whenUnsatisfiable=DoNotSchedule, not \"Sometimes\"",
            "spec.pod.topologySpreadConstraints[0].nodeAffinityPolicy: \"Always\" is not supported: Honor or Ignore",
            "spec.pod.topologySpreadConstraints[0].nodeTaintsPolicy: \"Never\" is not supported: Honor or Ignore",
            "spec.pod.topologySpreadConstraints[0].matchLabelKeys[0]: \"app\" exists in both matchLabelKeys and labelSelector",
            "spec.pod.topologySpreadConstraints[0].matchLabelKeys[1]: \"bad key\" is not a valid label key",
            "spec.pod.topologySpreadConstraints[0].labelSelector.matchExpressions[0].operator: \"Like\" is not a valid label selector operator",
            "spec.pod.topologySpreadConstraints[0].labelSelector.matchExpressions[0].key: \"bad key\" is not a valid label key",
            "spec.pod.topologySpreadConstraints[1].topologyKey: can not be empty: the node label that names a topology domain, such as topology.kubernetes.io/zone",
            "spec.pod.topologySpreadConstraints[1].whenUnsatisfiable: \"Sometimes\" is not supported: DoNotSchedule or ScheduleAnyway",
            "spec.pod.topologySpreadConstraints[1].matchLabelKeys: must not be specified when labelSelector is not set",
            "spec.pod.topologySpreadConstraints[2].minDomains: must be greater than 0, got -1",
            "spec.pod.topologySpreadConstraints[2].minDomains: can only use minDomains if whenUnsatisfiable=DoNotSchedule, not \"ScheduleAnyway\"",
        ],
    );
}

/// Every violation of one object, in order: the resource names, then their units, then overcommitment, then hugepages and claims.
#[test]
fn resource_violations_come_in_the_api_servers_order() {
    assert_violations(
        "resources:\n  requests: {example.com/device: 500m, hugepages-2Mi: 3Mi, cpus: \"1\", example.com/gpu: \"1\", hugepages-1Gi: 1Gi}\n  limits: {example.com/gpu: \"2\", hugepages-2Mi: 3Mi, \"bad name\": \"1\", example.com/device: 1500m}\n  claims:\n  - name: gpu",
        &[
            "spec.pod.resources.requests.cpus: \"cpus\" is not a standard resource for containers: cpu, memory, ephemeral-storage, hugepages-<size>, or an extended resource domain/name such as example.com/device",
            "spec.pod.resources.limits.bad name: \"bad name\" is not a valid resource name ([domain/]name, name up to 63 characters)",
            "spec.pod.resources.requests.example.com/device: \"500m\" must be an integer",
            "spec.pod.resources.requests.hugepages-2Mi: \"3Mi\" is not a positive integer multiple of the page size \"2Mi\"",
            "spec.pod.resources.limits.example.com/device: \"1500m\" must be an integer",
            "spec.pod.resources.limits.hugepages-2Mi: \"3Mi\" is not a positive integer multiple of the page size \"2Mi\"",
            "spec.pod.resources.requests.example.com/device: \"500m\" must be equal to example.com/device limit of \"1500m\" (it cannot be overcommitted)",
            "spec.pod.resources.requests.example.com/gpu: \"1\" must be equal to example.com/gpu limit of \"2\" (it cannot be overcommitted)",
            "spec.pod.resources.limits.hugepages-1Gi: Limit must be set for non overcommitable resources (hugepages-1Gi is requested)",
            "spec.pod.resources: HugePages require cpu or memory",
            "spec.pod.resources.claims: is not supported: the member pods have no resource claims to use",
        ],
    );
}

/// Every violation of one object, in order: the IDs, the change policies, the profiles, sysctls listed once, then Pod Security `baseline` (the annotations last).
#[test]
fn security_context_violations_come_in_the_api_servers_order() {
    assert_violations(
        "annotations:\n  container.apparmor.security.beta.kubernetes.io/etcd: unconfined\nsecurityContext:\n  runAsUser: 0\n  runAsNonRoot: true\n  runAsGroup: -1\n  fsGroup: 2147483648\n  supplementalGroups: [1, -1]\n  fsGroupChangePolicy: Sometimes\n  supplementalGroupsPolicy: Loose\n  seLinuxChangePolicy: Never\n  seccompProfile: {type: Localhost}\n  appArmorProfile: {type: Unconfined, localhostProfile: x}\n  sysctls:\n  - {name: net.ipv4.tcp_syncookies, value: \"1\"}\n  - {name: net/ipv4/tcp_syncookies, value: \"0\"}\n  - {name: kernel.msgmax, value: \"1\"}",
        &[
            "spec.pod.securityContext.runAsGroup: must be between 0 and 2147483647, got -1",
            "spec.pod.securityContext.fsGroup: must be between 0 and 2147483647, got 2147483648",
            "spec.pod.securityContext.runAsNonRoot: true contradicts runAsUser: 0; to run an image as root (the opt-in for old etcd images) set runAsUser: 0 or runAsNonRoot: false alone",
            "spec.pod.securityContext.supplementalGroups[1]: must be between 0 and 2147483647, got -1",
            "spec.pod.securityContext.fsGroupChangePolicy: \"Sometimes\" is not supported: OnRootMismatch or Always",
            "spec.pod.securityContext.supplementalGroupsPolicy: \"Loose\" is not supported: Merge or Strict",
            "spec.pod.securityContext.seLinuxChangePolicy: \"Never\" is not supported: Recursive or MountOption",
            "spec.pod.securityContext.seccompProfile.localhostProfile: must be set when the profile type is Localhost",
            "spec.pod.securityContext.appArmorProfile.localhostProfile: can only be set when the profile type is Localhost",
            "spec.pod.securityContext.sysctls[1].name: \"net/ipv4/tcp_syncookies\" is listed more than once",
            "spec.pod.securityContext.appArmorProfile.type: Unconfined is forbidden by Pod Security baseline (use RuntimeDefault or Localhost)",
            "spec.pod.securityContext.sysctls[2].name: \"kernel.msgmax\" is not a safe sysctl: Pod Security baseline allows only kernel.shm_rmid_forced, net.ipv4.ip_local_port_range, net.ipv4.ip_unprivileged_port_start, net.ipv4.tcp_syncookies, net.ipv4.ping_group_range, net.ipv4.ip_local_reserved_ports, net.ipv4.tcp_keepalive_time, net.ipv4.tcp_fin_timeout, net.ipv4.tcp_keepalive_intvl, net.ipv4.tcp_keepalive_probes, net.ipv4.tcp_rmem, net.ipv4.tcp_wmem",
            "spec.pod.annotations[\"container.apparmor.security.beta.kubernetes.io/etcd\"]: AppArmor profile \"unconfined\" is forbidden by Pod Security baseline (allowed: runtime/default, localhost/PROFILE)",
        ],
    );
}

/// Every violation of one object, in order: a profile type without its Localhost profile, and an unknown type.
#[test]
fn profile_violations_name_the_field_at_fault() {
    assert_violations(
        "securityContext:\n  seccompProfile: {type: RuntimeDefault, localhostProfile: x.json}\n  appArmorProfile: {type: Strict}",
        &[
            "spec.pod.securityContext.seccompProfile.localhostProfile: can only be set when the profile type is Localhost",
            "spec.pod.securityContext.appArmorProfile.type: \"Strict\" is not supported: RuntimeDefault, Localhost or Unconfined",
        ],
    );
}

/// Every violation of one object, in order: labels, annotation keys, the node selector, then the pod spec, the resources, anti-affinity and the priority class.
#[test]
fn pod_violations_come_field_group_by_field_group() {
    assert_violations(
        "labels: {app: x, \"bad key\": x, good: \"bad value\"}\nannotations: {\"Bad Key!\": x}\nnodeSelector: {\"bad key\": x}\nantiAffinity: true\naffinity:\n  podAntiAffinity: {}\npriorityClassName: Critical\nbusyboxImage: busybox\nresources:\n  requests: {cpu: \"-1\"}",
        &[
            "spec.pod.labels[app]: is reserved for the operator (app, etcd_*, app.kubernetes.io/* and etcd.database.coreos.com/* select the members)",
            "spec.pod.labels[bad key]: is not a valid label key ([prefix/]name, name up to 63 characters)",
            "spec.pod.labels[good]: value \"bad value\" is not a valid label value (up to 63 alphanumerics, '-', '_' or '.')",
            "spec.pod.annotations[Bad Key!]: is not a valid annotation key ([prefix/]name, name up to 63 characters)",
            "spec.pod.nodeSelector[bad key]: bad key=x is not a valid label selector term",
            "spec.pod.resources.requests.cpu: \"-1\" is negative; a resource quantity must be at least 0",
            "spec.pod.antiAffinity: cannot be combined with spec.pod.affinity.podAntiAffinity; set one of them",
            "spec.pod.priorityClassName: must be a valid PriorityClass name, got \"Critical\"",
        ],
    );
}

/// The fields this operator ignores are warned about, each in turn.
#[test]
fn ignored_pod_fields_are_warned_about_in_order() {
    let got = AdmissionPolicy::default()
        .validate(
            &with_pod("busyboxImage: busybox\nDNSTimeoutInSecond: 5"),
            None,
        )
        .expect("accepted");
    assert_eq!(
        got,
        [
            "spec.pod.busyboxImage: is ignored: this operator needs no DNS wait container",
            "spec.pod.DNSTimeoutInSecond: is ignored: this operator's members need no DNS init container to time out",
        ]
    );
}

/// A pod as JSON.
fn pod(json: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json).expect("a pod")
}

/// The violations of a whole pod, displayed as `field: message`.
fn shown(violations: Vec<super::pod_security::PodSecurityViolation>) -> Vec<String> {
    violations
        .into_iter()
        .map(|v| format!("{}: {}", v.field, v.message))
        .collect()
}

/// Pod Security on a whole pod (what the pod builder's tests hold the member pods to), every
/// control in order: `baseline` (annotations, host namespaces, the pod's security context,
/// hostPath volumes, then each container's ports and security context), then `restricted`
/// (volume types, the pod's user, then each container's escalation, user, seccomp and
/// capabilities, inheriting the pod's settings).
#[test]
fn pod_security_of_a_whole_pod_in_order() {
    use super::pod_security::{baseline_violations, restricted_violations};
    let unconfined =
        serde_json::json!({"container.apparmor.security.beta.kubernetes.io/etcd": "unconfined"});
    let everything = pod(serde_json::json!({
        "metadata": {"annotations": unconfined},
        "spec": {
            "hostNetwork": true, "hostPID": true, "hostIPC": false,
            "securityContext": {
                "runAsUser": 0, "runAsNonRoot": false,
                "seccompProfile": {"type": "Unconfined"},
                "sysctls": [{"name": "kernel.msgmax", "value": "1"}]
            },
            "volumes": [
                {"name": "a", "hostPath": {"path": "/"}},
                {"name": "b", "emptyDir": {}},
                {"name": "c", "gitRepo": {"repository": "x"}}
            ],
            "containers": [
                {
                    "name": "etcd",
                    "ports": [{"containerPort": 1, "hostPort": 2379}, {"containerPort": 2, "hostPort": 0}],
                    "securityContext": {
                        "privileged": true,
                        "capabilities": {"add": ["CHOWN", "SYS_ADMIN"], "drop": ["NET_RAW"]},
                        "procMount": "Unmasked",
                        "windowsOptions": {"hostProcess": true},
                        "seLinuxOptions": {"type": "spc_t", "user": "u"},
                        "appArmorProfile": {"type": "Unconfined"},
                        "runAsUser": 0,
                        "allowPrivilegeEscalation": true
                    }
                },
                {
                    "name": "ok",
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"},
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
                    }
                }
            ],
            "initContainers": [{"name": "init"}],
            "ephemeralContainers": [
                {"name": "debug", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}
            ]
        }
    }));
    let baseline = [
        "metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/etcd\"]: AppArmor profile \"unconfined\" is forbidden by Pod Security baseline (allowed: runtime/default, localhost/PROFILE)",
        "spec.hostNetwork: host namespaces are forbidden by Pod Security baseline",
        "spec.hostPID: host namespaces are forbidden by Pod Security baseline",
        "spec.securityContext.seccompProfile.type: Unconfined is forbidden by Pod Security baseline (use RuntimeDefault or Localhost)",
        "spec.securityContext.sysctls[0].name: \"kernel.msgmax\" is not a safe sysctl: Pod Security baseline allows only kernel.shm_rmid_forced, net.ipv4.ip_local_port_range, net.ipv4.ip_unprivileged_port_start, net.ipv4.tcp_syncookies, net.ipv4.ping_group_range, net.ipv4.ip_local_reserved_ports, net.ipv4.tcp_keepalive_time, net.ipv4.tcp_fin_timeout, net.ipv4.tcp_keepalive_intvl, net.ipv4.tcp_keepalive_probes, net.ipv4.tcp_rmem, net.ipv4.tcp_wmem",
        "spec.volumes[0].hostPath: hostPath volumes are forbidden by Pod Security baseline",
        "spec.containers[0].ports[0].hostPort: host ports are forbidden by Pod Security baseline",
        "spec.containers[0].securityContext.privileged: privileged containers are forbidden by Pod Security baseline",
        "spec.containers[0].securityContext.capabilities.add[1]: \"SYS_ADMIN\" is not a capability Pod Security baseline allows adding",
        "spec.containers[0].securityContext.procMount: only the Default /proc mount is allowed by Pod Security baseline",
        "spec.containers[0].securityContext.windowsOptions.hostProcess: HostProcess containers are forbidden by Pod Security baseline",
        "spec.containers[0].securityContext.seLinuxOptions.type: SELinux type \"spc_t\" is forbidden by Pod Security baseline (allowed: container_t, container_init_t, container_kvm_t, container_engine_t)",
        "spec.containers[0].securityContext.seLinuxOptions.user: setting the SELinux user is forbidden by Pod Security baseline",
        "spec.containers[0].securityContext.appArmorProfile.type: Unconfined is forbidden by Pod Security baseline (use RuntimeDefault or Localhost)",
        "spec.ephemeralContainers[0].securityContext.capabilities.add[0]: \"NET_ADMIN\" is not a capability Pod Security baseline allows adding",
    ];
    assert_eq!(shown(baseline_violations(&everything)), baseline);
    let restricted = shown(restricted_violations(&everything));
    assert_eq!(restricted[..baseline.len()], baseline);
    assert_eq!(
        restricted[baseline.len()..],
        [
            "spec.volumes[0]: hostPath volumes are forbidden by Pod Security restricted",
            "spec.volumes[2]: gitRepo volumes are forbidden by Pod Security restricted",
            "spec.securityContext.runAsUser: running as user 0 (root) is forbidden by Pod Security restricted",
            "spec.securityContext.runAsNonRoot: must not be false under Pod Security restricted",
            "spec.containers[0].securityContext.allowPrivilegeEscalation: must be false under Pod Security restricted",
            "spec.containers[0].securityContext.runAsNonRoot: must be true (on the container or the pod) under Pod Security restricted",
            "spec.containers[0].securityContext.runAsUser: running as user 0 (root) is forbidden by Pod Security restricted",
            "spec.containers[0].securityContext.seccompProfile.type: must be RuntimeDefault or Localhost (on the container or the pod) under Pod Security restricted",
            "spec.containers[0].securityContext.capabilities.drop: must include ALL under Pod Security restricted",
            "spec.containers[0].securityContext.capabilities.add[0]: Pod Security restricted allows adding only NET_BIND_SERVICE",
            "spec.containers[0].securityContext.capabilities.add[1]: Pod Security restricted allows adding only NET_BIND_SERVICE",
            "spec.initContainers[0].securityContext.allowPrivilegeEscalation: must be false under Pod Security restricted",
            "spec.initContainers[0].securityContext.runAsNonRoot: must be true (on the container or the pod) under Pod Security restricted",
            "spec.initContainers[0].securityContext.seccompProfile.type: must be RuntimeDefault or Localhost (on the container or the pod) under Pod Security restricted",
            "spec.initContainers[0].securityContext.capabilities.drop: must include ALL under Pod Security restricted",
            "spec.ephemeralContainers[0].securityContext.allowPrivilegeEscalation: must be false under Pod Security restricted",
            "spec.ephemeralContainers[0].securityContext.runAsNonRoot: must be true (on the container or the pod) under Pod Security restricted",
            "spec.ephemeralContainers[0].securityContext.seccompProfile.type: must be RuntimeDefault or Localhost (on the container or the pod) under Pod Security restricted",
            "spec.ephemeralContainers[0].securityContext.capabilities.drop: must include ALL under Pod Security restricted",
            "spec.ephemeralContainers[0].securityContext.capabilities.add[0]: Pod Security restricted allows adding only NET_BIND_SERVICE",
        ]
    );
    // Without a spec, only the annotations.
    let bare = pod(serde_json::json!({"metadata": {"annotations": unconfined}}));
    assert_eq!(
        shown(restricted_violations(&bare)),
        [
            "metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/etcd\"]: AppArmor profile \"unconfined\" is forbidden by Pod Security baseline (allowed: runtime/default, localhost/PROFILE)",
        ]
    );
    // A container inherits the pod's runAsNonRoot and seccomp profile.
    let inherits = pod(serde_json::json!({
        "spec": {
            "containers": [{"name": "e"}],
            "securityContext": {
                "runAsNonRoot": true,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p"}
            }
        }
    }));
    assert_eq!(
        shown(restricted_violations(&inherits)),
        [
            "spec.containers[0].securityContext.allowPrivilegeEscalation: must be false under Pod Security restricted",
            "spec.containers[0].securityContext.capabilities.drop: must include ALL under Pod Security restricted",
        ]
    );
}
