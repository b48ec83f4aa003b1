//! Creates and deletes that a retried step may repeat: an object that already exists (made by
//! an earlier attempt or another reconcile) is created, one already gone is deleted. The one
//! place that tells those answers (409, 404) from failures.

use std::fmt::Debug;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;

/// Creates `object` through `api`; `Conflict` (it exists already) is success. `what` names
/// it in the error (`pod demo-0`).
pub async fn create<K>(api: &Api<K>, object: &K, what: impl Into<String>) -> Result<(), Error>
where
    K: Clone + DeserializeOwned + Serialize + Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("create {}", what.into()))(e)),
    }
}

/// Deletes the object `name` whose UID is `uid` (when known) through `api`: names are reused
/// by design (a member's pod comes back under its name), so a delete planned on an older
/// observation (a slow reconcile, a former leader paused mid-step) must never hit the object
/// that replaced the one it saw. `NotFound`, and a precondition that no longer holds
/// (`Conflict`: the name belongs to a newer object now), mean the object meant is gone.
pub async fn delete_exact<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<&str>,
    what: impl Into<String>,
) -> Result<(), Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || (uid.is_some() && e.code == 409) => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {}", what.into()))(e)),
    }
}

/// Deletes `name` through `api` with `params`; `NotFound` (gone already, or never made) is
/// success. `what` names it in the error (`pod demo-0`).
pub async fn delete<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
    what: impl Into<String>,
) -> Result<(), Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {}", what.into()))(e)),
    }
}
