//! `etcd-controller backup save|verify`: what the operator's image runs in the short-lived
//! pods that mount a PersistentVolumeClaim for the controller (storage type `PVC`):
//!
//! - **save** (the EtcdBackup's pod, claim read-write) streams etcd's Snapshot RPC from the
//!   member the controller chose into the file ([`claim_files::write_snapshot`]: renamed into
//!   place only when etcd's hash checks), writes its metadata beside it, deletes periodic
//!   snapshots beyond `maxBackups`;
//! - **verify** (the EtcdRestore's pod, claim read-only) reads a snapshot file through and
//!   checks etcd's hash and the hash its metadata recorded, before the restore touches the
//!   live cluster.
//!
//! Both report to the controller with a [`PodReport`] in the termination message.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand};

use etcd_shared::types::Retention;

use super::claim_files::{self, FileError, Metadata};
use super::pod_report::PodReport;
use crate::builders::claim_pod::TERMINATION_LOG;
use crate::etcd::EtcdAccess;
use crate::etcd_tls::MemberTls;
use crate::snapshot::keys::Pruning;

/// `etcd-controller backup ...`.
#[derive(Debug, Parser)]
#[command(
    name = "etcd-controller backup",
    about = "Snapshots in a PersistentVolumeClaim (run by the operator in pods that mount it)"
)]
pub struct BackupCommand {
    /// The step.
    #[command(subcommand)]
    pub step: BackupStep,
    /// Where the report for the controller is written.
    #[arg(long, global = true, default_value = TERMINATION_LOG)]
    pub termination_message_path: PathBuf,
}

/// A step.
#[derive(Debug, Subcommand)]
pub enum BackupStep {
    /// Stream a snapshot from a member into a file of the claim.
    Save(Box<SaveArgs>),
    /// Check a snapshot file of the claim.
    Verify(VerifyArgs),
}

/// `backup save`.
#[derive(Debug, ClapArgs)]
pub struct SaveArgs {
    /// Client URL of the member to snapshot.
    #[arg(long)]
    pub endpoint: String,
    /// Directory with the client certificate (etcd-client.crt, etcd-client.key,
    /// etcd-client-ca.crt), for a cluster serving clients over TLS.
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// Name the member's certificate is verified against.
    #[arg(long, default_value = "")]
    pub server_name: String,
    /// The snapshot file to write.
    #[arg(long)]
    pub file: PathBuf,
    /// For a periodic backup: the path's file, prefix of every snapshot's name (retention).
    #[arg(long)]
    pub prefix: Option<PathBuf>,
    /// Periodic snapshots of `prefix` kept; 0 keeps all.
    #[arg(long, default_value_t = 0)]
    pub max_backups: i64,
    /// `spec.retention.keepLast` (any `--keep-*` above 0: retention instead of maxBackups).
    #[arg(long, default_value_t = 0)]
    pub keep_last: i64,
    /// `spec.retention.keepHourly`.
    #[arg(long, default_value_t = 0)]
    pub keep_hourly: i64,
    /// `spec.retention.keepDaily`.
    #[arg(long, default_value_t = 0)]
    pub keep_daily: i64,
    /// `spec.retention.keepWeekly`.
    #[arg(long, default_value_t = 0)]
    pub keep_weekly: i64,
    /// `spec.retention.keepMonthly`.
    #[arg(long, default_value_t = 0)]
    pub keep_monthly: i64,
    /// `spec.timeZone`, the zone of the retention's periods; blank is UTC.
    #[arg(long, default_value = "")]
    pub time_zone: String,
    /// etcd version of the member (recorded in the metadata).
    #[arg(long)]
    pub etcd_version: String,
    /// Revision the member reported (recorded in the metadata).
    #[arg(long)]
    pub revision: i64,
    /// `NAMESPACE/NAME` of the cluster (recorded in the metadata).
    #[arg(long)]
    pub cluster: String,
    /// The member's name (recorded in the metadata).
    #[arg(long)]
    pub member: String,
    /// Longest the snapshot may take, seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
}

/// `backup verify`.
#[derive(Debug, ClapArgs)]
pub struct VerifyArgs {
    /// The snapshot file to check.
    #[arg(long)]
    pub file: PathBuf,
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A file operation or a check failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// The client certificate could not be read or used.
    #[error("client TLS from {dir}: {reason}")]
    Tls {
        /// The directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The member could not be reached.
    #[error(transparent)]
    Etcd(#[from] crate::error::Error),
    /// The snapshot took longer than allowed.
    #[error("the snapshot took longer than {0:?}")]
    Timeout(Duration),
}

impl CommandError {
    /// A static label (one of [`super::pod_report::KNOWN_REASONS`]).
    pub fn reason(&self) -> &'static str {
        match self {
            CommandError::File(e) => e.reason(),
            CommandError::Tls { .. } | CommandError::Etcd(_) => "NoMemberReachable",
            CommandError::Timeout(_) => "Timeout",
        }
    }
}

/// Runs a step; returns the report written (also when it failed) and whether it succeeded.
pub async fn run(command: BackupCommand) -> (PodReport, bool) {
    let outcome = match &command.step {
        BackupStep::Save(args) => save(args).await,
        BackupStep::Verify(args) => verify(args),
    };
    let report = match outcome {
        Ok(report) => report,
        Err(e) => PodReport::failed(e.reason(), e.to_string()),
    };
    if let Err(e) = std::fs::write(&command.termination_message_path, report.to_message()) {
        eprintln!(
            "etcd-controller backup: writing {}: {e}",
            command.termination_message_path.display()
        );
    }
    let ok = report.ok;
    (report, ok)
}

/// The operator's client TLS from the files of its Secret in `dir` (etcd-client.crt,
/// etcd-client.key, etcd-client-ca.crt, or cert-manager's tls.crt, tls.key, ca.crt), verifying
/// members as `server_name`.
pub(crate) fn member_tls(dir: &Path, server_name: &str) -> Result<MemberTls, CommandError> {
    let tls_error = |reason: String| CommandError::Tls {
        dir: dir.to_path_buf(),
        reason,
    };
    let read =
        |name: &str| std::fs::read(dir.join(name)).map_err(|e| tls_error(format!("{name}: {e}")));
    let [cert_key, key_key, ca_key] = crate::etcd_tls::client_keys(|k| dir.join(k).exists());
    let (cert, key, ca) = (read(cert_key)?, read(key_key)?, read(ca_key)?);
    MemberTls::new(&ca, &cert, &key, server_name).map_err(|e| tls_error(e.to_string()))
}

impl SaveArgs {
    /// The retention rule the arguments say: `--keep-*` if any, else `--max-backups`.
    pub fn pruning(&self) -> Result<Pruning, String> {
        let retention = Retention {
            keep_last: self.keep_last,
            keep_hourly: self.keep_hourly,
            keep_daily: self.keep_daily,
            keep_weekly: self.keep_weekly,
            keep_monthly: self.keep_monthly,
        };
        if retention.is_empty() {
            return Ok(Pruning::MaxBackups(self.max_backups));
        }
        let zone = etcd_shared::schedule::time_zone(&self.time_zone).map_err(|e| e.to_string())?;
        Ok(Pruning::Retention(retention, zone))
    }
}

/// `save`: the snapshot, its metadata, retention.
pub async fn save(args: &SaveArgs) -> Result<PodReport, CommandError> {
    let limit = Duration::from_secs(args.timeout_seconds.max(1));
    let tls = args
        .tls_dir
        .as_deref()
        .map(|dir| member_tls(dir, &args.server_name))
        .transpose()?;
    let access = EtcdAccess {
        tls: tls.map(Arc::new),
        tls_id: 0,
        timeout: Duration::from_secs(5),
        pool: None,
    };
    // What an earlier pod of this backup left when it was killed (its timeout) goes first.
    let leftovers = claim_files::remove_leftovers(&args.file, args.prefix.as_deref())?;
    let write = || async {
        let stream = access.snapshot(&args.endpoint, limit).await?;
        Ok::<_, CommandError>(claim_files::write_snapshot(&args.file, stream).await?)
    };
    let mut pruned = Vec::new();
    let written = match tokio::time::timeout(limit, write()).await {
        Ok(Err(CommandError::File(e))) if claim_files::is_full(&e) => {
            // A full claim: retention only ran after successes, so it never got room back.
            // Make room for one snapshot (down to maxBackups - 1, never the last one) and try
            // once more.
            let room = args.max_backups.saturating_sub(1).max(1);
            pruned = match &args.prefix {
                Some(prefix) if args.max_backups > 1 => {
                    claim_files::retain(prefix, &Pruning::MaxBackups(room), Path::new(""))?
                }
                _ => Vec::new(),
            };
            if pruned.is_empty() {
                return Err(CommandError::File(e));
            }
            tokio::time::timeout(limit, write())
                .await
                .map_err(|_| CommandError::Timeout(limit))??
        }
        other => other.map_err(|_| CommandError::Timeout(limit))??,
    };
    let metadata = Metadata {
        etcd_version: args.etcd_version.clone(),
        revision: args.revision,
        sha256: written.sha256.clone(),
        size: written.size,
        cluster: args.cluster.clone(),
        member: args.member.clone(),
    };
    claim_files::write_metadata(&args.file, &metadata)?;
    let mut message = format!(
        "{} written: {} bytes, sha256 {}",
        args.file.display(),
        written.size,
        written.sha256
    );
    if !leftovers.is_empty() {
        message.push_str(&format!(
            "; {} temporary file(s) of an interrupted backup removed",
            leftovers.len()
        ));
    }
    if !pruned.is_empty() {
        message.push_str(&format!(
            "; the claim was full: {} old snapshot(s) deleted to make room",
            pruned.len()
        ));
    }
    if let Some(prefix) = &args.prefix {
        // The snapshot is written; a failed deletion is reported and retried after the next.
        let pruned = args.pruning().and_then(|rule| {
            claim_files::retain(prefix, &rule, &args.file)
                .map(|deleted| (deleted, rule.field()))
                .map_err(|e| e.to_string())
        });
        match pruned {
            Ok((deleted, field)) if !deleted.is_empty() => {
                message.push_str(&format!(
                    "; {} old snapshot(s) deleted ({field})",
                    deleted.len()
                ));
            }
            Ok(_) => {}
            Err(e) => message.push_str(&format!("; deleting old snapshots failed: {e}")),
        }
    }
    Ok(PodReport {
        ok: true,
        message: Some(message),
        size: Some(written.size),
        sha256: Some(written.sha256),
        revision: Some(args.revision),
        etcd_version: Some(args.etcd_version.clone()),
        ..PodReport::default()
    })
}

/// `verify`: the file's hashes; the metadata's revision and version when recorded.
pub fn verify(args: &VerifyArgs) -> Result<PodReport, CommandError> {
    let (checked, metadata) = claim_files::verify_file(&args.file, None, |_| Ok(()))?;
    Ok(PodReport {
        ok: true,
        message: Some(format!(
            "{} checked: {} bytes, sha256 {}",
            args.file.display(),
            checked.size,
            checked.sha256
        )),
        size: Some(checked.size),
        sha256: Some(checked.sha256),
        revision: metadata.as_ref().map(|m| m.revision),
        etcd_version: metadata.map(|m| m.etcd_version),
        ..PodReport::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_lines_parse() {
        let c = BackupCommand::try_parse_from([
            "backup",
            "save",
            "--endpoint=http://10.0.0.1:2379",
            "--file=/backup/demo/snap.db_v7_2026-01-01-00:00:00",
            "--prefix=/backup/demo/snap.db",
            "--max-backups=3",
            "--etcd-version=3.6.16",
            "--revision=7",
            "--cluster=ns/demo",
            "--member=demo-0",
            "--termination-message-path=/tmp/t",
        ])
        .expect("parses");
        assert!(
            matches!(c.step, BackupStep::Save(ref s) if s.max_backups == 3 && s.tls_dir.is_none())
        );
        let BackupStep::Save(ref s) = c.step else {
            panic!("save")
        };
        assert!(matches!(s.pruning(), Ok(Pruning::MaxBackups(3))));
        let r = BackupCommand::try_parse_from([
            "backup",
            "save",
            "--endpoint=http://10.0.0.1:2379",
            "--file=/backup/demo/snap.db_v7_2026-01-01-00:00:00",
            "--prefix=/backup/demo/snap.db",
            "--keep-last=2",
            "--keep-daily=7",
            "--time-zone=Europe/Berlin",
            "--etcd-version=3.6.16",
            "--revision=7",
            "--cluster=ns/demo",
            "--member=demo-0",
        ])
        .expect("parses");
        let BackupStep::Save(ref s) = r.step else {
            panic!("save")
        };
        assert!(matches!(
            s.pruning(),
            Ok(Pruning::Retention(ref p, _)) if p.keep_last == 2 && p.keep_daily == 7
        ));
        assert_eq!(c.termination_message_path, PathBuf::from("/tmp/t"));
        let v = BackupCommand::try_parse_from(["backup", "verify", "--file=/restore/s.db"])
            .expect("parses");
        assert_eq!(v.termination_message_path, PathBuf::from(TERMINATION_LOG));
        assert!(BackupCommand::try_parse_from(["backup", "save"]).is_err());
    }

    #[tokio::test]
    async fn a_verify_failure_is_reported_with_its_reason() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("termination");
        let (report, ok) = run(BackupCommand {
            step: BackupStep::Verify(VerifyArgs {
                file: dir.path().join("missing.db"),
            }),
            termination_message_path: log.clone(),
        })
        .await;
        assert!(!ok);
        assert_eq!(report.reason.as_deref(), Some("NotFound"));
        let written: PodReport =
            serde_json::from_str(&std::fs::read_to_string(&log).expect("log")).expect("json");
        assert_eq!(written, report);
    }
}
