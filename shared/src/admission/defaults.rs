//! Defaulting: fill in what is missing, normalize the version, touch nothing else.

use crate::EtcdCluster;
use crate::version::{DEFAULT_REPOSITORY, DEFAULT_VERSION};

/// Size of a cluster whose spec gives none.
pub const DEFAULT_SIZE: i32 = 3;

/// The values defaulting fills in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// Number of members.
    pub size: i32,
    /// etcd version, `MAJOR.MINOR.PATCH`.
    pub version: String,
    /// Image repository.
    pub repository: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            size: DEFAULT_SIZE,
            version: DEFAULT_VERSION.to_string(),
            repository: DEFAULT_REPOSITORY.to_string(),
        }
    }
}

impl Defaults {
    /// The object with missing size, version and repository filled in, and a leading `v`
    /// removed from the version.
    pub fn apply(&self, object: &EtcdCluster) -> EtcdCluster {
        let mut out = object.clone();
        let spec = &mut out.spec;
        spec.size.get_or_insert(self.size);
        match &mut spec.version {
            Some(v) => {
                if let Some(stripped) = v.strip_prefix('v') {
                    *v = stripped.to_string();
                }
            }
            None => spec.version = Some(self.version.clone()),
        }
        if spec.repository.as_deref().is_none_or(str::is_empty) {
            spec.repository = Some(self.repository.clone());
        }
        out
    }

    /// The version a spec asks for, with its default applied.
    pub fn version_of<'a>(&'a self, object: &'a EtcdCluster) -> &'a str {
        object.spec.version.as_deref().unwrap_or(&self.version)
    }
}
