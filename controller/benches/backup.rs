//! Benchmark: a backup and a restore check of a large etcd database through the controller's
//! own code paths (`EtcdAccess::snapshot` into `transfer::upload`, then `transfer::verify`),
//! against a real etcd 3.6 member and a real S3 server (versitygw) on loopback. Reports the
//! throughput of each and the process's peak RSS (`VmHWM`, reset before each phase) next to
//! the database size: the memory must not grow with the database.
//!
//! `cargo bench -p etcd-controller --bench backup [-- MiB]` (default 1024 MiB; needs
//! `hack/build-tools.sh`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use etcd_controller::etcd::EtcdAccess;
use etcd_controller::snapshot::store::{
    self, AwsProfile, Credentials, StoreLocation, StoreTimeouts,
};
use etcd_controller::snapshot::transfer::{self, SnapshotInfo, meta::Names};
use etcd_shared::types::storage::S3Source;
use etcd_tests::member::SingleMember;
use etcd_tests::s3::S3Server;
use etcd_tests::{Tools, poll_until};

const VERSION: &str = "3.6.16";
const VALUE: usize = 1024 * 1024;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Resets `VmHWM` to the current RSS (Linux `clear_refs` 5).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let size_mib: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1024);
    let tools = Tools::from_env()?;
    let dir = tempfile::tempdir()?;
    let member = SingleMember::start(
        &tools.etcd(VERSION)?,
        dir.path(),
        &[
            "--quota-backend-bytes=8589934592".into(),
            "--max-request-bytes=2097152".into(),
        ],
    )?;
    let endpoint = member.endpoint.clone();
    let access = EtcdAccess {
        timeout: Duration::from_secs(10),
        ..EtcdAccess::default()
    };
    poll_until("etcd up", Duration::from_secs(30), || async {
        anyhow::Ok(
            access
                .status(&endpoint)
                .await
                .ok()
                .filter(|s| s.leader != 0),
        )
    })
    .await?;

    // The database: size_mib values of 1 MiB (random bytes: nothing compresses them).
    let started = Instant::now();
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None).await?;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..size_mib {
        let value: Vec<u8> = (0..VALUE)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        client.put(format!("/big/{i:06}"), value, None).await?;
    }
    let status = access.status(&endpoint).await?;
    println!(
        "database: {size_mib} values of 1 MiB written in {:.1} s; db size {:.1} MiB at revision {}",
        started.elapsed().as_secs_f64(),
        status.db_size as f64 / 1048576.0,
        status.revision
    );

    let server = S3Server::start(&tools, "127.0.0.1").await?;
    server.create_bucket("bench").await?;
    let profile = AwsProfile::parse(&server.credentials_file(), Some(&server.config_file()))?;
    let object = StoreLocation::s3(&S3Source {
        path: "bench/snapshot.db".into(),
        aws_secret: "aws".into(),
        endpoint: server.endpoint().into(),
        force_path_style: true,
    })?;
    let bucket = store::open(
        &object,
        &Credentials::Aws(profile),
        StoreTimeouts::default(),
    )?;
    let info = SnapshotInfo {
        etcd_version: status.version.clone(),
        revision: status.revision,
        cluster: "bench/a".into(),
        member: "a".into(),
    };

    let base = status_kib("VmRSS:");
    reset_peak();
    let started = Instant::now();
    let stream = access
        .snapshot(&endpoint, Duration::from_secs(3600))
        .await?;
    let uploaded = transfer::upload(&bucket, &object.key, &info, Names::Hyphens, stream).await?;
    let backup_secs = started.elapsed().as_secs_f64();
    let backup_peak = status_kib("VmHWM:");
    let size = uploaded.size as f64 / 1048576.0;

    reset_peak();
    let started = Instant::now();
    let (checked, _) = transfer::verify(&bucket, &object.key, Some(&uploaded.sha256)).await?;
    let verify_secs = started.elapsed().as_secs_f64();
    let verify_peak = status_kib("VmHWM:");
    ensure!(
        checked == uploaded,
        "read back {checked:?}, wrote {uploaded:?}"
    );

    println!(
        "backup: {size:.1} MiB in {backup_secs:.1} s = {:.1} MiB/s; process RSS {:.1} MiB before, peak {:.1} MiB during (+{:.1} MiB for a {size:.0} MiB snapshot)",
        size / backup_secs,
        mib(base),
        mib(backup_peak),
        mib(backup_peak.saturating_sub(base))
    );
    println!(
        "restore check (download + hash): {size:.1} MiB in {verify_secs:.1} s = {:.1} MiB/s; peak RSS {:.1} MiB",
        size / verify_secs,
        mib(verify_peak)
    );
    let listed = server
        .object_file("bench", "snapshot.db")
        .metadata()
        .context("the stored object")?
        .len();
    ensure!(listed == uploaded.size, "stored {listed} bytes");
    Ok(())
}
