//! Container images → local binaries. There is no container runtime: an image is "pulled" by
//! finding a rule of the [`ImageMap`] that maps it to binaries built on this machine.
//!
//! The built-in rule ([`ImageMap::with_etcd`]) maps any image whose repository ends in `/etcd`
//! (`quay.io/coreos/etcd:v3.6.16`, `gcr.io/etcd-development/etcd:v3.7.3`, `etcd:v3.5.35`)
//! with a tag `vX.Y.Z` to the etcd built by `hack/build-tools.sh` for X.Y.Z: its
//! `/usr/local/bin/etcd` (the entrypoint), `/usr/local/bin/etcdctl` and, from etcd 3.5 on,
//! `/usr/local/bin/etcdutl` (older lines have none: their images restore snapshots with
//! `etcdctl snapshot restore`). More rules can be
//! registered at any time, e.g. the operator's own images:
//!
//! ```no_run
//! # fn demo(images: &etcd_tests::kubelet::ImageMap) {
//! use etcd_tests::kubelet::ImageMapping;
//! images.register_repository(
//!     "/etcd-operator-controller",
//!     ImageMapping::new("/etcd-controller", "target/debug/etcd-controller"),
//! );
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::tools::Tools;

/// Where the official etcd images keep etcd.
pub const ETCD_ENTRYPOINT: &str = "/usr/local/bin/etcd";
/// Where the official etcd images keep etcdctl.
pub const ETCDCTL_PATH: &str = "/usr/local/bin/etcdctl";
/// Where the official etcd images (3.5 and later) keep etcdutl.
pub const ETCDUTL_PATH: &str = "/usr/local/bin/etcdutl";

/// An image reference split into repository, tag and digest, with Docker Hub names normalized
/// (`etcd` → `docker.io/library/etcd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The reference as written in the pod.
    pub image: String,
    /// Registry and path, e.g. `quay.io/coreos/etcd`.
    pub repository: String,
    /// The tag, if any (`v3.6.16`).
    pub tag: Option<String>,
    /// The digest, if any (`sha256:...`).
    pub digest: Option<String>,
}

impl ImageRef {
    /// Splits `image`. Never fails: anything that is not a tag or digest is the repository.
    pub fn parse(image: &str) -> Self {
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest.to_owned())),
            None => (image, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_owned()),
            ),
            None => (rest, None),
        };
        let repository = match repository.split_once('/') {
            None => format!("docker.io/library/{repository}"),
            Some((first, _))
                if !first.contains('.') && !first.contains(':') && first != "localhost" =>
            {
                format!("docker.io/{repository}")
            }
            Some(_) => repository.to_owned(),
        };
        Self {
            image: image.to_owned(),
            repository,
            tag,
            digest,
        }
    }
}

/// What an image contains: paths inside the image mapped to binaries on this machine, and the
/// entrypoint run when a container sets no `command`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageMapping {
    entrypoint: String,
    binaries: BTreeMap<String, PathBuf>,
}

impl ImageMapping {
    /// An image whose entrypoint `entrypoint` (a path inside the image, e.g.
    /// `/usr/local/bin/etcd`) is the local `binary`.
    pub fn new(entrypoint: impl Into<String>, binary: impl Into<PathBuf>) -> Self {
        let entrypoint = entrypoint.into();
        Self {
            binaries: BTreeMap::from([(entrypoint.clone(), binary.into())]),
            entrypoint,
        }
    }

    /// Adds another executable of the image (e.g. `/usr/local/bin/etcdctl`, for exec probes).
    pub fn with_binary(
        mut self,
        path_in_image: impl Into<String>,
        binary: impl Into<PathBuf>,
    ) -> Self {
        self.binaries.insert(path_in_image.into(), binary.into());
        self
    }

    /// The entrypoint, as a path inside the image.
    pub fn entrypoint(&self) -> &str {
        &self.entrypoint
    }

    /// The local binary behind the entrypoint.
    pub fn entrypoint_binary(&self) -> Option<&Path> {
        self.binaries.get(&self.entrypoint).map(PathBuf::as_path)
    }

    /// Every executable of the image: path inside the image → local binary.
    pub fn binaries(&self) -> &BTreeMap<String, PathBuf> {
        &self.binaries
    }

    /// The local binary for `program` (a container's `command[0]`): an exact path of the image,
    /// or, for a bare name, the image executable with that file name (a `PATH` lookup).
    pub fn resolve(&self, program: &str) -> Result<&Path, String> {
        if let Some(binary) = self.binaries.get(program) {
            return Ok(binary);
        }
        if !program.contains('/')
            && let Some(binary) = self
                .binaries
                .iter()
                .find(|(path, _)| path.rsplit('/').next() == Some(program))
                .map(|(_, b)| b)
        {
            return Ok(binary);
        }
        Err(format!(
            "exec: {program:?}: executable file not found in the image (the etcd-tests kubelet \
             maps only {:?})",
            self.binaries.keys().collect::<Vec<_>>()
        ))
    }

    /// An `imageID` for container statuses: `local://` and the entrypoint binary.
    pub fn image_id(&self) -> String {
        match self.entrypoint_binary() {
            Some(binary) => format!("local://{}", binary.display()),
            None => String::from("local://"),
        }
    }
}

/// Why an image cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// No rule matches the image.
    #[error(
        "failed to pull image {image:?}: no local binary is mapped to it (etcd-tests kubelet \
         image map: {rules})"
    )]
    NotMapped {
        /// The image.
        image: String,
        /// The rules tried, described.
        rules: String,
    },
    /// A rule matches but its binary is not available.
    #[error("failed to pull image {image:?}: {reason}")]
    Unavailable {
        /// The image.
        image: String,
        /// Why (e.g. the etcd version is not built).
        reason: String,
    },
}

/// A rule's verdict: `None` when the rule does not apply to the image, `Some(Err(reason))` when
/// it applies but cannot deliver (a binary is missing).
pub type RuleResult = Option<Result<ImageMapping, String>>;

type Resolver = dyn Fn(&ImageRef) -> RuleResult + Send + Sync;

struct ImageRule {
    description: String,
    resolve: Box<Resolver>,
}

/// The image rules of a kubelet. Cheap to clone; clones share the rules, so rules registered
/// after the kubelet started apply to the next pull (pods in `ImagePullBackOff` retry).
/// Rules registered later are tried first.
#[derive(Clone, Default)]
pub struct ImageMap {
    rules: Arc<RwLock<Vec<Arc<ImageRule>>>>,
}

impl std::fmt::Debug for ImageMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageMap")
            .field("rules", &self.descriptions())
            .finish()
    }
}

/// `X.Y.Z` from a tag `vX.Y.Z` (or `X.Y.Z`), digits only.
fn semver_tag(tag: &str) -> Option<&str> {
    let version = tag.strip_prefix('v').unwrap_or(tag);
    let parts: Vec<&str> = version.split('.').collect();
    (parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then_some(version)
}

impl ImageMap {
    /// A map without rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// A map with the etcd rule (see the module docs), resolving binaries in `tools`.
    pub fn with_etcd(tools: Tools) -> Self {
        let map = Self::new();
        map.add_etcd_rule(tools);
        map
    }

    /// Adds the etcd rule (see the module docs) *after* the existing rules, so rules
    /// registered before or after still take precedence.
    pub fn add_etcd_rule(&self, tools: Tools) {
        let rule = ImageRule {
            description: "*/etcd:vX.Y.Z -> etcd X.Y.Z of the tool cache".into(),
            resolve: Box::new(move |image: &ImageRef| {
                if !(image.repository.ends_with("/etcd")) {
                    return None;
                }
                let version = semver_tag(image.tag.as_deref()?)?;
                Some(match tools.etcd(version) {
                    Ok(etcd) => {
                        let mut mapping = ImageMapping::new(ETCD_ENTRYPOINT, etcd);
                        if let Ok(etcdctl) = tools.etcdctl(version) {
                            mapping = mapping.with_binary(ETCDCTL_PATH, etcdctl);
                        }
                        // Only the lines that ship it (3.5 and later) map etcdutl.
                        if let Ok(etcdutl) = tools.etcdutl(version) {
                            mapping = mapping.with_binary(ETCDUTL_PATH, etcdutl);
                        }
                        Ok(mapping)
                    }
                    Err(e) => Err(format!("etcd {version} is not available locally: {e}")),
                })
            }),
        };
        self.rules
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Arc::new(rule));
    }

    /// Registers a rule, tried before the existing ones. `description` appears in the error
    /// for unmapped images.
    pub fn register(
        &self,
        description: impl Into<String>,
        resolve: impl Fn(&ImageRef) -> RuleResult + Send + Sync + 'static,
    ) {
        let rule = Arc::new(ImageRule {
            description: description.into(),
            resolve: Box::new(resolve),
        });
        self.rules
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(0, rule);
    }

    /// Maps every image whose (normalized) repository ends with `suffix`, whatever its tag, to
    /// `mapping`. E.g. `register_repository("/etcd-operator-webhook", ...)`.
    pub fn register_repository(&self, suffix: impl Into<String>, mapping: ImageMapping) {
        let suffix = suffix.into();
        self.register(
            format!("*{suffix}:* -> {}", mapping.image_id()),
            move |image| {
                image
                    .repository
                    .ends_with(suffix.as_str())
                    .then(|| Ok(mapping.clone()))
            },
        );
    }

    /// The rule descriptions, first tried first.
    pub fn descriptions(&self) -> Vec<String> {
        self.snapshot()
            .iter()
            .map(|r| r.description.clone())
            .collect()
    }

    fn snapshot(&self) -> Vec<Arc<ImageRule>> {
        self.rules
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// "Pulls" `image`: the first rule that applies decides.
    pub fn resolve(&self, image: &str) -> Result<ImageMapping, ImageError> {
        let parsed = ImageRef::parse(image);
        let rules = self.snapshot();
        for rule in &rules {
            match (rule.resolve)(&parsed) {
                None => continue,
                Some(Ok(mapping)) => return Ok(mapping),
                Some(Err(reason)) => {
                    return Err(ImageError::Unavailable {
                        image: image.to_owned(),
                        reason,
                    });
                }
            }
        }
        Err(ImageError::NotMapped {
            image: image.to_owned(),
            rules: if rules.is_empty() {
                String::from("no rules")
            } else {
                rules
                    .iter()
                    .map(|r| r.description.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{VERSIONS_ENV, Versions};

    #[test]
    fn parses_references() {
        let r = ImageRef::parse("quay.io/coreos/etcd:v3.6.16");
        assert_eq!(r.repository, "quay.io/coreos/etcd");
        assert_eq!(r.tag.as_deref(), Some("v3.6.16"));
        let r = ImageRef::parse("localhost:5000/etcd@sha256:abc");
        assert_eq!(r.repository, "localhost:5000/etcd");
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_deref(), Some("sha256:abc"));
        assert_eq!(
            ImageRef::parse("etcd:3.5.35").repository,
            "docker.io/library/etcd"
        );
        assert_eq!(
            ImageRef::parse("bitnami/etcd").repository,
            "docker.io/bitnami/etcd"
        );
    }

    #[test]
    fn etcd_rule_and_registered_rules() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("etcd/v3.6.16/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("etcd"), "").unwrap();
        std::fs::write(bin.join("etcdctl"), "").unwrap();
        std::fs::write(dir.path().join("etcd/v3.6.16/.complete"), "").unwrap();
        let tools = Tools::new(dir.path(), Versions::parse(VERSIONS_ENV).unwrap());
        let map = ImageMap::with_etcd(tools);

        let m = map.resolve("gcr.io/etcd-development/etcd:v3.6.16").unwrap();
        assert_eq!(m.entrypoint(), ETCD_ENTRYPOINT);
        assert_eq!(m.resolve(ETCD_ENTRYPOINT).unwrap(), bin.join("etcd"));
        assert_eq!(m.resolve("etcdctl").unwrap(), bin.join("etcdctl"));
        assert!(m.resolve("/bin/sh").unwrap_err().contains("/bin/sh"));
        // No etcdutl in this (fake) 3.6.16 tool directory: not mapped.
        assert!(m.resolve(ETCDUTL_PATH).is_err());

        let err = map.resolve("quay.io/coreos/etcd:v3.9.9").unwrap_err();
        assert!(matches!(err, ImageError::Unavailable { .. }), "{err}");
        let err = map.resolve("quay.io/coreos/etcd:latest").unwrap_err();
        assert!(matches!(err, ImageError::NotMapped { .. }), "{err}");
        let err = map.resolve("nginx:1.27").unwrap_err().to_string();
        assert!(err.contains("\"nginx:1.27\""), "{err}");

        map.register_repository(
            "/etcd-operator-controller",
            ImageMapping::new("/etcd-controller", "/bin/true"),
        );
        let m = map
            .resolve("ghcr.io/x/etcd-operator-controller:dev")
            .unwrap();
        assert_eq!(m.entrypoint_binary(), Some(Path::new("/bin/true")));
    }

    #[test]
    fn etcd_rule_maps_etcdutl_where_the_line_has_it() {
        let dir = tempfile::tempdir().unwrap();
        for (version, tools) in [
            ("v3.6.16", &["etcd", "etcdctl", "etcdutl"][..]),
            ("v3.4.45", &["etcd", "etcdctl"][..]),
        ] {
            let bin = dir.path().join("etcd").join(version).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            for tool in tools {
                std::fs::write(bin.join(tool), "").unwrap();
            }
            std::fs::write(dir.path().join("etcd").join(version).join(".complete"), "").unwrap();
        }
        let tools = Tools::new(dir.path(), Versions::parse(VERSIONS_ENV).unwrap());
        let map = ImageMap::with_etcd(tools);

        let m = map.resolve("quay.io/coreos/etcd:v3.6.16").unwrap();
        let etcdutl = dir.path().join("etcd/v3.6.16/bin/etcdutl");
        assert_eq!(m.resolve(ETCDUTL_PATH).unwrap(), etcdutl);
        assert_eq!(m.resolve("etcdutl").unwrap(), etcdutl);

        let m = map.resolve("quay.io/coreos/etcd:v3.4.45").unwrap();
        let err = m.resolve(ETCDUTL_PATH).unwrap_err();
        assert!(
            err.contains("etcdutl") && err.contains(ETCDCTL_PATH),
            "{err}"
        );
        assert_eq!(
            m.resolve(ETCDCTL_PATH).unwrap(),
            dir.path().join("etcd/v3.4.45/bin/etcdctl")
        );
    }
}
