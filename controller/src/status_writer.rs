//! The one status writer of the three controllers: server-side apply of `status` on the
//! status subresource, under the operator's field manager, forced (the operator owns its
//! status fields).

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use etcd_shared::names::FIELD_MANAGER;

use crate::error::Error;

/// Applies `status` to the object `name` of kind `K` through `api`.
pub async fn apply_status<K, S>(api: &Api<K>, name: &str, status: &S) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!(
        "write status of {} {name}",
        K::kind(&())
    )))?;
    Ok(())
}

/// Applies `status` to `object` (found by its namespace and name).
pub async fn write_status<K, S>(client: &kube::Client, object: &K, status: &S) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
    S: Serialize,
{
    let meta = object.meta();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    apply_status(&api, meta.name.as_deref().unwrap_or_default(), status).await
}
