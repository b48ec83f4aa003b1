//! Issue 16: backups to and restores from a PersistentVolumeClaim (storage type `PVC`, the
//! operator's extension) on real etcd members, with the process kubelet running the operator's
//! own pods (`etcd-controller backup save|verify`, the seed member's `restore fetch`) from the
//! built binary and the claim as a host directory.

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt as _};

use etcd_controller::in_pod::claim_files;
use etcd_shared::EtcdCluster;
use etcd_shared::types::{EtcdBackup, EtcdRestore};
use etcd_tests::operator::OperatorBinaries;
use etcd_tests::poll_until;
use etcd_tests::suite::TestContext;

use support::backups::{backup_status, create, restore_status};
use support::operator::{Controller, install};
use support::{
    WAIT, bulk_put, check_every_member, client_service_urls, connect, create_settled, duration,
};

fn main() -> std::process::ExitCode {
    let long = Duration::from_secs(600);
    let tests = vec![
        etcd_tests::Test::new(
            "a_pvc_backup_restores_the_cluster_and_a_damaged_file_is_refused",
            a_pvc_backup_restores_the_cluster_and_a_damaged_file_is_refused,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "periodic_pvc_backups_keep_max_backups",
            periodic_pvc_backups_keep_max_backups,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "pvc_retention_keeps_the_newest_of_each_day",
            pvc_retention_keeps_the_newest_of_each_day,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "every_member_lost_recovers_from_the_latest_pvc_backup",
            every_member_lost_recovers_from_the_latest_pvc_backup,
        )
        .with_timeout(long),
    ];
    etcd_tests::run_suite_with_kubelet(tests)
}

/// The claim the snapshots go to.
const CLAIM: &str = "etcd-backups";

/// Creates the claim (1 GiB, ReadWriteOnce); the kubelet binds it when a pod mounts it.
async fn create_claim(ctx: &TestContext) -> anyhow::Result<()> {
    let claim: PersistentVolumeClaim = serde_yaml::from_str(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {CLAIM}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n"
    ))?;
    ctx.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &claim)
        .await?;
    Ok(())
}

/// The claim's directory on the (process) node.
fn claim_dir(ctx: &TestContext) -> anyhow::Result<PathBuf> {
    Ok(ctx.kubelet()?.claim_dir(ctx.ns(), CLAIM))
}

fn pvc_yaml(path: &str) -> String {
    format!("  pvc:\n    claimName: {CLAIM}\n    path: {path}\n")
}

fn backup_yaml(name: &str, cluster: &str, path: &str, policy: &str) -> String {
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: {name}\nspec:\n  etcdEndpoints: [\"http://{cluster}-client:2379\"]\n  storageType: PVC\n{}{policy}",
        pvc_yaml(path)
    )
}

fn restore_yaml(name: &str, cluster: &str, path: &str) -> String {
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdRestore\nmetadata:\n  name: {name}\nspec:\n  etcdCluster:\n    name: {cluster}\n  backupStorageType: PVC\n{}",
        pvc_yaml(path)
    )
}

/// The operator's claim pods of the namespace (backup and verify pods).
async fn claim_pods(ctx: &TestContext, component: &str) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = ctx.api();
    let listed = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await?;
    Ok(listed.items.iter().map(|p| p.name_any()).collect())
}

/// Issue 16, the PVC target: a one-shot backup to a claim (file, metadata, hash, status, pod
/// deleted), a damaged copy refused by the restore's verify pod with the cluster untouched,
/// then a restore from the good file: the cluster is replaced, its keys come back with their
/// values, and a key written after the backup is gone.
async fn a_pvc_backup_restores_the_cluster_and_a_damaged_file_is_refused(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    create_claim(&ctx).await?;
    let version = create_settled(&ctx, "pv", 1, None).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "pv", "/k/", 300, 8).await?;
    ensure!(
        data.len() == 300,
        "{} of 300 writes acknowledged",
        data.len()
    );

    // The one-shot backup.
    let started = Instant::now();
    create::<EtcdBackup>(&ctx, &backup_yaml("once", "pv", "pv/snapshot.db", "")).await?;
    let status = backup_status(&ctx, "once", "succeeded", |s| s.succeeded).await?;
    duration("one-shot PVC backup", started);
    let revision = status.etcd_revision.context("etcdRevision")?;
    ensure!(
        status.last_backup_path.as_deref() == Some("etcd-backups/pv/snapshot.db"),
        "{status:?}"
    );
    ensure!(
        status.etcd_version.as_deref() == Some(version.as_str()),
        "{status:?}"
    );
    let cond = status.conditions.first().context("a condition")?;
    ensure!(
        cond.type_ == "Succeeded" && cond.status == "True",
        "{cond:?}"
    );

    // The file in the claim: intact, the hash the status reports, its metadata beside it.
    let file = claim_dir(&ctx)?.join("pv/snapshot.db");
    let sha = status.last_backup_sha256.clone().context("sha256")?;
    let (checked, metadata) = claim_files::verify_file(&file, Some(&sha), |_| Ok(()))?;
    let metadata = metadata.context("the metadata file")?;
    ensure!(
        Some(checked.size as i64) == status.last_backup_size,
        "{status:?}"
    );
    ensure!(
        metadata.revision == revision && metadata.etcd_version == version && metadata.sha256 == sha,
        "{metadata:?}"
    );
    ensure!(
        !claim_files::temporary_path(&file).exists(),
        "a temporary file is left"
    );
    // The pod is gone once its report is read.
    poll_until("the backup pod deleted", WAIT, || async {
        anyhow::Ok(claim_pods(&ctx, "backup").await?.is_empty().then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    // A key written after the backup: the restore takes the cluster back before it.
    let urls = client_service_urls(&slices, "pv").await?;
    connect(&urls).await?.put("/after", "x", None).await?;

    // A damaged copy is refused by the verify pod; the cluster keeps running untouched.
    let damaged = claim_dir(&ctx)?.join("pv/damaged.db");
    let mut bytes = std::fs::read(&file)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&damaged, &bytes)?;
    std::fs::copy(
        claim_files::metadata_path(&file),
        claim_files::metadata_path(&damaged),
    )?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let uid = clusters.get("pv").await?.uid().context("uid")?;
    create::<EtcdRestore>(&ctx, &restore_yaml("bad", "pv", "pv/damaged.db")).await?;
    let refused = restore_status(&ctx, "bad", "refused", |s| s.reason.is_some()).await?;
    let reason = refused.reason.clone().unwrap_or_default();
    ensure!(reason.starts_with("IntegrityCheckFailed"), "{reason}");
    ensure!(
        refused.replaced_cluster_uid.is_none() && !refused.succeeded,
        "{refused:?}"
    );
    let verified = refused
        .conditions
        .iter()
        .find(|c| c.type_ == "Verified")
        .context("Verified condition")?;
    ensure!(verified.status == "False", "{verified:?}");
    ctx.api::<EtcdRestore>()
        .delete("bad", &DeleteParams::default())
        .await?;
    let cluster = clusters.get("pv").await?;
    ensure!(
        cluster.uid().as_deref() == Some(uid.as_str())
            && cluster.metadata.deletion_timestamp.is_none(),
        "the live cluster was touched"
    );
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "pv", "/k/", &data, 1).await?;

    // The restore from the good file.
    let started = Instant::now();
    create::<EtcdRestore>(&ctx, &restore_yaml("good", "pv", "pv/snapshot.db")).await?;
    let restored = restore_status(&ctx, "good", "succeeded", |s| s.succeeded).await?;
    duration("PVC restore to a Running cluster", started);
    ensure!(
        restored.snapshot_sha256.as_deref() == Some(sha.as_str()),
        "{restored:?}"
    );
    ensure!(restored.snapshot_revision == Some(revision), "{restored:?}");
    ensure!(
        restored.replaced_cluster_uid.as_deref() == Some(uid.as_str()),
        "{restored:?}"
    );
    let cluster = clusters.get("pv").await?;
    ensure!(
        cluster.uid().as_deref() != Some(uid.as_str()),
        "the cluster was replaced"
    );
    check_every_member(&pods, "pv", "/k/", &data, 1).await?;
    let urls = client_service_urls(&slices, "pv").await?;
    let after = connect(&urls).await?.get("/after", None).await?;
    ensure!(
        after.kvs().is_empty(),
        "a key written after the backup came back"
    );
    // The verify pods are gone: the good one deleted once read, the bad one's with it.
    poll_until("no verify pod", WAIT, || async {
        anyhow::Ok(
            claim_pods(&ctx, "restore-verify")
                .await?
                .is_empty()
                .then_some(()),
        )
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Issue 16, the PVC target: periodic backups write `PATH_v<revision>_<time>` files, keep
/// `maxBackups` of them (with their metadata) and never more than one backup pod at a time.
async fn periodic_pvc_backups_keep_max_backups(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    create_claim(&ctx).await?;
    create_settled(&ctx, "pp", 1, None).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    bulk_put(&slices, "pp", "/k/", 50, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(
            "every",
            "pp",
            "pp/snap.db",
            "  backupPolicy:\n    backupIntervalInSecond: 2\n    maxBackups: 2\n",
        ),
    )
    .await?;
    let api: Api<EtcdBackup> = ctx.api();
    let mut paths = BTreeSet::new();
    let mut most_pods = 0;
    let started = Instant::now();
    while paths.len() < 4 {
        ensure!(
            started.elapsed() < WAIT,
            "4 periodic backups not seen: {paths:?}"
        );
        most_pods = most_pods.max(claim_pods(&ctx, "backup").await?.len());
        if let Some(path) = api
            .get("every")
            .await?
            .status
            .filter(|s| s.succeeded)
            .and_then(|s| s.last_backup_path)
        {
            paths.insert(path);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    duration("4 periodic PVC backups", started);
    ensure!(most_pods <= 1, "{most_pods} backup pods at once");
    api.delete("every", &DeleteParams::default()).await?;
    // Its pod (if one was running) goes with it.
    poll_until("no backup pod", WAIT, || async {
        anyhow::Ok(claim_pods(&ctx, "backup").await?.is_empty().then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    let dir = claim_dir(&ctx)?.join("pp");
    let mut names: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    // A pod deleted with its EtcdBackup in the middle of a snapshot may leave its temporary
    // file (never a file under a snapshot's name).
    names.retain(|n| !n.ends_with(".part"));
    let snapshots: Vec<&String> = names
        .iter()
        .filter(|n| !n.ends_with(".meta.json"))
        .collect();
    // The last one recorded, and one before it; their metadata; nothing else.
    ensure!(
        (2..=3).contains(&snapshots.len()),
        "maxBackups 2 (a third only while a newer backup was being written): {names:?}"
    );
    for name in &snapshots {
        ensure!(name.starts_with("snap.db_v"), "{names:?}");
        ensure!(names.contains(&format!("{name}.meta.json")), "{names:?}");
    }
    ensure!(names.len() == snapshots.len() * 2, "{names:?}");
    Ok(())
}

/// Issue 35, item 1, the PVC target: `spec.retention` reaches the claim pod (`--keep-*`,
/// `--time-zone`), which deletes the files (and their metadata) it does not keep: with
/// `keepLast: 1, keepDaily: 2` and older snapshots seeded yesterday at 10:00 and 12:00 and
/// three days ago, one backup leaves itself and yesterday's 12:00.
async fn pvc_retention_keeps_the_newest_of_each_day(ctx: TestContext) -> anyhow::Result<()> {
    use k8s_openapi::jiff::{Timestamp, ToSpan as _, tz::TimeZone};

    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    create_claim(&ctx).await?;
    create_settled(&ctx, "pg", 1, None).await?;
    let dir = claim_dir(&ctx)?.join("pg");
    std::fs::create_dir_all(&dir)?;
    let today = Timestamp::now().to_zoned(TimeZone::UTC).date();
    let seeded = |days_ago: i64, hour: i8| -> anyhow::Result<String> {
        let t = today
            .checked_sub(days_ago.days())?
            .at(hour, 0, 0, 0)
            .to_zoned(TimeZone::UTC)?
            .timestamp();
        let name = etcd_controller::snapshot::keys::snapshot_key("snap.db", true, 1, t);
        std::fs::write(dir.join(&name), b"seeded")?;
        std::fs::write(dir.join(format!("{name}.meta.json")), b"{}")?;
        Ok(name)
    };
    let (d1_10, d1_12, d3) = (seeded(1, 10)?, seeded(1, 12)?, seeded(3, 12)?);
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(
            "gfs",
            "pg",
            "pg/snap.db",
            "  backupPolicy:\n    backupIntervalInSecond: 3600\n  timeZone: UTC\n  retention:\n    keepLast: 1\n    keepDaily: 2\n",
        ),
    )
    .await?;
    let api: Api<EtcdBackup> = ctx.api();
    let path = poll_until("the backup written", WAIT, || async {
        anyhow::Ok(
            api.get("gfs")
                .await?
                .status
                .filter(|s| s.succeeded)
                .and_then(|s| s.last_backup_path),
        )
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let written = path.rsplit('/').next().context("a file name")?.to_string();
    let mut names: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let mut want = vec![
        d1_12.clone(),
        format!("{d1_12}.meta.json"),
        written.clone(),
        format!("{written}.meta.json"),
    ];
    want.sort();
    ensure!(
        names == want,
        "keepLast 1 + keepDaily 2 keep {written} and yesterday's newest ({d1_12}), not {d1_10} or {d3}: {names:?}"
    );
    Ok(())
}

/// Issue 35 item 4: the recovery from permanent quorum loss searches PVC backups too. A
/// 3-member cluster with `recovery.policy: Automatic` and a PVC EtcdBackup of it; every member
/// pod deleted (emptyDir: every member's data gone): the cluster is recovered from the latest
/// snapshot in the claim (checked by the seed's fetch against the SHA-256 its EtcdBackup
/// recorded), with every key of the backup, and `lastRecovery` names the claim.
async fn every_member_lost_recovers_from_the_latest_pvc_backup(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    create_claim(&ctx).await?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    support::operator::create_cluster(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: lost\nspec:\n  size: 3\n  version: {version}\n  recovery:\n    policy: Automatic\n"
        ),
    )
    .await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    support::wait_until(&clusters, "lost", "settled", |c| {
        support::settled(c, 3, version)
    })
    .await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let kept = bulk_put(&slices, "lost", "/kept/", 200, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml("claimed", "lost", "lost/snapshot.db", ""),
    )
    .await?;
    let status = backup_status(&ctx, "claimed", "succeeded", |s| s.succeeded).await?;
    ensure!(
        status.last_backup_path.as_deref() == Some("etcd-backups/lost/snapshot.db"),
        "{:?}",
        status.last_backup_path
    );
    // The backup pod is gone before the claim (ReadWriteOnce) is mounted by the seed.
    poll_until("the backup pod gone", WAIT, || async {
        anyhow::Ok(claim_pods(&ctx, "backup").await?.is_empty().then_some(()))
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    let lost_at = Instant::now();
    pods.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        &ListParams::default().labels(&format!("{}=lost", etcd_shared::names::LABEL_INSTANCE)),
    )
    .await?;
    let done = support::wait_until(&clusters, "lost", "recovered from the PVC backup", |c| {
        support::settled(c, 3, version)
            && c.status
                .as_ref()
                .is_some_and(|s| s.last_recovery.is_some() && s.recovery.is_none())
    })
    .await?;
    duration("every member lost -> Running from the PVC backup", lost_at);
    let last = done
        .status
        .and_then(|s| s.last_recovery)
        .context("lastRecovery")?;
    ensure!(
        last.source == "PVC etcd-backups/lost/snapshot.db",
        "{last:?}"
    );
    check_every_member(&pods, "lost", "/kept/", &kept, 3).await?;
    Ok(())
}
