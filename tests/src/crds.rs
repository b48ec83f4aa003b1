//! Installing the operator's CRDs (EtcdCluster, EtcdBackup, EtcdRestore) the way the chart's
//! `crds/` does, from the types in `etcd-shared`, and waiting until each is Established.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::conditions;
use kube::{Api, ResourceExt as _};

use crate::wait::{WaitError, await_condition};

/// Errors installing the CRDs.
#[derive(Debug, thiserror::Error)]
pub enum CrdInstallError {
    /// The API server refused a CRD.
    #[error("applying CRD {name}: {source}")]
    Apply {
        /// The CRD.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// A CRD did not become Established.
    #[error(transparent)]
    Wait(#[from] WaitError),
}

/// Applies every CRD of the operator (server-side, field manager `etcd-tests`) and waits up to
/// `timeout` for each to be Established.
pub async fn install_all(client: &kube::Client, timeout: Duration) -> Result<(), CrdInstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("etcd-tests").force();
    for generated in etcd_shared::crd::all_crds() {
        let name = generated.crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&generated.crd))
            .await
            .map_err(|source| CrdInstallError::Apply {
                name: name.clone(),
                source,
            })?;
        await_condition(
            api.clone(),
            &name,
            conditions::is_crd_established(),
            timeout,
        )
        .await?;
    }
    Ok(())
}
