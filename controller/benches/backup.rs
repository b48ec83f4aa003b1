//! Benchmark: a backup and a restore check of a large etcd database through the controller's
//! own code paths (`EtcdAccess::snapshot` into `transfer::upload`, then `transfer::verify`),
//! against a real etcd 3.6 member and a real S3 server (versitygw) on loopback. Reports the
//! throughput of each and the process's peak RSS (`VmHWM`, reset before each phase) next to
//! the database size: the memory must not grow with the database.
//!
//! Each of `BENCH_ROUNDS` rounds (default 3) backs up and checks the database twice, plain and
//! encrypted with age ([`etcd_controller::snapshot::encryption`]); the medians of both are
//! printed last.
//!
//! `cargo bench -p etcd-controller --bench backup [-- MiB]` (default 1024 MiB; needs
//! `hack/build-tools.sh`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use etcd_controller::etcd::EtcdAccess;
use etcd_controller::snapshot::encryption::{Identities, Recipients, Sealer};
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

/// One round's figures, MiB/s and MiB.
struct Run {
    backup: f64,
    check: f64,
    peak_growth: f64,
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A fresh X25519 key pair: the identity and its recipient.
fn keypair() -> anyhow::Result<(Identities, Recipients)> {
    let (identity, recipient) = etcd_controller::snapshot::encryption::generate();
    Ok((
        Identities::parse(&identity)?,
        Recipients::parse(&recipient)?,
    ))
}

fn transfer_sealer(recipients: &Recipients) -> anyhow::Result<Sealer> {
    Ok(Sealer::new(recipients)?)
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
    let (identities, recipients) = keypair()?;
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    // Plain and encrypted (age, X25519) alternate, so both see the same machine load.
    let mut results: Vec<(bool, Run)> = Vec::new();
    for round in 0..rounds {
        for encrypted in [false, true] {
            let key = if encrypted {
                format!("{}.age", object.key)
            } else {
                object.key.clone()
            };
            let info = SnapshotInfo {
                etcd_version: status.version.clone(),
                revision: status.revision,
                cluster: "bench/a".into(),
                member: "a".into(),
                encrypted,
            };
            let base = status_kib("VmRSS:");
            reset_peak();
            let started = Instant::now();
            let stream = access
                .snapshot(&endpoint, Duration::from_secs(3600))
                .await?;
            let sealer = encrypted
                .then(|| transfer_sealer(&recipients))
                .transpose()?;
            let uploaded =
                transfer::upload(&bucket, &key, &info, Names::Hyphens, stream, sealer).await?;
            let backup_secs = started.elapsed().as_secs_f64();
            let backup_peak = status_kib("VmHWM:");
            let size = uploaded.size as f64 / 1048576.0;

            reset_peak();
            let started = Instant::now();
            let ids = encrypted.then_some(&identities);
            let (checked, _) = transfer::verify(&bucket, &key, Some(&uploaded.sha256), ids).await?;
            let verify_secs = started.elapsed().as_secs_f64();
            let verify_peak = status_kib("VmHWM:");
            ensure!(
                checked == uploaded,
                "read back {checked:?}, wrote {uploaded:?}"
            );
            let stored = server
                .object_file("bench", key.trim_start_matches("bench/"))
                .metadata()
                .context("the stored object")?
                .len();
            if encrypted {
                ensure!(stored > uploaded.size, "stored {stored} bytes, encrypted");
            } else {
                ensure!(stored == uploaded.size, "stored {stored} bytes");
            }
            let mode = if encrypted { "age" } else { "plain" };
            println!(
                "round {round} {mode}: backup {size:.1} MiB in {backup_secs:.1} s = {:.1} MiB/s (RSS {:.1} MiB before, peak +{:.1} MiB); restore check {:.1} MiB/s (peak RSS {:.1} MiB)",
                size / backup_secs,
                mib(base),
                mib(backup_peak.saturating_sub(base)),
                size / verify_secs,
                mib(verify_peak)
            );
            results.push((
                encrypted,
                Run {
                    backup: size / backup_secs,
                    check: size / verify_secs,
                    peak_growth: mib(backup_peak.saturating_sub(base)),
                },
            ));
        }
    }
    for encrypted in [false, true] {
        let runs: Vec<&Run> = results
            .iter()
            .filter(|(e, _)| *e == encrypted)
            .map(|(_, r)| r)
            .collect();
        let mode = if encrypted {
            "encrypted (age)"
        } else {
            "plain"
        };
        println!(
            "median of {} {mode}: backup {:.1} MiB/s, restore check {:.1} MiB/s, backup peak RSS growth {:.1} MiB",
            runs.len(),
            median(runs.iter().map(|r| r.backup)),
            median(runs.iter().map(|r| r.check)),
            median(runs.iter().map(|r| r.peak_growth)),
        );
    }
    Ok(())
}
