//! One namespace per test: unique names, creation, waiting for the default ServiceAccount, and
//! deletion.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Namespace as NamespaceObject, ServiceAccount};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Resource};

use crate::wait::{WaitError, poll_until};

/// Label put on every namespace the harness creates.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "etcd-tests");

/// Errors while creating or deleting a test namespace.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The API call failed.
    #[error("namespace {name}: {source}")]
    Api {
        /// The namespace.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// The default ServiceAccount did not appear.
    #[error(transparent)]
    Wait(#[from] WaitError),
}

/// A namespace created for one test. Cloning shares the name and client.
#[derive(Clone)]
pub struct Namespace {
    name: String,
    client: kube::Client,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A valid, unique namespace name derived from `hint` (e.g. a test name): lowercase
/// alphanumerics and `-`, at most 63 characters, ending in a process-wide counter.
pub fn unique_name(hint: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(1);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut base = String::new();
    for c in hint.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            base.push(c);
        } else if !base.ends_with('-') && !base.is_empty() {
            base.push('-');
        }
    }
    let suffix = format!("-{n}");
    base.truncate(63 - suffix.len());
    let base = base.trim_end_matches('-');
    let base = if base.is_empty() { "test" } else { base };
    format!("{base}{suffix}")
}

impl Namespace {
    /// Creates a namespace with a unique name derived from `hint` (see [`unique_name`]).
    pub async fn create(client: kube::Client, hint: &str) -> Result<Self, NamespaceError> {
        Self::create_named(client, &unique_name(hint)).await
    }

    /// Creates the namespace `name`.
    pub async fn create_named(client: kube::Client, name: &str) -> Result<Self, NamespaceError> {
        let api: Api<NamespaceObject> = Api::all(client.clone());
        let object = NamespaceObject {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(
                    [(MANAGED_BY_LABEL.0.to_owned(), MANAGED_BY_LABEL.1.to_owned())].into(),
                ),
                ..ObjectMeta::default()
            },
            ..NamespaceObject::default()
        };
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|source| NamespaceError::Api {
                name: name.to_owned(),
                source,
            })?;
        Ok(Self {
            name: name.to_owned(),
            client,
        })
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client the namespace was created with.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// An `Api` for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Waits until the controller manager created the `default` ServiceAccount; until then the
    /// ServiceAccount admission plugin refuses Pods in this namespace.
    pub async fn wait_for_default_service_account(
        &self,
        timeout: Duration,
    ) -> Result<(), NamespaceError> {
        let api: Api<ServiceAccount> = self.api();
        poll_until(
            &format!("ServiceAccount {}/default", self.name),
            timeout,
            || async { api.get_opt("default").await.map(|sa| sa.map(drop)) },
        )
        .await?;
        Ok(())
    }

    /// Starts deleting the namespace (the controller manager finishes it in the background).
    pub async fn delete(&self) -> Result<(), NamespaceError> {
        let api: Api<NamespaceObject> = Api::all(self.client.clone());
        match api.delete(&self.name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => Err(NamespaceError::Api {
                name: self.name.clone(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unique_name;

    #[test]
    fn names_are_valid_and_unique() {
        let a = unique_name("configmap_round_trip");
        let b = unique_name("configmap_round_trip");
        assert_ne!(a, b);
        assert!(a.starts_with("configmap-round-trip-"), "{a}");
        let long = unique_name(&"X_".repeat(100));
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert!(unique_name("__").starts_with("test-"));
    }
}
