//! The key of an object's per-object state in the controller (backoff, retry gates,
//! connections, reports): its namespace and name, as a type rather than a `namespace/name`
//! sentence.

use kube::Resource;

/// An object's namespace and name; shown as `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ObjectKey {
    /// The namespace (empty for a cluster-scoped object).
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// The key of `namespace`/`name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of `object`.
    pub fn of<K: Resource>(object: &K) -> Self {
        ObjectKey::new(
            object.meta().namespace.as_deref().unwrap_or_default(),
            object.meta().name.as_deref().unwrap_or_default(),
        )
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn keys_show_as_namespace_slash_name() {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.name = Some("a".into());
        assert_eq!(ObjectKey::of(&cm), ObjectKey::new("ns", "a"));
        assert_eq!(ObjectKey::of(&cm).to_string(), "ns/a");
        cm.metadata.namespace = None;
        assert_eq!(ObjectKey::of(&cm).to_string(), "/a");
    }
}
