//! The scratch member of a verification (`spec.verify`): the snapshot restored by etcd's own
//! tool into a short-lived pod ([`crate::builders::scratch`]) and served there alone; the
//! controller asks it `HashKV` and the key count at the snapshot's revision, then deletes it.
//! A leftover pod of the same name (a controller restarted mid-verification) is deleted first.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::{Api, Resource as _, ResourceExt as _};

use etcd_shared::types::EtcdBackup;
use etcd_shared::version::EtcdVersion;

use crate::builders::OperatorImage;
use crate::builders::scratch::{self, CLIENT_PORT, ScratchPod};
use crate::etcd::{EtcdAccess, KvFingerprint};
use crate::idempotent;
use crate::snapshot::cluster::Success;
use crate::view::ClusterView;

/// How often the scratch pod is looked at.
const POLL: Duration = Duration::from_secs(1);

/// Restores `success`'s snapshot into a scratch member and asks it `HashKV` and the key count
/// at the snapshot's revision, within `limit`; `Err` says why it could not.
pub async fn fingerprint(
    client: &kube::Client,
    backup: &EtcdBackup,
    view: &ClusterView,
    image: Option<&OperatorImage>,
    success: &Success,
    limit: Duration,
) -> Result<KvFingerprint, String> {
    let image = image.ok_or("the controller has no --restore-image for a scratch member")?;
    let version: EtcdVersion = success.etcd_version.parse().map_err(|e| {
        format!(
            "the snapshot's etcd version {:?}: {e}",
            success.etcd_version
        )
    })?;
    let etcdutl = version.capabilities().unwrap_or(view.capabilities).etcdutl;
    let mut source = backup.spec.source.clone();
    if let Some(s3) = source.s3.as_mut() {
        s3.path.clone_from(&success.path);
    } else if let Some(abs) = source.abs.as_mut() {
        abs.path.clone_from(&success.path);
    } else if let Some(gcs) = source.gcs.as_mut() {
        gcs.path.clone_from(&success.path);
    }
    let identity_secret = backup
        .spec
        .encryption
        .as_ref()
        .map(|e| e.identity_secret.clone())
        .filter(|s| !s.is_empty());
    let namespace = backup.namespace().unwrap_or_default();
    let pod = scratch::scratch_pod(ScratchPod {
        backup: backup.name_any(),
        namespace: namespace.clone(),
        owner: backup.controller_owner_ref(&()).unwrap_or_default(),
        operator_image: image.clone(),
        etcd_image: view.image(&version),
        etcdutl,
        source,
        sha256: success.sha256.clone(),
        identity_secret,
    });
    let name = scratch::pod_name(&backup.name_any());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let started = Timestamp::now();
    let outcome = tokio::time::timeout(limit, async {
        gone(&pods, &name).await?;
        idempotent::create(&pods, &pod, format!("pod {name}"))
            .await
            .map_err(|e| e.to_string())?;
        ask(&pods, &name, success.revision).await
    })
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "the scratch member did not answer within {limit:?}"
        ))
    });
    // Deleted whatever happened (a pod left behind is deleted before the next one).
    if let Err(e) = idempotent::delete(
        &pods,
        &name,
        &DeleteParams::background(),
        format!("pod {name}"),
    )
    .await
    {
        tracing::warn!(pod = %name, error = %e, "could not delete the scratch pod");
    }
    tracing::info!(pod = %name, took = ?Timestamp::now().duration_since(started), ok = outcome.is_ok(), "scratch member asked");
    outcome
}

/// Deletes the pod `name` if there is one, and waits until it is gone.
async fn gone(pods: &Api<Pod>, name: &str) -> Result<(), String> {
    loop {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => return Ok(()),
            Some(_) => {
                idempotent::delete(
                    pods,
                    name,
                    &DeleteParams::background(),
                    format!("pod {name}"),
                )
                .await
                .map_err(|e| e.to_string())?;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits for the scratch member to serve, then asks it.
async fn ask(pods: &Api<Pod>, name: &str, revision: i64) -> Result<KvFingerprint, String> {
    let access = EtcdAccess {
        timeout: Duration::from_secs(5),
        ..EtcdAccess::default()
    };
    let mut last = String::from("not started yet");
    loop {
        let pod = pods
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the scratch pod {name} was deleted"))?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Failed" | "Succeeded")) {
            return Err(format!("the scratch member stopped: {}", stopped(&pod)));
        }
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        let running = phase == Some("Running");
        if let (true, Some(ip)) = (running, ip) {
            let endpoint = format!("http://{ip}:{CLIENT_PORT}");
            match access.kv_fingerprint(&endpoint, revision).await {
                Ok(fingerprint) => return Ok(fingerprint),
                // Still starting (or refusing): asked again until the limit.
                Err(e) => last = e.to_string(),
            }
        }
        tracing::debug!(pod = %name, %last, "scratch member not answering yet");
        tokio::time::sleep(POLL).await;
    }
}

/// Which container of a stopped scratch pod failed, with its exit code and message.
fn stopped(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let containers = status.and_then(|s| {
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
            .find_map(|c| {
                let t = c.state.as_ref()?.terminated.as_ref()?;
                (t.exit_code != 0).then(|| {
                    format!(
                        "{} exited {}: {}",
                        c.name,
                        t.exit_code,
                        t.message
                            .as_deref()
                            .or(t.reason.as_deref())
                            .unwrap_or_default()
                    )
                })
            })
    });
    containers.unwrap_or_else(|| "no container reports why".into())
}
