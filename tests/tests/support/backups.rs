//! Creating EtcdBackups and EtcdRestores from YAML and waiting on their status: shared by the
//! object-store and the PVC backup suites.

use anyhow::Context as _;
use kube::Api;
use kube::api::PostParams;

use etcd_shared::types::{EtcdBackup, EtcdBackupStatus, EtcdRestore, EtcdRestoreStatus};
use etcd_tests::poll_until;
use etcd_tests::suite::TestContext;

use super::WAIT;

/// Creates the namespaced object `yaml` describes in the test's namespace.
pub async fn create<K>(ctx: &TestContext, yaml: &str) -> anyhow::Result<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_yaml::from_str(yaml).context("YAML")?;
    Ok(ctx
        .api::<K>()
        .create(&PostParams::default(), &object)
        .await?)
}

/// Waits until the backup's status satisfies `done`.
pub async fn backup_status(
    ctx: &TestContext,
    name: &str,
    what: &str,
    done: impl Fn(&EtcdBackupStatus) -> bool,
) -> anyhow::Result<EtcdBackupStatus> {
    let api: Api<EtcdBackup> = ctx.api();
    poll_until(&format!("EtcdBackup {name}: {what}"), WAIT, || async {
        anyhow::Ok(api.get(name).await?.status.filter(|s| done(s)))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Waits until the restore's status satisfies `done`.
pub async fn restore_status(
    ctx: &TestContext,
    name: &str,
    what: &str,
    done: impl Fn(&EtcdRestoreStatus) -> bool,
) -> anyhow::Result<EtcdRestoreStatus> {
    let api: Api<EtcdRestore> = ctx.api();
    poll_until(&format!("EtcdRestore {name}: {what}"), WAIT, || async {
        anyhow::Ok(api.get(name).await?.status.filter(|s| done(s)))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))
}
