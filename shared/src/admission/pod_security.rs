//! The Pod Security Standards (`baseline` and `restricted`) as pure functions of a pod, as
//! the API server's PodSecurity admission judges them (Kubernetes'
//! `staging/src/k8s.io/pod-security-admission/policy`, the checks of the latest version).
//!
//! The admission rules refuse any `spec.pod` field that would make a member pod break
//! `baseline` ([`baseline_pod_security_context`], [`baseline_annotations`]): an EtcdCluster
//! author gets no more than a user allowed `pods/create` in a `baseline` namespace. The
//! [`restricted_violations`] check of a whole pod is what the pod builder's own tests hold
//! the default member pod to.
//!
//! This module depends on `k8s-openapi`, `serde_json` and `std` only, so it can be compiled
//! into another crate's tests as it is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, Container, Pod, PodSecurityContext, PodSpec, SELinuxOptions,
    SeccompProfile, SecurityContext, Volume, WindowsSecurityContextOptions,
};

/// The sysctls `baseline` allows (the "safe" set of Kubernetes 1.32 and later); every other
/// sysctl is forbidden.
pub const BASELINE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The capabilities `baseline` allows a container to add (the container runtimes' defaults).
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The SELinux types `baseline` allows (`""` is unset).
pub const BASELINE_SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The prefix of the AppArmor annotations, one per container.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The volume types `restricted` allows.
pub const RESTRICTED_VOLUME_TYPES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// One control of a Pod Security Standard that a pod breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSecurityViolation {
    /// Path of the offending field, such as `spec.securityContext.sysctls[0].name`.
    pub field: String,
    /// The control and the value that breaks it.
    pub message: String,
}

impl PodSecurityViolation {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        PodSecurityViolation {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A sysctl name with `.` separators: Kubernetes also accepts `/` as the separator when the
/// name's first separator is a `/` (`net/ipv4/tcp_syncookies`), swapping the two.
pub fn normalized_sysctl(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// Whether `baseline` allows the sysctl `name` (in either separator spelling).
pub fn is_baseline_sysctl(name: &str) -> bool {
    BASELINE_SYSCTLS.contains(&normalized_sysctl(name).as_str())
}

/// The `baseline` controls on a pod's security context, whose path is `path`
/// (`spec.securityContext`): host processes, SELinux, seccomp, AppArmor and sysctls.
pub fn baseline_pod_security_context(
    context: &PodSecurityContext,
    path: &str,
) -> Vec<PodSecurityViolation> {
    let mut out = Vec::new();
    host_process(context.windows_options.as_ref(), path, &mut out);
    se_linux(context.se_linux_options.as_ref(), path, &mut out);
    seccomp_not_unconfined(context.seccomp_profile.as_ref(), path, &mut out);
    app_armor_not_unconfined(context.app_armor_profile.as_ref(), path, &mut out);
    for (i, sysctl) in context.sysctls.iter().flatten().enumerate() {
        if !is_baseline_sysctl(&sysctl.name) {
            out.push(PodSecurityViolation::new(
                format!("{path}.sysctls[{i}].name"),
                format!(
                    "{} is not a safe sysctl: Pod Security baseline allows only {}",
                    clip(&sysctl.name),
                    BASELINE_SYSCTLS.join(", ")
                ),
            ));
        }
    }
    out
}

/// The `baseline` control on a pod's annotations, whose path is `path`
/// (`metadata.annotations`): an AppArmor annotation must be `runtime/default` or
/// `localhost/PROFILE` (`unconfined` is forbidden).
pub fn baseline_annotations(
    annotations: &BTreeMap<String, String>,
    path: &str,
) -> Vec<PodSecurityViolation> {
    annotations
        .iter()
        .filter(|(key, value)| {
            key.starts_with(APPARMOR_ANNOTATION_PREFIX)
                && !(value.is_empty()
                    || value.as_str() == "runtime/default"
                    || value.starts_with("localhost/"))
        })
        .map(|(key, value)| {
            PodSecurityViolation::new(
                format!("{path}[{}]", clip(key)),
                format!(
                    "AppArmor profile {} is forbidden by Pod Security baseline (allowed: runtime/default, localhost/PROFILE)",
                    clip(value)
                ),
            )
        })
        .collect()
}

/// Every `baseline` control a pod breaks: its AppArmor annotations, host namespaces, its
/// security context, hostPath volumes, then each container's host ports and security context.
pub fn baseline_violations(pod: &Pod) -> Vec<PodSecurityViolation> {
    let mut out = Vec::new();
    if let Some(annotations) = &pod.metadata.annotations {
        out.extend(baseline_annotations(annotations, "metadata.annotations"));
    }
    let Some(spec) = &pod.spec else {
        return out;
    };
    host_namespaces(spec, &mut out);
    if let Some(context) = &spec.security_context {
        out.extend(baseline_pod_security_context(
            context,
            "spec.securityContext",
        ));
    }
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if volume.host_path.is_some() {
            out.push(PodSecurityViolation::new(
                format!("spec.volumes[{i}].hostPath"),
                "hostPath volumes are forbidden by Pod Security baseline",
            ));
        }
    }
    for (path, container) in containers(spec) {
        host_ports(&container, &path, &mut out);
        if let Some(context) = &container.security_context {
            baseline_container_context(context, &format!("{path}.securityContext"), &mut out);
        }
    }
    out
}

/// `baseline`: no host network, PID or IPC namespace.
fn host_namespaces(spec: &PodSpec, out: &mut Vec<PodSecurityViolation>) {
    for (field, on) in [
        ("spec.hostNetwork", spec.host_network),
        ("spec.hostPID", spec.host_pid),
        ("spec.hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            out.push(PodSecurityViolation::new(
                field,
                "host namespaces are forbidden by Pod Security baseline",
            ));
        }
    }
}

/// `baseline`: no host port (0 is none) on the container at `path`.
fn host_ports(container: &Container, path: &str, out: &mut Vec<PodSecurityViolation>) {
    for (j, port) in container.ports.iter().flatten().enumerate() {
        if port.host_port.is_some_and(|p| p != 0) {
            out.push(PodSecurityViolation::new(
                format!("{path}.ports[{j}].hostPort"),
                "host ports are forbidden by Pod Security baseline",
            ));
        }
    }
}

/// `baseline` on a container's security context at `path`: not privileged, only the allowed
/// capabilities added, the default /proc mount, then host processes, SELinux, seccomp and
/// AppArmor as on the pod.
fn baseline_container_context(
    context: &SecurityContext,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    if context.privileged == Some(true) {
        out.push(PodSecurityViolation::new(
            format!("{path}.privileged"),
            "privileged containers are forbidden by Pod Security baseline",
        ));
    }
    for (j, cap) in added(context.capabilities.as_ref()).enumerate() {
        if !BASELINE_CAPABILITIES.contains(&cap) {
            out.push(PodSecurityViolation::new(
                format!("{path}.capabilities.add[{j}]"),
                format!(
                    "{} is not a capability Pod Security baseline allows adding",
                    clip(cap)
                ),
            ));
        }
    }
    if context
        .proc_mount
        .as_deref()
        .is_some_and(|m| m != "Default")
    {
        out.push(PodSecurityViolation::new(
            format!("{path}.procMount"),
            "only the Default /proc mount is allowed by Pod Security baseline",
        ));
    }
    host_process(context.windows_options.as_ref(), path, out);
    se_linux(context.se_linux_options.as_ref(), path, out);
    seccomp_not_unconfined(context.seccomp_profile.as_ref(), path, out);
    app_armor_not_unconfined(context.app_armor_profile.as_ref(), path, out);
}

/// Every `restricted` control a pod breaks (`restricted` includes `baseline`): besides the
/// `baseline` ones, only the restricted volume types, no privilege escalation, non-root,
/// seccomp `RuntimeDefault` or `Localhost`, and capabilities dropped to `ALL` (adding only
/// `NET_BIND_SERVICE`), for every container.
pub fn restricted_violations(pod: &Pod) -> Vec<PodSecurityViolation> {
    let mut out = baseline_violations(pod);
    let Some(spec) = &pod.spec else {
        return out;
    };
    restricted_volumes(spec, &mut out);
    let pod_context = spec.security_context.clone().unwrap_or_default();
    if pod_context.run_as_user == Some(0) {
        out.push(PodSecurityViolation::new(
            "spec.securityContext.runAsUser",
            "running as user 0 (root) is forbidden by Pod Security restricted",
        ));
    }
    if pod_context.run_as_non_root == Some(false) {
        out.push(PodSecurityViolation::new(
            "spec.securityContext.runAsNonRoot",
            "must not be false under Pod Security restricted",
        ));
    }
    for (path, container) in containers(spec) {
        let context = container.security_context.clone().unwrap_or_default();
        let path = format!("{path}.securityContext");
        restricted_container_user(&context, &pod_context, &path, &mut out);
        restricted_container_seccomp(&context, &pod_context, &path, &mut out);
        restricted_capabilities(context.capabilities.as_ref(), &path, &mut out);
    }
    out
}

/// `restricted`: only the volume types of [`RESTRICTED_VOLUME_TYPES`].
fn restricted_volumes(spec: &PodSpec, out: &mut Vec<PodSecurityViolation>) {
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if let Some(kind) = volume_type(volume)
            && !RESTRICTED_VOLUME_TYPES.contains(&kind.as_str())
        {
            out.push(PodSecurityViolation::new(
                format!("spec.volumes[{i}]"),
                format!("{kind} volumes are forbidden by Pod Security restricted"),
            ));
        }
    }
}

/// `restricted` on who a container (security context at `path`) runs as: no privilege
/// escalation, non-root (its own `runAsNonRoot`, else the pod's), not user 0.
fn restricted_container_user(
    context: &SecurityContext,
    pod_context: &PodSecurityContext,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    if context.allow_privilege_escalation != Some(false) {
        out.push(PodSecurityViolation::new(
            format!("{path}.allowPrivilegeEscalation"),
            "must be false under Pod Security restricted",
        ));
    }
    let non_root = match context.run_as_non_root {
        Some(v) => v,
        None => pod_context.run_as_non_root == Some(true),
    };
    if !non_root {
        out.push(PodSecurityViolation::new(
            format!("{path}.runAsNonRoot"),
            "must be true (on the container or the pod) under Pod Security restricted",
        ));
    }
    if context.run_as_user == Some(0) {
        out.push(PodSecurityViolation::new(
            format!("{path}.runAsUser"),
            "running as user 0 (root) is forbidden by Pod Security restricted",
        ));
    }
}

/// `restricted`: a container's seccomp profile (its own, else the pod's) is `RuntimeDefault`
/// or `Localhost`.
fn restricted_container_seccomp(
    context: &SecurityContext,
    pod_context: &PodSecurityContext,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    let seccomp = context
        .seccomp_profile
        .as_ref()
        .or(pod_context.seccomp_profile.as_ref())
        .map(|s| s.type_.as_str());
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        out.push(PodSecurityViolation::new(
            format!("{path}.seccompProfile.type"),
            "must be RuntimeDefault or Localhost (on the container or the pod) under Pod Security restricted",
        ));
    }
}

/// `restricted`: a container drops `ALL` capabilities and adds back only `NET_BIND_SERVICE`.
fn restricted_capabilities(
    capabilities: Option<&Capabilities>,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    let drops_all = capabilities
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        out.push(PodSecurityViolation::new(
            format!("{path}.capabilities.drop"),
            "must include ALL under Pod Security restricted",
        ));
    }
    for (j, cap) in added(capabilities).enumerate() {
        if cap != "NET_BIND_SERVICE" {
            out.push(PodSecurityViolation::new(
                format!("{path}.capabilities.add[{j}]"),
                "Pod Security restricted allows adding only NET_BIND_SERVICE",
            ));
        }
    }
}

/// Every container of a pod with its path: containers, init containers, ephemeral containers.
fn containers(spec: &PodSpec) -> Vec<(String, Container)> {
    let mut all: Vec<(String, Container)> = Vec::new();
    for (i, c) in spec.containers.iter().enumerate() {
        all.push((format!("spec.containers[{i}]"), c.clone()));
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        all.push((format!("spec.initContainers[{i}]"), c.clone()));
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let common = Container {
            name: c.name.clone(),
            ports: c.ports.clone(),
            security_context: c.security_context.clone(),
            ..Container::default()
        };
        all.push((format!("spec.ephemeralContainers[{i}]"), common));
    }
    all
}

fn added(capabilities: Option<&Capabilities>) -> impl Iterator<Item = &str> {
    capabilities
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
        .map(String::as_str)
}

/// The name of the volume's source (`emptyDir`, `hostPath`, ...), from its JSON form.
fn volume_type(volume: &Volume) -> Option<String> {
    let value = serde_json::to_value(volume).ok()?;
    value
        .as_object()?
        .iter()
        .find(|(k, v)| k.as_str() != "name" && !v.is_null())
        .map(|(k, _)| k.clone())
}

fn host_process(
    options: Option<&WindowsSecurityContextOptions>,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    if options.and_then(|o| o.host_process) == Some(true) {
        out.push(PodSecurityViolation::new(
            format!("{path}.windowsOptions.hostProcess"),
            "HostProcess containers are forbidden by Pod Security baseline",
        ));
    }
}

fn se_linux(options: Option<&SELinuxOptions>, path: &str, out: &mut Vec<PodSecurityViolation>) {
    let Some(options) = options else {
        return;
    };
    let kind = options.type_.as_deref().unwrap_or("");
    if !BASELINE_SELINUX_TYPES.contains(&kind) {
        out.push(PodSecurityViolation::new(
            format!("{path}.seLinuxOptions.type"),
            format!(
                "SELinux type {} is forbidden by Pod Security baseline (allowed: container_t, container_init_t, container_kvm_t, container_engine_t)",
                clip(kind)
            ),
        ));
    }
    for (name, value) in [("user", &options.user), ("role", &options.role)] {
        if value.as_deref().is_some_and(|v| !v.is_empty()) {
            out.push(PodSecurityViolation::new(
                format!("{path}.seLinuxOptions.{name}"),
                format!("setting the SELinux {name} is forbidden by Pod Security baseline"),
            ));
        }
    }
}

fn seccomp_not_unconfined(
    profile: Option<&SeccompProfile>,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    if profile.is_some_and(|p| p.type_ == "Unconfined") {
        out.push(PodSecurityViolation::new(
            format!("{path}.seccompProfile.type"),
            "Unconfined is forbidden by Pod Security baseline (use RuntimeDefault or Localhost)",
        ));
    }
}

fn app_armor_not_unconfined(
    profile: Option<&AppArmorProfile>,
    path: &str,
    out: &mut Vec<PodSecurityViolation>,
) {
    if profile.is_some_and(|p| p.type_ == "Unconfined") {
        out.push(PodSecurityViolation::new(
            format!("{path}.appArmorProfile.type"),
            "Unconfined is forbidden by Pod Security baseline (use RuntimeDefault or Localhost)",
        ));
    }
}

/// At most 64 characters of a value, quoted, then its length: a message never echoes a
/// whole user value.
pub(crate) fn clip(value: &str) -> String {
    match value.char_indices().nth(64) {
        None => format!("{value:?}"),
        Some((end, _)) => format!(
            "{:?}... ({} characters)",
            &value[..end],
            value.chars().count()
        ),
    }
}
