//! A container's command line and environment, as a kubelet computes them: environment
//! variables from `value`, `valueFrom` and `envFrom`, `$(VAR)` references, then mount paths
//! rewritten to host directories.
//!
//! # Why mount paths are rewritten
//!
//! Containers run as plain processes sharing the test binary's mount namespace, so a
//! `volumeMount` cannot put a directory at its `mountPath`. Instead every occurrence of a
//! mount path in the expanded command, arguments, environment values and working directory is
//! replaced by the volume's host directory: with the data volume mounted at `/var/lib/etcd`,
//! `--data-dir=/var/lib/etcd/data` runs as `--data-dir=<pod dir>/volumes/data/data`. A mount
//! path is only replaced at path boundaries (preceded by the start or a character that cannot
//! be part of a path, followed by the end, `/` or such a character), longest first, so
//! `/etc/etcd/peer-tls/peer.crt` and `/etc/etcd/peer-tls-other` are told apart. Paths a program
//! computes itself (not given on its command line or in its environment) are not rewritten.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, Secret};

/// `$(VAR)` expansion as Kubernetes does it: `$(NAME)` becomes the value of `NAME` when
/// `lookup` knows it and stays as written otherwise; `$$` is a literal `$` (so `$$(NAME)` is
/// the literal `$(NAME)`); any other `$` is kept.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Volume mount paths → host directories, applied to strings (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountMap {
    /// Sorted longest mount path first.
    mounts: Vec<(String, PathBuf)>,
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '-' | '_' | '~' | '+' | '@')
}

impl MountMap {
    /// From `(mountPath, host directory)` pairs. A mount at `/` is ignored (it would rewrite
    /// every absolute path).
    pub fn new(mounts: impl IntoIterator<Item = (String, PathBuf)>) -> Self {
        let mut mounts: Vec<(String, PathBuf)> = mounts
            .into_iter()
            .map(|(m, h)| (m.trim_end_matches('/').to_owned(), h))
            .filter(|(m, _)| !m.is_empty())
            .collect();
        mounts.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        Self { mounts }
    }

    /// The pairs, longest mount path first.
    pub fn mounts(&self) -> &[(String, PathBuf)] {
        &self.mounts
    }

    /// `input` with every mount path at a path boundary replaced by its host directory.
    pub fn rewrite(&self, input: &str) -> String {
        if self.mounts.is_empty() {
            return input.to_owned();
        }
        let mut out = String::with_capacity(input.len());
        let mut i = 0;
        let mut previous: Option<char> = None;
        while i < input.len() {
            let rest = &input[i..];
            if previous.is_none_or(|c| !is_path_char(c))
                && let Some((mount, host)) = self.mounts.iter().find(|(m, _)| {
                    rest.starts_with(m.as_str())
                        && rest[m.len()..]
                            .chars()
                            .next()
                            .is_none_or(|c| c == '/' || !is_path_char(c))
                })
            {
                out.push_str(&host.to_string_lossy());
                i += mount.len();
                previous = mount.chars().last();
                continue;
            }
            let Some(c) = rest.chars().next() else { break };
            out.push(c);
            previous = Some(c);
            i += c.len_utf8();
        }
        out
    }
}

/// Values a container's environment can refer to that are not in the pod spec.
#[derive(Debug, Clone, Default)]
pub struct EnvSources {
    /// `status.podIP`.
    pub pod_ip: Option<String>,
    /// `status.hostIP`.
    pub host_ip: Option<String>,
    /// ConfigMaps of the pod's namespace by name (`None`: looked up, does not exist).
    pub config_maps: BTreeMap<String, Option<ConfigMap>>,
    /// Secrets of the pod's namespace by name (`None`: looked up, does not exist).
    pub secrets: BTreeMap<String, Option<Secret>>,
}

/// Why a container's environment cannot be built (`CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A referenced ConfigMap or Secret, or a key of it, is missing and not optional.
    #[error("{0}")]
    Missing(String),
    /// A `valueFrom` this kubelet does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// The ConfigMaps and Secrets `container`'s environment refers to: `(config maps, secrets)`.
pub fn env_references(container: &Container) -> (Vec<String>, Vec<String>) {
    let mut maps = Vec::new();
    let mut secrets = Vec::new();
    for from in container.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            maps.push(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                maps.push(r.name.clone());
            }
            if let Some(r) = &from.secret_key_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    maps.sort();
    maps.dedup();
    secrets.sort();
    secrets.dedup();
    (maps, secrets)
}

/// The value of a downward-API `fieldPath` of `pod`.
pub fn field_value(pod: &Pod, sources: &EnvSources, path: &str) -> Result<String, EnvError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_owned)
    };
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" | "status.podIPs" => sources.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => sources.host_ip.clone(),
        _ => {
            if let Some(key) = map_key("metadata.labels") {
                meta.labels.as_ref().and_then(|l| l.get(&key).cloned())
            } else if let Some(key) = map_key("metadata.annotations") {
                meta.annotations.as_ref().and_then(|a| a.get(&key).cloned())
            } else {
                return Err(EnvError::Unsupported(format!("fieldPath {path:?}")));
            }
        }
    };
    Ok(value.unwrap_or_default())
}

fn config_map_value(map: &ConfigMap, key: &str) -> Option<String> {
    map.data
        .as_ref()
        .and_then(|d| d.get(key).cloned())
        .or_else(|| {
            map.binary_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        })
}

fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key).cloned())
        })
}

fn var_value(
    pod: &Pod,
    sources: &EnvSources,
    var: &EnvVar,
    env: &[(String, String)],
) -> Result<Option<String>, EnvError> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let Some(from) = &var.value_from else {
        return Ok(Some(expand(var.value.as_deref().unwrap_or(""), lookup)));
    };
    if let Some(field) = &from.field_ref {
        return field_value(pod, sources, &field.field_path).map(Some);
    }
    if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional.unwrap_or(false);
        return match sources.config_maps.get(&r.name).and_then(Option::as_ref) {
            Some(map) => match config_map_value(map, &r.key) {
                Some(v) => Ok(Some(v)),
                None if optional => Ok(None),
                None => Err(EnvError::Missing(format!(
                    "couldn't find key {} in ConfigMap {}",
                    r.key, r.name
                ))),
            },
            None if optional => Ok(None),
            None => Err(EnvError::Missing(format!(
                "configmap {:?} not found",
                r.name
            ))),
        };
    }
    if let Some(r) = &from.secret_key_ref {
        let optional = r.optional.unwrap_or(false);
        return match sources.secrets.get(&r.name).and_then(Option::as_ref) {
            Some(secret) => match secret_value(secret, &r.key) {
                Some(v) => Ok(Some(v)),
                None if optional => Ok(None),
                None => Err(EnvError::Missing(format!(
                    "couldn't find key {} in Secret {}",
                    r.key, r.name
                ))),
            },
            None if optional => Ok(None),
            None => Err(EnvError::Missing(format!("secret {:?} not found", r.name))),
        };
    }
    Err(EnvError::Unsupported(format!(
        "valueFrom of {} (only fieldRef, configMapKeyRef and secretKeyRef)",
        var.name
    )))
}

/// The environment of `container`, in order (a later duplicate overrides an earlier one):
/// `base` (e.g. `HOSTNAME`, `PATH`), then `envFrom`, then `env` (each `value` expanded against
/// the variables before it). Values are not mount-rewritten yet.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    sources: &EnvSources,
    base: &[(String, String)],
) -> Result<Vec<(String, String)>, EnvError> {
    let mut env: Vec<(String, String)> = base.to_vec();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        if let Some(r) = &from.config_map_ref {
            match sources.config_maps.get(&r.name).and_then(Option::as_ref) {
                Some(map) => {
                    for (k, v) in map.data.iter().flatten() {
                        set(&mut env, format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => {
                    return Err(EnvError::Missing(format!(
                        "configmap {:?} not found",
                        r.name
                    )));
                }
            }
        }
        if let Some(r) = &from.secret_ref {
            match sources.secrets.get(&r.name).and_then(Option::as_ref) {
                Some(secret) => {
                    for (k, v) in secret.data.iter().flatten() {
                        set(
                            &mut env,
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        );
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => {
                    return Err(EnvError::Missing(format!("secret {:?} not found", r.name)));
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(value) = var_value(pod, sources, var, &env)? {
            set(&mut env, var.name.clone(), value);
        }
    }
    Ok(env)
}

/// `command` + `args` of `container` with `$(VAR)` expanded from `env`; with no `command`, the
/// image's `entrypoint` comes first.
pub fn command_line(
    container: &Container,
    env: &[(String, String)],
    entrypoint: &str,
) -> Vec<String> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let command: Vec<String> = match container.command.as_deref() {
        Some(command) if !command.is_empty() => command.to_vec(),
        _ => vec![entrypoint.to_owned()],
    };
    command
        .iter()
        .chain(container.args.iter().flatten())
        .map(|a| expand(a, lookup))
        .collect()
}

/// A host path for a path inside the container: the rewritten path if it lies under a mount,
/// else `fallback`.
pub fn host_path(mounts: &MountMap, path: &str, fallback: &Path) -> PathBuf {
    let rewritten = mounts.rewrite(path);
    if rewritten == path {
        fallback.to_owned()
    } else {
        PathBuf::from(rewritten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMapKeySelector, EnvVarSource, ObjectFieldSelector, SecretKeySelector,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "POD_IP" => Some("10.244.0.7".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes() {
        assert_eq!(
            expand("http://$(POD_IP):2379", lookup),
            "http://10.244.0.7:2379"
        );
        assert_eq!(expand("$(UNKNOWN)x", lookup), "$(UNKNOWN)x");
        assert_eq!(expand("$$(POD_IP)", lookup), "$(POD_IP)");
        assert_eq!(expand("a$$b$c$", lookup), "a$b$c$");
        assert_eq!(expand("$(EMPTY)-$(POD_IP", lookup), "-$(POD_IP");
        assert_eq!(expand("$(POD_IP)$(POD_IP)", lookup), "10.244.0.710.244.0.7");
    }

    #[test]
    fn mount_paths_are_rewritten_at_boundaries_only() {
        let mounts = MountMap::new([
            ("/var/lib/etcd".to_owned(), PathBuf::from("/p/volumes/data")),
            (
                "/etc/etcd/peer-tls/".to_owned(),
                PathBuf::from("/p/volumes/peer-tls"),
            ),
            (
                "/etc/etcd/peer-tls/ca".to_owned(),
                PathBuf::from("/p/volumes/ca"),
            ),
        ]);
        assert_eq!(
            mounts.rewrite("--data-dir=/var/lib/etcd/data"),
            "--data-dir=/p/volumes/data/data"
        );
        assert_eq!(mounts.rewrite("/var/lib/etcd"), "/p/volumes/data");
        assert_eq!(
            mounts.rewrite("/var/lib/etcdx /x/var/lib/etcd"),
            "/var/lib/etcdx /x/var/lib/etcd"
        );
        assert_eq!(
            mounts.rewrite("--peer-cert-file=/etc/etcd/peer-tls/peer.crt,/etc/etcd/peer-tls/ca/x"),
            "--peer-cert-file=/p/volumes/peer-tls/peer.crt,/p/volumes/ca/x"
        );
        assert_eq!(
            MountMap::new([("/".into(), PathBuf::from("/h"))]).rewrite("/a"),
            "/a"
        );
        assert_eq!(
            host_path(&mounts, "/var/lib/etcd", Path::new("/fallback")),
            PathBuf::from("/p/volumes/data")
        );
        assert_eq!(
            host_path(&mounts, "/tmp", Path::new("/fallback")),
            PathBuf::from("/fallback")
        );
    }

    fn var(name: &str, value: Option<&str>, from: Option<EnvVarSource>) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.map(Into::into),
            value_from: from,
        }
    }

    #[test]
    fn environment_from_fields_maps_secrets_and_earlier_vars() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("m-0".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                labels: Some([("app".to_owned(), "etcd".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let field = |p: &str| EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: p.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        };
        let container = Container {
            name: "c".into(),
            env: Some(vec![
                var("POD_NAME", None, Some(field("metadata.name"))),
                var("POD_IP", None, Some(field("status.podIP"))),
                var("APP", None, Some(field("metadata.labels['app']"))),
                var(
                    "URL",
                    Some("http://$(POD_IP):2379/$(POD_NAME)/$(LATER)"),
                    None,
                ),
                var("LATER", Some("x"), None),
                var(
                    "FROM_MAP",
                    None,
                    Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "cm".into(),
                            key: "k".into(),
                            optional: None,
                        }),
                        ..EnvVarSource::default()
                    }),
                ),
                var(
                    "FROM_SECRET",
                    None,
                    Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "s".into(),
                            key: "missing".into(),
                            optional: Some(true),
                        }),
                        ..EnvVarSource::default()
                    }),
                ),
            ]),
            args: Some(vec!["--name=$(POD_NAME)".into(), "$(URL)".into()]),
            ..Container::default()
        };
        assert_eq!(
            env_references(&container),
            (vec!["cm".into()], vec!["s".into()])
        );
        let mut sources = EnvSources {
            pod_ip: Some("10.244.0.9".into()),
            ..EnvSources::default()
        };
        let missing = container_env(&pod, &container, &sources, &[]).unwrap_err();
        assert_eq!(
            missing,
            EnvError::Missing("configmap \"cm\" not found".into())
        );
        sources.config_maps.insert(
            "cm".into(),
            Some(ConfigMap {
                data: Some([("k".to_owned(), "v".to_owned())].into()),
                ..ConfigMap::default()
            }),
        );
        sources.secrets.insert(
            "s".into(),
            Some(Secret {
                data: Some([("other".to_owned(), ByteString(b"x".to_vec()))].into()),
                ..Secret::default()
            }),
        );
        let env = container_env(
            &pod,
            &container,
            &sources,
            &[("HOSTNAME".into(), "h".into())],
        )
        .unwrap();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("HOSTNAME"), Some("h"));
        assert_eq!(get("APP"), Some("etcd"));
        assert_eq!(get("URL"), Some("http://10.244.0.9:2379/m-0/$(LATER)"));
        assert_eq!(get("FROM_MAP"), Some("v"));
        assert_eq!(get("FROM_SECRET"), None);
        assert_eq!(
            command_line(&container, &env, "/usr/local/bin/etcd"),
            [
                "/usr/local/bin/etcd",
                "--name=m-0",
                "http://10.244.0.9:2379/m-0/$(LATER)"
            ]
        );
    }
}
