//! Backups and restores on real etcd members and real object store servers started by the
//! harness (versitygw for S3, Azurite for ABS, fake-gcs-server for GCS): the webhook and the
//! controller run in this process against the harness's kube-apiserver, the process kubelet
//! runs the member pods as real etcd processes.
//!
//! Run: `cargo test -p etcd-tests --test backup_restore` (needs `hack/build-tools.sh` first).
//! Each test prints its figures on lines starting with `duration:` or `figure:`.

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::TryStreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use object_store::{ObjectStore, ObjectStoreExt as _};

use etcd_controller::snapshot::store::{self, Credentials, StoreLocation, StoreTimeouts};
use etcd_controller::snapshot::transfer;
use etcd_shared::types::EtcdBackup;
use etcd_shared::types::storage::{S3Source, StorageSource};
use etcd_tests::azurite::{self, AzuriteServer};
use etcd_tests::gcs::GcsServer;
use etcd_tests::s3::S3Server;
use etcd_tests::suite::TestContext;
use etcd_tests::{Tools, poll_until};

use etcd_shared::EtcdCluster;
use etcd_shared::types::EtcdRestore;
use etcd_tests::operator::OperatorBinaries;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

use support::backups::{backup_status, create, restore_status};
use support::operator::{Controller, create_cluster, install};
use support::{
    ETCD_TIMEOUT, WAIT, bulk_put, check_every_member, client_service_urls, connect, create_settled,
    duration, settled, wait_until,
};

fn main() -> std::process::ExitCode {
    let long = Duration::from_secs(600);
    let mut tests = etcd_tests::tests![
        a_one_shot_backup_is_taken_while_writes_continue,
        periodic_backups_keep_max_backups,
        a_corrupt_snapshot_is_refused_before_the_cluster_is_touched,
        a_tls_cluster_is_backed_up_with_the_client_tls_secret,
        bad_backups_and_restores_are_refused_at_kubectl_apply,
        a_verified_backup_says_so_and_a_damaged_object_fails_verification,
    ];
    // Waits for three whole minutes of its schedule after the creation (up to 3 min by
    // construction, plus the cluster's start): more than the suite's default 180 s.
    tests.push(
        etcd_tests::Test::new(
            "a_schedule_runs_on_time_across_a_controller_restart_and_prunes_by_retention",
            a_schedule_runs_on_time_across_a_controller_restart_and_prunes_by_retention,
        )
        .with_timeout(Duration::from_secs(300)),
    );
    tests.push(
        etcd_tests::Test::new(
            "safety_backups_come_before_a_scale_down_and_a_minor_upgrade",
            safety_backups_come_before_a_scale_down_and_a_minor_upgrade,
        )
        .with_timeout(long),
    );
    tests.extend([
        etcd_tests::Test::new(
            "a_restore_brings_back_every_acknowledged_write",
            a_restore_brings_back_every_acknowledged_write,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_restore_into_a_new_name_clones_with_a_bumped_revision",
            a_restore_into_a_new_name_clones_with_a_bumped_revision,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_roll_back_bumps_revisions_past_the_old_history",
            a_roll_back_bumps_revisions_past_the_old_history,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_3_5_snapshot_restores_into_3_6",
            a_3_5_snapshot_restores_into_3_6,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "coreos_examples_back_up_and_restore_the_users_cluster",
            coreos_examples_back_up_and_restore_the_users_cluster,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "abs_backups_and_a_restore_through_azurite",
            abs_backups_and_a_restore_through_azurite,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "gcs_backups_and_a_restore_through_fake_gcs_server",
            gcs_backups_and_a_restore_through_fake_gcs_server,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_scale_down_after_a_slow_safety_backup_is_planned_on_a_fresh_observation",
            a_scale_down_after_a_slow_safety_backup_is_planned_on_a_fresh_observation,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_weeks_old_safety_record_is_not_reused",
            a_weeks_old_safety_record_is_not_reused,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_refused_safety_backup_holds_the_upgrade_until_the_store_takes_it",
            a_refused_safety_backup_holds_the_upgrade_until_the_store_takes_it,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_restore_deleted_mid_replacement_still_recreates_the_cluster",
            a_restore_deleted_mid_replacement_still_recreates_the_cluster,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "every_member_lost_recovers_from_the_newest_backup_that_checks",
            every_member_lost_recovers_from_the_newest_backup_that_checks,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "an_encrypted_backup_restores_only_with_its_key",
            an_encrypted_backup_restores_only_with_its_key,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "every_member_lost_recovers_from_an_encrypted_backup_with_its_identity",
            every_member_lost_recovers_from_an_encrypted_backup_with_its_identity,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_restore_to_a_revision_between_two_snapshots_has_exactly_its_keys",
            a_restore_to_a_revision_between_two_snapshots_has_exactly_its_keys,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "point_in_time_restores_on_the_users_3_2",
            point_in_time_restores_on_the_users_3_2,
        )
        .with_timeout(long),
    ]);
    etcd_tests::run_suite_with_kubelet(tests)
}

/// A real S3 server with a bucket, and the `awsSecret` for it in the test's namespace.
struct Storage {
    server: S3Server,
    bucket: String,
}

impl Storage {
    async fn start(ctx: &TestContext, bucket: &str) -> anyhow::Result<Self> {
        let server = S3Server::start(&Tools::from_env()?, "127.0.0.1").await?;
        server.create_bucket(bucket).await?;
        let secrets: Api<Secret> = ctx.api();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("aws".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (
                    "credentials".to_string(),
                    ByteString(server.credentials_file().into_bytes()),
                ),
                (
                    "config".to_string(),
                    ByteString(server.config_file().into_bytes()),
                ),
            ])),
            ..Secret::default()
        };
        secrets.create(&PostParams::default(), &secret).await?;
        Ok(Storage {
            server,
            bucket: bucket.to_string(),
        })
    }

    /// The `s3` source of a spec, as YAML lines under `s3:`.
    fn s3_yaml(&self, key: &str) -> String {
        format!(
            "  s3:\n    path: {}/{key}\n    awsSecret: aws\n    endpoint: {}\n    forcePathStyle: true\n",
            self.bucket,
            self.server.endpoint()
        )
    }

    /// The bucket, opened as the operator opens it.
    fn open(&self) -> anyhow::Result<Arc<dyn ObjectStore>> {
        self.open_bucket(&self.bucket)
    }

    /// Another bucket of the same server, opened as the operator opens it.
    fn open_bucket(&self, bucket: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
        let source = S3Source {
            path: format!("{bucket}/x"),
            aws_secret: "aws".into(),
            endpoint: self.server.endpoint().into(),
            force_path_style: true,
        };
        let location = StoreLocation::s3(&source)?;
        let files = [
            ("credentials", self.server.credentials_file()),
            ("config", self.server.config_file()),
        ];
        let get = |key: &str| {
            files
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        let credentials = Credentials::read(&location.backend, Some(&get))?;
        Ok(store::open(
            &location,
            &credentials,
            StoreTimeouts::default(),
        )?)
    }

    async fn keys(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let listed: Vec<_> = self
            .open()?
            .list(Some(&prefix.into()))
            .try_collect()
            .await?;
        let mut keys: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        Ok(keys)
    }
}

/// Keeps writing `PREFIX<n>` keys through the client Service endpoints, recording each
/// acknowledged write with the revision etcd gave it.
struct RevisionWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Vec<(String, String, i64)>>>,
}

impl RevisionWriter {
    async fn start(
        slices: &Api<EndpointSlice>,
        cluster: &str,
        prefix: &str,
    ) -> anyhow::Result<Self> {
        let urls = client_service_urls(slices, cluster).await?;
        let mut client = connect(&urls).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let prefix = prefix.to_string();
        let task = tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                let (key, value) = (
                    format!("{prefix}{n:08}"),
                    format!("v{n}-{}", "w".repeat(64)),
                );
                n += 1;
                let put = client.put(key.clone(), value.clone(), None);
                if let Ok(Ok(resp)) = tokio::time::timeout(ETCD_TIMEOUT, put).await {
                    let revision = resp.header().map_or(0, |h| h.revision());
                    acked.push((key, value, revision));
                }
            }
            anyhow::Ok(acked)
        });
        Ok(RevisionWriter { stop, task })
    }

    async fn stop(self) -> anyhow::Result<Vec<(String, String, i64)>> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

async fn settled_cluster(ctx: &TestContext, name: &str, size: usize) -> anyhow::Result<String> {
    create_settled(ctx, name, size, None).await
}

/// Issue 16, item 4 and 7: a one-shot backup of a 3-member cluster under continuous writes
/// goes to the real S3 server from the member with the highest revision; the object carries
/// etcd's hash and the version and revision in its metadata; the status says so (CoreOS'
/// fields and a Succeeded condition).
async fn a_one_shot_backup_is_taken_while_writes_continue(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "backups").await?;
    let version = settled_cluster(&ctx, "bk", 3).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let writer = RevisionWriter::start(&slices, "bk", "/w/").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    create::<EtcdBackup>(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: once\nspec:\n  etcdEndpoints: [\"http://bk-client:2379\"]\n  storageType: S3\n{}",
            storage.s3_yaml("bk/snapshot.db")
        ),
    )
    .await?;
    let status = backup_status(&ctx, "once", "succeeded", |s| s.succeeded).await?;
    duration("one-shot backup under writes", started);
    let acked = writer.stop().await?;
    ensure!(!acked.is_empty(), "no write was acknowledged");

    ensure!(
        status.etcd_version.as_deref() == Some(version.as_str()),
        "{status:?}"
    );
    let revision = status.etcd_revision.context("etcdRevision")?;
    ensure!(revision > 1, "{status:?}");
    ensure!(status.last_success_date.is_some() && status.reason.is_none());
    ensure!(status.last_backup_path.as_deref() == Some("backups/bk/snapshot.db"));
    let cond = status.conditions.first().context("a condition")?;
    ensure!(
        cond.type_ == "Succeeded" && cond.status == "True",
        "{cond:?}"
    );

    // The object: intact, with its metadata, the hash the status reports.
    let bucket = storage.open()?;
    let (checked, info) = transfer::verify(
        &bucket,
        "bk/snapshot.db",
        status.last_backup_sha256.as_deref(),
        None,
    )
    .await?;
    ensure!(Some(checked.size as i64) == status.last_backup_size);
    ensure!(info.revision == Some(revision) && info.etcd_version == Some(version));
    println!(
        "figure: snapshot of {} bytes at revision {revision}, {} writes acknowledged meanwhile",
        checked.size,
        acked.len()
    );

    // A one-shot backup is not taken again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api: Api<EtcdBackup> = ctx.api();
    let again = api.get("once").await?.status.context("status")?;
    ensure!(
        again.last_success_date == status.last_success_date,
        "taken twice"
    );
    Ok(())
}

/// Issue 16, item 4: periodic backups (`backupIntervalInSecond`) with `maxBackups` keep the
/// newest snapshots, each named as CoreOS named them (`KEY_v<rev>_<time>`), the oldest
/// deleted first; deleting the EtcdBackup drops its metric series.
async fn periodic_backups_keep_max_backups(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "periodic").await?;
    settled_cluster(&ctx, "pd", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let writer = RevisionWriter::start(&slices, "pd", "/p/").await?;

    create::<EtcdBackup>(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: every2s\nspec:\n  etcdEndpoints: [\"http://pd-client.{}.svc:2379\"]\n  storageType: S3\n  backupPolicy:\n    backupIntervalInSecond: 2\n    maxBackups: 2\n{}",
            ctx.ns(),
            storage.s3_yaml("pd/snap.db")
        ),
    )
    .await?;
    // Four backups, each a new last success.
    let mut seen: Vec<String> = Vec::new();
    while seen.len() < 4 {
        let last = seen.last().cloned();
        let status = backup_status(&ctx, "every2s", "a new success", |s| {
            s.succeeded && s.last_backup_path.is_some() && s.last_backup_path != last
        })
        .await?;
        seen.push(status.last_backup_path.clone().context("a path")?);
    }
    writer.stop().await?;
    let keys = storage.keys("pd").await?;
    ensure!(
        keys.len() == 2,
        "maxBackups 2 keeps 2 snapshots, found {keys:?}"
    );
    for key in &keys {
        // CoreOS' naming: KEY_v<revision>_<2006-01-02-15:04:05>.
        let rest = key.strip_prefix("pd/snap.db_v").context("prefix")?;
        let (revision, time) = rest.split_once('_').context("_")?;
        ensure!(revision.parse::<i64>().is_ok(), "{key}");
        ensure!(
            time.len() == 19 && time.as_bytes()[10] == b'-' && time.as_bytes()[13] == b':',
            "{key}"
        );
    }
    let newest = seen.last().cloned().context("a path")?;
    ensure!(
        keys.iter().any(|k| newest.ends_with(k.as_str())),
        "the newest snapshot {newest} is kept: {keys:?}"
    );
    ensure!(
        controller.metric_value("etcd_controller_backup_last_success_timestamp_seconds") > 0.0,
        "last success metric"
    );

    let api: Api<EtcdBackup> = ctx.api();
    api.delete("every2s", &DeleteParams::default()).await?;
    poll_until("the backup's series dropped", WAIT, || async {
        anyhow::Ok(
            (controller.metric_value("etcd_controller_backup_last_success_timestamp_seconds")
                == 0.0)
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}

/// Issue 35, item 1: a cron schedule (every minute, read in Europe/Berlin) with
/// grandfather-father-son retention on the real S3 server. The first backup is taken at the
/// first minute after the EtcdBackup's creation, on time; the controller is stopped, the
/// status rewound ten minutes as a ten-minute outage would leave it, and the controller is
/// started again after the next minute: the missed times are made up by one backup at once
/// (for the latest), then the next runs at its minute. Retention (`keepLast: 2`,
/// `keepDaily: 3`) prunes the store's snapshots, older ones seeded as if taken on the days
/// before, after each backup.
async fn a_schedule_runs_on_time_across_a_controller_restart_and_prunes_by_retention(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use etcd_controller::snapshot::keys;
    use etcd_shared::types::Retention;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{Timestamp, ToSpan as _, tz::TimeZone};
    use kube::api::{Patch, PatchParams};

    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "scheduled").await?;
    settled_cluster(&ctx, "sc", 1).await?;

    // Snapshots of the days before, named as periodic ones (retention reads the names):
    // yesterday 10:00 and 12:00, two and three days ago 12:00, Berlin time.
    let berlin = TimeZone::get("Europe/Berlin")?;
    let today = Timestamp::now().to_zoned(berlin.clone()).date();
    let day_at = |days_ago: i64, hour: i8| -> anyhow::Result<String> {
        let date = today.checked_sub(days_ago.days())?;
        let t = date.at(hour, 0, 0, 0).to_zoned(berlin.clone())?.timestamp();
        Ok(keys::snapshot_key("sc/snap.db", true, 1, t))
    };
    let (d1_10, d1_12, d2, d3) = (
        day_at(1, 10)?,
        day_at(1, 12)?,
        day_at(2, 12)?,
        day_at(3, 12)?,
    );
    let bucket = storage.open()?;
    for key in [&d1_10, &d1_12, &d2, &d3] {
        bucket
            .put(&transfer::object_path(key)?, b"seeded".to_vec().into())
            .await?;
    }

    let created = create::<EtcdBackup>(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: minutely\nspec:\n  etcdEndpoints: [\"http://sc-client:2379\"]\n  storageType: S3\n  schedule: \"* * * * *\"\n  timeZone: Europe/Berlin\n  retention:\n    keepLast: 2\n    keepDaily: 3\n{}",
            storage.s3_yaml("sc/snap.db")
        ),
    )
    .await?;
    let creation = created
        .metadata
        .creation_timestamp
        .context("a creation time")?
        .0;
    let minute = |t: Timestamp| -> anyhow::Result<Timestamp> {
        // The first whole minute after t.
        let s = t.as_second();
        Ok(Timestamp::from_second(s - s.rem_euclid(60) + 60)?)
    };
    let m1 = minute(creation)?;
    let late = |status: &etcd_shared::types::EtcdBackupStatus, due: Timestamp| {
        status
            .last_success_date
            .as_ref()
            .map_or(f64::NAN, |t| t.0.duration_since(due).as_secs_f64())
    };

    // 1. The first backup: at the first minute after the creation, on time.
    let first = backup_status(&ctx, "minutely", "the first scheduled backup", |s| {
        s.last_schedule_time.is_some()
    })
    .await?;
    ensure!(
        first.last_schedule_time == Some(Time(m1)),
        "the first backup is for {m1}: {first:?}"
    );
    let first_late = late(&first, m1);
    ensure!(
        (0.0..15.0).contains(&first_late),
        "{first_late} s late: {first:?}"
    );
    ensure!(first.next_schedule_time == Some(Time(m1 + 60.seconds())));
    let r1 = first.last_backup_path.clone().context("a path")?;
    let r1 = r1.strip_prefix("scheduled/").context("bucket")?.to_string();
    let after_first = storage.keys("sc").await?;
    let want: Vec<String> = {
        let mut w = vec![d1_12.clone(), d2.clone(), r1.clone()];
        w.sort();
        w
    };
    ensure!(
        after_first == want,
        "retention after the first backup keeps today's, yesterday's newest and two days ago's: {after_first:?}"
    );

    // 2. The controller stops; its status says the last backup was ten minutes earlier (as a
    //    ten-minute outage leaves it); it comes back after the next minute.
    controller.stop().await?;
    let api: Api<EtcdBackup> = ctx.api();
    let rewound = Time(m1 - 10.minutes());
    api.patch_status(
        "minutely",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"lastScheduleTime": rewound}})),
    )
    .await?;
    let m2 = m1 + 60.seconds();
    let wait = m2.duration_since(Timestamp::now()).as_secs_f64() + 2.0;
    tokio::time::sleep(Duration::from_secs_f64(wait.max(0.0))).await;
    let restarted = Timestamp::now();
    let controller = Controller::start(&ctx)?;
    let made_up = backup_status(&ctx, "minutely", "the missed times made up", |s| {
        s.last_schedule_time.as_ref().is_some_and(|t| t.0 >= m2)
    })
    .await?;
    ensure!(
        made_up.last_schedule_time == Some(Time(m2)),
        "made up for the latest missed time {m2}: {made_up:?}"
    );
    let catch_up = made_up
        .last_success_date
        .as_ref()
        .context("a success")?
        .0
        .duration_since(restarted)
        .as_secs_f64();
    let m3 = m2 + 60.seconds();
    ensure!(
        made_up.next_schedule_time == Some(Time(m3)),
        "the next time from the schedule: {made_up:?}"
    );

    // 3. The next backup at its minute; one backup made up, not eleven.
    let next = backup_status(&ctx, "minutely", "the next scheduled backup", |s| {
        s.last_schedule_time.as_ref().is_some_and(|t| t.0 >= m3)
    })
    .await?;
    ensure!(next.last_schedule_time == Some(Time(m3)), "{next:?}");
    let next_late = late(&next, m3);
    ensure!(
        (0.0..15.0).contains(&next_late),
        "{next_late} s late: {next:?}"
    );
    let taken = controller.counter_sum("etcd_controller_backups_total");
    ensure!(
        taken == 2,
        "the restarted controller took {taken} backups: one made up, one on time"
    );
    let r2 = made_up.last_backup_path.clone().context("a path")?;
    let r3 = next.last_backup_path.clone().context("a path")?;
    let (r2, r3) = (
        r2.strip_prefix("scheduled/").context("bucket")?.to_string(),
        r3.strip_prefix("scheduled/").context("bucket")?.to_string(),
    );
    let end = storage.keys("sc").await?;
    let mut want = vec![d1_12.clone(), d2.clone(), r2.clone(), r3.clone()];
    want.sort();
    ensure!(
        end == want,
        "retention keeps the last two, and the newest of today, yesterday and two days ago: {end:?}"
    );
    // The same decision as the pure function's on everything written.
    let all = vec![d1_10, d1_12, d2, d3, r1, r2, r3.clone()];
    let policy = Retention {
        keep_last: 2,
        keep_daily: 3,
        ..Retention::default()
    };
    let doomed = keys::expired_by_retention("sc/snap.db", &all, &policy, &berlin, &r3);
    let mut kept: Vec<String> = all.into_iter().filter(|k| !doomed.contains(k)).collect();
    kept.sort();
    ensure!(kept == end, "{kept:?} vs {end:?}");
    // Status times are whole seconds: 0 means within the second.
    println!(
        "figure: scheduled backups written {first_late:.0} s and {next_late:.0} s after their minute (whole seconds); ten minutes of missed times made up by one backup {:.0} s after the controller's restart",
        catch_up.max(0.0).ceil()
    );
    drop(controller);
    Ok(())
}

fn restore_yaml(storage: &Storage, name: &str, cluster: &str, key: &str) -> String {
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdRestore\nmetadata:\n  name: {name}\nspec:\n  etcdCluster:\n    name: {cluster}\n  backupStorageType: S3\n{}",
        storage.s3_yaml(key)
    )
}

fn backup_yaml(storage: &Storage, name: &str, cluster: &str, key: &str) -> String {
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: {name}\nspec:\n  etcdEndpoints: [\"http://{cluster}-client:2379\"]\n  storageType: S3\n{}",
        storage.s3_yaml(key)
    )
}

/// Issue 16, item 7: 10,000 keys in a 3-member cluster, a backup to the real S3 server while
/// writes continue, then a restore: the cluster is replaced by one seeded from the snapshot,
/// grows to 3 members, and every write acknowledged at or before the snapshot's revision is
/// on every member with its value; the status of both says which snapshot.
async fn a_restore_brings_back_every_acknowledged_write(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "restores").await?;
    settled_cluster(&ctx, "rs", 3).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let started = Instant::now();
    let bulk = bulk_put(&slices, "rs", "/bulk/", 10_000, 32).await?;
    ensure!(
        bulk.len() == 10_000,
        "{} of 10,000 bulk writes acknowledged",
        bulk.len()
    );
    duration("10,000 keys written", started);
    let writer = RevisionWriter::start(&slices, "rs", "/live/").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "before", "rs", "rs/snapshot.db"),
    )
    .await?;
    let backup = backup_status(&ctx, "before", "succeeded", |s| s.succeeded).await?;
    let acked = writer.stop().await?;
    let revision = backup.etcd_revision.context("revision")?;
    let before: BTreeMap<String, String> = acked
        .iter()
        .filter(|(_, _, rev)| *rev <= revision)
        .map(|(k, v, _)| (k.clone(), v.clone()))
        .collect();
    println!(
        "figure: snapshot at revision {revision}, {} bytes; {} of {} live writes acknowledged at or before it",
        backup.last_backup_size.unwrap_or(0),
        before.len(),
        acked.len()
    );

    let clusters: Api<EtcdCluster> = ctx.api();
    let old_uid = clusters.get("rs").await?.uid().context("uid")?;
    let started = Instant::now();
    create::<EtcdRestore>(
        &ctx,
        &restore_yaml(&storage, "rs-restore", "rs", "rs/snapshot.db"),
    )
    .await?;
    let status = restore_status(&ctx, "rs-restore", "succeeded", |s| s.succeeded).await?;
    let secs = duration("restore to a Running 3-member cluster", started);
    println!("figure: restore {secs:.1} s");
    ensure!(status.snapshot_revision == Some(revision), "{status:?}");
    ensure!(
        status.snapshot_sha256 == backup.last_backup_sha256,
        "{status:?}"
    );
    ensure!(status.replaced_cluster_uid.as_deref() == Some(old_uid.as_str()));
    let cluster = clusters.get("rs").await?;
    ensure!(
        cluster.uid().as_deref() != Some(old_uid.as_str()),
        "the cluster was replaced"
    );
    let from = cluster
        .status
        .as_ref()
        .and_then(|s| s.restored_from.clone())
        .context("status.restoredFrom")?;
    ensure!(
        from.path == "restores/rs/snapshot.db" && from.revision == Some(revision),
        "{from:?}"
    );

    // Every acknowledged write at or before the snapshot's revision, on every member.
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "rs", "/bulk/", &bulk, 3).await?;
    check_every_member(&pods, "rs", "/live/", &before, 3).await?;
    Ok(())
}

/// Issue 35, item 4: an EtcdRestore with `spec.restoreInto` clones the backed-up cluster into
/// a new name: the clone serves every key the source held at the backup (and none written
/// after), its revisions are bumped past the snapshot's and a watcher resuming from the old
/// history gets `compacted`; the source keeps running with its own members and data. A second
/// clone into the name (now taken) fails with `ClusterExists` and leaves that cluster alone; a
/// clone into the source's own name is refused at apply.
async fn a_restore_into_a_new_name_clones_with_a_bumped_revision(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "clones").await?;
    settled_cluster(&ctx, "src", 3).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "src", "/k/", 500, 8).await?;
    ensure!(
        data.len() == 500,
        "{} of 500 writes acknowledged",
        data.len()
    );
    create::<EtcdBackup>(&ctx, &backup_yaml(&storage, "b", "src", "src/snapshot.db")).await?;
    let backup = backup_status(&ctx, "b", "succeeded", |s| s.succeeded).await?;
    let revision = backup.etcd_revision.context("revision")?;
    // Written after the backup: the source has them, the clone must not.
    let after = bulk_put(&slices, "src", "/after/", 50, 4).await?;

    let clusters: Api<EtcdCluster> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    let src_uid = clusters.get("src").await?.uid();
    let src_pods: BTreeMap<String, Option<String>> = support::member_pods(&pods, "src")
        .await?
        .iter()
        .map(|(name, p)| (name.clone(), p.uid()))
        .collect();

    // A clone into the source's own name is a roll back: refused, with the field named.
    let same = format!(
        "{}  restoreInto: src\n",
        restore_yaml(&storage, "same", "src", "src/snapshot.db")
    );
    let refused = kubectl_apply_refused(&ctx, &same).await?;
    ensure!(
        refused.contains("spec.restoreInto") && refused.contains("roll back"),
        "{refused}"
    );

    let clone_yaml = |name: &str| {
        format!(
            "{}  restoreInto: copy\n",
            restore_yaml(&storage, name, "src", "src/snapshot.db")
        )
    };
    let started = Instant::now();
    create::<EtcdRestore>(&ctx, &clone_yaml("clone")).await?;
    let status = restore_status(&ctx, "clone", "succeeded", |s| s.succeeded).await?;
    let secs = duration("clone to a Running cluster", started);
    println!("figure: clone {secs:.1} s");
    ensure!(
        status.restored_cluster.as_deref() == Some("copy"),
        "{status:?}"
    );
    ensure!(status.snapshot_revision == Some(revision), "{status:?}");
    ensure!(status.replaced_cluster_uid.is_none(), "{status:?}");
    let copy = clusters.get("copy").await?;
    let from = copy
        .status
        .as_ref()
        .and_then(|s| s.restored_from.clone())
        .context("status.restoredFrom of the clone")?;
    ensure!(
        from.path == "clones/src/snapshot.db" && from.revision == Some(revision),
        "{from:?}"
    );
    check_every_member(&pods, "copy", "/k/", &data, 3).await?;
    let urls: Vec<String> = support::member_urls(&pods, "copy")
        .await?
        .into_values()
        .collect();
    for url in &urls {
        let later = support::read_all(url, "/after/").await?;
        ensure!(
            later.is_empty(),
            "the clone holds writes after the backup: {later:?}"
        );
    }

    // Revisions bumped past the snapshot's, and the old history marked compacted.
    let mut client = connect(&urls).await?;
    let clone_revision = client
        .get("/k/", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    println!("figure: snapshot revision {revision}, clone revision {clone_revision}");
    ensure!(
        clone_revision >= revision + 1_000_000_000,
        "the clone's revision {clone_revision} is not bumped past the snapshot's {revision}"
    );
    compacted_from(&mut client, "/k/", revision).await?;

    // The source is untouched: same cluster, same member pods, all its data.
    let src = clusters.get("src").await?;
    ensure!(
        src.uid() == src_uid && src.metadata.deletion_timestamp.is_none(),
        "the source was replaced"
    );
    let now: BTreeMap<String, Option<String>> = support::member_pods(&pods, "src")
        .await?
        .iter()
        .map(|(name, p)| (name.clone(), p.uid()))
        .collect();
    ensure!(
        now == src_pods,
        "source members {src_pods:?} became {now:?}"
    );
    check_every_member(&pods, "src", "/k/", &data, 3).await?;
    check_every_member(&pods, "src", "/after/", &after, 3).await?;

    // A second clone into the same name: the cluster there is not its own, so it fails and
    // leaves it alone.
    let copy_uid = copy.uid();
    create::<EtcdRestore>(&ctx, &clone_yaml("again")).await?;
    let again = restore_status(&ctx, "again", "refused", |s| s.reason.is_some()).await?;
    let reason = again.reason.clone().unwrap_or_default();
    ensure!(
        reason.starts_with("ClusterExists") && reason.contains("copy"),
        "{reason}"
    );
    ensure!(!again.succeeded, "{again:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let copy = clusters.get("copy").await?;
    ensure!(
        copy.uid() == copy_uid && copy.metadata.deletion_timestamp.is_none(),
        "the existing clone was touched"
    );
    check_every_member(&pods, "copy", "/k/", &data, 3).await?;
    Ok(())
}

/// A watch of `prefix` resumed from `from` (a revision of the history before a restore) is told
/// `compacted` (past `from`) rather than silently watching a history that went back in time.
async fn compacted_from(
    client: &mut etcd_client::Client,
    prefix: &str,
    from: i64,
) -> anyhow::Result<()> {
    let mut stream = client
        .watch(
            prefix,
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(from),
            ),
        )
        .await?;
    // The first answer says the watch was created; the next one says what became of it.
    let answer = tokio::time::timeout(WAIT, async {
        loop {
            let message = stream.message().await?.context("the watch ended")?;
            if message.compact_revision() > 0 || !message.events().is_empty() || message.canceled()
            {
                return anyhow::Ok(message);
            }
        }
    })
    .await
    .context("the watch from the old history never answered")??;
    ensure!(
        answer.compact_revision() > from,
        "watch from {from}: compact revision {}, canceled {}, {} events",
        answer.compact_revision(),
        answer.canceled(),
        answer.events().len()
    );
    Ok(())
}

/// Issue 35, item 4: a roll back (an EtcdRestore into the cluster's own name) goes back to the
/// snapshot's data but not back in revisions: they are bumped past every revision the old
/// history reached (writes after the backup included), and a watcher resuming from one of those
/// gets `compacted`.
async fn a_roll_back_bumps_revisions_past_the_old_history(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "rollbacks").await?;
    settled_cluster(&ctx, "back", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "back", "/k/", 300, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "b", "back", "back/snapshot.db"),
    )
    .await?;
    let backup = backup_status(&ctx, "b", "succeeded", |s| s.succeeded).await?;
    let revision = backup.etcd_revision.context("revision")?;
    // The history goes on past the snapshot: a client of it has seen these revisions.
    bulk_put(&slices, "back", "/after/", 100, 4).await?;
    let urls = client_service_urls(&slices, "back").await?;
    let seen = connect(&urls)
        .await?
        .get("/after/", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    ensure!(seen > revision, "seen {seen}, snapshot {revision}");

    create::<EtcdRestore>(
        &ctx,
        &restore_yaml(&storage, "undo", "back", "back/snapshot.db"),
    )
    .await?;
    let status = restore_status(&ctx, "undo", "succeeded", |s| s.succeeded).await?;
    ensure!(
        status.restored_cluster.as_deref() == Some("back"),
        "{status:?}"
    );
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "back", "/k/", &data, 1).await?;
    let urls: Vec<String> = support::member_urls(&pods, "back")
        .await?
        .into_values()
        .collect();
    let later = support::read_all(&urls[0], "/after/").await?;
    ensure!(
        later.is_empty(),
        "rolled back, yet {} later keys",
        later.len()
    );
    let mut client = connect(&urls).await?;
    let now = client
        .get("/k/", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    println!("figure: snapshot revision {revision}, old history at {seen}, rolled back at {now}");
    ensure!(
        now >= revision + 1_000_000_000 && now > seen,
        "revision {now} after the roll back: not past the old history's {seen}"
    );
    compacted_from(&mut client, "/k/", seen).await?;
    Ok(())
}

/// Issue 16, items 5 and 7: a snapshot whose bytes changed in the store is refused while the
/// cluster keeps running untouched (same UID, same data), with a clear status and event.
async fn a_corrupt_snapshot_is_refused_before_the_cluster_is_touched(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "corrupt").await?;
    settled_cluster(&ctx, "live", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "live", "/k/", 200, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "b", "live", "live/snapshot.db"),
    )
    .await?;
    backup_status(&ctx, "b", "succeeded", |s| s.succeeded).await?;
    let file = storage.server.object_file("corrupt", "live/snapshot.db");
    let mut bytes = std::fs::read(&file)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&file, &bytes)?;

    let clusters: Api<EtcdCluster> = ctx.api();
    let uid = clusters.get("live").await?.uid();
    create::<EtcdRestore>(
        &ctx,
        &restore_yaml(&storage, "bad", "live", "live/snapshot.db"),
    )
    .await?;
    let status = restore_status(&ctx, "bad", "refused", |s| s.reason.is_some()).await?;
    let reason = status.reason.clone().unwrap_or_default();
    ensure!(reason.starts_with("IntegrityCheckFailed"), "{reason}");
    ensure!(
        !status.succeeded && status.replaced_cluster_uid.is_none(),
        "{status:?}"
    );
    let verified = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Verified")
        .context("Verified condition")?;
    ensure!(verified.status == "False", "{verified:?}");
    // A missing object is refused the same way.
    create::<EtcdRestore>(
        &ctx,
        &restore_yaml(&storage, "missing", "live", "live/typo.db"),
    )
    .await?;
    let missing = restore_status(&ctx, "missing", "refused", |s| s.reason.is_some()).await?;
    ensure!(
        missing
            .reason
            .as_deref()
            .unwrap_or_default()
            .starts_with("NotFound"),
        "{missing:?}"
    );
    // The cluster is untouched.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cluster = clusters.get("live").await?;
    ensure!(cluster.uid() == uid && cluster.metadata.deletion_timestamp.is_none());
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "live", "/k/", &data, 1).await?;
    Ok(())
}

/// Issue 35, item 3 (verified backups): a one-shot backup with `spec.verify` of a real member
/// to versitygw is read back and checked, then restored into a scratch member (a short-lived
/// pod, deleted after) whose hashKV and key count at the snapshot's revision match the source
/// member's; its status says Verified, with the source member's figures (the same the test
/// asks the member for). Then the object is overwritten through the S3 API with one byte
/// flipped and a verification asked for (the annotation): it fails, saying why.
async fn a_verified_backup_says_so_and_a_damaged_object_fails_verification(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use etcd_controller::backup::verify;

    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "verified").await?;
    settled_cluster(&ctx, "vf", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    bulk_put(&slices, "vf", "/v/", 300, 8).await?;
    let started = Instant::now();
    create::<EtcdBackup>(
        &ctx,
        &format!(
            "{}  verify:\n    every: 1\n",
            backup_yaml(&storage, "checked", "vf", "vf/snapshot.db")
        ),
    )
    .await?;
    let status = backup_status(&ctx, "checked", "verified", |s| {
        s.last_verification.is_some()
    })
    .await?;
    duration("one-shot backup written and verified", started);
    let record = status
        .last_verification
        .clone()
        .context("lastVerification")?;
    ensure!(record.result == verify::PASSED, "{record:?}");
    ensure!(record.path == "verified/vf/snapshot.db", "{record:?}");
    let revision = status.etcd_revision.context("etcdRevision")?;
    ensure!(record.revision == Some(revision), "{record:?}");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Verified")
        .context("Verified condition")?;
    ensure!(condition.status == "True", "{condition:?}");
    ensure!(
        record.reason.contains("restored into a scratch member")
            && record.reason.contains("as the source member's"),
        "{record:?}"
    );
    // The scratch pod is deleted once asked (its etcd stops within the grace period).
    let pods: Api<Pod> = ctx.api();
    poll_until("the scratch pod gone", WAIT, || async {
        anyhow::Ok(
            pods.get_opt("checked-scratch")
                .await?
                .is_none()
                .then_some(()),
        )
    })
    .await?;

    // The source's figures at the snapshot's revision, asked of the member directly.
    let urls = client_service_urls(&slices, "vf").await?;
    let mut client = connect(&urls).await?;
    let hashed = client.hash_kv(revision).await?;
    let counted = client
        .get(
            vec![0u8],
            Some(
                etcd_client::GetOptions::new()
                    .with_from_key()
                    .with_count_only()
                    .with_revision(revision),
            ),
        )
        .await?;
    ensure!(
        record.hash_kv == Some(i64::from(hashed.hash())) && record.keys == Some(counted.count()),
        "recorded {record:?}, member: hashKV {} keys {}",
        hashed.hash(),
        counted.count()
    );
    ensure!(counted.count() >= 300, "{}", counted.count());
    println!(
        "figure: verified snapshot of {} bytes at revision {revision}: hashKV {} over {} keys",
        status.last_backup_size.unwrap_or_default(),
        hashed.hash(),
        counted.count()
    );

    // One byte flipped, written back through the S3 API: verification fails and says why.
    let bucket = storage.open()?;
    let path = transfer::object_path("vf/snapshot.db")?;
    let mut bytes = bucket.get(&path).await?.bytes().await?.to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    bucket.put(&path, bytes.into()).await?;
    // Asked to verify the latest snapshot again (an annotation), the controller finds it out.
    let backups: Api<EtcdBackup> = ctx.api();
    let patch = serde_json::json!({"metadata": {"annotations": {
        etcd_shared::types::backup::ANNOTATION_VERIFY: "after-damage"
    }}});
    let asked = Instant::now();
    backups
        .patch(
            "checked",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    let status = backup_status(&ctx, "checked", "verified on request", |s| {
        s.last_verification
            .as_ref()
            .is_some_and(|v| v.request == "after-damage")
    })
    .await?;
    duration("verification on request of a damaged object", asked);
    let failed = status
        .last_verification
        .clone()
        .context("lastVerification")?;
    ensure!(failed.result == verify::FAILED, "{failed:?}");
    ensure!(
        failed.reason.contains("integrity hash mismatch"),
        "{}",
        failed.reason
    );
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Verified")
        .context("Verified condition")?;
    ensure!(
        condition.status == "False" && condition.reason == "VerificationFailed",
        "{condition:?}"
    );
    ensure!(
        status.succeeded,
        "the backup itself stays succeeded: {status:?}"
    );
    println!(
        "figure: the damaged object fails verification: {}",
        failed.reason
    );
    Ok(())
}

/// Issue 16, item 7: a snapshot taken by etcd 3.5 restores into a 3.6 cluster (etcd's
/// one-line rule), and the restored cluster runs 3.6 on the 3.5 data.
async fn a_3_5_snapshot_restores_into_3_6(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "lines").await?;
    let old = support::pinned_etcd("3.5")?;
    let new = support::pinned_etcd("3.6")?;
    create_settled(&ctx, "old", 1, Some(&old)).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "old", "/old/", 500, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "b35", "old", "old/snapshot.db"),
    )
    .await?;
    let backup = backup_status(&ctx, "b35", "succeeded", |s| s.succeeded).await?;
    ensure!(backup.etcd_version.as_deref() == Some(old.as_str()));

    create_settled(&ctx, "next", 3, Some(&new)).await?;
    create::<EtcdRestore>(
        &ctx,
        &restore_yaml(&storage, "up", "next", "old/snapshot.db"),
    )
    .await?;
    let status = restore_status(&ctx, "up", "succeeded", |s| s.succeeded).await?;
    ensure!(status.snapshot_etcd_version.as_deref() == Some(old.as_str()));
    let clusters: Api<EtcdCluster> = ctx.api();
    let cluster = clusters.get("next").await?;
    ensure!(cluster.spec.version.as_deref() == Some(new.as_str()));
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "next", "/old/", &data, 3).await?;
    Ok(())
}

/// `kubectl apply --validate=strict` of `text` (a manifest) in the test's namespace.
async fn kubectl_apply(ctx: &TestContext, text: &str) -> anyhow::Result<()> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), text)?;
    let mut command = ctx.kubectl();
    command
        .args(["apply", "--validate=strict", "-f"])
        .arg(file.path());
    let out = tokio::task::spawn_blocking(move || command.output()).await??;
    ensure!(
        out.status.success(),
        "kubectl apply: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `kubectl apply --validate=strict` of `text`, expected to be refused: stderr.
async fn kubectl_apply_refused(ctx: &TestContext, text: &str) -> anyhow::Result<String> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), text)?;
    let mut command = ctx.kubectl();
    command
        .args(["apply", "--validate=strict", "-f"])
        .arg(file.path());
    let out = tokio::task::spawn_blocking(move || command.output()).await??;
    ensure!(
        !out.status.success(),
        "kubectl apply was accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Issue 16, item 1: bad EtcdBackups and EtcdRestores are refused at `kubectl apply` by the
/// webhook, with the field and the rule, and nothing is stored.
async fn bad_backups_and_restores_are_refused_at_kubectl_apply(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let s3 = "  s3:\n    path: etcd-backups/demo/snapshot.db\n    awsSecret: aws\n";
    let backup = |name: &str, spec: &str| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };
    let restore = |name: &str, spec: &str| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdRestore\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };
    let cases = [
        (
            backup(
                "two-clusters",
                &format!(
                    "  etcdEndpoints: [\"http://a-client:2379\", \"http://b-client:2379\"]\n  storageType: S3\n{s3}"
                ),
            ),
            "spec.etcdEndpoints",
        ),
        (
            backup(
                "oss",
                "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: OSS\n  oss:\n    path: b/k\n    ossSecret: o\n",
            ),
            "OSS is a storage type of CoreOS' API that this operator does not support",
        ),
        (
            backup(
                "gcs",
                "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: GCS\n  gcs:\n    path: google-backups/k\n",
            ),
            "spec.gcs.path: the bucket \"google-backups\" must not start with \"goog\"",
        ),
        (
            backup(
                "abs",
                "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: ABS\n  abs:\n    path: etcd/k\n    absSecret: azure\n    endpoint: azurite:10000\n",
            ),
            "spec.abs.endpoint",
        ),
        (
            backup(
                "short-bucket",
                "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: S3\n  s3:\n    path: b/snapshot.db\n    awsSecret: aws\n",
            ),
            "spec.s3.path",
        ),
        (
            backup(
                "schedule-and-interval",
                &format!(
                    "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: S3\n  schedule: \"0 3 * * *\"\n  backupPolicy:\n    backupIntervalInSecond: 3600\n{s3}"
                ),
            ),
            "spec.schedule: and spec.backupPolicy.backupIntervalInSecond (3600) are both set",
        ),
        (
            backup(
                "continuous-one-shot",
                &format!(
                    "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: S3\n  continuous: {{}}\n{s3}"
                ),
            ),
            "spec.continuous: needs periodic snapshots",
        ),
        (
            restore(
                "to-revision-and-time",
                &format!(
                    "  etcdCluster:\n    name: demo\n  backupStorageType: S3\n  toRevision: 5\n  toTime: \"2026-12-07T05:10:00Z\"\n{s3}"
                ),
            ),
            "spec.toTime: and spec.toRevision are both set",
        ),
        (
            backup(
                "bad-cron",
                &format!(
                    "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: S3\n  schedule: \"0 3 * *\"\n{s3}"
                ),
            ),
            "spec.schedule: must be a cron expression of five fields",
        ),
        (
            backup(
                "bad-zone",
                &format!(
                    "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: S3\n  schedule: \"0 3 * * *\"\n  timeZone: Europe/Berlim\n{s3}"
                ),
            ),
            "spec.timeZone: is not a time zone of the IANA database",
        ),
        (
            restore(
                "no-cluster",
                &format!("  etcdCluster:\n    name: \"\"\n  backupStorageType: S3\n{s3}"),
            ),
            "spec.etcdCluster.name",
        ),
        (
            backup(
                "bad-recipients",
                &format!(
                    "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: S3\n  encryption:\n    recipientsSecret: Age_Keys\n{s3}"
                ),
            ),
            "spec.encryption.recipientsSecret",
        ),
        (
            backup(
                "encrypted-pvc",
                "  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: PVC\n  pvc:\n    claimName: backups\n    path: demo/snapshot.db\n  encryption:\n    recipientsSecret: keys\n",
            ),
            "spec.encryption: is supported for S3, ABS and GCS only, not PVC",
        ),
        (
            restore(
                "no-identity",
                &format!(
                    "  etcdCluster:\n    name: demo\n  backupStorageType: S3\n  encryption:\n    identitySecret: \"\"\n{s3}"
                ),
            ),
            "spec.encryption.identitySecret",
        ),
    ];
    // kubectl's discovery may not know the kinds yet when this test runs first: wait until it
    // maps them (a refusal by the webhook, not a mapping error).
    poll_until(
        "kubectl to map EtcdBackup",
        Duration::from_secs(60),
        || async {
            let stderr = kubectl_apply_refused(&ctx, &cases[0].0).await?;
            anyhow::Ok((!stderr.contains("resource mapping not found")).then_some(()))
        },
    )
    .await?;
    for (manifest, field) in &cases {
        let stderr = kubectl_apply_refused(&ctx, manifest).await?;
        // kubectl prints a 422 with causes as `The EtcdBackup "NAME" is invalid: FIELD: ...`.
        ensure!(
            (stderr.contains("is invalid") || stderr.contains("denied the request"))
                && stderr.contains(field),
            "want a refusal naming {field}, got: {stderr}"
        );
    }
    let backups: Api<EtcdBackup> = ctx.api();
    let restores: Api<EtcdRestore> = ctx.api();
    ensure!(
        backups.list(&Default::default()).await?.items.is_empty(),
        "a refused backup was stored"
    );
    ensure!(
        restores.list(&Default::default()).await?.items.is_empty(),
        "a refused restore was stored"
    );
    // A restore's spec is immutable once applied.
    let good = restore(
        "fixed",
        &format!("  etcdCluster:\n    name: demo\n  backupStorageType: S3\n{s3}"),
    );
    kubectl_apply(&ctx, &good).await?;
    let stderr = kubectl_apply_refused(&ctx, &good.replace("name: demo", "name: other")).await?;
    ensure!(
        stderr.contains("spec"),
        "want the immutable spec refused, got: {stderr}"
    );
    Ok(())
}

fn example(name: &str) -> anyhow::Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// Issue 16, "done when": the users' example cluster (etcd 3.2.13) and CoreOS' example backup
/// and restore manifests, as shipped in `examples/` but for the S3 endpoint, applied with
/// `kubectl apply --validate=strict`: the backup is written, the restore brings the data back
/// (etcd 3.2's own `etcdctl snapshot restore` in the seed member).
async fn coreos_examples_back_up_and_restore_the_users_cluster(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "etcd-backups").await?;
    kubectl_apply(&ctx, &example("example-etcd-cluster.yaml")?).await?;
    wait_until(&ctx.api(), "example-etcd-cluster", "settled", |c| {
        settled(c, 3, "3.2.13")
    })
    .await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "example-etcd-cluster", "/users/", 1000, 16).await?;
    let ours =
        |text: String| text.replace("http://minio.minio.svc:9000", storage.server.endpoint());
    kubectl_apply(&ctx, &ours(example("etcd-backup.yaml")?)).await?;
    let backup = backup_status(&ctx, "example-etcd-cluster-backup", "succeeded", |s| {
        s.succeeded
    })
    .await?;
    ensure!(
        backup.etcd_version.as_deref() == Some("3.2.13"),
        "{backup:?}"
    );

    let started = Instant::now();
    kubectl_apply(&ctx, &ours(example("etcd-restore.yaml")?)).await?;
    restore_status(&ctx, "example-etcd-cluster", "succeeded", |s| s.succeeded).await?;
    duration("the users' example restored on 3.2.13", started);
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "example-etcd-cluster", "/users/", &data, 3).await?;
    Ok(())
}

/// Issue 16, item 7: a cluster with client TLS (`spec.TLS.static`, CoreOS' layout) is backed up
/// with CoreOS' `clientTLSSecret` (etcd-client.crt, etcd-client.key, etcd-client-ca.crt) over
/// mutual TLS; a client TLS secret that does not exist is reported, not retried silently.
async fn a_tls_cluster_is_backed_up_with_the_client_tls_secret(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "tls").await?;
    support::tls::coreos_tls_secrets(&ctx, "sec").await?;
    let created = create_cluster(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: sec\nspec:\n  size: 1\n{}",
            support::tls::tls_section("sec")
        ),
    )
    .await?;
    let version = created.spec.version.clone().context("version")?;
    wait_until(&ctx.api(), "sec", "settled over TLS", |c| {
        settled(c, 1, &version)
    })
    .await?;
    let yaml = |name: &str, secret: &str| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: {name}\nspec:\n  etcdEndpoints: [\"https://sec-client:2379\"]\n  storageType: S3\n  clientTLSSecret: {secret}\n{}",
            storage.s3_yaml(&format!("sec/{name}.db"))
        )
    };
    create::<EtcdBackup>(&ctx, &yaml("tls", "sec-operator")).await?;
    let status = backup_status(&ctx, "tls", "succeeded", |s| s.succeeded).await?;
    let bucket = storage.open()?;
    transfer::verify(
        &bucket,
        "sec/tls.db",
        status.last_backup_sha256.as_deref(),
        None,
    )
    .await?;

    create::<EtcdBackup>(&ctx, &yaml("nosecret", "absent")).await?;
    let failed = backup_status(&ctx, "nosecret", "refused", |s| s.reason.is_some()).await?;
    let reason = failed.reason.unwrap_or_default();
    ensure!(reason.contains("absent") && !failed.succeeded, "{reason}");
    Ok(())
}

/// Issue 16, item 6: a cluster with `spec.safetyBackup` (this operator's extension) gets a
/// snapshot before scaling down and before its first member moves to a new minor line; each
/// change waits for its snapshot, the status records it, one snapshot per change.
async fn safety_backups_come_before_a_scale_down_and_a_minor_upgrade(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "safety").await?;
    let from = support::pinned_etcd("3.6")?;
    let to = support::pinned_etcd("3.7")?;
    let started = Instant::now();
    let created = create_cluster(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: safe\nspec:\n  size: 3\n  version: {from}\n  safetyBackup:\n    storageType: S3\n{}",
            storage.s3_yaml("safe/snap.db").replace("\n  ", "\n    ").replacen("  s3:", "    s3:", 1)
        ),
    )
    .await?;
    ensure!(
        created.spec.safety_backup.is_some(),
        "the extension is kept"
    );
    wait_until(&ctx.api(), "safe", "settled", |c| settled(c, 3, &from)).await?;
    duration("safe: 3 members Available", started);
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "safe", "/s/", 300, 8).await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let patch = |spec: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    "safe",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(serde_json::json!({ "spec": spec })),
                )
                .await
        }
    };

    // Scale 3 -> 1: one snapshot before the first removal, none for the second.
    patch(serde_json::json!({ "size": 1 })).await?;
    let scaled = wait_until(&ctx.api(), "safe", "1 member", |c| settled(c, 1, &from)).await?;
    let record = scaled
        .status
        .as_ref()
        .and_then(|s| s.last_safety_backup.clone())
        .context("status.lastSafetyBackup after the scale-down")?;
    ensure!(record.before.starts_with("scale down to 1"), "{record:?}");
    let keys = storage.keys("safe").await?;
    ensure!(keys.len() == 1, "one snapshot for the scale-down: {keys:?}");
    ensure!(
        keys[0].starts_with("safe/snap.db_before-scale-down-1_v"),
        "{keys:?}"
    );
    let bucket = storage.open()?;
    let key = record
        .path
        .split_once('/')
        .map(|(_, k)| k.to_string())
        .unwrap_or_default();
    transfer::verify(&bucket, &key, Some(&record.sha256), None).await?;

    // 3.6 -> 3.7: a snapshot before the first member moves.
    patch(serde_json::json!({ "version": to })).await?;
    let upgraded = wait_until(&ctx.api(), "safe", "upgraded", |c| settled(c, 1, &to)).await?;
    let record = upgraded
        .status
        .as_ref()
        .and_then(|s| s.last_safety_backup.clone())
        .context("status.lastSafetyBackup after the upgrade")?;
    let line = to.rsplit_once('.').map(|(l, _)| l).unwrap_or_default();
    ensure!(record.before == format!("upgrade to {line}"), "{record:?}");
    let keys = storage.keys("safe").await?;
    ensure!(
        keys.len() == 2,
        "a second snapshot for the upgrade: {keys:?}"
    );
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "safe", "/s/", &data, 1).await?;
    Ok(())
}

/// An Azure Blob Storage (Azurite) or GCS (fake-gcs-server) server with a container or bucket,
/// and its secret (`azure` or `gcp`, CoreOS' keys) in the test's namespace.
struct CloudStorage {
    server: CloudServer,
    bucket: String,
    /// The secret's keys, as the operator reads them.
    secret: BTreeMap<String, String>,
}

enum CloudServer {
    Abs(AzuriteServer),
    Gcs(GcsServer),
}

impl CloudStorage {
    async fn abs(ctx: &TestContext, container: &str) -> anyhow::Result<Self> {
        let server = AzuriteServer::start(&Tools::from_env()?, "127.0.0.1").await?;
        server.create_container(container).await?;
        let secret = [
            ("storage-account", azurite::ACCOUNT),
            ("storage-key", azurite::ACCOUNT_KEY),
            ("cloud", "AzurePublicCloud"),
        ];
        Self::with_secret(ctx, CloudServer::Abs(server), container, "azure", &secret).await
    }

    async fn gcs(ctx: &TestContext, bucket: &str) -> anyhow::Result<Self> {
        let server = GcsServer::start(&Tools::from_env()?, "127.0.0.1").await?;
        server.create_bucket(bucket).await?;
        let key = server.credentials_json();
        let secret = [("credentials.json", key.as_str())];
        Self::with_secret(ctx, CloudServer::Gcs(server), bucket, "gcp", &secret).await
    }

    async fn with_secret(
        ctx: &TestContext,
        server: CloudServer,
        bucket: &str,
        name: &str,
        keys: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let secret: BTreeMap<String, String> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let secrets: Api<Secret> = ctx.api();
        let object = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some(
                secret
                    .iter()
                    .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
                    .collect(),
            ),
            ..Secret::default()
        };
        secrets.create(&PostParams::default(), &object).await?;
        Ok(CloudStorage {
            server,
            bucket: bucket.to_string(),
            secret,
        })
    }

    fn storage_type(&self) -> &'static str {
        match self.server {
            CloudServer::Abs(_) => "ABS",
            CloudServer::Gcs(_) => "GCS",
        }
    }

    /// The source of a spec, as YAML lines under `abs:` or `gcs:`.
    fn source_yaml(&self, key: &str) -> String {
        match &self.server {
            CloudServer::Abs(server) => format!(
                "  abs:\n    path: {}/{key}\n    absSecret: azure\n    endpoint: {}\n",
                self.bucket,
                server.endpoint()
            ),
            CloudServer::Gcs(_) => format!(
                "  gcs:\n    path: {}/{key}\n    gcpSecret: gcp\n",
                self.bucket
            ),
        }
    }

    /// The container or bucket, opened as the operator opens it.
    fn open(&self) -> anyhow::Result<Arc<dyn ObjectStore>> {
        let yaml = self.source_yaml("x").replace("\n  ", "\n");
        let source: StorageSource = serde_yaml::from_str(yaml.trim_start())?;
        let location = StoreLocation::from_source(self.storage_type(), &source)?;
        let get = |key: &str| self.secret.get(key).cloned();
        let credentials = Credentials::read(&location.backend, Some(&get))?;
        Ok(store::open(
            &location,
            &credentials,
            StoreTimeouts::default(),
        )?)
    }

    fn log_tail(&self) -> String {
        match &self.server {
            CloudServer::Abs(server) => server.log_tail(20),
            CloudServer::Gcs(server) => server.log_tail(20),
        }
    }
}

async fn abs_backups_and_a_restore_through_azurite(ctx: TestContext) -> anyhow::Result<()> {
    let storage = CloudStorage::abs(&ctx, "etcd-backups").await?;
    backups_and_a_restore_through(&ctx, &storage).await
}

async fn gcs_backups_and_a_restore_through_fake_gcs_server(ctx: TestContext) -> anyhow::Result<()> {
    let storage = CloudStorage::gcs(&ctx, "etcd-backups").await?;
    backups_and_a_restore_through(&ctx, &storage).await
}

/// Issue 16, ABS and GCS: a one-shot backup to the store (the object intact, its size and the
/// etcd version and revision in its metadata as the status says), periodic backups keeping
/// `maxBackups` (the store's listing and deletion), and a restore from the one-shot snapshot
/// (the controller's check and the seed member's `restore fetch` from the store) bringing
/// every key back with its value.
async fn backups_and_a_restore_through(
    ctx: &TestContext,
    storage: &CloudStorage,
) -> anyhow::Result<()> {
    install(ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(ctx)?;
    let t = storage.storage_type();
    let version = settled_cluster(ctx, "cl", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "cl", "/k/", 500, 8).await?;

    let backup = |name: &str, policy: &str, key: &str| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: {name}\nspec:\n  etcdEndpoints: [\"http://cl-client:2379\"]\n  storageType: {t}\n{policy}{}",
            storage.source_yaml(key)
        )
    };
    let started = Instant::now();
    create::<EtcdBackup>(ctx, &backup("once", "", "cl/snapshot.db")).await?;
    let status = backup_status(ctx, "once", "succeeded", |s| {
        s.succeeded || s.reason.is_some()
    })
    .await?;
    ensure!(
        status.succeeded,
        "{t} backup failed: {status:?}\n{}",
        storage.log_tail()
    );
    duration(&format!("{t}: one-shot backup"), started);
    ensure!(status.last_backup_path.as_deref() == Some("etcd-backups/cl/snapshot.db"));
    let revision = status.etcd_revision.context("etcdRevision")?;
    let bucket = storage.open()?;
    let meta = bucket.head(&"cl/snapshot.db".into()).await?;
    ensure!(
        Some(meta.size as i64) == status.last_backup_size,
        "{meta:?} {status:?}"
    );
    let (checked, info) = transfer::verify(
        &bucket,
        "cl/snapshot.db",
        status.last_backup_sha256.as_deref(),
        None,
    )
    .await?;
    ensure!(
        info.revision == Some(revision) && info.etcd_version.as_deref() == Some(version.as_str()),
        "the object's metadata: {info:?}"
    );
    println!(
        "figure: {t} snapshot of {} bytes at revision {revision}",
        checked.size
    );

    // Periodic backups: the listing and deletion of the store keep maxBackups.
    let policy = "  backupPolicy:\n    backupIntervalInSecond: 1\n    maxBackups: 2\n";
    create::<EtcdBackup>(ctx, &backup("every1s", policy, "cl/periodic/snap.db")).await?;
    let mut seen: Vec<String> = Vec::new();
    while seen.len() < 4 {
        let last = seen.last().cloned();
        let status = backup_status(ctx, "every1s", "a new success", |s| {
            s.reason.is_some() || (s.succeeded && s.last_backup_path != last)
        })
        .await?;
        ensure!(status.reason.is_none(), "{t} periodic backup: {status:?}");
        seen.push(status.last_backup_path.clone().context("a path")?);
    }
    let api: Api<EtcdBackup> = ctx.api();
    api.delete("every1s", &DeleteParams::default()).await?;
    let listed: Vec<_> = bucket
        .list(Some(&"cl/periodic".into()))
        .try_collect()
        .await?;
    let keys: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
    // Two kept after each retention (three if one more landed before the delete); the
    // oldest of the four is gone.
    let oldest = seen[0].split_once('/').map_or("", |(_, k)| k);
    ensure!(
        (2..=3).contains(&keys.len())
            && keys.iter().all(|k| k.starts_with("cl/periodic/snap.db_v"))
            && !keys.iter().any(|k| k == oldest),
        "{t}: maxBackups 2 keeps the 2 newest snapshots, found {keys:?} (taken: {seen:?})"
    );

    // The restore: the snapshot is checked, the cluster replaced, its keys back.
    let started = Instant::now();
    create::<EtcdRestore>(
        ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdRestore\nmetadata:\n  name: cl\nspec:\n  etcdCluster:\n    name: cl\n  backupStorageType: {t}\n{}",
            storage.source_yaml("cl/snapshot.db")
        ),
    )
    .await?;
    let restored = restore_status(ctx, "cl", "succeeded or refused", |s| {
        s.succeeded || s.reason.is_some()
    })
    .await?;
    ensure!(restored.succeeded, "{t} restore: {restored:?}");
    duration(&format!("{t}: restore to a Running cluster"), started);
    ensure!(
        restored.snapshot_revision == Some(revision)
            && restored.snapshot_sha256 == status.last_backup_sha256
    );
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "cl", "/k/", &data, 1).await?;
    Ok(())
}

/// A cluster manifest with `spec.safetyBackup` to S3 at `endpoint`.
fn safe_cluster_yaml(
    name: &str,
    size: usize,
    version: &str,
    bucket: &str,
    endpoint: &str,
) -> String {
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {name}\nspec:\n  size: {size}\n  version: {version}\n  safetyBackup:\n    storageType: S3\n    s3:\n      path: {bucket}/{name}/snap.db\n      awsSecret: aws\n      endpoint: {endpoint}\n      forcePathStyle: true\n"
    )
}

/// The pid of a member's etcd process.
fn member_pid(ctx: &TestContext, pod: &str) -> anyhow::Result<nix::unistd::Pid> {
    let pid = ctx
        .kubelet()?
        .container_pid(ctx.ns(), pod)
        .with_context(|| format!("{pod} runs no process"))?;
    Ok(nix::unistd::Pid::from_raw(i32::try_from(pid)?))
}

/// Issue 23, item 6: a step that waited on a long call (here a safety backup to a store
/// reached over a slow path, 8 s per connection) is planned again on a fresh observation. While
/// the snapshot uploads, the follower that would stay is frozen (SIGSTOP); the scale-down 3 -> 2
/// then removes that unhealthy member, not the healthy one it had picked: quorum holds. Before,
/// the removal planned before the snapshot went ahead, leaving 1 healthy voter of 2.
async fn a_scale_down_after_a_slow_safety_backup_is_planned_on_a_fresh_observation(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use support::phases::PhaseWatch;
    use support::proxy::DelayingProxy;
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "fresh").await?;
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", storage.server.port()).parse()?;
    let proxy = DelayingProxy::start(upstream, Duration::from_secs(8)).await?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    create_cluster(
        &ctx,
        &safe_cluster_yaml("fresh", 3, version, "fresh", &proxy.endpoint()),
    )
    .await?;
    wait_until(&ctx.api(), "fresh", "settled", |c| settled(c, 3, version)).await?;
    // The scale-down removes the newest follower; the other follower is the one frozen.
    let pods: Api<Pod> = ctx.api();
    let mut followers = Vec::new();
    for (name, url) in support::member_urls(&pods, "fresh").await? {
        let mut client = connect(&[url]).await?;
        let status = client.status().await?;
        let id = status.header().map_or(0, |h| h.member_id());
        if status.leader() != id {
            followers.push(name);
        }
    }
    followers.sort();
    ensure!(followers.len() == 2, "followers {followers:?}");
    let (frozen, picked) = (followers[0].clone(), followers[1].clone());
    let phases = PhaseWatch::start(ctx.api(), "fresh");
    let clusters: Api<EtcdCluster> = ctx.api();
    clusters
        .patch(
            "fresh",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"size": 2}})),
        )
        .await?;
    tokio::time::timeout(WAIT, proxy.connection())
        .await
        .context("the safety backup never reached the store")?;
    let pid = member_pid(&ctx, &frozen)?;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
    println!("fresh: snapshot uploading; {frozen} frozen, {picked} was the planned removal");
    let result = wait_until(&clusters, "fresh", "2 healthy voters", |c| {
        settled(c, 2, version)
    })
    .await;
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    let phases = phases.stop().await?;
    let done = result?;
    ensure!(
        !phases
            .iter()
            .any(|(p, _)| *p == etcd_shared::types::ClusterPhase::QuorumLost),
        "quorum lost: {phases:?}"
    );
    let members = done.status.and_then(|s| s.members).context("members")?;
    ensure!(
        members.ready.contains(&picked) && !members.ready.contains(&frozen),
        "the frozen member should have gone, not {picked}: {members:?}"
    );
    Ok(())
}

/// Issue 23, item 11: a safety-backup record is not reused weeks later. A record of an
/// "upgrade to 3.7" three weeks old (an upgrade rolled back then) stands in the status; asked
/// for again, the upgrade gets a snapshot of its own. Before, the old record counted.
async fn a_weeks_old_safety_record_is_not_reused(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "stale").await?;
    let from = support::pinned_etcd("3.6")?;
    let to = support::pinned_etcd("3.7")?;
    create_cluster(
        &ctx,
        &safe_cluster_yaml("stale", 1, &from, "stale", storage.server.endpoint()),
    )
    .await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    wait_until(&clusters, "stale", "settled", |c| settled(c, 1, &from)).await?;
    let weeks_ago = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(21 * 24))?;
    clusters
        .patch_status(
            "stale",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {"lastSafetyBackup": {
                "before": "upgrade to 3.7",
                "path": "stale/stale/snap.db_before-upgrade-3.7_v5_old",
                "revision": 5,
                "sha256": "00".repeat(32),
                "time": weeks_ago.to_string(),
            }}})),
        )
        .await?;
    clusters
        .patch(
            "stale",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"version": to}})),
        )
        .await?;
    let upgraded = wait_until(&clusters, "stale", "upgraded", |c| settled(c, 1, &to)).await?;
    let record = upgraded
        .status
        .and_then(|s| s.last_safety_backup)
        .context("lastSafetyBackup")?;
    let age = k8s_openapi::jiff::Timestamp::now()
        .as_second()
        .saturating_sub(record.time.as_ref().map_or(0, |t| t.0.as_second()));
    ensure!(age < 3600, "the record is {age} s old: {record:?}");
    let keys = storage.keys("stale").await?;
    ensure!(
        keys.iter().any(|k| k.contains("before-upgrade-3.7")),
        "no snapshot before the upgrade: {keys:?}"
    );
    Ok(())
}

/// The fault of a safety backup (issue 23): the store refuses the snapshot before a minor
/// upgrade (its bucket does not exist yet). The upgrade waits — status reason
/// `SafetyBackupFailed` with a Degraded message naming the change and the store's error on one
/// bounded line, a Warning Event, the member still on the old line — and goes on by itself once the bucket
/// exists (the failed snapshot is retried after 10 s, then doubling), with its snapshot in the
/// store and recorded in the status.
async fn a_refused_safety_backup_holds_the_upgrade_until_the_store_takes_it(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "other").await?;
    let from = support::pinned_etcd("3.6")?;
    let to = support::pinned_etcd("3.7")?;
    let line = to.rsplit_once('.').map(|(l, _)| l).unwrap_or_default();
    create_cluster(
        &ctx,
        &safe_cluster_yaml("held", 1, &from, "held", storage.server.endpoint()),
    )
    .await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    wait_until(&clusters, "held", "settled", |c| settled(c, 1, &from)).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "held", "/h/", 50, 4).await?;
    let patched = Instant::now();
    clusters
        .patch(
            "held",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"version": to}})),
        )
        .await?;
    let message = support::degraded_for(&clusters, "held", "SafetyBackupFailed").await?;
    duration("held: version patched -> SafetyBackupFailed said", patched);
    ensure!(
        message.contains(&format!("upgrade to {line}")) && message.contains("failed"),
        "the Degraded message names the change and the failure: {message}"
    );
    ensure!(
        !message.contains('\n') && message.len() < 1200,
        "one bounded line, though the store answered a multi-line XML document: {message}"
    );
    let warnings = support::events(&ctx, "SafetyBackupFailed").await?;
    ensure!(
        warnings
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning")),
        "a Warning Event SafetyBackupFailed: {warnings:?}"
    );
    let held = clusters.get("held").await?;
    let status = held.status.context("status")?;
    ensure!(
        status.current_version.as_deref() == Some(from.as_str()),
        "nothing moved while the snapshot failed: {:?}",
        status.current_version
    );
    ensure!(
        status.last_safety_backup.is_none(),
        "no record of a snapshot that failed: {:?}",
        status.last_safety_backup
    );
    println!("held: upgrade to {line} waits: {message}");

    let fixed = Instant::now();
    storage.server.create_bucket("held").await?;
    let upgraded = wait_until(&clusters, "held", "upgraded once the store takes it", |c| {
        settled(c, 1, &to)
    })
    .await?;
    duration("held: bucket created -> upgraded", fixed);
    let record = upgraded
        .status
        .and_then(|s| s.last_safety_backup)
        .context("status.lastSafetyBackup after the upgrade")?;
    ensure!(record.before == format!("upgrade to {line}"), "{record:?}");
    let key = record
        .path
        .strip_prefix("held/")
        .with_context(|| format!("the snapshot is in bucket held: {record:?}"))?;
    transfer::verify(
        &storage.open_bucket("held")?,
        key,
        Some(&record.sha256),
        None,
    )
    .await?;
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "held", "/h/", &data, 1).await?;
    Ok(())
}

/// Issue 23, item 11: deleting an EtcdRestore after it deleted the cluster it replaces (its
/// status then holds the only copy of the cluster's spec) no longer loses both: a finalizer
/// keeps it until the restored cluster exists, which then comes up with every key.
async fn a_restore_deleted_mid_replacement_still_recreates_the_cluster(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "midway").await?;
    settled_cluster(&ctx, "midway", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "midway", "/m/", 200, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "mb", "midway", "midway/snapshot.db"),
    )
    .await?;
    backup_status(&ctx, "mb", "succeeded", |s| s.succeeded).await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let old_uid = clusters.get("midway").await?.uid().context("uid")?;
    create::<EtcdRestore>(
        &ctx,
        &restore_yaml(&storage, "mr", "midway", "midway/snapshot.db"),
    )
    .await?;
    // The moment the old cluster is being deleted, the user deletes the restore.
    poll_until("the old cluster being deleted", WAIT, || {
        let clusters = clusters.clone();
        let old_uid = old_uid.clone();
        async move {
            let c = clusters.get_opt("midway").await?;
            anyhow::Ok(
                c.is_none_or(|c| {
                    c.metadata.deletion_timestamp.is_some() || c.uid() != Some(old_uid)
                })
                .then_some(()),
            )
        }
    })
    .await?;
    let restores: Api<EtcdRestore> = ctx.api();
    restores.delete("mr", &DeleteParams::default()).await?;
    let back = poll_until("the restored cluster", WAIT, || {
        let clusters = clusters.clone();
        let old_uid = old_uid.clone();
        async move {
            let c = clusters.get_opt("midway").await?;
            anyhow::Ok(c.filter(|c| c.uid() != Some(old_uid.clone())))
        }
    })
    .await
    .context("the cluster was never recreated: deleting the restore lost it")?;
    ensure!(back.spec.size == Some(1), "{:?}", back.spec);
    wait_until(&clusters, "midway", "Running", |c| {
        settled(c, 1, etcd_shared::version::DEFAULT_VERSION)
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    check_every_member(&pods, "midway", "/m/", &data, 1).await?;
    poll_until("the restore gone once the cluster exists", WAIT, || {
        let restores = restores.clone();
        async move { anyhow::Ok(restores.get_opt("mr").await?.is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

/// Issue 24: every member and its data lost (three emptyDir pods deleted) under
/// `spec.recovery.policy: Automatic`: the cluster comes back from the newest snapshot of its
/// EtcdBackups that checks. The newest one is damaged in the store: it is skipped (and said)
/// for the one before, whose keys are all back on 3 members.
async fn every_member_lost_recovers_from_the_newest_backup_that_checks(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "lost").await?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    create_cluster(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: gone\nspec:\n  size: 3\n  version: {version}\n  recovery:\n    policy: Automatic\n"
        ),
    )
    .await?;
    wait_until(&ctx.api(), "gone", "settled", |c| settled(c, 3, version)).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let kept = bulk_put(&slices, "gone", "/kept/", 200, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "older", "gone", "gone/older.db"),
    )
    .await?;
    backup_status(&ctx, "older", "succeeded", |s| s.succeeded).await?;
    // One second later (the times sort), a newer backup with more keys...
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = bulk_put(&slices, "gone", "/later/", 50, 8).await?;
    create::<EtcdBackup>(
        &ctx,
        &backup_yaml(&storage, "newer", "gone", "gone/newer.db"),
    )
    .await?;
    backup_status(&ctx, "newer", "succeeded", |s| s.succeeded).await?;
    // ... that is damaged in the store.
    let file = storage.server.object_file("lost", "gone/newer.db");
    let mut bytes = std::fs::read(&file)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&file, &bytes)?;
    let pods: Api<Pod> = ctx.api();
    let lost_at = Instant::now();
    // Every member pod at once (one request): with the loss spread over several reconciles, the
    // first member lost is replaced while quorum still holds, and fewer are lost at the end.
    pods.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        &kube::api::ListParams::default()
            .labels(&format!("{}=gone", etcd_shared::names::LABEL_INSTANCE)),
    )
    .await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let done = wait_until(&clusters, "gone", "recovered from a backup", |c| {
        settled(c, 3, version)
            && c.status
                .as_ref()
                .is_some_and(|s| s.last_recovery.is_some() && s.recovery.is_none())
    })
    .await?;
    duration("every member lost -> Running from the backup", lost_at);
    let last = done
        .status
        .and_then(|s| s.last_recovery)
        .context("lastRecovery")?;
    println!("gone: lastRecovery {last:?}");
    // How many voters were lost when the recovery started depends on how the deletions fell
    // between reconciles (a majority at least, else quorum would have held).
    ensure!(
        last.source == "S3 lost/gone/older.db" && (1..=3).contains(&last.members_lost),
        "{last:?}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = ctx.api();
    let skipped = events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("RecoverySnapshotSkipped"))
        .and_then(|e| e.message)
        .context("no RecoverySnapshotSkipped event")?;
    ensure!(skipped.contains("EtcdBackup newer"), "{skipped}");
    check_every_member(&pods, "gone", "/kept/", &kept, 3).await?;
    let data = support::read_all(
        support::member_urls(&pods, "gone")
            .await?
            .values()
            .next()
            .context("a member")?,
        "/later/",
    )
    .await?;
    ensure!(
        data.is_empty() && !later.is_empty(),
        "keys written after the older backup came back: {}",
        data.len()
    );
    Ok(())
}

/// A Secret of the test's namespace with one key.
async fn key_secret(ctx: &TestContext, name: &str, key: &str, text: &str) -> anyhow::Result<()> {
    let secrets: Api<Secret> = ctx.api();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            key.to_string(),
            ByteString(text.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await?;
    Ok(())
}

/// Issue 35, item 2: an EtcdBackup with `spec.encryption` writes an age file to the S3 server
/// (versitygw) that holds none of the data in the clear; a restore without an identity, or
/// with another key, fails with a clear status while the cluster keeps running untouched with
/// its data; the restore with the backup's key brings every key back on a new cluster. A
/// missing recipients Secret is a clear backup status, nothing written; a rotation of the
/// recipients applies to the next snapshot only.
async fn an_encrypted_backup_restores_only_with_its_key(ctx: TestContext) -> anyhow::Result<()> {
    use etcd_controller::snapshot::encryption::{self, Identities};
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "encrypted").await?;
    settled_cluster(&ctx, "enc", 1).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let data = bulk_put(&slices, "enc", "/secret-data/", 300, 8).await?;

    let (identity, recipient) = encryption::generate();
    let (stranger, _) = encryption::generate();
    let (_, rotated_out) = encryption::generate();
    key_secret(
        &ctx,
        "backup-recipients",
        "recipients",
        &format!("# ops\n{recipient}\n# the old key, kept for a while\n{rotated_out}\n"),
    )
    .await?;
    key_secret(
        &ctx,
        "backup-identity",
        "identity",
        &format!("# public key: {recipient}\n{identity}\n"),
    )
    .await?;
    key_secret(&ctx, "other-identity", "identity", &stranger).await?;
    let encrypted = |name: &str, key: &str, secret: &str| {
        format!(
            "{}  encryption:\n    recipientsSecret: {secret}\n",
            backup_yaml(&storage, name, "enc", key)
        )
    };

    // No recipients Secret: a clear status, no object.
    create::<EtcdBackup>(&ctx, &encrypted("nokeys", "enc/nokeys.db", "absent")).await?;
    let failed = backup_status(&ctx, "nokeys", "refused", |s| s.reason.is_some()).await?;
    let reason = failed.reason.clone().unwrap_or_default();
    ensure!(
        reason.starts_with("BadSecret") && reason.contains("absent") && !failed.succeeded,
        "{reason}"
    );
    ensure!(storage.keys("enc/nokeys.db").await?.is_empty());
    println!("figure: missing recipients: {reason}");

    let started = Instant::now();
    create::<EtcdBackup>(
        &ctx,
        &encrypted("b", "enc/snapshot.db", "backup-recipients"),
    )
    .await?;
    let backup = backup_status(&ctx, "b", "succeeded", |s| s.succeeded).await?;
    duration("encrypted backup", started);
    let stored = std::fs::read(storage.server.object_file("encrypted", "enc/snapshot.db"))?;
    ensure!(
        encryption::is_encrypted(&stored),
        "the object is an age file"
    );
    ensure!(
        !stored.windows(13).any(|w| w == b"/secret-data/"),
        "no key name in the clear"
    );
    // The controller's own read path: only the key decrypts it, to the snapshot recorded.
    let bucket = storage.open()?;
    let ids = Identities::parse(&identity)?;
    let (checked, info) = transfer::verify(
        &bucket,
        "enc/snapshot.db",
        backup.last_backup_sha256.as_deref(),
        Some(&ids),
    )
    .await?;
    ensure!(Some(checked.size as i64) == backup.last_backup_size);
    ensure!(info.revision == backup.etcd_revision, "{info:?}");
    let none = transfer::verify(&bucket, "enc/snapshot.db", None, None).await;
    ensure!(
        none.as_ref()
            .is_err_and(|e| e.reason() == "SnapshotEncrypted"),
        "{none:?}"
    );

    // A rotation: the Secret's recipients replaced by a new key. The next backup is for the
    // new key only; the snapshot written before keeps its recipients.
    let (new_identity, new_recipient) = encryption::generate();
    let secrets: Api<Secret> = ctx.api();
    secrets
        .patch(
            "backup-recipients",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "stringData": { "recipients": format!("{new_recipient}\n") }
            })),
        )
        .await?;
    create::<EtcdBackup>(
        &ctx,
        &encrypted("rotated", "enc/rotated.db", "backup-recipients"),
    )
    .await?;
    backup_status(&ctx, "rotated", "succeeded", |s| s.succeeded).await?;
    let new_ids = Identities::parse(&new_identity)?;
    transfer::verify(&bucket, "enc/rotated.db", None, Some(&new_ids)).await?;
    let old_key_on_new = transfer::verify(&bucket, "enc/rotated.db", None, Some(&ids)).await;
    ensure!(
        old_key_on_new
            .as_ref()
            .is_err_and(|e| e.reason() == "WrongIdentity"),
        "the old key does not read a snapshot written after the rotation: {old_key_on_new:?}"
    );
    let new_key_on_old = transfer::verify(&bucket, "enc/snapshot.db", None, Some(&new_ids)).await;
    ensure!(
        new_key_on_old
            .as_ref()
            .is_err_and(|e| e.reason() == "WrongIdentity"),
        "a snapshot written before the rotation keeps its recipients: {new_key_on_old:?}"
    );

    let clusters: Api<EtcdCluster> = ctx.api();
    let old_uid = clusters.get("enc").await?.uid().context("uid")?;
    let pods: Api<Pod> = ctx.api();
    let restore = |name: &str, identity: Option<&str>| {
        let mut yaml = restore_yaml(&storage, name, "enc", "enc/snapshot.db");
        if let Some(secret) = identity {
            yaml.push_str(&format!("  encryption:\n    identitySecret: {secret}\n"));
        }
        yaml
    };
    // Without an identity, and with another key: refused before the cluster is touched.
    for (name, secret, want) in [
        ("nokey", None, "SnapshotEncrypted"),
        ("wrongkey", Some("other-identity"), "WrongIdentity"),
    ] {
        create::<EtcdRestore>(&ctx, &restore(name, secret)).await?;
        let status = restore_status(&ctx, name, "refused", |s| s.reason.is_some()).await?;
        let reason = status.reason.clone().unwrap_or_default();
        ensure!(reason.starts_with(want), "{name}: {reason}");
        ensure!(
            !status.succeeded && status.replaced_cluster_uid.is_none(),
            "{status:?}"
        );
        let verified = status.conditions.iter().find(|c| c.type_ == "Verified");
        ensure!(
            verified.is_some_and(|c| c.status == "False" && c.reason == want),
            "{verified:?}"
        );
        println!("figure: restore {name}: {reason}");
        ctx.api::<EtcdRestore>()
            .delete(name, &DeleteParams::default())
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cluster = clusters.get("enc").await?;
    ensure!(
        cluster.uid().as_deref() == Some(old_uid.as_str())
            && cluster.metadata.deletion_timestamp.is_none(),
        "the cluster is untouched"
    );
    check_every_member(&pods, "enc", "/secret-data/", &data, 1).await?;

    // With the key: the cluster is replaced by one seeded from the decrypted snapshot.
    let started = Instant::now();
    create::<EtcdRestore>(&ctx, &restore("right", Some("backup-identity"))).await?;
    let status = restore_status(&ctx, "right", "succeeded", |s| s.succeeded).await?;
    duration("restore of an encrypted snapshot", started);
    ensure!(
        status.snapshot_sha256 == backup.last_backup_sha256,
        "{status:?}"
    );
    let cluster = clusters.get("enc").await?;
    ensure!(
        cluster.uid().as_deref() != Some(old_uid.as_str()),
        "replaced"
    );
    check_every_member(&pods, "enc", "/secret-data/", &data, 1).await?;
    Ok(())
}

/// Issue 35, item 2: recovery from permanent quorum loss takes an encrypted EtcdBackup's
/// snapshot with that backup's `spec.encryption.identitySecret` (the seed member decrypts it),
/// and skips, saying why, a newer encrypted one whose backup names no identity.
async fn every_member_lost_recovers_from_an_encrypted_backup_with_its_identity(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use etcd_controller::snapshot::encryption;
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "lostenc").await?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    create_cluster(
        &ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: sealed\nspec:\n  size: 3\n  version: {version}\n  recovery:\n    policy: Automatic\n"
        ),
    )
    .await?;
    wait_until(&ctx.api(), "sealed", "settled", |c| settled(c, 3, version)).await?;
    let (identity, recipient) = encryption::generate();
    key_secret(&ctx, "recipients", "recipients", &recipient).await?;
    key_secret(&ctx, "identity", "identity", &identity).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let kept = bulk_put(&slices, "sealed", "/kept/", 200, 8).await?;
    let with_key =
        "  encryption:\n    recipientsSecret: recipients\n    identitySecret: identity\n";
    create::<EtcdBackup>(
        &ctx,
        &format!(
            "{}{with_key}",
            backup_yaml(&storage, "older", "sealed", "sealed/older.db")
        ),
    )
    .await?;
    backup_status(&ctx, "older", "succeeded", |s| s.succeeded).await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    bulk_put(&slices, "sealed", "/later/", 50, 8).await?;
    // Newer, encrypted too, but its backup names no identity: recovery cannot read it.
    create::<EtcdBackup>(
        &ctx,
        &format!(
            "{}  encryption:\n    recipientsSecret: recipients\n",
            backup_yaml(&storage, "newer", "sealed", "sealed/newer.db")
        ),
    )
    .await?;
    backup_status(&ctx, "newer", "succeeded", |s| s.succeeded).await?;
    for key in ["sealed/older.db", "sealed/newer.db"] {
        let stored = std::fs::read(storage.server.object_file("lostenc", key))?;
        ensure!(encryption::is_encrypted(&stored), "{key} is an age file");
    }
    let pods: Api<Pod> = ctx.api();
    let lost_at = Instant::now();
    pods.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        &kube::api::ListParams::default()
            .labels(&format!("{}=sealed", etcd_shared::names::LABEL_INSTANCE)),
    )
    .await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let done = wait_until(&clusters, "sealed", "recovered from a backup", |c| {
        settled(c, 3, version)
            && c.status
                .as_ref()
                .is_some_and(|s| s.last_recovery.is_some() && s.recovery.is_none())
    })
    .await?;
    duration(
        "every member lost -> Running from an encrypted backup",
        lost_at,
    );
    let last = done
        .status
        .and_then(|s| s.last_recovery)
        .context("lastRecovery")?;
    ensure!(last.source == "S3 lostenc/sealed/older.db", "{last:?}");
    let events: Api<k8s_openapi::api::core::v1::Event> = ctx.api();
    let skipped = events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("RecoverySnapshotSkipped"))
        .and_then(|e| e.message)
        .context("no RecoverySnapshotSkipped event")?;
    ensure!(
        skipped.contains("EtcdBackup newer") && skipped.contains("no identity was given"),
        "{skipped}"
    );
    println!("figure: skipped: {skipped}");
    check_every_member(&pods, "sealed", "/kept/", &kept, 3).await?;
    Ok(())
}

/// One acknowledged change of the point-in-time writer: its revision, when it was
/// acknowledged, and the keys it set (`Some(value)`) or deleted (`None`).
type Change = (i64, Instant, Vec<(String, Option<String>)>);

/// Keeps changing `/pitr/` keys through the client Service: puts over 200 keys, a delete every
/// 7th change and a two-key transaction every 5th, recording every acknowledged change (the
/// history a restore to a revision is checked against).
fn pitr_writer(
    mut client: etcd_client::Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<Change>>> {
    tokio::spawn(async move {
        let mut history = Vec::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let key = format!("/pitr/{:03}", n % 200);
            let (txn, change) = if n.is_multiple_of(7) {
                (
                    etcd_client::Txn::new()
                        .and_then([etcd_client::TxnOp::delete(key.clone(), None)]),
                    vec![(key, None)],
                )
            } else if n.is_multiple_of(5) {
                let other = format!("/pitr/{:03}", (n + 100) % 200);
                let value = format!("t{n}");
                (
                    etcd_client::Txn::new().and_then([
                        etcd_client::TxnOp::put(key.clone(), value.clone(), None),
                        etcd_client::TxnOp::put(other.clone(), value.clone(), None),
                    ]),
                    vec![(key, Some(value.clone())), (other, Some(value))],
                )
            } else {
                let value = format!("v{n}");
                (
                    etcd_client::Txn::new().and_then([etcd_client::TxnOp::put(
                        key.clone(),
                        value.clone(),
                        None,
                    )]),
                    vec![(key, Some(value))],
                )
            };
            if let Ok(Ok(resp)) = tokio::time::timeout(ETCD_TIMEOUT, client.txn(txn)).await {
                let revision = resp.header().map_or(0, |h| h.revision());
                history.push((revision, Instant::now(), change));
            }
        }
        anyhow::Ok(history)
    })
}

/// The keys of `history` as they were at `revision`, if every change up to it was
/// acknowledged (a delete of a key that was not there takes no revision, so only the changes
/// that took one are kept).
fn state_at(history: &[Change], revision: i64) -> BTreeMap<String, String> {
    let mut state = BTreeMap::new();
    for (_, _, changes) in history.iter().filter(|(r, _, _)| *r <= revision) {
        for (key, value) in changes {
            match value {
                Some(v) => state.insert(key.clone(), v.clone()),
                None => state.remove(key),
            };
        }
    }
    state
}

/// Issue 35, item 5: a continuous backup (5 s segments) between periodic snapshots, under a
/// writer changing, deleting and transacting on `/pitr/` keys; a restore to a revision between
/// the first two snapshots (a clone, so the source stays to compare with) holds exactly the
/// keys of that revision: the recorded history's and the source's own `get --rev`. Measures
/// the RPO: from a write's acknowledgement to its segment being listed in the store.
async fn a_restore_to_a_revision_between_two_snapshots_has_exactly_its_keys(
    ctx: TestContext,
) -> anyhow::Result<()> {
    point_in_time_restores(ctx, None).await
}

/// The same on the users' line, etcd 3.2 (3.2.13 pinned).
async fn point_in_time_restores_on_the_users_3_2(ctx: TestContext) -> anyhow::Result<()> {
    let version = support::pinned_etcd("3.2")?;
    point_in_time_restores(ctx, Some(version.as_str())).await
}

/// The continuous backup, the RPO, a controller restart mid-stream and the restores to a
/// revision and to a time, on a 3-member cluster of `version` (the default when `None`).
async fn point_in_time_restores(ctx: TestContext, version: Option<&str>) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let controller = Controller::start(&ctx)?;
    let storage = Storage::start(&ctx, "pitr").await?;
    let version = create_settled(&ctx, "src", 3, version).await?;
    println!("figure: etcd {version}");
    let slices: Api<EndpointSlice> = ctx.api();
    let urls = client_service_urls(&slices, "src").await?;
    let stop = Arc::new(AtomicBool::new(false));
    // Wall-clock times of the writer's acknowledgements, for spec.toTime.
    let (epoch, epoch_wall) = (Instant::now(), k8s_openapi::jiff::Timestamp::now());
    let wall_ms = |at: Instant| {
        epoch_wall.as_millisecond() + i64::try_from((at - epoch).as_millis()).unwrap_or(0)
    };
    let writer = pitr_writer(connect(&urls).await?, stop.clone());

    // The store's segments as they appear: (last revision, when first listed).
    let bucket = storage.open()?;
    let watching = Arc::new(AtomicBool::new(false));
    let seen_task = {
        let watching = watching.clone();
        let bucket = bucket.clone();
        tokio::spawn(async move {
            let mut seen: BTreeMap<String, (i64, Instant)> = BTreeMap::new();
            while !watching.load(Ordering::Relaxed) {
                let listed: Vec<_> = bucket
                    .list(Some(&"src/snapshot.db_segments".into()))
                    .try_collect()
                    .await
                    .unwrap_or_default();
                let now = Instant::now();
                for meta in listed {
                    let key = meta.location.to_string();
                    if let Some((_, last)) =
                        etcd_controller::snapshot::segments::parse_segment("src/snapshot.db", &key)
                    {
                        seen.entry(key).or_insert((last, now));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        })
    };

    let yaml = format!(
        "{}  backupPolicy:\n    backupIntervalInSecond: 30\n  continuous:\n    segmentSeconds: 5\n",
        backup_yaml(&storage, "pitr", "src", "src/snapshot.db")
    );
    create::<EtcdBackup>(&ctx, &yaml).await?;
    let first = backup_status(&ctx, "pitr", "a first snapshot", |s| {
        s.backup_count >= Some(1) && s.succeeded
    })
    .await?;
    // Streaming; then the controller stops for 3 s and starts again: the stream resumes from
    // what the store holds, and the chain stays whole.
    backup_status(&ctx, "pitr", "three segments", |s| {
        s.continuous
            .as_ref()
            .and_then(|c| c.segments)
            .is_some_and(|n| n >= 3)
    })
    .await?;
    controller.stop().await?;
    let stopped_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _controller = Controller::start(&ctx)?;
    let restarted_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = backup_status(&ctx, "pitr", "a second snapshot", |s| {
        s.backup_count >= Some(2) && s.succeeded
    })
    .await?;
    let (rev1, rev2) = (
        first.etcd_revision.context("revision 1")?,
        second.etcd_revision.context("revision 2")?,
    );
    // A few segments past the second snapshot, then stop and let the last one be written.
    tokio::time::sleep(Duration::from_secs(12)).await;
    stop.store(true, Ordering::Relaxed);
    let history = writer.await??;
    let last_acked = history.iter().map(|(r, _, _)| *r).max().context("writes")?;
    let streamed = backup_status(&ctx, "pitr", "the last write streamed", |s| {
        s.continuous
            .as_ref()
            .and_then(|c| c.last_revision)
            .is_some_and(|r| r >= last_acked)
    })
    .await?;
    watching.store(true, Ordering::Relaxed);
    let seen = seen_task.await?;
    println!(
        "figure: {} changes acknowledged in {:.1} s (one client, sequential txns), snapshots at revisions {rev1} and {rev2}, {} segments streamed (status {:?})",
        history.len(),
        history
            .last()
            .zip(history.first())
            .map_or(0.0, |(l, f)| (l.1 - f.1).as_secs_f64()),
        seen.len(),
        streamed.continuous
    );

    // RPO: for each acknowledged change, from its acknowledgement to the first listing of a
    // segment holding it; once streaming (after the first segment was listed: until then the
    // changes since the first snapshot are caught up on).
    let mut appearances: Vec<(i64, Instant)> = seen.values().copied().collect();
    appearances.sort_by_key(|(last, _)| *last);
    let streaming_since = appearances
        .iter()
        .map(|(_, at)| *at)
        .min()
        .context("segments")?;
    let lag = |rev: i64, acked: Instant| {
        appearances
            .iter()
            .filter(|(last, _)| *last >= rev)
            .map(|(_, at)| *at)
            .min()
            .map(|at| at.saturating_duration_since(acked).as_secs_f64())
    };
    // Steady streaming: not the writes of the restart (from a period before the stop to 10 s
    // after the start, measured apart).
    let restarting = |acked: Instant| {
        acked + Duration::from_secs(5) > stopped_at
            && acked < restarted_at + Duration::from_secs(10)
    };
    let mut lags: Vec<f64> = history
        .iter()
        .filter(|(r, acked, _)| *r > rev1 && *acked > streaming_since && !restarting(*acked))
        .filter_map(|(rev, acked, _)| lag(*rev, *acked))
        .collect();
    let restart_max = history
        .iter()
        .filter(|(_, acked, _)| restarting(*acked))
        .filter_map(|(rev, acked, _)| lag(*rev, *acked))
        .fold(0.0, f64::max);
    println!(
        "figure: writes during the controller's restart (stopped {:.1} s): in the store at most {restart_max:.2} s after their acknowledgement",
        (restarted_at - stopped_at).as_secs_f64()
    );
    ensure!(
        !lags.is_empty(),
        "no write after the first snapshot was streamed"
    );
    lags.sort_by(f64::total_cmp);
    let median = lags[lags.len() / 2];
    let p99 = lags[(lags.len() * 99 / 100).min(lags.len() - 1)];
    let max = lags[lags.len() - 1];
    println!(
        "figure: RPO (acknowledged write to its segment listed in the store, 5 s segments, {} writes): median {median:.2} s, p99 {p99:.2} s, max {max:.2} s",
        lags.len()
    );
    // 5 s: the segments' period, cut 0.5 s early for the upload; the store is listed every
    // 0.1 s.
    ensure!(max <= 5.5, "a write waited {max:.2} s for its segment");

    // A revision between the two snapshots, written after the restart (the chain crosses
    // it), and the source's own view of it.
    let target = history
        .iter()
        .find(|(_, acked, _)| *acked > restarted_at + Duration::from_secs(2))
        .map(|(rev, _, _)| *rev)
        .context("writes after the restart")?;
    ensure!(
        rev1 < target && target < rev2,
        "revision {target} after the restart is not between the snapshots' {rev1} and {rev2}"
    );
    let expected = state_at(&history, target);
    let mut source = connect(&urls).await?;
    let at_target = source
        .get(
            "/pitr/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_revision(target),
            ),
        )
        .await?;
    let from_source: BTreeMap<String, String> = at_target
        .kvs()
        .iter()
        .map(|kv| Ok((kv.key_str()?.to_string(), kv.value_str()?.to_string())))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        from_source == expected,
        "the recorded history and the source disagree at revision {target}: {} vs {} keys",
        expected.len(),
        from_source.len()
    );
    // The latest state differs from the target's: a restore of the newest data would fail.
    let now = support::read_all(&urls[0], "/pitr/").await?;
    ensure!(
        now != expected,
        "the keys did not change after revision {target}"
    );

    let started = Instant::now();
    let restore = format!(
        "{}  restoreInto: pitr-copy\n  toRevision: {target}\n",
        restore_yaml(&storage, "to-rev", "src", "src/snapshot.db")
    );
    create::<EtcdRestore>(&ctx, &restore).await?;
    // No client is let into the copy before the replay is done: its client Service lists no
    // ready member until the restore succeeded.
    let restores: Api<EtcdRestore> = ctx.api();
    let slices: Api<EndpointSlice> = ctx.api();
    let held_seen = AtomicBool::new(false);
    let status = poll_until("the restore to a revision done", WAIT * 4, || async {
        let status = restores.get("to-rev").await?.status.unwrap_or_default();
        if status.succeeded {
            return anyhow::Ok(Some(status));
        }
        let clusters: Api<EtcdCluster> = ctx.api();
        if let Some(copy) = clusters.get_opt("pitr-copy").await? {
            let held = copy
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(etcd_shared::names::ANNOTATION_HOLD_CLIENTS));
            if held {
                held_seen.store(true, Ordering::Relaxed);
            }
            let serving = ready_endpoints(&slices, "pitr-copy-client").await?;
            ensure!(
                serving == 0,
                "{serving} members in the copy's client Service before the replay finished"
            );
        }
        Ok(None)
    })
    .await?;
    ensure!(
        held_seen.load(Ordering::Relaxed),
        "the copy was never created holding its clients"
    );
    poll_until(
        "the copy's members let into its client Service",
        WAIT,
        || async {
            anyhow::Ok((ready_endpoints(&slices, "pitr-copy-client").await? == 3).then_some(()))
        },
    )
    .await?;
    let secs = duration("restore to a revision", started);
    println!(
        "figure: restore to revision {target} ({} revisions after the snapshot of revision {:?}, {} segments) in {secs:.1} s",
        target - status.snapshot_revision.unwrap_or(0),
        status.snapshot_revision,
        status.segments.unwrap_or(0)
    );
    ensure!(status.replayed_revision == Some(target), "{status:?}");
    ensure!(status.snapshot_revision == Some(rev1), "{status:?}");
    let pods: Api<Pod> = ctx.api();
    let copy_urls = support::member_urls(&pods, "pitr-copy").await?;
    ensure!(copy_urls.len() == 3, "{copy_urls:?}");
    for (member, url) in &copy_urls {
        let got = support::read_all(url, "/pitr/").await?;
        ensure!(
            got == expected,
            "member {member} of the restored cluster: {} keys, revision {target} had {}; first difference: {:?}",
            got.len(),
            expected.len(),
            expected
                .iter()
                .find(|(k, v)| got.get(*k) != Some(*v))
                .or_else(|| got.iter().find(|(k, _)| !expected.contains_key(*k)))
        );
    }

    let clusters: Api<EtcdCluster> = ctx.api();
    clusters
        .delete("pitr-copy", &DeleteParams::default())
        .await?;

    // spec.toTime: a time after the restart, between the snapshots; the revision it maps to
    // is the last one received at or before it, so every write acknowledged 0.3 s before it
    // is in, none acknowledged 0.3 s after.
    let pick = history
        .iter()
        .find(|(_, acked, _)| *acked > restarted_at + Duration::from_secs(4))
        .map(|(_, acked, _)| wall_ms(*acked))
        .context("writes 4 s after the restart")?;
    let at = k8s_openapi::jiff::Timestamp::from_millisecond(pick)?;
    let started = Instant::now();
    let restore = format!(
        "{}  restoreInto: pitr-time\n  toTime: \"{at}\"\n",
        restore_yaml(&storage, "to-time", "src", "src/snapshot.db")
    );
    create::<EtcdRestore>(&ctx, &restore).await?;
    let status = restore_status(&ctx, "to-time", "succeeded", |s| s.succeeded).await?;
    let secs = duration("restore to a time", started);
    let resolved = status.target_revision.context("status.targetRevision")?;
    println!("figure: restore to {at} (revision {resolved}) in {secs:.1} s");
    ensure!(status.replayed_revision == Some(resolved), "{status:?}");
    ensure!(
        rev1 < resolved && resolved < rev2,
        "{resolved} not between {rev1} and {rev2}"
    );
    for (rev, acked, _) in &history {
        let ms = wall_ms(*acked);
        ensure!(
            !((ms < pick - 300 && *rev > resolved) || (ms > pick + 300 && *rev <= resolved)),
            "revision {rev} acknowledged {} ms from {at} is on the wrong side of {resolved}",
            ms - pick
        );
    }
    let expected_at_time = state_at(&history, resolved);
    for (member, url) in &support::member_urls(&pods, "pitr-time").await? {
        let got = support::read_all(url, "/pitr/").await?;
        ensure!(
            got == expected_at_time,
            "member {member} of the cluster restored to {at}: {} keys, revision {resolved} had {}",
            got.len(),
            expected_at_time.len()
        );
    }

    // Past what was streamed: refused with the reason, nothing created.
    let beyond = format!(
        "{}  restoreInto: pitr-later\n  toRevision: {}\n",
        restore_yaml(&storage, "beyond", "src", "src/snapshot.db"),
        last_acked + 1_000_000
    );
    create::<EtcdRestore>(&ctx, &beyond).await?;
    let refused = restore_status(&ctx, "beyond", "refused", |s| s.reason.is_some()).await?;
    let reason = refused.reason.unwrap_or_default();
    ensure!(reason.starts_with("RevisionNotStreamed"), "{reason}");
    ensure!(clusters.get_opt("pitr-later").await?.is_none());
    Ok(())
}

/// How many ready endpoints the EndpointSlices of Service `service` list.
async fn ready_endpoints(slices: &Api<EndpointSlice>, service: &str) -> anyhow::Result<usize> {
    let listed = slices
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("kubernetes.io/service-name={service}")),
        )
        .await?;
    Ok(listed
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .count())
}
