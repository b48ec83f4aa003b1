//! Verified backups (`spec.verify`): every Nth successful snapshot is read back from the store
//! and checked (etcd's snapshot hash over the whole object, and the SHA-256 recorded when it
//! was written), then restored into a scratch member ([`super::scratch`]) whose `HashKV` and
//! key count at the snapshot's revision must match the source member's, asked right after the
//! snapshot. The outcome is `status.lastVerification` and the `Verified` condition.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use object_store::ObjectStore;

use kube::ResourceExt as _;

use etcd_shared::types::backup::ANNOTATION_VERIFY;
use etcd_shared::types::{EtcdBackup, EtcdBackupSpec, EtcdBackupStatus, VerificationRecord};

use super::schedule::VERIFIED;
use crate::conditions::{self, Stamp, bounded_message};
use crate::etcd::KvFingerprint;
use crate::snapshot::cluster::Success;
use crate::snapshot::encryption::Identities;
use crate::snapshot::transfer;

/// `result` of a verification that passed.
pub const PASSED: &str = "Verified";
/// `result` of a verification that failed.
pub const FAILED: &str = "Failed";

/// Whether the backup numbered `count` (1 for the first success) is to be verified.
pub fn due(spec: &EtcdBackupSpec, count: i64) -> bool {
    match &spec.verify {
        Some(v) if v.every >= 1 => count >= 1 && count % v.every == 0,
        _ => false,
    }
}

/// Reads the snapshot `key` of `success` back from `bucket` and checks it: etcd's hash and the
/// SHA-256 recorded at upload. `identities` decrypt an encrypted one. `Err` says why it failed.
pub async fn check(
    bucket: &Arc<dyn ObjectStore>,
    key: &str,
    success: &Success,
    identities: Option<&Identities>,
) -> Result<String, String> {
    match transfer::verify(bucket, key, Some(&success.sha256), identities).await {
        Ok((checked, _)) => Ok(format!(
            "read back {} bytes: etcd's snapshot hash and the SHA-256 {} check",
            checked.size, checked.sha256
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// The value of the verify annotation of `backup` when it asks for a verification not yet
/// made: `spec.verify` set, a latest snapshot to verify, and a value other than the one the
/// latest verification answered.
pub fn requested(backup: &EtcdBackup) -> Option<String> {
    backup.spec.verify.as_ref()?;
    let value = backup.annotations().get(ANNOTATION_VERIFY)?;
    let status = backup.status.as_ref()?;
    status.last_backup_path.as_ref()?;
    let answered = status
        .last_verification
        .as_ref()
        .map(|v| v.request.as_str());
    (!value.is_empty() && answered != Some(value.as_str())).then(|| value.clone())
}

/// The latest snapshot of `status`, as its backup recorded it; the source member's figures
/// when the latest verification was of the same snapshot.
pub fn latest(status: &EtcdBackupStatus) -> Option<Success> {
    let path = status.last_backup_path.clone()?;
    let revision = status.etcd_revision?;
    let source = status
        .last_verification
        .as_ref()
        .filter(|v| v.path == path && v.revision == Some(revision))
        .and_then(|v| {
            Some(KvFingerprint {
                revision,
                hash_kv: u32::try_from(v.hash_kv?).ok()?,
                compact_revision: 0,
                keys: v.keys?,
            })
        });
    Some(Success {
        path,
        etcd_version: status.etcd_version.clone().unwrap_or_default(),
        revision,
        size: status
            .last_backup_size
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or_default(),
        sha256: status.last_backup_sha256.clone().unwrap_or_default(),
        took: std::time::Duration::ZERO,
        source,
    })
}

/// Compares the scratch member's `HashKV` and key count at the snapshot's revision with the
/// source member's (`None`: the source could not say; the scratch member's figures are noted).
pub fn compare(source: Option<&KvFingerprint>, scratch: &KvFingerprint) -> Result<String, String> {
    let r = scratch.revision;
    let Some(source) = source else {
        return Ok(format!(
            "restored into a scratch member: hashKV {} over {} keys at revision {r} (the source's was not available to compare)",
            scratch.hash_kv, scratch.keys
        ));
    };
    if source.hash_kv != scratch.hash_kv || source.keys != scratch.keys {
        return Err(format!(
            "the restored snapshot differs from the source at revision {r}: hashKV {} over {} keys, the source member's {} over {} keys",
            scratch.hash_kv, scratch.keys, source.hash_kv, source.keys
        ));
    }
    Ok(format!(
        "restored into a scratch member: hashKV {} and {} keys at revision {r}, as the source member's",
        scratch.hash_kv, scratch.keys
    ))
}

/// The record of a verification of `success` at `now`: `outcome` is what [`check`] found.
pub fn record(
    success: &Success,
    outcome: &Result<String, String>,
    now: Timestamp,
) -> VerificationRecord {
    let source = success.source.as_ref();
    let (result, reason) = match outcome {
        Ok(note) => (PASSED, note.clone()),
        Err(why) => (FAILED, bounded_message(why.clone())),
    };
    let reason = match source {
        Some(_) => reason,
        None => format!("{reason}; the source member's hashKV at the revision was not available"),
    };
    VerificationRecord {
        path: success.path.clone(),
        revision: Some(success.revision),
        hash_kv: source.map(|s| i64::from(s.hash_kv)),
        keys: source.map(|s| s.keys),
        result: result.into(),
        reason,
        time: Some(Time(now)),
        request: String::new(),
    }
}

/// `status` with `record` as the latest verification, and its `Verified` condition.
pub fn with_record(
    mut status: EtcdBackupStatus,
    record: VerificationRecord,
    generation: Option<i64>,
    now: Timestamp,
) -> EtcdBackupStatus {
    let ok = record.result == PASSED;
    let message = format!(
        "{} {}: {}",
        record.path,
        record.result.to_lowercase(),
        record.reason
    );
    let reason = if ok {
        "SnapshotVerified"
    } else {
        "VerificationFailed"
    };
    let condition = Stamp::new(generation, now).condition(VERIFIED, ok, reason, message);
    conditions::replace(&mut status.conditions, vec![condition]);
    status.last_verification = Some(record);
    status
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use etcd_shared::types::BackupVerify;

    use super::*;

    #[test]
    fn the_scratch_member_must_match_the_source() {
        let at = |hash_kv, keys| KvFingerprint {
            revision: 9,
            hash_kv,
            compact_revision: 1,
            keys,
        };
        assert!(compare(Some(&at(5, 3)), &at(5, 3)).is_ok());
        let hash = compare(Some(&at(5, 3)), &at(6, 3)).expect_err("hash");
        assert!(
            hash.contains("hashKV 6 over 3 keys, the source member's 5 over 3"),
            "{hash}"
        );
        assert!(compare(Some(&at(5, 3)), &at(5, 4)).is_err());
        let unknown = compare(None, &at(5, 3)).expect("no source");
        assert!(unknown.contains("not available"), "{unknown}");
    }

    fn spec(every: Option<i64>) -> EtcdBackupSpec {
        EtcdBackupSpec {
            verify: every.map(|every| BackupVerify { every }),
            ..EtcdBackupSpec::default()
        }
    }

    #[test]
    fn every_nth_backup_is_verified() {
        assert!(!due(&spec(None), 1));
        assert!(due(&spec(Some(1)), 1));
        assert!(due(&spec(Some(1)), 2));
        let third = spec(Some(3));
        let verified: Vec<i64> = (1..=9).filter(|n| due(&third, *n)).collect();
        assert_eq!(verified, vec![3, 6, 9]);
        assert!(!due(&spec(Some(0)), 1), "past the webhook: off");
    }

    #[test]
    fn a_new_annotation_value_asks_for_the_latest_snapshot_once() {
        let mut backup = EtcdBackup::new("b", spec(Some(3)));
        let ask = |b: &mut EtcdBackup, v: &str| {
            b.metadata.annotations = Some([(ANNOTATION_VERIFY.to_string(), v.to_string())].into());
        };
        ask(&mut backup, "1");
        assert_eq!(requested(&backup), None, "no snapshot yet");
        backup.status = Some(EtcdBackupStatus {
            last_backup_path: Some("b/snap.db".into()),
            etcd_revision: Some(42),
            last_backup_sha256: Some("ab".into()),
            ..EtcdBackupStatus::default()
        });
        assert_eq!(requested(&backup).as_deref(), Some("1"));
        let latest_one = latest(backup.status.as_ref().expect("status")).expect("latest");
        assert_eq!((latest_one.revision, latest_one.source), (42, None));
        if let Some(status) = backup.status.as_mut() {
            status.last_verification = Some(VerificationRecord {
                path: "b/snap.db".into(),
                revision: Some(42),
                hash_kv: Some(7),
                keys: Some(10),
                request: "1".into(),
                ..VerificationRecord::default()
            });
        }
        assert_eq!(requested(&backup), None, "answered");
        let again = latest(backup.status.as_ref().expect("status")).expect("latest");
        assert_eq!(again.source.map(|s| (s.hash_kv, s.keys)), Some((7, 10)));
        ask(&mut backup, "2");
        assert_eq!(requested(&backup).as_deref(), Some("2"));
        backup.spec.verify = None;
        assert_eq!(requested(&backup), None, "without spec.verify");
    }

    fn success() -> Success {
        Success {
            path: "b/snap.db".into(),
            etcd_version: "3.6.16".into(),
            revision: 42,
            size: 0,
            sha256: String::new(),
            took: Duration::ZERO,
            source: Some(KvFingerprint {
                revision: 42,
                hash_kv: 7,
                compact_revision: 1,
                keys: 10,
            }),
        }
    }

    #[tokio::test]
    async fn a_damaged_object_fails_verification_and_a_good_one_passes() {
        use bytes::Bytes;
        use object_store::ObjectStoreExt as _;
        let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let info = transfer::SnapshotInfo {
            etcd_version: "3.6.16".into(),
            revision: 42,
            cluster: "ns/demo".into(),
            member: "demo-0".into(),
            encrypted: false,
        };
        // A database and etcd's hash of it appended, as a member streams a snapshot.
        use sha2::Digest as _;
        let mut bytes: Vec<u8> = (0..4 * 512).map(|i| (i % 253) as u8).collect();
        let hash = sha2::Sha256::digest(&bytes);
        bytes.extend_from_slice(&hash);
        let chunks = vec![Ok::<_, std::io::Error>(Bytes::from(bytes.clone()))];
        let written = transfer::upload(
            &bucket,
            "b/snap.db",
            &info,
            crate::snapshot::transfer::meta::Names::Hyphens,
            futures::stream::iter(chunks),
            None,
        )
        .await
        .expect("uploaded");
        let mut ok = success();
        ok.size = written.size;
        ok.sha256 = written.sha256.clone();
        let now = Timestamp::now();
        let outcome = check(&bucket, "b/snap.db", &ok, None).await;
        let passed = record(&ok, &outcome, now);
        assert_eq!(passed.result, PASSED, "{passed:?}");
        assert_eq!((passed.hash_kv, passed.keys), (Some(7), Some(10)));
        let status = with_record(EtcdBackupStatus::default(), passed, Some(1), now);
        assert_eq!(status.conditions[0].status, "True");
        // One byte flipped in the stored object.
        let mut damaged = bytes.clone();
        damaged[100] ^= 0xff;
        let path = transfer::object_path("b/snap.db").expect("path");
        bucket
            .put(&path, damaged.into())
            .await
            .expect("overwritten");
        let outcome = check(&bucket, "b/snap.db", &ok, None).await;
        let failed = record(&ok, &outcome, now);
        assert_eq!(failed.result, FAILED, "{failed:?}");
        assert!(failed.reason.contains("hash"), "{}", failed.reason);
        let status = with_record(status, failed, Some(1), now);
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(status.conditions[0].reason, "VerificationFailed");
    }
}
