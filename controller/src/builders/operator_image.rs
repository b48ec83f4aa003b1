//! The operator's own image as the pods that run it name and pull it: a restored cluster's
//! first member (its restore init containers) and the one-shot pods of PVC backups and
//! restores.

use k8s_openapi::api::core::v1::LocalObjectReference;

/// The operator's image and the Secrets a pod pulls it with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorImage {
    /// The image reference (the controller's `--restore-image`).
    pub reference: String,
    /// Names of Secrets in the pod's namespace holding the registry's credentials (the
    /// controller's `--restore-image-pull-secret`; the chart passes its `imagePullSecrets`).
    pub pull_secrets: Vec<String>,
}

impl OperatorImage {
    /// The image `reference`, pulled without credentials.
    pub fn new(reference: impl Into<String>) -> Self {
        OperatorImage {
            reference: reference.into(),
            pull_secrets: Vec::new(),
        }
    }
}

/// A pod's `imagePullSecrets` with `names` added, each Secret named once, in order; `None`
/// when the list stays empty (the field is left out).
pub fn with_pull_secrets<'a>(
    list: Option<Vec<LocalObjectReference>>,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<Vec<LocalObjectReference>> {
    let mut list = list.unwrap_or_default();
    for name in names {
        if !list.iter().any(|s| s.name == name) {
            list.push(LocalObjectReference {
                name: name.to_string(),
            });
        }
    }
    (!list.is_empty()).then_some(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &Option<Vec<LocalObjectReference>>) -> Vec<&str> {
        list.iter().flatten().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn each_secret_is_named_once_in_order() {
        let list = with_pull_secrets(None, ["quay", "internal"]);
        assert_eq!(names(&list), ["quay", "internal"]);
        let list = with_pull_secrets(list, ["internal", "mirror"]);
        assert_eq!(names(&list), ["quay", "internal", "mirror"]);
    }

    #[test]
    fn no_secret_leaves_the_field_out() {
        assert_eq!(with_pull_secrets(None, []), None);
        assert_eq!(with_pull_secrets(Some(Vec::new()), []), None);
    }
}
