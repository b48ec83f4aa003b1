//! Whether the CRDs the API server serves are this operator's: CoreOS' operators registered
//! `etcdclusters` (and their backup and restore operators `etcdbackups` and `etcdrestores`)
//! themselves, with no schema and no status subresource, and `helm install` skips a chart's
//! `crds/` when the CRD exists. Under such a CRD every status write fails; the controller says
//! so in its log and its `/readyz` until the CRD is replaced (docs/migrating-from-coreos.md,
//! "Taking over"). Read from the API discovery document, which every authenticated client may read
//! (no RBAC on CRDs needed, also in namespace mode).

use std::time::Duration;

use etcd_process::admin::Readiness;
use etcd_shared::names::API_GROUP;
use tokio_util::sync::CancellationToken;

/// The group version the operator serves its kinds in.
pub const GROUP_VERSION: &str = "etcd.database.coreos.com/v1beta2";

/// The resources the operator needs, each with a status subresource.
pub const RESOURCES: [&str; 3] = ["etcdclusters", "etcdbackups", "etcdrestores"];

/// How often the served resources are checked again (readiness).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// How often the controller, waiting to start, checks them.
pub const WAIT_INTERVAL: Duration = Duration::from_secs(5);

/// What the user runs to install (or replace) the CRDs.
pub use etcd_shared::crd::REPLACE_COMMAND;

/// What is wrong with the served resources, given the names discovery lists for
/// [`GROUP_VERSION`] (`etcdclusters`, `etcdclusters/status`, ...; `None`: the group version
/// is not served at all). `None` when every resource is served with its status subresource.
pub fn problem(served: Option<&[String]>) -> Option<String> {
    let Some(served) = served else {
        return Some(format!(
            "the API server does not serve {GROUP_VERSION}: the CRDs are not installed; install them with: {REPLACE_COMMAND}"
        ));
    };
    let has = |name: &str| served.iter().any(|s| s == name);
    let missing: Vec<String> = RESOURCES
        .iter()
        .filter(|r| !has(r))
        .map(|r| format!("{r}.{API_GROUP}"))
        .collect();
    let without_status: Vec<String> = RESOURCES
        .iter()
        .filter(|r| has(r) && !has(&format!("{r}/status")))
        .map(|r| format!("{r}.{API_GROUP}"))
        .collect();
    match (missing.is_empty(), without_status.is_empty()) {
        (true, true) => None,
        (_, false) => Some(format!(
            "the installed CRD {} is not this operator's: it has no status subresource (CoreOS' operators registered theirs so, and `helm install` does not replace an existing CRD), so every status write fails; replace it, keeping the stored objects, with: {REPLACE_COMMAND}",
            without_status.join(", ")
        )),
        (false, true) => Some(format!(
            "CRDs not installed: {}; install them with: {REPLACE_COMMAND}",
            missing.join(", ")
        )),
    }
}

/// The problem with the served resources, read from discovery. A failed read other than "not
/// served" is no verdict (`Err`): the previous one stands.
pub async fn check(client: &kube::Client) -> Result<Option<String>, kube::Error> {
    match client.list_api_group_resources(GROUP_VERSION).await {
        Ok(list) => {
            let names: Vec<String> = list.resources.into_iter().map(|r| r.name).collect();
            Ok(problem(Some(&names)))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(problem(None)),
        Err(e) => Err(e),
    }
}

/// Checks the served resources every [`CHECK_INTERVAL`] until `stop`, blocking `readiness`
/// with the problem while there is one and logging each change.
pub async fn watch(client: kube::Client, readiness: Readiness, stop: CancellationToken) {
    loop {
        match check(&client).await {
            Ok(found) => {
                if readiness.block(found.clone()) {
                    match found {
                        Some(why) => tracing::error!(problem = %why, "installed CRDs"),
                        None => tracing::info!("the installed CRDs are this operator's"),
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "reading the API discovery document"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(CHECK_INTERVAL) => {}
        }
    }
}

/// Waits until the served resources are this operator's (`true`), or `stop` (`false`). The
/// problem is logged by [`watch`].
pub async fn until_ours(client: &kube::Client, stop: &CancellationToken) -> bool {
    loop {
        if matches!(check(client).await, Ok(None)) {
            return true;
        }
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(WAIT_INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn only_every_resource_with_its_status_subresource_is_ours() {
        let ours = served(&[
            "etcdclusters",
            "etcdclusters/status",
            "etcdbackups",
            "etcdbackups/status",
            "etcdrestores",
            "etcdrestores/status",
        ]);
        assert_eq!(problem(Some(&ours)), None);
        // CoreOS' etcdclusters CRD (no status subresource) beside our other two.
        let coreos = served(&[
            "etcdclusters",
            "etcdbackups",
            "etcdbackups/status",
            "etcdrestores",
            "etcdrestores/status",
        ]);
        let said = problem(Some(&coreos)).unwrap_or_default();
        assert!(
            said.contains("etcdclusters.etcd.database.coreos.com is not this operator's")
                && said.contains("no status subresource")
                && said.contains(REPLACE_COMMAND),
            "{said}"
        );
        assert!(!said.contains("etcdbackups"), "{said}");
        // Only CoreOS' etcdclusters CRD: the missing two are named too, the status first.
        let lone = served(&["etcdclusters"]);
        assert!(
            problem(Some(&lone))
                .unwrap_or_default()
                .contains("no status subresource")
        );
        let partial = served(&["etcdclusters", "etcdclusters/status"]);
        let said = problem(Some(&partial)).unwrap_or_default();
        assert!(
            said.contains("not installed: etcdbackups.etcd.database.coreos.com, etcdrestores.etcd.database.coreos.com"),
            "{said}"
        );
        assert!(problem(None).unwrap_or_default().contains("not installed"));
    }
}
